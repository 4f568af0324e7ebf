// The rotary kernel (attn/rotary.hpp): one plain params struct, filled and validated once in
// src/api/rotary.cpp (or by the KV cache), trusted here.
#pragma once

#include <cstdint>

#include "attn/tensor.hpp"

namespace attn::cpu {

// x and out are read as (B, S, H, d) through element strides, or, varlen (starts given), as the
// packed (T, H, d) with sequence b's tokens at [starts[b], starts[b+1]) and s_b = 0. Every layout
// (a cache's (H, S, d) too) is these three strides. Positions: token i of sequence b at
// offsets[b] + i, already checked to lie in [0, rows of the tables).
template <class T, class C>
struct RotaryParams {
  T* out = nullptr;
  const T* x = nullptr;
  index_t out_sb = 0, out_ss = 0, out_sh = 0;
  index_t x_sb = 0, x_ss = 0, x_sh = 0;
  index_t batch = 0, seqlen = 0, heads = 0, head_dim = 0;  // seqlen: tokens per sequence (not varlen)
  index_t half = 0;                                        // rotary_dim / 2
  const C* cos = nullptr;
  const C* sin = nullptr;
  index_t cos_s = 0, sin_s = 0;                            // row strides of the tables
  const std::int64_t* offsets = nullptr;                   // (batch,) first positions
  const std::int64_t* starts = nullptr;                    // (batch + 1,) varlen, or null
  bool interleaved = false, inverse = false;
};

// out = x rotated; out == x (same strides) rotates in place. T: float, double, bfloat16, float16,
// with C = RotaryTable<T>.
template <class T, class C>
void rotary(const RotaryParams<T, C>& p);

}  // namespace attn::cpu
