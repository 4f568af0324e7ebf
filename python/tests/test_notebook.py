"""The d2l chapter's notebook cells, run with attn as the d2l chapter runs them with torch, and checked
against the d2l chapter's own code on the same inputs and against the values the cells are known to
give.
examples/d2l_notebook.py runs the same cells and prints them."""

import numpy as np

import attn
import d2l_torch
from helpers import assert_within_budget, torch, torch_both

# The d2l chapter's shared inputs: keys = torch.ones((2, 10, 2)),
# values = torch.arange(40, dtype=torch.float32).reshape(1, 10, 4).repeat(2, 1, 1), valid_lens = [2, 6].
KEYS = np.ones((2, 10, 2), np.float32)
VALUES = np.tile(np.arange(40, dtype=np.float32).reshape(1, 10, 4), (2, 1, 1))
VALID_LENS = np.array([2, 6])
# Equal keys: each valid key weighs the same, 1/2 of the first 2 and 1/6 of the first 6; the outputs
# are the means of those value rows.
EXPECTED_OUT = np.array([[[2, 3, 4, 5]], [[10, 11, 12, 13]]], np.float32)
EXPECTED_WEIGHTS = np.array([[[0.5] * 2 + [0] * 8], [[1 / 6] * 6 + [0] * 4]])


def test_masked_softmax_cells(rng):
    # masked_softmax(torch.rand(2, 2, 4), torch.tensor([2, 3]))
    # masked_softmax(torch.rand(2, 2, 4), torch.tensor([[1, 3], [2, 4]]))
    for lens in (np.array([2, 3]), np.array([[1, 3], [2, 4]])):
        X = rng.random((2, 2, 4)).astype(np.float32)
        weights = attn.masked_softmax(X, lens)
        refs = torch_both(lambda t: {"w": d2l_torch.masked_softmax(t["X"] * 1, t["lens"])}, {"X": X, "lens": lens})
        assert_within_budget(weights, *refs["w"], f"lens {lens.tolist()}")
        per_row = np.broadcast_to(lens if lens.ndim == 2 else lens[:, None], (2, 2))
        for b, i in np.ndindex(2, 2):
            assert np.all(weights[b, i, per_row[b, i]:] == 0)
            assert abs(weights[b, i].sum() - 1) < 1e-6


def test_bmm_cell():
    # Q = d2l.ones((2, 3, 4)); K = d2l.ones((2, 4, 6)); torch.bmm(Q, K)  # Result: (2, 3, 6)
    out = attn.bmm(np.ones((2, 3, 4), np.float32), np.ones((2, 4, 6), np.float32))
    assert out.shape == (2, 3, 6) and np.all(out == 4)


def test_additive_attention_cell(rng):
    queries = rng.standard_normal((2, 1, 20)).astype(np.float32)  # torch.normal(0, 1, (2, 1, 20))
    attention = attn.AdditiveAttention(key_size=2, query_size=20, num_hiddens=8, dropout=0.1)
    attention.eval()
    out = attention(queries, KEYS, VALUES, VALID_LENS)
    np.testing.assert_allclose(out, EXPECTED_OUT, rtol=1e-6)
    np.testing.assert_allclose(attention.attention_weights, EXPECTED_WEIGHTS, rtol=1e-6)
    # The d2l chapter's module with the same parameters, on the same inputs.
    torch.manual_seed(0)
    module = d2l_torch.AdditiveAttention(key_size=2, query_size=20, num_hiddens=8, dropout=0.1)
    module.eval()
    with torch.no_grad():
        module.W_q.weight.copy_(torch.from_numpy(attention.W_q))
        module.W_k.weight.copy_(torch.from_numpy(attention.W_k))
        module.w_v.weight.copy_(torch.from_numpy(attention.w_v[None, :]))
    ref = module(torch.from_numpy(queries), torch.from_numpy(KEYS), torch.from_numpy(VALUES), torch.from_numpy(VALID_LENS))
    np.testing.assert_allclose(out, ref.detach().numpy(), rtol=1e-6)


def test_dot_product_attention_cells(rng):
    queries = rng.standard_normal((2, 1, 2)).astype(np.float32)  # torch.normal(0, 1, (2, 1, 2))
    attention = attn.DotProductAttention(dropout=0.5)
    attention.eval()
    out = attention(queries, KEYS, VALUES, VALID_LENS)
    np.testing.assert_allclose(out, EXPECTED_OUT, rtol=1e-6)
    np.testing.assert_allclose(attention.attention_weights, EXPECTED_WEIGHTS, rtol=1e-6)
    # The d2l practical guide's variant: keys and values drawn from normal(0, 1); "the attention
    # weights should be zero beyond the valid lengths (2 for the first sequence, 6 for the second)".
    keys = rng.standard_normal((2, 10, 2)).astype(np.float32)
    values = rng.standard_normal((2, 10, 4)).astype(np.float32)
    output = attention(queries, keys, values, VALID_LENS)
    assert output.shape == (2, 1, 4)
    assert np.all(attention.attention_weights[0, :, 2:] == 0) and np.all(attention.attention_weights[1, :, 6:] == 0)
    module = d2l_torch.DotProductAttention(dropout=0.5).eval()
    ref = module(*(torch.from_numpy(a) for a in (queries, keys, values, VALID_LENS)))
    np.testing.assert_allclose(output, ref.numpy(), rtol=1e-5, atol=1e-6)


def test_nadaraya_watson_cell(rng):
    # The d2l chapter: f(x) = sum_i softmax(-1/2 (x - x_i)^2) y_i, on d2l's toy regression. It beats the
    # plain average; the narrower the kernel, the closer the fit follows the training points.
    x_train = np.sort(rng.random(50) * 5)
    y_train = 2 * np.sin(x_train) + x_train**0.8 + rng.normal(0.0, 0.5, 50)
    x_query = np.arange(0, 5, 0.1)
    truth = 2 * np.sin(x_query) + x_query**0.8
    mse = lambda kernel: np.mean((attn.nadaraya_watson(x_train, y_train, x_query, kernel) - truth) ** 2)
    assert mse("gaussian") < mse("constant")  # better than the plain average of the targets
    at_train = {w: attn.nadaraya_watson(x_train, y_train, x_train, width=w) for w in (0.1, 1.0)}
    assert np.mean((at_train[0.1] - y_train) ** 2) < np.mean((at_train[1.0] - y_train) ** 2)
