#!/usr/bin/python3
"""Times a training step of attention from PyTorch: forward and backward through
attn.torch.scaled_dot_product_attention against the d2l chapter's DotProductAttention (torch's bmm and
softmax, as the chapter writes it; tests/torch/make_cases.py), in the same process on the same tensors.

    PYTHONPATH=build/release/python /usr/bin/python3 bench/torch_autograd.py [--seconds 2] [--threads T]

Prints the median milliseconds of each, GFLOP/s (4 B H n m d for the forward, 8 B H n m d more for the
backward: the two products, then four in the backward) and attn's speed-up. Both use the same OpenMP
threads (they share the setting).
"""
import argparse
import os
import pathlib
import sys

import torch

import attn
import attn.torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "torch"))
from compare_torch import median_seconds  # noqa: E402  (bench/, beside this script)
from make_cases import DotProductAttention  # noqa: E402

CASES = [(4, 8, 256, 64), (1, 8, 1024, 64), (1, 8, 4096, 64)]  # (B, H, n = m, d)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    theirs = DotProductAttention(0.0).eval()
    print(f"{torch.get_num_threads()} threads, attn on {attn.simd_target()}, torch {torch.__version__}")
    print(f"{'(B, H, n, d), forward + backward':34s} {'torch ms':>9s} {'GFLOP/s':>8s} {'attn ms':>8s} {'GFLOP/s':>8s} {'speed-up':>8s}")
    for B, H, n, d in CASES:
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(B, H, n, d, generator=g, requires_grad=True) for _ in range(3))
        upstream = torch.randn(B, H, n, d, generator=g)

        def textbook():
            out = theirs(q.reshape(B * H, n, d), k.reshape(B * H, n, d), v.reshape(B * H, n, d))
            torch.autograd.grad(out, (q, k, v), upstream.reshape(B * H, n, d))

        def ours():
            out = attn.torch.scaled_dot_product_attention(q, k, v)
            torch.autograd.grad(out, (q, k, v), upstream)

        flops = 12.0 * B * H * n * n * d
        t_torch, t_attn = median_seconds(textbook, args.seconds), median_seconds(ours, args.seconds)
        print(f"{str((B, H, n, d)):34s} {1e3 * t_torch:9.2f} {flops / t_torch / 1e9:8.1f} {1e3 * t_attn:8.2f} "
              f"{flops / t_attn / 1e9:8.1f} {t_torch / t_attn:7.2f}x")


if __name__ == "__main__":
    main()
