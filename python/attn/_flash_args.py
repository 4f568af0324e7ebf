"""Arguments that attn.flash's functions share, normalised as FlashAttention's C++ does."""


def window_bounds(function, causal, window_size, seqlen_k):
    """(left, right) of window_size, -1 for unbounded: a bound at or past seqlen_k (the keys' length,
    max_seqlen_k for varlen, the cache's capacity for a KV cache) is no bound, and causal is a window
    with nothing on the right, as FlashAttention's mha_fwd, mha_varlen_fwd and mha_fwd_kvcache make them."""
    if not isinstance(causal, bool):
        raise TypeError(f"{function}: causal must be a bool; got {causal!r}")
    try:
        left, right = (int(w) for w in window_size)
    except (TypeError, ValueError):
        raise TypeError(f"{function}: window_size must be a pair of ints (left, right), -1 for unbounded; "
                        f"got {window_size!r}") from None
    left = left if 0 <= left < seqlen_k else -1
    right = right if 0 <= right < seqlen_k else -1
    return left, 0 if causal else right
