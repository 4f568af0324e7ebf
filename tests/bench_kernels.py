#!/usr/bin/env python3
"""bench/kernels.cpp runs every benchmark once, briefly, and reports sane figures: no benchmark's
error (each checks its result is finite), a positive GFLOP/s and a share of the FMA peak between 0
and 4: above 1 means a wrong count or a wrong peak, but CTest runs other tests beside this one, and
the peak and a kernel measured in different moments of a shared machine can differ by tens of
percent.

  bench_kernels.py PROGRAM
"""
import json
import subprocess
import sys

EXPECTED = {"BM_BlockProduct", "BM_SdpaForward", "BM_SdpaBackward", "BM_Matmul"}


def main():
    program = sys.argv[1]
    run = subprocess.run([program, "--benchmark_min_time=0.01", "--benchmark_format=json"],
                         capture_output=True, text=True, timeout=600)
    if run.returncode != 0:
        sys.exit(f"{program} exited {run.returncode}: {run.stderr}")
    report = json.loads(run.stdout)
    seen = set()
    for b in report["benchmarks"]:
        name = b["name"]
        seen.add(name.split("/")[0])
        if b.get("error_occurred"):
            sys.exit(f"{name}: {b.get('error_message')}")
        if not b["GFLOP/s"] > 0:
            sys.exit(f"{name}: GFLOP/s {b['GFLOP/s']}")
        for share in ("of_peak", "products_of_peak"):
            if share in b and not 0 < b[share] < 4:
                sys.exit(f"{name}: {share} {b[share]} is not a share of the FMA peak")
        print(f"{name}: {b['GFLOP/s']:.1f} GFLOP/s, {b['of_peak']:.2f} of the peak")
    missing = EXPECTED - seen
    if missing:
        sys.exit(f"benchmarks missing from the report: {sorted(missing)}")


if __name__ == "__main__":
    main()
