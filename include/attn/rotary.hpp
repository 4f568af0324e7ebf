// Rotary position embeddings (RoPE, RoFormer): the semantics of FlashAttention's
// flash_attn.layers.rotary.apply_rotary_emb.
//
//   x, out     (B, S, H, d)  batch, tokens, heads, head size; or, with cu_seqlens (the varlen form),
//              (T, H, d)     the B sequences packed one after another, T tokens in all
//   cos, sin   (P, r / 2)    P = seqlen_ro positions; r = rotary_dim = 2 * cos.dim(1) <= d
//
// Token i of sequence b sits at position p = i + offset_b (offset_b: RotaryPositions below), which
// must lie in [0, P). Only the first r features of each head rotate; features r..d-1 pass through
// unchanged. With c = cos(p, k), s = sin(p, k), k < r / 2:
//   non-interleaved (GPT-NeoX): x1 = x[k], x2 = x[k + r/2]
//       out[k] = x1 c - x2 s,   out[k + r/2] = x1 s + x2 c
//   interleaved (GPT-J):        x1 = x[2k], x2 = x[2k + 1]
//       out[2k] = x1 c - x2 s,  out[2k + 1]  = x1 s + x2 c
// `inverse` applies the transpose rotation (s negated, FlashAttention's conjugate=True). The rotation
// is orthogonal, so the inverse undoes the forward, and it is also the backward:
//   grad_x = apply_rotary(grad_out, cos, sin, positions, {.interleaved = ..., .inverse = true}).
//
// Element types: float and double (tables of the same type, computed in it); bfloat16 and float16
// (tables float32; each row computed in float32 and rounded once). out may be x itself (exactly the
// same data and strides: rotated in place, as FlashAttention's inplace=True) or memory of its own;
// a partial overlap, or an out that broadcasts, is refused. Strides are in elements, the last
// dimension of every tensor contiguous. Inputs of more than 64K elements are split across threads by
// tokens. Errors (attn::Error) name the argument, its shape or value and the rule.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "attn/half.hpp"
#include "attn/tensor.hpp"

namespace attn {

// A (n,) vector of int32 or int64 (PyTorch's and NumPy's index types), or nothing.
class IndexVector {
 public:
  IndexVector() = default;
  /// An int32 or int64 vector (either converts implicitly); its emptiness, rank, sizes, shape as
  /// messages write it, and data.
  IndexVector(TensorView<const std::int32_t> v) : i32_(v) {}  // NOLINT(google-explicit-constructor)
  IndexVector(TensorView<const std::int64_t> v) : i64_(v) {}  // NOLINT(google-explicit-constructor)
  bool empty() const { return i32_.empty() && i64_.empty(); }
  int rank() const { return i32_.empty() ? i64_.rank() : i32_.rank(); }
  index_t dim(int i) const { return i32_.empty() ? i64_.dim(i) : i32_.dim(i); }
  std::string shape_string() const { return i32_.empty() ? i64_.shape_string() : i32_.shape_string(); }
  const void* data() const { return i32_.empty() ? static_cast<const void*>(i64_.data()) : i32_.data(); }
  // Element k (of a rank-1 vector).
  index_t operator[](index_t k) const { return i32_.empty() ? i64_(k) : static_cast<index_t>(i32_(k)); }

 private:
  TensorView<const std::int32_t> i32_;
  TensorView<const std::int64_t> i64_;
};

// Where each sequence starts: its first token's position, and (varlen form) where it lies in x.
struct RotaryPositions {
  index_t offset = 0;      // every sequence's first position (>= 0); or
  IndexVector offsets = {};     // (B,): sequence b's first position (>= 0), as a KV cache's lengths
  IndexVector cu_seqlens = {};  // (B + 1,): the varlen form, sequence b is x[cu[b], cu[b+1]); cu[0] = 0,
                                // non-decreasing, cu[B] = T
};

struct RotaryOptions {
  bool interleaved = false;  // pairs (2k, 2k+1) (GPT-J) instead of halves (GPT-NeoX)
  bool inverse = false;      // the transpose rotation (sin negated): the backward, and the undo
};

// The tables' element type for x of type T: float for the 16-bit types, else T.
template <class T>
using RotaryTable = std::conditional_t<std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>, float, T>;

// out = x rotated at its tokens' positions (see above). T: float, double, bfloat16 or float16.
template <class T>
void apply_rotary(TensorView<T> out, TensorView<const T> x, TensorView<const RotaryTable<T>> cos,
                  TensorView<const RotaryTable<T>> sin, const RotaryPositions& positions = {},
                  const RotaryOptions& options = {});

// The tables a KV cache rotates its keys and queries with (attn/kv_cache.hpp): cos, sin (P, r / 2)
// float32, as above. Views: the caller keeps their memory alive as long as the cache uses them.
struct RotaryTables {
  TensorView<const float> cos = {}, sin = {};
  bool interleaved = false;
  /// Whether no tables are given.
  bool empty() const { return cos.empty() && sin.empty(); }
};

}  // namespace attn
