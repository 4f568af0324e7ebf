"""cli.bench (tests/cli.cmake): `attn bench` runs its decode cases, float32, 16-bit, int8, float8 and 4-bit
(int4, int4_kivi), and grouped-query ones (32 query heads over 8 key heads), and exits 0 with every case
in its JSON; its additive-mask cases run beside their masks' built-in forms, checked against the
unfused backend. Each case's own tolerance (its JSON "tolerance", none looser than the 4-bit caches' 4/15 ~
0.267: 4 units of a group's (max - lo) / 30) decides whether its fused and unfused results agree (a
single float32 threshold once failed every run that had a 16-bit case, and later the float8 one).

    /usr/bin/python3 tests/cli_bench.py build/release/attn
"""
import json
import subprocess
import sys

attn = sys.argv[1]
run = subprocess.run([attn, "bench", "--filter", "decode", "--seconds", "0.01", "--json"], capture_output=True, text=True)
if run.returncode != 0:
    sys.exit(f"attn bench exited {run.returncode}: {run.stderr.strip().splitlines()[-1]}")
report = json.loads(run.stdout)
names = [case["name"] for case in report["cases"]]
for wanted in ("sdpa decode (32,1,8192,128)", "sdpa decode bf16 (32,1,8192,128)", "sdpa decode f16 (32,1,8192,128)",
               "sdpa decode int8 (32,1,8192,128)", "sdpa decode float8_e4m3 cache (32,1,8192,128)",
               "sdpa decode int4 cache (32,1,8192,128)", "sdpa decode int4_kivi cache (32,1,8192,128)",
               "sdpa decode float32 cache 32/8 heads (4,1,8192,128)", "sdpa decode bf16 cache 32/8 heads (4,1,8192,128)"):
    if wanted not in names:
        sys.exit(f"attn bench did not run {wanted!r}; it ran {names}")
for case in report["cases"]:
    if not (case["median_s"] > 0 and case["gbs"] > 0 and 0 <= case["max_rel_diff"] <= case["tolerance"] <= 0.267):
        sys.exit(f"attn bench reported {case}")
# The additive masks: timed in turn with their built-in form (none, or causal=True) in the "unfused"
# column, and their result checked against the unfused backend's within float32's tolerance.
run = subprocess.run([attn, "bench", "--filter", "sdpa forward additive", "--seconds", "0.01", "--json"],
                     capture_output=True, text=True)
if run.returncode != 0:
    sys.exit(f"attn bench --filter 'sdpa forward additive' exited {run.returncode}: {run.stderr.strip()}")
masks = json.loads(run.stdout)["cases"]
if [c["name"] for c in masks] != ["sdpa forward additive float mask (1,4,2048,2048,128)",
                                  "sdpa forward additive causal mask (1,4,2048,2048,128)"]:
    sys.exit(f"attn bench ran {[c['name'] for c in masks]} for the additive masks")
for case in masks:
    if not (case["unfused_median_s"] > 0 and "built-in form" in case["counted"] and
            0 <= case["max_rel_diff"] <= case["tolerance"] <= 1e-4):
        sys.exit(f"attn bench reported {case}")
print(f"attn bench ran {len(names)} decode cases on {report['simd_ran']}: " +
      ", ".join(f"{c['name']} {1e3 * c['median_s']:.2f} ms" for c in report["cases"]))
