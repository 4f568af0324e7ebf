"""attn.flash: FlashAttention-2's flash_attn_func and flash_attn_varlen_func on CPU tensors.

The reference is FlashAttention's attention_ref written here in torch (tests/test_flash_attn.py's
semantics: padded batches with query and key padding masks, local masks built from the padded
lengths and aligned bottom-right, ALiBi as -slope * |i + sk - sq - j|, soft-capping before the bias,
a row with no key gives 0; sinks as gpt-oss computes them: the sink logit appended as a column, the
softmax taken, the column dropped). In float64 it is the oracle; in the inputs' precision (float32,
or bfloat16 / float16 emulated: every op's result rounded) it is the error budget, FlashAttention's
rule: attn's error against float64 at most 2x (outputs) and 3x (gradients) the same-precision
reference's, plus a small epsilon. Varlen batches are the padded ones unpadded (random lengths with
1 and sizes off the 64-row tiles), compared row by row; gradients, d(sinks) included, also by
torch.autograd.gradcheck in float64; dropout against the reference given the mask S_dmask encodes;
every bad argument raises TypeError or ValueError naming it.
"""
import math

import pytest

torch = pytest.importorskip("torch")

from attn.flash import flash_attn_func, flash_attn_varlen_func  # noqa: E402


# ---- the reference (FlashAttention's attention_ref, in torch) -------------------------------------

def construct_local_mask(seqlen_q, seqlen_k, window_size, query_padding_mask=None, key_padding_mask=None):
    """True where the window excludes a key: FlashAttention's construct_local_mask, with the real
    lengths sq, sk of each batch element for the bottom-right alignment; -1: that side unbounded."""
    row = torch.arange(seqlen_q).view(-1, 1)
    col = torch.arange(seqlen_k)
    sk = seqlen_k if key_padding_mask is None else key_padding_mask.sum(-1).view(-1, 1, 1, 1)
    sq = seqlen_q if query_padding_mask is None else query_padding_mask.sum(-1).view(-1, 1, 1, 1)
    left, right = window_size
    excluded = torch.zeros(1, dtype=torch.bool)
    if right >= 0:
        excluded = excluded | (col > row + sk - sq + right)
    if left >= 0:
        excluded = excluded | (col < row + sk - sq - left)
    return excluded


def alibi_bias(slopes, seqlen_q, seqlen_k, query_padding_mask=None, key_padding_mask=None):
    """-slope * |i + sk - sq - j| (FlashAttention's attn_bias_from_alibi_slopes, non-causal form)."""
    batch = query_padding_mask.shape[0] if query_padding_mask is not None else (slopes.shape[0] if slopes.dim() == 2 else 1)
    slopes = slopes if slopes.dim() == 2 else slopes.expand(batch, -1)
    row = torch.arange(seqlen_q).view(-1, 1)
    col = torch.arange(seqlen_k)
    sk = seqlen_k if key_padding_mask is None else key_padding_mask.sum(-1).view(-1, 1, 1, 1)
    sq = seqlen_q if query_padding_mask is None else query_padding_mask.sum(-1).view(-1, 1, 1, 1)
    return -slopes.view(slopes.shape[0], slopes.shape[1], 1, 1) * (row + sk - sq - col).abs()


def attention_ref(q, k, v, query_padding_mask=None, key_padding_mask=None, dropout_p=0.0, dropout_mask=None,
                  causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, sinks=None, scale=None,
                  dtype=torch.float64, low=None):
    """out (batch, seqlen_q, nheads, d_v) and the attention (batch, nheads, seqlen_q, seqlen_k) computed in
    `dtype`; low: a 16-bit dtype every op's result is rounded to (the same-precision reference)."""
    r = (lambda x: x.to(low).to(dtype)) if low is not None else (lambda x: x)
    if causal:
        window_size = (window_size[0], 0)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    g = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(g, 2), v.repeat_interleave(g, 2)
    d = q.shape[-1]
    scores = r(torch.einsum("bthd,bshd->bhts", q * (1 / math.sqrt(d) if scale is None else scale), k))
    if softcap > 0:
        scores = r(torch.tanh(scores / softcap) * softcap)
    allowed = torch.ones(scores.shape, dtype=torch.bool)
    if key_padding_mask is not None:
        allowed = allowed & key_padding_mask.view(key_padding_mask.shape[0], 1, 1, -1)
    if window_size[0] >= 0 or window_size[1] >= 0:
        allowed = allowed & ~construct_local_mask(seqlen_q, seqlen_k, window_size, query_padding_mask,
                                                  key_padding_mask)
    if alibi_slopes is not None:
        scores = r(scores + alibi_bias(alibi_slopes.to(dtype), seqlen_q, seqlen_k, query_padding_mask,
                                       key_padding_mask))
    scores = scores.masked_fill(~allowed, float("-inf"))
    if sinks is not None:  # gpt-oss: the sink as one more column, dropped after the softmax
        column = sinks.to(dtype).view(1, -1, 1, 1).expand(scores.shape[0], -1, seqlen_q, 1)
        attention = torch.softmax(torch.cat([scores, column], -1), -1)[..., :-1]
    else:
        attention = torch.softmax(scores, -1)
    attention = r(attention.masked_fill(~allowed.any(-1, keepdim=True), 0.0))  # a row with no key: 0
    if query_padding_mask is not None:
        attention = attention.masked_fill(~query_padding_mask.view(query_padding_mask.shape[0], 1, -1, 1), 0.0)
    dropped = attention if dropout_mask is None else attention.masked_fill(~dropout_mask, 0.0)
    out = r(torch.einsum("bhts,bshd->bthd", dropped, v * (1.0 / (1 - dropout_p))))
    if query_padding_mask is not None:
        out = out.masked_fill(~query_padding_mask.view(query_padding_mask.shape[0], -1, 1, 1), 0.0)
    return out, attention


def same_precision(dtype):
    """The reference's computation dtype and rounding for inputs of `dtype` (FlashAttention's `_pt`)."""
    if dtype in (torch.bfloat16, torch.float16):
        return torch.float32, dtype
    return dtype, None


def err(a, b):
    return (a.double() - b.double()).abs().max().item()


def check_budget(got, pt, ref, factor, what, eps=1e-6):
    e, e_pt = err(got, ref), err(pt, ref)
    assert e <= factor * e_pt + eps, f"{what}: attn's error {e:.3g} > {factor} x the same-precision error {e_pt:.3g}"


def random_qkv(batch, seqlen_q, seqlen_k, nheads, nheads_k, d, dtype, dv=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seqlen_q, nheads, d, generator=gen).to(dtype)
    k = torch.randn(batch, seqlen_k, nheads_k, d, generator=gen).to(dtype)
    v = torch.randn(batch, seqlen_k, nheads_k, dv or d, generator=gen).to(dtype)
    return q, k, v


def run_both(fn_attn, fn_ref, inputs, dout):
    """Outputs and gradients of attn and of the reference on the same leaf tensors' copies."""
    results = []
    for fn in (fn_attn, fn_ref):
        leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
        out = fn(*leaves)
        out.backward(dout.to(out.dtype))
        results.append((out.detach(), [x.grad for x in leaves]))
    return results


# ---- flash_attn_func ----------------------------------------------------------------------------

SHAPES = [  # batch, seqlen_q, seqlen_k, nheads, nheads_k, d
    (2, 113, 203, 4, 2, 59),
    (1, 203, 113, 3, 3, 64),
    (2, 128, 128, 4, 1, 128),
    (1, 1, 239, 2, 2, 64),
]
VARIANTS = [
    dict(),
    dict(causal=True),
    dict(window_size=(17, 5)),
    dict(window_size=(-1, 0)),
    dict(causal=True, window_size=(40, -1)),
    dict(alibi=True),
    dict(alibi=True, causal=True, softcap=3.0),
    dict(sinks=True, causal=True),
    dict(sinks=True, alibi=True, window_size=(30, 30), softcap=5.0, scale=0.2),
]


def variant_args(variant, batch, nheads, seed=1):
    gen = torch.Generator().manual_seed(seed)
    args = dict(causal=variant.get("causal", False), window_size=variant.get("window_size", (-1, -1)),
                softcap=variant.get("softcap", 0.0))
    if "scale" in variant:
        args["softmax_scale"] = variant["scale"]
    if variant.get("alibi"):
        args["alibi_slopes"] = torch.rand(batch, nheads, generator=gen) * 0.3
    if variant.get("sinks"):
        args["sinks"] = torch.randn(nheads, generator=gen, dtype=torch.float64)
    return args


def ref_args(args):
    return dict(causal=args["causal"], window_size=args["window_size"], softcap=args["softcap"],
                alibi_slopes=args.get("alibi_slopes"), sinks=args.get("sinks"), scale=args.get("softmax_scale"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(sorted(v)) or "plain")
def test_flash_attn_func_against_reference(dtype, shape, variant):
    batch, seqlen_q, seqlen_k, nheads, nheads_k, d = shape
    if dtype != torch.float32 and (shape[0], d) != (2, 59) and variant:
        pytest.skip("16-bit: every variant on the first shape, the plain call on every shape")
    q, k, v = random_qkv(batch, seqlen_q, seqlen_k, nheads, nheads_k, d, dtype)
    args = variant_args(variant, batch, nheads)
    dout = torch.randn(batch, seqlen_q, nheads, d, generator=torch.Generator().manual_seed(9))
    sinks = args.pop("sinks", None)
    extra = [] if sinks is None else [sinks.to(torch.float32)]

    def attn_fn(q, k, v, *s):
        return flash_attn_func(q, k, v, **args, sinks=s[0] if s else None)

    compute, low = same_precision(dtype)
    ra = ref_args(dict(args, sinks=sinks))

    def ref_fn(dtype_, low_):
        def f(q, k, v, *s):
            return attention_ref(q, k, v, **dict(ra, sinks=s[0] if s else None), dtype=dtype_, low=low_)[0]
        return f

    (out, grads), (ref, ref_grads) = run_both(attn_fn, ref_fn(torch.float64, None), [q, k, v, *extra], dout)
    _, (pt, pt_grads) = run_both(attn_fn, ref_fn(compute, low), [q, k, v, *extra], dout)
    assert out.dtype == dtype and out.shape == (batch, seqlen_q, nheads, d) and out.is_contiguous()
    eps = 1e-5 if dtype == torch.float32 else 1e-3
    check_budget(out, pt, ref, 2, "out", eps)
    for name, g, g_pt, g_ref in zip(["dq", "dk", "dv", "dsinks"], grads, pt_grads, ref_grads):
        assert g.dtype == g_ref.dtype or name != "dsinks"
        check_budget(g, g_pt, g_ref, 3, name, eps * 10)


def test_flash_attn_func_float64_and_lse():
    """float64 to rounding; softmax_lse (batch, nheads, seqlen_q) float64, +inf for an empty row (causal,
    seqlen_q > seqlen_k), and the probabilities S_dmask."""
    q, k, v = random_qkv(2, 9, 5, 4, 2, 16, torch.float64)
    out, lse, probs = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    ref, attention = attention_ref(q, k, v, causal=True)
    assert err(out, ref) < 1e-12 and err(probs, attention) < 1e-12
    assert lse.shape == (2, 4, 9) and lse.dtype == torch.float64 and probs.shape == (2, 4, 9, 5)
    scores = torch.einsum("bthd,bshd->bhts", q / 4, k.repeat_interleave(2, 2))
    visible = torch.arange(5).view(1, -1) <= torch.arange(9).view(-1, 1) + 5 - 9
    expected = torch.logsumexp(scores.masked_fill(~visible, float("-inf")), -1)
    assert torch.equal(torch.isinf(lse), ~visible.any(-1).expand(2, 4, 9))
    assert (lse[torch.isinf(lse)] > 0).all()  # FlashAttention's +inf
    finite = torch.isfinite(lse)
    assert err(lse[finite], expected[finite]) < 1e-12
    out16, lse16, probs16 = flash_attn_func(q.bfloat16(), k.bfloat16(), v.bfloat16(), return_attn_probs=True)
    assert lse16.dtype == torch.float32 and probs16.dtype == torch.bfloat16


def test_flash_attn_func_reads_views_in_place():
    """Strided q, k, v (slices of a packed qkv) are read through their strides; a non-contiguous last
    dimension is copied."""
    qkv = torch.randn(2, 33, 3, 4, 16, dtype=torch.float64)
    q, k, v = qkv.unbind(2)
    out = flash_attn_func(q, k, v, causal=True)
    assert err(out, attention_ref(q, k, v, causal=True)[0]) < 1e-12
    qt = torch.randn(2, 33, 16, 4, dtype=torch.float64).transpose(-1, -2)
    assert err(flash_attn_func(qt, k, v), attention_ref(qt, k, v)[0]) < 1e-12


def test_flash_attn_func_gradcheck():
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, 5, 4, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    k = torch.randn(2, 7, 2, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    v = torch.randn(2, 7, 2, 2, dtype=torch.float64, generator=gen, requires_grad=True)
    sinks = torch.randn(4, dtype=torch.float64, generator=gen, requires_grad=True)
    slopes = torch.rand(2, 4, dtype=torch.float64, generator=gen)
    for kwargs in (dict(causal=True), dict(window_size=(2, 1), alibi_slopes=slopes, softcap=2.0),
                   dict(causal=True, alibi_slopes=slopes[0], softmax_scale=0.7)):
        assert torch.autograd.gradcheck(lambda q, k, v, s: flash_attn_func(q, k, v, **kwargs, sinks=s),
                                        (q, k, v, sinks))


def test_flash_attn_func_dropout():
    """Dropout: the probabilities S_dmask returns, the dropped ones negative (FlashAttention's
    encoding); out and gradients equal the reference given that mask; torch.manual_seed repeats it."""
    q, k, v = random_qkv(2, 37, 70, 4, 2, 16, torch.float64)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    torch.manual_seed(5)
    out, lse, s_dmask = flash_attn_func(*leaves, dropout_p=0.3, causal=True, return_attn_probs=True)
    keep = s_dmask >= 0
    assert 0.6 < keep[s_dmask != 0].double().mean().item() < 0.8
    ref, attention = attention_ref(q, k, v, dropout_p=0.3, dropout_mask=keep, causal=True)
    assert err(out, ref) < 1e-12 and err(s_dmask.abs(), attention) < 1e-12
    torch.manual_seed(5)
    again = flash_attn_func(q, k, v, dropout_p=0.3, causal=True)
    assert torch.equal(again, out)
    dout = torch.randn(out.shape, dtype=torch.float64)
    out.backward(dout)
    ref_leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    attention_ref(*ref_leaves, dropout_p=0.3, dropout_mask=keep, causal=True)[0].backward(dout)
    for a, b in zip(leaves, ref_leaves):
        assert err(a.grad, b.grad) < 1e-10


# ---- flash_attn_varlen_func ---------------------------------------------------------------------

def padded_batch(lens_q, lens_k, nheads, nheads_k, d, dtype, seed=0):
    """Padded q, k, v with padding masks, and the packed (unpadded) tensors with cu_seqlens."""
    batch = len(lens_q)
    q, k, v = random_qkv(batch, max(lens_q), max(lens_k), nheads, nheads_k, d, dtype, seed=seed)
    qpm = torch.arange(max(lens_q)).view(1, -1) < torch.tensor(lens_q).view(-1, 1)
    kpm = torch.arange(max(lens_k)).view(1, -1) < torch.tensor(lens_k).view(-1, 1)
    cu = lambda lens: torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)  # noqa: E731
    return q, k, v, qpm, kpm, cu(lens_q), cu(lens_k)


def unpad(x, mask):
    return x[mask]


LENGTHS = [  # (lens_q, lens_k): 1, sizes off the 64-row tiles, seqlen_q != seqlen_k per sequence
    ([1, 113, 64, 7], [203, 1, 130, 7]),
    ([65, 3, 200], [65, 40, 129]),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lengths", LENGTHS, ids=["a", "b"])
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(sorted(v)) or "plain")
def test_flash_attn_varlen_func_against_reference(dtype, lengths, variant):
    lens_q, lens_k = lengths
    if dtype == torch.bfloat16 and lengths is not LENGTHS[0]:
        pytest.skip("bfloat16 on the first lengths")
    nheads, nheads_k, d = 4, 2, 59
    q, k, v, qpm, kpm, cu_q, cu_k = padded_batch(lens_q, lens_k, nheads, nheads_k, d, dtype)
    args = variant_args(variant, len(lens_q), nheads)
    sinks = args.pop("sinks", None)
    extra = [] if sinks is None else [sinks.to(torch.float32)]
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(9)) * qpm.view(*qpm.shape, 1, 1)

    def attn_fn(q, k, v, *s):
        out = flash_attn_varlen_func(unpad(q, qpm), unpad(k, kpm), unpad(v, kpm), cu_q, cu_k, max(lens_q),
                                     max(lens_k), **args, sinks=s[0] if s else None)
        padded = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=out.dtype)
        padded[qpm] = out
        return padded

    compute, low = same_precision(dtype)
    ra = ref_args(dict(args, sinks=sinks))

    def ref_fn(dtype_, low_):
        def f(q, k, v, *s):
            return attention_ref(q, k, v, qpm, kpm, **dict(ra, sinks=s[0] if s else None), dtype=dtype_, low=low_)[0]
        return f

    (out, grads), (ref, ref_grads) = run_both(attn_fn, ref_fn(torch.float64, None), [q, k, v, *extra], dout)
    _, (pt, pt_grads) = run_both(attn_fn, ref_fn(compute, low), [q, k, v, *extra], dout)
    eps = 1e-5 if dtype == torch.float32 else 1e-3
    check_budget(out, pt, ref, 2, "out", eps)
    for name, g, g_pt, g_ref in zip(["dq", "dk", "dv", "dsinks"], grads, pt_grads, ref_grads):
        check_budget(g, g_pt, g_ref, 3, name, eps * 10)


def test_flash_attn_varlen_func_lse_and_probs():
    """softmax_lse (nheads, total_q), +inf for a row with no key; S_dmask (batch, nheads, max_seqlen_q,
    max_seqlen_k), each sequence's attention in its corner."""
    lens_q, lens_k = [3, 1, 6], [5, 2, 4]
    q, k, v, qpm, kpm, cu_q, cu_k = padded_batch(lens_q, lens_k, 2, 1, 8, torch.float64)
    slopes = torch.tensor([0.3, 0.1], dtype=torch.float64)
    out, lse, probs = flash_attn_varlen_func(q[qpm], k[kpm], v[kpm], cu_q, cu_k, 6, 5, causal=True,
                                             alibi_slopes=slopes, return_attn_probs=True)
    ref, attention = attention_ref(q, k, v, qpm, kpm, causal=True, alibi_slopes=slopes)
    assert err(out, ref[qpm]) < 1e-12
    assert lse.shape == (2, 10) and probs.shape == (3, 2, 6, 5)
    assert err(probs, attention.masked_fill(~kpm.view(3, 1, 1, -1), 0)) < 1e-12
    # the third sequence: 6 queries, 4 keys, bottom-right: its first two rows see nothing
    assert torch.isinf(lse[:, 4:6]).all() and (lse[:, 4:6] > 0).all() and torch.isfinite(lse[:, 6:]).all()


def test_flash_attn_varlen_func_dropout_is_packed_pattern():
    """Dropout in varlen: the reference given S_dmask's signs; the decisions of sequence b are those of
    the (1, nheads, total_q, total_k) pattern at (cu_seqlens_q[b] + i, cu_seqlens_k[b] + j)."""
    lens_q, lens_k = [7, 1, 20], [9, 4, 20]
    q, k, v, qpm, kpm, cu_q, cu_k = padded_batch(lens_q, lens_k, 2, 2, 8, torch.float64)
    torch.manual_seed(11)
    out, _, s_dmask = flash_attn_varlen_func(q[qpm], k[kpm], v[kpm], cu_q, cu_k, 20, 20, dropout_p=0.25,
                                             return_attn_probs=True)
    keep = s_dmask >= 0
    ref, _ = attention_ref(q, k, v, qpm, kpm, dropout_p=0.25, dropout_mask=keep)
    assert err(out, ref[qpm]) < 1e-12
    torch.manual_seed(11)
    seed = int(torch.randint(0, 2**62, (), dtype=torch.int64).item())
    from attn import _attn
    whole = torch.empty((1, 2, 28, 33), dtype=torch.bool)
    _attn._torch.dropout_keep(whole, 0.25, seed)
    for b in range(3):
        n, m, r, c = lens_q[b], lens_k[b], int(cu_q[b]), int(cu_k[b])
        assert torch.equal(keep[b, :, :n, :m], whole[0, :, r:r + n, c:c + m])


def test_flash_attn_varlen_func_gradcheck():
    lens_q, lens_k = [2, 1, 3], [3, 2, 1]
    q, k, v, qpm, kpm, cu_q, cu_k = padded_batch(lens_q, lens_k, 4, 2, 3, torch.float64, seed=4)
    q, k, v = (x.detach().requires_grad_(True) for x in (q[qpm], k[kpm], v[kpm]))
    sinks = torch.randn(4, dtype=torch.float64, requires_grad=True)
    slopes = torch.rand(3, 4, dtype=torch.float64)
    for kwargs in (dict(causal=True), dict(window_size=(1, 0), alibi_slopes=slopes, softcap=1.5)):
        assert torch.autograd.gradcheck(
            lambda q, k, v, s: flash_attn_varlen_func(q, k, v, cu_q, cu_k, 3, 3, **kwargs, sinks=s), (q, k, v, sinks))
    # Not twice: create_graph=True raises (it had returned a gradient with no graph), and slopes changed
    # in place after the forward are refused by PyTorch's check of saved tensors.
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 3, 3, alibi_slopes=slopes)
    with pytest.raises(RuntimeError, match="create_graph=True"):
        torch.autograd.grad(out.sum(), q, create_graph=True)
    slopes.add_(0.5)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(out.sum(), q)


def test_flash_attn_varlen_func_empty_sequences():
    """Sequences of no query or no key: nothing out, zero gradients; queries without keys output 0."""
    cu_q = torch.tensor([0, 0, 2, 4], dtype=torch.int32)
    cu_k = torch.tensor([0, 3, 3, 5], dtype=torch.int32)
    q = torch.randn(4, 2, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(5, 2, 8, dtype=torch.float64, requires_grad=True)
    v = torch.randn(5, 2, 8, dtype=torch.float64, requires_grad=True)
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 2, 3)
    assert torch.equal(out[:2], torch.zeros(2, 2, 8, dtype=torch.float64))
    out.sum().backward()
    assert torch.equal(k.grad[:3], torch.zeros(3, 2, 8, dtype=torch.float64))
    assert torch.equal(q.grad[:2], torch.zeros(2, 2, 8, dtype=torch.float64))


# ---- errors -------------------------------------------------------------------------------------

def varlen_call(**change):
    args = dict(q=torch.randn(5, 2, 8), k=torch.randn(6, 2, 8), v=torch.randn(6, 2, 8),
                cu_seqlens_q=torch.tensor([0, 2, 5], dtype=torch.int32),
                cu_seqlens_k=torch.tensor([0, 4, 6], dtype=torch.int32), max_seqlen_q=3, max_seqlen_k=4)
    args.update(change)
    return flash_attn_varlen_func(**args)


I32 = torch.int32


@pytest.mark.parametrize("change,error,words", [
    (dict(cu_seqlens_q=torch.tensor([0, 3, 2, 5], dtype=I32)), ValueError, "cu_seqlens_q[2] is 2"),
    (dict(cu_seqlens_q=torch.tensor([1, 2, 5], dtype=I32)), ValueError, "cu_seqlens_q[0] is 1"),
    (dict(cu_seqlens_k=torch.tensor([0, 4, 5], dtype=I32)), ValueError, "cu_seqlens_k ends at 5"),
    (dict(cu_seqlens_q=torch.tensor([0, 2, 5])), TypeError, "cu_seqlens_q has dtype torch.int64"),
    (dict(cu_seqlens_k=torch.tensor([0, 4, 6], dtype=torch.float32)), TypeError, "cu_seqlens_k has dtype"),
    (dict(cu_seqlens_q=torch.tensor([0, 1, 2, 5], dtype=I32)), ValueError, "both must be (B+1,)"),
    (dict(max_seqlen_q=2), ValueError, "max_seqlen_q is 2 but sequence 1 has 3 queries"),
    (dict(max_seqlen_k=3), ValueError, "max_seqlen_k is 3"),
    (dict(max_seqlen_k=4.0), TypeError, "max_seqlen_k must be an int"),
    (dict(sinks=torch.zeros(3)), ValueError, "sinks has shape (3,)"),
    (dict(sinks=torch.tensor([0.0, float("inf")])), ValueError, "sinks has a value that is not finite"),
    (dict(sinks=torch.tensor([0.0, float("nan")])), ValueError, "sinks has a value that is not finite"),
    (dict(alibi_slopes=torch.zeros(3, 2)), ValueError, "alibi_slopes has shape (3, 2)"),
    (dict(alibi_slopes=torch.zeros(2, requires_grad=True)), ValueError, "alibi_slopes requires grad"),
    (dict(k=torch.randn(6, 3, 8), v=torch.randn(6, 3, 8)), ValueError, "nheads must be a multiple of nheads_k"),
    (dict(k=torch.randn(6, 2, 8).double()), TypeError, "k has dtype torch.float64 but q has torch.float32"),
    (dict(q=torch.randn(5, 2, 8).int()), TypeError, "q has dtype torch.int32"),
    (dict(q=torch.randn(1, 5, 2, 8)), ValueError, "q has shape (1, 5, 2, 8)"),
    (dict(q=torch.randn(6, 2, 8)), ValueError, "cu_seqlens_q ends at 5 but queries has 6 rows"),
    (dict(q=[[1.0]]), TypeError, "q must be a torch.Tensor"),
    (dict(dropout_p=1.0), ValueError, "dropout_p is 1.0"),
    (dict(softcap=-1.0), ValueError, "softcap is -1.0"),
    (dict(softmax_scale=float("inf")), ValueError, "softmax_scale is inf"),
    (dict(window_size=5), TypeError, "window_size must be a pair"),
    (dict(causal="yes"), TypeError, "causal must be a bool"),
])
def test_varlen_bad_input_is_named(change, error, words):
    with pytest.raises(error) as info:
        varlen_call(**change)
    assert words in str(info.value)


def test_flash_attn_func_bad_input_is_named():
    q, k, v = random_qkv(2, 5, 6, 4, 2, 8, torch.float32)
    with pytest.raises(ValueError, match=r"q has shape \(5, 4, 8\)"):
        flash_attn_func(q[0], k, v)
    with pytest.raises(ValueError, match="batch_size must match"):
        flash_attn_func(q, k[:1], v[:1])
    with pytest.raises(ValueError, match="headdim"):
        flash_attn_func(q, k[..., :4], v)
    with pytest.raises(ValueError, match=r"sinks has shape \(2,\)"):
        flash_attn_func(q, k, v, sinks=torch.zeros(2))
    with pytest.raises(ValueError, match="not finite"):
        flash_attn_func(q, k, v, sinks=torch.tensor([0.0, 1.0, float("-inf"), 0.0]))
    with pytest.raises(TypeError, match="torch.float16 but q has torch.float32"):
        flash_attn_func(q, k.half(), v)
    if hasattr(torch, "device") and torch.device("meta").type == "meta":
        with pytest.raises(ValueError, match="q is on device meta"):
            flash_attn_func(q.to("meta"), k, v)


def test_numpy_bool_is_a_bool_and_other_types_are_named():
    """causal=numpy.bool_(True), as FlashAttention's bool argument takes it; a tensor is refused
    naming its type (its repr alone, True, read as if True itself were refused)."""
    import numpy as np
    q, k, v = random_qkv(1, 5, 9, 2, 2, 8, torch.float32)
    assert torch.equal(flash_attn_func(q, k, v, causal=np.bool_(True)), flash_attn_func(q, k, v, causal=True))
    assert torch.equal(flash_attn_func(q, k, v, causal=np.bool_(False)), flash_attn_func(q, k, v))
    with pytest.raises(TypeError, match=r"causal must be a bool; got tensor\(True\) of type Tensor"):
        flash_attn_func(q, k, v, causal=torch.tensor(True))


def test_deterministic_is_accepted():
    q, k, v = random_qkv(1, 9, 9, 2, 2, 8, torch.float32)
    assert torch.equal(flash_attn_func(q, k, v, deterministic=True), flash_attn_func(q, k, v))


def test_block_table_is_the_varlen_call_over_the_gathered_pages():
    """block_table (a paged k/v, as a server passes a batch mixing prompt chunks and decode tokens):
    the same as flash_attn_varlen_func over each sequence's keys gathered from its pages; no gradients."""
    torch.manual_seed(5)
    page, nheads, nheads_k, d = 16, 4, 2, 32
    nq, nk = [1, 9, 1, 4], [40, 23, 1, 16]
    k_cache, v_cache = torch.randn(12, page, nheads_k, d), torch.randn(12, page, nheads_k, d)
    table = torch.randperm(12)[:12].view(4, 3).to(I32)
    cu_q = torch.tensor([0, 1, 10, 11, 15], dtype=I32)
    cu_k = torch.tensor([0, 40, 63, 64, 80], dtype=I32)
    q = torch.randn(15, nheads, d)
    k = torch.cat([k_cache[table[b].long()].reshape(-1, nheads_k, d)[: nk[b]] for b in range(4)])
    v = torch.cat([v_cache[table[b].long()].reshape(-1, nheads_k, d)[: nk[b]] for b in range(4)])
    sinks = torch.rand(nheads)
    for causal, window in ((True, (-1, -1)), (False, (5, 0)), (False, (-1, -1))):
        got = flash_attn_varlen_func(q, k_cache, v_cache, cu_q, cu_k, 9, 40, causal=causal, window_size=window,
                                     block_table=table, sinks=sinks)
        want = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 9, 40, causal=causal, window_size=window, sinks=sinks)
        torch.testing.assert_close(got, want, atol=2e-6, rtol=0)
    # max_seqlen_q, max_seqlen_k checked as without block_table (a window bound at or past
    # max_seqlen_k is no bound, so one below a sequence's length would drop the window).
    with pytest.raises(ValueError, match="max_seqlen_k is 39 but sequence 0 has 40 keys"):
        flash_attn_varlen_func(q, k_cache, v_cache, cu_q, cu_k, 9, 39, window_size=(5, 0), block_table=table)
    with pytest.raises(ValueError, match="max_seqlen_q is 8 but sequence 1 has 9 queries"):
        flash_attn_varlen_func(q, k_cache, v_cache, cu_q, cu_k, 8, 40, block_table=table)
    for bad in (-1, 2**70):
        with pytest.raises(ValueError, match=rf"max_seqlen_k is {bad}; it must lie in \[0, 2\^48\]"):
            flash_attn_varlen_func(q, k_cache, v_cache, cu_q, cu_k, 9, bad, block_table=table)
        with pytest.raises(ValueError, match=rf"max_seqlen_q is {bad}; it must lie in \[0, 2\^48\]"):
            flash_attn_varlen_func(q, k, v, cu_q, cu_k, bad, 40)
    with pytest.raises(MemoryError, match=r"return_attn_probs forms S_dmask .* = \(4, 4, 2147483648, 2147483648\)"):
        flash_attn_varlen_func(q, k, v, cu_q, cu_k, 2**31, 2**31, return_attn_probs=True)
    with pytest.raises(ValueError, match=r"block_table has shape \(3,\d+\), a row for each of 3 sequences, but "
                                         r"cu_seqlens_q has shape \(5,\): 4 sequences"):
        flash_attn_varlen_func(q, k_cache, v_cache, cu_q, cu_k, 9, 40, block_table=table[:3])
    # A v of another headdim than k's named as such (it had been reported as an out of the wrong shape).
    with pytest.raises(ValueError, match=r"k has shape \(\d+,\d+,\d+,\d+\) but v \(\d+,\d+,\d+,\d+\); they must match"):
        flash_attn_varlen_func(q, k_cache, torch.cat([v_cache, v_cache[..., :2]], -1), cu_q, cu_k, 9, 40, block_table=table)
    with pytest.raises(ValueError, match="block_table"):
        flash_attn_varlen_func(q.requires_grad_(True), k_cache, v_cache, cu_q, cu_k, 9, 40, block_table=table)


def test_max_seqlen_takes_integers_of_any_kind():
    """max_seqlen_q, max_seqlen_k: Python ints, NumPy integers and 0-d integer tensors (cu_seqlens' max)."""
    np = pytest.importorskip("numpy")
    cu = torch.tensor([0, 2, 5], dtype=I32)
    q = torch.randn(5, 2, 8)
    lens = cu[1:] - cu[:-1]
    expected = flash_attn_varlen_func(q, q, q, cu, cu, 3, 3)
    assert torch.equal(flash_attn_varlen_func(q, q, q, cu, cu, np.int64(3), lens.max()), expected)
    with pytest.raises(TypeError, match="max_seqlen_q must be an int"):
        flash_attn_varlen_func(q, q, q, cu, cu, True, 3)


def test_window_bounds_past_the_keys_are_unbounded():
    """FlashAttention's C++ turns a window bound >= seqlen_k (max_seqlen_k) into -1: with 8 queries over
    2 keys, bottom-right, window_size=(-1, 2) is no window at all (every query sees both keys)."""
    torch.manual_seed(11)
    q, k, v = torch.randn(1, 8, 2, 16), torch.randn(1, 2, 2, 16), torch.randn(1, 2, 2, 16)
    torch.testing.assert_close(flash_attn_func(q, k, v, window_size=(-1, 2)), flash_attn_func(q, k, v), atol=0, rtol=0)
    torch.testing.assert_close(flash_attn_func(q, k, v, window_size=(5, 2)), flash_attn_func(q, k, v), atol=0, rtol=0)
    cu_q, cu_k = torch.tensor([0, 8], dtype=I32), torch.tensor([0, 2], dtype=I32)
    torch.testing.assert_close(flash_attn_varlen_func(q[0], k[0], v[0], cu_q, cu_k, 8, 2, window_size=(-1, 2)),
                               flash_attn_varlen_func(q[0], k[0], v[0], cu_q, cu_k, 8, 2), atol=0, rtol=0)


def test_empty_dimensions_with_attention_probabilities():
    # A batch, queries or keys of length 0 return empty results of the right shapes, S_dmask too.
    for (b, sq, sk) in ((2, 0, 4), (2, 3, 0), (0, 3, 4)):
        out, lse, probs = flash_attn_func(torch.randn(b, sq, 2, 8), torch.randn(b, sk, 2, 8), torch.randn(b, sk, 2, 4),
                                          return_attn_probs=True)
        assert out.shape == (b, sq, 2, 4) and lse.shape == (b, 2, sq) and probs.shape == (b, 2, sq, sk)
        assert torch.all(out == 0)


def test_scalar_arguments_are_named_not_truncated():
    q, k, v = torch.randn(1, 3, 2, 8), torch.randn(1, 4, 2, 8), torch.randn(1, 4, 2, 8)
    with pytest.raises(TypeError, match=r"window_size must be a pair of ints .*got \(1.5, 2\)"):
        flash_attn_func(q, k, v, window_size=(1.5, 2))
    with pytest.raises(ValueError, match="window_size's left is 18446744073709551616"):
        flash_attn_func(q, k, v, window_size=(2**64, 1))
    with pytest.raises(TypeError, match="softcap must be a real number; got None"):
        flash_attn_func(q, k, v, softcap=None)
    with pytest.raises(TypeError, match="softmax_scale must be a real number; got 'x'"):
        flash_attn_func(q, k, v, softmax_scale="x")
    # Errors the shared kernel raises name the function called and FlashAttention's arguments.
    with pytest.raises(ValueError, match=r"^flash_attn_func: alibi_slopes holds nan"):
        flash_attn_func(q, k, v, alibi_slopes=torch.tensor([float("nan"), 1.0]))
    with pytest.raises(ValueError, match=r"^flash_attn_func: softcap is 1e\+39; it must be positive and finite in the "
                                         r"computation's type \(32-bit float\)"):
        flash_attn_func(q, k, v, softcap=1e39)
    # Positive, but 0 in float32: it read as no soft-capping at all.
    with pytest.raises(ValueError, match=r"^flash_attn_func: softcap is 1e-46; it must be positive and finite in the "
                                         r"computation's type \(32-bit float\)"):
        flash_attn_func(q, k, v, softcap=1e-46)
    with pytest.raises(ValueError, match=r"^flash_attn_func: q has shape \(1, 3, 2, 0\) .*headdim and headdim_v must be"):
        flash_attn_func(q[..., :0], k[..., :0], v)
