"""flash_attn_with_kvcache on CPU torch tensors: FlashAttention 2.6's function (signature, defaults,
layouts, in-place cache update and return values), computed by attn::flash_attn_with_kvcache
(include/attn/flash.hpp), plus attention sinks as a keyword.

    from attn.flash import flash_attn_with_kvcache
    out = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lens, causal=True)

q (batch, seqlen_q, nheads, headdim); k_cache, v_cache (batch_cache, seqlen_cache, nheads_k, headdim),
or paged (num_blocks, page_block_size, nheads_k, headdim) with block_table (batch, max_blocks) int32
(any page size). k, v (batch, seqlen_new, nheads_k, headdim): written into the caches in place at
positions cache_seqlens[b] .. (rotated first when rotary_cos/rotary_sin are given), then q attends to
each sequence's keys [cache_leftpad[b], cache_seqlens[b] + seqlen_new). The queries are the last
seqlen_q tokens (bottom-right) for causal, window_size and ALiBi, causal or not. Rotary: the new key t
at table row cache_seqlens[b] + t; query i at row cache_seqlens[b] + i when causal or local, else at
row cache_seqlens[b]; interleaved (GPT-J) or halves (GPT-NeoX). Returns out (batch, seqlen_q,
nheads, headdim), and softmax_lse (batch, nheads, seqlen_q) float32 when return_softmax_lse (+inf for
a row with no key, as FlashAttention's kernels write it). Forward only (no autograd), as
FlashAttention.

dtypes: q, the caches, k, v and the rotary tables of one dtype (float32, bfloat16 or float16);
cache_seqlens, cache_batch_idx, cache_leftpad and block_table int32 (cache_seqlens may be an int);
alibi_slopes float32 (nheads,) or (batch, nheads); sinks (nheads,) floating. A tensor off the CPU or
of a wrong dtype raises RuntimeError (as FlashAttention's checks); a wrong shape or value ValueError,
naming the argument; a call that raises has written nothing into the caches. num_splits is accepted
and ignored (attn splits the keys across threads itself). A paged cache takes neither
cache_batch_idx nor cache_leftpad (as FlashAttention).
"""

import torch

from . import _attn
from ._flash_args import window_bounds

_bridge = _attn._torch
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_FUNCTION = "flash_attn_with_kvcache"


def _cpu_tensor(x, name):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{_FUNCTION}: {name} must be a torch.Tensor; got {type(x).__name__}")
    if x.device.type != "cpu":
        raise RuntimeError(f"{_FUNCTION}: {name} is on device {x.device}; attn computes on the CPU (move it with .cpu())")
    return x


def _int32(x, name):
    if x is None:
        return None
    _cpu_tensor(x, name)
    if x.dtype != torch.int32:
        raise RuntimeError(f"{_FUNCTION}: {name} has dtype {x.dtype}; it must be torch.int32")
    return x


def _maybe_contiguous(x):
    return x.contiguous() if x is not None and x.dim() > 0 and x.shape[-1] > 1 and x.stride(-1) != 1 else x


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None, cache_seqlens=None,
                            cache_batch_idx=None, cache_leftpad=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0, rotary_interleaved=True,
                            alibi_slopes=None, num_splits=0, return_softmax_lse=False, *, sinks=None):
    """FlashAttention's flash_attn_with_kvcache on CPU tensors (see the module's docstring)."""
    _cpu_tensor(q, "q")
    if q.dtype not in _DTYPES:
        raise RuntimeError(f"{_FUNCTION}: q has dtype {q.dtype}; attn computes in float32, bfloat16 or float16")
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v), ("rotary_cos", rotary_cos),
                    ("rotary_sin", rotary_sin)):
        if x is None and name in ("k_cache", "v_cache"):
            raise TypeError(f"{_FUNCTION}: {name} must be a torch.Tensor; got None")
        if x is None:
            continue
        _cpu_tensor(x, name)
        if x.dtype != q.dtype:
            raise RuntimeError(f"{_FUNCTION}: {name} has dtype {x.dtype} but q has {q.dtype}; they must be the same")
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):
        if x.dim() > 0 and x.shape[-1] > 1 and x.stride(-1) != 1:
            raise RuntimeError(f"{_FUNCTION}: {name} must have contiguous last dimension (it is updated in place)")
    if q.dim() != 4:
        raise ValueError(f"{_FUNCTION}: q has shape {tuple(q.shape)}; it must be (batch_size, seqlen_q, nheads, headdim)")
    batch, seqlen_q, nheads, _ = q.shape
    q, k, v = (_maybe_contiguous(x) for x in (q, k, v))
    rotary_cos, rotary_sin = _maybe_contiguous(rotary_cos), _maybe_contiguous(rotary_sin)
    if isinstance(cache_seqlens, bool):
        raise TypeError(f"{_FUNCTION}: cache_seqlens must be an int or an int32 tensor; got a bool")
    if isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((batch,), cache_seqlens, dtype=torch.int32)
    cache_seqlens, cache_batch_idx = _int32(cache_seqlens, "cache_seqlens"), _int32(cache_batch_idx, "cache_batch_idx")
    cache_leftpad, block_table = _int32(cache_leftpad, "cache_leftpad"), _int32(block_table, "block_table")
    if isinstance(num_splits, bool) or not isinstance(num_splits, int):
        raise TypeError(f"{_FUNCTION}: num_splits must be an int; got {num_splits!r}")
    # The window as FlashAttention normalises it against the cache's capacity (causal: nothing on the
    # right, which also decides where the queries are rotated).
    seqlen_k = k_cache.shape[1] * (block_table.shape[1] if block_table is not None and block_table.dim() == 2 else 1)
    left, right = window_bounds(_FUNCTION, causal, window_size, seqlen_k)
    softcap = float(softcap)
    options = {
        "causal": "bottom_right" if causal else "none",
        "window": None if left < 0 and right < 0 else (left, right),
        "scale": None if softmax_scale is None else float(softmax_scale),
        "softcap": softcap if softcap != 0 else None,
    }
    if softcap < 0:
        raise ValueError(f"{_FUNCTION}: softcap is {softcap}; it must be 0.0 (off) or positive and finite")
    if alibi_slopes is not None:
        _cpu_tensor(alibi_slopes, "alibi_slopes")
        if alibi_slopes.dtype != torch.float32:
            raise RuntimeError(f"{_FUNCTION}: alibi_slopes has dtype {alibi_slopes.dtype}; it must be torch.float32")
        options["alibi_slopes"] = _maybe_contiguous(alibi_slopes.detach())
    if sinks is not None:
        _cpu_tensor(sinks, "sinks")
        if not sinks.dtype.is_floating_point:
            raise RuntimeError(f"{_FUNCTION}: sinks has dtype {sinks.dtype}; it must be floating")
        options["sinks"] = sinks.detach().to(torch.float32).contiguous()
    out = torch.empty(q.shape, dtype=q.dtype)
    lse = torch.empty((batch, nheads, seqlen_q), dtype=torch.float32) if return_softmax_lse else None
    _bridge.flash_attn_with_kvcache(out, lse, q.detach(), k_cache.detach(), v_cache.detach(),
                                    None if k is None else k.detach(), None if v is None else v.detach(),
                                    rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                                    bool(rotary_interleaved), options)
    if not return_softmax_lse:
        return out
    return out, torch.where(lse == float("-inf"), torch.full_like(lse, float("inf")), lse)
