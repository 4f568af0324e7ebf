"""attn.flash: FlashAttention-2's Python functions on CPU torch tensors, computed by attn.

    from attn.flash import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache
    out = flash_attn_func(q, k, v, causal=True)                          # (batch, seqlen, nheads, headdim)
    out = flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    out = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lens, causal=True)

Functions (the signatures, defaults, layouts and return values of flash_attn.flash_attn_interface;
autograd through both, attn's fused forward and backward kernels):
  flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
      softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False, *, sinks=None)
      q (batch, seqlen_q, nheads, headdim), k (batch, seqlen_k, nheads_k, headdim), v (batch, seqlen_k,
      nheads_k, headdim_v); returns out (batch, seqlen_q, nheads, headdim_v).
  flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
      dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
      alibi_slopes=None, deterministic=False, return_attn_probs=False, block_table=None, *, sinks=None)
      q (total_q, nheads, headdim), k and v (total_k, nheads_k, headdim[_v]) packed, cu_seqlens_q and
      cu_seqlens_k (batch + 1,) int32 cumulative lengths; returns out (total_q, nheads, headdim_v).
      Each sequence attends only to its own keys (attn/varlen.hpp: one fused call per sequence on
      views of the packed rows, no padding computed).
  flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
      cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
      softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, rotary_interleaved=True,
      alibi_slopes=None, num_splits=0, return_softmax_lse=False, *, sinks=None)
      the caller's KV cache, contiguous or paged, updated in place with k and v (rotary embeddings
      applied to them and to q); forward only, as FlashAttention (attn._flash_kvcache states the rest).

Conventions, FlashAttention's (and where attn.torch differs):
  - Layouts: (batch, seqlen, nheads, headdim) and packed (total, nheads, headdim); attn.torch takes
    (batch, nheads, seqlen, headdim). The tensors are read in place through their strides (the last
    dimension contiguous; a tensor whose last dimension is not is copied once, as FlashAttention's
    maybe_contiguous does).
  - Alignment: always bottom-right, per sequence. Query i of a sequence of n_q queries and n_k keys
    sits at position i + n_k - n_q for causal (key j visible when j <= i + n_k - n_q), for the window
    (keys i + n_k - n_q - left .. i + n_k - n_q + right; -1 is unbounded; causal sets right = 0) and
    for ALiBi (score -= slope * |i + n_k - n_q - j|). attn.torch's is_causal=True is top-left.
  - softmax_scale: default 1 / sqrt(headdim). softcap: 0.0 is off, c > 0 gives score =
    c tanh(score / c) before ALiBi (a negative softcap is refused; FlashAttention ignores it).
  - alibi_slopes: (nheads,) or (batch, nheads), any float dtype (FlashAttention: float32); constants:
    one that requires grad raises ValueError (FlashAttention gives it no gradient silently).
  - GQA/MQA: nheads a multiple of nheads_k; query head h reads key head h // (nheads // nheads_k).
  - A query row that sees no key outputs 0, with zero gradients.
  - dropout_p: drops weights with attn's counter-based generator, its seed drawn from torch's default
    generator (torch.manual_seed repeats it); the backward drops the same weights. For varlen,
    sequence b's weight (h, i, j) takes the decision of one (1, nheads, total_q, total_k) attention at
    (h, cu_seqlens_q[b] + i, cu_seqlens_k[b] + j). FlashAttention's CUDA pattern is not reproduced.
  - deterministic: accepted and ignored: attn's forward and backward are always deterministic.
  - return_attn_probs=True returns (out, softmax_lse, S_dmask):
      softmax_lse float32 (float64 for float64 q): (batch, nheads, seqlen_q), or (nheads, total_q) for
        varlen; +inf for a row with no key, as FlashAttention's kernels return it (the log of an empty
        sum is -inf; FlashAttention writes +inf so that its backward's exp(score - lse) is 0).
      S_dmask in q's dtype: the attention probabilities (before dropout, without its 1/(1 - p)), with
        the weights dropout dropped negated (FlashAttention's encoding): (batch, nheads, seqlen_q,
        seqlen_k), or (batch, nheads, max_seqlen_q, max_seqlen_k) for varlen, sequence b in its top-left
        corner and 0 elsewhere. FlashAttention rounds the last two sizes up to multiples of 128 and
        returns an empty tensor when dropout_p == 0; attn returns the probabilities in every case,
        computed by an extra float32 (float64) pass.
      softmax_lse and S_dmask carry no gradient (FlashAttention's backward ignores them too).
  - sinks (keyword, attn's extra; gpt-oss): (nheads,) attention-sink logits joining each row's softmax
    with no value; finite; a sinks tensor that requires grad gets its gradient. softmax_lse includes
    them (a row with no key then has lse = its sink).
  - block_table (flash_attn_varlen_func; FlashAttention 2.6): k and v are then a paged cache
    (num_blocks, page_block_size, nheads_k, headdim), sequence b's keys in the pages block_table[b]
    (int32), cu_seqlens_k giving their lengths: the call a server makes for a batch mixing prompt
    chunks and decode tokens (attn::flash_attn_varlen_paged: decode-length sequences read the pages in
    place, longer ones gather theirs). Inference only: ValueError when gradients are required.
  - dtypes: float32, bfloat16, float16 (accumulating in float32), and float64 (not with block_table,
    nor in flash_attn_with_kvcache); CPU tensors only.
  - window_size bounds at or past the keys' length (max_seqlen_k for varlen) are unbounded, as
    FlashAttention's C++ makes them.
Errors: TypeError for a wrong type or dtype, ValueError for a wrong device, shape or value, each naming
the argument (FlashAttention's names).
"""
import math
import operator

import torch

from . import _attn
from ._flash_args import window_bounds
from ._flash_kvcache import flash_attn_with_kvcache
from .torch import _dropout_seed, _first_order, _number, _save, _saved, _ScaledDotProductAttention

_bridge = _attn._torch

_SIXTEEN_BITS = (torch.bfloat16, torch.float16)
_FLOATS = (torch.float32, torch.float64) + _SIXTEEN_BITS
# The largest max_seqlen_q or max_seqlen_k taken (attn places queries and keys in [0, 2^48): mask.hpp).
_MAX_SEQLEN = 1 << 48

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache"]


# ---- arguments -----------------------------------------------------------------------------------

def _tensor(x, name, function):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{function}: {name} must be a torch.Tensor; got {type(x).__name__}")
    if x.device.type != "cpu":
        raise ValueError(f"{function}: {name} is on device {x.device}; attn computes on the CPU (move it with .cpu())")
    return x


def _contiguous_last(x):
    """x when its last dimension is contiguous (attn reads it in place), else a copy that is."""
    if x.dim() == 0 or x.shape[-1] <= 1 or x.stride(-1) == 1:
        return x
    return x.contiguous()


def _qkv(function, q, k, v, rank, layout):
    for name, x in (("q", q), ("k", k), ("v", v)):
        _tensor(x, name, function)
        if x.dtype not in _FLOATS:
            raise TypeError(f"{function}: {name} has dtype {x.dtype}; attn computes in float32, bfloat16, "
                            f"float16 or float64")
        if x.dim() != rank:
            raise ValueError(f"{function}: {name} has shape {tuple(x.shape)}; it must be {layout}")
    for name, x in (("k", k), ("v", v)):
        if x.dtype != q.dtype:
            raise TypeError(f"{function}: {name} has dtype {x.dtype} but q has {q.dtype}; they must be the same")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"{function}: k has shape {tuple(k.shape)} but q has {tuple(q.shape)}; their headdim "
                         f"(last dimension) must match")
    if v.shape[:-1] != k.shape[:-1]:
        raise ValueError(f"{function}: v has shape {tuple(v.shape)} but k has {tuple(k.shape)}; they must agree "
                         f"in every dimension but the last")
    if q.shape[-1] == 0 or v.shape[-1] == 0:
        raise ValueError(f"{function}: q has shape {tuple(q.shape)} and v {tuple(v.shape)}; headdim and headdim_v "
                         f"must be at least 1")
    nheads, nheads_k = q.shape[-2], k.shape[-2]
    if nheads_k == 0 or nheads % nheads_k != 0:
        raise ValueError(f"{function}: q has {nheads} heads and k has {nheads_k}; nheads must be a multiple of "
                         f"nheads_k (grouped-query attention)")
    return [_contiguous_last(x) for x in (q, k, v)]


def _options(function, q, nheads, batch, seqlen_k, dropout_p, softmax_scale, causal, window_size, softcap,
             alibi_slopes, sinks):
    """The bridge's options dict (FlashAttention's arguments in attn's terms) and sinks in the mask dtype.
    seqlen_k: the keys' length (max_seqlen_k for varlen): a window bound at or past it is unbounded, as
    FlashAttention's mha_fwd and mha_varlen_fwd make it."""
    wide = torch.float32 if q.dtype in _SIXTEEN_BITS else q.dtype
    left, right = window_bounds(function, causal, window_size, seqlen_k)
    dropout_p = _number(dropout_p, "dropout_p", function)
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"{function}: dropout_p is {dropout_p}; it must lie in [0, 1)")
    if softmax_scale is not None:
        softmax_scale = _number(softmax_scale, "softmax_scale", function)
        if not math.isfinite(softmax_scale):
            raise ValueError(f"{function}: softmax_scale is {softmax_scale}; it must be finite")
    softcap = _number(softcap, "softcap", function)
    if softcap < 0 or not math.isfinite(softcap):
        raise ValueError(f"{function}: softcap is {softcap}; it must be 0.0 (off) or positive and finite")
    options = {
        "function": function,  # the name the kernel's messages start with
        "causal": "bottom_right" if causal else "none",
        "align": "bottom_right",
        "window": None if left < 0 and right < 0 else (left, right),
        "scale": softmax_scale,
        "softcap": softcap if softcap > 0 else None,
        "dropout_p": dropout_p,
        "seed": _dropout_seed(dropout_p),
    }
    if alibi_slopes is not None:
        _tensor(alibi_slopes, "alibi_slopes", function)
        if not alibi_slopes.dtype.is_floating_point:
            raise TypeError(f"{function}: alibi_slopes has dtype {alibi_slopes.dtype}; it must be floating (float32)")
        if alibi_slopes.requires_grad and torch.is_grad_enabled():
            raise ValueError(f"{function}: alibi_slopes requires grad, but attn computes no gradient for it; pass "
                             f"alibi_slopes.detach()")
        if tuple(alibi_slopes.shape) not in ((nheads,), (batch, nheads)):
            raise ValueError(f"{function}: alibi_slopes has shape {tuple(alibi_slopes.shape)}; it must be (nheads,) = "
                             f"({nheads},) or (batch_size, nheads) = ({batch}, {nheads})")
        options["alibi_slopes"] = _contiguous_last(alibi_slopes.detach().to(wide))
    if sinks is not None:
        _tensor(sinks, "sinks", function)
        if not sinks.dtype.is_floating_point:
            raise TypeError(f"{function}: sinks has dtype {sinks.dtype}; it must be floating")
        if tuple(sinks.shape) != (nheads,):
            raise ValueError(f"{function}: sinks has shape {tuple(sinks.shape)}; it must be (nheads,) = ({nheads},)")
        if not bool(torch.isfinite(sinks.detach()).all()):
            raise ValueError(f"{function}: sinks has a value that is not finite; each sink is a logit (finite)")
        sinks = sinks.to(wide)
    return options, sinks


def _fa_lse(lse):
    """softmax_lse as FlashAttention returns it: +inf (not attn's -inf) for a row with no key."""
    return torch.where(lse == float("-inf"), torch.full_like(lse, float("inf")), lse)


# ---- the varlen autograd function (flash_attn_func runs attn.torch's, tokens first) -----------------

class _FlashAttnVarlen(torch.autograd.Function):
    """Packed q (total_q, H, d), k, v (total_k, Hk, *): attn::varlen_forward / varlen_backward."""
    @staticmethod
    def forward(ctx, q, k, v, sinks, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, options):
        wide = torch.float32 if q.dtype in _SIXTEEN_BITS else q.dtype
        out = torch.empty((q.shape[0], q.shape[1], v.shape[-1]), dtype=q.dtype)
        lse = torch.empty((q.shape[1], q.shape[0]), dtype=wide)
        options = dict(options, sinks=None if sinks is None else _contiguous_last(sinks.detach()))
        _bridge.varlen_forward(out, lse, None, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, options)
        _save(ctx, (q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k), options)
        ctx.sizes = (max_seqlen_q, max_seqlen_k)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    @_first_order
    def backward(ctx, grad_out, grad_lse):
        (q, k, v, out, lse, cu_q, cu_k), options = _saved(ctx)
        wanted = ctx.needs_input_grad
        grads = [torch.empty(x.shape, dtype=x.dtype) if want else None for x, want in zip((q, k, v), wanted)]
        sinks = options["sinks"]
        grad_sinks = torch.empty(sinks.shape, dtype=sinks.dtype) if wanted[3] else None
        if any(g is not None for g in grads) or grad_sinks is not None:
            _bridge.varlen_backward(*grads, _contiguous_last(grad_out.to(out.dtype)), q, k, v, out, lse, cu_q, cu_k,
                                    *ctx.sizes, options, grad_sinks=grad_sinks)
        return (*grads, grad_sinks, None, None, None, None, None)


# ---- S_dmask (return_attn_probs) -------------------------------------------------------------------

def _probs(q, k, v, cu_q, cu_k, max_q, max_k, options, sinks):
    """(B, H, max_q, max_k) weights before dropout from attn's varlen forward in float32 (float64 for
    float64 q), each sequence in its corner."""
    wide = torch.float32 if q.dtype in _SIXTEEN_BITS else q.dtype
    q, k, v = (x.detach().to(wide) for x in (q, k, v))
    out = torch.empty((q.shape[0], q.shape[1], v.shape[-1]), dtype=wide)
    shape = (cu_q.shape[0] - 1, q.shape[1], max_q, max_k)
    need = math.prod(shape) * torch.finfo(wide).bits // 8
    if need > _attn.memory_limit():  # named here, before torch tries to allocate it
        raise MemoryError(f"flash_attn_varlen_func: return_attn_probs forms S_dmask (batch, nheads, max_seqlen_q, "
                          f"max_seqlen_k) = {shape}, {need} bytes, more than attn may use ({_attn.memory_limit()} "
                          f"bytes: attn.memory_limit())")
    weights = torch.empty(shape, dtype=wide)
    options = dict(options, dropout_p=0.0, sinks=None if sinks is None else _contiguous_last(sinks.detach()))
    _bridge.varlen_forward(out, None, weights, q, k, v, cu_q, cu_k, max_q, max_k, options)
    return weights


def _signed(weights, options, starts):
    """FlashAttention's encoding of dropout in S_dmask: the dropped weights negated. starts: None for
    the dense (B, H, n, m) pattern, else each sequence's (row_start, key_start, n, m)."""
    p = options["dropout_p"]
    if p == 0:
        return weights
    if starts is None:
        keep = torch.empty(weights.shape, dtype=torch.bool)
        _bridge.dropout_keep(keep, p, options["seed"])
        return torch.where(keep, weights, -weights)
    for b, (row, key, n, m) in enumerate(starts):
        if n == 0 or m == 0:
            continue
        keep = torch.empty((1, weights.shape[1], n, m), dtype=torch.bool)
        _bridge.dropout_keep(keep, p, options["seed"], row, key)
        corner = weights[b, :, :n, :m]
        weights[b, :, :n, :m] = torch.where(keep[0], corner, -corner)
    return weights


# ---- the functions ------------------------------------------------------------------------------

def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False, *, sinks=None):
    """FlashAttention-2's flash_attn_func on CPU tensors, computed by attn (conventions: the module's
    docstring).

    q (batch, seqlen_q, nheads, headdim), k (batch, seqlen_k, nheads_k, headdim), v (batch, seqlen_k,
    nheads_k, headdim_v). Causal, window and ALiBi aligned bottom-right. Returns out (batch, seqlen_q,
    nheads, headdim_v); with return_attn_probs, (out, softmax_lse (batch, nheads, seqlen_q),
    S_dmask (batch, nheads, seqlen_q, seqlen_k)).
    """
    function = "flash_attn_func"
    layout = "(batch_size, seqlen, nheads, headdim)"
    q, k, v = _qkv(function, q, k, v, 4, layout)
    if k.shape[0] != q.shape[0]:
        raise ValueError(f"{function}: k has shape {tuple(k.shape)} but q has {tuple(q.shape)}; their batch_size "
                         f"must match")
    batch, seqlen_q, nheads, _ = q.shape
    options, sinks = _options(function, q, nheads, batch, k.shape[1], dropout_p, softmax_scale, causal, window_size,
                              softcap, alibi_slopes, sinks)
    out, lse = _ScaledDotProductAttention.apply(q, k, v, sinks, dict(options, tokens_first=True))
    if not return_attn_probs:
        return out
    seqlen_k = k.shape[1]
    cu_q = torch.arange(batch + 1, dtype=torch.int32) * seqlen_q
    cu_k = torch.arange(batch + 1, dtype=torch.int32) * seqlen_k
    weights = _probs(q.reshape(batch * seqlen_q, nheads, q.shape[3]), k.reshape(batch * seqlen_k, k.shape[2], k.shape[3]),
                     v.reshape(batch * seqlen_k, v.shape[2], v.shape[3]), cu_q, cu_k, seqlen_q, seqlen_k, options, sinks)
    return out, _fa_lse(lse), _signed(weights, options, None).to(q.dtype)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None, *, sinks=None):
    """FlashAttention-2's flash_attn_varlen_func on CPU tensors, computed by attn (conventions: the
    module's docstring).

    q (total_q, nheads, headdim), k (total_k, nheads_k, headdim), v (total_k, nheads_k, headdim_v);
    cu_seqlens_q, cu_seqlens_k (batch_size + 1,) int32: 0, then the cumulative lengths, ending at
    total_q (total_k); max_seqlen_q, max_seqlen_k: ints at least every sequence's length. Each
    sequence's causal mask, window and ALiBi aligned bottom-right with its own lengths; ALiBi slopes
    (nheads,) or (batch_size, nheads). Returns out (total_q, nheads, headdim_v); with
    return_attn_probs, (out, softmax_lse (nheads, total_q), S_dmask (batch_size, nheads, max_seqlen_q,
    max_seqlen_k)).
    block_table: paged k and v (num_blocks, page_block_size, nheads_k, headdim), inference only.
    """
    function = "flash_attn_varlen_func"
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        _tensor(cu, name, function)
        if cu.dtype != torch.int32:
            raise TypeError(f"{function}: {name} has dtype {cu.dtype}; it must be torch.int32")
        if cu.dim() != 1:
            raise ValueError(f"{function}: {name} has shape {tuple(cu.shape)}; it must be (batch_size + 1,)")
    sizes = []
    for name, size in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        try:
            if isinstance(size, bool):
                raise TypeError
            sizes.append(operator.index(size))
        except TypeError:
            raise TypeError(f"{function}: {name} must be an int; got {type(size).__name__}") from None
        if not 0 <= sizes[-1] <= _MAX_SEQLEN:
            raise ValueError(f"{function}: {name} is {sizes[-1]}; it must lie in [0, 2^48]")
    max_seqlen_q, max_seqlen_k = sizes
    batch = cu_seqlens_q.shape[0] - 1
    if block_table is not None:
        return _paged(function, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                      softmax_scale, causal, window_size, softcap, alibi_slopes, return_attn_probs, block_table, sinks)
    q, k, v = _qkv(function, q, k, v, 3, "(total, nheads, headdim)")
    options, sinks = _options(function, q, q.shape[1], batch, max_seqlen_k, dropout_p, softmax_scale, causal,
                              window_size, softcap, alibi_slopes, sinks)
    out, lse = _FlashAttnVarlen.apply(q, k, v, sinks, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, options)
    if not return_attn_probs:
        return out
    weights = _probs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, options, sinks)
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    starts = [(cq[b], ck[b], cq[b + 1] - cq[b], ck[b + 1] - ck[b]) for b in range(batch)]
    return out, _fa_lse(lse), _signed(weights, options, starts).to(q.dtype)


def _paged(function, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
           causal, window_size, softcap, alibi_slopes, return_attn_probs, block_table, sinks):
    """block_table: attn's paged varlen forward (inference only), through
    paged_varlen_forward(out (total_q, nheads, headdim), softmax_lse (nheads, total_q), q, k_cache,
    v_cache (num_blocks, page_block_size, nheads_k, headdim), cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
    max_seqlen_k, block_table (batch_size, max_blocks) int32, options)."""
    forward = _bridge.paged_varlen_forward
    _tensor(block_table, "block_table", function)
    if block_table.dtype != torch.int32:
        raise TypeError(f"{function}: block_table has dtype {block_table.dtype}; it must be torch.int32")
    if torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in (q, k, v, sinks)):
        raise ValueError(f"{function}: block_table (paged k/v) is inference only, as in FlashAttention: no "
                         f"gradient; call it under torch.no_grad() or with tensors that do not require grad")
    if return_attn_probs:
        raise ValueError(f"{function}: return_attn_probs is not available with block_table")
    for name, x in (("q", q), ("k", k), ("v", v)):
        _tensor(x, name, function)
        if x.dtype not in _SIXTEEN_BITS + (torch.float32,) or x.dtype != q.dtype:
            raise TypeError(f"{function}: {name} has dtype {x.dtype}; with block_table q, k and v must share one "
                            f"of float32, bfloat16, float16 (FlashAttention's)")
    q, k, v = (_contiguous_last(x) for x in (q, k, v))
    # As the call without block_table checks them in C++ (varlen.hpp): the window's bounds are read
    # against max_seqlen_k, so one below a sequence's length would change the answer.
    for name, size, cu, what in (("max_seqlen_q", max_seqlen_q, cu_seqlens_q, "queries"),
                                 ("max_seqlen_k", max_seqlen_k, cu_seqlens_k, "keys")):
        lengths = (cu[1:] - cu[:-1]).tolist() if cu.numel() > 1 else []
        for b, length in enumerate(lengths):
            if length > size:
                raise ValueError(f"{function}: {name} is {size} but sequence {b} has {length} {what}; it must be at "
                                 f"least the longest sequence")
    options, sinks = _options(function, q, q.shape[1], cu_seqlens_q.shape[0] - 1, max_seqlen_k, dropout_p,
                              softmax_scale, causal, window_size, softcap, alibi_slopes, sinks)
    options["sinks"] = None if sinks is None else _contiguous_last(sinks.detach())
    wide = torch.float32 if q.dtype in _SIXTEEN_BITS else q.dtype
    out = torch.empty((q.shape[0], q.shape[1], v.shape[-1]), dtype=q.dtype)
    lse = torch.empty((q.shape[1], q.shape[0]), dtype=wide)
    forward(out, lse, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, _contiguous_last(block_table),
            options)
    return out
