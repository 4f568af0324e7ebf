"""The seeds' PyTorch code, the oracle of the Python module's tests.

First the chapter's code as the seeds give it (d2l's masked_softmax with its -1e6 fill,
AdditiveAttention, DotProductAttention), verbatim but for comments; it is the same code as
tests/torch/make_cases.py, the C++ parity tests' oracle. Then torch versions, in the seeds' style,
of what attn adds to it: the other masks (bool, float, causal) and attn's default treatment of a row
with no key ("exclude": weights 0), and the Nadaraya-Watson estimator of seed 001. Everything here
runs in float32 or float64, whichever the inputs have.
"""
import math

import torch
from torch import nn

# ----------------------------------------------------------------------------------------------
# The seeds' code (d2l).


def sequence_mask(X, valid_len, value=0):
    """d2l.sequence_mask: entries of each row at or beyond its valid length become `value`."""
    maxlen = X.size(1)
    mask = torch.arange((maxlen), dtype=torch.float32, device=X.device)[None, :] < valid_len[:, None]
    X[~mask] = value
    return X


def masked_softmax(X, valid_lens):
    """Perform softmax operation by masking elements on the last axis."""
    # `X`: 3D tensor, `valid_lens`: 1D or 2D tensor
    if valid_lens is None:
        return nn.functional.softmax(X, dim=-1)
    else:
        shape = X.shape
        if valid_lens.dim() == 1:
            valid_lens = torch.repeat_interleave(valid_lens, shape[1])
        else:
            valid_lens = valid_lens.reshape(-1)
        # On the last axis, replace masked elements with a very large negative
        # value, whose exponentiation outputs 0
        X = sequence_mask(X.reshape(-1, shape[-1]), valid_lens, value=-1e6)
        return nn.functional.softmax(X.reshape(shape), dim=-1)


class AdditiveAttention(nn.Module):
    def __init__(self, key_size, query_size, num_hiddens, dropout):
        super(AdditiveAttention, self).__init__()
        self.W_k = nn.Linear(key_size, num_hiddens, bias=False)
        self.W_q = nn.Linear(query_size, num_hiddens, bias=False)
        self.w_v = nn.Linear(num_hiddens, 1, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, queries, keys, values, valid_lens):
        queries, keys = self.W_q(queries), self.W_k(keys)
        features = queries.unsqueeze(2) + keys.unsqueeze(1)
        features = torch.tanh(features)
        scores = self.w_v(features).squeeze(-1)
        self.attention_weights = masked_softmax(scores, valid_lens)
        return torch.bmm(self.dropout(self.attention_weights), values)


class DotProductAttention(nn.Module):
    """Scaled dot product attention."""

    def __init__(self, dropout):
        super(DotProductAttention, self).__init__()
        self.dropout = nn.Dropout(dropout)

    def forward(self, queries, keys, values, valid_lens=None):
        d = queries.shape[-1]
        scores = torch.bmm(queries, keys.transpose(1, 2)) / math.sqrt(d)
        self.attention_weights = masked_softmax(scores, valid_lens)
        return torch.bmm(self.dropout(self.attention_weights), values)


# ----------------------------------------------------------------------------------------------
# What attn adds, written in the seeds' style.


def allowed_keys(shape, valid_lens=None, keep=None, causal=False):
    """The bool (B, [H,] n, m) array of the keys each query may attend to: valid lengths ((B,) or
    (B, n), as the seeds), a bool keep-mask (True = attend) broadcast to the scores, and a causal
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
    take no part and a row left with none is 0, or ("seeds_minus_1e6") masked scores become -1e6
    before an ordinary softmax, as the seeds' masked_softmax."""
    allowed = allowed_keys(X.shape, valid_lens, keep, causal)
    S = X if additive is None else X + additive
    if fill == "seeds_minus_1e6":
        return nn.functional.softmax(S.masked_fill(~allowed, -1e6), dim=-1)
    W = nn.functional.softmax(S.masked_fill(~allowed, -math.inf), dim=-1)
    return torch.nan_to_num(W, nan=0.0)  # a row of -inf only: 0/0 -> 0


def masked_softmax_exclude(X, valid_lens):
    """The seeds' masked_softmax with attn's default for a row of valid length 0: weights 0."""
    W = masked_softmax(X, valid_lens)
    if valid_lens is None:
        return W
    lens = valid_lens if valid_lens.dim() == 2 else valid_lens[:, None].expand(X.shape[0], X.shape[1])
    return W * (lens > 0).to(W.dtype)[..., None]


def nadaraya_watson(x_train, y_train, x_query, kernel="gaussian", width=1.0):
    """Seed 001's estimator f(x) = sum_i K(|x - x_i| / width) y_i / sum_j K(|x - x_j| / width),
    x_train (B, m, p), y_train (B, m, v), x_query (B, n, p); returns (y_hat (B, n, v), weights
    (B, n, m)). The Gaussian as the seed writes it, softmax(-1/2 (|x - x_i| / width)^2); boxcar
    1 if u <= 1; Epanechnikov max(0, 1 - u); constant 1. A row with no weight gives 0."""
    diff = x_query.unsqueeze(-2) - x_train.unsqueeze(-3)  # (B, n, m, p)
    dist2 = (diff * diff).sum(-1)
    if kernel == "gaussian":
        weights = nn.functional.softmax(-dist2 / (2 * width * width), dim=-1)
    else:
        u = torch.sqrt(dist2) / width
        if kernel == "boxcar":
            k = (u <= 1).to(u.dtype)
        elif kernel == "epanechnikov":
            k = torch.clamp(1 - u, min=0)
        elif kernel == "constant":
            k = torch.ones_like(u)
        else:
            raise ValueError(kernel)
        total = k.sum(-1, keepdim=True)
        weights = k / torch.where(total > 0, total, torch.ones_like(total))
    return torch.matmul(weights, y_train), weights
