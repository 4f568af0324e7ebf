"""How arrays reach attn: layouts used in place or converted, other array-likes, dtypes, and the
GIL released while attn computes."""
import time

import numpy as np
import pytest

import attn
from helpers import longest_pause_during_a_call, torch


def random(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def layouts(a):
    """`a` (3-D) in other memory layouts, each with the same values but "broadcast" (stride 0 over
    the batch), which repeats the first batch element."""
    return {
        "fortran": np.asfortranarray(a),
        "reversed": np.ascontiguousarray(a[::-1])[::-1],  # negative strides
        "slice": np.repeat(a, 2, axis=0)[::2],  # every other batch element: strided, last axis contiguous
        "columns": np.repeat(a, 2, axis=-1)[..., ::2],  # a strided last axis
        "transposed": np.ascontiguousarray(a.transpose(0, 2, 1)).transpose(0, 2, 1),
        "big_endian": a.astype(a.dtype.newbyteorder(">")),
        "read_only": np.frombuffer(a.tobytes(), a.dtype).reshape(a.shape),
        "broadcast": np.broadcast_to(a[:1], a.shape),
    }


def test_a_reversed_axis_of_length_one_is_read(rng):
    # NumPy calls such an array C-contiguous, negative stride and all, so asking it for a contiguous
    # array gave it back as it was, and attn refused the stride.
    q, k, v = random(rng, 1, 3, 4), random(rng, 1, 1, 4), random(rng, 1, 1, 2)
    reversed_k = k[:, ::-1]
    assert reversed_k.strides[1] < 0 and reversed_k.flags.c_contiguous
    np.testing.assert_array_equal(attn.scaled_dot_product_attention(q, reversed_k, v),
                                  attn.scaled_dot_product_attention(q, k, v))
    np.testing.assert_array_equal(attn.masked_softmax(q[::-1]), attn.masked_softmax(q))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_layout_gives_the_c_ordered_result(rng, dtype):
    q, k, v = random(rng, 2, 5, 3, dtype=dtype), random(rng, 2, 7, 3, dtype=dtype), random(rng, 2, 7, 4, dtype=dtype)
    for name, (lq, lk, lv) in zip(layouts(q), zip(layouts(q).values(), layouts(k).values(), layouts(v).values())):
        cq, ck, cv = (np.array(a, dtype, order="C") for a in (lq, lk, lv))  # the same values, C-ordered copies
        got = attn.scaled_dot_product_attention(lq, lk, lv, np.array([3, 7]))
        assert got.dtype == dtype and got.flags.c_contiguous
        np.testing.assert_array_equal(got, attn.scaled_dot_product_attention(cq, ck, cv, np.array([3, 7])), err_msg=name)
        np.testing.assert_array_equal(attn.masked_softmax(lq), attn.masked_softmax(cq), err_msg=name)
        np.testing.assert_array_equal(attn.bmm(lq, lk, transpose_b=True), attn.bmm(cq, ck, transpose_b=True), err_msg=name)


def test_c_ordered_arrays_are_used_without_a_copy_and_others_are_copied(rng):
    # The layer's backward reads the arrays its call read (test_layers.py): changing an input in place
    # afterwards shows whether attn read that very array or a copy of it.
    q, k, G = random(rng, 1, 3, 2), random(rng, 1, 4, 2), random(rng, 1, 3, 4)
    for name, v, used_in_place in [("C order", random(rng, 1, 4, 4), True),
                                   ("a slice", random(rng, 2, 4, 4)[1:], True),
                                   ("Fortran order", np.asfortranarray(random(rng, 1, 4, 4)), False)]:
        attention = attn.DotProductAttention(0.0)
        attention(q, k, v)
        before = attention.backward(G)["queries"]
        v *= 3
        after = attention.backward(G)["queries"]
        assert np.allclose(after, 3 * before) == used_in_place, name


def test_lists_and_torch_tensors_are_arrays(rng):
    X = random(rng, 2, 2, 4)
    expected = attn.masked_softmax(X, np.array([2, 3]))
    # The softmax over each batch element's first 2 and 3 keys, 0 beyond them, in float64.
    x = X.astype(np.float64)
    want = np.zeros_like(x)
    for b, n in enumerate([2, 3]):
        e = np.exp(x[b, :, :n] - x[b, :, :n].max(-1, keepdims=True))
        want[b, :, :n] = e / e.sum(-1, keepdims=True)
    np.testing.assert_allclose(expected, want, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(attn.masked_softmax(torch.from_numpy(X), torch.tensor([2, 3])), expected)
    np.testing.assert_array_equal(attn.masked_softmax(X.tolist(), [2, 3]), attn.masked_softmax(X.astype(np.float64), [2, 3]))
    assert attn.masked_softmax(X.tolist()).dtype == np.float64  # Python floats are float64
    np.testing.assert_array_equal(attn.masked_softmax(X, np.array([2, 3], np.uint8)), expected)  # any integer dtype


def test_empty_dimensions(rng):
    assert attn.masked_softmax(np.zeros((0, 3, 4), np.float32)).shape == (0, 3, 4)
    out, w = attn.scaled_dot_product_attention(random(rng, 2, 3, 4), np.zeros((2, 0, 4), np.float32),
                                               np.zeros((2, 0, 5), np.float32), return_weights=True)
    assert out.shape == (2, 3, 5) and w.shape == (2, 3, 0) and np.all(out == 0)  # no key: every row is empty


def test_the_gil_is_released_while_attn_computes(rng):
    # While a thread runs an attn call of a few tenths of a second (the queries doubled until the
    # call alone takes 0.2 s: the fused kernels do the first size in milliseconds, no longer than
    # the 5 ms a thread may wait for the GIL), the main thread keeps running Python code: its longest
    # pause is far shorter than the call. Were the GIL held, the main thread would stop for the whole
    # call, every time. On a loaded machine the OS may deschedule the main thread once in a while
    # (and the call alone may run faster than with the main thread beside it), so one attempt in ten
    # is enough.
    q, k = random(rng, 4, 256, 64), random(rng, 4, 2048, 64)
    while q.shape[1] < 65536:
        start = time.perf_counter()
        attn.scaled_dot_product_attention(q, k, k)
        if time.perf_counter() - start >= 0.2:
            break
        q = np.concatenate([q, q], axis=1)
    attempts = []
    for _ in range(10):
        attempts.append(longest_pause_during_a_call(lambda: attn.scaled_dot_product_attention(q, k, k)))
        pause, duration = attempts[-1]
        if pause < duration / 2:
            break
    else:
        raise AssertionError(f"the main thread stopped for most of every call: {attempts}")
