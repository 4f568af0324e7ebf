"""The d2l chapter's notebook "Attention Scoring Functions", cell by cell, with attn in place of torch.

Run: /usr/bin/python3 examples/d2l_notebook.py [DIR]   (the heatmaps go to DIR, default ".")
NumPy's generator stands in for torch's: random values differ from the d2l chapter's, all else is theirs.
"""
import pathlib
import sys

import numpy as np

import attn

rng = np.random.default_rng(0)
out_dir = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
out_dir.mkdir(parents=True, exist_ok=True)
np.set_printoptions(precision=4, suppress=True)

# Masked softmax: masked_softmax(torch.rand(2, 2, 4), torch.tensor([2, 3]))
print(attn.masked_softmax(rng.random((2, 2, 4), np.float32), np.array([2, 3])))
# One valid length per row: masked_softmax(torch.rand(2, 2, 4), torch.tensor([[1, 3], [2, 4]]))
print(attn.masked_softmax(rng.random((2, 2, 4), np.float32), np.array([[1, 3], [2, 4]])))

# Batch matrix multiplication: torch.bmm(d2l.ones((2, 3, 4)), d2l.ones((2, 4, 6)))  # Result: (2, 3, 6)
Q, K = np.ones((2, 3, 4), np.float32), np.ones((2, 4, 6), np.float32)
print(attn.bmm(Q, K).shape)

# Additive attention: queries of size 20, keys of size 2.
queries, keys = rng.normal(0, 1, (2, 1, 20)).astype(np.float32), np.ones((2, 10, 2), np.float32)
values = np.tile(np.arange(40, dtype=np.float32).reshape(1, 10, 4), (2, 1, 1))
valid_lens = np.array([2, 6])
attention = attn.AdditiveAttention(key_size=2, query_size=20, num_hiddens=8, dropout=0.1)
attention.eval()
print(attention(queries, keys, values, valid_lens))  # [[[2, 3, 4, 5]], [[10, 11, 12, 13]]]
print(attn.show_heatmaps(attention.attention_weights.reshape((1, 1, 2, 10)), xlabel="Keys", ylabel="Queries",
                         path=out_dir / "additive_attention.svg"))

# Scaled dot-product attention on the same keys and values: d = 2.
queries = rng.normal(0, 1, (2, 1, 2)).astype(np.float32)
attention = attn.DotProductAttention(dropout=0.5)
attention.eval()
print(attention(queries, keys, values, valid_lens))  # the same: every valid key scores alike
print(attn.show_heatmaps(attention.attention_weights.reshape((1, 1, 2, 10)), xlabel="Keys", ylabel="Queries",
                         path=out_dir / "dot_product_attention.svg"))

# The d2l practical guide's test: random keys and values; "the attention weights should be zero
# beyond the valid lengths (2 for the first sequence, 6 for the second)".
keys, values = rng.normal(0, 1, (2, 10, 2)).astype(np.float32), rng.normal(0, 1, (2, 10, 4)).astype(np.float32)
output = attention(queries, keys, values, valid_lens)
print(f"Output shape: {output.shape}")  # Should be (2, 1, 4)
print(attention.attention_weights)

# What the d2l chapter leave to autograd: the gradients of sum(output * grad_out), and training mode,
# where dropout drops weights (a new mask each call; the seed decides it).
grads = attention.backward(np.ones_like(output))
print({name: g.shape for name, g in grads.items()})
attention.train()
print(attention(queries, keys, values, valid_lens))

# Nadaraya-Watson regression (the d2l chapter): f(x) = sum_i softmax(-1/2 ((x - x_i) / width)^2) y_i on
# d2l's toy data; narrower kernels follow the noise more closely.
x_train = np.sort(rng.random(50) * 5)
y_train = 2 * np.sin(x_train) + x_train**0.8 + rng.normal(0.0, 0.5, 50)
x_query = np.arange(0, 5, 0.1)
y_truth = 2 * np.sin(x_query) + x_query**0.8
for kernel, width in [("gaussian", 1.0), ("boxcar", 1.0), ("epanechnikov", 1.0), ("constant", 1.0),
                      ("gaussian", 0.1), ("gaussian", 0.5)]:
    y_hat, weights = attn.nadaraya_watson(x_train, y_train, x_query, kernel, width, return_weights=True)
    print(f"{kernel:>12} width {width:3}: MSE {np.mean((y_hat - y_truth) ** 2):.4f}")
# The weights of the last fit (Gaussian, width 0.5), with d2l's labels: (queries, training inputs).
print(attn.show_heatmaps(weights, xlabel="Sorted training inputs", ylabel="Sorted testing inputs",
                         path=out_dir / "nadaraya_watson_weights.svg"))
