"""attn.varlen_attention: packed variable-length attention on NumPy arrays, against a float64 reference
written here per sequence from the formula (causal and window aligned bottom-right or top-left, ALiBi
(H,) and (B, H), soft-capping, sinks, GQA), in float64 to rounding and float32 within twice the
error of the same reference in float32; dropout against attn.flash's packed pattern; named errors.
"""
import numpy as np
import pytest

import attn


def reference(q, k, v, cu_q, cu_k, causal=False, align="bottom_right", window=None, slopes=None, softcap=None,
              scale=None, sinks=None, dtype=np.float64):
    q, k, v = q.astype(dtype), k.astype(dtype), v.astype(dtype)
    H, Hk = q.shape[1], k.shape[1]
    out = np.zeros((q.shape[0], H, v.shape[2]), dtype)
    lse = np.full((H, q.shape[0]), -np.inf, dtype)
    scale = 1 / np.sqrt(q.shape[2]) if scale is None else scale
    for b in range(len(cu_q) - 1):
        n, m = cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]
        pos = np.arange(n)[:, None] + (m - n if align == "bottom_right" else 0)
        j = np.arange(m)[None, :]
        allowed = np.ones((n, m), bool)
        if causal:
            allowed &= j <= pos
        if window is not None and window[0] >= 0:
            allowed &= j >= pos - window[0]
        if window is not None and window[1] >= 0:
            allowed &= j <= pos + window[1]
        for h in range(H):
            kh = h // (H // Hk)
            qs, ks, vs = q[cu_q[b]:cu_q[b + 1], h], k[cu_k[b]:cu_k[b + 1], kh], v[cu_k[b]:cu_k[b + 1], kh]
            s = (qs @ ks.T * dtype(scale)).astype(dtype)
            if softcap is not None:
                s = softcap * np.tanh(s / softcap)
            if slopes is not None:
                slope = slopes[h] if slopes.ndim == 1 else slopes[b, h]
                s = s - dtype(slope) * np.abs(pos - j)
            s = np.where(allowed, s, -np.inf)
            top = s.max(axis=1, initial=-np.inf)
            if sinks is not None:
                top = np.maximum(top, sinks[h])
            safe = np.where(np.isfinite(top), top, 0)
            e = np.where(allowed, np.exp(s - safe[:, None]), 0)
            total = e.sum(1) + (np.exp(sinks[h] - safe) if sinks is not None else 0)
            any_key = allowed.any(1)
            w = np.where(any_key[:, None], e / np.where(total > 0, total, 1)[:, None], 0)
            out[cu_q[b]:cu_q[b + 1], h] = w @ vs
            row_lse = np.where(total > 0, safe + np.log(np.where(total > 0, total, 1)), -np.inf)
            lse[h, cu_q[b]:cu_q[b + 1]] = np.where(any_key, row_lse, sinks[h] if sinks is not None else -np.inf)
    return out, lse


def packed(lens_q, lens_k, H, Hk, d, rng):
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    q = rng.uniform(-2, 2, (cu_q[-1], H, d))
    k = rng.uniform(-2, 2, (cu_k[-1], Hk, d))
    v = rng.uniform(-1, 1, (cu_k[-1], Hk, d + 3))
    return q, k, v, cu_q, cu_k


LENS = ([0, 1, 37, 130, 5, 70], [3, 1, 70, 0, 9, 70])
VARIANTS = [
    dict(),
    dict(causal=True),
    dict(causal=True, align="top_left"),
    dict(window=(7, 3)),
    dict(window=(None, 0), align="top_left"),
    dict(slopes="rows", softcap=2.5),
    dict(slopes="heads", sinks=True, causal=True),
    dict(causal=True, window=(16, None), scale=0.3, sinks=True),
]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(sorted(v)) or "plain")
def test_against_reference(variant, rng):
    H, Hk, d = 4, 2, 16
    q, k, v, cu_q, cu_k = packed(*LENS, H, Hk, d, rng)
    kwargs = dict(variant)
    if kwargs.get("slopes") == "rows":
        kwargs["alibi_slopes"] = rng.uniform(0.05, 0.5, (len(LENS[0]), H))
    elif kwargs.get("slopes") == "heads":
        kwargs["alibi_slopes"] = rng.uniform(0.05, 0.5, H)
    kwargs.pop("slopes", None)
    if kwargs.pop("sinks", False):
        kwargs["sinks"] = rng.uniform(-1, 2, H)
    ref_kwargs = dict(causal=kwargs.get("causal", False), align=kwargs.get("align", "bottom_right"),
                      slopes=kwargs.get("alibi_slopes"), softcap=kwargs.get("softcap"), scale=kwargs.get("scale"),
                      sinks=kwargs.get("sinks"))
    if "window" in kwargs:
        ref_kwargs["window"] = tuple(-1 if w is None else w for w in kwargs["window"])
    out, lse = attn.varlen_attention(q, k, v, cu_q, cu_k, **kwargs, return_lse=True)
    ref, ref_lse = reference(q, k, v, cu_q, cu_k, **ref_kwargs)
    assert out.shape == (cu_q[-1], H, d + 3) and lse.shape == (H, cu_q[-1])
    assert np.max(np.abs(out - ref)) < 1e-12
    np.testing.assert_allclose(lse, ref_lse, rtol=0, atol=1e-12)
    out32 = attn.varlen_attention(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), cu_q, cu_k,
                                  **{key: (val.astype(np.float32) if isinstance(val, np.ndarray) else val)
                                     for key, val in kwargs.items()})
    ref32, _ = reference(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), cu_q, cu_k,
                         dtype=np.float32, **ref_kwargs)
    assert out32.dtype == np.float32
    assert np.max(np.abs(out32 - ref)) <= 2 * np.max(np.abs(ref32 - ref)) + 1e-6


def test_dropout_is_attn_flash_pattern(rng):
    """The same seed gives attn.flash's dropout (its seed drawn from torch's generator) bit for bit."""
    torch = pytest.importorskip("torch")
    from attn.flash import flash_attn_varlen_func
    q, k, v, cu_q, cu_k = packed(*LENS, 2, 2, 8, rng)
    torch.manual_seed(3)
    seed = int(torch.randint(0, 2**62, (), dtype=torch.int64).item())
    torch.manual_seed(3)
    expected = flash_attn_varlen_func(*(torch.from_numpy(x) for x in (q, k, v)), torch.from_numpy(cu_q),
                                      torch.from_numpy(cu_k), 130, 70, dropout_p=0.3, causal=True)
    out = attn.varlen_attention(q, k, v, cu_q, cu_k, causal=True, dropout_p=0.3, seed=seed)
    assert np.array_equal(out, expected.numpy())


@pytest.mark.parametrize("change,error,words", [
    (dict(cu_seqlens_q=np.array([0, 2, 5])), TypeError, "cu_seqlens_q has dtype int64"),
    (dict(cu_seqlens_q=np.array([0, 3, 2, 5], np.int32)), ValueError, "cu_seqlens_q[2] is 2"),
    (dict(cu_seqlens_k=np.array([1, 4, 6], np.int32)), ValueError, "cu_seqlens_k[0] is 1"),
    (dict(cu_seqlens_k=np.array([0, 4, 5], np.int32)), ValueError, "cu_seqlens_k ends at 5"),
    (dict(max_seqlen_q=2), ValueError, "max_seqlen_q is 2"),
    (dict(sinks=np.zeros(3)), ValueError, "sinks has shape (3,)"),
    (dict(alibi_slopes=np.zeros((3, 2))), ValueError, "alibi_slopes has shape (3,2)"),
    (dict(k=np.zeros((6, 3, 8)), v=np.zeros((6, 3, 8))), ValueError, "multiple of the key heads"),
    (dict(align="middle"), ValueError, "align is \"middle\""),
    (dict(q=np.zeros((5, 2, 8), np.int32)), TypeError, "q has dtype int32"),
    (dict(q=np.zeros((5, 2, 8), np.float32), k=np.zeros((6, 2, 8), np.float32), v=np.zeros((6, 2, 8), np.float32),
          softcap=1e-46), ValueError, "softcap is 1e-46; it must be positive and finite in the computation's type"),
    (dict(q=np.zeros((5, 2, 8), np.float32), k=np.zeros((6, 2, 8), np.float32), v=np.zeros((6, 2, 8), np.float32),
          softcap=1e-40), ValueError, "softcap is 1e-40; it must be positive and finite in the computation's type, and so "
                                     "must its inverse"),
])
def test_bad_input_is_named(change, error, words):
    args = dict(q=np.zeros((5, 2, 8)), k=np.zeros((6, 2, 8)), v=np.zeros((6, 2, 8)),
                cu_seqlens_q=np.array([0, 2, 5], np.int32), cu_seqlens_k=np.array([0, 4, 6], np.int32))
    args.update(change)
    with pytest.raises(error) as info:
        attn.varlen_attention(**args)
    assert words in str(info.value)
