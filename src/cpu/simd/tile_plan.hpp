// Which key tiles a block of kBlockQ queries visits, and how much of each one its rows' key ranges
// cut (BlockState, simd/softmax-inl.h, is built on it). Scalar bookkeeping, the same on every SIMD
// target: an ordinary header, not a per-target "-inl.h" one.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>

#include "core/mask_plan.hpp"
#include "cpu/simd/fused.hpp"

namespace attn::cpu::fused {

// The keys a block of queries may attend to, [begin, end): tiles outside it are skipped. begin is a
// multiple of kBlockK, so that tiles keep their places (dropout draws four keys at a time from a
// multiple of 4; the backward's chunks are made of whole tiles).
struct KeyRange {
  index_t begin = 0, end = 0;
};

// The block's rows summarised for tile skipping: the union of their key ranges [begin, end) (keys
// outside it are never visited), the smallest end and largest begin (a tile inside both is cut by no
// row's range), and the range of the rows' segment ids (a tile whose keys' ids all lie outside it
// holds no key any row attends).
template <class T>
struct TilePlan {
  index_t rows = 0, min_end = 0, max_begin = 0, keys_m = 0;
  bool segments = false;                // segment ids: a tile is masked element by element unless uniform
  bool d2l_fill = false;                // the d2l chapter's -1e6 fill: every key takes part in every row
  std::int64_t seg_lo = 0, seg_hi = 0;  // the block's query segment ids lie in [seg_lo, seg_hi]
  SegmentRow seg_k;                     // the keys' segment ids

  // Plans the block of rows [0, count) of batch element b whose row masks are rm[0, count) (count >=
  // 1). Returns the keys that take part in the block, begin rounded down to a whole tile; empty when
  // no row attends any key.
  KeyRange plan(const MaskPlan<T>& mask, index_t b, const RowMask<T>* rm, index_t count) {
    rows = count;
    segments = !mask.seg_q.empty();
    seg_k = mask.segments_k(b);
    d2l_fill = mask.d2l_fill;
    min_end = mask.m, max_begin = 0, keys_m = mask.m;
    KeyRange range{mask.m, 0};
    for (index_t i = 0; i < count; ++i) {
      min_end = std::min(min_end, rm[i].end), max_begin = std::max(max_begin, rm[i].begin);
      range.begin = std::min(range.begin, rm[i].begin), range.end = std::max(range.end, rm[i].end);
      if (segments) {
        seg_lo = i == 0 ? rm[i].seg : std::min(seg_lo, rm[i].seg);
        seg_hi = i == 0 ? rm[i].seg : std::max(seg_hi, rm[i].seg);
      }
    }
    if (d2l_fill) range = {0, mask.m};  // every key takes part in every row
    if (range.begin >= range.end) return {};
    range.begin = range.begin / kBlockK * kBlockK;
    return range;
  }

  // Whether keys [j0, j0 + cnt) may share a segment id with the block's queries: false when the
  // ranges of ids are disjoint (no key of the tile is attended; not so under the d2l chapter's fill).
  bool segments_meet(index_t j0, index_t cnt) const {
    if (!segments || d2l_fill) return true;
    const auto [lo, hi] = key_segments(j0, cnt);
    return !(hi < seg_lo || lo > seg_hi);
  }
  // Whether every query of the block and every key of [j0, j0 + cnt) have one segment id: the
  // segments then mask nothing in the tile.
  bool uniform_segments(index_t j0, index_t cnt) const {
    if (seg_lo != seg_hi) return false;
    const auto [lo, hi] = key_segments(j0, cnt);
    return lo == seg_lo && hi == seg_lo;
  }
  // Whether some row's range starts after key j0 (its left edge must be compared in the tile).
  bool cuts_left(index_t j0) const { return max_begin > j0; }
  // Whether some row's range leaves out a key of [j0, j0 + cnt).
  bool cuts(index_t j0, index_t cnt) const { return j0 + cnt > min_end || cuts_left(j0); }
  // Whether the block is whole and every row's range holds all of [j0, j0 + cnt).
  bool whole(index_t j0, index_t cnt) const { return rows == kBlockQ && j0 + cnt <= min_end && max_begin <= j0; }

 private:
  // The smallest and largest segment id of keys [j0, j0 + cnt).
  std::pair<std::int64_t, std::int64_t> key_segments(index_t j0, index_t cnt) const {
    std::int64_t lo = seg_k[j0], hi = lo;
    for (index_t j = j0 + 1; j < j0 + cnt; ++j) lo = std::min(lo, seg_k[j]), hi = std::max(hi, seg_k[j]);
    return {lo, hi};
  }
};

}  // namespace attn::cpu::fused
