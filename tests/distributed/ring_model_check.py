"""bench/ring_model.py against attn itself: its shards are attn.distributed.shard_rows' for every
layout and uneven split, its causal pair counts equal a brute-force count of the mask, every rank's
pairs over the ring's steps add up to the whole attention's, and --check predicts a synthetic run
whose step times follow the model exactly (and fails one that is 2x off). Exits 1 on a failure."""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

import attn.distributed as dist

here = os.path.dirname(os.path.abspath(__file__))
script = os.path.join(here, "..", "..", "bench", "ring_model.py")
sys.path.insert(0, os.path.dirname(script))
import ring_model  # noqa: E402

failures = []


def expect(condition, what):
    if not condition:
        failures.append(what)


for ranks in (1, 2, 3, 4, 5):
    for n in (ranks, 2 * ranks + 1, 37):
        for layout in ("contiguous", "zigzag"):
            total = {False: 0, True: 0}
            for rank in range(ranks):
                model_rows = ring_model.shard_rows(n, ranks, rank, layout)
                attn_rows = [tuple(r) for r in dist.shard_rows(n, ranks, rank, layout)]
                expect([tuple(r) for r in model_rows if r[1] > r[0]] == [r for r in attn_rows if r[1] > r[0]],
                       f"shard_rows({n}, {ranks}, {rank}, {layout}): model {model_rows}, attn {attn_rows}")
                for step in range(ranks):
                    for causal in (False, True):
                        count = ring_model.step_pairs(n, ranks, rank, step, layout, causal)
                        src = (rank - step) % ranks
                        mask = np.zeros((n, n), bool)
                        for qb, qe in model_rows:
                            for kb, ke in ring_model.shard_rows(n, ranks, src, layout):
                                mask[qb:qe, kb:ke] = True
                        if causal:
                            mask &= np.tril(np.ones((n, n), bool))
                        expect(count == mask.sum(), f"step_pairs(n={n}, P={ranks}, r={rank}, s={step}, {layout}, "
                                                    f"causal={causal}) = {count}, mask has {mask.sum()}")
                        total[causal] += count
            expect(total[False] == n * n and total[True] == n * (n + 1) // 2,
                   f"n={n}, P={ranks}, {layout}: pairs over the ring {total}, whole attention {n * n}, "
                   f"{n * (n + 1) // 2}")

# --check on a run that follows the model exactly, then on one twice as slow.
n, d, heads, ranks, rate = 4096, 64, 4, 2, 50e9
cases = []
for causal in (False, True):
    for backward in (False, True):
        predicted, _, _ = ring_model.predict(n, d, heads, ranks, rate, 10e9, 2e-6, causal,
                                             "zigzag" if causal else "contiguous", backward)
        pairs = n * (n + 1) / 2 if causal else n * n
        name = (f"ring {'zigzag ' if causal else ''}forward{'+backward' if backward else ''} "
                f"(1,{heads},{n},{n},{d}){' causal' if causal else ''}")
        cases.append({"name": name, "median_s": predicted,
                      "single_process_s": (12 if backward else 4) * d * heads * pairs / (rate * ranks)})
with tempfile.TemporaryDirectory() as tmp:
    for factor, want in ((1.0, 0), (2.0, 1)):
        path = os.path.join(tmp, f"run{factor}.json")
        with open(path, "w") as f:
            json.dump({"ranks": ranks, "cases": [dict(c, median_s=c["median_s"] * factor) for c in cases]}, f)
        run = subprocess.run([sys.executable, script, "--check", path, "--bandwidth", "10", "--latency", "2"],
                             capture_output=True, text=True)
        expect(run.returncode == want, f"--check on a run {factor}x the model: exit {run.returncode}\n{run.stdout}")
        if factor == 1.0:
            expect("largest difference: 0%" in run.stdout, f"--check on the model's own times:\n{run.stdout}")

for failure in failures:
    print("FAIL:", failure)
print(f"ring_model_check: {len(failures)} failures")
sys.exit(1 if failures else 0)
