"""The alignment rule and attention sinks from Python (NumPy, attn.torch, KVCache), against float64
references written here from the definitions: query i sits at p(i) = i (top_left) or i + m - n
(bottom_right) for the causal mask, the window and ALiBi together; a sink is gpt-oss's extra softmax
column with no value (concatenate the logit, softmax, drop it)."""
import itertools
import math

import numpy as np
import pytest
import torch

import attn
import attn.torch as at


def reference(q, k, v, *, causal=False, align="top_left", window=None, slopes=None, sinks=None, softcap=None):
    """out (B, H, n, v) and lse (B, H, n) in float64 (NumPy), every rule written out."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    B, H, n, d = q.shape
    m = k.shape[2]
    group = H // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d)
    if softcap:
        s = softcap * np.tanh(s / softcap)
    p = np.arange(n)[:, None] + (m - n if align == "bottom_right" else 0)
    j = np.arange(m)[None, :]
    allowed = np.ones((n, m), dtype=bool)
    if causal:
        allowed &= j <= p
    if window is not None:
        left, right = window
        if left is not None and left >= 0:
            allowed &= j >= p - left
        if right is not None and right >= 0:
            allowed &= j <= p + right
    if slopes is not None:
        s = s - np.asarray(slopes, dtype=np.float64)[None, :, None, None] * np.abs(p - j)[None, None]
    s = np.where(allowed, s, -np.inf)
    if sinks is not None:  # gpt-oss: the sink logit as one more column
        col = np.broadcast_to(np.asarray(sinks, dtype=np.float64)[None, :, None, None], (B, H, n, 1))
        s = np.concatenate([s, col], axis=-1)
    top = np.max(s, axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0)
    e = np.exp(s - top)
    total = e.sum(-1, keepdims=True)
    w = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    if sinks is not None:
        w = w[..., :m]
    with np.errstate(divide="ignore"):
        lse = (np.log(total) + top)[..., 0]
    return w @ v, lse


SHAPES = [(3, 9), (7, 7), (9, 4)]


@pytest.mark.parametrize("n,m", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
def test_numpy_alignment_windows_alibi_sinks(n, m, causal, align):
    rng = np.random.default_rng(n * 100 + m)
    B, H, d = 2, 4, 8
    q, k, v = rng.normal(size=(B, H, n, d)), rng.normal(size=(B, 2, m, d)), rng.normal(size=(B, 2, m, 5))
    slopes = rng.uniform(0.1, 0.7, size=H)
    sinks = rng.uniform(-1, 2, size=H)
    for window, use_slopes, use_sinks in itertools.product([None, (2, 1), (4, 0)], [False, True], [False, True]):
        kwargs = dict(causal=causal, align=align, window=window,
                      alibi_slopes=slopes if use_slopes else None, sinks=sinks if use_sinks else None)
        out, lse = attn.scaled_dot_product_attention(q, k, v, return_lse=True, **kwargs)
        want, want_lse = reference(q, k, v, causal=causal, align=align, window=window,
                                   slopes=slopes if use_slopes else None, sinks=sinks if use_sinks else None)
        np.testing.assert_allclose(out, want, atol=1e-12, err_msg=str(kwargs))
        np.testing.assert_allclose(lse, want_lse, atol=1e-12, err_msg=str(kwargs))
        out32 = attn.scaled_dot_product_attention(*(x.astype(np.float32) for x in (q, k, v)),
                                                  **{**kwargs, "alibi_slopes": None if kwargs["alibi_slopes"] is None
                                                     else slopes.astype(np.float32),
                                                     "sinks": None if kwargs["sinks"] is None else sinks.astype(np.float32)})
        np.testing.assert_allclose(out32, want, atol=2e-5, err_msg=str(kwargs))


def test_numpy_spellings_agree():
    """causal='bottom_right' (today's spelling) is causal=True with align='bottom_right'."""
    rng = np.random.default_rng(1)
    q, k, v = rng.normal(size=(1, 2, 3, 4)), rng.normal(size=(1, 2, 8, 4)), rng.normal(size=(1, 2, 8, 4))
    a = attn.scaled_dot_product_attention(q, k, v, causal="bottom_right", window=(2, 0))
    b = attn.scaled_dot_product_attention(q, k, v, causal=True, align="bottom_right", window=(2, 0))
    np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="causal is top_left but align is bottom_right"):
        attn.scaled_dot_product_attention(q, k, v, causal="top_left", align="bottom_right")
    with pytest.raises(ValueError, match="align is \"diagonal\""):
        attn.scaled_dot_product_attention(q, k, v, align="diagonal")
    with pytest.raises(ValueError, match=r"sinks has shape \(3,\)"):
        attn.scaled_dot_product_attention(q, k, v, sinks=np.zeros(3))
    with pytest.raises(ValueError, match="sinks holds nan"):
        attn.scaled_dot_product_attention(q, k, v, sinks=np.array([0.0, np.nan]))


def torch_reference(q, k, v, sinks, *, causal, align, window=None, slopes=None):
    """The same attention in torch (autograd through q, k, v and sinks), gpt-oss's sink formulation."""
    B, H, n, d = q.shape
    m = k.shape[2]
    s = q @ k.transpose(-1, -2) / math.sqrt(d)
    p = torch.arange(n)[:, None] + (m - n if align == "bottom_right" else 0)
    j = torch.arange(m)[None, :]
    allowed = torch.ones(n, m, dtype=torch.bool)
    if causal:
        allowed &= j <= p
    if window is not None:
        allowed &= (j >= p - window[0]) & (j <= p + window[1])
    if slopes is not None:
        s = s - slopes[None, :, None, None] * (p - j).abs()[None, None]
    s = s.masked_fill(~allowed, float("-inf"))
    s = torch.cat([s, sinks[None, :, None, None].expand(B, H, n, 1)], dim=-1)
    w = torch.softmax(s, dim=-1)[..., :m]
    return w @ v, torch.logsumexp(s, dim=-1)


@pytest.mark.parametrize("n,m", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
def test_torch_sinks_gradients_and_lse(n, m, causal, align):
    torch.manual_seed(n * 10 + m)
    B, H, d = 2, 3, 6
    q = torch.randn(B, H, n, d, dtype=torch.float64, requires_grad=True)
    k = torch.randn(B, H, m, d, dtype=torch.float64, requires_grad=True)
    v = torch.randn(B, H, m, d, dtype=torch.float64, requires_grad=True)
    sinks = torch.randn(H, dtype=torch.float64, requires_grad=True)
    slopes = torch.rand(H, dtype=torch.float64)
    out, lse = at.scaled_dot_product_attention(q, k, v, is_causal=causal, align=align, window=(3, 1),
                                               alibi_slopes=slopes, sinks=sinks, return_lse=True)
    want, want_lse = torch_reference(q, k, v, sinks, causal=causal, align=align, window=(3, 1), slopes=slopes)
    torch.testing.assert_close(out, want, atol=1e-12, rtol=0)
    torch.testing.assert_close(lse, want_lse, atol=1e-12, rtol=0)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v, sinks), g)
    expected = torch.autograd.grad(want, (q, k, v, sinks), g)
    for a, b, name in zip(got, expected, "qkv", strict=False):
        torch.testing.assert_close(a, b, atol=1e-11, rtol=0, msg=f"grad {name}")
    torch.testing.assert_close(got[3], expected[3], atol=1e-11, rtol=0, msg="grad sinks")
    fn = lambda q, k, v, s: at.scaled_dot_product_attention(q, k, v, is_causal=causal, align=align,  # noqa: E731
                                                            window=(3, 1), sinks=s)
    small = [x.detach()[:1, :, :, :3].clone().requires_grad_() for x in (q, k, v)]
    assert torch.autograd.gradcheck(fn, (*small, sinks))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_torch_sinks_error_rule(dtype):
    """FlashAttention's rule: attn's error against float64 at most 2x (out) and 3x (gradients) that of
    the same reference computed in the tensors' dtype."""
    torch.manual_seed(0)
    B, H, n, m, d = 2, 4, 113, 203, 64
    q64, k64, v64 = (torch.randn(B, H, r, d, dtype=torch.float64) for r in (n, m, m))
    s64 = torch.randn(H, dtype=torch.float64) + 2
    g64 = torch.randn(B, H, n, d, dtype=torch.float64)

    def grads(fn, dt):
        xs = [x.to(dt).requires_grad_() for x in (q64, k64, v64, s64)]
        if dt in (torch.bfloat16, torch.float16):
            xs[3] = s64.float().requires_grad_()
        out = fn(*xs)
        return [out.double()] + [x.double() for x in torch.autograd.grad(out, xs, g64.to(out.dtype))]

    ref = lambda q, k, v, s: torch_reference(q, k, v, s, causal=True, align="bottom_right")[0]  # noqa: E731
    ours = lambda q, k, v, s: at.scaled_dot_product_attention(q, k, v, is_causal=True, align="bottom_right",  # noqa: E731
                                                              sinks=s)
    exact = grads(ref, torch.float64)
    if dtype == torch.float16:  # this torch has no float16 matmul on the CPU: float32 on float16 values, rounded
        same = grads(lambda q, k, v, s: ref(q.float(), k.float(), v.float(), s.float()).to(q.dtype), dtype)
    else:
        same = grads(lambda q, k, v, s: ref(q, k, v, s.to(q.dtype)), dtype)
    tested = grads(ours, dtype)
    for i, (e, r, t) in enumerate(zip(exact, same, tested, strict=True)):
        factor = 2 if i == 0 else 3
        err, budget = (t - e).abs().max().item(), (r - e).abs().max().item()
        assert err <= factor * budget + 1e-5, f"output {i}: error {err} > {factor} x {budget}"


def test_kv_cache_decode_window_without_causal():
    rng = np.random.default_rng(3)
    cache = attn.KVCache(1, 1, 64, block_size=16)
    k, v = rng.normal(size=(1, 100, 64)).astype(np.float32), rng.normal(size=(1, 100, 64)).astype(np.float32)
    cache.append(k, v, seq=0)
    q = rng.normal(size=(1, 1, 64)).astype(np.float32)
    out = cache.attend(q, seq=0, causal=False, window=(4, 0))
    want, _ = reference(q[None], k[None], v[None], window=(4, 0), align="bottom_right")
    np.testing.assert_allclose(out, want[0], atol=1e-5)
    sinks = np.array([1.5], dtype=np.float32)
    out = cache.attend(q, seq=0, sinks=sinks)
    want, _ = reference(q[None], k[None], v[None], causal=True, align="bottom_right", sinks=sinks)
    np.testing.assert_allclose(out, want[0], atol=1e-5)
    with pytest.raises(ValueError, match="causal is top_left"):
        cache.attend(q, seq=0, causal="top_left")
