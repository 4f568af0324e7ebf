"""Bad arguments: every function and layer raises ValueError (shapes, values) or TypeError (types,
dtypes), and the message starts with the Python function and names the Python argument. The checks
themselves are attn's C++ ones; these tests pin how their messages reach Python."""
import re

import numpy as np
import pytest

import attn

f32 = lambda *shape: np.ones(shape, np.float32)
X = f32(2, 3, 4)
Q, K, V = f32(2, 1, 2), f32(2, 10, 2), f32(2, 10, 4)
x1 = np.linspace(0, 1, 5)

# (what is called, the exception, a pattern of its message)
CASES = {
    # masked_softmax
    "X 2-D": (lambda: attn.masked_softmax(f32(2, 3)), ValueError,
              r"^masked_softmax: X has shape \(2,3\); it must have 3 to 4 dimensions"),
    "X 5-D": (lambda: attn.masked_softmax(f32(1, 1, 1, 2, 3)), ValueError, r"^masked_softmax: X has shape \(1,1,1,2,3\) with 5"),
    "X int": (lambda: attn.masked_softmax(np.ones((2, 3, 4), np.int64)), TypeError, r"^masked_softmax: X has dtype int64"),
    "X str": (lambda: attn.masked_softmax("scores"), TypeError, r"^masked_softmax: X must be an array .*got str"),
    "X None": (lambda: attn.masked_softmax(None), TypeError, r"^masked_softmax: X is required"),
    "valid_lens too long": (lambda: attn.masked_softmax(X, np.array([5, 1])), ValueError,
                            r"^masked_softmax: valid_lens\[0\] is 5; valid lengths must lie in \[0, m\] = \[0, 4\]"),
    "valid_lens negative": (lambda: attn.masked_softmax(X, np.array([[1, 1, 1], [1, -1, 1]])), ValueError,
                            r"valid_lens\[1,1\] is -1"),
    "valid_lens shape": (lambda: attn.masked_softmax(X, np.array([1, 2, 3])), ValueError,
                         r"^masked_softmax: valid_lens has shape \(3,\); it must be \(B,\) = \(2,\) or \(B, n\)"),
    "valid_lens float": (lambda: attn.masked_softmax(X, np.array([1.0, 2.0])), TypeError, r"valid_lens has dtype float64; valid lengths are integers"),
    "mask int": (lambda: attn.masked_softmax(X, mask=np.ones((3, 4), np.int32)), TypeError, r"mask has dtype int32; a mask is bool .* or float"),
    "mask dtype": (lambda: attn.masked_softmax(X, mask=np.zeros((3, 4))), TypeError,
                   r"mask has dtype float64 but X has float32; a float mask"),
    "mask shape": (lambda: attn.masked_softmax(X, mask=np.ones((3, 5), bool)), ValueError,
                   r"^masked_softmax: mask has shape \(3,5\) which does not broadcast to the scores' shape \(2,3,4\)"),
    "additive mask shape": (lambda: attn.masked_softmax(X, mask=f32(5)), ValueError, r"^masked_softmax: mask \(a float mask\) has shape \(5,\)"),
    "causal str": (lambda: attn.masked_softmax(X, causal="upper"), ValueError, r"causal is \"upper\""),
    "causal int": (lambda: attn.masked_softmax(X, causal=2), TypeError, r"causal must be a bool"),
    "masked_fill": (lambda: attn.masked_softmax(X, masked_fill="zero"), ValueError, r"masked_fill is \"zero\""),
    # bmm
    "bmm inner": (lambda: attn.bmm(f32(2, 3, 4), f32(2, 5, 6)), ValueError, r"^bmm: a has shape \(2,3,4\) and b has shape \(2,5,6\); the inner dimensions 4 and 5 must match"),
    "bmm batch": (lambda: attn.bmm(f32(2, 3, 4), f32(3, 4, 6)), ValueError, r"^bmm: .*their batch dimensions must match"),
    "bmm dtype": (lambda: attn.bmm(f32(2, 3, 4), np.ones((2, 4, 6))), TypeError, r"^bmm: b has dtype float64 but a has float32"),
    "bmm rank": (lambda: attn.bmm(f32(3, 4), f32(4, 6)), ValueError, r"^bmm: a has shape \(3,4\); it must have 3 to 4"),
    "bmm ranks": (lambda: attn.bmm(f32(2, 3, 4), f32(2, 1, 4, 6)), ValueError,
                  r"^bmm: b has shape \(2,1,4,6\) with 4 dimensions but a has 3; all tensors"),
    # scaled_dot_product_attention
    "sdpa k": (lambda: attn.scaled_dot_product_attention(Q, f32(2, 10, 3), V), ValueError,
               r"^scaled_dot_product_attention: k \(keys\) has shape \(2,10,3\) but must be \(2,10,2\)"),
    "sdpa v": (lambda: attn.scaled_dot_product_attention(Q, K, f32(2, 9, 4)), ValueError, r"v \(values\) has shape \(2,9,4\) but must be \(2,10,4\)"),
    "sdpa q rank": (lambda: attn.scaled_dot_product_attention(f32(1, 2), K, V), ValueError, r"q \(queries\) has shape \(1,2\)"),
    "sdpa ranks": (lambda: attn.scaled_dot_product_attention(Q, f32(2, 1, 10, 2), V), ValueError,
                   r"k \(keys\) has shape \(2,1,10,2\) with 4 dimensions but queries has 3"),
    "sdpa dtype": (lambda: attn.scaled_dot_product_attention(Q, K, V.astype(np.float64)), TypeError, r"v has dtype float64 but q has float32"),
    "sdpa d = 0": (lambda: attn.scaled_dot_product_attention(f32(2, 1, 0), f32(2, 10, 0), V), ValueError,
                   r"q \(queries\) has shape \(2,1,0\) with d = 0; the default scale"),
    "sdpa scale": (lambda: attn.scaled_dot_product_attention(Q, K, V, scale=float("inf")), ValueError, r"scale is inf; it must be finite"),
    "sdpa scale type": (lambda: attn.scaled_dot_product_attention(Q, K, V, scale="1"), TypeError, r"scale must be a number; got str"),
    "sdpa dropout_p": (lambda: attn.scaled_dot_product_attention(Q, K, V, dropout_p=1.0), ValueError,
                       r"^scaled_dot_product_attention: dropout_p is 1; it must lie in \[0, 1\)"),
    "sdpa seed": (lambda: attn.scaled_dot_product_attention(Q, K, V, seed=-1), ValueError, r"seed is -1; it must lie in \[0, 2\*\*64\)"),
    "sdpa seed type": (lambda: attn.scaled_dot_product_attention(Q, K, V, seed=1.5), TypeError, r"seed must be an integer; got float"),
    "sdpa valid_lens": (lambda: attn.scaled_dot_product_attention(Q, K, V, np.array([2, 11])), ValueError, r"valid_lens\[1\] is 11"),
    # nadaraya_watson
    "nw kernel": (lambda: attn.nadaraya_watson(x1, x1, x1, kernel="triangle"), ValueError,
                  r"^nadaraya_watson: kernel: unknown kernel \"triangle\"; the known kernels are gaussian, boxcar, epanechnikov, constant"),
    "nw kernel type": (lambda: attn.nadaraya_watson(x1, x1, x1, kernel=1), TypeError, r"kernel must be a str"),
    "nw width": (lambda: attn.nadaraya_watson(x1, x1, x1, width=0), ValueError, r"^nadaraya_watson: width is 0; it must be positive and finite$"),
    # A width that float32 cannot hold is named as given, not as the 0 or inf it would become.
    "nw width underflows": (lambda: attn.nadaraya_watson(*(x1.astype(np.float32),) * 3, width=1e-50), ValueError,
                            r"^nadaraya_watson: width is 1e-50, which is 0\.0 in float32, the dtype the call computes in; it must be positive"),
    "nw width overflows": (lambda: attn.nadaraya_watson(*(x1.astype(np.float32),) * 3, width=1e300), ValueError,
                           r"^nadaraya_watson: width is 1e\+300, which is inf in float32"),
    "nw y_train": (lambda: attn.nadaraya_watson(x1, x1[:4], x1), ValueError,
                   r"^nadaraya_watson: y_train \(values\) has shape \(1,4,1\) but must be \(1,5,1\).*y_train \(4,\) is passed to attn as \(1,4,1\)"),
    "nw features": (lambda: attn.nadaraya_watson(np.ones((5, 2)), x1, np.ones((3, 3))), ValueError, r"x_train \(keys\) has shape \(1,5,2\) but must be \(1,5,3\)"),
    "nw dtype": (lambda: attn.nadaraya_watson(x1, x1.astype(np.float32), x1), TypeError, r"y_train has dtype float32 but x_train has float64"),
    # DotProductAttention
    "dot dropout": (lambda: attn.DotProductAttention(1.0), ValueError, r"^DotProductAttention: dropout is 1; it must lie in \[0, 1\)"),
    "dot dropout type": (lambda: attn.DotProductAttention("0.5"), TypeError, r"^DotProductAttention: dropout must be a number"),
    "dot keys": (lambda: attn.DotProductAttention(0.1)(Q, f32(2, 10, 3), V), ValueError, r"^DotProductAttention: keys has shape \(2,10,3\) but must be \(2,10,2\)"),
    "dot valid_lens": (lambda: attn.DotProductAttention(0.1)(Q, K, V, np.array([1])), ValueError, r"^DotProductAttention: valid_lens has shape \(1,\)"),
    "dot seed": (lambda: setattr(attn.DotProductAttention(0.1), "seed", -2), ValueError, r"seed is -2"),
    "dot set dropout": (lambda: setattr(attn.DotProductAttention(0.1), "dropout", -0.5), ValueError, r"dropout is -0.5"),
    # AdditiveAttention
    "additive float16 with float32": (lambda: attn.AdditiveAttention(2, 2, 4, 0.0)(Q.astype(np.float16), K, V), TypeError,
                                      r"^AdditiveAttention: keys has dtype float32 but queries has float16; the arrays of one call"),
    "add key_size": (lambda: attn.AdditiveAttention(0, 20, 8, 0.1), ValueError, r"^AdditiveAttention: key_size is 0; it must be at least 1"),
    "add num_hiddens": (lambda: attn.AdditiveAttention(2, 20, -1, 0.1), ValueError, r"^AdditiveAttention: num_hiddens is -1"),
    "add size type": (lambda: attn.AdditiveAttention(2.5, 20, 8, 0.1), TypeError, r"key_size must be an integer; got float"),
    "add dtype": (lambda: attn.AdditiveAttention(2, 20, 8, 0.1, dtype=np.int32), TypeError, r"dtype is int32; the parameters are float32 or float64"),
    "add queries": (lambda: attn.AdditiveAttention(2, 20, 8, 0.1)(f32(2, 1, 5), K, V), ValueError,
                    r"^AdditiveAttention: W_q has shape \(8,20\) but must be \(8,5\): W_q is \(h, q\) with q = 5, the last dimension of queries"),
    "add set W_q": (lambda: setattr(attn.AdditiveAttention(2, 20, 8, 0.1), "W_q", f32(8, 2)), ValueError,
                    r"^AdditiveAttention: W_q has shape \(8,2\) but must be \(num_hiddens, query_size\) = \(8,20\)"),
    "add set w_v type": (lambda: setattr(attn.AdditiveAttention(2, 20, 8, 0.1), "w_v", "ones"), TypeError, r"w_v must be an array"),
    # show_heatmaps
    "heatmap path": (lambda: attn.show_heatmaps(f32(2, 3)), TypeError, r"^show_heatmaps: path is required"),
    "heatmap extension": (lambda: attn.show_heatmaps(f32(2, 3), path="w.txt"), ValueError,
                          r'^show_heatmaps: path "w.txt": cannot tell the picture format from the extension ".txt"'),
    "heatmap directory": (lambda: attn.show_heatmaps(f32(2, 3), path="/no/such/dir/w.svg"), ValueError,
                          r'^show_heatmaps: path "/no/such/dir/w.svg": cannot open for writing'),
    "heatmap cmap": (lambda: attn.show_heatmaps(f32(2, 3), path="w.svg", cmap="jet"), ValueError,
                     r'^show_heatmaps: cmap: unknown colormap "jet"; known: Reds'),
    "heatmap titles": (lambda: attn.show_heatmaps(f32(2, 2, 3), titles=["a", "b", "c"], path="w.svg"), ValueError,
                       r"^show_heatmaps: 3 titles for a grid of 1 x 2 heatmaps"),
    "heatmap titles type": (lambda: attn.show_heatmaps(f32(2, 3), titles="a", path="w.svg"), TypeError, r"titles must be a list of str"),
    "heatmap rank": (lambda: attn.show_heatmaps(f32(3), path="w.svg"), ValueError,
                     r"^show_heatmaps: matrices has shape \(3,\) with 1 dimensions; it must be \(rows, cols, n, m\)"),
    "heatmap empty": (lambda: attn.show_heatmaps(f32(2, 0), path="w.svg"), ValueError, r"matrices has shape \(2,0\): there is nothing to draw"),
    # more kinds of the README's catalogue of bad input ("Bad input: what each interface says")
    "X complex": (lambda: attn.masked_softmax(X.astype(np.complex64)), TypeError, r"^masked_softmax: X has dtype complex64; this function takes float16, float32 or float64"),
    "valid_lens huge": (lambda: attn.masked_softmax(X, np.array([2**40, 1])), ValueError, r"valid_lens\[0\] is 1099511627776; valid lengths must lie in \[0, m\] = \[0, 4\]"),
    "bmm None": (lambda: attn.bmm(None, X), TypeError, r"^bmm: a is required; got None"),
    "sdpa batch": (lambda: attn.scaled_dot_product_attention(Q, f32(3, 10, 2), f32(3, 10, 4)), ValueError,
                   r"^scaled_dot_product_attention: k \(keys\) has shape \(3,10,2\) but must be \(2,10,2\): keys must have the batch size"),
    "sdpa valid_lens negative": (lambda: attn.scaled_dot_product_attention(Q, K, V, np.array([-1, 2])), ValueError,
                                 r"^scaled_dot_product_attention: valid_lens\[0\] is -1; valid lengths must lie in \[0, m\] = \[0, 10\]"),
    "sdpa dropout_p negative": (lambda: attn.scaled_dot_product_attention(Q, K, V, dropout_p=-0.1), ValueError, r"dropout_p is -0.1; it must lie in \[0, 1\)"),
    "sdpa dropout_p nan": (lambda: attn.scaled_dot_product_attention(Q, K, V, dropout_p=float("nan")), ValueError, r"dropout_p is nan; it must lie in \[0, 1\)"),
    "valid_lens uint64 max": (lambda: attn.scaled_dot_product_attention(Q, K, V, np.array([2**64 - 1, 1], np.uint64)), ValueError,
                              r"^scaled_dot_product_attention: valid_lens holds 18446744073709551615; valid lengths must lie in \[0, m\]"),
    "kv seq once named": (lambda: attn.KVCache(1, 1, 4).keys(3), ValueError, r"^KVCache\.keys: seq is 3; the cache holds sequences 0 to 0"),
    "sdpa seed 2**64": (lambda: attn.scaled_dot_product_attention(Q, K, V, seed=2**64), ValueError, r"seed is 18446744073709551616; it must lie in \[0, 2\*\*64\)"),
    "sdpa alibi nan": (lambda: attn.scaled_dot_product_attention(Q, K, V, alibi_slopes=np.array([np.nan], np.float32)), ValueError,
                       r"alibi_slopes holds nan for batch 0, head 0; every slope must be finite"),
    "sdpa segment_ids n != m": (lambda: attn.scaled_dot_product_attention(Q, K, V, segment_ids=np.zeros((2, 1), np.int64)), ValueError,
                                r"segment_ids of the queries are given without those of the keys, but n = 1 != m = 10"),
    "sdpa causal": (lambda: attn.scaled_dot_product_attention(Q, K, V, causal="diagonal"), ValueError,
                    r'causal is "diagonal"; it must be True or False, "top_left" or "bottom_right"'),
    "nw width nan": (lambda: attn.nadaraya_watson(x1, x1, x1, width=float("nan")), ValueError, r"^nadaraya_watson: width is nan; it must be positive and finite$"),
    "select_width one point": (lambda: attn.select_width(x1[:1], x1[:1]), ValueError,
                               r"^select_width: x has shape \(1,1,1\) with N = 1 point\(s\) per group; leave-one-out needs at least 2"),
    "select_width kernel": (lambda: attn.select_width(x1, x1, kernel="triangle"), ValueError, r'^select_width: kernel: unknown kernel "triangle"'),
    "select_width y_train": (lambda: attn.select_width(x1, x1[:4]), ValueError, r"^select_width: y has shape \(1,4,1\) but must be \(1,5,1\)"),
    "add dropout": (lambda: attn.AdditiveAttention(2, 20, 8, 1.0), ValueError, r"^AdditiveAttention: dropout is 1; it must lie in \[0, 1\)"),
    "add valid_lens": (lambda: attn.AdditiveAttention(2, 20, 8, 0.1)(f32(2, 1, 20), K, V, np.array([2, 11])), ValueError,
                       r"^AdditiveAttention: valid_lens\[1\] is 11; valid lengths must lie in \[0, m\] = \[0, 10\]"),
    "add set W_k hidden": (lambda: setattr(attn.AdditiveAttention(2, 20, 8, 0.1), "W_k", f32(7, 2)), ValueError,
                           r"^AdditiveAttention: W_k has shape \(7,2\) but must be \(num_hiddens, key_size\) = \(8,2\)"),
    "mha dropout": (lambda: attn.MultiHeadAttention(12, 4, 1.5), ValueError, r"^MultiHeadAttention: dropout is 1.5; it must lie in \[0, 1\)"),
    "kv batch 0": (lambda: attn.KVCache(0, 2, 32), ValueError, r"^KVCache: .*batch 0, kv_heads 2 and head_dim 32 must all be at least 1"),
    "kv block_size 0": (lambda: attn.KVCache(1, 2, 32, block_size=0), ValueError, r"^KVCache: .*block_size is 0; it must be at least 1"),
    "kv attend seq": (lambda: attn.KVCache(2, 2, 32).attend(f32(2, 1, 32), seq=5), ValueError,
                      r"^KVCache\.attend: .*seq is 5; the cache holds sequences 0 to 1"),
    # An empty list reads as integers (NumPy makes it float64): the shape is what is wrong.
    "kv attend_batch []": (lambda: attn.KVCache(1, 2, 32).attend_batch(f32(0, 2, 32), []), ValueError,
                           r"^KVCache\.attend_batch: cu_seqlens_q has shape \(0,\); it must be \(B \+ 1,\)"),
    "valid_lens []": (lambda: attn.masked_softmax(X, valid_lens=[]), ValueError, r"^masked_softmax: valid_lens has shape \(0,\)"),
    "kv reset seq": (lambda: attn.KVCache(1, 2, 32).reset(4), ValueError, r"^KVCache\.reset: .*seq is 4; the cache holds sequences 0 to 0"),
    "kv int8 nan": (lambda: attn.KVCache(1, 2, 32, dtype="int8").append(np.full((1, 2, 3, 32), np.nan, np.float32), f32(1, 2, 3, 32)),
                    ValueError, r"^KVCache\.append: .*an int8 cache stores finite values only; sequence 0 was given a non-finite one"),
    "plot extension": (lambda: attn.plot("p.pdf", {"a": ([0, 1], [0, 1])}), ValueError,
                       r'^plot: path "p.pdf": cannot tell the picture format from the extension ".pdf"; use .svg or .png'),
    "set_simd_target": (lambda: attn.set_simd_target("avx9"), ValueError,
                        r'^set_simd_target: target "avx9" is not one this build and CPU can run; they are: .*scalar'),
    "set_num_threads": (lambda: attn.set_num_threads(-1), ValueError, r"^set_num_threads: threads is -1; it must be 0 \(default\) or positive"),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_argument(case):
    call, exception, pattern = CASES[case]
    with pytest.raises(exception) as info:
        call()
    assert re.search(pattern, str(info.value)), f"{case}: the message was {str(info.value)!r}"


def test_backward_errors():
    attention = attn.DotProductAttention(0.0)
    with pytest.raises(RuntimeError, match=r"^DotProductAttention.backward: the layer has not been called yet"):
        attention.backward(f32(2, 1, 4))
    attention(Q, K, V)
    with pytest.raises(ValueError, match=r"^DotProductAttention.backward: grad_out has shape \(2,1,3\) but must be \(2,1,4\)"):
        attention.backward(f32(2, 1, 3))
    with pytest.raises(TypeError, match=r"grad_out has dtype float64 but the inputs of the last call have float32"):
        attention.backward(np.ones((2, 1, 4)))
    additive = attn.AdditiveAttention(2, 2, 3, 0.0)
    additive(Q, K, V)
    with pytest.raises(ValueError, match=r"^AdditiveAttention.backward: grad_out has shape \(1,1,4\)"):
        additive.backward(f32(1, 1, 4))


def test_a_failed_call_changes_nothing():
    attention = attn.DotProductAttention(0.5, seed=3)
    attention(Q, K, V)
    weights = attention.attention_weights
    with pytest.raises(ValueError):
        attention(Q, f32(2, 10, 3), V)
    assert attention.attention_weights is weights and attention.seed == 4
    assert attention.backward(f32(2, 1, 4))["values"].shape == V.shape

