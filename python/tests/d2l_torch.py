"""The d2l chapter's PyTorch code, the oracle of the Python module's tests.

First the chapter's code as the d2l chapter gives it (d2l's masked_softmax with its -1e6 fill,
AdditiveAttention, DotProductAttention), verbatim but for comments. It has one home,
tests/torch/make_cases.py, the C++ parity tests' oracle, and is imported from there. Then torch
versions, in the d2l chapter's style, of what attn adds to it: the other masks (bool, float, causal) and
attn's default treatment of a row with no key ("exclude": weights 0). The Nadaraya-Watson estimator
of the d2l chapter comes from make_cases.py too. Everything runs in float32 or float64, as the inputs.
"""
import math
import pathlib
import sys

import torch
from torch import nn

# The d2l chapter's code (d2l): masked_softmax (with d2l.sequence_mask), AdditiveAttention, DotProductAttention;
# and the d2l chapter's Nadaraya-Watson estimator, nadaraya_watson(queries, keys, values, kernel, sigma) on
# (B, n, p), (B, m, p), (B, m, v), returning (out, weights).
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tests" / "torch"))
from make_cases import (AdditiveAttention, DotProductAttention, MultiHeadAttention, masked_softmax,  # noqa: E402,F401
                        nadaraya_watson)

# ----------------------------------------------------------------------------------------------
# What attn adds, written in the d2l chapter's style.


def allowed_keys(shape, valid_lens=None, keep=None, causal=False):
    """The bool (B, [H,] n, m) array of the keys each query may attend to: valid lengths ((B,) or
    (B, n), as the d2l chapter), a bool keep-mask (True = attend) broadcast to the scores, and a causal
    mask ("top_left": key j <= query i; "bottom_right": j <= i + m - n)."""
    n, m = shape[-2], shape[-1]
    allowed = torch.ones(shape, dtype=torch.bool)
    if valid_lens is not None:
        lens = valid_lens if valid_lens.dim() == 2 else valid_lens[:, None].expand(shape[0], n)
        lens = lens.reshape(shape[0], *([1] * (len(shape) - 3)), n, 1)  # (B, [1,] n, 1)
        allowed = allowed & (torch.arange(m) < lens)
    if keep is not None:
        allowed = allowed & keep
    if causal:
        offset = m - n if causal == "bottom_right" else 0
        allowed = allowed & (torch.arange(m)[None, :] <= torch.arange(n)[:, None] + offset)
    return allowed


def masked_softmax_general(X, valid_lens=None, keep=None, additive=None, causal=False, fill="exclude"):
    """attn's masked softmax: the additive mask is added to X; then either ("exclude") masked keys
    take no part and a row left with none is 0, or ("d2l_minus_1e6") masked scores become -1e6
    before an ordinary softmax, as the d2l chapter's masked_softmax."""
    allowed = allowed_keys(X.shape, valid_lens, keep, causal)
    S = X if additive is None else X + additive
    if fill == "d2l_minus_1e6":
        return nn.functional.softmax(S.masked_fill(~allowed, -1e6), dim=-1)
    W = nn.functional.softmax(S.masked_fill(~allowed, -math.inf), dim=-1)
    return torch.nan_to_num(W, nan=0.0)  # a row of -inf only: 0/0 -> 0


def masked_softmax_exclude(X, valid_lens):
    """The d2l chapter's masked_softmax with attn's default for a row of valid length 0: weights 0."""
    W = masked_softmax(X, valid_lens)
    if valid_lens is None:
        return W
    lens = valid_lens if valid_lens.dim() == 2 else valid_lens[:, None].expand(X.shape[0], X.shape[1])
    return W * (lens > 0).to(W.dtype)[..., None]
