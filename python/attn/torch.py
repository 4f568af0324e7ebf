"""attn.torch: attn's kernels for PyTorch, as autograd functions and nn.Modules.

    import attn.torch
    out = attn.torch.scaled_dot_product_attention(q, k, v, is_causal=True)   # q.requires_grad: fine
    out.sum().backward()                                                     # attn's backward kernels

Functions (each a torch.autograd.Function whose forward and backward run attn's C++ kernels):
  scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
      scale=None, *, valid_lens=None, window=None, alibi_slopes=None, softcap=None, segment_ids=None,
      enable_gqa=False, align=None, sinks=None, return_lse=False)
      torch.nn.functional.scaled_dot_product_attention's arguments and mask semantics (a bool mask
      is True where a query may attend, a float mask is added to the scores, is_causal is aligned
      top-left unless align says otherwise), with attn's variants as keywords, attention sinks
      (their gradient too) and the log-sum-exp. float32, float64, bfloat16 and float16 tensors;
      16-bit ones accumulate in float32 (attn/sdpa.hpp).
  additive_attention(queries, keys, values, W_q, W_k, w_v, valid_lens=None, *, attn_mask=None,
      is_causal=False, dropout_p=0.0)                      the d2l chapter's additive scoring, as a function
  nadaraya_watson(queries, keys, values, kernel="gaussian", width=1.0)
      the d2l chapter's kernel regression; width may be a tensor that requires grad (it gets its gradient)
Modules, their parameters named as the textbook's modules name theirs, so that load_state_dict moves
weights between the two either way: DotProductAttention, AdditiveAttention, MultiHeadAttention.

How tensors reach attn: through their data pointer and strides (attn._attn._torch), without a copy,
bfloat16 included, whenever the last dimension is contiguous (any other strides, 0 for an expanded
dimension too); a tensor whose last dimension is not contiguous is copied once. CPU tensors only. The
GIL is released while attn computes. attn and PyTorch share one thread count: both run on GCC's
OpenMP runtime, so torch.set_num_threads and attn.set_num_threads set the same number (Debian's
torch sets 1 when it is imported; set it back to the cores you have). Dropout draws attn's seed from PyTorch's default generator, so
torch.manual_seed makes it repeatable; the backward drops the same weights as its forward.

Gradients: for query, key and value (and the parameters and width of the other two operations).
A float attn_mask and alibi_slopes are constants: passing one that requires grad raises ValueError
rather than returning no gradient for it; a mask, valid_lens, slopes, segment ids or sinks changed in
place between the forward and the backward is refused by PyTorch's check of saved tensors. The
attention functions' backward cannot itself be differentiated: a backward with create_graph=True
(double backward, gradgradcheck, gradient penalties) raises RuntimeError rather than leave out attn's
terms (apply_rotary's, linear in x, is once_differentiable).
Errors: attn's checks of shapes and values raise ValueError naming the argument by PyTorch's name;
dtypes and devices raise RuntimeError as PyTorch's own function does.
"""
import functools
import math
import operator

import numpy

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from . import _attn

_bridge = _attn._torch

_SIXTEEN_BITS = (torch.bfloat16, torch.float16)
_FLOATS = (torch.float32, torch.float64) + _SIXTEEN_BITS


# ---- arguments -----------------------------------------------------------------------------------

def _tensor(x, name, function):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{function}: {name} must be a torch.Tensor; got {type(x).__name__}")
    if x.device.type != "cpu":
        raise RuntimeError(f"{function}: {name} is on device {x.device}; attn computes on the CPU "
                           f"(move it with .cpu())")
    return x


def _readable(x):
    """x itself when attn reads it in place (its last dimension contiguous), else a contiguous copy."""
    if x.dim() == 0 or x.shape[-1] <= 1 or x.stride(-1) == 1:
        return x
    return x.contiguous()


def _floating(x, name, function, dtypes=_FLOATS):
    _tensor(x, name, function)
    if x.dtype not in dtypes:
        names = ", ".join(str(d) for d in dtypes)
        raise RuntimeError(f"{function}: {name} has dtype {x.dtype}; attn computes in {names}")
    return x


def _same_dtype(function, reference_name, reference, **tensors):
    for name, x in tensors.items():
        if x.dtype != reference.dtype:
            raise RuntimeError(f"{function}: {name} has dtype {x.dtype} but {reference_name} has {reference.dtype}; "
                               f"they must be the same")


def _constant(x, name, function):
    if isinstance(x, torch.Tensor) and x.requires_grad and torch.is_grad_enabled():
        raise ValueError(f"{function}: {name} requires grad, but attn computes no gradient for it; "
                         f"pass {name}.detach() to use it as a constant")


def _lengths(valid_lens, function):
    if valid_lens is None:
        return None
    lens = torch.as_tensor(valid_lens)
    _tensor(lens, "valid_lens", function)
    if lens.dtype.is_floating_point or lens.dtype.is_complex or lens.dtype == torch.bool:
        raise RuntimeError(f"{function}: valid_lens has dtype {lens.dtype}; it must hold integers")
    return lens.to(torch.int64)


def _segments(ids, name, function):
    ids = torch.as_tensor(ids)
    _tensor(ids, name, function)
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise TypeError(f"{function}: {name} has dtype {ids.dtype}; it must hold integers")
    if ids.dtype not in (torch.int32, torch.int64):
        ids = ids.to(torch.int64)
    return _readable(ids)


def _integer(x, name, function):
    """x as a Python int: an int, a NumPy integer or an integer tensor of one element; TypeError naming
    `name` otherwise (a float is not truncated)."""
    if isinstance(x, torch.Tensor) and x.numel() == 1 and not (x.dtype.is_floating_point or x.dtype.is_complex):
        x = x.item()
    if isinstance(x, bool) or not hasattr(x, "__index__"):
        raise TypeError(f"{function}: {name} must be an integer; got {x!r}")
    x = operator.index(x)
    if not -2**63 <= x < 2**63:
        raise ValueError(f"{function}: {name} is {x}; it must fit in a signed 64-bit integer")
    return x


def _number(x, name, function):
    """x as a Python float: TypeError naming `name` for what is not a real number, ValueError for a tensor
    that requires grad (attn computes no gradient for it)."""
    _constant(x, name, function)
    try:
        return float(x)
    except (TypeError, ValueError):
        raise TypeError(f"{function}: {name} must be a real number; got {x!r}") from None


def _window(window, function):
    if window is None:
        return None
    try:
        left, right = window
    except (TypeError, ValueError):
        raise TypeError(f"{function}: window must be a pair (left, right); got {window!r}") from None
    bound = lambda w, side: -1 if w is None else _integer(w, f"window[{side}]", function)  # noqa: E731
    return (bound(left, 0), bound(right, 1))


def _plain_bool(x):
    """NumPy's bool as Python's (numpy.bool_(True) is not True), anything else as it is: PyTorch's bool
    arguments take either."""
    return bool(x) if isinstance(x, numpy.bool_) else x


def _causal(is_causal, function):
    is_causal = _plain_bool(is_causal)
    if is_causal is True or is_causal == "top_left":
        return "top_left"
    if is_causal is False or is_causal is None:
        return "none"
    if is_causal == "bottom_right":
        return "bottom_right"
    raise ValueError(f"{function}: is_causal is {is_causal!r} of type {type(is_causal).__name__}; it must be False, "
                     f"True (top-left), 'top_left' or 'bottom_right'")


def _align(align, function):
    if align is None or align in ("top_left", "bottom_right"):
        return align
    raise ValueError(f"{function}: align is {align!r}; it must be None, 'top_left' or 'bottom_right'")


def _dropout_seed(dropout_p):
    """attn's dropout seed, drawn from PyTorch's default generator (torch.manual_seed repeats it)."""
    if dropout_p == 0:
        return 0
    return int(torch.randint(0, 2**62, (), dtype=torch.int64).item())


def _mask_options(function, attn_mask, valid_lens, is_causal, mask_dtype):
    """The masks of one call as the bridge reads them; a float mask in mask_dtype."""
    options = {"causal": _causal(is_causal, function), "valid_lens": _lengths(valid_lens, function)}
    if attn_mask is not None:
        _tensor(attn_mask, "attn_mask", function)
        if attn_mask.dtype == torch.bool:
            options["keep"] = attn_mask
        elif attn_mask.dtype.is_floating_point:
            _constant(attn_mask, "attn_mask", function)
            options["additive"] = attn_mask.detach().to(mask_dtype)
        else:
            raise RuntimeError(f"{function}: attn_mask has dtype {attn_mask.dtype}; it must be bool (True = "
                               f"attend) or floating (added to the scores)")
    return options


def _save(ctx, tensors, options):
    """ctx.save_for_backward of the call's tensors and of the tensors among its options (masks, valid
    lengths, slopes, segment ids, sinks), so that a backward after any of them was changed in place
    is refused by PyTorch's version check, as for its own saved tensors (found by probing: a
    valid_lens filled in place between forward and backward changed the gradients silently)."""
    names = [name for name, x in options.items() if torch.is_tensor(x)]
    ctx.option_names, ctx.count = names, len(tensors)
    ctx.options = {name: x for name, x in options.items() if name not in names}
    # A tensor made under torch.inference_mode (a cached mask) cannot be saved: a copy of it is.
    kept = (options[name].clone() if options[name].is_inference() else options[name] for name in names)
    ctx.save_for_backward(*tensors, *kept)


def _first_order(backward):
    """A backward that cannot itself be differentiated: run without a graph, and refused with
    create_graph=True (grad mode on as it starts). PyTorch's once_differentiable refuses a double
    backward only where the incoming gradient requires grad, and otherwise returns gradients with no
    graph, so a gradient penalty through attn silently missed its terms (found by probing)."""
    @functools.wraps(backward)
    def first_order(ctx, *grads):
        if torch.is_grad_enabled():
            raise RuntimeError("attn's backward cannot itself be differentiated: a gradient computed with "
                               "create_graph=True would silently miss its terms through attn (double backward, "
                               "gradgradcheck and gradient penalties are not supported)")
        with torch.no_grad():
            return backward(ctx, *grads)
    return first_order


def _saved(ctx):
    """The tensors and the options _save kept, the options' tensors back in place."""
    saved = ctx.saved_tensors
    return saved[:ctx.count], dict(ctx.options, **dict(zip(ctx.option_names, saved[ctx.count:])))


# ---- scaled dot-product attention ----------------------------------------------------------------

class _ScaledDotProductAttention(torch.autograd.Function):
    """out and lse of attn's sdpa; sinks (H,) or None is an input of its own, for its gradient. With
    options["tokens_first"], query, key and value are (B, S, H, D) (FlashAttention's layout, attn.flash):
    attn reads (B, H, S, D) views of them and out is allocated (B, S, H, Dv); lse is (B, H, S) either way."""
    @staticmethod
    def forward(ctx, query, key, value, sinks, options):
        heads = _heads_of(options)
        wide = torch.float32 if query.dtype in _SIXTEEN_BITS else query.dtype
        out = torch.empty(query.shape[:-1] + value.shape[-1:], dtype=query.dtype)
        lse = torch.empty(heads(query).shape[:-1], dtype=wide)
        options = dict(options, sinks=None if sinks is None else _readable(sinks.detach()))
        _bridge.sdpa_forward(heads(out), lse, heads(query), heads(key), heads(value), options)
        _save(ctx, (query, key, value, out, lse), options)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    @_first_order
    def backward(ctx, grad_out, grad_lse):
        (query, key, value, out, lse), options = _saved(ctx)
        heads = _heads_of(options)
        wanted = ctx.needs_input_grad
        grads = [torch.empty(x.shape, dtype=x.dtype) if want else None
                 for x, want in zip((query, key, value), wanted)]
        sinks = options["sinks"]
        grad_sinks = torch.empty(sinks.shape, dtype=sinks.dtype) if wanted[3] else None
        if any(g is not None for g in grads) or grad_sinks is not None:
            views = [None if g is None else heads(g) for g in grads]
            _bridge.sdpa_backward(*views, heads(_readable(grad_out.to(out.dtype))), heads(query), heads(key),
                                  heads(value), heads(out), lse, options, grad_sinks=grad_sinks)
        return (*grads, grad_sinks, None)


def _heads_of(options):
    """The (B, H, S, D) view attn reads of a call's tensors: themselves, or for tokens-first tensors
    (B, S, H, D) their transpose (no copy)."""
    if options.get("tokens_first"):
        return lambda x: x.transpose(1, 2)
    return lambda x: x


def _heads_view(x):
    """(..., L, E) as attn's rank 3 or 4: a 2-D tensor gets a batch of one, more than 4 dimensions
    have their leading ones flattened."""
    if x.dim() == 2:
        return x.unsqueeze(0)
    if x.dim() > 4:
        return x.flatten(0, x.dim() - 4)
    return x


def _batch_mask(attn_mask, query, function):
    """attn_mask for a query of more than 4 dimensions: its batch dimensions (all but the last 3)
    broadcast against the query's and flattened as _heads_view flattens the query's (a copy only
    where the mask varies along them)."""
    if not torch.is_tensor(attn_mask) or query.dim() <= 4 or attn_mask.dim() <= 3:
        return attn_mask
    if attn_mask.dim() > query.dim():
        raise ValueError(f"{function}: attn_mask has shape {tuple(attn_mask.shape)}, more dimensions than query "
                         f"{tuple(query.shape)}")
    mask = attn_mask.reshape((1,) * (query.dim() - attn_mask.dim()) + tuple(attn_mask.shape))
    batch = query.shape[:-3]
    if all(size == 1 for size in mask.shape[:-3]):
        return mask.reshape(1, *mask.shape[-3:])
    try:
        return mask.expand(*batch, *mask.shape[-3:]).flatten(0, len(batch) - 1)
    except RuntimeError:
        raise ValueError(f"{function}: attn_mask has shape {tuple(attn_mask.shape)}, whose batch dimensions do "
                         f"not broadcast to query's {tuple(query.shape)}") from None


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, *,
                                 valid_lens=None, window=None, alibi_slopes=None, softcap=None, segment_ids=None,
                                 enable_gqa=False, align=None, sinks=None, return_lse=False):
    """softmax(query key^T * scale + mask) value, with dropout on the weights: PyTorch 2's
    torch.nn.functional.scaled_dot_product_attention computed by attn, forward and backward.

    query (..., L, E), key (..., S, E), value (..., S, Ev); the leading dimensions (batch, heads) of
    key and value equal query's or are 1 (broadcast). With enable_gqa=True the heads dimension (-3) of
    key and value may divide query's (grouped-query attention). Returns (..., L, Ev) in query's dtype.
    attn_mask: bool (True = attend) or float (added; same dtype as query), broadcastable to (..., L, S).
    is_causal: True aligns the causal mask top-left as PyTorch does (or as `align` says); 'bottom_right'
      aligns it to the end of the keys (a decoder continuing a cache). It may be combined with attn_mask.
    align: None or 'top_left' (query i at position i), or 'bottom_right' (query i at i + S - L, the
      queries being the last L of S tokens: FlashAttention's convention) for the causal mask, the window
      and ALiBi together, causal or not (docs/semantics.md, "Alignment").
    scale: default 1/sqrt(E). dropout_p: applied whenever > 0, as PyTorch's function does (pass 0.0
      in eval mode); the seed comes from torch's default generator.
    attn's variants (attn/mask.hpp): valid_lens (B,) or (B, L) integers; window (left, right), None
      for an unbounded side; alibi_slopes (H,) or (B, H); softcap c > 0 (score = c tanh(score / c));
      segment_ids (B, L) when L == S, or a pair ((B, L), (B, S)), for packed sequences.
    sinks: (H,) attention sinks (gpt-oss): one logit per head joining each row's softmax, with no value;
      a sinks tensor that requires grad gets its gradient.
    return_lse: also return the log-sum-exp of each score row, (..., L) (float32 for 16-bit inputs; it
      includes the sinks; -inf for a row with no key and no sink); it carries no gradient.
    """
    function = "scaled_dot_product_attention"
    _floating(query, "query", function)
    _floating(key, "key", function)
    _floating(value, "value", function)
    _same_dtype(function, "query", query, key=key, value=value)
    if query.dim() < 2 or key.dim() != query.dim() or value.dim() != query.dim():
        raise ValueError(f"{function}: query {tuple(query.shape)}, key {tuple(key.shape)} and value "
                         f"{tuple(value.shape)} must have the same number of dimensions, at least 2")
    if query.dim() > 4:  # the leading batch dimensions broadcast against each other, as PyTorch's
        try:
            lead = torch.broadcast_shapes(query.shape[:-3], key.shape[:-3], value.shape[:-3])
        except RuntimeError:
            raise RuntimeError(f"{function}: query {tuple(query.shape)}, key {tuple(key.shape)} and value "
                               f"{tuple(value.shape)} have leading batch dimensions that do not broadcast") from None
        query, key, value = (x.expand(*lead, *x.shape[-3:]) for x in (query, key, value))
    q, k, v = _heads_view(query), _heads_view(key), _heads_view(value)
    if q.dim() == 4 and k.shape[1] not in (1, q.shape[1]) and not enable_gqa:  # 1: broadcast, as PyTorch
        raise RuntimeError(f"{function}: query has {q.shape[1]} heads but key has {k.shape[1]}; pass "
                           f"enable_gqa=True for grouped-query attention")
    if k.shape[0] == 1 and q.shape[0] > 1:  # a batch of one broadcast: an expanded view, not a copy
        k, v = k.expand(q.shape[0], *k.shape[1:]), v.expand(q.shape[0], *v.shape[1:])
    q, k, v = _readable(q), _readable(k), _readable(v)
    sixteen = query.dtype in _SIXTEEN_BITS
    mask_dtype = torch.float32 if sixteen else query.dtype
    options = _mask_options(function, _batch_mask(attn_mask, query, function), valid_lens, is_causal, mask_dtype)
    options["align"] = _align(align, function)
    if align == "bottom_right" and options["causal"] == "top_left" and _plain_bool(is_causal) is True:
        options["causal"] = "bottom_right"
    options["window"] = _window(window, function)
    if alibi_slopes is not None:
        _constant(alibi_slopes, "alibi_slopes", function)
        options["alibi_slopes"] = _readable(torch.as_tensor(alibi_slopes).detach().to(mask_dtype))
    if segment_ids is not None:
        pair = isinstance(segment_ids, (tuple, list))
        options["segment_ids_q"] = _segments(segment_ids[0] if pair else segment_ids, "segment_ids", function)
        if pair:
            options["segment_ids_k"] = _segments(segment_ids[1], "segment_ids", function)
    options["scale"] = None if scale is None else _number(scale, "scale", function)
    options["softcap"] = None if softcap is None else _number(softcap, "softcap", function)
    options["dropout_p"] = _number(dropout_p, "dropout_p", function)
    options["seed"] = _dropout_seed(dropout_p)
    if sinks is not None:
        _tensor(sinks, "sinks", function)
        if not sinks.dtype.is_floating_point:
            raise RuntimeError(f"{function}: sinks has dtype {sinks.dtype}; it must be floating")
        sinks = sinks.to(mask_dtype)
    out, lse = _ScaledDotProductAttention.apply(q, k, v, sinks, options)
    out = out.reshape(query.shape[:-1] + value.shape[-1:])
    if return_lse:
        return out, lse.reshape(query.shape[:-1])
    return out


# ---- additive attention --------------------------------------------------------------------------

class _AdditiveAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, queries, keys, values, W_q, W_k, w_v, options):
        out = torch.empty(queries.shape[:-1] + values.shape[-1:], dtype=queries.dtype)
        _bridge.additive_forward(out, queries, keys, values, W_q, W_k, w_v, options)
        _save(ctx, (queries, keys, values, W_q, W_k, w_v), options)
        return out

    @staticmethod
    @_first_order
    def backward(ctx, grad_out):
        saved, options = _saved(ctx)
        inputs = [torch.empty(x.shape, dtype=x.dtype) if want else None
                  for x, want in zip(saved[:3], ctx.needs_input_grad[:3])]
        params = [torch.empty(x.shape, dtype=x.dtype) for x in saved[3:]]  # attn writes all three
        _bridge.additive_backward(*inputs, *params, _readable(grad_out.to(saved[0].dtype)), *saved, options)
        params = [g if want else None for g, want in zip(params, ctx.needs_input_grad[3:6])]
        return (*inputs, *params, None)


def additive_attention(queries, keys, values, W_q, W_k, w_v, valid_lens=None, *, attn_mask=None, is_causal=False,
                       dropout_p=0.0):
    """The d2l chapter's additive attention: softmax(w_v^T tanh(W_q q + W_k k)) pooling the values.

    queries (B, n, q), keys (B, m, k), values (B, m, v) (or 4-D with heads); W_q (h, q), W_k (h, k) and
    w_v (h,) or (1, h), nn.Linear's weight layout. Returns (B, n, v). Masks as
    scaled_dot_product_attention; dropout_p applied whenever > 0. float32 and float64 compute as they
    are; 16-bit tensors compute in float32 and are rounded back.
    """
    function = "additive_attention"
    for name, x in (("queries", queries), ("keys", keys), ("values", values), ("W_q", W_q), ("W_k", W_k),
                    ("w_v", w_v)):
        _floating(x, name, function)
    _same_dtype(function, "queries", queries, keys=keys, values=values, W_q=W_q, W_k=W_k, w_v=w_v)
    dtype = queries.dtype
    if dtype in _SIXTEEN_BITS:
        wide = [x.float() for x in (queries, keys, values, W_q, W_k, w_v)]
        return additive_attention(*wide, valid_lens, attn_mask=attn_mask, is_causal=is_causal,
                                  dropout_p=dropout_p).to(dtype)
    if not (w_v.dim() == 1 or (w_v.dim() == 2 and w_v.shape[0] == 1)):
        raise ValueError(f"{function}: w_v has shape {tuple(w_v.shape)}; it must be (h,) or (1, h), "
                         f"nn.Linear(h, 1)'s weight")
    for name, x in (("queries", queries), ("keys", keys), ("values", values)):
        if x.dim() not in (3, 4):
            raise ValueError(f"{function}: {name} has shape {tuple(x.shape)}; it must have 3 or 4 dimensions")
    options = _mask_options(function, attn_mask, valid_lens, is_causal, dtype)
    options["dropout_p"] = float(dropout_p)
    options["seed"] = _dropout_seed(dropout_p)
    tensors = [_readable(x) for x in (queries, keys, values, W_q, W_k, w_v.reshape(-1))]
    return _AdditiveAttention.apply(*tensors, options)


# ---- Nadaraya-Watson -----------------------------------------------------------------------------

class _NadarayaWatson(torch.autograd.Function):
    @staticmethod
    def forward(ctx, queries, keys, values, width, kernel):
        out = torch.empty(queries.shape[:-1] + values.shape[-1:], dtype=queries.dtype)
        _bridge.nadaraya_watson_forward(out, queries, keys, values, kernel, float(width))
        _save(ctx, (queries, keys, values, width), {"kernel": kernel})
        return out

    @staticmethod
    @_first_order
    def backward(ctx, grad_out):
        (queries, keys, values, width), options = _saved(ctx)
        grads = [torch.empty(x.shape, dtype=x.dtype) if want else None
                 for x, want in zip((queries, keys, values), ctx.needs_input_grad[:3])]
        want_width = ctx.needs_input_grad[3]
        dwidth = _bridge.nadaraya_watson_backward(*grads, _readable(grad_out.to(queries.dtype)), queries, keys, values,
                                                  options["kernel"], float(width), want_width)
        return (*grads, torch.full_like(width, dwidth) if want_width else None, None)


def _as_batch(x):
    """(len,) as (1, len, 1) and (len, c) as (1, len, c); batches as they are."""
    if x.dim() == 1:
        return x.reshape(1, -1, 1)
    if x.dim() == 2:
        return x.unsqueeze(0)
    return x


def nadaraya_watson(queries, keys, values, kernel="gaussian", width=1.0):
    """Nadaraya-Watson regression: f(q) = sum_j K(|q - k_j| / width) v_j / sum_j K(|q - k_j| / width).

    kernel: "gaussian", "boxcar", "epanechnikov" or "constant" (attn/nadaraya_watson.hpp). queries
    (n,), keys (m,) and values (m,) as in the d2l chapter's regression (returns (n,)); or (n, p), (m, p),
    (m, v) (returns (n, v); (n,) for 1-D values); or batches (B, n, p), (B, m, p), (B, m, v).
    width: a positive float, or a one-element tensor; when it requires grad it gets d loss / d width
    (the learnable width of the d2l chapter's parametric regression).
    """
    function = "nadaraya_watson"
    for name, x in (("queries", queries), ("keys", keys), ("values", values)):
        _floating(x, name, function, (torch.float32, torch.float64))
    _same_dtype(function, "queries", queries, keys=keys, values=values)
    width_tensor = width if isinstance(width, torch.Tensor) else torch.tensor(float(width), dtype=torch.float64)
    if width_tensor.numel() != 1:
        raise ValueError(f"{function}: width has shape {tuple(width_tensor.shape)}; it must hold one number")
    # Checked here, before the width is narrowed to the call's dtype (the bridge gets it narrowed).
    given = float(width_tensor.detach())
    narrowed = float(torch.tensor(given, dtype=queries.dtype))
    if given > 0 and math.isfinite(given) and not (narrowed > 0 and math.isfinite(narrowed)):
        raise ValueError(f"{function}: width is {given!r}, which is {narrowed!r} in {str(queries.dtype)[6:]}, the "
                         f"dtype the call computes in; it must be positive and finite there")
    batched = queries.dim() > 2
    q, k, v = (_readable(_as_batch(x)) for x in (queries, keys, values))
    out = _NadarayaWatson.apply(q, k, v, width_tensor.to(queries.dtype), str(kernel))
    if batched:
        return out
    return out.reshape(-1) if values.dim() == 1 else out.squeeze(0)


# ---- modules -------------------------------------------------------------------------------------

class DotProductAttention(nn.Module):
    """The d2l chapter's DotProductAttention on attn's fused kernel: forward(queries, keys, values,
    valid_lens=None, **variants) with queries (B, n, d) or (B, H, n, d); variants as
    scaled_dot_product_attention's keywords (attn_mask, is_causal, window, ...). Dropout on the weights
    in training mode only. It forms no weights: attention_weights is not kept (attn.masked_softmax
    computes them when wanted)."""

    def __init__(self, dropout=0.0):
        super().__init__()
        self.dropout = nn.Dropout(dropout)

    def forward(self, queries, keys, values, valid_lens=None, **variants):
        p = self.dropout.p if self.training else 0.0
        return scaled_dot_product_attention(queries, keys, values, dropout_p=p, valid_lens=valid_lens, **variants)


def _linear(in_features, out_features, bias, dtype=None):
    """nn.Linear, or nn.LazyLinear (its input size taken from the first call) when in_features is None."""
    if in_features is None:
        return nn.LazyLinear(out_features, bias=bias, dtype=dtype)
    return nn.Linear(in_features, out_features, bias=bias, dtype=dtype)


def _materialize(linear, x):
    """Gives a LazyLinear its weight from x's last size (by a call on no rows), as its first call would."""
    if isinstance(linear, nn.modules.lazy.LazyModuleMixin) and linear.has_uninitialized_params():
        linear(x.narrow(-2, 0, 0))


class AdditiveAttention(nn.Module):
    """The d2l chapter's AdditiveAttention, its scores, softmax, dropout and pooling in attn's kernels.

    AdditiveAttention(key_size, query_size, num_hiddens, dropout) as the d2l chapter's first version, or
    AdditiveAttention(num_hiddens, dropout) as d2l's later one (LazyLinear: sizes from the first call).
    Parameters W_k.weight (h, k), W_q.weight (h, q), w_v.weight (1, h), as the d2l chapter's nn.Linear layers.
    forward(queries, keys, values, valid_lens=None, *, attn_mask=None, is_causal=False).
    """

    def __init__(self, *args, dtype=None):
        super().__init__()
        if len(args) == 4:
            key_size, query_size, num_hiddens, dropout = args
        elif len(args) == 2:
            key_size, query_size, (num_hiddens, dropout) = None, None, args
        else:
            raise TypeError("AdditiveAttention(key_size, query_size, num_hiddens, dropout) or "
                            f"AdditiveAttention(num_hiddens, dropout); got {len(args)} arguments")
        self.W_k = _linear(key_size, num_hiddens, False, dtype)
        self.W_q = _linear(query_size, num_hiddens, False, dtype)
        self.w_v = _linear(num_hiddens, 1, False, dtype)
        self.dropout = nn.Dropout(dropout)

    def forward(self, queries, keys, values, valid_lens=None, *, attn_mask=None, is_causal=False):
        _materialize(self.W_q, queries)
        _materialize(self.W_k, keys)
        p = self.dropout.p if self.training else 0.0
        return additive_attention(queries, keys, values, self.W_q.weight, self.W_k.weight, self.w_v.weight, valid_lens,
                                  attn_mask=attn_mask, is_causal=is_causal, dropout_p=p)


class MultiHeadAttention(nn.Module):
    """d2l's MultiHeadAttention (the next d2l chapter) on attn's fused kernel, with grouped
    key and value heads (num_kv_heads divides num_heads; None: as many as num_heads).

    MultiHeadAttention(num_hiddens, num_heads, dropout, bias=False, num_kv_heads=None, *,
    query_size=None, key_size=None, value_size=None): the projections W_q, W_k, W_v, W_o are nn.Linear
    (nn.LazyLinear, as d2l's, for the sizes not given), so their parameters are W_q.weight, ..., W_o.weight
    (and .bias with bias=True) as d2l names them. forward(queries (B, n, q), keys (B, m, k),
    values (B, m, v), valid_lens=None, **variants) returns (B, n, num_hiddens); variants as
    scaled_dot_product_attention's keywords. The heads are strided views of the projections: attn
    reads them in place, without the transposed copies of d2l's transpose_qkv.
    """

    def __init__(self, num_hiddens, num_heads, dropout=0.0, bias=False, num_kv_heads=None, *, query_size=None,
                 key_size=None, value_size=None, dtype=None):
        super().__init__()
        function = "MultiHeadAttention"
        num_hiddens, num_heads = _integer(num_hiddens, "num_hiddens", function), _integer(num_heads, "num_heads", function)
        num_kv_heads = num_heads if num_kv_heads is None else _integer(num_kv_heads, "num_kv_heads", function)
        for name, size in (("num_hiddens", num_hiddens), ("num_heads", num_heads), ("num_kv_heads", num_kv_heads)):
            if size < 1:
                raise ValueError(f"{function}: {name} is {size}; it must be at least 1")
        if num_hiddens % num_heads or num_heads % num_kv_heads:
            raise ValueError(f"{function}: num_hiddens {num_hiddens} must be a multiple of num_heads "
                             f"{num_heads}, and num_heads a multiple of num_kv_heads {num_kv_heads}")
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        kv_hiddens = num_kv_heads * (num_hiddens // num_heads)
        self.attention = DotProductAttention(dropout)
        self.W_q = _linear(query_size, num_hiddens, bias, dtype)
        self.W_k = _linear(key_size, kv_hiddens, bias, dtype)
        self.W_v = _linear(value_size, kv_hiddens, bias, dtype)
        self.W_o = _linear(num_hiddens, num_hiddens, bias, dtype)

    @staticmethod
    def _split_heads(x, heads):
        # (B, n, heads * dh) -> (B, heads, n, dh): a view whose last dimension stays contiguous
        return x.reshape(x.shape[0], x.shape[1], heads, -1).transpose(1, 2)

    def forward(self, queries, keys, values, valid_lens=None, **variants):
        for name, x in (("queries", queries), ("keys", keys), ("values", values)):
            if not isinstance(x, torch.Tensor) or x.dim() != 3:
                raise ValueError(f"MultiHeadAttention: {name} has shape {tuple(getattr(x, 'shape', ()))}; it must be "
                                 f"(batch, tokens, features)")
        if keys.shape[0] != queries.shape[0] or values.shape[:2] != keys.shape[:2]:
            raise ValueError(f"MultiHeadAttention: queries {tuple(queries.shape)}, keys {tuple(keys.shape)} and values "
                             f"{tuple(values.shape)} must share the batch, and keys and values their tokens")
        q = self._split_heads(self.W_q(queries), self.num_heads)
        k = self._split_heads(self.W_k(keys), self.num_kv_heads)
        v = self._split_heads(self.W_v(values), self.num_kv_heads)
        out = self.attention(q, k, v, valid_lens, enable_gqa=True, **variants)  # (B, H, n, dh)
        return self.W_o(out.transpose(1, 2).reshape(queries.shape[0], queries.shape[1], -1))


# ---- rotary position embeddings ------------------------------------------------------------------

class _ApplyRotary(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin, interleaved, inplace, offset, offsets, cu_seqlens):
        out = x if inplace else torch.empty(x.shape, dtype=x.dtype)
        _bridge.rotary_forward(out, x, cos, sin, offset, offsets, cu_seqlens, interleaved, False)
        if inplace:
            ctx.mark_dirty(x)
        ctx.save_for_backward(cos, sin, offsets, cu_seqlens)
        ctx.interleaved, ctx.offset = interleaved, offset
        return out

    @staticmethod
    @once_differentiable  # linear in x with constant tables: no second-order term is lost
    def backward(ctx, grad_out):
        cos, sin, offsets, cu_seqlens = ctx.saved_tensors
        grad = _readable(grad_out)
        grad_x = torch.empty(grad.shape, dtype=grad.dtype)
        # The rotation's transpose (sin negated): grad_x = R^T grad_out.
        _bridge.rotary_forward(grad_x, grad, cos, sin, ctx.offset, offsets, cu_seqlens, ctx.interleaved, True)
        return grad_x, None, None, None, None, None, None, None


def _index_tensor(t, name, function):
    _tensor(t, name, function)
    if t.dtype not in (torch.int32, torch.int64):
        raise RuntimeError(f"{function}: {name} has dtype {t.dtype}; it must be torch.int32 or torch.int64")
    return t.contiguous()


def apply_rotary(x, cos, sin, *, interleaved=False, offsets=0, cu_seqlens=None, inplace=False):
    """Rotary position embeddings (RoPE): FlashAttention's flash_attn.layers.rotary.apply_rotary_emb,
    computed by attn (attn/rotary.hpp), with its gradient for x.

    x (batch, seqlen, nheads, headdim), or (total, nheads, headdim) with cu_seqlens (batch + 1,) int32
    or int64 (sequence b is x[cu_seqlens[b]:cu_seqlens[b+1]]). cos, sin (seqlen_ro, rotary_dim / 2),
    rotary_dim <= headdim; only x[..., :rotary_dim] rotates. Token i of sequence b sits at position
    i + offsets (an int, or a (batch,) int32/int64 tensor), which must be less than seqlen_ro.
    interleaved: rotate the pairs (x[2k], x[2k+1]) (GPT-J) instead of the halves (GPT-NeoX).
    inplace: rotate x itself and return it. float32, float64, bfloat16 and float16 x; 16-bit x is
    computed in float32 and rounded once, with float32 tables (cos and sin are converted to x's
    precision, float32 for 16-bit x). cos and sin are constants (no gradient).
    """
    function = "apply_rotary"
    _floating(x, "x", function)
    if x.dim() > 4:
        raise ValueError(f"{function}: x has shape {tuple(x.shape)} with {x.dim()} dimensions; it must be (batch, seqlen, "
                         f"nheads, headdim), or (total, nheads, headdim) with cu_seqlens")
    wide = torch.float32 if x.dtype in _SIXTEEN_BITS else x.dtype
    tables = []
    for name, t in (("cos", cos), ("sin", sin)):
        _constant(t, name, function)
        _floating(_tensor(t, name, function), name, function)
        tables.append(_readable(t.detach().to(wide)))
    offset, offset_tensor = 0, None
    if isinstance(offsets, torch.Tensor):
        offset_tensor = _index_tensor(offsets, "offsets", function)
    else:
        offset = _integer(offsets, "offsets", function)  # a float is refused, not truncated
    if cu_seqlens is not None:
        cu_seqlens = _index_tensor(torch.as_tensor(cu_seqlens), "cu_seqlens", function)
    if inplace and x.dim() > 0 and x.shape[-1] > 1 and x.stride(-1) != 1:
        raise ValueError(f"{function}: inplace=True writes into x, whose last dimension must then be contiguous "
                         f"(its stride is {x.stride(-1)})")
    return _ApplyRotary.apply(x if inplace else _readable(x), tables[0], tables[1], bool(interleaved), bool(inplace),
                              offset, offset_tensor, cu_seqlens)


__all__ = ["apply_rotary", "scaled_dot_product_attention", "additive_attention", "nadaraya_watson", "DotProductAttention",
           "AdditiveAttention", "MultiHeadAttention"]
