#!/usr/bin/python3
"""Times the d2l chapter's PyTorch DotProductAttention and AdditiveAttention and the textbook's
MultiHeadAttention built on them (Debian's python3-torch, 2 threads) on the cases of `attn bench` and prints the ratio against attn's fused kernels from
`attn bench --json`.

    /usr/bin/python3 bench/compare_torch.py build/attn [--seconds 1] [--filter additive]

The d2l chapter's code, as written in the chapter (masked_softmax with d2l.sequence_mask's -1e6 fill, then
two bmm), comes from tests/torch/make_cases.py. Causal cases are skipped: the d2l chapter has no causal
mask; so is the Nadaraya-Watson case, whose (n, m) weight matrix the d2l chapter's code would form (40 GB at
n = m = 1e5).
"""
import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import time

import torch


# The d2l chapter's code (d2l's masked_softmax with its -1e6 fill, DotProductAttention, AdditiveAttention)
# has one home, tests/torch/make_cases.py, the parity tests' oracle, and is imported from there.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "torch"))
from make_cases import AdditiveAttention, DotProductAttention, MultiHeadAttention  # noqa: E402


def median_seconds(f, budget):
    f()
    times, start = [], time.perf_counter()
    while len(times) < 3 or (len(times) < 50 and time.perf_counter() - start < budget):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def torch_case(name, budget):
    """Seconds of the d2l chapter's code for a case named as `attn bench` names it, None if not comparable."""
    if "causal" in name or "forward (1,16384" in name:
        return None
    if name.startswith("nw "):
        print(f"{name:44s} skipped: the d2l chapter's Nadaraya-Watson forms the (n, m) weight matrix, "
              "1e5 x 1e5 float32 = 40 GB", flush=True)
        return None
    dims = [int(x) for x in name[name.index("(") + 1:name.index(")")].split(",")]
    if name.startswith("multi-head"):
        return multi_head_case(*dims, budget)
    if len(dims) != 4:  # the variants' (B, H, n, m, d) cases: the d2l chapter has no heads, windows or biases
        return None
    B, n, m, d = dims
    if name.startswith("additive"):
        return additive_case(B, n, m, d, "backward" in name, budget)
    q, k, v = (torch.rand(B, r, d) * 2 - 1 for r in (n, m, m))
    lens = torch.tensor([m // 2 + (b * m) // (2 * B) + 1 for b in range(B)]) if "valid_lens" in name else None
    attention = DotProductAttention(0.0).eval()
    if "backward" in name:
        q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
        g = torch.rand(B, n, d)

        def step():
            q.grad = k.grad = v.grad = None
            attention.train()(q, k, v, lens).backward(g)
        return median_seconds(step, budget)
    with torch.no_grad():
        return median_seconds(lambda: attention(q, k, v, lens), budget)


def additive_case(B, n, m, h, backward, budget):
    """The d2l chapter's AdditiveAttention with hidden size h, queries, keys and values of size 64, no mask;
    it materialises the (B, n, m, h) features (512 MiB for the bench case's forward alone)."""
    q, k, v = (torch.rand(B, r, 64) * 2 - 1 for r in (n, m, m))
    attention = AdditiveAttention(64, 64, h, 0.0)
    if backward:
        q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
        g = torch.rand(B, n, 64)

        def step():
            attention.zero_grad(set_to_none=True)
            q.grad = k.grad = v.grad = None
            attention.train()(q, k, v, None).backward(g)
        return median_seconds(step, budget)
    with torch.no_grad():
        return median_seconds(lambda: attention.eval()(q, k, v, None), budget)


def multi_head_case(B, n, D, H, budget):
    """The textbook's MultiHeadAttention (the next d2l chapter, on their DotProductAttention),
    forward and backward, queries = keys = values = x (B, n, D), no bias or mask, as attn bench's case."""
    x = (torch.rand(B, n, D) * 2 - 1).requires_grad_()
    g = torch.rand(B, n, D)
    layer = MultiHeadAttention(D, H, 0.0)
    layer(x, x, x, None)  # sizes the lazy layers

    def step():
        layer.zero_grad(set_to_none=True)
        x.grad = None
        layer.train()(x, x, x, None).backward(g)
    return median_seconds(step, budget)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("attn", help="path of the attn executable")
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--filter", default="", help="only the cases whose name contains this (as attn bench)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    command = [args.attn, "bench", "--json", "--threads", "2", "--seconds", str(args.seconds)]
    if args.filter:
        command += ["--filter", args.filter]
    ours = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
    print(f"{'case':44s} {'attn ms':>9s} {'torch ms':>9s} {'torch/attn':>10s}")
    for c in ours["cases"]:
        t = torch_case(c["name"], args.seconds)
        if t is None:
            continue
        print(f"{c['name']:44s} {c['median_s'] * 1e3:9.2f} {t * 1e3:9.2f} {t / c['median_s']:9.2f}x", flush=True)


if __name__ == "__main__":
    main()
