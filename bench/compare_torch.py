#!/usr/bin/python3
"""Times the seeds' PyTorch DotProductAttention (Debian's python3-torch, 2 threads) on the cases of
`attn bench` and prints the ratio against attn's fused kernels from `attn bench --json`.

    /usr/bin/python3 bench/compare_torch.py build/attn [--seconds 1]

The seeds' code is copied below as written in the chapter (masked_softmax with d2l.sequence_mask's
-1e6 fill, then two bmm). Causal cases are skipped: the seeds have no causal mask; so is the Nadaraya-Watson case, whose
(n, m) weight matrix the seeds' code would form (40 GB at n = m = 1e5).
"""
import argparse
import json
import math
import statistics
import subprocess
import time

import torch
from torch import nn


def sequence_mask(X, valid_len, value=0):  # d2l.sequence_mask
    maxlen = X.size(1)
    mask = torch.arange((maxlen), dtype=torch.float32, device=X.device)[None, :] < valid_len[:, None]
    X[~mask] = value
    return X


def masked_softmax(X, valid_lens):  # the seeds' masked_softmax
    if valid_lens is None:
        return nn.functional.softmax(X, dim=-1)
    shape = X.shape
    if valid_lens.dim() == 1:
        valid_lens = torch.repeat_interleave(valid_lens, shape[1])
    else:
        valid_lens = valid_lens.reshape(-1)
    X = sequence_mask(X.reshape(-1, shape[-1]), valid_lens, value=-1e6)
    return nn.functional.softmax(X.reshape(shape), dim=-1)


class DotProductAttention(nn.Module):  # the seeds' DotProductAttention
    def __init__(self, dropout):
        super().__init__()
        self.dropout = nn.Dropout(dropout)

    def forward(self, queries, keys, values, valid_lens=None):
        d = queries.shape[-1]
        scores = torch.bmm(queries, keys.transpose(1, 2)) / math.sqrt(d)
        self.attention_weights = masked_softmax(scores, valid_lens)
        return torch.bmm(self.dropout(self.attention_weights), values)


def median_seconds(f, budget):
    f()
    times, start = [], time.perf_counter()
    while len(times) < 3 or (len(times) < 50 and time.perf_counter() - start < budget):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def torch_case(name, budget):
    """Seconds of the seeds' code for a case named as `attn bench` names it, None if not comparable."""
    if "causal" in name or "forward (1,16384" in name:
        return None
    if name.startswith("nw "):
        print(f"{name:44s} skipped: the seeds' Nadaraya-Watson forms the (n, m) weight matrix, "
              "1e5 x 1e5 float32 = 40 GB", flush=True)
        return None
    B, n, m, d = (int(x) for x in name[name.index("(") + 1:name.index(")")].split(","))
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


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("attn", help="path of the attn executable")
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()
    torch.set_num_threads(2)
    ours = json.loads(subprocess.run([args.attn, "bench", "--json", "--threads", "2", "--seconds", str(args.seconds)],
                                     check=True, capture_output=True, text=True).stdout)
    print(f"{'case':44s} {'attn ms':>9s} {'torch ms':>9s} {'torch/attn':>10s}")
    for c in ours["cases"]:
        t = torch_case(c["name"], args.seconds)
        if t is None:
            continue
        print(f"{c['name']:44s} {c['median_s'] * 1e3:9.2f} {t * 1e3:9.2f} {t / c['median_s']:9.2f}x", flush=True)


if __name__ == "__main__":
    main()
