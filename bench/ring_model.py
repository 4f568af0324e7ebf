#!/usr/bin/env python3
"""A model of ring attention's step time (attn/distributed.hpp), from a kernel rate and a link.

Each of P ranks holds n/P queries and m/P keys (contiguous, or zigzag: chunks r and 2P-1-r of 2P).
The ring takes P steps; at step s rank r computes its queries against the block of rank r - s while
that block's keys and values (and, in the backward, the gradients so far) travel to the next rank.
A step lasts as long as its slowest rank, whose time is the larger of
    compute      = pairs(r, s) * FLOPs per pair / rate per rank
    communicate  = latency + bytes of a block / bandwidth
so communication hides behind compute when compute >= communicate; the ranks whose compute is
shorter than the step's longest idle for the difference. pairs(r, s) counts the (query, key) pairs
rank r attends in block r - s exactly (the causal mask cut along the shards), as the kernels skip
the rest. FLOPs per pair: 4 d (Q K^T and P V) forward; the backward 8 d (Q K^T again, dP = dout V^T,
and dV, dK, dQ), each block's from the whole attention's out and log-sum-exp alone, so
forward+backward costs 12 d per pair, as in one process.

    python3 bench/ring_model.py --rate 120 --bandwidth 12.5 --latency 2 --n 1048576 --causal
        the predicted step for P = 2, 4, ..., 1024 ranks of 120 GFLOP/s each on 100 Gbit/s links
    python3 bench/ring_model.py --check P2.json P3.json P4.json
        against `mpiexec -n P attn bench --distributed --json` runs: the model is given the single
        process's measured rate (split evenly over the ranks, which share the machine's cores) and
        the machine's copy bandwidth, and predicts each measured ring case (several files of one P:
        medians of their cases)

The model leaves out what the kernels spend beside their FLOPs on small blocks (many ranks, short
shards) and the merges of partial results (O(n d) per step); --check shows how far that goes.
"""
import argparse
import json
import math
import re
import statistics
import sys


def shard_rows(length, ranks, rank, layout):
    """attn::shard_rows: the rows [begin, end) rank `rank` of `ranks` holds."""
    def cut(c, parts):
        return c * length // parts
    if layout == "contiguous":
        return [(cut(rank, ranks), cut(rank + 1, ranks))]
    mirror = 2 * ranks - 1 - rank
    return [(cut(rank, 2 * ranks), cut(rank + 1, 2 * ranks)), (cut(mirror, 2 * ranks), cut(mirror + 1, 2 * ranks))]


def pairs_between(q, k, causal):
    """(query, key) pairs attended between query rows q = (begin, end) and key rows k, top-left causal."""
    (qb, qe), (kb, ke) = q, k
    if qe <= qb or ke <= kb:
        return 0
    if not causal:
        return (qe - qb) * (ke - kb)
    total = 0  # query i attends keys [kb, min(ke, i + 1))
    lo, hi = max(qb, kb), min(qe, ke)  # queries whose cut lies inside the block: i in [kb, ke - 1]
    if hi > lo:  # sum over i in [lo, hi) of (i + 1 - kb)
        total += (hi - lo) * (lo + hi + 1) // 2 - (hi - lo) * kb
    beyond = max(0, qe - max(qb, ke))  # queries at or past ke see the whole block
    return total + beyond * (ke - kb)


def step_pairs(n, ranks, rank, step, layout, causal):
    src = (rank - step) % ranks
    return sum(pairs_between(q, k, causal) for q in shard_rows(n, ranks, rank, layout)
               for k in shard_rows(n, ranks, src, layout))


def predict(n, d, heads, ranks, rate, bandwidth, latency, causal, layout, backward, item=4):
    """Seconds of one ring forward (or forward+backward), its communication time per step, and the
    largest idle share of a rank. rate: FLOP/s per rank; bandwidth: bytes/s; latency: s."""
    per_pair = (12 if backward else 4) * d * heads
    # K and V; forward+backward: K and V in each pass and dK, dV behind them in the second
    block = n / ranks * d * heads * 2 * item * (3 if backward else 1)
    communicate = latency + block / bandwidth
    total, busy = 0.0, [0.0] * ranks
    for s in range(ranks):
        compute = [step_pairs(n, ranks, r, s, layout, causal) * per_pair / rate for r in range(ranks)]
        longest = max(compute)
        step = max(longest, communicate) if s + 1 < ranks or backward else longest
        total += step
        busy = [b + c for b, c in zip(busy, compute)]
    idle = max(1 - b / total for b in busy)
    return total, communicate, idle


def table(args):
    layout = "zigzag" if args.causal else "contiguous"
    print(f"ring attention, n = m = {args.n}, d = {args.d}, {args.heads} heads, {'causal zigzag' if args.causal else 'contiguous'}; "
          f"{args.rate} GFLOP/s per rank, links of {args.bandwidth} GB/s and {args.latency} us")
    print(f"{'P':>6} {'forward s':>12} {'fwd+bwd s':>12} {'comm/step ms':>13} {'compute/step ms':>16} {'hidden':>7} {'idle':>6}")
    ranks = 2
    while ranks <= args.max_ranks:
        fwd, comm, idle = predict(args.n, args.d, args.heads, ranks, args.rate * 1e9, args.bandwidth * 1e9,
                                  args.latency * 1e-6, args.causal, layout, False)
        both, _, _ = predict(args.n, args.d, args.heads, ranks, args.rate * 1e9, args.bandwidth * 1e9,
                             args.latency * 1e-6, args.causal, layout, True)
        per_step = fwd / ranks
        print(f"{ranks:>6} {fwd:>12.4g} {both:>12.4g} {comm * 1e3:>13.4g} {per_step * 1e3:>16.4g} "
              f"{'yes' if per_step >= comm else 'no':>7} {100 * idle:>5.0f}%")
        ranks *= 2
    # Communication hides while a block's compute outlasts its transfer: (n/P)^2 4 d H / R against
    # (n/P) 8 d H / BW, i.e. n/P >= 2 R / BW (twice that for a causal mask's half blocks).
    need = 2 * args.rate / args.bandwidth * (2 if args.causal else 1)
    print(f"communication hides while each rank holds at least {need:.0f} rows (n/P >= 2 R/BW"
          f"{', x2 causal' if args.causal else ''}) and a step outlasts the latency")


def check(args):
    # Several runs of one P are merged case by case into medians (the machine is shared and noisy).
    runs = {}
    for path in args.check:
        with open(path) as f:
            run = json.load(f)
        for case in run["cases"]:
            if case["name"].startswith("ring"):
                runs.setdefault((run["ranks"], case["name"]), []).append(case)
    worst = 0.0
    for (ranks, name), cases in sorted(runs.items()):
        measured = statistics.median(c["median_s"] for c in cases)
        single_process = statistics.median(c["single_process_s"] for c in cases)
        heads, n, _, d = map(int, re.search(r"\(1,(\d+),(\d+),(\d+),(\d+)\)", name).groups())
        causal, backward = "causal" in name, "backward" in name
        # The machine's rate, measured by the single process on all cores, shared evenly by the ranks.
        pairs = n * (n + 1) / 2 if causal else n * n
        rate = (12 if backward else 4) * d * heads * pairs / single_process / ranks
        predicted, _, idle = predict(n, d, heads, ranks, rate, args.bandwidth * 1e9, args.latency * 1e-6, causal,
                                     "zigzag" if causal else "contiguous", backward)
        error = predicted / measured - 1
        worst = max(worst, abs(error))
        print(f"P = {ranks}: {name:<52} measured {measured:8.3f} s, predicted {predicted:8.3f} s "
              f"({100 * error:+.0f}%), predicted idle {100 * idle:.0f}%"
              + (f" (medians of {len(cases)} runs)" if len(cases) > 1 else ""))
    print(f"largest difference: {100 * worst:.0f}%")
    return worst


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=100.0, help="GFLOP/s of the fused kernel per rank")
    parser.add_argument("--bandwidth", type=float, default=12.5, help="GB/s of a link (12.5: 100 Gbit/s)")
    parser.add_argument("--latency", type=float, default=2.0, help="microseconds per message")
    parser.add_argument("--n", type=int, default=1 << 20, help="queries = keys")
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--causal", action="store_true", help="causal mask, zigzag layout")
    parser.add_argument("--max-ranks", type=int, default=1024)
    parser.add_argument("--check", nargs="+", help="attn bench --distributed --json outputs to compare with")
    parser.add_argument("--tolerance", type=float, default=0.25, help="--check fails beyond this relative error")
    args = parser.parse_args()
    if args.check:
        sys.exit(0 if check(args) <= args.tolerance else 1)
    table(args)


if __name__ == "__main__":
    main()
