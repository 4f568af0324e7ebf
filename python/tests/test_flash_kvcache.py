"""attn's flash_attn_with_kvcache (python/attn/_flash_kvcache.py) against a torch float64 reference
written from FlashAttention's test_flash_attn_kvcache scenario: random cache lengths, new k/v appended
(the caches checked after the call), rotary on or off (interleaved or not), contiguous caches with
cache_batch_idx and cache_leftpad, paged caches (pages of 1, 16 and 256, shuffled block tables), GQA,
causal or not, windows, ALiBi, soft-capping, sinks, seqlen_q 1 and 7. FlashAttention's error rule:
the output's error against float64 at most twice that of a same-precision torch reference (float32
for float32; computed in bfloat16 / float16 for those). Then the paged varlen forward, attn.KVCache
on torch tensors, and the bad inputs, each named, with nothing written.
"""
import itertools
import math
import random

import pytest
import torch

from attn._flash_kvcache import flash_attn_with_kvcache

_attn = pytest.importorskip("attn._attn")


def rotary_ref(x, cos, sin, offsets, interleaved):
    """x (batch, s, heads, d) rotated at rows offsets[b] + i of the tables, in x's dtype (the formula)."""
    r = cos.shape[1] * 2
    if r == 0:
        return x
    pos = offsets.long()[:, None] + torch.arange(x.shape[1])[None, :]
    c, s = cos[pos][:, :, None, :].to(x.dtype), sin[pos][:, :, None, :].to(x.dtype)
    if interleaved:
        x1, x2 = x[..., 0:r:2], x[..., 1:r:2]
        rot = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)
    else:
        x1, x2 = x[..., : r // 2], x[..., r // 2 : r]
        rot = torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)
    return torch.cat((rot, x[..., r:]), dim=-1)


def attention_ref(q, k, v, key_padding_mask, causal, window, softcap, alibi, sinks, key_leftpad, dtype):
    """FlashAttention's attention_ref in `dtype`: q (b, n, h, d), k and v (b, sk, h, d) (heads repeated),
    keys masked by key_padding_mask (b, sk); positions counted from key_leftpad, queries bottom-right.
    float16 (whose CPU matmul torch lacks) in float32 with each intermediate rounded to float16."""
    rnd = (lambda x: x.half().float()) if dtype == torch.float16 else (lambda x: x)
    dtype = torch.float32 if dtype == torch.float16 else dtype
    q, k, v = rnd(q.to(dtype)), rnd(k.to(dtype)), rnd(v.to(dtype))
    n, sk_all = q.shape[1], k.shape[1]
    scores = rnd(torch.einsum("bthd,bshd->bhts", rnd(q / math.sqrt(q.shape[-1])), k))
    if softcap > 0:
        scores = torch.tanh(scores / softcap) * softcap
    row = torch.arange(n).view(1, 1, n, 1)
    col = torch.arange(sk_all).view(1, 1, 1, sk_all)
    if key_leftpad is not None:
        lp = key_leftpad.long().view(-1, 1, 1, 1)
        col = torch.where(col >= lp, col - lp, 2 ** 32)
    sk = key_padding_mask.sum(-1).view(-1, 1, 1, 1)
    p = row + sk - n
    masked = ~key_padding_mask.view(key_padding_mask.shape[0], 1, 1, sk_all)
    if causal:
        masked = masked | (col > p)
    if window[0] >= 0:
        masked = masked | (col < p - window[0])
    if window[1] >= 0:
        masked = masked | (col > p + window[1])
    if alibi is not None:
        scores = scores - alibi.to(dtype).view(alibi.shape[0], -1, 1, 1) * (p - col).abs().to(dtype)
    scores = scores.masked_fill(masked, float("-inf"))
    if sinks is not None:
        logits = torch.cat((scores, sinks.to(dtype).view(1, -1, 1, 1).expand(*scores.shape[:3], 1)), dim=-1)
        weights = torch.softmax(logits, dim=-1)[..., :-1]
    else:
        weights = torch.softmax(scores, dim=-1)
    weights = rnd(weights.masked_fill(masked.all(-1, keepdim=True), 0.0))
    return rnd(torch.einsum("bhts,bshd->bthd", weights, v))


def _cases():
    rnd = random.Random(0)
    grid = list(itertools.product(
        [torch.float32, torch.bfloat16, torch.float16],  # dtype
        [None, 1, 16, 256],                               # page size
        [1, 7],                                           # seqlen_q
        [0.0, 0.5, 1.0],                                  # rotary fraction
        [False, True],                                    # causal
    ))
    cases = []
    for dtype, page, seqlen_q, rotary, causal in grid:
        cases.append(dict(dtype=dtype, page=page, seqlen_q=seqlen_q, rotary=rotary, causal=causal,
                          interleaved=rnd.random() < 0.5, new_kv=rotary > 0 or rnd.random() < 0.7,
                          local=rnd.random() < 0.3, alibi=rnd.random() < 0.3, softcap=rnd.choice([0.0, 0.0, 3.0]),
                          sinks=rnd.random() < 0.3, gqa=rnd.choice([(6, 2), (4, 4), (4, 1)]),
                          batch_idx=page is None and rnd.random() < 0.5, leftpad=page is None and rnd.random() < 0.5,
                          seqlen_new_eq_q=rnd.random() < 0.5, seed=rnd.randrange(1 << 30)))
    return cases


@pytest.mark.parametrize("c", _cases(), ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items() if k != "seed"))
def test_flash_attn_kvcache_matches_the_reference(c):
    torch.manual_seed(c["seed"])
    dtype, page, seqlen_q, d = c["dtype"], c["page"], c["seqlen_q"], 32
    nheads, nheads_k = c["gqa"]
    batch, seqlen_k = 3, 300 if page == 256 else 57
    seqlen_new = seqlen_q if c["seqlen_new_eq_q"] else random.Random(c["seed"]).randint(1, seqlen_q)
    rotary_dim = int(c["rotary"] * d) // 16 * 16
    new_kv, local, causal = c["new_kv"], c["local"], c["causal"]
    window = tuple(random.Random(c["seed"] + 1).choice([(5, 0), (9, 3), (-1, 2)])) if local else (-1, -1)
    if causal:
        window = (window[0], 0) if local else window
    q = torch.randn(batch, seqlen_q, nheads, d).to(dtype)
    k = torch.randn(batch, seqlen_new, nheads_k, d).to(dtype) if new_kv else None
    v = torch.randn(batch, seqlen_new, nheads_k, d).to(dtype) if new_kv else None
    if page is None:
        batch_cache = batch + 2 if c["batch_idx"] else batch
        k_cache = torch.randn(batch_cache, seqlen_k, nheads_k, d).to(dtype)
        v_cache = torch.randn(batch_cache, seqlen_k, nheads_k, d).to(dtype)
        block_table = None
    else:
        nblocks = math.ceil(seqlen_k / page)
        num_blocks = nblocks * batch * 3
        k_paged = torch.randn(num_blocks, page, nheads_k, d).to(dtype)
        v_paged = torch.randn(num_blocks, page, nheads_k, d).to(dtype)
        block_table = torch.randperm(num_blocks)[: batch * nblocks].view(batch, nblocks).to(torch.int32)
        k_cache = k_paged[block_table.flatten().long()].reshape(batch, nblocks * page, nheads_k, d)[:, :seqlen_k]
        v_cache = v_paged[block_table.flatten().long()].reshape(batch, nblocks * page, nheads_k, d)[:, :seqlen_k]
    room = seqlen_q if (causal or local) and rotary_dim > 0 else (seqlen_new if new_kv else 0)
    cache_seqlens = torch.randint(0, seqlen_k - room + 1, (batch,), dtype=torch.int32)
    cache_leftpad = None
    if c["leftpad"]:
        cache_leftpad = torch.tensor([random.Random(c["seed"] + b).randint(0, max(0, int(s) - 1)) for b, s in
                                      enumerate(cache_seqlens)], dtype=torch.int32)
    cache_batch_idx = torch.randperm(batch_cache, dtype=torch.int32)[:batch] if c["batch_idx"] else None
    arange = torch.arange(seqlen_k).view(1, -1)
    lens = cache_seqlens.view(-1, 1).long()
    key_padding_mask = arange < lens + (seqlen_new if new_kv else 0)
    if cache_leftpad is not None:
        key_padding_mask &= arange >= cache_leftpad.view(-1, 1)
    alibi = torch.rand(batch, nheads) * 0.3 if c["alibi"] else None
    sinks = torch.randn(nheads) if c["sinks"] else None
    if rotary_dim > 0:
        table_rows = seqlen_k if page is None else num_blocks * page
        angle = torch.rand(table_rows, rotary_dim // 2, dtype=torch.float64) * 2 * math.pi
        cos, sin = torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)
    else:
        cos = sin = None

    def rotated(x, f):
        """q and k as rotated in precision f (float64 for the oracle)."""
        if cos is None:
            return x.to(f)
        if causal or local:
            qr = rotary_ref(x.to(f), cos, sin, cache_seqlens, c["interleaved"])
        else:
            qr = rotary_ref(x.to(f).reshape(batch, 1, -1, d), cos, sin, cache_seqlens, c["interleaved"]).reshape(x.shape)
        return qr

    def caches(f):
        """The caches as the call leaves them, in precision f: new keys rotated in f, rounded to dtype."""
        kc = (k_cache if cache_batch_idx is None else k_cache[cache_batch_idx.long()]).clone().to(f)
        vc = (v_cache if cache_batch_idx is None else v_cache[cache_batch_idx.long()]).clone().to(f)
        if new_kv:
            k_ro = k.to(f) if cos is None else rotary_ref(k.to(f), cos, sin, cache_seqlens, c["interleaved"])
            update = (lens <= arange) & (arange < lens + seqlen_new)
            kc[update] = k_ro.to(dtype).to(f).reshape(-1, nheads_k, d)
            vc[update] = v.to(f).reshape(-1, nheads_k, d)
        return kc, vc

    def reference(f, q_dtype):
        kc, vc = caches(f)
        g = nheads // nheads_k
        q_ro = rotated(q, f).to(q_dtype)
        return attention_ref(q_ro, kc.repeat_interleave(g, dim=2), vc.repeat_interleave(g, dim=2), key_padding_mask,
                             causal, window, c["softcap"], alibi, sinks, cache_leftpad, f)

    out_ref = reference(torch.float64, torch.float64)
    same = torch.float32 if dtype == torch.float32 else dtype
    out_pt = reference(same, dtype)
    k_cache_before = (k_paged if page else k_cache).clone()
    out, lse = flash_attn_with_kvcache(
        q, k_cache if page is None else k_paged, v_cache if page is None else v_paged, k, v, rotary_cos=cos,
        rotary_sin=sin, cache_seqlens=cache_seqlens, cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad,
        block_table=block_table, causal=causal, window_size=window, softcap=c["softcap"],
        rotary_interleaved=c["interleaved"], alibi_slopes=alibi, return_softmax_lse=True, sinks=sinks)
    assert out.shape == q.shape and out.dtype == dtype and lse.shape == (batch, nheads, seqlen_q)
    err = (out.double() - out_ref).abs().max().item()
    budget = 2 * (out_pt.double() - out_ref).abs().max().item() + 1e-6
    assert err <= budget, f"out error {err} against float64; same-precision torch's {budget / 2}"
    # The caches after the call: the new tokens at their places (the keys rotated), nothing else moved.
    if new_kv:
        if page is None:
            k_after = k_cache if cache_batch_idx is None else k_cache[cache_batch_idx.long()]
            v_after = v_cache if cache_batch_idx is None else v_cache[cache_batch_idx.long()]
        else:
            k_after = k_paged[block_table.flatten().long()].reshape(batch, -1, nheads_k, d)[:, :seqlen_k]
            v_after = v_paged[block_table.flatten().long()].reshape(batch, -1, nheads_k, d)[:, :seqlen_k]
        k_expected, v_expected = caches(torch.float32)
        update = (lens <= arange) & (arange < lens + seqlen_new)
        eps = {torch.float32: 1e-6, torch.bfloat16: 2 ** -7, torch.float16: 2 ** -10}[dtype]
        torch.testing.assert_close(k_after.float()[update], k_expected[update], rtol=eps, atol=eps)
        assert torch.equal(v_after.float()[update], v_expected[update])
        assert torch.equal(k_after[~update], (k_cache_before if page is None else
                                              k_cache_before[block_table.flatten().long()].reshape(batch, -1, nheads_k, d)[:, :seqlen_k]
                                              )[cache_batch_idx.long() if cache_batch_idx is not None else slice(None)][~update])


def test_window_of_four_attends_the_last_five_keys():
    k_cache = torch.zeros(1, 128, 1, 8)
    v_cache = torch.zeros(1, 128, 1, 8)
    v_cache[0, :, 0, 0] = torch.arange(128, dtype=torch.float32)
    q = torch.randn(1, 1, 1, 8)
    out = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=100, causal=False, window_size=(4, 0))
    assert abs(out[0, 0, 0, 0].item() - (95 + 96 + 97 + 98 + 99) / 5) < 1e-5


def test_paged_varlen_forward_matches_the_reference():
    """flash_attn_varlen_func's paged form through _attn._torch.paged_varlen_forward: sequences of 1
    to 9 queries (decode and prompt paths), keys from cu_seqlens_k or seqused_k."""
    torch.manual_seed(3)
    page, nheads, nheads_k, d = 16, 4, 2, 32
    nq, nk = [1, 9, 3, 2], [17, 40, 5, 0]
    nblocks = 3
    k_paged, v_paged = torch.randn(20, page, nheads_k, d), torch.randn(20, page, nheads_k, d)
    table = torch.randperm(20)[: 4 * nblocks].view(4, nblocks).to(torch.int32)
    cu_q = torch.tensor([0] + list(itertools.accumulate(nq)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(itertools.accumulate(nk)), dtype=torch.int32)
    q = torch.randn(int(cu_q[-1]), nheads, d)
    for causal, window, seqused in ((False, (-1, -1), False), (True, (-1, -1), True), (True, (3, 0), False)):
        out = torch.empty_like(q)
        lse = torch.empty(nheads, q.shape[0])
        opts = {"causal": "bottom_right" if causal else "none", "window": None if window == (-1, -1) else window}
        used = torch.tensor(nk, dtype=torch.int32) if seqused else None
        cu = torch.tensor([0, 50, 100, 150, 200], dtype=torch.int32) if seqused else cu_k
        _attn._torch.paged_varlen_forward(out, lse, q, k_paged, v_paged, cu_q, cu, max(nq), max(nk), table, opts, used)
        for b in range(4):
            kb = k_paged[table[b].long()].reshape(-1, nheads_k, d)[: nk[b]].repeat_interleave(2, dim=1)[None]
            vb = v_paged[table[b].long()].reshape(-1, nheads_k, d)[: nk[b]].repeat_interleave(2, dim=1)[None]
            qb = q[cu_q[b] : cu_q[b + 1]][None]
            mask = torch.ones(1, nk[b], dtype=torch.bool)
            ref = attention_ref(qb, kb, vb, mask, causal, window, 0.0, None, None, None, torch.float64)
            pt = attention_ref(qb, kb, vb, mask, causal, window, 0.0, None, None, None, torch.float32)
            got = out[cu_q[b] : cu_q[b + 1]][None]
            assert (got.double() - ref).abs().max() <= 2 * (pt.double() - ref).abs().max() + 1e-6


def test_kvcache_takes_torch_tensors():
    import attn
    import numpy as np

    keys, values, queries = torch.randn(2, 5, 16), torch.randn(2, 5, 16), torch.randn(4, 1, 16)
    from_torch, from_numpy = attn.KVCache(1, 2, 16), attn.KVCache(1, 2, 16)
    from_torch.append(keys, values, seq=0)
    from_numpy.append(keys.numpy(), values.numpy(), seq=0)
    out = from_torch.attend(queries, seq=0)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    assert np.array_equal(out.numpy(), from_numpy.attend(queries.numpy(), seq=0))
    out16 = from_torch.attend(queries.bfloat16(), seq=0)
    assert out16.dtype == torch.bfloat16
    bf = attn.KVCache(1, 2, 16)
    bf.append(keys.bfloat16(), values.bfloat16(), seq=0)
    assert np.array_equal(bf.keys(0), keys.bfloat16().float().numpy())


def _setup(batch=2, seqlen=8, nheads_k=1, d=16, nheads=2):
    k_cache, v_cache = torch.zeros(4, seqlen, nheads_k, d), torch.zeros(4, seqlen, nheads_k, d)
    q = torch.randn(batch, 1, nheads, d)
    k, v = torch.ones(batch, 1, nheads_k, d), torch.ones(batch, 1, nheads_k, d)
    return q, k_cache, v_cache, k, v


@pytest.mark.parametrize("change, error, words", [
    (dict(cache_seqlens=torch.tensor([3, 8], dtype=torch.int32)), ValueError, ["cache_seqlens[1] is 8", "holds 8"]),
    (dict(cache_batch_idx=torch.tensor([1, 1], dtype=torch.int32)), ValueError, ["cache_batch_idx[1] is 1", "distinct"]),
    (dict(cache_batch_idx=torch.tensor([0, 4], dtype=torch.int32)), ValueError, ["cache_batch_idx[1] is 4", "[0, 4)"]),
    (dict(cache_leftpad=torch.tensor([4, 0], dtype=torch.int32)), ValueError, ["cache_leftpad[0] is 4", "holds 3"]),
    (dict(block_table=torch.tensor([[0, 1], [5, 2]], dtype=torch.int32)), ValueError, ["block_table[1, 0] is 5", "[0, 4)"]),
    (dict(block_table=torch.tensor([[0, 1], [0, 3]], dtype=torch.int32)), ValueError, ["block 0", "belong to one sequence"]),
    (dict(rotary_cos=torch.zeros(7, 4), rotary_sin=torch.zeros(7, 4)), ValueError, ["rotary_cos has shape (7,4)", "at least 8"]),
    (dict(rotary_cos=torch.zeros(16, 10), rotary_sin=torch.zeros(16, 10)), ValueError, ["rotary_dim 20", "headdim 16"]),
    (dict(sinks=torch.zeros(3)), ValueError, ["sinks has shape (3,)", "(nheads,) = (2,)"]),
    (dict(sinks=torch.tensor([0.0, float("nan")])), ValueError, ["sinks[1] is nan"]),
    (dict(alibi_slopes=torch.tensor([0.5, float("nan")])), ValueError, ["alibi_slopes holds nan"]),
    (dict(softcap=1e-46), ValueError, ["softcap is 1e-46", "positive and finite in float32"]),
    (dict(cache_seqlens=torch.tensor([3, 7], dtype=torch.int64)), RuntimeError, ["cache_seqlens", "int32"]),
    (dict(alibi_slopes=torch.zeros(2, dtype=torch.float64)), RuntimeError, ["alibi_slopes", "float32"]),
    (dict(k=torch.ones(2, 1, 1, 16, dtype=torch.float64)), RuntimeError, ["k has dtype torch.float64"]),
])
def test_bad_inputs_are_named_and_write_nothing(change, error, words):
    q, k_cache, v_cache, k, v = _setup()
    args = dict(k=k, v=v, cache_seqlens=torch.tensor([3, 7], dtype=torch.int32))
    args.update(change)
    if "block_table" in args:
        args["cache_seqlens"] = torch.tensor([3, 7], dtype=torch.int32)
    with pytest.raises(error) as e:
        flash_attn_with_kvcache(q, k_cache, v_cache, **args)
    for w in words:
        assert w in str(e.value), str(e.value)
    assert not k_cache.any() and not v_cache.any(), "a call that raised wrote into the cache"


def test_a_cache_off_the_cpu_or_of_another_dtype_is_a_runtime_error():
    q, k_cache, v_cache, k, v = _setup()
    with pytest.raises(RuntimeError, match="v_cache has dtype torch.bfloat16"):
        flash_attn_with_kvcache(q, k_cache, v_cache.bfloat16(), k, v, cache_seqlens=1)
    with pytest.raises(RuntimeError, match="q is on device meta"):
        flash_attn_with_kvcache(q.to("meta"), k_cache, v_cache, k, v, cache_seqlens=1)
    with pytest.raises(RuntimeError, match="k_cache must have contiguous last dimension"):
        flash_attn_with_kvcache(q, torch.zeros(4, 8, 1, 32)[..., ::2], v_cache, cache_seqlens=1)
