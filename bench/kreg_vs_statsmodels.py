#!/usr/bin/python3
"""Times statsmodels' KernelReg against attn.KernelReg on the same data, in one process:

  (a) one cv_ls criterion evaluation at a fixed bandwidth (attn's cv_ls bandwidth of the data):
      statsmodels' model.cv_loo(bw, model._est_loc_constant or _est_loc_linear) against attn's
      model.cv_ls(bw), reg_type lc and ll, n = 500 and 2000, and 10000 (statsmodels there only when
      one evaluation at n = 2000 predicts under --sm-limit seconds at 10000: its cost grows as n^2);
  (b) the whole fit with bw="cv_ls" at n = 500: statsmodels' Nelder-Mead search (scipy's fmin from
      the rule of thumb) against attn's search (quasi-Newton from three starts, exact gradients).

    OMP_WAIT_POLICY=passive OMP_NUM_THREADS=1 PYTHONPATH=build/release/python /usr/bin/python3 bench/kreg_vs_statsmodels.py

Runs alternate (statsmodels, attn, statsmodels, attn, ...) so that a neighbour's load falls on both
alike; each figure is the median of --reps runs. The data: x uniform in [0, 5), y = 2 sin(x) +
x^0.8 + N(0, 0.5^2) (the d2l chapter's curve, the distribution of `attn bench`'s kreg cases, drawn here
by numpy), one continuous regressor, the Gaussian kernel (statsmodels' default). Prints both criteria
and both bandwidths; docs/performance.md has the figures.
"""
import argparse
import statistics
import time

import numpy as np
from statsmodels.nonparametric.kernel_regression import KernelReg as SmKernelReg

import attn


def data(n):
    rng = np.random.default_rng(7)
    x = rng.uniform(0.0, 5.0, n)
    return x, 2 * np.sin(x) + x ** 0.8 + rng.normal(0.0, 0.5, n)


def timed(fn):
    t0 = time.perf_counter()
    value = fn()
    return time.perf_counter() - t0, float(np.squeeze(value)) if isinstance(value, np.ndarray) else value


def alternate(fns, reps):
    """Median seconds and the last value of each fn, run in turn reps times."""
    seconds = [[] for _ in fns]
    values = [None for _ in fns]
    for _ in range(reps):
        for i, fn in enumerate(fns):
            s, values[i] = timed(fn)
            seconds[i].append(s)
    return [statistics.median(s) for s in seconds], values


def criterion(reps, sm_limit):
    print(f"(a) one cv_ls evaluation at attn's cv_ls bandwidth, medians of {reps}")
    print(f"{'reg_type':8s} {'n':>6s} {'bw':>10s} {'statsmodels s':>14s} {'attn s':>10s} {'ratio':>8s}  criteria (statsmodels, attn)")
    sm_seconds_2000 = {}
    for n in (500, 2000, 10000):
        x, y = data(n)
        for reg_type in ("lc", "ll"):
            ours = attn.KernelReg(y, x, "c", reg_type=reg_type, bw="cv_ls")
            bw = ours.bw
            run_sm = n < 10000 or sm_seconds_2000[reg_type] * (n / 2000) ** 2 < sm_limit
            fns = []
            if run_sm:
                theirs = SmKernelReg(y, x, "c", reg_type=reg_type, bw=bw)
                est = theirs._est_loc_constant if reg_type == "lc" else theirs._est_loc_linear
                fns.append(lambda: theirs.cv_loo(bw, est))  # noqa: E731 (bound per iteration, called at once)
            fns.append(lambda: ours.cv_ls(bw))  # noqa: E731
            medians, values = alternate(fns, reps)
            if n == 2000:
                sm_seconds_2000[reg_type] = medians[0]
            if run_sm:
                print(f"{reg_type:8s} {n:6d} {bw[0]:10.6f} {medians[0]:14.4g} {medians[1]:10.3g} {medians[0] / medians[1]:7.0f}x"
                      f"  {values[0]:.12g}, {values[1]:.12g}")
            else:
                print(f"{reg_type:8s} {n:6d} {bw[0]:10.6f} {'-':>14s} {medians[0]:10.3g} {'-':>8s}  -, {values[0]:.12g}"
                      f"  (statsmodels predicted {sm_seconds_2000[reg_type] * (n / 2000) ** 2:.0f} s, not run)")


def search(reps):
    n = 500
    x, y = data(n)
    print(f"(b) the whole fit, bw=\"cv_ls\", n = {n}, medians of {reps}")
    print(f"{'reg_type':8s} {'statsmodels s':>14s} {'attn s':>10s} {'ratio':>8s}  bandwidths (statsmodels, attn); "
          "cv_ls at each (by attn)")
    for reg_type in ("lc", "ll"):
        medians, (theirs, ours) = alternate([lambda: SmKernelReg(y, x, "c", reg_type=reg_type, bw="cv_ls"),  # noqa: E731
                                             lambda: attn.KernelReg(y, x, "c", reg_type=reg_type, bw="cv_ls")], reps)
        print(f"{reg_type:8s} {medians[0]:14.4g} {medians[1]:10.3g} {medians[0] / medians[1]:7.0f}x"
              f"  {theirs.bw[0]:.6f}, {ours.bw[0]:.6f}; {ours.cv_ls(theirs.bw):.10g}, {ours.cv_ls(ours.bw):.10g}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--sm-limit", type=float, default=60.0,
                    help="statsmodels runs at n = 10000 only if one evaluation is predicted under this (seconds)")
    args = ap.parse_args()
    import statsmodels
    print(f"attn on {attn.simd_target()}, {attn.num_threads()} threads; statsmodels {statsmodels.__version__}")
    criterion(args.reps, args.sm_limit)
    search(args.reps)


if __name__ == "__main__":
    main()
