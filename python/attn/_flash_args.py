"""Arguments that attn.flash's functions share, normalised as FlashAttention's C++ does."""
import operator

import numpy


def window_bounds(function, causal, window_size, seqlen_k):
    """(left, right) of window_size, -1 for unbounded: a bound at or past seqlen_k (the keys' length,
    max_seqlen_k for varlen, the cache's capacity for a KV cache) is no bound, and causal is a window
    with nothing on the right, as FlashAttention's mha_fwd, mha_varlen_fwd and mha_fwd_kvcache make them."""
    if not isinstance(causal, (bool, numpy.bool_)):  # FlashAttention's bool argument takes NumPy's bool too
        raise TypeError(f"{function}: causal must be a bool; got {causal!r} of type {type(causal).__name__}")
    try:
        left, right = window_size
        left, right = operator.index(left), operator.index(right)  # a float is refused, not truncated
    except (TypeError, ValueError):
        raise TypeError(f"{function}: window_size must be a pair of ints (left, right), -1 for unbounded; "
                        f"got {window_size!r}") from None
    for side, w in (("left", left), ("right", right)):
        if not -2**63 <= w < 2**63:
            raise ValueError(f"{function}: window_size's {side} is {w}; it must fit in a signed 64-bit integer")
    left = left if 0 <= left < seqlen_k else -1
    right = right if 0 <= right < seqlen_k else -1
    return left, 0 if causal else right
