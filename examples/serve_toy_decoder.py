"""A toy decoder served with continuous batching over attn.KVCache: random weights, grouped-query
attention (32 query heads, 8 key/value heads, head size 128 by default), rotary embeddings fused
into the cache, attention sinks, one paged cache per layer. Each step hands attention one mixed
batch through KVCache.attend_batch: the sequences that generate one token, and chunks of new
prompts up to a budget of prompt tokens a step. Prints tokens per second and attention's share of
the time; exits 1 if a step's batched attention differs from one attend per sequence.

    python3 examples/serve_toy_decoder.py [--requests 16] [--generate 16] [--dtype bfloat16] [--small]
"""
import argparse
import sys
import time

import numpy as np

import attn


def rotary_tables(max_pos, head_dim, base=10000.0):
    """cos and sin (max_pos, head_dim / 2) of RoPE (GPT-NeoX's pairs: c and c + head_dim / 2)."""
    inv = base ** (-np.arange(0, head_dim, 2) / head_dim)
    angles = np.arange(max_pos)[:, None] * inv[None]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


class ToyDecoder:
    """Layers of attention alone (no MLP), pre-norm, residual; random weights scaled to keep the
    activations near unit size."""

    def __init__(self, rng, layers, heads, kv_heads, head_dim, vocab):
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        width = heads * head_dim
        def w(rows, cols):
            return (rng.standard_normal((rows, cols)) / np.sqrt(rows)).astype(np.float32)
        self.embed = w(vocab, width) * np.sqrt(vocab)
        self.layers = [dict(q=w(width, width), k=w(width, kv_heads * head_dim), v=w(width, kv_heads * head_dim),
                            o=w(width, width), sinks=rng.standard_normal(heads).astype(np.float32))
                       for _ in range(layers)]
        self.unembed = w(width, vocab)


def run(args):
    rng = np.random.default_rng(args.seed)
    heads, kv_heads, head_dim = (8, 2, 64) if args.small else (32, 8, 128)
    model = ToyDecoder(rng, args.layers, heads, kv_heads, head_dim, args.vocab)
    max_pos = args.prompt_max + args.generate + 1
    cos, sin = rotary_tables(max_pos, head_dim)
    scales = {"k_scale": 0.05, "v_scale": 0.05} if args.dtype.startswith("float8") else {}
    caches = [attn.KVCache(args.requests, kv_heads, head_dim, dtype=args.dtype, block_size=args.block_size,
                           rotary_cos=cos, rotary_sin=sin, **scales) for _ in model.layers]
    prompts = [rng.integers(0, args.vocab, int(rng.integers(args.prompt_min, args.prompt_max + 1)))
               for _ in range(args.requests)]
    fed = [0] * args.requests        # prompt tokens already in the caches
    generated = [[] for _ in range(args.requests)]
    next_token = [None] * args.requests
    attention_s = total_s = 0.0
    steps = checked = 0
    start = time.perf_counter()
    while any(len(g) < args.generate for g in generated):
        # The step's entries: every sequence that decodes, then prompt chunks within the budget.
        entries, budget = [], args.budget
        for s in range(args.requests):
            if fed[s] == len(prompts[s]) and len(generated[s]) < args.generate:
                entries.append((s, np.array([next_token[s]])))
        for s in range(args.requests):
            if fed[s] < len(prompts[s]) and budget > 0:
                chunk = prompts[s][fed[s] : fed[s] + budget]
                entries.append((s, chunk))
                budget -= len(chunk)
        seqs = np.array([s for s, _ in entries], np.int32)
        cu = np.concatenate([[0], np.cumsum([len(t) for _, t in entries])]).astype(np.int32)
        x = model.embed[np.concatenate([t for _, t in entries])]  # (total, width)
        for layer, cache in zip(model.layers, caches):
            h = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)
            q = (h @ layer["q"]).reshape(-1, heads, head_dim)
            k = (h @ layer["k"]).reshape(-1, kv_heads, head_dim)
            v = (h @ layer["v"]).reshape(-1, kv_heads, head_dim)
            for b, s in enumerate(seqs):  # the new tokens' keys and values (rotated at their positions)
                rows = slice(cu[b], cu[b + 1])
                cache.append(np.ascontiguousarray(k[rows].transpose(1, 0, 2)),
                             np.ascontiguousarray(v[rows].transpose(1, 0, 2)), seq=int(s))
            t0 = time.perf_counter()
            out = cache.attend_batch(q, cu, seqs, sinks=layer["sinks"])
            attention_s += time.perf_counter() - t0
            if steps % 8 == 0 and checked < 3:  # the same as one attend per sequence
                checked += 1
                for b, s in enumerate(seqs):
                    own = cache.attend(np.ascontiguousarray(q[cu[b] : cu[b + 1]].transpose(1, 0, 2)), int(s),
                                       sinks=layer["sinks"])
                    gap = np.abs(own.transpose(1, 0, 2) - out[cu[b] : cu[b + 1]]).max()
                    if not gap <= 1e-5:
                        print(f"step {steps}: sequence {s}'s batched attention differs by {gap}", file=sys.stderr)
                        return 1
            x = x + out.reshape(len(out), -1) @ layer["o"]
        logits = x[cu[1:] - 1] @ model.unembed  # each entry's last token
        for b, (s, tokens) in enumerate(entries):
            if fed[s] < len(prompts[s]):
                fed[s] += len(tokens)
                if fed[s] < len(prompts[s]):
                    continue  # the prompt is not all in yet
            else:
                generated[s].append(int(next_token[s]))
            next_token[s] = int(np.argmax(logits[b]))
        steps += 1
    total_s = time.perf_counter() - start
    tokens = sum(len(g) for g in generated)
    print(f"{args.requests} requests, prompts of {args.prompt_min}-{args.prompt_max} tokens, {args.generate} generated each, "
          f"{args.layers} layer(s) of {heads} query heads, {kv_heads} KV heads, head size {head_dim}, {args.dtype} cache")
    print(f"{steps} steps, {tokens} tokens generated in {total_s:.2f} s: {tokens / total_s:.1f} tokens/s "
          f"(attention {attention_s:.2f} s, {100 * attention_s / total_s:.0f}% of the time; the rest is NumPy's projections)")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--prompt-min", type=int, default=128)
    p.add_argument("--prompt-max", type=int, default=1024)
    p.add_argument("--generate", type=int, default=16)
    p.add_argument("--budget", type=int, default=512, help="prompt tokens a step")
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--block-size", type=int, default=256)
    p.add_argument("--dtype", default="bfloat16", help="the cache's dtype (attn.KVCache)")
    p.add_argument("--small", action="store_true", help="8 query heads, 2 KV heads, head size 64")
    p.add_argument("--seed", type=int, default=0)
    sys.exit(run(p.parse_args()))


if __name__ == "__main__":
    main()
