"""attn.distributed: exact attention over sequences split across MPI ranks (mpi4py communicators).

    from mpi4py import MPI
    import attn.distributed
    out = attn.distributed.scaled_dot_product_attention(q, k, v, comm=MPI.COMM_WORLD, causal=True,
                                                        layout="zigzag")
    dq, dk, dv = attn.distributed.backward(dout, q, k, v, out, lse, comm=MPI.COMM_WORLD, causal=True,
                                           layout="zigzag")   # lse from return_lse=True

Each rank passes its shard of the queries (B, [H,] n_r, d), keys (B, [Hk,] m_r, d) and values
(B, [Hk,] m_r, dv) and gets the rows of out (and lse) of its own queries: the single-process result
over the whole sequences. shard(x, comm=..., layout=...) cuts a whole array into this rank's shard.

layout: "contiguous": rank r holds rows [floor(r L / P), floor((r + 1) L / P)) of a sequence of
length L (n and m need not divide by P); "zigzag": the sequence is cut into 2P chunks
[floor(c L / 2P), floor((c + 1) L / 2P)) and rank r holds chunk r then chunk 2P - 1 - r, which
balances a causal mask's work. algorithm: "ring" (key/value blocks travel around the ranks, merged
through their log-sum-exp; any number of heads) or "ulysses" (an all-to-all on heads; needs
Hk >= P for every rank to work).

Masks and options: causal (True or "top_left" as PyTorch's is_causal, or "bottom_right"), valid_lens
(B,) (key lengths of the whole sequence, the same on every rank) or (B, n_r) (per query: this rank's
rows of the whole (B, n), e.g. shard(lens, comm=comm, axis=1)), window (left, right), alibi_slopes
(H,) or (B, H), softcap, scale, and dropout_p with its seed (the weights dropped are those one
process drops with that seed: the random numbers follow the whole sequence's positions). float32 and float64 (other dtypes are converted to float32). Bad
arguments on any rank raise the same ValueError (TypeError for a wrong type) on every rank (never a
hang; comm itself must be a communicator on every rank); an error one rank meets
later in the call (its memory limit reached) raises on every rank once the call's exchanges are
done, MemoryError where that rank ran out of memory.

Each call runs with attn's SIMD target (attn.simd_target()) and the memory limit of
attn.set_memory_limit (or else ATTN_MAX_BYTES, or the machine's memory, as in attn), counted apart
from attn.memory_in_use(): the MPI part is a compiled library of its own.

Needs mpi4py (Debian's python3-mpi4py) and attn built with MPI (libopenmpi-dev).
"""
import numpy as np

from . import _attn, _distributed

__all__ = ["scaled_dot_product_attention", "backward", "shard", "shard_rows"]

_LAYOUTS = ("contiguous", "zigzag")
_ALGORITHMS = ("ring", "ulysses")


def _handle(comm):
    if comm is None or not hasattr(comm, "py2f"):
        raise TypeError(f"comm must be an mpi4py communicator (e.g. MPI.COMM_WORLD); got {type(comm).__name__}")
    return comm.py2f()


def _agreed(comm, prepare):
    """prepare() (this rank's arguments read and converted), then one allgather of what it raised, if
    anything: an argument refused here on one rank raises on every rank, as the compiled part's own
    checks do, instead of leaving the others waiting in the call's collectives (found by probing: the
    other rank hung, or its call was matched with this rank's next one)."""
    try:
        prepared, mine = prepare(), None
    except Exception as e:  # OverflowError too (a window of inf, a scale of 10**400): every kind must reach the others
        prepared, mine = None, (type(e).__name__, str(e))
    everyone = comm.allgather(mine)
    for rank, failed in enumerate(everyone):
        if failed is not None:
            kind = {"TypeError": TypeError, "MemoryError": MemoryError}.get(failed[0], ValueError)
            raise kind(f"{failed[1]} (on rank {rank} of {len(everyone)})")
    return prepared


def _settings(function, causal, layout, algorithm, valid_lens, window, scale, softcap, dropout_p, seed, align=None):
    if layout not in _LAYOUTS:
        raise ValueError(f"{function}: layout is {layout!r}; it must be one of {_LAYOUTS}")
    if algorithm not in _ALGORITHMS:
        raise ValueError(f"{function}: algorithm is {algorithm!r}; it must be one of {_ALGORITHMS}")
    s = _distributed.Settings()
    causal = bool(causal) if isinstance(causal, np.bool_) else causal  # NumPy's bool, as Python's
    if causal is True or causal == "top_left":
        s.causal = "top_left"
    elif causal == "bottom_right":
        s.causal = "bottom_right"
    elif causal is False or causal is None:
        s.causal = ""
    else:
        raise ValueError(f"{function}: causal is {causal!r} of type {type(causal).__name__}; it must be True, False, "
                         f"'top_left' or 'bottom_right'")
    if align not in (None, "top_left", "bottom_right"):
        raise ValueError(f"{function}: align is {align!r}; it must be None, 'top_left' or 'bottom_right'")
    if align is not None:
        s.align = align
        if causal is True:
            s.causal = align
    s.layout, s.algorithm = layout, algorithm
    if valid_lens is not None:
        lens = np.asarray(valid_lens)
        if lens.dtype.kind not in "iu":  # as one process's attn (a float 2.9 was read as 2, True as 1)
            raise TypeError(f"{function}: valid_lens has dtype {lens.dtype}; valid lengths are integers")
        s.valid_lens = np.ascontiguousarray(lens, dtype=np.int64)
    if window is not None:
        if len(window) != 2:
            raise ValueError(f"{function}: window is {window!r}; it must be a pair (left, right)")
        bounds = []
        for i, bound in enumerate(window):  # integers, as one process's attn takes them (2.5 was cut to 2)
            if bound is not None and (isinstance(bound, bool) or not hasattr(bound, "__index__")):
                raise TypeError(f"{function}: window[{i}] must be an integer or None; got {bound!r}")
            bounds.append(-1 if bound is None else int(bound))
        s.window = tuple(bounds)
    s.scale = None if scale is None else float(scale)
    s.softcap = None if softcap is None else float(softcap)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"{function}: seed is {seed!r}; it must be an integer")
    if not 0 <= int(seed) < 2**64:
        raise ValueError(f"{function}: seed is {seed}; it must lie in [0, 2**64)")
    s.dropout, s.seed = float(dropout_p), int(seed)
    # attn's settings, which the compiled part (a library of its own) takes for the call
    s.simd_target, s.memory_limit = _attn.simd_target(), _attn.memory_limit_set()
    return s


def _dtype_of(*arrays):
    return np.float64 if all(np.asarray(a).dtype == np.float64 for a in arrays) else np.float32


def _arrays(dtype, *arrays):
    return [np.ascontiguousarray(a, dtype=dtype) for a in arrays]


def _optional(array, dtype):
    return None if array is None else np.ascontiguousarray(array, dtype=dtype)


def scaled_dot_product_attention(queries, keys, values, *, comm, causal=False, layout="contiguous", algorithm="ring",
                                 valid_lens=None, window=None, scale=None, alibi_slopes=None, softcap=None,
                                 dropout_p=0.0, seed=0, return_lse=False, align=None, sinks=None):
    """This rank's rows of softmax(Q K^T scale + masks) V over the whole sequences; (out, lse) with
    return_lse=True (lse: (B, [H,] n_r), what backward needs). align places the whole sequences'
    queries (as attn.scaled_dot_product_attention); sinks (H,) are attention sinks, the same on every
    rank. Collective over comm."""
    handle = _handle(comm)

    def prepare():
        s = _settings("scaled_dot_product_attention", causal, layout, algorithm, valid_lens, window, scale, softcap,
                      dropout_p, seed, align)
        dtype = _dtype_of(queries, keys, values)
        return (s, dtype, *_arrays(dtype, queries, keys, values), _optional(alibi_slopes, dtype),
                _optional(sinks, dtype))

    s, dtype, q, k, v, slopes, sink_logits = _agreed(comm, prepare)
    name = "float64" if dtype == np.float64 else "float32"
    out, lse = getattr(_distributed, "forward_" + name)(handle, q, k, v, slopes, sink_logits, s)
    return (out, lse) if return_lse else out


def backward(grad_out, queries, keys, values, out, lse, *, comm, causal=False, layout="contiguous", algorithm="ring",
             valid_lens=None, window=None, scale=None, alibi_slopes=None, softcap=None, dropout_p=0.0, seed=0,
             align=None, sinks=None):
    """(dqueries, dkeys, dvalues) of this rank's shards, given the forward's inputs, out and lse and the
    same options; with sinks, (dqueries, dkeys, dvalues, dsinks), dsinks the gradient of the sinks over
    the whole sequences (the same on every rank). Collective over comm."""
    handle = _handle(comm)

    def prepare():
        s = _settings("backward", causal, layout, algorithm, valid_lens, window, scale, softcap, dropout_p, seed,
                      align)
        dtype = _dtype_of(grad_out, queries, keys, values, out, lse)
        return (s, dtype, *_arrays(dtype, grad_out, queries, keys, values, out, lse), _optional(alibi_slopes, dtype),
                _optional(sinks, dtype))

    s, dtype, g, q, k, v, o, l, slopes, sink_logits = _agreed(comm, prepare)
    name = "float64" if dtype == np.float64 else "float32"
    return getattr(_distributed, "backward_" + name)(handle, g, q, k, v, o, l, slopes, sink_logits, s)


def shard_rows(length, ranks, rank, layout="contiguous"):
    """The rows [(begin, end), ...] of a sequence of `length` that rank `rank` of `ranks` holds."""
    if layout not in _LAYOUTS:
        raise ValueError(f"shard_rows: layout is {layout!r}; it must be one of {_LAYOUTS}")
    return _distributed.shard_rows(length, ranks, rank, layout)


def shard(x, *, comm, layout="contiguous", axis=-2):
    """This rank's shard of a whole array along its sequence axis (default: the second to last)."""
    x = np.asarray(x)
    rows = shard_rows(x.shape[axis], comm.Get_size(), comm.Get_rank(), layout)
    return np.concatenate([np.take(x, np.arange(b, e), axis=axis) for b, e in rows], axis=axis)
