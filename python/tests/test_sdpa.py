"""attn.scaled_dot_product_attention against the d2l chapter's DotProductAttention and its masked variants,
and its dropout: which weights it drops, and that the seed alone decides."""
import math

import numpy as np
import pytest

import attn
import d2l_torch
from helpers import assert_within_budget, draw_lens, max_err, torch, torch_both

DTYPES = [np.float32, np.float64]


def qkv(rng, lead, n, m, d, v, qscale=1.0):
    f = lambda *shape: rng.standard_normal(shape).astype(np.float32)
    return f(*lead, n, d) * np.float32(qscale), f(*lead, m, d), f(*lead, m, v)


def check(got, refs, what):
    for i, (name, (r32, r64)) in enumerate(refs.items()):
        assert_within_budget(got[i] if isinstance(got, tuple) else got, r32, r64, f"{what}: {name}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lens_kind", [None, "batch", "query"])
@pytest.mark.parametrize("draw", range(3))
def test_sdpa_matches_the_d2l_dot_product_attention(rng, draw, lens_kind, dtype):
    B, n, m, d, v = rng.integers(1, 4), *rng.integers(1, 50, size=4)
    q, k, vv = qkv(rng, (B,), n, m, d, v)
    lens = draw_lens(rng, lens_kind, B, n, m)

    def run(t):
        attention = d2l_torch.DotProductAttention(dropout=0.5)
        attention.eval()
        out = attention(t["q"], t["k"], t["v"], t["lens"])
        return {"out": out, "weights": attention.attention_weights}

    refs = torch_both(run, {"q": q, "k": k, "v": vv, "lens": lens})
    got = attn.scaled_dot_product_attention(q.astype(dtype), k.astype(dtype), vv.astype(dtype), lens,
                                            return_weights=True)
    assert [g.dtype for g in got] == [dtype, dtype]
    check(got, refs, f"({B},{n},{m},{d},{v}) lens {lens_kind}")


def test_sdpa_odd_sizes_and_large_scores(rng):
    # n = 113, m = 203, d = 64; queries scaled by 100: scores overflow exp() without the max.
    q, k, v = qkv(rng, (2,), 113, 203, 64, 32, qscale=100.0)
    lens = draw_lens(rng, "query", 2, 113, 203)
    refs = torch_both(lambda t: {"out": d2l_torch.DotProductAttention(0.0)(t["q"], t["k"], t["v"], t["lens"])},
                      {"q": q, "k": k, "v": v, "lens": lens})
    check(attn.scaled_dot_product_attention(q, k, v, lens), refs, "large scores")


def reference(t, scale, fill="exclude", causal=False):
    """softmax of the masked, scaled scores times v, in torch: DotProductAttention's formula with
    d2l_torch.masked_softmax_general for attn's masks."""
    S = torch.matmul(t["q"], t["k"].transpose(-1, -2)) * scale
    W = d2l_torch.masked_softmax_general(S, t.get("lens"), t.get("keep"), t.get("additive"), causal, fill)
    return {"out": torch.matmul(W, t["v"]), "weights": W}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", [False, True])
@pytest.mark.parametrize("masks", ["zero_lens", "keep", "additive", "causal", "bottom_right", "scale"])
def test_sdpa_masks_heads_and_scale(rng, masks, heads, dtype):
    B, H, n, m, d, v = rng.integers(1, 4), rng.integers(1, 4), *rng.integers(1, 40, size=4)
    lead = (B, H) if heads else (B,)
    q, k, vv = qkv(rng, lead, n, m, d, v)
    arrays, kw = {"q": q, "k": k, "v": vv}, {}
    if masks == "zero_lens":
        arrays["lens"] = kw["valid_lens"] = draw_lens(rng, "query", B, n, m, zero=True)
    if masks == "keep":
        arrays["keep"] = kw["mask"] = rng.random((*lead, n, m)) < 0.6
    if masks == "additive":
        arrays["additive"] = rng.standard_normal((n, m)).astype(np.float32)
        kw["mask"] = arrays["additive"].astype(dtype)
    causal = {"causal": True, "bottom_right": "bottom_right"}.get(masks, False)
    scale = 0.37 if masks == "scale" else 1 / math.sqrt(d)
    refs = torch_both(lambda t: reference(t, scale, causal=causal), arrays)
    got = attn.scaled_dot_product_attention(q.astype(dtype), k.astype(dtype), vv.astype(dtype), causal=causal,
                                            scale=0.37 if masks == "scale" else None, return_weights=True, **kw)
    check(got, refs, f"{masks} {lead}")


def test_sdpa_d2l_fill_gives_empty_rows_the_d2l_average(rng):
    q, k, v = qkv(rng, (3,), 5, 7, 4, 3)
    lens = np.array([0, 7, 2])
    refs = torch_both(lambda t: {"out": d2l_torch.DotProductAttention(0.0)(t["q"], t["k"], t["v"], t["lens"])},
                      {"q": q, "k": k, "v": v, "lens": lens})
    check(attn.scaled_dot_product_attention(q, k, v, lens, masked_fill="d2l_minus_1e6"), refs, "d2l fill")
    assert np.all(attn.scaled_dot_product_attention(q, k, v, lens)[0] == 0)  # attn's default: an empty row is 0


# ---- dropout --------------------------------------------------------------------------------------


def dropped_weights(q, k, lens, p, seed):
    """The weights after dropout, read off an output: with values the identity (v = m), out = weights."""
    B, m = k.shape[0], k.shape[-2]
    eye = np.broadcast_to(np.eye(m, dtype=q.dtype), (B, m, m))
    return attn.scaled_dot_product_attention(q, k, eye, lens, dropout_p=p, seed=seed)


def test_sdpa_dropout_is_the_d2l_dropout_of_the_weights(rng):
    # dropout(W) v with W the weights before dropout: each weight kept (scaled by 1/(1-p)) or 0.
    q, k, v = qkv(rng, (2,), 31, 47, 8, 5)
    lens, p, seed = draw_lens(rng, "batch", 2, 31, 47), 0.3, 1234
    out, weights = attn.scaled_dot_product_attention(q, k, v, lens, dropout_p=p, seed=seed, return_weights=True)
    D = dropped_weights(q, k, lens, p, seed)
    kept = D != 0
    np.testing.assert_allclose(D[kept], weights[kept] / (1 - p), rtol=1e-6)
    assert 0.6 < kept[weights > 0].mean() < 0.8  # about 1 - p of the weights survive (here ~800 of them)

    def run(t):  # the d2l chapter's bmm(dropout(W), v) with attn's dropout mask
        W = d2l_torch.masked_softmax(torch.bmm(t["q"], t["k"].transpose(1, 2)) / math.sqrt(8), t["lens"])
        return {"out": torch.bmm(W * t["kept"] / (1 - p), t["v"])}

    refs = torch_both(run, {"q": q, "k": k, "v": v, "lens": lens, "kept": kept.astype(np.float32)})
    check(out, refs, "dropout")


def test_sdpa_dropout_mask_depends_on_the_seed_only(rng):
    q, k, _ = qkv(rng, (2,), 9, 11, 4, 1)
    a, b, c = (dropped_weights(q, k, None, 0.5, s) for s in (7, 7, 8))
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    # The same mask in float64: the keep decisions do not depend on the dtype.
    d = dropped_weights(q.astype(np.float64), k.astype(np.float64), None, 0.5, 7)
    assert np.array_equal(a != 0, d != 0)
    assert max_err(attn.scaled_dot_product_attention(q, k, k, dropout_p=0.0, seed=3),
                   attn.scaled_dot_product_attention(q, k, k)) == 0  # p = 0: nothing dropped, any seed
