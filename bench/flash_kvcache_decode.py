"""Decode-step timing of attn's flash_attn_with_kvcache over a caller-owned paged bfloat16 cache,
against attn.KVCache.attend over the same keys and values, and with rotary embeddings on and off.

    OMP_WAIT_POLICY=passive ATTN_SIMD_TARGET=avx3 PYTHONPATH=build/release/python \
        /usr/bin/python3 bench/flash_kvcache_decode.py [--batch 32] [--tokens 8192] [--reps 15]

Shape: batch sequences of `tokens` tokens each, 8 key heads, 32 query heads, head size 128, pages of
256 tokens in a shuffled block table, one query per sequence, causal. Checks first that the two
paths agree, then times each variant `reps` times, interleaved (A B C D A B C D ...) so that a
neighbour's load falls on all alike, and prints the medians and the bytes of K and V read per
second.
"""
import argparse
import statistics
import time

import numpy as np
import torch

import attn
from attn._flash_kvcache import flash_attn_with_kvcache


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    attn.set_num_threads(args.threads)
    B, L, Hk, H, d, page = args.batch, args.tokens, 8, 32, 128, 256
    torch.manual_seed(0)
    blocks = B * L // page
    k_paged = torch.randn(blocks, page, Hk, d).to(torch.bfloat16)
    v_paged = torch.randn(blocks, page, Hk, d).to(torch.bfloat16)
    table = torch.randperm(blocks).view(B, L // page).to(torch.int32)
    cache = attn.KVCache(B, Hk, d, dtype="bfloat16", block_size=page)
    for b in range(B):
        rows = table[b].long()
        cache.append(k_paged[rows].reshape(L, Hk, d).permute(1, 0, 2).float().numpy(),
                     v_paged[rows].reshape(L, Hk, d).permute(1, 0, 2).float().numpy(), seq=b)
    q = torch.randn(B, 1, H, d).to(torch.bfloat16)
    q_np = q.float().permute(0, 2, 1, 3).contiguous().numpy()  # (B, H, 1, d) for KVCache
    full = torch.full((B,), L, dtype=torch.int32)
    short = torch.full((B,), L - 1, dtype=torch.int32)  # one token appended: L keys after the call
    k_new = torch.randn(B, 1, Hk, d).to(torch.bfloat16)
    v_new = torch.randn(B, 1, Hk, d).to(torch.bfloat16)
    angle = torch.rand(L, d // 2, dtype=torch.float64) * 2 * np.pi
    cos, sin = torch.cos(angle).to(torch.bfloat16), torch.sin(angle).to(torch.bfloat16)

    variants = {
        "flash_attn_with_kvcache (no append)": lambda: flash_attn_with_kvcache(
            q, k_paged, v_paged, cache_seqlens=full, block_table=table, causal=True),
        "KVCache.attend": lambda: cache.attend(q_np, causal=True),
        "flash, append 1 token": lambda: flash_attn_with_kvcache(
            q, k_paged, v_paged, k_new, v_new, cache_seqlens=short, block_table=table, causal=True),
        "flash, append 1 token + rotary": lambda: flash_attn_with_kvcache(
            q, k_paged, v_paged, k_new, v_new, rotary_cos=cos, rotary_sin=sin, cache_seqlens=short,
            block_table=table, causal=True, rotary_interleaved=False),
    }
    # Validate before timing: the two paths over the same cache.
    a = variants["flash_attn_with_kvcache (no append)"]().float()
    b_ = torch.from_numpy(np.asarray(variants["KVCache.attend"]())).permute(0, 2, 1, 3)
    diff = (a - b_).abs().max().item()
    print(f"max |flash - KVCache.attend| = {diff:.3g} (flash rounds out to bfloat16)")
    assert diff < 2e-2
    times = {name: [] for name in variants}
    for _ in range(2):
        for f in variants.values():
            f()
    for _ in range(args.reps):
        for name, f in variants.items():
            t0 = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - t0)
    kv_bytes = 2 * B * L * Hk * d * 2
    print(f"B={B} tokens={L} Hk={Hk} H={H} d={d} page={page} bfloat16, threads={attn.num_threads()}, "
          f"simd={attn.simd_target()}, {args.reps} reps")
    base = statistics.median(times["KVCache.attend"])
    for name, t in times.items():
        m = statistics.median(t)
        print(f"  {name:36s} median {m * 1e3:8.2f} ms  ({kv_bytes / m / 1e9:5.1f} GB/s of K+V)  "
              f"x{m / base:.3f} of KVCache.attend  [min {min(t) * 1e3:.2f}, max {max(t) * 1e3:.2f}]")


if __name__ == "__main__":
    main()
