"""What attention sinks cost: attn.scaled_dot_product_attention with and without sinks on the same
arrays, timed interleaved (A B A B ...) so that a neighbour's load falls on both alike, medians.

    OMP_WAIT_POLICY=passive PYTHONPATH=build/release/python /usr/bin/python3 bench/sinks_overhead.py [--reps 41]

Cases: a forward (4, 8, 1024, 1024, 64) and a decode (32, 8, 1, 8192, 128), float32. Each kernel adds
the head's sink to a row's sum when it finishes the row (fused::row_end): one exponential a row.
"""
import argparse
import statistics
import time

import numpy as np

import attn


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=41)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    cases = {
        "forward (4,8,1024,1024,64)": (4, 8, 1024, 1024, 64),
        "decode (32,8,1,8192,128)": (32, 8, 1, 8192, 128),
    }
    print(f"simd={attn.simd_target()}, threads={attn.num_threads()}, {args.reps} reps each, interleaved")
    for name, (B, H, n, m, d) in cases.items():
        q = rng.uniform(-1, 1, (B, H, n, d)).astype(np.float32)
        k = rng.uniform(-1, 1, (B, H, m, d)).astype(np.float32)
        v = rng.uniform(-1, 1, (B, H, m, d)).astype(np.float32)
        sinks = rng.uniform(0, 2, H).astype(np.float32)
        plain = lambda: attn.scaled_dot_product_attention(q, k, v)  # noqa: E731
        with_sinks = lambda: attn.scaled_dot_product_attention(q, k, v, sinks=sinks)  # noqa: E731
        plain(), with_sinks()  # warm-up: scratch and pages
        a, b = [], []
        for _ in range(args.reps):
            a.append(timed(plain))
            b.append(timed(with_sinks))
        ma, mb = statistics.median(a), statistics.median(b)
        ratios = sorted(y / x for x, y in zip(a, b))
        print(f"  {name:28s} without {ma * 1e3:8.2f} ms   with sinks {mb * 1e3:8.2f} ms   "
              f"ratio of medians {mb / ma:.3f}   median of paired ratios {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
