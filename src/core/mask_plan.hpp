// The one internal form of every mask (attn/mask.hpp): per score row (b, h, i) a key limit `end`
// (from valid lengths and the causal rule: keys j >= end are masked) plus optional broadcast views
// of a boolean keep-mask and an additive mask. Built and validated once by plan_mask; the kernels
// only call MaskPlan::row.
#pragma once

#include <algorithm>
#include <cstdint>

#include "attn/mask.hpp"

namespace attn {

template <class T>
struct RowMask {
  index_t end = 0;                 // keys [end, m) are masked
  const bool* keep = nullptr;      // keep[j * keep_stride]: false = masked; nullptr = all kept
  index_t keep_stride = 0;
  const T* bias = nullptr;         // bias[j * bias_stride] is added to score j; nullptr = none
  index_t bias_stride = 0;
  bool seeds_fill = false;         // MaskedFill::seeds_minus_1e6

  bool allowed(index_t j) const { return j < end && (keep == nullptr || keep[j * keep_stride]); }
  T bias_at(index_t j) const { return bias == nullptr ? T(0) : bias[j * bias_stride]; }
  // Whether key j takes part in the weighted sum: the allowed ones, or all of them under the
  // seeds' -1e6 fill (a masked key then has a tiny, or for an empty row uniform, weight).
  bool participates(index_t j) const { return seeds_fill || allowed(j); }
};

template <class T>
struct MaskPlan {
  index_t B = 0, H = 0, n = 0, m = 0;
  const std::int64_t* lens = nullptr;  // valid lengths, lens[b * lens_sb + i * lens_si]
  index_t lens_sb = 0, lens_si = 0;
  bool causal = false;
  index_t causal_offset = 0;           // causal: key j allowed when j <= i + causal_offset
  const bool* keep = nullptr;
  index_t keep_s[4] = {0, 0, 0, 0};    // broadcast strides over (B, H, n, m)
  const T* bias = nullptr;
  index_t bias_s[4] = {0, 0, 0, 0};
  bool seeds_fill = false;

  RowMask<T> row(index_t b, index_t h, index_t i) const {
    RowMask<T> r;
    r.end = m;
    if (lens != nullptr) r.end = std::min<index_t>(r.end, lens[b * lens_sb + i * lens_si]);
    if (causal) r.end = std::min<index_t>(r.end, std::max<index_t>(0, i + causal_offset + 1));
    if (keep != nullptr) r.keep = keep + b * keep_s[0] + h * keep_s[1] + i * keep_s[2], r.keep_stride = keep_s[3];
    if (bias != nullptr) r.bias = bias + b * bias_s[0] + h * bias_s[1] + i * bias_s[2], r.bias_stride = bias_s[3];
    r.seeds_fill = seeds_fill;
    return r;
  }
};

// Validates `mask` against scores of shape (B, H, n, m) and builds its plan. `rank` is the rank of
// the caller's tensors (3 or 4), used to print shapes the way the caller wrote them.
// Throws attn::Error naming `op`, the mask component, its shape or value, and the rule.
template <class T>
MaskPlan<T> plan_mask(const Mask<T>& mask, index_t B, index_t H, index_t n, index_t m, int rank, const char* op);

}  // namespace attn
