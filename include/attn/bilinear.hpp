// Bilinear (multiplicative, Luong "general") attention: a(q, k) = q^T W k, the q^T M k that the d2l chapter
// names for queries and keys of different sizes; then masked softmax, dropout and a weighted average.
//
//   queries (B, n, q) or (B, H, n, q)     keys (B, m, k) / (B, H, m, k)
//   values  (B, m, v) / (B, H, m, v)      out  (B, n, v) / (B, H, n, v)
//   weights (B, n, m) / (B, H, n, m)      before dropout, only written when given
//   W (q, k)                              shared by all heads
// Masks and empty rows: attn/mask.hpp.
#pragma once

#include "attn/dropout.hpp"
#include "attn/mask.hpp"
#include "attn/tensor.hpp"

namespace attn {

/// out (B, n, v) = bilinear attention: scores q_i^T W k_j with w (q, k), masked softmax, dropout,
/// times values (B, m, v); weights (B, n, m) when not empty.
template <class T>
void bilinear_attention_forward(TensorView<T> out, TensorView<T> weights, TensorView<const T> queries,
                                TensorView<const T> keys, TensorView<const T> values, TensorView<const T> w,
                                const Mask<T>& mask = {}, const Dropout& dropout = {});

// Gradients of queries, keys, values (each may be empty when not needed) and of W (required).
template <class T>
void bilinear_attention_backward(TensorView<T> dqueries, TensorView<T> dkeys, TensorView<T> dvalues, TensorView<T> dw,
                                 TensorView<const T> dout, TensorView<const T> queries, TensorView<const T> keys,
                                 TensorView<const T> values, TensorView<const T> w, const Mask<T>& mask = {},
                                 const Dropout& dropout = {});

}  // namespace attn
