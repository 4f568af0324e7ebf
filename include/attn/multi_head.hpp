// Multi-head attention, the layer the next d2l chapter builds from scaled dot-product
// attention (d2l's MultiHeadAttention, Vaswani et al. 2017), with grouped key and value heads
// (grouped-query attention; Hk = 1: multi-query attention).
//
//   queries (B, n, q)   keys (B, m, k)   values (B, m, vin)   out (B, n, D), D = num_hiddens
//   Q = queries W_q^T + b_q   (B, n, H dh)     dh = D / H per head
//   K = keys W_k^T + b_k      (B, m, Hk dh)    Hk = num_kv_heads, a divisor of H
//   V = values W_v^T + b_v    (B, m, Hk dh)
//   head h = scaled dot-product attention of Q's columns [h dh, (h + 1) dh) over the columns of key
//            and value head h / (H / Hk) of K and V (scale 1 / sqrt(dh) unless options say otherwise)
//   out = concat(head 0, ..., head H-1) W_o^T + b_o
// W_q (D, q), W_k (Hk dh, k), W_v (Hk dh, vin), W_o (D, D): nn.Linear's weight layout, as d2l's
// modules name them; biases (rows,) all given or none. The heads are read through strides (d2l's
// transpose_qkv without its copies). The mask applies to every head's scores (B, H, n, m): valid
// lengths (B,) or (B, n) as the d2l chapter uses them (d2l repeats them per head), causal, windows, ...
// (attn/mask.hpp); options as SDPA's (attn/sdpa.hpp), dropout on the attention weights.
#pragma once

#include <cstdint>

#include "attn/mask.hpp"
#include "attn/sdpa.hpp"
#include "attn/tensor.hpp"

namespace attn {

struct MultiHeadConfig {
  index_t num_heads = 1;
  index_t num_kv_heads = 0;  // 0: num_heads (multi-head attention)
};

template <class T>
struct MultiHeadParams {
  TensorView<const T> w_q, w_k, w_v, w_o;
  TensorView<const T> b_q, b_k, b_v, b_o;  // all empty (bias=False), or all given
};

// Gradients of the parameters, same shapes (the biases' only when the parameters have biases);
// written, not accumulated, by the backward.
template <class T>
struct MultiHeadGrads {
  TensorView<T> w_q, w_k, w_v, w_o;
  TensorView<T> b_q, b_k, b_v, b_o;
};

// Owning parameters initialised as nn.Linear's default: uniform in +-1/sqrt(fan_in), weights and
// biases, drawn from a counter-based generator keyed by `seed` (reproducible, not PyTorch's stream).
template <class T>
struct MultiHeadWeights {
  Tensor<T> w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o;
  /// Weights (and biases when `bias`) drawn from `seed` as nn.Linear initialises them.
  static MultiHeadWeights init(index_t query_size, index_t key_size, index_t value_size, index_t num_hiddens,
                               const MultiHeadConfig& config, bool bias, std::uint64_t seed);
  /// Views of the weights and biases, for the forward and backward calls; bias(): whether there are biases.
  MultiHeadParams<T> params() const;
  bool bias() const { return b_q.numel() > 0; }
};

// What the forward keeps for the backward (PyTorch's saved tensors): the projections Q (B, n, H dh),
// K and V (B, m, Hk dh), the heads' outputs concatenated (B, n, H dh) and their lse (B, H, n).
template <class T>
struct MultiHeadState {
  Tensor<T> q, k, v, heads, lse;
};

// out (B, n, D); fills *state when not null.
template <class T>
void multi_head_attention_forward(TensorView<T> out, MultiHeadState<T>* state, TensorView<const T> queries,
                                  TensorView<const T> keys, TensorView<const T> values,
                                  const MultiHeadParams<T>& params, const MultiHeadConfig& config,
                                  const Mask<T>& mask = {}, const SdpaOptions& options = {});

// The gradients of every input and parameter from dout (B, n, D), given the same inputs, parameters,
// mask and options as the forward that filled `state`. dqueries, dkeys, dvalues may be empty.
template <class T>
void multi_head_attention_backward(TensorView<T> dqueries, TensorView<T> dkeys, TensorView<T> dvalues,
                                   const MultiHeadGrads<T>& grads, TensorView<const T> dout,
                                   TensorView<const T> queries, TensorView<const T> keys, TensorView<const T> values,
                                   const MultiHeadParams<T>& params, const MultiHeadConfig& config,
                                   const MultiHeadState<T>& state, const Mask<T>& mask = {},
                                   const SdpaOptions& options = {});

// The heads' attention weights before dropout (the d2l chapter's attention_weights, one matrix a
// head): weights (B, H, n, m) from the state of a forward and the same config, mask and options
// (scale, softcap; dropout is not drawn). Reshaped to (B H, n, m), the layout of d2l's
// attention.attention.attention_weights (its heads split by transpose_qkv, batch-major). One more
// attention forward over the saved projections; the forward itself forms no weights.
template <class T>
void multi_head_attention_weights(TensorView<T> weights, const MultiHeadState<T>& state,
                                  const MultiHeadConfig& config, const Mask<T>& mask = {},
                                  const SdpaOptions& options = {});

}  // namespace attn
