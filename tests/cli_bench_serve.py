"""cli.bench_serve (tests/cli.cmake): `attn bench --serve` replays a tiny continuous-batching trace
(4 requests, prompts of 16 to 200 tokens in chunks of 64, 3 tokens generated each, 4 query and 2 key
heads of 64) through every cache dtype and exits 0 with one "serve" entry per dtype, its figures
positive and finite (the run itself fails when attend_batch and one attend per sequence disagree);
bad trace options exit 2 naming the option.

    /usr/bin/python3 tests/cli_bench_serve.py build/release/attn
"""
import json
import math
import os
import subprocess
import sys

attn = sys.argv[1]
TINY = {"--requests": "4", "--prompt-min": "16", "--prompt-max": "200", "--generate": "3", "--budget": "64",
        "--heads": "4", "--kv-heads": "2", "--head-dim": "64", "--seconds": "0.01"}


def serve(**changes):
    """`attn bench --serve` on the tiny trace, with `changes` ({"kv_heads": "3"}: --kv-heads 3) over it."""
    options = {**TINY, **{"--" + key.replace("_", "-"): value for key, value in changes.items()}}
    return [attn, "bench", "--serve", *(word for pair in options.items() for word in pair)]


DTYPES = {"float32", "bfloat16", "float16", "int8", "float8_e4m3", "float8_e5m2", "int4", "int4_kivi"}
FIGURES = ("tokens_per_s", "decode_fraction_of_read", "prefill_fraction_of_dense", "speedup_vs_per_sequence")

# Passive OpenMP waits: on a shared machine, threads spinning between the tiny trace's many short
# calls made it 100x slower (0.6 s instead of 0.03 s for one dtype).
run = subprocess.run(serve() + ["--json"], capture_output=True, text=True, timeout=120,
                     env={**os.environ, "OMP_WAIT_POLICY": "passive"})
if run.returncode != 0:
    sys.exit(f"attn bench --serve exited {run.returncode}: {run.stderr.strip()}")
report = json.loads(run.stdout)
if report["requests"] != 4 or report["budget"] != 64 or report["heads"] != 4 or report["kv_heads"] != 2:
    sys.exit(f"attn bench --serve did not report the trace it was given: {report}")
if not (report["threads"] >= 1 and report["simd"] and report["steps"] > report["decode_only_steps"] >= 1):
    sys.exit(f"attn bench --serve reported {report}")
dtypes = [entry["dtype"] for entry in report["serve"]]
if sorted(dtypes) != sorted(DTYPES):
    sys.exit(f"attn bench --serve ran {dtypes}; every cache dtype once was wanted: {sorted(DTYPES)}")
for entry in report["serve"]:
    for key in FIGURES:
        if not (isinstance(entry[key], (int, float)) and entry[key] > 0 and math.isfinite(entry[key])):
            sys.exit(f"attn bench --serve reported {key} = {entry[key]} for {entry['dtype']}: {entry}")
    if not (0 <= entry["max_abs_diff"] <= report["tolerance"]):
        sys.exit(f"attn bench --serve: attend_batch and attend differ by {entry['max_abs_diff']} for {entry['dtype']}")

# Bad values: exit 2, the option named on stderr.
for changes, named in (
        ({"requests": "0"}, "--requests"),
        ({"prompt_min": "300", "prompt_max": "200"}, "--prompt-max"),
        ({"budget": "0"}, "--budget"),
        ({"generate": "-1"}, "--generate"),
        ({"kv_heads": "3"}, "--kv-heads"),
        ({"head_dim": "48"}, "--head-dim"),  # int8 and the 4-bit caches store groups of 32
        ({"filter": "float64"}, "--filter"),
):
    bad = subprocess.run(serve(**changes), capture_output=True, text=True, timeout=60)
    if bad.returncode != 2 or named not in bad.stderr:
        sys.exit(f"attn bench --serve with {changes} exited {bad.returncode} (2 wanted), stderr {bad.stderr.strip()!r} "
                 f"(naming {named} wanted)")
# A trace option without --serve is refused too.
bad = subprocess.run([attn, "bench", "--requests", "4"], capture_output=True, text=True, timeout=60)
if bad.returncode != 2 or "--serve" not in bad.stderr:
    sys.exit(f"attn bench --requests 4 (no --serve) exited {bad.returncode}, stderr {bad.stderr.strip()!r}")

print(f"attn bench --serve ran {len(dtypes)} dtypes over {report['steps']} steps on {report['simd_ran']}: " +
      ", ".join(f"{e['dtype']} {e['tokens_per_s']:.0f} tok/s {e['speedup_vs_per_sequence']:.2f}x" for e in report["serve"]))
