#!/usr/bin/python3
"""Writes the PyTorch side of attn's parity tests (tests/test_torch_parity.cpp).

Usage: /usr/bin/python3 make_cases.py OUT_DIR

For every case in CASES it draws float32 inputs from a seed of its own, runs the d2l chapter's PyTorch code
(d2l's masked_softmax with the -1e6 fill, AdditiveAttention, DotProductAttention) or the torch
versions of bilinear attention and Nadaraya-Watson written below, in eval mode (no dropout), twice:
in float32, and in float64 on the same inputs and parameters cast to float64. The loss
sum(out * G), G random, gives by autograd the gradients of every input and parameter. It writes

  OUT_DIR/<case>/<input>.npy       inputs, parameters, G: float32 (valid_lens: int64)
  OUT_DIR/<case>/<result>.f32.npy  a result computed by torch in float32
  OUT_DIR/<case>/<result>.f64.npy  the same result computed by torch in float64
  OUT_DIR/<case>/meta.json         op, mask and kernel flags, the names of inputs and results

The C++ test runs attn in float32 on the inputs and requires, per result, the STYLE.md rule:
max |attn32 - torch64| <= 2 max |torch32 - torch64| + 1e-6. A gradient torch does not produce (a
boxcar's or a constant kernel's gradient with respect to queries, keys or sigma) is written as zeros.
Requires torch and numpy: Debian's python3-torch, at /usr/bin/python3.
"""
import copy
import json
import math
import os
import sys

import numpy as np
import torch
from torch import nn


# ----------------------------------------------------------------------------------------------
# The d2l chapter's code (d2l), verbatim but for comments.


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


class MultiHeadAttention(nn.Module):
    """Multi-head attention: the next d2l chapter (d2l 11.5), its code but for comments, built
    on the d2l chapter's DotProductAttention; num_kv_heads (grouped key and value heads, each read by
    num_heads // num_kv_heads query heads through repeat_interleave) is attn's addition."""

    def __init__(self, num_hiddens, num_heads, dropout, bias=False, num_kv_heads=None, **kwargs):
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads or num_heads
        self.attention = DotProductAttention(dropout)
        kv_hiddens = self.num_kv_heads * (num_hiddens // num_heads)
        self.W_q = nn.LazyLinear(num_hiddens, bias=bias)
        self.W_k = nn.LazyLinear(kv_hiddens, bias=bias)
        self.W_v = nn.LazyLinear(kv_hiddens, bias=bias)
        self.W_o = nn.LazyLinear(num_hiddens, bias=bias)

    def forward(self, queries, keys, values, valid_lens):
        queries = self.transpose_qkv(self.W_q(queries), self.num_heads)
        keys = self.transpose_qkv(self.W_k(keys), self.num_kv_heads)
        values = self.transpose_qkv(self.W_v(values), self.num_kv_heads)
        group = self.num_heads // self.num_kv_heads
        if group > 1:  # (B * Hk, m, dh) -> (B * H, m, dh), key head j serving query heads j*group ...
            keys = keys.reshape(-1, self.num_kv_heads, *keys.shape[1:]).repeat_interleave(group, dim=1).flatten(0, 1)
            values = values.reshape(-1, self.num_kv_heads, *values.shape[1:]).repeat_interleave(group, dim=1).flatten(0, 1)
        if valid_lens is not None:
            valid_lens = torch.repeat_interleave(valid_lens, repeats=self.num_heads, dim=0)
        output = self.attention(queries, keys, values, valid_lens)
        output_concat = self.transpose_output(output)
        return self.W_o(output_concat)

    def transpose_qkv(self, X, heads):
        X = X.reshape(X.shape[0], X.shape[1], heads, -1)
        X = X.permute(0, 2, 1, 3)
        return X.reshape(-1, X.shape[2], X.shape[3])

    def transpose_output(self, X):
        X = X.reshape(-1, self.num_heads, X.shape[1], X.shape[2])
        X = X.permute(0, 2, 1, 3)
        return X.reshape(X.shape[0], X.shape[1], -1)


# ----------------------------------------------------------------------------------------------
# attn's other scoring functions, written in the d2l chapter's style.


class BilinearAttention(nn.Module):
    """a(q, k) = q^T W k (the d2l chapter's q^T M k), then the d2l chapter's masked softmax and bmm."""

    def __init__(self, W, dropout):
        super().__init__()
        self.W = nn.Parameter(W)  # (query_size, key_size)
        self.dropout = nn.Dropout(dropout)

    def forward(self, queries, keys, values, valid_lens=None):
        scores = torch.bmm(torch.matmul(queries, self.W), keys.transpose(1, 2))
        self.attention_weights = masked_softmax(scores, valid_lens)
        return torch.bmm(self.dropout(self.attention_weights), values)


def nadaraya_watson(queries, keys, values, kernel, sigma):
    """f(q) = sum_j K(u_j) v_j / sum_j K(u_j), u_j = ||q - k_j|| / sigma.

    queries (B, n, p), keys (B, m, p), values (B, m, v); returns (out, weights). The Gaussian is the
    d2l chapter's softmax(-||q - k||^2 / 2) form (the same ratio, without underflow); the others are the
    d2l chapter's kernels as written.
    """
    diff = queries.unsqueeze(2) - keys.unsqueeze(1)  # (B, n, m, p)
    dist2 = (diff * diff).sum(-1)  # (B, n, m)
    if kernel == "gaussian":
        weights = nn.functional.softmax(-dist2 / (2 * sigma * sigma), dim=-1)
    else:
        u = torch.sqrt(dist2) / sigma
        if kernel == "boxcar":
            k = (u <= 1).to(u.dtype)
        elif kernel == "epanechnikov":
            k = torch.clamp(1 - u, min=0)
        elif kernel == "constant":
            k = torch.ones_like(u)
        else:
            raise ValueError(kernel)
        weights = k / k.sum(-1, keepdim=True)
    return torch.bmm(weights, values), weights


# ----------------------------------------------------------------------------------------------
# Cases.

# name -> (op, seed, settings). Sizes: B batch, H heads, n queries, m keys, d query/key size
# (sdpa), q and k query and key sizes, h hidden size, v value size, p point size (Nadaraya-Watson).
# lens: None, "batch" (shape (B,)), "query" (shape (B, n)), or an explicit list; values in [1, m]
# unless zero=True, which puts some 0s in (the d2l chapter's code then gives a uniform row).
CASES = {
    # masked_softmax alone: the d2l chapter's two examples (torch.rand scores), then odd sizes.
    "masked_softmax_d2l_lens_b": ("masked_softmax", 101, dict(B=2, n=2, m=4, lens=[2, 3], dist="rand")),
    "masked_softmax_d2l_lens_q": ("masked_softmax", 102, dict(B=2, n=2, m=4, lens=[[1, 3], [2, 4]], dist="rand")),
    "masked_softmax_odd_lens_q": ("masked_softmax", 103, dict(B=3, n=113, m=203, lens="query", scale=5.0)),
    "masked_softmax_zero_len": ("masked_softmax", 104, dict(B=3, n=37, m=59, lens="query", zero=True, scale=5.0)),
    # DotProductAttention.
    "sdpa_d2l_example": ("sdpa", 201, dict(d2l_example=True)),
    "sdpa_odd_lens_b": ("sdpa", 202, dict(B=2, n=113, m=203, d=59, v=37, lens="batch")),
    "sdpa_odd_lens_q": ("sdpa", 203, dict(B=3, n=37, m=113, d=59, v=23, lens="query")),
    "sdpa_no_mask": ("sdpa", 204, dict(B=2, n=59, m=37, d=16, v=13, lens=None)),
    "sdpa_zero_len": ("sdpa", 205, dict(B=3, n=7, m=11, d=5, v=3, lens=[0, 11, 4])),
    "sdpa_zero_len_q": ("sdpa", 206, dict(B=2, n=13, m=29, d=9, v=6, lens="query", zero=True)),
    # Scores of several hundred: exp overflows float32 without the max subtraction.
    "sdpa_large_scores": ("sdpa", 207, dict(B=2, n=113, m=203, d=64, v=32, lens="query", qscale=100.0)),
    # d2l's MultiHeadAttention layout: (B, H, n, d) run as (B*H, n, d), valid_lens repeated per head.
    "sdpa_heads": ("sdpa", 208, dict(B=2, H=3, n=29, m=43, d=16, v=16, lens="batch")),
    # AdditiveAttention.
    "additive_d2l_example": ("additive", 301, dict(d2l_example=True)),
    "additive_odd_lens_b": ("additive", 302, dict(B=2, n=113, m=203, q=59, k=23, h=37, v=41, lens="batch")),
    "additive_zero_len_q": ("additive", 303, dict(B=3, n=13, m=31, q=7, k=11, h=9, v=5, lens="query", zero=True)),
    "additive_no_mask": ("additive", 304, dict(B=2, n=17, m=29, q=20, k=2, h=8, v=4, lens=None)),
    # Bilinear attention.
    "bilinear_odd_lens_b": ("bilinear", 401, dict(B=2, n=113, m=203, q=59, k=37, v=41, lens="batch")),
    "bilinear_zero_len_q": ("bilinear", 402, dict(B=3, n=17, m=29, q=6, k=10, v=7, lens="query", zero=True)),
    "bilinear_no_mask": ("bilinear", 403, dict(B=2, n=19, m=23, q=5, k=8, v=3, lens=None)),
    # Nadaraya-Watson: the d2l chapter's 1-D regression (50 training points, 50 test points), then odd sizes.
    "nw_gaussian_d2l_1d": ("nw", 501, dict(d2l_1d=True, kernel="gaussian", sigma=1.0)),
    "nw_boxcar_d2l_1d": ("nw", 502, dict(d2l_1d=True, kernel="boxcar", sigma=0.5)),
    "nw_epanechnikov_d2l_1d": ("nw", 503, dict(d2l_1d=True, kernel="epanechnikov", sigma=1.0)),
    "nw_constant_d2l_1d": ("nw", 504, dict(d2l_1d=True, kernel="constant", sigma=1.0)),
    "nw_gaussian_odd": ("nw", 505, dict(B=2, n=113, m=203, p=3, v=7, kernel="gaussian", sigma=1.3)),
    "nw_boxcar_odd": ("nw", 506, dict(B=2, n=113, m=203, p=3, v=7, kernel="boxcar", sigma=2.5)),
    "nw_epanechnikov_odd": ("nw", 507, dict(B=2, n=113, m=203, p=3, v=7, kernel="epanechnikov", sigma=2.5)),
    "nw_constant_odd": ("nw", 508, dict(B=2, n=113, m=203, p=3, v=7, kernel="constant", sigma=1.0)),
}

# A compact kernel's u = ||q - k|| / sigma must stay this far from 1, where the boxcar jumps and the
# Epanechnikov kernel's gradient jumps: there float32 and float64 may legitimately take different
# sides, and no error budget could say which side attn should take. float32 computes u to a few
# units in the last place (~1e-7); 1e-5 leaves a wide berth and still lets a draw of 113 x 203 pairs
# pass.
KERNEL_EDGE_MARGIN = 1e-5


def f32(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def draw_lens(rng, spec, B, n, m, zero):
    """valid_lens as an int64 array, or None."""
    if spec is None:
        return None
    if isinstance(spec, list):
        return np.array(spec, dtype=np.int64)
    shape = (B,) if spec == "batch" else (B, n)
    lens = rng.integers(1, m + 1, size=shape, dtype=np.int64)
    lens.reshape(-1)[0] = m  # a full row
    if zero:
        flat = lens.reshape(-1)
        flat[1::3] = 0  # every third row, from the second, attends to nothing
    return lens


def run_both(build, inputs):
    """Runs build(dtype, tensors) -> (results dict of output tensors, loss output, grads wrt) in
    float32 and float64; returns {name: (f32 array, f64 array)} of outputs and gradients."""
    results = {}
    per_dtype = {}
    for dtype in (torch.float32, torch.float64):
        tensors = {}
        for name, a in inputs.items():
            t = torch.from_numpy(a.copy())
            if t.is_floating_point():
                t = t.to(dtype)
            tensors[name] = t
        outs, grads = build(dtype, tensors)
        per_dtype[dtype] = {**{k: v.detach().numpy() for k, v in outs.items()}, **grads}
    for name in per_dtype[torch.float32]:
        a32 = np.asarray(per_dtype[torch.float32][name], dtype=np.float32)
        a64 = np.asarray(per_dtype[torch.float64][name], dtype=np.float64)
        assert a32.shape == a64.shape, name
        assert np.all(np.isfinite(a64)) and np.all(np.isfinite(a32)), f"{name} is not finite"
        results[name] = (a32, a64)
    return results


def grads_of(loss, wrt):
    """{name: gradient as numpy} for each (name, tensor) of wrt; zeros where loss does not depend on it."""
    tensors = list(wrt.values())
    gs = torch.autograd.grad(loss, tensors, allow_unused=True)
    return {name: (np.zeros(t.shape) if g is None else g.detach().numpy()) for (name, t), g in zip(wrt.items(), gs)}


def case_masked_softmax(rng, s):
    B, n, m = s["B"], s["n"], s["m"]
    if s.get("dist") == "rand":
        scores = rng.random((B, n, m)).astype(np.float32)  # torch.rand
    else:
        scores = f32(rng, (B, n, m), s.get("scale", 1.0))
    lens = draw_lens(rng, s["lens"], B, n, m, s.get("zero", False))
    inputs = {"scores": scores, "valid_lens": lens, "G": f32(rng, (B, n, m))}

    def build(dtype, t):
        X = t["scores"].requires_grad_()
        # sequence_mask writes in place; the d2l chapter always call masked_softmax on a computed tensor.
        weights = masked_softmax(X * 1, t["valid_lens"])
        return {"weights": weights}, grads_of((weights * t["G"]).sum(), {"dscores": X})

    return inputs, build, {}


def case_sdpa(rng, s):
    if s.get("d2l_example"):
        # queries = torch.normal(0, 1, (2, 1, 2)); keys = torch.ones((2, 10, 2));
        # values = torch.arange(40).reshape(1, 10, 4).repeat(2, 1, 1); valid_lens = [2, 6]
        queries = f32(rng, (2, 1, 2))
        keys = np.ones((2, 10, 2), dtype=np.float32)
        values = np.tile(np.arange(40, dtype=np.float32).reshape(1, 10, 4), (2, 1, 1))
        lens = np.array([2, 6], dtype=np.int64)
        H = None
    else:
        B, H, n, m, d, v = s["B"], s.get("H"), s["n"], s["m"], s["d"], s["v"]
        lead = (B,) if H is None else (B, H)
        queries = f32(rng, (*lead, n, d), s.get("qscale", 1.0))
        keys = f32(rng, (*lead, m, d))
        values = f32(rng, (*lead, m, v))
        lens = draw_lens(rng, s["lens"], B, n, m, s.get("zero", False))
    G = f32(rng, queries.shape[:-1] + (values.shape[-1],))
    inputs = {"queries": queries, "keys": keys, "values": values, "valid_lens": lens, "G": G}
    attention = DotProductAttention(dropout=0.5)
    attention.eval()

    def build(dtype, t):
        q, k, v = (t[x].requires_grad_() for x in ("queries", "keys", "values"))
        lens = t["valid_lens"]
        if H is None:
            out = attention(q, k, v, lens)
            weights = attention.attention_weights
        else:
            # d2l's MultiHeadAttention: heads folded into the batch, valid_lens repeated per head.
            B, _, n, d = q.shape
            m = k.shape[2]
            if lens is not None:
                lens = torch.repeat_interleave(lens, repeats=H, dim=0)
            out = attention(q.reshape(B * H, n, d), k.reshape(B * H, m, d), v.reshape(B * H, m, -1), lens)
            out = out.reshape(B, H, n, -1)
            weights = attention.attention_weights.reshape(B, H, n, m)
        loss = (out * t["G"]).sum()
        return {"out": out, "weights": weights}, grads_of(loss, {"dqueries": q, "dkeys": k, "dvalues": v})

    return inputs, build, {"heads": 0 if H is None else H}


def case_additive(rng, s, seed):
    if s.get("d2l_example"):
        # queries = torch.normal(0, 1, (2, 1, 20)); keys = torch.ones((2, 10, 2)); values as above;
        # AdditiveAttention(key_size=2, query_size=20, num_hiddens=8, dropout=0.1)
        queries = f32(rng, (2, 1, 20))
        keys = np.ones((2, 10, 2), dtype=np.float32)
        values = np.tile(np.arange(40, dtype=np.float32).reshape(1, 10, 4), (2, 1, 1))
        lens = np.array([2, 6], dtype=np.int64)
        q_size, k_size, h = 20, 2, 8
    else:
        B, n, m, q_size, k_size, h, v = (s[x] for x in ("B", "n", "m", "q", "k", "h", "v"))
        queries = f32(rng, (B, n, q_size))
        keys = f32(rng, (B, m, k_size))
        values = f32(rng, (B, m, v))
        lens = draw_lens(rng, s["lens"], B, n, m, s.get("zero", False))
    G = f32(rng, queries.shape[:-1] + (values.shape[-1],))
    torch.manual_seed(seed)  # nn.Linear's default initialisation, reproducibly
    module32 = AdditiveAttention(key_size=k_size, query_size=q_size, num_hiddens=h, dropout=0.1)
    module32.eval()
    module64 = copy.deepcopy(module32).double()  # the same parameters, exactly, in float64
    inputs = {"queries": queries, "keys": keys, "values": values, "valid_lens": lens, "G": G,
              "W_q": module32.W_q.weight.detach().numpy().copy(),
              "W_k": module32.W_k.weight.detach().numpy().copy(),
              "w_v": module32.w_v.weight.detach().numpy().reshape(h).copy()}

    def build(dtype, t):
        module = module32 if dtype == torch.float32 else module64
        q, k, v = (t[x].requires_grad_() for x in ("queries", "keys", "values"))
        out = module(q, k, v, t["valid_lens"])
        loss = (out * t["G"]).sum()
        grads = grads_of(loss, {"dqueries": q, "dkeys": k, "dvalues": v, "dW_q": module.W_q.weight,
                                "dW_k": module.W_k.weight, "dw_v": module.w_v.weight})
        grads["dw_v"] = grads["dw_v"].reshape(h)
        return {"out": out, "weights": module.attention_weights}, grads

    return inputs, build, {}


def case_bilinear(rng, s):
    B, n, m, q_size, k_size, v = (s[x] for x in ("B", "n", "m", "q", "k", "v"))
    queries = f32(rng, (B, n, q_size))
    keys = f32(rng, (B, m, k_size))
    values = f32(rng, (B, m, v))
    lens = draw_lens(rng, s["lens"], B, n, m, s.get("zero", False))
    W = f32(rng, (q_size, k_size), 1.0 / math.sqrt(q_size))
    G = f32(rng, (B, n, v))
    inputs = {"queries": queries, "keys": keys, "values": values, "valid_lens": lens, "G": G, "W": W}

    def build(dtype, t):
        attention = BilinearAttention(t["W"], dropout=0.5)
        attention.eval()
        q, k, vv = (t[x].requires_grad_() for x in ("queries", "keys", "values"))
        out = attention(q, k, vv, t["valid_lens"])
        loss = (out * t["G"]).sum()
        grads = grads_of(loss, {"dqueries": q, "dkeys": k, "dvalues": vv, "dW": attention.W})
        return {"out": out, "weights": attention.attention_weights}, grads

    return inputs, build, {}


def nw_points(rng, s):
    if s.get("d2l_1d"):
        # d2l's Nadaraya-Watson regression: x_train = sort(rand(50) * 5), y = 2 sin(x) + x^0.8 + noise,
        # x_test = arange(0, 5, 0.1).
        x_train = np.sort(rng.random(50) * 5)
        y_train = 2 * np.sin(x_train) + x_train ** 0.8 + rng.normal(0.0, 0.5, 50)
        x_test = np.arange(0, 5, 0.1)
        return (x_test.reshape(1, 50, 1).astype(np.float32), x_train.reshape(1, 50, 1).astype(np.float32),
                y_train.reshape(1, 50, 1).astype(np.float32))
    B, n, m, p, v = (s[x] for x in ("B", "n", "m", "p", "v"))
    return f32(rng, (B, n, p)), f32(rng, (B, m, p)), f32(rng, (B, m, v))


def case_nw(rng, s):
    kernel, sigma = s["kernel"], np.float32(s["sigma"])
    # Redraw until no u lies near a compact kernel's edge and every query has a key inside it.
    for attempt in range(100):
        queries, keys, values = nw_points(rng, s)
        u = np.linalg.norm(queries[:, :, None, :].astype(np.float64) - keys[:, None, :, :], axis=-1) / sigma
        if kernel not in ("boxcar", "epanechnikov"):
            break
        inside_with_margin = (u < 1 - KERNEL_EDGE_MARGIN).any(axis=-1).all()
        if np.abs(u - 1).min() > KERNEL_EDGE_MARGIN and inside_with_margin:
            break
    else:
        raise RuntimeError(f"no draw keeps u = ||q - k|| / sigma away from 1 for {kernel}")
    G = f32(rng, queries.shape[:-1] + (values.shape[-1],))
    inputs = {"queries": queries, "keys": keys, "values": values, "G": G, "sigma": np.array(sigma, dtype=np.float32)}

    def build(dtype, t):
        q, k, v, sg = (t[x].requires_grad_() for x in ("queries", "keys", "values", "sigma"))
        out, weights = nadaraya_watson(q, k, v, kernel, sg)
        loss = (out * t["G"]).sum()
        grads = grads_of(loss, {"dqueries": q, "dkeys": k, "dvalues": v, "dsigma": sg})
        return {"out": out, "weights": weights}, grads

    return inputs, build, {"kernel": kernel, "redraws": attempt}


def make_case(out_dir, name, op, seed, s):
    rng = np.random.default_rng(seed)
    if op == "masked_softmax":
        inputs, build, flags = case_masked_softmax(rng, s)
    elif op == "sdpa":
        inputs, build, flags = case_sdpa(rng, s)
    elif op == "additive":
        inputs, build, flags = case_additive(rng, s, seed)
    elif op == "bilinear":
        inputs, build, flags = case_bilinear(rng, s)
    elif op == "nw":
        inputs, build, flags = case_nw(rng, s)
    else:
        raise ValueError(op)
    lens = inputs.pop("valid_lens", None)
    if lens is not None:
        inputs["valid_lens"] = lens
    results = run_both(lambda dtype, t: build(dtype, {**t, "valid_lens": t.get("valid_lens")}), inputs)

    case_dir = os.path.join(out_dir, name)
    os.makedirs(case_dir, exist_ok=True)
    for key, a in inputs.items():
        np.save(os.path.join(case_dir, key + ".npy"), a)
    for key, (a32, a64) in results.items():
        np.save(os.path.join(case_dir, key + ".f32.npy"), a32)
        np.save(os.path.join(case_dir, key + ".f64.npy"), a64)
    lens_kind = "none" if lens is None else ("batch" if lens.ndim == 1 else "query")
    meta = {"op": op, "valid_lens": lens_kind, "fill": "d2l_minus_1e6" if op != "nw" else "none",
            "seed": seed, "torch": torch.__version__, "inputs": sorted(inputs), "results": sorted(results),
            "shapes": {k: list(a.shape) for k, a in inputs.items()}, **flags}
    with open(os.path.join(case_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)
        f.write("\n")
    worst = max(float(np.abs(a32 - a64).max()) if a32.size else 0.0 for a32, a64 in results.values())
    print(f"{name}: {op}, {len(results)} results, worst torch32 error {worst:.3g}")


def main():
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OUT_DIR")
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    torch.set_num_threads(1)  # results do not depend on it; the test machines are small
    for name, (op, seed, s) in CASES.items():
        make_case(out_dir, name, op, seed, s)
    with open(os.path.join(out_dir, "cases.txt"), "w") as f:
        f.write("".join(name + "\n" for name in CASES))


if __name__ == "__main__":
    main()
