"""attn.MultiHeadAttention against the textbook's PyTorch MultiHeadAttention (d2l 11.5, in
tests/torch/make_cases.py) with the same weights: outputs and the gradients of every input and
parameter under the error budget, with and without biases, grouped key heads, valid lengths; lazy
sizing, parameters, modes and errors."""
import numpy as np
import pytest

import attn
import d2l_torch
from helpers import assert_within_budget, draw_lens, grads, torch, torch_both

PARAMS = ["W_q", "W_k", "W_v", "W_o"]
pytestmark = pytest.mark.filterwarnings("ignore:Lazy modules are a new feature")  # the textbook's nn.LazyLinear


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def textbook(layer, bias, heads, kv_heads, t):
    """The textbook's module with attn's layer's weights, in t's dtype."""
    module = d2l_torch.MultiHeadAttention(layer.num_hiddens, heads, 0.0, bias=bias, num_kv_heads=kv_heads).eval()
    module.to(t["queries"].dtype)
    with torch.no_grad():
        module(t["queries"], t["keys"], t["values"], t["lens"])  # sizes the lazy layers
    with torch.no_grad():
        for name in PARAMS:
            getattr(module, name).weight.copy_(torch.from_numpy(getattr(layer, name)))
            if bias:
                getattr(module, name).bias.copy_(torch.from_numpy(getattr(layer, "b_" + name[-1])))
    return module


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("bias, heads, kv_heads, lens", [(False, 4, 4, None), (True, 4, 4, "batch"),
                                                        (False, 6, 2, "query"), (True, 8, 1, "batch")])
def test_matches_the_textbook(rng, bias, heads, kv_heads, lens, dtype):
    B, n, m, q, k, v, D = 2, 7, 11, 5, 6, 9, 24
    arrays = {"queries": f32(rng, B, n, q), "keys": f32(rng, B, m, k), "values": f32(rng, B, m, v),
              "lens": None if lens is None else rng.integers(1, m + 1, size=(B,) if lens == "batch" else (B, n)),
              "G": f32(rng, B, n, D)}
    layer = attn.MultiHeadAttention(D, heads, 0.1, bias=bias, num_kv_heads=kv_heads, seed=3).eval()
    out = layer(*(arrays[x].astype(dtype) for x in ("queries", "keys", "values")), arrays["lens"])
    got = {"out": out, **{"d" + name: g for name, g in layer.backward(arrays["G"].astype(dtype)).items()}}

    def run(t):
        module = textbook(layer, bias, heads, kv_heads, t)
        o = module(t["queries"], t["keys"], t["values"], t["lens"])
        named = {"queries": t["queries"], "keys": t["keys"], "values": t["values"]}
        named.update({name: getattr(module, name).weight for name in PARAMS})
        if bias:
            named.update({"b_" + name[-1]: getattr(module, name).bias for name in PARAMS})
        return {"out": o, **{"d" + x: g for x, g in grads((o * t["G"]).sum(), named).items()}}

    refs = torch_both(run, arrays, requires_grad=("queries", "keys", "values"))
    assert set(got) == set(refs)
    for name, (r32, r64) in refs.items():
        assert got[name].dtype == dtype
        assert_within_budget(got[name], r32, r64, name)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("bias, heads, kv_heads, lens", [(False, 4, 4, None), (True, 6, 2, "query"), (False, 4, 1, "batch")])
def test_attention_weights_are_the_textbooks(rng, bias, heads, kv_heads, lens, dtype):
    # d2l's module keeps its heads' weights in attention.attention_weights, (B * heads, n, m).
    B, n, m, D = 2, 5, 9, 24
    arrays = {"queries": f32(rng, B, n, 3), "keys": f32(rng, B, m, 4), "values": f32(rng, B, m, 6),
              "lens": draw_lens(rng, lens, B, n, m)}
    layer = attn.MultiHeadAttention(D, heads, 0.5, bias=bias, num_kv_heads=kv_heads, seed=1)
    assert layer.attention_weights is None
    layer(*(arrays[x].astype(dtype) for x in ("queries", "keys", "values")), arrays["lens"])  # training: dropout on
    got = layer.attention_weights
    assert got.shape == (B, heads, n, m) and got.dtype == dtype
    assert layer.attention_weights is got  # formed once a call
    t = {x: torch.from_numpy(a.astype(np.float64)) for x, a in arrays.items() if x != "lens"}
    t["lens"] = None if arrays["lens"] is None else torch.from_numpy(arrays["lens"])
    module = textbook(layer, bias, heads, kv_heads, t)
    with torch.no_grad():
        module(t["queries"], t["keys"], t["values"], t["lens"])
    want = module.attention.attention_weights.reshape(B, heads, n, m).numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 if dtype == np.float32 else 1e-13)
    if arrays["lens"] is not None:  # the call's lengths, even changed in place before the weights are read
        layer(*(arrays[x].astype(dtype) for x in ("queries", "keys", "values")), arrays["lens"])
        arrays["lens"][...] = m
        np.testing.assert_allclose(layer.attention_weights, want, rtol=0, atol=2e-6 if dtype == np.float32 else 1e-13)
    layer(arrays["queries"][:1], arrays["keys"][:1], arrays["values"][:1])  # a new call, new weights
    assert layer.attention_weights.shape == (1, heads, n, m)


def test_attention_weights_under_causal_and_float16(rng):
    layer = attn.MultiHeadAttention(8, 2, 0.0, query_size=3, key_size=3, value_size=3, dtype="float64").eval()
    x = rng.standard_normal((1, 6, 3))
    layer(x, x, x, causal=True)
    w = layer.attention_weights
    Q = (x @ layer.W_q.T).reshape(1, 6, 2, 4).transpose(0, 2, 1, 3)
    K = (x @ layer.W_k.T).reshape(1, 6, 2, 4).transpose(0, 2, 1, 3)
    scores = np.where(np.tril(np.ones((6, 6), bool)), Q @ K.transpose(0, 1, 3, 2) / 2.0, -np.inf)
    want = np.exp(scores - scores.max(-1, keepdims=True))
    np.testing.assert_allclose(w, want / want.sum(-1, keepdims=True), rtol=0, atol=1e-14)
    layer(x.astype(np.float16), x.astype(np.float16), x.astype(np.float16))
    assert layer.attention_weights.dtype == np.float16 and layer.attention_weights.shape == (1, 2, 6, 6)
    np.testing.assert_allclose(layer.attention_weights.sum(-1), 1, atol=1e-2)


def test_sizes_from_the_first_call_or_the_constructor(rng):
    layer = attn.MultiHeadAttention(12, 3, 0.0, bias=True)
    assert layer.W_q is None
    layer(f32(rng, 1, 2, 5), f32(rng, 1, 3, 4), f32(rng, 1, 3, 7))
    assert layer.W_q.shape == (12, 5) and layer.W_k.shape == (12, 4) and layer.W_v.shape == (12, 7)
    assert layer.W_o.shape == (12, 12) and layer.b_k.shape == (12,)
    sized = attn.MultiHeadAttention(12, 3, 0.0, num_kv_heads=1, query_size=5, key_size=4, value_size=7)
    assert sized.W_k.shape == (4, 4) and sized.b_q is None
    assert np.all(np.abs(sized.W_q) <= 1 / np.sqrt(5))
    # The same seed, the same weights.
    again = attn.MultiHeadAttention(12, 3, 0.0, num_kv_heads=1, query_size=5, key_size=4, value_size=7)
    np.testing.assert_array_equal(again.W_o, sized.W_o)


def test_parameters_are_assignable_and_updated_in_place(rng):
    layer = attn.MultiHeadAttention(8, 2, 0.0, query_size=3, key_size=3, value_size=3).eval()
    x = f32(rng, 2, 4, 3)
    before = layer(x, x, x)
    layer.W_o = np.zeros((8, 8), np.float32)
    np.testing.assert_array_equal(layer(x, x, x), 0)
    layer.W_o = np.eye(8, dtype=np.float32)
    g = layer.backward(np.ones((2, 4, 8), np.float32))
    layer.W_q -= 0.1 * g["W_q"]  # in place: the layer sees it
    assert not np.array_equal(layer(x, x, x), before)
    with pytest.raises(ValueError, match="W_k has shape \\(3,3\\) but must be \\(8,3\\)"):
        layer.W_k = np.zeros((3, 3), np.float32)
    with pytest.raises(ValueError, match="b_q does not exist: the layer was built with bias=False"):
        layer.b_q = np.zeros(8, np.float32)


def test_backward_differentiates_the_values_the_call_saw(rng):
    # Copies, not references: the backward also reads the projections the call saved, so an input or
    # a parameter changed in place before it must not reach it (it once mixed old and new values).
    q, k, v, G = (rng.standard_normal(s) for s in ((1, 3, 4), (1, 5, 3), (1, 5, 2), (1, 3, 6)))
    layer = attn.MultiHeadAttention(6, 2, 0.0, query_size=4, key_size=3, value_size=2, dtype="float64").eval()
    layer(q, k, v)
    want = layer.backward(G)
    keys = k.copy()
    layer(q, keys, v)
    keys *= 2
    layer.W_k *= 3
    got = layer.backward(G)
    layer.W_k /= 3
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-12, err_msg=name)


def test_dropout_in_training_mode_only(rng):
    layer = attn.MultiHeadAttention(8, 2, 0.5, query_size=3, key_size=3, value_size=3)
    x = f32(rng, 1, 6, 3)
    a, b = layer(x, x, x), layer(x, x, x)  # the seed advances: two masks
    assert not np.array_equal(a, b)
    layer.eval()
    np.testing.assert_array_equal(layer(x, x, x), layer(x, x, x))


def test_causal_and_window_reach_every_head(rng):
    layer = attn.MultiHeadAttention(8, 2, 0.0, query_size=3, key_size=3, value_size=3).eval()
    x = f32(rng, 1, 6, 3)
    full = layer(x, x, x)
    causal = layer(x, x, x, causal=True)
    np.testing.assert_allclose(causal[:, -1], full[:, -1], rtol=1e-5, atol=1e-6)  # the last query sees every key
    assert not np.allclose(causal[:, 0], full[:, 0])
    one = layer(x, x, x, window=(0, 0))  # each query attends only itself
    x2 = x.copy()
    x2[:, 3] += 1  # changes query/key/value 3 only
    np.testing.assert_array_equal(layer(x2, x2, x2, window=(0, 0))[:, :3], one[:, :3])


def test_errors_name_the_argument(rng):
    with pytest.raises(ValueError, match="num_heads is 5; it must divide num_hiddens = 12"):
        attn.MultiHeadAttention(12, 5, 0.0)
    with pytest.raises(ValueError, match="num_kv_heads is 4; it must divide num_heads = 6"):
        attn.MultiHeadAttention(12, 6, 0.0, num_kv_heads=4)
    with pytest.raises(TypeError, match="query_size, key_size and value_size are given together"):
        attn.MultiHeadAttention(12, 3, 0.0, query_size=4)
    layer = attn.MultiHeadAttention(12, 3, 0.0, query_size=4, key_size=4, value_size=4)
    with pytest.raises(RuntimeError, match="has not been called yet"):
        layer.backward(np.zeros((1, 2, 12), np.float32))
    # An argument of other features than the layer's sizes is named, not the weight matrix it meets.
    with pytest.raises(ValueError, match="queries has shape \\(1,2,5\\), 5 features, but the layer was sized for 4"):
        layer(f32(rng, 1, 2, 5), f32(rng, 1, 3, 4), f32(rng, 1, 3, 4))
    with pytest.raises(ValueError, match="values has shape \\(1,3,7\\), 7 features, but the layer was sized for 4"):
        layer(f32(rng, 1, 2, 4), f32(rng, 1, 3, 4), f32(rng, 1, 3, 7))
    with pytest.raises(ValueError, match="queries, keys and values must be 3-D"):
        layer(f32(rng, 1, 1, 2, 4), f32(rng, 1, 3, 4), f32(rng, 1, 3, 4))
