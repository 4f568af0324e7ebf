"""KVCache.attend_batch against one KVCache.attend per sequence, on the same cache and queries:
64 sequences of 300 to 2047 tokens (8 key heads, 32 query heads, head size 128, blocks of 256), a
decode-only step (one query each) and a mixed step (a prompt chunk of 256 queries and 63 decodes),
for each cache dtype; medians of alternated runs, and their ratio.

    PYTHONPATH=build/release/python OMP_WAIT_POLICY=passive /usr/bin/python3 bench/serve_batch.py [--reps 9]
"""
import argparse
import time

import numpy as np

import attn


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--dtypes", default="float32,bfloat16,int8,float8_e4m3")
    args = p.parse_args()
    rng = np.random.default_rng(0)
    B, Hk, H, d = 64, 8, 32, 128
    lengths = rng.integers(300, 2048, B)
    for dtype in args.dtypes.split(","):
        scales = {"k_scale": 0.05, "v_scale": 0.05} if dtype.startswith("float8") else {}
        cache = attn.KVCache(B, Hk, d, dtype=dtype, block_size=256, **scales)
        for s in range(B):
            L = int(lengths[s])
            cache.append(rng.standard_normal((Hk, L, d), dtype=np.float32), rng.standard_normal((Hk, L, d), dtype=np.float32), seq=s)
        for name, counts in (("decode", [1] * B), ("mixed", [256] + [1] * (B - 1))):
            cu = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
            q = rng.standard_normal((int(cu[-1]), H, d), dtype=np.float32)
            per = [np.ascontiguousarray(q[cu[b] : cu[b + 1]].transpose(1, 0, 2)) for b in range(B)]
            runs = {"batch": lambda: cache.attend_batch(q, cu), "per sequence": lambda: [cache.attend(per[b], b) for b in range(B)]}
            times = {k: [] for k in runs}
            for f in runs.values():
                f()
            for _ in range(args.reps):
                for k, f in runs.items():
                    t = time.perf_counter()
                    f()
                    times[k].append(time.perf_counter() - t)
            batch, each = np.median(times["batch"]), np.median(times["per sequence"])
            print(f"{dtype:12s} {name:7s} attend_batch {1e3 * batch:8.2f} ms   per sequence {1e3 * each:8.2f} ms   {each / batch:.2f}x")


if __name__ == "__main__":
    main()
