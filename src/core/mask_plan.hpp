// The one internal form of every mask (attn/mask.hpp): per score row (b, h, i) a range of keys
// [begin, end) (from valid lengths, the causal rule and a sliding window: keys outside are masked),
// plus optional broadcast views of a boolean keep-mask, an additive mask, segment ids, the ALiBi
// slope of the row's head, and the attention sinks' logits. Built and validated once by plan_mask; the kernels call MaskPlan::row and
// the few summaries below.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <limits>

#include "attn/mask.hpp"
#include "core/switch_plan.hpp"

namespace attn {

// Segment ids of one batch element's queries or keys, int32 or int64, read as int64.
struct SegmentRow {
  const std::int32_t* i32 = nullptr;
  const std::int64_t* i64 = nullptr;
  index_t stride = 0;

  bool empty() const { return i32 == nullptr && i64 == nullptr; }
  std::int64_t operator[](index_t j) const { return i64 != nullptr ? i64[j * stride] : i32[j * stride]; }
};

template <class T>
struct RowMask {
  index_t begin = 0;               // keys [0, begin) are masked (the window's left edge)
  index_t end = 0;                 // keys [end, m) are masked
  const bool* keep = nullptr;      // keep[j * keep_stride]: false = masked; nullptr = all kept
  index_t keep_stride = 0;
  const T* bias = nullptr;         // bias[j * bias_stride] is added to score j; nullptr = none
  index_t bias_stride = 0;
  SegmentRow seg_k;                // the keys' segment ids; empty = no segments
  std::int64_t seg = 0;            // this query's segment id
  T alibi = 0;                     // ALiBi: -alibi_slope |pos - j| is added to score j; 0 = none
  index_t pos = 0;                 // the query's position p(i)
  bool d2l_fill = false;           // MaskedFill::d2l_minus_1e6
  bool has_sink = false;           // attention sinks: `sink` joins the row's softmax with no value
  T sink = 0;

  // Whether key j is attended. A -inf additive entry masks its key as a false keep entry does (the
  // score, NaN or not, is never read), except under the d2l chapter's fill, which adds it as a number.
  bool allowed(index_t j) const {
    return j >= begin && j < end && (keep == nullptr || keep[j * keep_stride]) && (seg_k.empty() || seg_k[j] == seg) &&
           (bias == nullptr || d2l_fill || bias[j * bias_stride] != -std::numeric_limits<T>::infinity());
  }
  // The bias of key j: the additive mask's and ALiBi's.
  T bias_at(index_t j) const {
    T b = bias == nullptr ? T(0) : bias[j * bias_stride];
    if (alibi != T(0)) b -= alibi * static_cast<T>(std::abs(pos - j));
    return b;
  }
  // Whether every key in [begin, end) is attended with no bias: nothing masked or added key by key.
  bool plain() const { return keep == nullptr && bias == nullptr && seg_k.empty() && alibi == T(0); }
  // Whether key j takes part in the weighted sum: the allowed ones, or all of them under the
  // d2l chapter's -1e6 fill (a masked key then has a tiny, or for an empty row uniform, weight).
  bool participates(index_t j) const { return d2l_fill || allowed(j); }
};

// What each (rows x keys) tile of an additive mask holds, found by the first block of a call that
// reads the tile and kept for every later block that reads the same tile: a mask broadcast over
// heads, the batch or the queries is then scanned once per call, not once per block (an additive
// causal mask over 4 heads was read 4 times, each -inf tile only to skip it). Cell (b, h, r, t)
// covers rows [r rows_per_block, ...) and keys [t keys_per_tile, ...) of the mask's slice of (b, h);
// its strides are 0 over the axes the mask broadcasts over. Made by cpu::BiasClassesFor.
struct BiasTileClasses {
  static constexpr std::uint8_t kKnown = 1;    // the cell was filled
  static constexpr std::uint8_t kFinite = 2;   // some entry is not -inf: some key may be attended
  static constexpr std::uint8_t kNonzero = 4;  // some entry is not 0: the tile must be added
  static constexpr std::uint8_t kMasks = 8;    // some entry is -inf: a weight of exactly 0
  std::atomic<std::uint8_t>* cells = nullptr;
  index_t sb = 0, sh = 0, sr = 0;              // strides of the cells over b, h and row blocks
  index_t rows_per_block = 0, keys_per_tile = 0;

  // The cells of rows [i0, ...) of (b, h): cell t covers keys [t keys_per_tile, ...).
  std::atomic<std::uint8_t>* row(index_t b, index_t h, index_t i0) const {
    return cells + b * sb + h * sh + i0 / rows_per_block * sr;
  }
};

template <class T>
struct MaskPlan {
  index_t B = 0, H = 0, n = 0, m = 0;
  const std::int64_t* lens = nullptr;  // valid lengths, lens[b * lens_sb + i * lens_si]
  index_t lens_sb = 0, lens_si = 0;
  bool causal = false;
  index_t offset = 0;                  // p(i) = i + offset: 0, or m - n when causal is bottom-right,
                                       // plus query_start - key_start
  bool window = false;
  index_t window_left = -1, window_right = -1;  // -1: unbounded on that side
  const bool* keep = nullptr;
  index_t keep_s[4] = {0, 0, 0, 0};    // broadcast strides over (B, H, n, m)
  const T* bias = nullptr;
  index_t bias_s[4] = {0, 0, 0, 0};
  const BiasTileClasses* bias_classes = nullptr;  // the bias's tiles as found so far; null: none kept
  SegmentRow seg_q, seg_k;             // batch element 0's rows; seg_*_sb steps to the next
  index_t seg_q_sb = 0, seg_k_sb = 0;
  const T* alibi = nullptr;            // slopes, alibi[b * alibi_sb + h * alibi_sh]
  index_t alibi_sb = 0, alibi_sh = 0;
  bool d2l_fill = false;
  const T* sinks = nullptr;            // attention sinks' logits, sinks[h * sinks_stride]: each forward
  index_t sinks_stride = 0;            // kernel adds the row's to its softmax's sum (RowMask::sink)
  // The call's run-time switches, read once by plan_mask at the API boundary: every kernel that
  // takes a mask (or an SdpaPlan) runs on these, never on the global settings.
  detail::Switches switches;

  // Keys [begin, end) the structure of the mask allows query i of batch b (valid lengths, causal
  // rule, window); other components may mask more of them.
  // Positions and bounds are summed in 128 bits: a window bound or an offset near 2^63 must not
  // overflow (found by fuzzing); the result is clamped to [0, m].
  __extension__ using Wide = __int128;
  index_t begin(index_t i) const {
    if (!window || window_left < 0) return 0;
    return clamp_to_keys(static_cast<Wide>(i) + offset - window_left);
  }
  index_t end(index_t b, index_t i) const {
    index_t e = m;
    if (lens != nullptr) e = std::min<index_t>(e, lens[b * lens_sb + i * lens_si]);
    const Wide p = static_cast<Wide>(i) + offset;
    if (causal) e = std::min<index_t>(e, clamp_to_keys(p + 1));
    if (window && window_right >= 0) e = std::min<index_t>(e, clamp_to_keys(p + window_right + 1));
    return e;
  }
  index_t clamp_to_keys(Wide x) const { return x < 0 ? 0 : x > m ? m : static_cast<index_t>(x); }
  SegmentRow segments_q(index_t b) const { return shift(seg_q, b * seg_q_sb); }
  SegmentRow segments_k(index_t b) const { return shift(seg_k, b * seg_k_sb); }
  T sink(index_t h) const { return sinks[h * sinks_stride]; }
  const T* sink_of(index_t h) const { return sinks == nullptr ? nullptr : sinks + h * sinks_stride; }  // or none
  T alibi_slope(index_t b, index_t h) const { return alibi == nullptr ? T(0) : alibi[b * alibi_sb + h * alibi_sh]; }
  // Whether keys are masked element by element (a keep-mask, segments) or biased (additive, ALiBi).
  bool elementwise() const { return keep != nullptr || bias != nullptr || !seg_q.empty() || alibi != nullptr; }

  RowMask<T> row(index_t b, index_t h, index_t i) const {
    RowMask<T> r;
    r.begin = begin(i);
    r.end = end(b, i);
    if (keep != nullptr) r.keep = keep + b * keep_s[0] + h * keep_s[1] + i * keep_s[2], r.keep_stride = keep_s[3];
    if (bias != nullptr) r.bias = bias + b * bias_s[0] + h * bias_s[1] + i * bias_s[2], r.bias_stride = bias_s[3];
    if (!seg_q.empty()) r.seg_k = segments_k(b), r.seg = segments_q(b)[i];
    r.alibi = alibi_slope(b, h);
    r.pos = i + offset;
    r.d2l_fill = d2l_fill;
    if (sinks != nullptr) r.has_sink = true, r.sink = sink(h);
    return r;
  }

 private:
  static SegmentRow shift(SegmentRow r, index_t by) {
    if (r.i32 != nullptr) r.i32 += by;
    if (r.i64 != nullptr) r.i64 += by;
    return r;
  }
};

// Validates `mask` against scores of shape (B, H, n, m) and builds its plan. `rank` is the rank of
// the caller's tensors (3 or 4), used to print shapes the way the caller wrote them.
// Throws attn::Error naming `op`, the mask component, its shape or value, and the rule.
template <class T>
MaskPlan<T> plan_mask(const Mask<T>& mask, index_t B, index_t H, index_t n, index_t m, int rank, const char* op);

}  // namespace attn
