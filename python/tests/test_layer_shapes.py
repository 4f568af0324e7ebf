"""The layers' backward(grad_out) across the shapes where the cpu kernels change path: 1 to 5
queries (the decode path takes up to 4 per head), values from 1 to 1024 wide, the d2l chapter's keys
(2, 10, 2) and keys past a decode tile. The layers call the backward without the forward's out
(python/src/layers.cpp), the path that once returned wrong gradients for n <= 4 and wide values."""
import numpy as np
import pytest

import attn
import d2l_torch
from helpers import assert_within_budget, grads, torch_both
from test_layers import torch_additive


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def check_layer(attention, make_module, arrays, params=()):
    """The layer's output and gradients against the d2l chapter's module in torch float64 (budget rule)."""
    out = attention(arrays["queries"], arrays["keys"], arrays["values"], arrays["lens"])
    got = {"out": out, **{"d" + k: g for k, g in attention.backward(arrays["G"]).items()}}

    def run(t):
        module = make_module(t)
        o = module(t["queries"], t["keys"], t["values"], t["lens"])
        named = {"queries": t["queries"], "keys": t["keys"], "values": t["values"]}
        named.update({p: getattr(module, p).weight for p in params})
        g = grads((o * t["G"]).sum(), named)
        if "w_v" in g:
            g["w_v"] = g["w_v"].reshape(-1)
        return {"out": o, **{"d" + n: x for n, x in g.items()}}

    refs = torch_both(run, arrays, requires_grad=("queries", "keys", "values"))
    assert set(refs) <= set(got)
    for name, (r32, r64) in refs.items():
        assert_within_budget(got[name], r32, r64, name)


@pytest.mark.parametrize("m", [10, 700])
@pytest.mark.parametrize("v", [1, 4, 256, 1024])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_dot_product_attention_backward_across_paths(rng, n, v, m):
    arrays = {"queries": f32(rng, 2, n, 2), "keys": f32(rng, 2, m, 2), "values": f32(rng, 2, m, v),
              "lens": np.array([m, m // 2 + 1]), "G": f32(rng, 2, n, v)}
    check_layer(attn.DotProductAttention(0.0).eval(),
                lambda t: d2l_torch.DotProductAttention(dropout=0.0).eval(), arrays)


@pytest.mark.parametrize("v", [1, 256, 1024])
@pytest.mark.parametrize("n", [1, 3, 4, 5, 65])
def test_additive_attention_backward_across_paths(rng, n, v):
    m, q, k, h = 70, 5, 3, 8
    arrays = {"queries": f32(rng, 2, n, q), "keys": f32(rng, 2, m, k), "values": f32(rng, 2, m, v),
              "lens": np.array([m, 7]), "G": f32(rng, 2, n, v)}
    layer = attn.AdditiveAttention(k, q, h, 0.0).eval()
    params = {name: getattr(layer, name) for name in ("W_q", "W_k", "w_v")}
    check_layer(layer, lambda t: torch_additive(t, params), arrays, params=("W_q", "W_k", "w_v"))
