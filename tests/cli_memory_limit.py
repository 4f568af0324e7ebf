"""The command line under the memory limit (attn/memory.hpp): a run whose buffers would exceed the
memory attn may use exits 1 (a failed run) naming the bytes, before it allocates; ATTN_MAX_BYTES sets
the limit, and a malformed value is bad usage (exit 2) naming it.

Usage: cli_memory_limit.py ATTN_CLI WORK_DIR
"""
import os
import subprocess
import sys

import numpy as np

cli, work = sys.argv[1], sys.argv[2]
os.makedirs(work, exist_ok=True)
big, small = os.path.join(work, "q_2_20.npy"), os.path.join(work, "q_small.npy")
np.save(big, np.zeros((1, 1 << 20, 1), np.float32))  # n = m = 2^20: its weights are 4 TiB
np.save(small, np.ones((1, 64, 8), np.float32))
failures = []


def run(name, inputs, extra, env, code, parts):
    args = [cli, "sdpa", "--queries", inputs, "--keys", inputs, "--values", inputs,
            "--out", os.path.join(work, name + "_out.npy")] + extra
    r = subprocess.run(args, env=dict(os.environ, **env), capture_output=True, text=True, timeout=60)
    missing = [p for p in parts if p not in r.stderr]
    if r.returncode != code or missing:
        failures.append(f"{name}: exit {r.returncode} (expected {code}), missing {missing} in: {r.stderr.strip()}")
    if os.path.exists(os.path.join(work, name + "_weights.npy")):
        failures.append(f"{name}: wrote the weights it refused")


weights = lambda name: ["--weights", os.path.join(work, name + "_weights.npy")]
run("weights_2_20", big, weights("weights_2_20"), {}, 1,
    ["attn sdpa: error:", "(1,1048576,1048576)", "4398046511104 bytes (4.0 TiB)", "available"])
run("max_bytes", small, weights("max_bytes"), {"ATTN_MAX_BYTES": "4K"}, 1,
    ["attn sdpa: error:", "4096 bytes (4.0 KiB) (ATTN_MAX_BYTES)"])
run("max_bytes_malformed", small, [], {"ATTN_MAX_BYTES": "12 GB"}, 2, ['ATTN_MAX_BYTES is "12 GB"', "K, M, G or T"])
run("max_bytes_overflow", small, [], {"ATTN_MAX_BYTES": "99999999999999999999"}, 2, ["more bytes than a 64-bit size holds"])
run("max_bytes_ample", small, weights("max_bytes_ample_ok"), {"ATTN_MAX_BYTES": "64M"}, 0, [])
if not os.path.exists(os.path.join(work, "max_bytes_ample_out.npy")):
    failures.append("max_bytes_ample: no output under an ample limit")
for f in failures:
    print("FAIL", f)
print(f"{5 - len(failures)} of 5 memory-limit runs as expected")
sys.exit(1 if failures else 0)
