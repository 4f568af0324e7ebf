"""attn.masked_softmax and attn.bmm against the d2l chapter's PyTorch code, on random shapes, masks and values.

Every input is drawn in float32; torch runs on it in float32 and in float64, attn in the dtype of
the test, and helpers.assert_within_budget applies STYLE.md's error budget.
"""
import numpy as np
import pytest

import attn
import d2l_torch
from helpers import assert_within_budget, draw_lens, torch, torch_both

DTYPES = [np.float32, np.float64]


def scores(rng, shape, scale=5.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def check(got, refs, what):
    for name, (r32, r64) in refs.items():
        assert_within_budget(got if len(refs) == 1 else got[name], r32, r64, f"{what}: {name}")


# ---- masked_softmax: the d2l chapter's valid lengths ----------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lens_kind", [None, "batch", "query"])
@pytest.mark.parametrize("draw", range(4))
def test_masked_softmax_matches_the_d2l(rng, draw, lens_kind, dtype):
    B, n, m = rng.integers(1, 4), rng.integers(1, 40), rng.integers(1, 60)
    X, lens = scores(rng, (B, n, m)), draw_lens(rng, lens_kind, B, n, m)
    # The d2l chapter's masked_softmax writes into X's reshaped view: give it a computed tensor (X * 1).
    refs = torch_both(lambda t: {"weights": d2l_torch.masked_softmax(t["X"] * 1, t["lens"])}, {"X": X, "lens": lens})
    got = attn.masked_softmax(X.astype(dtype), lens)
    assert got.dtype == dtype and got.shape == X.shape
    check(got, refs, f"({B},{n},{m}) lens {lens_kind}")


def test_masked_softmax_odd_sizes_and_scores_that_overflow_exp(rng):
    # n = 113, m = 203; scores of several hundred overflow exp() without the max subtraction.
    X, lens = scores(rng, (3, 113, 203), scale=300.0), draw_lens(rng, "query", 3, 113, 203)
    refs = torch_both(lambda t: {"w": d2l_torch.masked_softmax(t["X"] * 1, t["lens"])}, {"X": X, "lens": lens})
    got = attn.masked_softmax(X, lens)
    assert np.all(np.isfinite(got))
    check(got, refs, "large scores")


@pytest.mark.parametrize("lens_kind", ["batch", "query"])
def test_masked_softmax_rows_with_valid_length_zero(rng, lens_kind):
    # attn's default gives such a row weights 0; masked_fill="d2l_minus_1e6" reproduces the d2l chapter's
    # uniform row exactly as their code computes it.
    B, n, m = 4, 7, 9
    X, lens = scores(rng, (B, n, m)), draw_lens(rng, lens_kind, B, n, m, zero=True)
    exclude = torch_both(lambda t: {"w": d2l_torch.masked_softmax_exclude(t["X"] * 1, t["lens"])}, {"X": X, "lens": lens})
    theirs = torch_both(lambda t: {"w": d2l_torch.masked_softmax(t["X"] * 1, t["lens"])}, {"X": X, "lens": lens})
    check(attn.masked_softmax(X, lens), exclude, "exclude")
    check(attn.masked_softmax(X, lens, masked_fill="d2l_minus_1e6"), theirs, "d2l_minus_1e6")
    empty = (lens if lens.ndim == 2 else np.repeat(lens[:, None], n, 1)) == 0
    assert empty.any() and np.all(attn.masked_softmax(X, lens)[empty] == 0)



# ---- masked_softmax: the masks attn adds -----------------------------------------------------------


def general(X, lens=None, keep=None, additive=None, causal=False, fill="exclude"):
    """torch float32 and float64 of d2l_torch.masked_softmax_general on the NumPy inputs."""
    arrays = {"X": X, "lens": lens, "keep": keep, "additive": additive}
    return torch_both(lambda t: {"w": d2l_torch.masked_softmax_general(
        t["X"], t["lens"], t["keep"], t["additive"], causal, fill)}, arrays)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", [False, True])
@pytest.mark.parametrize("mask_kind", ["keep", "keep_key_padding", "additive", "causal", "bottom_right", "all"])
def test_masked_softmax_masks(rng, mask_kind, heads, dtype):
    B, H, n, m = rng.integers(1, 4), rng.integers(1, 4), rng.integers(1, 30), rng.integers(1, 40)
    shape = (B, H, n, m) if heads else (B, n, m)
    X = scores(rng, shape)
    kw = {}
    if mask_kind in ("keep", "all"):
        kw["keep"] = rng.random(shape) < 0.7  # some rows lose every key: they must be 0
    if mask_kind == "keep_key_padding":
        kw["keep"] = (rng.random((B, 1, 1, m) if heads else (B, 1, m)) < 0.8)  # broadcast over heads and queries
    if mask_kind == "additive":
        additive = rng.standard_normal((n, m)).astype(np.float32)  # broadcast over batch and heads
        additive[rng.random((n, m)) < 0.2] = -np.inf
        kw["additive"] = additive
    # "all": valid lengths, a keep-mask and causal together (mask= takes one mask, bool or float).
    causal = {"causal": "top_left", "bottom_right": "bottom_right", "all": True}.get(mask_kind, False)
    lens = draw_lens(rng, "query", B, n, m) if mask_kind == "all" else None
    refs = general(X, lens, causal=causal, **kw)
    mask = kw.get("keep", kw.get("additive"))
    got = attn.masked_softmax(X.astype(dtype), lens, mask=None if mask is None else mask.astype(
        bool if mask.dtype == bool else dtype), causal=causal)
    check(got, refs, f"{mask_kind} {shape}")


def test_masked_softmax_d2l_fill_with_every_mask(rng):
    X, keep = scores(rng, (2, 5, 6)), rng.random((2, 5, 6)) < 0.5
    check(attn.masked_softmax(X, mask=keep, causal=True, masked_fill="d2l_minus_1e6"),
          general(X, keep=keep, causal=True, fill="d2l_minus_1e6"), "d2l fill")


# ---- bmm -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("transpose", [(False, False), (False, True), (True, False), (True, True)])
@pytest.mark.parametrize("heads", [False, True])
def test_bmm_matches_torch(rng, heads, transpose, dtype):
    lead = (rng.integers(1, 4), rng.integers(1, 4)) if heads else (rng.integers(1, 5),)
    r, k, c = rng.integers(1, 70, size=3)
    ta, tb = transpose
    a = rng.standard_normal((*lead, k, r) if ta else (*lead, r, k)).astype(np.float32)
    b = rng.standard_normal((*lead, c, k) if tb else (*lead, k, c)).astype(np.float32)

    def run(t):
        x, y = t["a"], t["b"]
        return {"out": torch.matmul(x.transpose(-1, -2) if ta else x, y.transpose(-1, -2) if tb else y)}

    got = attn.bmm(a.astype(dtype), b.astype(dtype), transpose_a=ta, transpose_b=tb)
    assert got.shape == (*lead, r, c) and got.dtype == dtype
    check(got, torch_both(run, {"a": a, "b": b}), f"bmm {lead} {transpose}")


def test_bmm_is_torch_bmm_on_the_d2l_example(rng):
    # The d2l chapter's Q = d2l.ones((2, 3, 4)), K = d2l.ones((2, 4, 6)): torch.bmm(Q, K) is (2, 3, 6) of 4s.
    ones = attn.bmm(np.ones((2, 3, 4), np.float32), np.ones((2, 4, 6), np.float32))
    np.testing.assert_array_equal(ones, torch.bmm(torch.ones(2, 3, 4), torch.ones(2, 4, 6)).numpy())
    # The same shapes with random values, against torch.bmm in float64 within the error budget
    # (drawn in float32, as every test here: the float32 and float64 calls see the same values).
    Q, K = scores(rng, (2, 3, 4), 1.0), scores(rng, (2, 4, 6), 1.0)
    refs = torch_both(lambda t: {"out": torch.bmm(t["Q"], t["K"])}, {"Q": Q, "K": K})
    for dtype in DTYPES:
        check(attn.bmm(Q.astype(dtype), K.astype(dtype)), refs, f"bmm (2, 3, 4) @ (2, 4, 6) in {dtype.__name__}")
