"""scaled_dot_product_attention with grouped-query heads, windows, ALiBi, soft-capping and packed
sequences against PyTorch's math written out (PyTorch 1.13 has none of them as options): keys and
values repeated per query head (repeat_interleave), an explicit boolean mask and an additive bias on
the scores; outputs and lse under the error budget, the keyword errors by type and message."""
import numpy as np
import pytest

import attn
from helpers import assert_within_budget, torch, torch_both


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def torch_sdpa(t, *, causal=None, window=None, alibi=None, softcap=None, seg=None, lens=None):
    """out and lse of attention written plainly in torch, from tensors t (q, k, v, and the options')."""
    q, k, v = t["q"], t["k"], t["v"]
    B, H, n, d = q.shape
    m = k.shape[-2]
    k = k.repeat_interleave(H // k.shape[1], dim=1)
    v = v.repeat_interleave(H // v.shape[1], dim=1)
    s = q @ k.transpose(-1, -2) / d ** 0.5
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    offset = m - n if causal == "bottom_right" else 0
    i = torch.arange(n)[:, None] + offset
    j = torch.arange(m)[None, :]
    if alibi is not None:  # slopes (H,) or (B, H)
        slopes = t["slopes"].reshape(-1, H, 1, 1)
        s = s - slopes * (i - j).abs().to(s.dtype)
    allowed = torch.ones(B, H, n, m, dtype=torch.bool)
    if causal is not None:
        allowed &= j <= i
    if window is not None:
        left, right = window
        if left is not None and left >= 0:
            allowed &= j >= i - left
        if right is not None and right >= 0:
            allowed &= j <= i + right
    if seg is not None:
        sq, sk = t["seg_q"], t["seg_k"]
        allowed &= (sq[:, None, :, None] == sk[:, None, None, :])
    if lens is not None:
        allowed &= j[None, None] < t["lens"][:, None, None, None]
    s = s.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # a row with no key: weights 0
    return {"out": p @ v, "lse": lse}


CASES = {
    "gqa": dict(H=6, Hk=2),
    "mqa": dict(H=4, Hk=1),
    "window": dict(window=(9, 4)),
    "window_causal_bottom_right": dict(window=(20, 0), causal="bottom_right", n=17),
    "window_one_side": dict(window=(None, 3)),
    "alibi": dict(alibi=True),
    "alibi_per_batch": dict(alibi="batch", causal="bottom_right", n=5),
    "softcap": dict(softcap=3.0),
    "segments": dict(seg=True, causal="top_left"),
    "segments_pair": dict(seg="pair", n=29, causal="bottom_right"),
    "decode_everything": dict(H=8, Hk=2, n=2, window=(300, 0), causal="bottom_right", alibi=True, softcap=5.0,
                              seg="pair", lens=True, m=700),
    "everything": dict(H=6, Hk=3, window=(30, 2), causal="bottom_right", alibi=True, softcap=4.0, seg="pair",
                       lens=True, n=41),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", list(CASES))
def test_matches_torch_written_out(rng, name, dtype):
    c = dict(B=2, H=2, Hk=None, n=None, m=53, d=13, v=7)
    c.update(CASES[name])
    B, H, m, d, v = c["B"], c["H"], c["m"], c["d"], c["v"]
    Hk = c["Hk"] or H
    n = c["n"] or m
    arrays = {"q": f32(rng, B, H, n, d), "k": f32(rng, B, Hk, m, d), "v": f32(rng, B, Hk, m, v)}
    kwargs, opts = {}, {}
    if c.get("causal"):
        kwargs["causal"] = opts["causal"] = c["causal"]
    if c.get("window"):
        kwargs["window"] = opts["window"] = c["window"]
    if c.get("alibi"):
        arrays["slopes"] = (rng.random((B, H) if c["alibi"] == "batch" else (H,)) + 0.1).astype(np.float32)
        kwargs["alibi_slopes"], opts["alibi"] = arrays["slopes"], True
    if c.get("softcap"):
        kwargs["softcap"] = opts["softcap"] = c["softcap"]
    if c.get("seg"):
        sk = np.sort(rng.integers(0, 4, size=(B, m))).astype(np.int32)
        sq = sk[:, m - n:] if c["seg"] == "pair" else sk
        arrays["seg_q"], arrays["seg_k"] = sq, sk
        kwargs["segment_ids"] = (sq, sk) if c["seg"] == "pair" else sq
        opts["seg"] = True
    if c.get("lens"):
        arrays["lens"] = np.array([m, m // 2 + 3])
        kwargs["valid_lens"], opts["lens"] = arrays["lens"], True
    refs = torch_both(lambda t: torch_sdpa(t, **opts), arrays)
    cast = {k: arrays[k].astype(dtype) for k in ("q", "k", "v")}
    if "alibi_slopes" in kwargs:
        kwargs["alibi_slopes"] = kwargs["alibi_slopes"].astype(dtype)
    out, lse = attn.scaled_dot_product_attention(cast["q"], cast["k"], cast["v"], return_lse=True, **kwargs)
    assert out.dtype == dtype and lse.dtype == dtype and lse.shape == (B, H, n)
    assert_within_budget(out, *refs["out"], f"{name}: out")
    finite = np.isfinite(refs["lse"][1])
    np.testing.assert_array_equal(np.isfinite(lse), finite)  # -inf exactly for the rows with no key
    assert_within_budget(lse[finite], refs["lse"][0][finite], refs["lse"][1][finite], f"{name}: lse")


def test_return_lse_and_weights_together(rng):
    q, k, v = f32(rng, 2, 5, 4), f32(rng, 2, 7, 4), f32(rng, 2, 7, 3)
    out, weights, lse = attn.scaled_dot_product_attention(q, k, v, return_weights=True, return_lse=True)
    assert weights.shape == (2, 5, 7) and lse.shape == (2, 5)
    s = q.astype(np.float64) @ k.astype(np.float64).transpose(0, 2, 1) / 2
    np.testing.assert_allclose(lse, np.log(np.exp(s).sum(-1)), rtol=1e-6)
    # Asking for the weights takes the unfused path: the same out up to rounding.
    np.testing.assert_allclose(out, attn.scaled_dot_product_attention(q, k, v), rtol=0, atol=1e-6)


def test_bad_keywords_raise_naming_the_argument(rng):
    q, k, v = f32(rng, 1, 6, 5, 4), f32(rng, 1, 4, 5, 4), f32(rng, 1, 4, 5, 3)
    with pytest.raises(ValueError, match="k \\(keys\\) has shape \\(1,4,5,4\\) with 4 heads but queries"):
        attn.scaled_dot_product_attention(q, k, v)
    q4 = f32(rng, 1, 4, 5, 4)
    with pytest.raises(TypeError, match="window must be a pair"):
        attn.scaled_dot_product_attention(q4, k, v, window=(1, 2, 3))
    with pytest.raises(TypeError, match="window\\[0\\] \\(left\\) must be an integer"):
        attn.scaled_dot_product_attention(q4, k, v, window=(1.5, 2))
    with pytest.raises(ValueError, match="alibi_slopes has shape \\(3,\\); it must be \\(H,\\) = \\(4,\\)"):
        attn.scaled_dot_product_attention(q4, k, v, alibi_slopes=np.ones(3, np.float32))
    with pytest.raises(ValueError, match="alibi_slopes holds inf"):
        attn.scaled_dot_product_attention(q4, k, v, alibi_slopes=np.array([1, np.inf, 1, 1], np.float32))
    for cap in (0.0, -2.0, float("nan")):
        with pytest.raises(ValueError, match="softcap is .*; it must be positive and finite"):
            attn.scaled_dot_product_attention(q4, k, v, softcap=cap)
    with pytest.raises(TypeError, match="segment_ids has dtype float32; segment ids are int32 or int64"):
        attn.scaled_dot_product_attention(q4, k, v, segment_ids=np.zeros((1, 5), np.float32))
    with pytest.raises(ValueError, match="segment_ids \\(queries\\) has shape \\(1,4\\); it must be \\(B, n\\)"):
        attn.scaled_dot_product_attention(q4, k, v, segment_ids=np.zeros((1, 4), np.int64))
    with pytest.raises(ValueError, match="mask has shape \\(1,1,5,5\\)|mask has shape \\(1,4,5,5\\)"):
        attn.scaled_dot_product_attention(f32(rng, 1, 8, 5, 4), k, v, mask=np.ones((1, 4, 5, 5), bool))
