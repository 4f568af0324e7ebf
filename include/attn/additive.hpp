// Additive attention (Bahdanau): a(q, k) = w_v^T tanh(W_q q + W_k k), then masked softmax,
// dropout and a weighted average of the values, as the d2l chapter's AdditiveAttention.
//
//   queries (B, n, q) or (B, H, n, q)     keys (B, m, k) / (B, H, m, k)
//   values  (B, m, v) / (B, H, m, v)      out  (B, n, v) / (B, H, n, v)
//   weights (B, n, m) / (B, H, n, m)      before dropout, only written when given
//   W_q (h, q), W_k (h, k), w_v (h,)      nn.Linear's weight layout; shared by all heads
// Queries and keys may have different sizes q and k. Masks and empty rows: attn/mask.hpp.
#pragma once

#include <cstdint>

#include "attn/dropout.hpp"
#include "attn/mask.hpp"
#include "attn/tensor.hpp"

namespace attn {

template <class T>
struct AdditiveParams {
  TensorView<const T> w_q;  // (h, q)
  TensorView<const T> w_k;  // (h, k)
  TensorView<const T> w_v;  // (h,)
};

// Gradients of the parameters, same shapes; written (not accumulated) by the backward.
template <class T>
struct AdditiveGrads {
  TensorView<T> w_q;
  TensorView<T> w_k;
  TensorView<T> w_v;
};

// Owning parameters initialised like PyTorch's nn.Linear default (kaiming_uniform with a = sqrt(5)):
// every weight uniform in [-1/sqrt(fan_in), 1/sqrt(fan_in)], fan_in = q, k and h respectively,
// drawn from a counter-based generator keyed by `seed` (reproducible, not PyTorch's stream).
template <class T>
struct AdditiveWeights {
  Tensor<T> w_q, w_k, w_v;
  /// W_q (h, q), W_k (h, k), w_v (h,) drawn from `seed` as nn.Linear initialises them.
  static AdditiveWeights init(index_t query_size, index_t key_size, index_t hidden_size, std::uint64_t seed);
  /// Views of the three weights, for the forward and backward calls.
  AdditiveParams<T> params() const { return {w_q.view(), w_k.view(), w_v.view()}; }
};

/// out (B, n, v) = additive attention of queries (B, n, q) over keys (B, m, k) and values (B, m, v):
/// scores w_v . tanh(W_q q_i + W_k k_j), masked softmax, dropout; weights (B, n, m) when not empty.
template <class T>
void additive_attention_forward(TensorView<T> out, TensorView<T> weights, TensorView<const T> queries,
                                TensorView<const T> keys, TensorView<const T> values, const AdditiveParams<T>& params,
                                const Mask<T>& mask = {}, const Dropout& dropout = {});

// Gradients of every input and parameter; any of dqueries, dkeys, dvalues may be empty when not
// needed; grads' views must all be given.
template <class T>
void additive_attention_backward(TensorView<T> dqueries, TensorView<T> dkeys, TensorView<T> dvalues,
                                 const AdditiveGrads<T>& grads, TensorView<const T> dout,
                                 TensorView<const T> queries, TensorView<const T> keys, TensorView<const T> values,
                                 const AdditiveParams<T>& params, const Mask<T>& mask = {},
                                 const Dropout& dropout = {});

}  // namespace attn
