"""Rotary position embeddings: attn.apply_rotary (NumPy), attn.torch.apply_rotary (autograd) and
KVCache's rotary tables, against FlashAttention's formula (apply_rotary_emb_torch: x cos + rotate_half(x)
sin on the first rotary_dim features) written in torch float64: both layouts, offsets, varlen, in
place, float16/bfloat16/float32/float64, gradcheck in float64, and errors."""
import math

import numpy as np
import pytest

import attn

torch = pytest.importorskip("torch")
import attn.torch as attn_torch  # noqa: E402


def rotate_half(x, interleaved):
    if not interleaved:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def reference(x, cos, sin, positions, interleaved):
    """x (..., T, H, d) in float64 with positions (..., T) of each token: FlashAttention's formula."""
    x, cos, sin = x.double(), cos.double(), sin.double()
    r = cos.shape[-1] * 2
    c, s = cos[positions], sin[positions]  # (..., T, r / 2)
    rep = (lambda t: t.repeat_interleave(2, dim=-1)) if interleaved else (lambda t: torch.cat((t, t), dim=-1))
    c, s = rep(c).unsqueeze(-2), rep(s).unsqueeze(-2)
    head = x[..., :r]
    return torch.cat([head * c + rotate_half(head, interleaved) * s, x[..., r:]], dim=-1)


def tables(P, half, dtype=torch.float32):
    inv = 1.0 / (10000 ** (torch.arange(0, half, dtype=torch.float64) / half))
    freqs = torch.outer(torch.arange(P, dtype=torch.float64), inv)
    return torch.cos(freqs).to(dtype), torch.sin(freqs).to(dtype)


TOLERANCE = {torch.float64: 1e-12, torch.float32: 2e-6, torch.bfloat16: 2 ** -7, torch.float16: 2 ** -10}


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_torch_matches_flash_attention_formula(interleaved, dtype):
    torch.manual_seed(0)
    B, S, H, d, half, P = 2, 7, 3, 10, 3, 16
    x = torch.randn(B, S, H, d).to(dtype)
    cos, sin = tables(P, half)
    offsets = torch.tensor([0, 9], dtype=torch.int32)
    out = attn_torch.apply_rotary(x, cos, sin, interleaved=interleaved, offsets=offsets)
    positions = torch.arange(S) + offsets.long()[:, None]
    want = reference(x, cos, sin, positions, interleaved)
    assert out.dtype == dtype and out.shape == x.shape
    assert (out.double() - want).abs().max().item() <= TOLERANCE[dtype] * 4
    # an int offset, and features past rotary_dim unchanged
    out = attn_torch.apply_rotary(x, cos, sin, interleaved=interleaved, offsets=5)
    assert (out.double() - reference(x, cos, sin, torch.arange(S) + 5, interleaved)).abs().max() <= TOLERANCE[dtype] * 4
    assert torch.equal(out[..., 2 * half:], x[..., 2 * half:])


@pytest.mark.parametrize("interleaved", [False, True])
def test_torch_varlen_and_inplace(interleaved):
    torch.manual_seed(1)
    H, d, half, P = 2, 8, 4, 12
    cu = torch.tensor([0, 3, 3, 8], dtype=torch.int32)
    x = torch.randn(8, H, d, dtype=torch.float64)
    cos, sin = tables(P, half, torch.float64)
    offsets = torch.tensor([2, 0, 7], dtype=torch.int64)
    out = attn_torch.apply_rotary(x, cos, sin, interleaved=interleaved, offsets=offsets, cu_seqlens=cu)
    positions = torch.tensor([2, 3, 4, 7, 8, 9, 10, 11])
    assert (out - reference(x, cos, sin, positions, interleaved)).abs().max() < 1e-12
    y = x.clone()
    back = attn_torch.apply_rotary(y, cos, sin, interleaved=interleaved, offsets=offsets, cu_seqlens=cu, inplace=True)
    assert back.data_ptr() == y.data_ptr() and torch.equal(y, out) and torch.equal(back, out)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("varlen", [False, True])
def test_torch_gradcheck(interleaved, varlen):
    torch.manual_seed(2)
    cos, sin = tables(10, 3, torch.float64)
    if varlen:
        x = torch.randn(6, 2, 8, dtype=torch.float64, requires_grad=True)
        kw = dict(cu_seqlens=torch.tensor([0, 2, 6], dtype=torch.int32), offsets=torch.tensor([5, 1]))
    else:
        x = torch.randn(2, 4, 2, 8, dtype=torch.float64, requires_grad=True)
        kw = dict(offsets=torch.tensor([0, 6], dtype=torch.int32))
    assert torch.autograd.gradcheck(lambda t: attn_torch.apply_rotary(t, cos, sin, interleaved=interleaved, **kw), (x,))


def test_torch_inplace_backward():
    cos, sin = tables(8, 4, torch.float64)
    x = torch.randn(1, 5, 2, 8, dtype=torch.float64, requires_grad=True)
    y = x * 1.0
    attn_torch.apply_rotary(y, cos, sin, inplace=True, offsets=1).sum().backward()
    x2 = x.detach().clone().requires_grad_()
    attn_torch.apply_rotary(x2, cos, sin, offsets=1).sum().backward()
    assert torch.allclose(x.grad, x2.grad, atol=1e-14)


def test_torch_errors():
    cos, sin = tables(8, 3)
    x = torch.randn(2, 4, 2, 8)
    with pytest.raises(ValueError, match=r"sequence 1 \(batch index 1\) starts at offset 6.*seqlen_ro"):
        attn_torch.apply_rotary(x, cos, sin, offsets=torch.tensor([0, 6]))
    with pytest.raises(ValueError, match=r"rotary_dim = 2 \* 5 = 10.*head_dim 8"):
        attn_torch.apply_rotary(x, *tables(8, 5))
    with pytest.raises(ValueError, match=r"cos has shape \(8,3\) but sin has shape \(8,2\)"):
        attn_torch.apply_rotary(x, cos, tables(8, 2)[1])
    with pytest.raises(RuntimeError, match="offsets has dtype torch.float32"):
        attn_torch.apply_rotary(x, cos, sin, offsets=torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"offsets\[1\] is -1"):
        attn_torch.apply_rotary(x, cos, sin, offsets=torch.tensor([0, -1]))
    with pytest.raises(ValueError, match=r"offsets has shape \(3,\)"):
        attn_torch.apply_rotary(x, cos, sin, offsets=torch.tensor([0, 0, 0]))
    with pytest.raises(ValueError, match="cu_seqlens ends at 5"):
        attn_torch.apply_rotary(torch.randn(6, 2, 8), cos, sin, cu_seqlens=torch.tensor([0, 2, 5], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"cu_seqlens\[0\] is 1"):
        attn_torch.apply_rotary(torch.randn(6, 2, 8), cos, sin, cu_seqlens=torch.tensor([1, 6], dtype=torch.int32))
    # A scalar offset is an integer, as NumPy's apply_rotary takes it: not truncated, not None.
    with pytest.raises(TypeError, match="apply_rotary: offsets must be an integer; got 1.7"):
        attn_torch.apply_rotary(x, cos, sin, offsets=1.7)
    with pytest.raises(TypeError, match="apply_rotary: offsets must be an integer; got None"):
        attn_torch.apply_rotary(x, cos, sin, offsets=None)
    with pytest.raises(ValueError, match="apply_rotary: offsets is 18446744073709551616; it must fit in a signed 64-bit"):
        attn_torch.apply_rotary(x, cos, sin, offsets=2**64)
    # An offset near 2^63: the message states the last position without overflowing.
    with pytest.raises(ValueError, match="starts at offset 9223372036854775807 and holds 4 tokens, so its last position "
                                         "is 9223372036854775810"):
        attn_torch.apply_rotary(x, cos, sin, offsets=2**63 - 1)
    with pytest.raises(ValueError, match=r"apply_rotary: x has shape \(1, 1, 4, 2, 8\) with 5 dimensions"):
        attn_torch.apply_rotary(torch.randn(1, 1, 4, 2, 8), cos, sin)
    with pytest.raises(ValueError, match="cos requires grad"):
        attn_torch.apply_rotary(x, cos.requires_grad_(), sin)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_numpy(interleaved, dtype):
    rng = np.random.default_rng(3)
    B, S, H, d, half, P = 2, 5, 3, 12, 4, 20
    x = rng.standard_normal((B, S, H, d)).astype(dtype)
    cos, sin = (t.numpy() for t in tables(P, half))
    offsets = np.array([3, 11], dtype=np.int64)
    out = attn.apply_rotary(x, cos, sin, interleaved=interleaved, offsets=offsets)
    want = reference(torch.from_numpy(x.astype(np.float64)), torch.from_numpy(cos), torch.from_numpy(sin),
                     torch.arange(S) + torch.from_numpy(offsets)[:, None], interleaved).numpy()
    tol = {np.float64: 1e-6, np.float32: 1e-5, np.float16: 4e-3}[dtype]  # float32 tables
    assert out.dtype == dtype and np.abs(out.astype(np.float64) - want).max() < tol
    back = attn.apply_rotary(out, cos, sin, interleaved=interleaved, offsets=offsets, inverse=True)
    assert np.abs(back.astype(np.float64) - x).max() < tol * 4
    y = x.copy()
    assert attn.apply_rotary(y, cos, sin, interleaved=interleaved, offsets=offsets, inplace=True) is y
    assert np.array_equal(y, out)
    # varlen: the same tokens packed
    packed = attn.apply_rotary(x.reshape(B * S, H, d), cos, sin, interleaved=interleaved, offsets=offsets,
                               cu_seqlens=np.array([0, S, 2 * S], dtype=np.int32))
    assert np.array_equal(packed.reshape(B, S, H, d), out)


def test_numpy_errors():
    cos, sin = (t.numpy() for t in tables(8, 3))
    x = np.zeros((2, 4, 2, 8), np.float32)
    with pytest.raises(ValueError, match=r"apply_rotary: sequence 0 \(batch index 0\) starts at offset 5"):
        attn.apply_rotary(x, cos, sin, offsets=5)
    with pytest.raises(ValueError, match="offsets is -1"):
        attn.apply_rotary(x, cos, sin, offsets=-1)
    with pytest.raises(TypeError, match="offsets has dtype float64"):
        attn.apply_rotary(x, cos, sin, offsets=np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match="must not decrease"):
        attn.apply_rotary(np.zeros((6, 2, 8), np.float32), cos, sin, cu_seqlens=np.array([0, 4, 2, 6], np.int32))
    with pytest.raises(ValueError, match="inplace=True"):
        attn.apply_rotary(np.zeros((2, 4, 2, 8), np.float32)[..., ::-1], cos, sin, inplace=True)
    with pytest.raises(ValueError, match=r"x has shape \(4,2,8\)"):
        attn.apply_rotary(np.zeros((4, 2, 8), np.float32), cos, sin)


@pytest.mark.parametrize("interleaved", [False, True])
def test_kv_cache_rotary(interleaved):
    """A cache with rotary tables equals attention over keys and queries rotated explicitly."""
    rng = np.random.default_rng(4)
    Hk, H, d, half, P = 2, 4, 16, 6, 40
    cos, sin = (t.numpy() for t in tables(P, half))
    cache = attn.KVCache(2, Hk, d, block_size=4, rotary_cos=cos, rotary_sin=sin, rotary_interleaved=interleaved)
    keys = [rng.standard_normal((Hk, L, d)).astype(np.float32) for L in (6, 9)]
    values = [rng.standard_normal((Hk, L, d)).astype(np.float32) for L in (6, 9)]
    for s in range(2):
        cache.append(keys[s][:, :4], values[s][:, :4], seq=s)
        cache.append(keys[s][:, 4:], values[s][:, 4:], seq=s)

    def rot(a, first):  # a (A, L, d) at positions first + i, in float64
        t = torch.from_numpy(a.astype(np.float64)).transpose(0, 1)
        r = reference(t, torch.from_numpy(cos), torch.from_numpy(sin), torch.arange(a.shape[1]) + first, interleaved)
        return r.transpose(0, 1)

    def expected(q, s):  # bottom-right causal attention over the rotated keys, float64
        n, L = q.shape[1], keys[s].shape[1]
        k = rot(keys[s], 0).repeat_interleave(H // Hk, dim=0)
        v = torch.from_numpy(values[s].astype(np.float64)).repeat_interleave(H // Hk, dim=0)
        scores = rot(q, L - n) @ k.transpose(-1, -2) / math.sqrt(d)
        mask = torch.arange(L)[None, :] <= (torch.arange(n)[:, None] + L - n)
        return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v

    assert np.abs(cache.keys(0) - rot(keys[0], 0).numpy()).max() < 1e-5
    for s, n in ((0, 1), (1, 3), (1, 7)):  # decode and prompt paths
        q = rng.standard_normal((H, n, d)).astype(np.float32)
        assert np.abs(cache.attend(q, seq=s) - expected(q, s).numpy()).max() < 1e-5
    qs = rng.standard_normal((2, H, 2, d)).astype(np.float32)  # every sequence at once
    out = cache.attend(qs)
    for s in range(2):
        assert np.abs(out[s] - expected(qs[s], s).numpy()).max() < 1e-5
    short = attn.KVCache(1, Hk, d, rotary_cos=cos[:5], rotary_sin=sin[:5])
    short.append(keys[0][:, :4], values[0][:, :4], seq=0)
    with pytest.raises(ValueError, match=r"positions 4 to 5.*5 rows \(max_pos\)"):
        short.append(keys[0][:, 4:], values[0][:, 4:], seq=0)
    with pytest.raises(ValueError, match="queries has 5 rows for sequence 0, which holds 4 tokens"):
        short.attend(rng.standard_normal((H, 5, d)).astype(np.float32), seq=0)
    with pytest.raises(ValueError, match="rotary_dim"):
        attn.KVCache(1, Hk, 8, rotary_cos=cos, rotary_sin=sin)
