"""attn.torch: attn's kernels as PyTorch autograd functions and modules.

Against PyTorch's own math (torch 1.13 has no fused SDPA: the formula in torch ops, in float64 as
the reference and float32 for the error budget of helpers.assert_within_budget), outputs and
gradients, for every mask and variant; torch.autograd.gradcheck in float64 for each operation;
bfloat16 and float16 tensors under the 16-bit rule; strides, broadcasts, partial requires_grad,
no copy of contiguous inputs; dropout from torch's generator; the modules' state_dict against the
textbook's modules; errors as PyTorch users expect.
"""
import math
import os
import pathlib
import re
import subprocess
import sys
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import attn  # noqa: E402
import attn.torch as at  # noqa: E402
from helpers import assert_within_budget, longest_pause_during_a_call, max_err  # noqa: E402
from d2l_torch import AdditiveAttention as D2lAdditive  # noqa: E402
from d2l_torch import MultiHeadAttention as D2lMultiHead  # noqa: E402
from d2l_torch import allowed_keys  # noqa: E402
from d2l_torch import nadaraya_watson as d2l_nadaraya_watson  # noqa: E402


class _RoundedGradient(torch.autograd.Function):
    """The identity, whose gradient is rounded to a 16-bit dtype on its way back."""

    @staticmethod
    def forward(ctx, x, dtype):
        ctx.dtype = dtype
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad.to(ctx.dtype).to(grad.dtype), None


def reference_sdpa(q, k, v, attn_mask=None, is_causal=False, scale=None, valid_lens=None, window=None,
                   alibi_slopes=None, softcap=None, segment_ids=None, low=None):
    """The formula in torch ops (attn/mask.hpp's order: scale, soft-cap, ALiBi, additive mask, then the
    allowed keys), in the inputs' dtype; a row with no key is 0. low: a 16-bit dtype the weights are
    rounded to before they pool the values, the output after, and the scores' gradient dS before it
    reaches dQ and dK (FlashAttention's 16-bit rule: its reference runs in the 16-bit type, whose
    products take P and dS rounded to it, as attn's bfloat16 kernel does)."""
    if q.dim() == 4 and k.shape[1] != q.shape[1]:
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    L, S = q.shape[-2], k.shape[-2]
    s = q @ k.transpose(-1, -2) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if low is not None:
        s = _RoundedGradient.apply(s, low)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    causal = "top_left" if is_causal is True else is_causal
    position = torch.arange(L)[:, None] + (S - L if causal == "bottom_right" else 0)
    j = torch.arange(S)[None, :]
    if alibi_slopes is not None:
        slopes = alibi_slopes.to(s.dtype)
        s = s - slopes[..., None, None] * (position - j).abs().to(s.dtype)
    keep = None
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            keep = attn_mask
        else:
            s = s + attn_mask.to(s.dtype)
    allowed = allowed_keys(s.shape, valid_lens, keep, causal or False)
    if window is not None:
        left, right = (math.inf if w is None else w for w in window)
        allowed = allowed & (j >= position - left) & (j <= position + right)
    if segment_ids is not None:
        seg_q, seg_k = segment_ids if isinstance(segment_ids, tuple) else (segment_ids, segment_ids)
        same = seg_q[:, :, None] == seg_k[:, None, :]  # (B, L, S)
        allowed = allowed & (same[:, None] if s.dim() == 4 else same)
    w = torch.nan_to_num(torch.softmax(s.masked_fill(~allowed, -math.inf), dim=-1), nan=0.0)
    if low is not None:
        return (w.to(low).to(w.dtype) @ v).to(low).to(w.dtype)
    return w @ v


def draw(shape, dtype=torch.float64, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype).requires_grad_(requires_grad)


B, H, HK, L, S, E, EV = 2, 4, 2, 5, 7, 8, 6

# Each variant: the keywords of one call (tensors in float64; cast to the call's dtype by `cast`).
VARIANTS = {
    "none": {},
    "bool_mask": {"attn_mask": draw((L, S), seed=1) > -0.5},
    "float_mask": {"attn_mask": draw((B, 1, L, S), seed=2)},
    "causal": {"is_causal": True},
    "causal_bottom_right": {"is_causal": "bottom_right"},
    "valid_lens_batch": {"valid_lens": torch.tensor([3, 7])},
    "valid_lens_query": {"valid_lens": torch.tensor([[1, 2, 3, 0, 7], [7, 6, 5, 4, 3]])},
    "window": {"window": (2, 1)},
    "window_causal": {"window": (3, None), "is_causal": "bottom_right"},
    "alibi": {"alibi_slopes": torch.tensor([0.5, 0.25, 0.125, 0.0625], dtype=torch.float64)},
    "softcap": {"softcap": 2.0, "scale": 0.9},
    "segments": {"segment_ids": (torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 2, 2]]),
                                 torch.tensor([[0, 0, 0, 1, 1, 1, 1], [0, 1, 1, 1, 2, 2, 2]]))},
    "gqa_all": {"attn_mask": draw((L, S), seed=3) > -1.0, "is_causal": "bottom_right", "window": (4, 0),
                "alibi_slopes": torch.tensor([[0.3, 0.2, 0.1, 0.05], [0.1, 0.1, 0.1, 0.1]], dtype=torch.float64),
                "softcap": 5.0},
}


def cast(kwargs, dtype):
    return {name: value.to(dtype) if isinstance(value, torch.Tensor) and value.is_floating_point() else value
            for name, value in kwargs.items()}


def qkv(dtype, requires_grad=True, seed=10, heads=(H, HK)):
    return (draw((B, heads[0], L, E), dtype, seed, requires_grad), draw((B, heads[1], S, E), dtype, seed + 1, requires_grad),
            draw((B, heads[1], S, EV), dtype, seed + 2, requires_grad))


def outputs_and_grads(run, tensors):
    out = run(*tensors)
    upstream = draw(out.shape, out.dtype, seed=99)
    grads = torch.autograd.grad(out, tensors, upstream)
    return [out.detach()] + [g.detach() for g in grads]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_sdpa_matches_torch_math_with_its_gradients(variant):
    kwargs = VARIANTS[variant]
    ours = outputs_and_grads(lambda q, k, v: at.scaled_dot_product_attention(q, k, v, enable_gqa=True,
                                                                             **cast(kwargs, torch.float32)),
                             qkv(torch.float32))
    ref32 = outputs_and_grads(lambda q, k, v: reference_sdpa(q, k, v, **cast(kwargs, torch.float32)), qkv(torch.float32))
    ref64 = outputs_and_grads(lambda q, k, v: reference_sdpa(q, k, v, **kwargs), qkv(torch.float64))
    for name, got, r32, r64 in zip(("out", "dq", "dk", "dv"), ours, ref32, ref64):
        assert got.dtype == torch.float32
        assert_within_budget(got.numpy(), r32.numpy(), r64.numpy(), f"{variant} {name}")
    ours64 = outputs_and_grads(lambda q, k, v: at.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kwargs),
                               qkv(torch.float64))
    for name, got, r32, r64 in zip(("out", "dq", "dk", "dv"), ours64, ref32, ref64):
        assert_within_budget(got.numpy(), r32.numpy(), r64.numpy(), f"{variant} {name} float64")


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_sdpa_gradcheck_float64(variant):
    kwargs = VARIANTS[variant]
    q, k, v = (draw((2, 4, 3, 3), seed=20, requires_grad=True), draw((2, 2, 4, 3), seed=21, requires_grad=True),
               draw((2, 2, 4, 2), seed=22, requires_grad=True))
    small = dict(kwargs)
    if "attn_mask" in small:
        small["attn_mask"] = small["attn_mask"][..., :3, :4]
    if "valid_lens" in small:
        small["valid_lens"] = small["valid_lens"][..., :3].clamp(max=4)
    if "segment_ids" in small:
        small["segment_ids"] = (small["segment_ids"][0][:, :3], small["segment_ids"][1][:, :4])
    assert torch.autograd.gradcheck(lambda q, k, v: at.scaled_dot_product_attention(q, k, v, enable_gqa=True, **small),
                                    (q, k, v))


def test_sdpa_gradcheck_with_dropout_under_a_fixed_torch_seed():
    q, k, v = (draw((1, 2, 4, 3), seed=s, requires_grad=True) for s in (30, 31, 32))

    def run(q, k, v):
        torch.manual_seed(7)  # the same dropout mask in every evaluation
        return at.scaled_dot_product_attention(q, k, v, dropout_p=0.4)

    assert torch.autograd.gradcheck(run, (q, k, v))


def test_dropout_follows_torch_manual_seed():
    q, k, v = qkv(torch.float32, requires_grad=False, heads=(H, H))
    torch.manual_seed(3)
    first = at.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    torch.manual_seed(3)
    again = at.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    other = at.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
    # in expectation dropout keeps the mean: many seeds average to the undropped output
    plain = at.scaled_dot_product_attention(q, k, v)
    mean = sum(at.scaled_dot_product_attention(q, k, v, dropout_p=0.5) for _ in range(400)) / 400
    assert float((mean - plain).abs().mean()) < 0.1 * float(plain.abs().mean())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("variant", ["none", "float_mask", "causal", "gqa_all"])
def test_sixteen_bit_tensors_within_the_sixteen_bit_rule(dtype, variant):
    kwargs = VARIANTS[variant]
    rounded = [x.detach().to(dtype) for x in qkv(torch.float64)]
    ours = outputs_and_grads(lambda q, k, v: at.scaled_dot_product_attention(q, k, v, enable_gqa=True,
                                                                             **cast(kwargs, dtype)),
                             [x.clone().requires_grad_() for x in rounded])
    assert all(x.dtype == dtype for x in ours)
    exact = outputs_and_grads(lambda q, k, v: reference_sdpa(q, k, v, **kwargs),
                              [x.to(torch.float64).requires_grad_() for x in rounded])
    low = outputs_and_grads(lambda q, k, v: reference_sdpa(q, k, v, low=dtype, **cast(kwargs, torch.float32)),
                            [x.to(torch.float32).requires_grad_() for x in rounded])
    for name, got, lo, ex in zip(("out", "dq", "dk", "dv"), ours, low, exact):
        lo = lo.to(dtype).double()  # the float32 reference's result rounded to the 16-bit type
        budget = 2 * max_err(lo.numpy(), ex.numpy()) + 1e-6 * max(1.0, float(ex.abs().max()))
        err = max_err(got.double().numpy(), ex.numpy())
        assert err <= budget, f"{dtype} {variant} {name}: error {err:.3g} exceeds {budget:.3g}"


def test_contiguous_inputs_reach_the_kernel_without_a_copy():
    for dtype in (torch.float32, torch.bfloat16):
        q, k, v = qkv(dtype, requires_grad=False)
        at.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        assert attn._attn._torch.last_input_pointers() == [q.data_ptr(), k.data_ptr(), v.data_ptr()]
    # heads split from a (B, L, H * E) projection by a transpose: the last dimension stays contiguous
    x = draw((B, L, H * E), torch.float32)
    heads = x.reshape(B, L, H, E).transpose(1, 2)
    at.scaled_dot_product_attention(heads, heads, heads)
    assert attn._attn._torch.last_input_pointers() == [x.data_ptr()] * 3


def test_strided_expanded_and_partly_differentiable_inputs_give_the_contiguous_results():
    q, k, v = qkv(torch.float64, requires_grad=False, heads=(H, H))
    expected = outputs_and_grads(lambda q, k, v: at.scaled_dot_product_attention(q, k, v),
                                 [x.clone().requires_grad_() for x in (q, k, v)])
    # q with a non-contiguous last dimension (copied), k stored transposed, v expanded from a batch of one
    q_t = q.transpose(-1, -2).contiguous().transpose(-1, -2).requires_grad_()
    k_t = k.transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()
    v_t = v.clone().requires_grad_()
    got = outputs_and_grads(lambda q, k, v: at.scaled_dot_product_attention(q, k, v), [q_t, k_t, v_t])
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-12)
    one = v[:1].clone().requires_grad_()
    out = at.scaled_dot_product_attention(q, k, one.expand(B, -1, -1, -1))
    ref = reference_sdpa(q, k, one.expand(B, -1, -1, -1))
    torch.testing.assert_close(out, ref)
    upstream = draw(out.shape, seed=5)
    (d_one,) = torch.autograd.grad(out, one, upstream)
    (d_ref,) = torch.autograd.grad(ref, one, upstream)
    torch.testing.assert_close(d_one, d_ref)  # summed over the broadcast batch by autograd
    # gradients for some inputs only
    q_only = q.clone().requires_grad_()
    out = at.scaled_dot_product_attention(q_only, k, v)
    (dq,) = torch.autograd.grad(out, q_only, draw(out.shape, seed=99))
    torch.testing.assert_close(dq, expected[1], rtol=1e-12, atol=1e-12)
    # 2-D and 5-D inputs: a batch of one added, leading dimensions flattened
    torch.testing.assert_close(at.scaled_dot_product_attention(q[0, 0], k[0, 0], v[0, 0]), expected[0][0, 0])
    five = at.scaled_dot_product_attention(q[None], k[None], v[None])
    torch.testing.assert_close(five[0], expected[0])


def test_the_gil_is_released_in_forward_and_backward():
    # As test_arrays' test of the NumPy functions: while a thread runs a forward and backward of about
    # 0.2 s, the main thread keeps running Python (its longest pause far shorter than the call) in
    # one attempt of ten at least.
    n = 256
    while True:
        q, k, v = (draw((1, 4, n, 64), torch.float32, seed, True) for seed in (80, 81, 82))

        def step():
            at.scaled_dot_product_attention(q, k, v).sum().backward()

        start = time.perf_counter()
        step()
        if time.perf_counter() - start >= 0.2 or n >= 16384:
            break
        n *= 2
    attempts = []
    for _ in range(10):
        attempts.append(longest_pause_during_a_call(step))
        if attempts[-1][0] < attempts[-1][1] / 2:
            break
    else:
        raise AssertionError(f"the main thread stopped for most of every call: {attempts}")


@pytest.mark.parametrize("shapes", [((0, 2, 3, 4), (0, 2, 600, 4)), ((0, 1, 65, 4), (0, 1, 130, 4)),
                                    ((1, 2, 0, 4), (1, 2, 5, 4)), ((1, 2, 3, 4), (1, 2, 0, 4))],
                         ids=["batch0_decode", "batch0_tiled", "no_queries", "no_keys"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_empty_shapes_compute_nothing_and_zero_gradients(shapes, dtype):
    q = draw(shapes[0], dtype, 90, True)
    k, v = draw(shapes[1], dtype, 91, True), draw(shapes[1], dtype, 92, True)
    out = at.scaled_dot_product_attention(q, k, v)
    assert out.shape == shapes[0][:-1] + (4,)
    assert not out.abs().any()  # no key: rows of 0
    out.float().sum().backward()
    for x in (q, k, v):
        assert x.grad.shape == x.shape and not x.grad.abs().any()


def test_no_grad_and_dtype_of_results():
    q, k, v = qkv(torch.float32, heads=(H, H))
    with torch.no_grad():
        out = at.scaled_dot_product_attention(q, k, v)
        ref32, ref64 = reference_sdpa(q, k, v), reference_sdpa(*(x.double() for x in (q, k, v)))
    assert not out.requires_grad and out.dtype == torch.float32 and out.shape == (B, H, L, EV)
    assert_within_budget(out.numpy(), ref32.numpy(), ref64.numpy(), "out under no_grad")


# ---- additive attention and Nadaraya-Watson ------------------------------------------------------

def test_additive_attention_gradcheck_with_its_parameters():
    queries, keys, values = draw((2, 3, 4), seed=40), draw((2, 5, 3), seed=41), draw((2, 5, 2), seed=42)
    W_q, W_k, w_v = draw((6, 4), seed=43), draw((6, 3), seed=44), draw((6,), seed=45)
    tensors = [x.requires_grad_() for x in (queries, keys, values, W_q, W_k, w_v)]
    lens = torch.tensor([2, 5])
    assert torch.autograd.gradcheck(lambda *t: at.additive_attention(*t, lens), tensors)
    assert torch.autograd.gradcheck(lambda *t: at.additive_attention(*t, is_causal=True), tensors)


@pytest.mark.parametrize("kernel", ["gaussian", "epanechnikov", "constant"])
def test_nadaraya_watson_gradcheck_including_the_width(kernel):
    queries, keys, values = draw((2, 4, 2), seed=50), draw((2, 6, 2), seed=51), draw((2, 6, 3), seed=52)
    width = torch.tensor(1.7, dtype=torch.float64, requires_grad=True)
    tensors = [x.requires_grad_() for x in (queries, keys, values)] + [width]
    assert torch.autograd.gradcheck(lambda q, k, v, w: at.nadaraya_watson(q, k, v, kernel, w), tensors)


def test_nadaraya_watson_width_the_dtype_cannot_hold_is_named_as_given():
    x = torch.linspace(0, 1, 5)
    for width, becomes in ((1e-50, "0.0"), (1e300, "inf")):
        with pytest.raises(ValueError, match=re.escape(f"width is {width!r}, which is {becomes} in float32, the dtype")):
            at.nadaraya_watson(x, x, x, width=width)
    assert torch.isfinite(at.nadaraya_watson(x.double(), x.double(), x.double(), width=1e-50)).all()


def test_nadaraya_watson_matches_the_d2l_and_learns_its_width():
    x_train = torch.sort(torch.rand(50, generator=torch.Generator().manual_seed(1)) * 5).values.double()
    y_train = 2 * torch.sin(x_train) + x_train ** 0.8
    x_test = torch.arange(0, 5, 0.1, dtype=torch.float64)
    width = torch.tensor(0.8, dtype=torch.float64, requires_grad=True)
    out = at.nadaraya_watson(x_test, x_train, y_train, "gaussian", width)
    ref, _ = d2l_nadaraya_watson(x_test.reshape(1, -1, 1), x_train.reshape(1, -1, 1), y_train.reshape(1, -1, 1),
                                   "gaussian", width)
    torch.testing.assert_close(out, ref.reshape(-1))
    (dw,) = torch.autograd.grad(out.sum(), width)
    (dw_ref,) = torch.autograd.grad(ref.sum(), width)
    torch.testing.assert_close(dw, dw_ref)


# ---- modules -------------------------------------------------------------------------------------

def test_additive_module_exchanges_state_dict_with_the_d2l_module():
    torch.manual_seed(0)
    theirs = D2lAdditive(key_size=3, query_size=4, num_hiddens=8, dropout=0.1).double()
    ours = at.AdditiveAttention(3, 4, 8, 0.1).double()
    assert set(ours.state_dict()) == set(theirs.state_dict()) == {"W_k.weight", "W_q.weight", "w_v.weight"}
    ours.load_state_dict(theirs.state_dict())
    queries, keys, values = draw((2, 3, 4), seed=60), draw((2, 5, 3), seed=61), draw((2, 5, 2), seed=62)
    lens = torch.tensor([2, 4])
    theirs.eval(), ours.eval()
    torch.testing.assert_close(ours(queries, keys, values, lens), theirs(queries, keys, values, lens))
    ours.train()
    torch.manual_seed(1)
    dropped = ours(queries, keys, values, lens)
    assert not torch.allclose(dropped, theirs(queries, keys, values, lens))  # dropout only in training
    lazy = at.AdditiveAttention(8, 0.0).double()
    lazy(queries, keys, values, lens)  # sizes from the first call, as d2l's LazyLinear
    lazy.load_state_dict(ours.state_dict())
    theirs.load_state_dict(lazy.state_dict())  # and back


def test_multi_head_module_matches_d2l_both_ways_with_gradients():
    torch.manual_seed(0)
    for kv_heads in (None, 2):
        theirs = D2lMultiHead(16, 4, 0.0, bias=True, num_kv_heads=kv_heads).double()
        queries, keys = draw((2, 5, 12), seed=70), draw((2, 7, 10), seed=71)
        lens = torch.tensor([3, 7])
        theirs(queries, keys, keys, lens)  # materialises d2l's LazyLinear layers
        ours = at.MultiHeadAttention(16, 4, 0.0, bias=True, num_kv_heads=kv_heads, query_size=12, key_size=10,
                                     value_size=10).double()
        assert set(ours.state_dict()) == set(theirs.state_dict())
        ours.load_state_dict(theirs.state_dict())
        got, want = ours(queries, keys, keys, lens), theirs(queries, keys, keys, lens)
        torch.testing.assert_close(got, want)
        got.square().sum().backward()
        want.square().sum().backward()
        for (name, p), (_, p_ref) in zip(sorted(ours.named_parameters()), sorted(theirs.named_parameters())):
            torch.testing.assert_close(p.grad, p_ref.grad, msg=name)
        theirs.load_state_dict(ours.state_dict())
    single = ours.to(torch.float32)
    assert single.W_q.weight.dtype == torch.float32
    assert single(queries.float(), keys.float(), keys.float(), lens).dtype == torch.float32


def test_dot_product_module_drops_only_in_training():
    module = at.DotProductAttention(0.5)
    q, k, v = qkv(torch.float32, requires_grad=False, heads=(H, H))
    torch.manual_seed(0)
    trained = module(q, k, v)
    module.eval()
    torch.testing.assert_close(module(q, k, v), at.scaled_dot_product_attention(q, k, v))
    assert not torch.allclose(trained, module(q, k, v))


# ---- errors --------------------------------------------------------------------------------------

def test_bad_input_raises_what_pytorch_users_expect():
    q, k, v = qkv(torch.float32, requires_grad=False, heads=(H, H))
    with pytest.raises(ValueError, match=r"scaled_dot_product_attention: key .*shape"):
        at.scaled_dot_product_attention(q, k[..., :3], v)
    with pytest.raises(RuntimeError, match="key has dtype torch.float64 but query has torch.float32"):
        at.scaled_dot_product_attention(q, k.double(), v)
    with pytest.raises(RuntimeError, match="query has dtype torch.int64"):
        at.scaled_dot_product_attention(q.long(), k, v)
    with pytest.raises(ValueError, match="dropout_p"):
        at.scaled_dot_product_attention(q, k, v, dropout_p=1.5)
    with pytest.raises(ValueError, match="attn_mask requires grad"):
        at.scaled_dot_product_attention(q, k, v, attn_mask=torch.zeros(L, S, requires_grad=True))
    with pytest.raises(RuntimeError, match="attn_mask has dtype torch.int64"):
        at.scaled_dot_product_attention(q, k, v, attn_mask=torch.zeros(L, S, dtype=torch.int64))
    with pytest.raises(ValueError, match="attn_mask"):
        at.scaled_dot_product_attention(q, k, v, attn_mask=torch.zeros(3, 3, dtype=torch.bool))
    with pytest.raises(RuntimeError, match="enable_gqa=True"):
        at.scaled_dot_product_attention(q, k[:, :2], v[:, :2])
    with pytest.raises(ValueError, match="valid_lens"):
        at.scaled_dot_product_attention(q, k, v, valid_lens=torch.tensor([1, 99]))
    with pytest.raises(TypeError, match="window must be a pair"):
        at.scaled_dot_product_attention(q, k, v, window=3)
    with pytest.raises(TypeError, match="query must be a torch.Tensor"):
        at.scaled_dot_product_attention(q.numpy(), k, v)
    with pytest.raises(ValueError, match="nadaraya_watson: width"):
        at.nadaraya_watson(q[0], k[0], v[0], "gaussian", -1.0)
    with pytest.raises(ValueError, match="kernel: unknown kernel"):
        at.nadaraya_watson(q[0], k[0], v[0], "triangle", 1.0)
    with pytest.raises(ValueError, match="W_k"):
        at.additive_attention(q[:, 0], k[:, 0], v[:, 0], torch.zeros(4, E), torch.zeros(3, E), torch.zeros(4))
    # Refused rather than truncated or dropped: float segment ids and window bounds, scale and softcap
    # that require grad (attn computes no gradient for them), what is not a number.
    with pytest.raises(TypeError, match="segment_ids has dtype torch.float32; it must hold integers"):
        at.scaled_dot_product_attention(q, q, q, segment_ids=torch.zeros(B, L))
    with pytest.raises(TypeError, match=r"window\[0\] must be an integer; got 0.9"):
        at.scaled_dot_product_attention(q, k, v, window=(0.9, 0.9))
    with pytest.raises(ValueError, match=r"window\[0\] is 18446744073709551616; it must fit in a signed 64-bit"):
        at.scaled_dot_product_attention(q, k, v, window=(2**64, 0))
    for name in ("scale", "softcap"):
        with pytest.raises(ValueError, match=f"{name} requires grad"):
            at.scaled_dot_product_attention(q, k, v, **{name: torch.tensor(0.5, requires_grad=True)})
    with pytest.raises(TypeError, match="scale must be a real number; got 'abc'"):
        at.scaled_dot_product_attention(q, k, v, scale="abc")
    # An option of more than 4 dimensions named (a TensorView's own message named no argument).
    with pytest.raises(ValueError, match="attn_mask has 5 dimensions; at most 4 are supported"):
        at.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(1, 1, 1, L, S, dtype=torch.bool))
    with pytest.raises(ValueError, match="num_heads is 0; it must be at least 1"):
        at.MultiHeadAttention(8, 0)
    with pytest.raises(ValueError, match="num_kv_heads is 0"):
        at.MultiHeadAttention(8, 2, num_kv_heads=0)
    with pytest.raises(ValueError, match=r"queries \(2, 3, 8\), keys \(3, 6, 8\) and values \(3, 6, 8\) must share the batch"):
        at.MultiHeadAttention(8, 2)(torch.zeros(2, 3, 8), torch.zeros(3, 6, 8), torch.zeros(3, 6, 8))
    with pytest.raises(ValueError, match=r"keys and values their tokens"):
        at.MultiHeadAttention(8, 2)(torch.zeros(2, 3, 8), torch.zeros(2, 6, 8), torch.zeros(2, 5, 8))
    with pytest.raises(ValueError, match=r"queries has shape \(3, 8\); it must be \(batch, tokens, features\)"):
        at.MultiHeadAttention(8, 2, query_size=8, key_size=8, value_size=8)(torch.zeros(3, 8), torch.zeros(3, 8),
                                                                             torch.zeros(3, 8))


def test_is_causal_takes_numpy_bool_and_names_other_types():
    """is_causal=numpy.bool_(True) is True (top-left, or bottom-right under align='bottom_right',
    n != m); a 0-d tensor is refused naming its type."""
    torch.manual_seed(3)
    q, k, v = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 9, 8), torch.randn(1, 2, 9, 8)
    for align in (None, "bottom_right"):
        extra = {} if align is None else {"align": align}
        want = at.scaled_dot_product_attention(q, k, v, is_causal=True, **extra)
        assert torch.equal(at.scaled_dot_product_attention(q, k, v, is_causal=np.bool_(True), **extra), want)
    assert torch.equal(at.scaled_dot_product_attention(q, k, v, is_causal=np.bool_(False)),
                       at.scaled_dot_product_attention(q, k, v))
    with pytest.raises(ValueError, match=r"is_causal is tensor\(True\) of type Tensor; it must be"):
        at.scaled_dot_product_attention(q, k, v, is_causal=torch.tensor(True))


def test_options_changed_in_place_and_double_backward_are_refused():
    """A mask or valid_lens changed in place after the forward is refused by PyTorch's version check
    (the gradients had silently followed the new values); a backward with create_graph=True raises
    (it had returned gradients with no graph, so a gradient penalty lost attn's terms)."""
    q, k, v = (torch.randn(1, 2, 4, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    for name in ("valid_lens", "attn_mask", "alibi_slopes"):
        option = {"valid_lens": torch.tensor([2]), "attn_mask": torch.rand(4, 4, dtype=torch.float64) < 0.7,
                  "alibi_slopes": torch.tensor([0.1, 0.2], dtype=torch.float64)}[name]
        out = at.scaled_dot_product_attention(q, k, v, **{name: option})
        grads = torch.autograd.grad(out.sum(), (q, k, v), retain_graph=True)
        assert all(torch.isfinite(g).all() for g in grads)
        option.fill_(1 if name != "alibi_slopes" else 0.5)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            torch.autograd.grad(out.sum(), (q, k, v))
    # A mask made under inference_mode (a cached one) cannot be saved as it is: a copy of it is.
    with torch.inference_mode():
        cached = torch.rand(4, 4) < 0.7
    out = at.scaled_dot_product_attention(q, k, v, attn_mask=cached)
    expected = at.scaled_dot_product_attention(q, k, v, attn_mask=cached.clone())
    assert torch.equal(torch.autograd.grad(out.sum(), q)[0], torch.autograd.grad(expected.sum(), q)[0])
    out = at.scaled_dot_product_attention(q, k, v)
    with pytest.raises(RuntimeError, match="create_graph=True"):
        torch.autograd.grad(out.sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="create_graph=True"):
        torch.autograd.gradgradcheck(lambda a: at.scaled_dot_product_attention(a, k.detach(), v.detach()), (q,))
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    out = at.nadaraya_watson(x, torch.arange(4.0, dtype=torch.float64), torch.arange(4.0, dtype=torch.float64),
                                     "gaussian", 1.0)
    with pytest.raises(RuntimeError, match="create_graph=True"):
        torch.autograd.grad(out.sum(), x, create_graph=True)


def test_leading_batch_dimensions_broadcast_as_pytorchs():
    # Past four dimensions the leading ones broadcast against each other (a key of batch 1 is shared),
    # and ones that do not broadcast are refused: they were once flattened and paired in order.
    q = torch.randn(2, 3, 1, 4, 8, dtype=torch.float64)
    k, v = torch.randn(1, 3, 1, 5, 8, dtype=torch.float64), torch.randn(1, 3, 1, 5, 6, dtype=torch.float64)
    out = at.scaled_dot_product_attention(q, k, v)
    assert out.shape == (2, 3, 1, 4, 6)
    for i in range(2):
        for j in range(3):
            torch.testing.assert_close(out[i, j], at.scaled_dot_product_attention(q[i, j], k[0, j], v[0, j]))
    with pytest.raises(RuntimeError, match="leading batch dimensions that do not broadcast"):
        at.scaled_dot_product_attention(q, torch.randn(3, 2, 1, 5, 8, dtype=torch.float64),
                                        torch.randn(3, 2, 1, 5, 8, dtype=torch.float64))


def test_additive_attention_names_w_v_and_ranks_as_given():
    # w_v was flattened before it was checked ("w_v has shape (14,)" for a (2, 7) one), and 5-D inputs
    # reached attn's views ("TensorView: rank 5 is not supported").
    q, k, v = torch.randn(2, 3, 4), torch.randn(2, 6, 5), torch.randn(2, 6, 2)
    W_q, W_k = torch.randn(7, 4), torch.randn(7, 5)
    for w_v in (torch.randn(2, 7), torch.randn(())):
        with pytest.raises(ValueError, match=rf"additive_attention: w_v has shape {re.escape(str(tuple(w_v.shape)))}; "
                                             r"it must be \(h,\) or \(1, h\)"):
            at.additive_attention(q, k, v, W_q, W_k, w_v)
    with pytest.raises(ValueError, match=r"queries has shape \(1, 1, 2, 3, 4\); it must have 3 or 4 dimensions"):
        at.additive_attention(q[None, None], k[None, None], v[None, None], W_q, W_k, torch.randn(7))


def test_masks_of_five_dimensions_broadcast_over_the_batch_dimensions():
    # A mask of as many dimensions as a 5-D query, or fewer, its batch dimensions broadcast against the
    # query's as PyTorch's (they were refused by the 4-D views); more dimensions than the query's, or
    # batch dimensions that do not broadcast, are refused by name.
    q = torch.randn(2, 3, 2, 4, 8, dtype=torch.float64)
    k, v = torch.randn(2, 3, 2, 5, 8, dtype=torch.float64), torch.randn(2, 3, 2, 5, 6, dtype=torch.float64)
    for shape in ((2, 3, 2, 4, 5), (3, 1, 4, 5), (2, 1, 1, 4, 5), (1, 3, 1, 1, 5), (4, 5)):
        for mask in (torch.randn(shape, dtype=torch.float64), torch.rand(shape) > 0.3):
            out = at.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            full = mask.expand(2, 3, 2, 4, 5)
            for i in range(2):
                for j in range(3):
                    torch.testing.assert_close(out[i, j], at.scaled_dot_product_attention(
                        q[i, j], k[i, j], v[i, j], attn_mask=full[i, j]))
    with pytest.raises(ValueError, match=r"attn_mask has shape \(1, 2, 3, 2, 4, 5\), more dimensions than query"):
        at.scaled_dot_product_attention(q, k, v, attn_mask=torch.zeros(1, 2, 3, 2, 4, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"attn_mask has shape \(2, 2, 2, 4, 5\), whose batch dimensions do not"):
        at.scaled_dot_product_attention(q, k, v, attn_mask=torch.zeros(2, 2, 2, 4, 5, dtype=torch.float64))


def test_attn_imports_without_torch():
    """attn itself needs no torch; attn.torch then says why it cannot import."""
    code = ("import sys; sys.modules['torch'] = None\n"
            "import numpy as np, attn\n"
            "x = np.ones((1, 2, 3), np.float32)\n"
            "assert attn.scaled_dot_product_attention(x, x, x).shape == (1, 2, 3)\n"
            "try:\n    import attn.torch\nexcept ImportError as e:\n    print('no torch:', e)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ.copy())
    assert result.returncode == 0, result.stderr
    assert "no torch:" in result.stdout


def test_version_is_the_package_version():
    """attn.__version__ is CMakeLists.txt's project(attn VERSION ...), the version's one home."""
    cmake = (pathlib.Path(__file__).resolve().parents[2] / "CMakeLists.txt").read_text()
    assert f"project(attn VERSION {attn.__version__} " in cmake
    assert np.all([part.isdigit() for part in attn.__version__.split(".")]) and attn.__version__.count(".") == 2
