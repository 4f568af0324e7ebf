"""Python threads calling attn at once (attn/config.hpp, "Threads"): the GIL is released while attn
computes, and calls made together give bit-identical results to the same calls made one by one,
whatever each thread's own number of OpenMP threads."""
import threading
import time

import numpy as np

import attn


def make_calls():
    """(name, call) pairs over fixed inputs, one per kind of function."""
    rng = np.random.default_rng(0)
    q32, k32, v32 = (rng.standard_normal((2, 4, 90, 32), dtype=np.float32) for _ in range(3))
    q64, k64, v64 = (x.astype(np.float64) for x in (q32, k32, v32))
    lens = rng.integers(0, 91, size=(2, 90))
    scores = rng.standard_normal((3, 50, 70))
    x_train, y_train = rng.uniform(0, 5, 200), rng.standard_normal(200)
    x_query = np.linspace(0, 5, 120)
    cache = attn.KVCache(2, 2, 32, dtype="int8", block_size=64)
    cache.append(rng.standard_normal((2, 2, 150, 32), dtype=np.float32), rng.standard_normal((2, 2, 150, 32), dtype=np.float32))
    decode_q = rng.standard_normal((2, 4, 1, 32), dtype=np.float32)
    return [
        ("sdpa float32 causal", lambda: attn.scaled_dot_product_attention(q32, k32, v32, causal=True)),
        ("sdpa float64 valid_lens", lambda: attn.scaled_dot_product_attention(q64, k64, v64, valid_lens=lens)),
        ("sdpa float16 window", lambda: attn.scaled_dot_product_attention(
            q32.astype(np.float16), k32.astype(np.float16), v32.astype(np.float16), window=(20, 0))),
        ("sdpa bfloat16", lambda: attn.scaled_dot_product_attention(q32, k32, v32, compute_dtype="bfloat16")),
        ("sdpa dropout weights", lambda: attn.scaled_dot_product_attention(
            q32, k32, v32, dropout_p=0.25, seed=5, return_weights=True)[0]),
        ("masked_softmax", lambda: attn.masked_softmax(scores, np.arange(3) * 20 + 10)),
        ("nadaraya_watson", lambda: attn.nadaraya_watson(x_train, y_train, x_query, "epanechnikov", 0.4)),
        ("kv cache decode", lambda: cache.attend(decode_q)),
    ]


def test_threads_calling_at_once_get_the_results_of_calls_made_one_by_one():
    calls = make_calls()
    expected = [call() for _, call in calls]
    threads_per_caller = [1, 2]
    results, errors = {}, []
    start = threading.Barrier(2 * len(calls))

    def caller(index):
        try:
            attn.set_num_threads(threads_per_caller[index % 2])  # this thread's own count
            start.wait()
            name, call = calls[index % len(calls)]
            results[index] = [call() for _ in range(3)]
        except Exception as e:  # reported below, with the thread's index
            errors.append((index, repr(e)))

    workers = [threading.Thread(target=caller, args=(i,)) for i in range(2 * len(calls))]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors, errors
    for index, got in results.items():
        name = calls[index % len(calls)][0]
        for run in got:
            assert np.array_equal(run, expected[index % len(calls)], equal_nan=True), f"{name} on thread {index}"


def test_the_gil_is_released_while_attn_computes():
    """Python code runs beside one long call: the longest pause of a loop in the main thread is a
    fraction of the call's time (were the GIL held, the loop would stop for the whole call)."""
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, 8, 2048, 64), dtype=np.float32)
    started, took = threading.Event(), []

    def compute():
        attn.set_num_threads(1)  # one core for the call, the other for the loop
        started.set()
        t0 = time.perf_counter()
        attn.scaled_dot_product_attention(q, q, q)
        took.append(time.perf_counter() - t0)

    worker = threading.Thread(target=compute)
    worker.start()
    started.wait()
    longest, last = 0.0, time.perf_counter()
    while worker.is_alive():
        now = time.perf_counter()
        longest, last = max(longest, now - last), now
    worker.join()
    assert took[0] > 0.02, "the call was too quick to tell"
    assert longest < took[0] / 2, f"the loop stopped for {longest:.3f} s of a {took[0]:.3f} s call: the GIL was held"
