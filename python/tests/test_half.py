"""16-bit attention from Python: float16 arrays, compute_dtype='bfloat16', and attn.KVCache in every
storage type, against NumPy float64 written from the formula on the values as rounded or stored."""
import numpy as np
import pytest

import attn


def reference(q, k, v, *, causal=None, mask=None):
    """softmax(q k^T / sqrt(d) + mask) v in float64, grouped heads repeated; causal 'bottom_right'."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    group = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, group, axis=-3), np.repeat(v, group, axis=-3)
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    n, m = s.shape[-2:]
    if causal == "bottom_right":
        s = np.where(np.arange(m)[None, :] <= np.arange(n)[:, None] + m - n, s, -np.inf)
    if mask is not None:
        s = s + mask
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    return w @ v


def bf16(x):
    """float32 values rounded to bfloat16 (nearest even), as float32."""
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16 << 16
    return b.astype(np.uint32).view(np.float32)


def test_float16_arrays_compute_in_float16_within_the_rule(rng):
    q, k, v = (rng.standard_normal(s).astype(np.float16) for s in [(2, 4, 33, 16), (2, 2, 47, 16), (2, 2, 47, 8)])
    mask = rng.uniform(-1, 0, (33, 47)).astype(np.float16)
    out, lse = attn.scaled_dot_product_attention(q, k, v, mask=mask, causal="bottom_right", return_lse=True)
    assert out.dtype == np.float16 and lse.dtype == np.float32 and out.shape == (2, 4, 33, 8)
    exact = reference(q, k, v, causal="bottom_right", mask=mask.astype(np.float64))
    # float32 on the same float16 values, rounded to float16: the error the rule allows twice of.
    low = reference(q, k, v, causal="bottom_right", mask=mask.astype(np.float64)).astype(np.float32).astype(np.float16)
    assert np.abs(out - exact).max() <= 2 * np.abs(low - exact).max() + 1e-6


def test_compute_dtype_bfloat16_rounds_once_and_returns_float32(rng):
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in [(3, 40, 32), (3, 50, 32), (3, 50, 16)])
    out = attn.scaled_dot_product_attention(q, k, v, compute_dtype="bfloat16")
    assert out.dtype == np.float32
    exact = reference(bf16(q)[:, None], bf16(k)[:, None], bf16(v)[:, None])[:, 0]
    # The rule as FlashAttention states it: twice the error of float32 on the rounded inputs with P
    # (the unnormalised weights) rounded to bfloat16; out is that float32 result, not rounded itself.
    qb, kb, vb = (bf16(x) for x in (q, k, v))
    s = qb @ kb.transpose(0, 2, 1) / np.float32(np.sqrt(32))
    p = np.exp(s - s.max(-1, keepdims=True))
    low = (bf16(p) @ vb) / p.sum(-1, keepdims=True)
    assert np.abs(out - exact).max() <= 2 * np.abs(low - exact).max() + 1e-6
    assert np.any(bf16(out) != out)
    # Not float32's result: the inputs were rounded.
    assert np.abs(out - attn.scaled_dot_product_attention(q, k, v)).max() > 1e-4


def test_sixteen_bit_bad_input_is_named(rng):
    q = rng.standard_normal((2, 5, 8)).astype(np.float16)
    q32 = q.astype(np.float32)
    with pytest.raises(ValueError, match="return_weights=True needs float32 or float64 computation .the bfloat16 kernel"):
        attn.scaled_dot_product_attention(q32, q32, q32, return_weights=True, compute_dtype="bfloat16")
    with pytest.raises(TypeError, match="compute_dtype='bfloat16' takes float32 arrays; q has dtype float16"):
        attn.scaled_dot_product_attention(q, q, q, compute_dtype="bfloat16")
    with pytest.raises(ValueError, match="compute_dtype is 'int4'"):
        attn.scaled_dot_product_attention(q, q, q, compute_dtype="int4")
    with pytest.raises(TypeError, match="k has dtype float32 but q has float16"):
        attn.scaled_dot_product_attention(q, q.astype(np.float32), q)
    with pytest.raises(TypeError, match="b has dtype float32 but a has float16"):
        attn.bmm(q, q.astype(np.float32), transpose_b=True)
    with pytest.raises(TypeError, match="mask has dtype float64 but X has float16"):
        attn.masked_softmax(q, mask=np.zeros((5, 5)))
    mha = attn.MultiHeadAttention(8, 2, 0.0)
    mha(q, q, q)
    with pytest.raises(TypeError, match="grad_out has dtype float32 but the inputs of the last call have float16"):
        mha.backward(q.astype(np.float32)[..., :8])
    layer = attn.DotProductAttention(0.0)
    layer(q, q, q)
    with pytest.raises(TypeError, match="grad_out has dtype float32 but the inputs of the last call have float16"):
        layer.backward(q.astype(np.float32))


def test_functions_without_a_16_bit_kernel_take_float16(rng):
    # float16 wherever float32 is: computed in float32 on the widened arrays, out rounded to float16.
    def same(got, want):
        assert got.dtype == np.float16
        np.testing.assert_array_equal(got, want.astype(np.float16))

    h = lambda *shape: rng.standard_normal(shape).astype(np.float16)
    w = lambda x: x.astype(np.float32)
    x, lens, mask = h(2, 3, 5), np.array([2, 4]), rng.standard_normal((3, 5)).astype(np.float32)
    same(attn.masked_softmax(x, lens), attn.masked_softmax(w(x), lens))
    same(attn.masked_softmax(x, mask=mask.astype(np.float16)), attn.masked_softmax(w(x), mask=w(mask.astype(np.float16))))
    same(attn.masked_softmax(x, causal=True), attn.masked_softmax(w(x), causal=True))
    a, b = h(2, 3, 4), h(2, 5, 4)
    same(attn.bmm(a, b, transpose_b=True), attn.bmm(w(a), w(b), transpose_b=True))
    x_train, y_train, x_query = h(20), h(20), h(7)
    out, weights = attn.nadaraya_watson(x_train, y_train, x_query, width=0.5, return_weights=True)
    out32, weights32 = attn.nadaraya_watson(w(x_train), w(y_train), w(x_query), width=0.5, return_weights=True)
    same(out, out32), same(weights, weights32)
    widths, error = attn.select_width(x_train, y_train)
    np.testing.assert_array_equal(widths, attn.select_width(w(x_train), w(y_train))[0])
    assert widths.dtype == np.float64 and error > 0
    # The d2l chapter's DotProductAttention (no parameters): out, weights and gradients the same way.
    q, k, v, lens = h(2, 3, 8), h(2, 5, 8), h(2, 5, 4), np.array([2, 5])
    layer, layer32 = attn.DotProductAttention(0.0), attn.DotProductAttention(0.0)
    same(layer(q, k, v, lens), layer32(w(q), w(k), w(v), lens))
    same(layer.attention_weights, layer32.attention_weights)
    grad = h(2, 3, 4)
    grads, grads32 = layer.backward(grad), layer32.backward(w(grad))
    for name in ("queries", "keys", "values"):
        same(grads[name], grads32[name])
    # The layers with parameters: computed in float32 (the parameters' float32 copies), out, weights
    # and every gradient rounded to float16; the parameters themselves unchanged.
    q, k, v, lens, grad = h(2, 3, 6), h(2, 5, 4), h(2, 5, 3), np.array([2, 5]), h(2, 3, 3)
    for dtype in ("float32", "float64"):
        layer = attn.AdditiveAttention(4, 6, 8, 0.2, seed=3, dtype=dtype)
        layer32 = attn.AdditiveAttention(4, 6, 8, 0.2, seed=3, dtype=dtype)
        same(layer(q, k, v, lens), layer32(w(q), w(k), w(v), lens))
        same(layer.attention_weights, layer32.attention_weights)
        grads, grads32 = layer.backward(grad), layer32.backward(w(grad))
        assert set(grads) == set(grads32) == {"queries", "keys", "values", "W_q", "W_k", "w_v"}
        for name in grads:
            same(grads[name], grads32[name])
        assert layer.W_q.dtype == np.dtype(dtype)
    grad = h(2, 3, 8)
    for bias in (False, True):
        mha, mha32 = (attn.MultiHeadAttention(8, 4, 0.1, bias, num_kv_heads=2, seed=4) for _ in range(2))
        same(mha(q, k, v, lens, causal=True), mha32(w(q), w(k), w(v), lens, causal=True))
        grads, grads32 = mha.backward(grad), mha32.backward(w(grad))
        assert set(grads) == set(grads32) and len(grads) == (11 if bias else 7)
        for name in grads:
            same(grads[name], grads32[name])
        assert mha.W_q.dtype == np.float32
    # scaled_dot_product_attention with return_weights: the 16-bit kernel forms no weights, so the
    # call computes in float32; out and weights float16, lse float32, with a mask, ALiBi and dropout.
    q, k, v = h(2, 2, 3, 8), h(2, 2, 5, 8), h(2, 2, 5, 4)
    bias, slopes = h(3, 5), np.array([0.5, 0.25], np.float32)
    kw = dict(mask=bias, alibi_slopes=slopes, dropout_p=0.3, seed=5, return_weights=True, return_lse=True)
    out, weights, lse = attn.scaled_dot_product_attention(q, k, v, **kw)
    out32, weights32, lse32 = attn.scaled_dot_product_attention(w(q), w(k), w(v), **{**kw, "mask": w(bias)})
    same(out, out32), same(weights, weights32)
    assert lse.dtype == np.float32
    np.testing.assert_array_equal(lse, lse32)
    # out within float16's rounding of the 16-bit kernel's out (which forms no weights).
    fused = attn.scaled_dot_product_attention(q, k, v, mask=bias, alibi_slopes=slopes, dropout_p=0.3, seed=5)
    assert np.abs(w(out) - w(fused)).max() <= 2 * np.abs(w(out32.astype(np.float16)) - out32).max() + 1e-3


def stored(x, dtype):
    """What a cache of `dtype` keeps of float32 rows x (..., d), from the definitions."""
    x = np.asarray(x, np.float32)
    if dtype == "bfloat16":
        return bf16(x)
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "int8":
        g = x.reshape(*x.shape[:-1], -1, 32)
        s = (np.abs(g).max(-1, keepdims=True) / np.float32(127)).astype(np.float32)
        with np.errstate(invalid="ignore", divide="ignore"):
            q = np.where(s == 0, 0, np.rint(g / s))
        return (q * s).astype(np.float32).reshape(x.shape)
    return x


def attended(q, dtype):
    """Queries (..., d) as a cache of `dtype` attends with them, from the definitions: over int8 keys
    each row rounded to 16-bit integers times sigma = max|q| / 32767 (as given where max|q| is not
    finite or below 2^-100)."""
    q = np.asarray(q, np.float32)
    if dtype != "int8":
        return q
    top = np.abs(q).max(-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        r = np.rint(q * (np.float32(32767) / top)) * (top / np.float32(32767))
    return np.where(np.isfinite(top) & (top >= np.float32(2.0**-100)), r, q).astype(np.float32)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "int8"])
def test_kv_cache_attends_like_sdpa_over_what_it_stores(rng, dtype):
    cache = attn.KVCache(3, 2, 64, dtype=dtype, block_size=16)
    keys = [[], [], []]
    values = [[], [], []]
    for seq, sizes in enumerate([[5, 16, 1, 30], [16, 4], [1, 20, 3]]):
        for t in sizes:
            k, v = rng.standard_normal((2, 2, t, 64)).astype(np.float32)
            cache.append(k, v, seq=seq)
            keys[seq].append(k), values[seq].append(v)
    for seq in range(3):
        k, v = np.concatenate(keys[seq], 1), np.concatenate(values[seq], 1)
        assert cache.length(seq) == k.shape[1]
        np.testing.assert_array_equal(cache.keys(seq), stored(k, dtype))
        np.testing.assert_array_equal(cache.values(seq), stored(v, dtype))
        for n in (1, 6):
            q = rng.standard_normal((4, n, 64)).astype(np.float32)
            out = cache.attend(q, seq=seq)
            assert out.shape == q.shape and out.dtype == np.float32
            exact = reference(attended(q, dtype), stored(k, dtype), stored(v, dtype), causal="bottom_right")
            np.testing.assert_allclose(out, exact, rtol=0, atol=2e-5)
    # Every sequence at once, one new query each; a float16 query is widened, and its out is float16.
    q = rng.standard_normal((3, 4, 1, 64)).astype(np.float32)
    out = cache.attend(q)
    for seq in range(3):
        np.testing.assert_array_equal(out[seq], cache.attend(q[seq], seq=seq))
    out16 = cache.attend(q.astype(np.float16))
    assert out16.dtype == np.float16 and out16.shape == q.shape
    np.testing.assert_array_equal(out16, cache.attend(q.astype(np.float16).astype(np.float32)).astype(np.float16))


def test_kv_cache_all_sequences_grow_together_and_truncate(rng):
    cache = attn.KVCache(2, 1, 32, dtype="bfloat16", block_size=4)
    k = rng.standard_normal((2, 1, 10, 32)).astype(np.float32)
    cache.append(k, k)
    assert [cache.length(s) for s in range(2)] == [10, 10]
    before = cache.nbytes
    cache.truncate(0, 3)
    cache.append(k[0, :, :7], k[0, :, :7], seq=0)
    assert cache.nbytes == before  # freed blocks reused
    np.testing.assert_array_equal(cache.keys(0)[:, 3:], bf16(k[0, :, :7]))
    cache.reset(1)
    assert cache.length(1) == 0
    assert cache.dtype == "bfloat16" and cache.block_size == 4 and cache.kv_heads == 1 and cache.head_dim == 32


def test_kv_cache_batch_slopes_and_causal_true(rng):
    # alibi_slopes (batch, heads) for every sequence at once: row b for sequence b; causal=True is
    # "bottom_right" (flash_attn_with_kvcache's meaning), not scaled_dot_product_attention's top-left.
    cache = attn.KVCache(3, 2, 32, block_size=8)
    for seq, t in enumerate([5, 12, 20]):
        k = rng.standard_normal((2, t, 32)).astype(np.float32)
        cache.append(k, -k, seq=seq)
    q = rng.standard_normal((3, 4, 2, 32)).astype(np.float32)
    slopes = rng.uniform(0.05, 0.5, (3, 4)).astype(np.float32)
    out = cache.attend(q, alibi_slopes=slopes)
    for seq in range(3):
        np.testing.assert_array_equal(out[seq], cache.attend(q[seq], seq=seq, alibi_slopes=slopes[seq]))
    with pytest.raises(ValueError, match=r"alibi_slopes has shape \(1,4\); it must be \(heads,\) = \(4,\) or \(batch, heads\) = \(3,4\)"):
        cache.attend(q, alibi_slopes=slopes[:1])
    np.testing.assert_array_equal(cache.attend(q[2], seq=2, causal=True), cache.attend(q[2], seq=2, causal="bottom_right"))
    with pytest.raises(ValueError, match="causal is top_left; a cache's queries are the newest tokens"):
        cache.attend(q[2], seq=2, causal="top_left")


def test_kv_cache_bad_input_is_named(rng):
    cache = attn.KVCache(2, 2, 32, capacity=8, grow=False)
    k = np.zeros((2, 5, 32), np.float32)
    with pytest.raises(ValueError, match="seq is 2; the cache holds sequences 0 to 1"):
        cache.append(k, k, seq=2)
    with pytest.raises(TypeError, match="keys has dtype float64; the cache stores and computes in float32 and takes float32 or float16"):
        cache.append(k.astype(np.float64), k, seq=0)
    with pytest.raises(TypeError, match="values has dtype int32; the cache stores and computes in float32 and takes float32 or float16"):
        cache.append(k, k.astype(np.int32), seq=0)
    with pytest.raises(TypeError, match="keys is not an array and NumPy reads it as float64"):
        cache.append(k.tolist(), k, seq=0)
    with pytest.raises(ValueError, match=r"keys has shape \(2,5,31\); it must be \(kv_heads, t, head_dim\)"):
        cache.append(k[..., :31], k, seq=0)
    cache.append(k, k, seq=0)
    with pytest.raises(ValueError, match="5 more do not fit"):
        cache.append(k, k, seq=0)
    with pytest.raises(ValueError, match="dtype is 'int2'"):
        attn.KVCache(1, 1, 32, dtype="int2")
    with pytest.raises(ValueError, match="head_dim is 40; an int4 cache"):
        attn.KVCache(1, 1, 40, dtype="int4")
    with pytest.raises(ValueError, match="head_dim is 48"):
        attn.KVCache(1, 1, 48, dtype="int8")
    with pytest.raises(ValueError, match="3 heads"):
        cache.attend(np.zeros((3, 1, 32), np.float32), seq=0)
    with pytest.raises(ValueError, match=r"length is 9; sequence 0 holds 5 tokens"):
        cache.truncate(0, 9)


def test_float16_call_takes_alibi_slopes_in_float32(rng):
    # attn's 16-bit attention takes its slopes in float32: a float16 call must not round them to
    # float16 (found by probing: slope 0.3 became 0.2998, biasing distant keys).
    m, d = 64, 16
    q, k = np.zeros((1, 1, 1, d), np.float16), np.zeros((1, 1, m, d), np.float16)
    v = np.ones((1, 1, m, d), np.float16)
    slope = np.array([0.3], np.float32)
    _, lse = attn.scaled_dot_product_attention(q, k, v, alibi_slopes=slope, return_lse=True)
    scores = -np.float64(slope[0]) * np.arange(m)  # the query sits at position 0: every key is at distance j
    expected = scores.max() + np.log(np.exp(scores - scores.max()).sum())
    rounded = -np.float64(np.float16(0.3)) * np.arange(m)
    assert abs(lse.ravel()[0] - expected) < 1e-5 < abs(expected - (rounded.max() + np.log(np.exp(rounded).sum())))


def test_kv_cache_sizes_and_all_or_nothing_appends(rng):
    with pytest.raises(ValueError, match="batch is 4611686018427387904"):
        attn.KVCache(2**62, 1, 32)
    with pytest.raises(MemoryError, match="a KvCache's capacity, 1073741824 tokens for each of 4 sequences"):
        attn.KVCache(4, 2, 64, capacity=2**30)
    with pytest.raises(ValueError, match="capacity is 0 .* grow is false"):
        attn.KVCache(2, 1, 32, grow=False)
    cache = attn.KVCache(2, 1, 32, dtype="int8")
    k = rng.standard_normal((2, 1, 3, 32)).astype(np.float32)
    k[1, 0, 2, 5] = np.nan
    with pytest.raises(ValueError, match="sequence 1 was given a non-finite one"):
        cache.append(k, k)
    assert (cache.length(0), cache.length(1)) == (0, 0)
    with pytest.raises(ValueError, match=r"keys has shape \(2,1,1,31\); it must be \(batch, kv_heads, t, head_dim\)"):
        cache.append(k[:, :, :1, :31], k[:, :, :1, :31])
    # causal as NumPy's bool, as scaled_dot_product_attention takes it.
    ok = attn.KVCache(1, 1, 32)
    kv = rng.standard_normal((1, 5, 32)).astype(np.float32)
    ok.append(kv, kv, seq=0)
    q = rng.standard_normal((1, 2, 32)).astype(np.float32)
    np.testing.assert_array_equal(ok.attend(q, seq=0, causal=np.bool_(True)), ok.attend(q, seq=0))
    np.testing.assert_array_equal(ok.attend(q, seq=0, causal=np.bool_(False)), ok.attend(q, seq=0, causal=False))
    # slopes that are not numbers are named, as scaled_dot_product_attention names them.
    with pytest.raises(TypeError, match="KVCache.attend: alibi_slopes has dtype <U1; it must hold numbers"):
        ok.attend(q, seq=0, alibi_slopes=["a"])
    np.testing.assert_array_equal(ok.attend(q, seq=0, alibi_slopes=[0.5]), ok.attend(q, seq=0, alibi_slopes=np.float32([0.5])))
