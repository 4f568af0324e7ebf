// Scaled dot-product attention: out = dropout(masked_softmax(Q K^T * scale)) V.
//
//   queries (B, n, d) or (B, H, n, d)      keys (B, m, d) / (B, Hk, m, d)
//   values  (B, m, v) / (B, Hk, m, v)      out  (B, n, v) / (B, H, n, v)
//   lse     (B, n)    / (B, H, n)          log-sum-exp of each masked, scaled score row (-inf for
//                                          an empty row), what the backward needs to rebuild the
//                                          weights without storing them
//   weights (B, n, m) / (B, H, n, m)       the attention weights before dropout (the d2l chapter's
//                                          `attention_weights`), only written when given
// All tensors of one call have the same rank. Masks and empty rows: attn/mask.hpp.
// Grouped-query attention: keys and values may have fewer heads Hk than the queries' H, when H is a
// multiple of Hk (Hk = 1: multi-query attention); query head h reads key and value head
// h / (H / Hk), as PyTorch's enable_gqa and FlashAttention. Nothing is copied per query head; the
// backward's dkeys and dvalues are each the sum over the query heads that read that head.
#pragma once

#include <optional>
#include <type_traits>

#include "attn/dropout.hpp"
#include "attn/half.hpp"
#include "attn/mask.hpp"
#include "attn/tensor.hpp"

namespace attn {

struct SdpaOptions {
  std::optional<double> scale;  // default 1 / sqrt(d)
  Dropout dropout;              // p = 0: nothing is dropped
  // Soft-capping (Gemma 2, FlashAttention-2): the scaled score s becomes softcap * tanh(s / softcap)
  // before the position bias (ALiBi) and the masks. Positive and finite; unset: none.
  std::optional<double> softcap;
};

// out (and, when given, lse and weights) from queries, keys and values.
template <class T>
void sdpa_forward(TensorView<T> out, TensorView<T> lse, TensorView<T> weights, TensorView<const T> queries,
                  TensorView<const T> keys, TensorView<const T> values, const Mask<T>& mask = {},
                  const SdpaOptions& options = {});

// dqueries, dkeys, dvalues from dout, given the forward's inputs and the same mask and options (the
// same dropout seed gives the same mask). Any gradient may be empty when not needed. out and lse are
// the forward's results (they must come from the same inputs, mask and scale); both are optional and
// checked for shape when given. out, when given, also gives D_i = dout_i . out_i of the softmax's
// backward on every backend (FlashAttention's form; sdpa_backward_block relies on it). The weights
// are recomputed from the inputs: the fused kernels rebuild a row as exp(score - lse) when
// |lse| <= 16 (its rounding then moves the whole row by one factor within 1 +- 16 x 2^-24 in float),
// and otherwise, or without lse, recompute the row's maximum and sum exactly; without out, the
// forward is run again first.
// With attention sinks (Mask::sinks), out and lse must be the forward's with the same sinks (run
// again when either is missing), and dsinks (H,), when given, receives the sinks' gradient.
template <class T>
void sdpa_backward(TensorView<T> dqueries, TensorView<T> dkeys, TensorView<T> dvalues, TensorView<const T> dout,
                   TensorView<const T> queries, TensorView<const T> keys, TensorView<const T> values,
                   TensorView<const T> out, TensorView<const T> lse, const Mask<T>& mask = {},
                   const SdpaOptions& options = {}, TensorView<T> dsinks = {});

// 16-bit attention (attn/half.hpp): queries, keys, values, out and the gradients in bfloat16 or
// float16, lse, masks and options in float32. Accumulation is in float32, every mask, variant and
// dropout as in float32, and the results are rounded once to the 16-bit type. On the cpu backend the
// forward reads the 16-bit tensors in place: bfloat16 through the AVX512-BF16 products where
// bf16_kernel_chosen() (attn/config.hpp; P rounded to bfloat16 for P V, as FlashAttention does), else
// through the float kernels, keys and values widened exactly once per call and queries a block at a
// time; the backward widens the tensors to float32 and makes the float32 call, whose fused kernel,
// for bfloat16 where bf16_kernel_chosen(), computes its five products by vdpbf16ps (or AMX's tiles)
// with P and dS rounded to bfloat16 (as FlashAttention's 16-bit backward, and like it forming
// dS = P (dP - D) in float32 where a tile's masks are key ranges; the float32 call forms it in
// float64). Shapes and errors as above.
template <class H>
concept Half16 = std::is_same_v<H, bfloat16> || std::is_same_v<H, float16>;

/// 16-bit queries, keys, values and out; lse float32.
template <Half16 H>
void sdpa_forward(TensorView<H> out, TensorView<float> lse, TensorView<const H> queries, TensorView<const H> keys,
                  TensorView<const H> values, const Mask<float>& mask = {}, const SdpaOptions& options = {});

// 16-bit queries, keys and values, out float32: the result before its rounding to 16 bits (NumPy's
// compute_dtype="bfloat16" and `attn sdpa --compute bf16` return it).
template <Half16 H>
void sdpa_forward(TensorView<float> out, TensorView<float> lse, TensorView<const H> queries, TensorView<const H> keys,
                  TensorView<const H> values, const Mask<float>& mask = {}, const SdpaOptions& options = {});

// A decoder reading a 16-bit cache: float32 queries, out and lse, 16-bit keys and values.
template <Half16 H>
void sdpa_forward(TensorView<float> out, TensorView<float> lse, TensorView<const float> queries,
                  TensorView<const H> keys, TensorView<const H> values, const Mask<float>& mask = {},
                  const SdpaOptions& options = {});

/// The 16-bit backward: gradients in the 16-bit type, lse and dsinks float32.
template <Half16 H>
void sdpa_backward(TensorView<H> dqueries, TensorView<H> dkeys, TensorView<H> dvalues, TensorView<const H> dout,
                   TensorView<const H> queries, TensorView<const H> keys, TensorView<const H> values,
                   TensorView<const H> out, TensorView<const float> lse, const Mask<float>& mask = {},
                   const SdpaOptions& options = {}, TensorView<float> dsinks = {});

// ---- int8 products (SageAttention's scheme, on the CPU) -----------------------------------------
// The forward with Q K^T in int8, an approximation opted into for speed: each query row, and each
// key row less the mean of its head's keys, quantized to int8 with one float32 scale a row (the keys
// from the first that some query may attend to the last: those outside that span, past every
// query's valid length, causal reach or window, are read by nothing, as in float32; every key inside
// it is read, masked or not)
// (s = max |x| / 127, round to nearest even); Q K^T summed exactly in int32 (vpdpbusd on CPUs with
// AVX512-VNNI, 16-bit products elsewhere, the same sums) and scaled back to float32, with q . mean
// added back, so that scores are the true ones up to the rounding of q and k (subtracting the mean
// leaves the softmax unchanged and shrinks the range that a key channel with a large common offset
// forces on every key). Soft-capping, ALiBi, every mask, sinks and dropout then apply in float32 as
// in sdpa_forward; P V in float32, or with P and V rounded to bfloat16 where the AVX512-BF16 kernel
// is chosen (bf16_kernel_chosen in attn/config.hpp), accumulated in float32. Accuracy: each score
// is off by at most (|q|_1 s_k + |k - mean|_1 s_q) / 2 + d s_q s_k / 4 before the scale (s the
// rows' scales); the documented measure is the cosine similarity of out with float64 attention
// (docs/performance.md). Queries and the keys of that span must be finite (an attn::Error
// names the first row that is not; out and lse are then unspecified); d <= 65536. Runs the cpu
// backend's fused kernel whatever the backend (attn/config.hpp); shapes and other errors as
// sdpa_forward<float>, which never computes in int8. Its speed: `attn bench`'s "sdpa forward int8 (1,4096,4096,128)".
void sdpa_forward_int8(TensorView<float> out, TensorView<float> lse, TensorView<const float> queries,
                       TensorView<const float> keys, TensorView<const float> values, const Mask<float>& mask = {},
                       const SdpaOptions& options = {});

// ---- attention over keys split into blocks (split-KV, sequence parallelism) ----------------------
// A long attention can be computed block by block of keys, each block a call with its own keys,
// values and mask and the positions of its first query and key (Mask::query_start, key_start), its
// results merged exactly through their log-sum-exp; and differentiated block by block the same way.
// This is what ring attention does on each machine.

// Merges attention over two disjoint sets of keys for the same queries (FlashAttention's combine of
// split-KV partials): given out and lse over one set and out_part and lse_part over the other,
// writes the attention over both into out and lse:
//   lse' = log(e^lse + e^lse_part),  out' = e^(lse - lse') out + e^(lse_part - lse') out_part.
// A row with no key in one set (lse -inf) takes the other's; with none in either it stays 0, -inf.
// out, out_part (B, n, v) / (B, H, n, v); lse, lse_part (B, n) / (B, H, n). Exact with dropout too
// (each part's out is its dropped weights over its own sum).
template <class T>
void sdpa_merge(TensorView<T> out, TensorView<T> lse, TensorView<const T> out_part, TensorView<const T> lse_part);

// One block's share of the gradients of a longer attention: queries, keys and values of the block
// with its mask and options, dout the gradient of the whole attention's output, out and lse the
// whole attention's (over every block, e.g. merged by sdpa_merge). Writes dkeys and dvalues, the
// block's own gradients, and dqueries, this block's term of dQ (dQ is the sum of the terms over the
// blocks). Any gradient may be empty. The block's weights are the whole attention's,
// exp(score - lse), and D = dout . out is the whole attention's, so nothing of the block's forward is
// recomputed (FlashAttention's backward on a block of keys; ring attention's per-machine step). The
// rounding of lse moves a row's weights by one common factor within 1 +- |lse| eps (eps = 2^-24 in
// float): exact for moderate scores, about 6% off for a row of the d2l chapter's -1e6 fill.
template <class T>
void sdpa_backward_block(TensorView<T> dqueries, TensorView<T> dkeys, TensorView<T> dvalues, TensorView<const T> dout,
                         TensorView<const T> queries, TensorView<const T> keys, TensorView<const T> values,
                         TensorView<const T> out, TensorView<const T> lse, const Mask<T>& mask = {},
                         const SdpaOptions& options = {});

// Attention sinks (Mask::sinks) on attention computed without them, for a caller that computes the
// attention in parts (blocks of keys merged with sdpa_merge, as ring attention does): applies the
// sinks (H,) once to the merged out (B, [H,] n, v) and lse (B, [H,] n) in place, as sdpa_forward
// with sinks would have. The gradient of the sinks from the same out and lse (with sinks) and dout:
// dsinks[h] = -sum over rows of e^(sinks[h] - lse) (dout . out), written into dsinks (H,).
template <class T>
void sdpa_apply_sinks(TensorView<T> out, TensorView<T> lse, TensorView<const T> sinks);
template <class T>
void sdpa_sinks_backward(TensorView<T> dsinks, TensorView<const T> dout, TensorView<const T> out,
                         TensorView<const T> lse, TensorView<const T> sinks);

// Convenience: returns out; fills *weights when not null.
template <class T>
Tensor<T> scaled_dot_product_attention(TensorView<const T> queries, TensorView<const T> keys,
                                       TensorView<const T> values, const Mask<T>& mask = {},
                                       const SdpaOptions& options = {}, Tensor<T>* weights = nullptr);

}  // namespace attn
