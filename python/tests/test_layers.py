"""attn.DotProductAttention and attn.AdditiveAttention against the d2l chapter's nn.Modules: outputs,
attention_weights, and the gradients of every input and parameter from backward(grad_out), on random
shapes and valid lengths; their modes, dropout seeds and parameters."""
import numpy as np
import pytest

import attn
import d2l_torch
from helpers import assert_within_budget, draw_lens, grads, torch, torch_both

DTYPES = [np.float32, np.float64]


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def check(got, refs, what):
    # A gradient's floor is scaled by the call's largest result: where a row has one valid key, the
    # gradients through its softmax are 0 in real arithmetic, attn's float32 dS = P (dP - rowsum(dO O))
    # keeps the roundoff of two equal dot products (as FlashAttention's backward does), while torch's
    # softmax backward, w (g - w g) with w = 1, cancels exactly.
    largest = max(float(np.abs(r64).max()) for _, r64 in refs.values() if np.asarray(r64).size)
    for name, (r32, r64) in refs.items():
        assert_within_budget(got[name], r32, r64, f"{what}: {name}", scale=largest if name.startswith("d") else None)


def attn_results(attention, arrays, dtype):
    """The layer's output, attention_weights and backward(G) gradients on `arrays`, in `dtype`."""
    cast = {k: (a.astype(dtype) if a is not None and a.dtype == np.float32 else a) for k, a in arrays.items()}
    out = attention(cast["queries"], cast["keys"], cast["values"], cast["lens"])
    results = {"out": out, "weights": attention.attention_weights}
    results.update({"d" + name: g for name, g in attention.backward(cast["G"]).items()})
    assert all(r.dtype == dtype for r in results.values())
    return results


def torch_module_results(make_module, arrays, params=()):
    """The same from a d2l module, by autograd on sum(out * G): {name: (float32, float64)}."""
    def run(t):
        module = make_module(t)
        out = module(t["queries"], t["keys"], t["values"], t["lens"])
        named = {"queries": t["queries"], "keys": t["keys"], "values": t["values"]}
        named.update({p: getattr(module, p).weight for p in params})
        g = grads((out * t["G"]).sum(), named)
        if "w_v" in g:
            g["w_v"] = g["w_v"].reshape(-1)  # nn.Linear(h, 1).weight is (1, h); attn's w_v is (h,)
        return {"out": out, "weights": module.attention_weights, **{"d" + n: x for n, x in g.items()}}

    return torch_both(run, arrays, requires_grad=("queries", "keys", "values"))


# ---- DotProductAttention ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lens_kind", [None, "batch", "query", "zero"])
@pytest.mark.parametrize("draw", range(3))
def test_dot_product_attention_matches_the_d2l(rng, draw, lens_kind, dtype):
    B, n, m, d, v = rng.integers(1, 4), *rng.integers(1, 40, size=4)
    lens = draw_lens(rng, "query" if lens_kind == "zero" else lens_kind, B, n, m, zero=lens_kind == "zero")
    arrays = {"queries": f32(rng, B, n, d), "keys": f32(rng, B, m, d), "values": f32(rng, B, m, v), "lens": lens,
              "G": f32(rng, B, n, v)}
    # Rows of valid length 0: the d2l chapter average every key; attn's masked_fill="d2l_minus_1e6" does too.
    fill = "d2l_minus_1e6" if lens_kind == "zero" else "exclude"
    refs = torch_module_results(lambda t: d2l_torch.DotProductAttention(dropout=0.5).eval(), arrays)
    got = attn_results(attn.DotProductAttention(0.5, masked_fill=fill).eval(), arrays, dtype)
    check(got, refs, f"({B},{n},{m},{d},{v}) lens {lens_kind}")


def test_dot_product_attention_with_heads(rng):
    # (B, H, n, d) inputs: as d2l's MultiHeadAttention, which folds the heads into the batch and
    # repeats valid_lens per head.
    B, H, n, m, d, v = 2, 3, 17, 23, 8, 5
    arrays = {"queries": f32(rng, B, H, n, d), "keys": f32(rng, B, H, m, d), "values": f32(rng, B, H, m, v),
              "lens": draw_lens(rng, "batch", B, n, m), "G": f32(rng, B, H, n, v)}
    folded = {k: a.reshape(B * H, *a.shape[2:]) for k, a in arrays.items() if k != "lens"}
    folded["lens"] = np.repeat(arrays["lens"], H)
    refs = torch_module_results(lambda t: d2l_torch.DotProductAttention(0.0), folded)
    got = attn_results(attn.DotProductAttention(0.0), arrays, np.float32)
    check({k: g.reshape(refs[k][0].shape) for k, g in got.items()}, refs, "heads")


class KeptDropout(torch.nn.Module):
    """nn.Dropout(p) that keeps the weights where `kept` is 1: W * kept / (1 - p)."""

    def __init__(self, kept, p):
        super().__init__()
        self.kept, self.p = kept, p

    def forward(self, W):
        return W * self.kept / (1 - self.p)


def test_dot_product_attention_train_mode_drops_weights_and_advances_the_seed(rng):
    B, n, m, d, v, p = 2, 13, 19, 6, 4, 0.4
    q, k, vals, G = f32(rng, B, n, d), f32(rng, B, m, d), f32(rng, B, m, v), f32(rng, B, n, v)
    lens = draw_lens(rng, "batch", B, n, m)
    attention = attn.DotProductAttention(p, seed=100)
    assert attention.training and attention.seed == 100
    # Values = identity: the output is the dropped weights, and shows the mask seed 100 draws.
    dropped = attention(q, k, np.broadcast_to(np.eye(m, dtype=np.float32), (B, m, m)), lens)
    assert attention.seed == 101
    kept = (dropped != 0).astype(np.float32)
    attention.seed = 100
    out = attention(q, k, vals, lens)
    got = {"out": out, "weights": attention.attention_weights,
           **{"d" + name: g for name, g in attention.backward(G).items()}}

    def make(t):
        module = d2l_torch.DotProductAttention(p)
        module.dropout = KeptDropout(t["kept"], p)  # the d2l chapter's nn.Dropout, with attn's mask
        return module

    refs = torch_module_results(make, {"queries": q, "keys": k, "values": vals, "lens": lens, "G": G, "kept": kept})
    check(got, refs, "train mode")
    # eval(): nothing dropped, the seed stays; train() turns dropout back on with the next seed.
    assert attention.eval() is attention and not attention.training
    # The layer keeps its weights (the unfused kernels); the function alone runs the fused ones, which
    # sum in another order: equal to float32 rounding, not bit for bit.
    np.testing.assert_allclose(attention(q, k, vals, lens), attn.scaled_dot_product_attention(q, k, vals, lens),
                               rtol=1e-5, atol=1e-6)
    assert attention.seed == 101
    assert not np.array_equal(attention.train()(q, k, vals, lens), out) and attention.seed == 102


def test_backward_reads_the_arrays_of_the_last_call(rng):
    # References, not copies: an input changed in place changes what backward differentiates; a new
    # call replaces what it reads.
    q, k, v, G = f32(rng, 1, 3, 2), f32(rng, 1, 4, 2), f32(rng, 1, 4, 3), f32(rng, 1, 3, 3)
    attention = attn.DotProductAttention(0.0)
    attention(q, k, v)
    before = attention.backward(G)["queries"]
    v *= 2
    assert np.allclose(attention.backward(G)["queries"], 2 * before)
    attention(q, k, v / 2)
    assert np.allclose(attention.backward(G)["queries"], before)


# ---- AdditiveAttention -----------------------------------------------------------------------------


def torch_additive(t, params):
    """The d2l chapter's AdditiveAttention with the parameters `params` (attn's arrays) in t's dtype."""
    h, q = params["W_q"].shape
    module = d2l_torch.AdditiveAttention(params["W_k"].shape[1], q, h, dropout=0.1).eval()
    with torch.no_grad():
        for name, a in params.items():
            getattr(module, name).weight.copy_(torch.from_numpy(a.reshape(getattr(module, name).weight.shape)))
    return module.to(t["queries"].dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lens_kind", [None, "batch", "query", "zero"])
@pytest.mark.parametrize("draw", range(3))
def test_additive_attention_matches_the_d2l(rng, draw, lens_kind, dtype):
    B, n, m, q, k, h, v = rng.integers(1, 4), *rng.integers(1, 30, size=6)
    lens = draw_lens(rng, "query" if lens_kind == "zero" else lens_kind, B, n, m, zero=lens_kind == "zero")
    arrays = {"queries": f32(rng, B, n, q), "keys": f32(rng, B, m, k), "values": f32(rng, B, m, v), "lens": lens,
              "G": f32(rng, B, n, v)}
    fill = "d2l_minus_1e6" if lens_kind == "zero" else "exclude"
    attention = attn.AdditiveAttention(k, q, h, 0.1, seed=draw, masked_fill=fill).eval()
    params = {name: getattr(attention, name) for name in ("W_q", "W_k", "w_v")}
    refs = torch_module_results(lambda t: torch_additive(t, params), arrays, params=("W_q", "W_k", "w_v"))
    got = attn_results(attention, arrays, dtype)
    check(got, refs, f"({B},{n},{m}) q {q} k {k} h {h} lens {lens_kind}")


def test_additive_attention_train_mode_dropout_gradients(rng):
    B, n, m, q, k, h, v, p = 2, 7, 11, 5, 3, 6, 4, 0.3
    arrays = {"queries": f32(rng, B, n, q), "keys": f32(rng, B, m, k), "values": f32(rng, B, m, v),
              "lens": draw_lens(rng, "query", B, n, m), "G": f32(rng, B, n, v)}
    attention = attn.AdditiveAttention(k, q, h, p, seed=9)
    eye = np.broadcast_to(np.eye(m, dtype=np.float32), (B, m, m))
    arrays["kept"] = (attention(arrays["queries"], arrays["keys"], eye, arrays["lens"]) != 0).astype(np.float32)
    attention.seed = 9  # the call below draws the mask just read off
    params = {name: getattr(attention, name) for name in ("W_q", "W_k", "w_v")}

    def make(t):
        module = torch_additive(t, params)
        module.dropout = KeptDropout(t["kept"], p)
        return module

    refs = torch_module_results(make, arrays, params=("W_q", "W_k", "w_v"))
    check(attn_results(attention, arrays, np.float32), refs, "train mode")


def test_additive_attention_odd_sizes(rng):
    B, n, m, q, k, h, v = 2, 113, 203, 59, 23, 37, 41
    arrays = {"queries": f32(rng, B, n, q), "keys": f32(rng, B, m, k), "values": f32(rng, B, m, v),
              "lens": draw_lens(rng, "batch", B, n, m), "G": f32(rng, B, n, v)}
    attention = attn.AdditiveAttention(k, q, h, 0.0, seed=5)
    params = {name: getattr(attention, name) for name in ("W_q", "W_k", "w_v")}
    refs = torch_module_results(lambda t: torch_additive(t, params), arrays, params=("W_q", "W_k", "w_v"))
    check(attn_results(attention, arrays, np.float32), refs, "odd sizes")


def test_additive_parameters_are_nn_linear_weights():
    attention = attn.AdditiveAttention(key_size=2, query_size=20, num_hiddens=8, dropout=0.1)
    assert attention.W_q.shape == (8, 20) and attention.W_k.shape == (8, 2) and attention.w_v.shape == (8,)
    assert (attention.key_size, attention.query_size, attention.num_hiddens) == (2, 20, 8)
    # nn.Linear's initialisation: uniform in +-1/sqrt(fan_in), fan_in = query_size, key_size, num_hiddens.
    for w, fan_in in ((attention.W_q, 20), (attention.W_k, 2), (attention.w_v, 8)):
        assert w.dtype == np.float32 and np.abs(w).max() <= 1 / np.sqrt(fan_in) and np.abs(w).max() > 0.5 / np.sqrt(fan_in)
    same = attn.AdditiveAttention(2, 20, 8, 0.1)
    assert np.array_equal(same.W_q, attention.W_q)  # the same seed, the same parameters
    assert not np.array_equal(attn.AdditiveAttention(2, 20, 8, 0.1, seed=1).W_q, attention.W_q)
    assert attn.AdditiveAttention(2, 20, 8, 0.1, dtype=np.float64).W_k.dtype == np.float64


def test_additive_parameters_are_writable(rng):
    attention = attn.AdditiveAttention(3, 4, 5, 0.0)
    q, k, v = f32(rng, 1, 2, 4), f32(rng, 1, 6, 3), f32(rng, 1, 6, 2)
    W_q = f32(rng, 5, 4)
    attention.W_q = W_q
    assert attention.W_q is W_q  # kept as given
    first = attention(q, k, v)
    attention.w_v[:] = 0  # in place: all scores 0, the output is the mean of the values
    np.testing.assert_allclose(attention(q, k, v), np.broadcast_to(v.mean(1, keepdims=True), (1, 2, 2)), rtol=1e-6)
    attention.w_v = np.ones(5)  # float64 parameters: converted for a float32 call
    out = attention(q, k, v)
    assert out.dtype == np.float32 and not np.allclose(out, first)
    # An SGD step with the gradients of backward, as on nn.Linear weights: in place on the array the
    # layer holds, and a small step against the gradient of sum(out) lowers it.
    g = attention.backward(np.ones((1, 2, 2), np.float32))
    assert set(g) == {"queries", "keys", "values", "W_q", "W_k", "w_v"}
    assert np.abs(g["W_q"]).max() > 1e-3
    attention.W_q -= 0.1 * g["W_q"]
    assert attention.W_q is W_q
    assert attention(q, k, v).sum() < out.sum()


def test_additive_attention_computes_in_the_dtype_of_its_inputs(rng):
    attention = attn.AdditiveAttention(3, 4, 5, 0.0)
    q, k, v = f32(rng, 1, 2, 4), f32(rng, 1, 6, 3), f32(rng, 1, 6, 2)
    out64 = attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64))
    grads64 = attention.backward(np.ones((1, 2, 2)))
    assert out64.dtype == np.float64 and grads64["W_q"].dtype == np.float64
    np.testing.assert_allclose(attention(q, k, v), out64, rtol=1e-5, atol=1e-6)
    assert attention.W_q.dtype == np.float32  # the parameters keep their dtype


def test_layers_print_like_their_constructors():
    assert repr(attn.DotProductAttention(0.5)) == "DotProductAttention(dropout=0.5)"
    assert repr(attn.AdditiveAttention(2, 20, 8, 0.1)) == "AdditiveAttention(key_size=2, query_size=20, num_hiddens=8, dropout=0.1)"
    assert attn.DotProductAttention(0.5).attention_weights is None  # before the first call
