"""A small Transformer encoder trained twice on the same synthetic task: once with the textbook's
MultiHeadAttention (d2l's code, as tests/torch/make_cases.py holds it) and once with
attn.torch.MultiHeadAttention, from the same initial weights (moved by load_state_dict: the two
modules name their parameters alike) and on the same batches.

The task: reverse a sequence of 16 tokens drawn from 12 (the answer at position i is the token at
position 15 - i), which attention must learn to route by position. Prints the loss and accuracy of both
models and the median time per training step, and draws both loss curves into
OUT_DIR/torch_transformer_loss.png (attn.plot).

    PYTHONPATH=build/release/python /usr/bin/python3 examples/torch_transformer.py [--steps 300] [--threads T] [OUT_DIR]
"""
import argparse
import os
import pathlib
import statistics
import sys
import time

import torch
from torch import nn

import attn
import attn.torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "torch"))
from make_cases import MultiHeadAttention as TextbookMultiHeadAttention  # noqa: E402

VOCAB, LENGTH, HIDDENS, HEADS, LAYERS, BATCH = 12, 16, 64, 4, 2, 64


class EncoderBlock(nn.Module):
    """d2l's TransformerEncoderBlock: attention and a position-wise MLP, each with a residual
    connection and layer norm (post-norm, as the textbook)."""

    def __init__(self, attention):
        super().__init__()
        self.attention = attention
        self.norm1, self.norm2 = nn.LayerNorm(HIDDENS), nn.LayerNorm(HIDDENS)
        self.ffn = nn.Sequential(nn.Linear(HIDDENS, 2 * HIDDENS), nn.ReLU(), nn.Linear(2 * HIDDENS, HIDDENS))

    def forward(self, x):
        x = self.norm1(x + self.attention(x, x, x, None))
        return self.norm2(x + self.ffn(x))


class Encoder(nn.Module):
    def __init__(self, make_attention):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, HIDDENS)
        self.position = nn.Parameter(torch.randn(LENGTH, HIDDENS))
        self.blocks = nn.ModuleList(EncoderBlock(make_attention()) for _ in range(LAYERS))
        self.head = nn.Linear(HIDDENS, VOCAB)

    def forward(self, tokens):
        x = self.embedding(tokens) + self.position
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def batch(generator):
    tokens = torch.randint(0, VOCAB, (BATCH, LENGTH), generator=generator)
    return tokens, tokens.flip(1)


def train(model, steps, seed):
    """Adam on fresh batches (the same stream for every model); returns losses and seconds per step."""
    data = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # the dropout masks' stream
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    loss_fn = nn.CrossEntropyLoss()
    losses, seconds = [], []
    model.train()
    for _ in range(steps):
        tokens, target = batch(data)
        start = time.perf_counter()
        loss = loss_fn(model(tokens).reshape(-1, VOCAB), target.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        seconds.append(time.perf_counter() - start)
        losses.append(loss.item())
    return losses, seconds


def accuracy(model, seed):
    tokens, target = batch(torch.Generator().manual_seed(seed))
    model.eval()
    with torch.no_grad():
        return (model(tokens).argmax(-1) == target).float().mean().item()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", nargs="?", default=".")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--threads", type=int, default=os.cpu_count(),
                        help="threads of PyTorch and attn (one OpenMP setting, which they share)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)  # Debian's torch sets 1 on import; attn reads the same setting
    out_dir = pathlib.Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(0)
    textbook = Encoder(lambda: TextbookMultiHeadAttention(HIDDENS, HEADS, 0.1))
    textbook(batch(torch.Generator().manual_seed(0))[0])  # gives d2l's LazyLinear layers their sizes
    ours = Encoder(lambda: attn.torch.MultiHeadAttention(HIDDENS, HEADS, 0.1, query_size=HIDDENS, key_size=HIDDENS,
                                                         value_size=HIDDENS))
    ours.load_state_dict(textbook.state_dict())  # the same initial weights, under the same names

    probe = batch(torch.Generator().manual_seed(1))[0]
    textbook.eval(), ours.eval()
    with torch.no_grad():
        gap = (textbook(probe) - ours(probe)).abs().max().item()
    print(f"same weights, eval mode: the two models' logits differ by {gap:.2e} "
          f"({torch.get_num_threads()} threads, attn on {attn.simd_target()})")
    if gap > 1e-4:
        sys.exit(f"torch_transformer: the models disagree before training (by {gap:.3g})")

    results = {}
    for name, model in (("textbook (d2l MultiHeadAttention)", textbook), ("attn.torch.MultiHeadAttention", ours)):
        losses, seconds = train(model, args.steps, seed=2)
        results[name] = losses
        if statistics.mean(losses[-10:]) > 0.5 * losses[0]:
            sys.exit(f"torch_transformer: {name} did not learn (loss {losses[0]:.3f} -> {losses[-1]:.3f})")
        print(f"{name:36s} loss {losses[0]:.3f} -> {statistics.mean(losses[-10:]):.3f}, "
              f"accuracy {accuracy(model, seed=3):.3f}, median {1e3 * statistics.median(seconds):.2f} ms/step")
    steps = list(range(1, args.steps + 1))
    picture = attn.plot(out_dir / "torch_transformer_loss.png", {name: (steps, losses) for name, losses in results.items()},
                        title=f"Reversing {LENGTH} tokens: training loss",
                        xlabel="step", ylabel="cross-entropy")
    print(f"loss curves: {picture}")


if __name__ == "__main__":
    main()
