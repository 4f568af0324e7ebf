"""The memory attn may use (attn/memory.hpp) from Python: a call whose buffers would exceed it raises
MemoryError naming the bytes before anything is allocated (the result arrays included), never an
out-of-memory kill; set_memory_limit and ATTN_MAX_BYTES set the limit."""
import os
import subprocess
import sys

import numpy as np
import pytest

import attn

MILLION = 1 << 20  # n = m = 2^20: the float32 weights (1, n, m) are 4 TiB


@pytest.fixture
def limit():
    """Sets a limit for one test, and goes back to the default after it."""
    yield attn.set_memory_limit
    attn.set_memory_limit(0)


def test_weights_of_two_to_the_twenty_raise_memory_error_naming_the_bytes():
    q = np.zeros((1, MILLION, 1), np.float32)
    with pytest.raises(MemoryError, match=r"the weights of shape \(1,1048576,1048576\) needs 4398046511104 bytes"):
        attn.scaled_dot_product_attention(q, q, q, return_weights=True)
    with pytest.raises(MemoryError, match="4398046511104 bytes"):
        attn.DotProductAttention(dropout=0.0)(q, q, q)  # the layer keeps its weights for backward


def sdpa_formula(q, dt):
    """Self-attention softmax(q q^T / sqrt(d)) q in dtype dt."""
    x = q.astype(dt)
    s = x @ x.swapaxes(-1, -2) / np.sqrt(dt(x.shape[-1]))
    w = np.exp(s - s.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ x


def test_a_set_limit_refuses_a_call_and_is_given_back(limit):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 300, 64), dtype=np.float32)
    expected = attn.scaled_dot_product_attention(q, q, q)
    # softmax(q q^T / 8) q in float64, and in float32 for the error budget of STYLE.md.
    exact, low = sdpa_formula(q, np.float64), sdpa_formula(q, np.float32)
    assert np.abs(expected - exact).max() <= 2 * np.abs(low - exact).max() + 1e-6 * np.abs(exact).max()
    assert attn.memory_limit_set() == 0
    limit(attn.memory_in_use() + 1024)
    assert attn.memory_limit() == attn.memory_in_use() + 1024
    assert attn.memory_limit_set() == attn.memory_limit()
    with pytest.raises(MemoryError, match=r"needs 153600 bytes .*than attn may use: .*\(set_memory_limit\)"):
        attn.scaled_dot_product_attention(q, q, q)
    attn.set_memory_limit(0)
    np.testing.assert_array_equal(attn.scaled_dot_product_attention(q, q, q), expected)


@pytest.mark.parametrize("value, error, parts", [
    ("4K", "MemoryError", ["4096 bytes (4.0 KiB) (ATTN_MAX_BYTES)"]),
    ("two gigabytes", "ValueError", ['ATTN_MAX_BYTES is "two gigabytes"', "K, M, G or T"]),
])
def test_attn_max_bytes_is_read_from_the_environment(value, error, parts):
    code = ("import numpy as np, attn\n"
            "q = np.ones((1, 64, 8), np.float32)\n"
            "try:\n"
            "    attn.scaled_dot_product_attention(q, q, q, return_weights=True)\n"
            "except Exception as e:\n"
            "    print(type(e).__name__, e)\n")
    r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, ATTN_MAX_BYTES=value),
                       capture_output=True, text=True, timeout=60)
    assert r.stdout.startswith(error), r.stdout + r.stderr
    for p in parts:
        assert p in r.stdout, r.stdout


def test_a_result_array_past_the_limit_names_the_call(limit):
    """The arrays a call returns count as its buffers do, and their MemoryError names the call too
    (KVCache.attend's did not)."""
    cache = attn.KVCache(1, 1, 32)
    cache.append(np.zeros((1, 4, 32), np.float32), np.zeros((1, 4, 32), np.float32), 0)
    q = np.zeros((2, 4, 32), np.float32)
    limit(attn.memory_in_use() + 512)
    with pytest.raises(MemoryError, match=r"^KVCache.attend: a result array of shape \(2,4,32\) needs 1024 bytes"):
        cache.attend(q, 0)
    with pytest.raises(MemoryError, match=r"^KVCache.attend_batch: a result array of shape \(8,1,32\) needs 1024 bytes"):
        cache.attend_batch(np.zeros((8, 1, 32), np.float32), [0, 8])
    with pytest.raises(MemoryError, match=r"^scaled_dot_product_attention: "):
        attn.scaled_dot_product_attention(q, q, q)
