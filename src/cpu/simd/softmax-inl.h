// Per-target online softmax over the key tiles of one block of kBlockQ queries (Highway "-inl.h"
// convention, like gemm-inl.h). Scores of a tile are stored transposed, (kBlockK, kBlockQ): each
// query is a lane, so the running maximum and sum of every query update with plain vector ops.
//
// exp is Highway's hn::Exp: at most 1 ulp from the exact value over the range the kernels use
// (arguments <= 0; below -104 in float, -1000 in double, it returns 0, as the weight rounds to 0 anyway).

#if defined(ATTN_CPU_SIMD_SOFTMAX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_CPU_SIMD_SOFTMAX_INL_H_
#undef ATTN_CPU_SIMD_SOFTMAX_INL_H_
#else
#define ATTN_CPU_SIMD_SOFTMAX_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include <hwy/cache_control.h>
#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include "cpu/simd/fused.hpp"
#include "cpu/simd/gemm-inl.h"
#include "cpu/simd/tanh-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::fused::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Whether every entry of rows [0, count) x columns [0, cols) of a strided matrix is finite: x - x is
// 0 for a finite x and NaN for an infinite or NaN one, so the rows' differences are summed lane by
// lane and the sum checked once (a scalar scan of a 64 x 64 value tile cost half its product).
template <class T>
bool rows_finite(const T* x, index_t stride, index_t count, index_t cols) {
  const hn::ScalableTag<T> d;
  const index_t L = static_cast<index_t>(hn::Lanes(d));
  auto acc = hn::Zero(d);
  T tail = 0;
  for (index_t r = 0; r < count; ++r) {
    const T* row = x + r * stride;
    index_t c = 0;
    for (; c + L <= cols; c += L) {
      const auto v = hn::LoadU(d, row + c);
      acc = hn::Add(acc, hn::Sub(v, v));
    }
    for (; c < cols; ++c) tail += row[c] - row[c];
  }
  return hn::AllTrue(d, hn::Eq(acc, hn::Zero(d))) && tail == T(0);
}

// C (cols, kBlockQ) += sum_j A[j][c] W[j][i] over j < cnt, i < count, reading row j of A only
// where W[j][i] != 0: the path for a tile whose masked keys hold values that are not finite
// (0 * Inf must not reach a row that never attends to that key). Its sums are BlockGemm's, in the
// same order (passes of kDepthBlock, each summed from 0 and then added to C), so that the result
// does not depend on which of the two paths a tile takes.
template <class T>
void AccumulateSkippingZeros(T* C, const T* A, index_t a_stride, const T* W, index_t cnt, index_t cols, index_t count) {
  for (index_t k0 = 0; k0 < cnt; k0 += kDepthBlock) {
    const index_t k1 = std::min(cnt, k0 + kDepthBlock);
    for (index_t i = 0; i < count; ++i)
      for (index_t c = 0; c < cols; ++c) {
        T sum = 0;
        for (index_t j = k0; j < k1; ++j) {
          const T w = W[j * kBlockQ + i];
          if (w != T(0)) sum += w * A[j * a_stride + c];
        }
        C[c * kBlockQ + i] += sum;
      }
  }
}

// The keys a block of queries may attend to, [begin, end): tiles outside it are skipped. begin is a
// multiple of kBlockK, so that tiles keep their places (dropout draws four keys at a time from a
// multiple of 4; the backward's chunks are made of whole tiles).
struct KeyRange {
  index_t begin = 0, end = 0;
};

// The state of one block of queries while its key tiles stream past, over arrays laid out by the
// caller (BlockArrays, simd/fused.hpp). Queries past the end of the block (the last block of a head)
// are padding lanes: every key is masked for them and nothing of them is stored.
template <class T>
struct BlockState : BlockArrays<T> {
  // qt (d, kBlockQ) queries transposed; s (kBlockK, kBlockQ) scores, then weights, of the current
  // tile; ot (v, kBlockQ) unnormalised output transposed; max: running row maximum (-inf while a
  // row has seen no key); alpha: exp(previous max - new max) of the current tile; begin, end: keys
  // outside [begin, end) are masked (valid lengths, causal rule, window), as T for lane compares;
  // pos: the queries' positions p(i) (ALiBi); sum: running sum of exp(score - max); tsum: the
  // current tile's part of it; rm: the row masks.
  using BlockArrays<T>::qt, BlockArrays<T>::s, BlockArrays<T>::ot, BlockArrays<T>::max, BlockArrays<T>::alpha,
      BlockArrays<T>::begin, BlockArrays<T>::end, BlockArrays<T>::pos, BlockArrays<T>::sum, BlockArrays<T>::tsum,
      BlockArrays<T>::rm;
  using typename BlockArrays<T>::Word;
  using BlockArrays<T>::kWordKeys, BlockArrays<T>::keep_words, BlockArrays<T>::bias_rows, BlockArrays<T>::bias_t;
  index_t rows = 0, min_end = 0, max_begin = 0, keys_m = 0;
  bool elementwise = false;  // a keep or additive mask the SIMD path cannot take: every tile masked element by element
  // Keep-masks and additive masks on the SIMD path: may_attend looks at each tile's part of them
  // first. A tile they mask entirely is skipped; one they leave whole (all kept, bias all 0) takes
  // the unmasked path; otherwise tile_keep (the keep bits apply) and tile_bias (the bias is added).
  bool has_keep = false, has_bias = false, keep_rows_shared = false, bias_rows_shared = false;
  index_t keep_stride = 0, bias_stride = 0, tile_j0 = 0;
  bool tile_keep = false, tile_bias = false, tile_bias_masks = false;  // tile_bias_masks: some entry -inf
  bool segments = false;     // segment ids: a tile is masked element by element unless uniform
  std::int64_t seg_lo = 0, seg_hi = 0;  // the block's query segment ids lie in [seg_lo, seg_hi]
  SegmentRow seg_k;          // the keys' segment ids
  T alibi = 0;               // the head's ALiBi slope, 0 for none
  T fill = 0;                // what a masked score becomes: -inf, or -1e6 under the d2l chapter's fill
  bool general = false;      // the current tile was masked element by element (mask_tile)
  const detail::ScoreHook<T>* hook = nullptr;  // the caller's score_mod and mask_mod; set by the caller
  index_t b = 0, h = 0, i0 = 0;                // the block: rows [i0, i0 + rows) of (b, h)

  explicit BlockState(const BlockArrays<T>& arrays) : BlockArrays<T>(arrays) {}

  // Starts rows [i0, i0 + count) of (b, h): empty running state, the row masks. Returns the keys
  // that take part in the block: tiles outside every row's range are skipped.
  KeyRange start(const MaskPlan<T>& mask, index_t batch, index_t head, index_t first, index_t count) {
    b = batch, h = head, i0 = first, rows = count;
    has_keep = mask.keep != nullptr, has_bias = mask.bias != nullptr;
    keep_rows_shared = has_keep && mask.keep_s[2] == 0, bias_rows_shared = has_bias && mask.bias_s[2] == 0;
    keep_stride = mask.keep_s[3], bias_stride = mask.bias_s[3];
    // The d2l chapter's -1e6 fill gives masked keys a weight: element by element. So does a bias whose row
    // offsets a gather's signed lanes cannot hold.
    constexpr index_t kMaxOffset = std::numeric_limits<std::make_signed_t<Word>>::max() / kBlockQ;
    elementwise = (has_keep || has_bias) && (mask.d2l_fill || (has_bias && mask.bias_s[2] > kMaxOffset));
    for (index_t i = 0; i < kBlockQ; ++i)
      bias_rows[i] = static_cast<std::make_signed_t<Word>>(std::min(i, count - 1) * mask.bias_s[2]);
    segments = !mask.seg_q.empty();
    seg_k = mask.segments_k(b);
    alibi = mask.alibi_slope(b, h);
    fill = mask.d2l_fill ? T(-1e6) : -std::numeric_limits<T>::infinity();
    min_end = mask.m, max_begin = 0, keys_m = mask.m;
    KeyRange range{mask.m, 0};
    for (index_t i = 0; i < kBlockQ; ++i) {
      max[i] = -std::numeric_limits<T>::infinity();
      sum[i] = 0;
      begin[i] = 0, end[i] = 0, pos[i] = 0;
      if (i >= rows) continue;
      rm[i] = mask.row(b, h, i0 + i);
      begin[i] = static_cast<T>(rm[i].begin), end[i] = static_cast<T>(rm[i].end), pos[i] = static_cast<T>(rm[i].pos);
      min_end = std::min(min_end, rm[i].end), max_begin = std::max(max_begin, rm[i].begin);
      range.begin = std::min(range.begin, rm[i].begin), range.end = std::max(range.end, rm[i].end);
      if (segments) {
        seg_lo = i == 0 ? rm[i].seg : std::min(seg_lo, rm[i].seg);
        seg_hi = i == 0 ? rm[i].seg : std::max(seg_hi, rm[i].seg);
      }
    }
    if (mask.d2l_fill) range = {0, mask.m};  // every key takes part in every row
    if (range.begin >= range.end) return {};
    range.begin = range.begin / kBlockK * kBlockK;
    return range;
  }

  // Whether keys [j0, j0 + cnt) may hold a key some row of the block attends to: false when no key
  // of the tile shares a segment id with the block's queries (their ranges of ids are disjoint), or
  // when the keep-mask or additive mask (-inf) excludes every key of the tile. Looks at the tile's
  // part of those masks for mask_tile: call it before mask_tile for every tile.
  bool may_attend(index_t j0, index_t cnt) {
    tile_j0 = j0, tile_keep = false, tile_bias = false, tile_bias_masks = false;
    if (segments && fill != T(-1e6)) {
      const auto [lo, hi] = key_segments(j0, cnt);
      if (hi < seg_lo || lo > seg_hi) return false;
    }
    if (elementwise) return true;
    if (j0 + kBlockK < keys_m) prefetch_masks(j0 + kBlockK);
    if (has_keep && !look_at_keep(j0, cnt)) return false;
    if (has_bias && !look_at_bias(j0, cnt)) return false;
    return true;
  }

  // Scores of keys [j0, j0 + cnt) (raw dot products in s) -> mod(cap(scale * score)) + ALiBi +
  // additive mask where allowed, `fill` where masked, with cap(x) = softcap tanh(x / softcap) (the
  // backward's accurate tanh, so that forward and backward agree bit for bit), or x when softcap is
  // 0, and mod the hook's score_mod (masking where its mask_mod says so), or none. tanh_out and
  // raw_out (kBlockK, kBlockQ), when given, receive the tanh and cap(scale * score). Returns whether
  // some row masks a key of the tile outright (its weight is then exactly 0, and the key's value row
  // may hold anything).
  template <class D>
  bool mask_tile(D d, T scale, T softcap, index_t j0, index_t cnt, T* tanh_out = nullptr, T* raw_out = nullptr) {
    using V = hn::Vec<D>;
    const index_t L = static_cast<index_t>(hn::Lanes(d));
    const V vscale = hn::Set(d, scale), vcap = hn::Set(d, softcap);
    const V vcap_inv = hn::Set(d, softcap != T(0) ? T(1) / softcap : T(0));
    general = tile_general(j0, cnt);
    const bool modified = hook != nullptr;  // bias and masks follow score_mod: a second pass
    const bool bounded = max_begin > j0;    // some row's window starts inside or after the tile
    for (index_t jj = 0; jj < cnt; ++jj) {
      T* sj = s + jj * kBlockQ;
      const V vj = hn::Set(d, static_cast<T>(j0 + jj));
      for (index_t i = 0; i < kBlockQ; i += L) {
        V x = hn::Mul(hn::Load(d, sj + i), vscale);
        if (softcap != T(0)) {
          const V t = TanhAccurate(d, hn::Mul(x, vcap_inv));
          if (tanh_out != nullptr) hn::Store(t, d, tanh_out + jj * kBlockQ + i);
          x = hn::Mul(vcap, t);
        }
        hn::Store(general || modified ? x : bias_and_mask(d, x, vj, jj, i, bounded), d, sj + i);
      }
    }
    if (modified) {
      if (raw_out != nullptr) std::copy(s, s + cnt * kBlockQ, raw_out);
      hook->modify(hook->ctx, s, kBlockQ, b, h, i0, rows, j0, cnt);
      if (!general)
        for (index_t jj = 0; jj < cnt; ++jj) {
          T* sj = s + jj * kBlockQ;
          const V vj = hn::Set(d, static_cast<T>(j0 + jj));
          for (index_t i = 0; i < kBlockQ; i += L)
            hn::Store(bias_and_mask(d, hn::Load(d, sj + i), vj, jj, i, bounded), d, sj + i);
        }
    }
    const bool hook_masks = modified && hook->masks;  // mask_mod may mask a key of the tile
    if (general) {
      for (index_t jj = 0; jj < cnt; ++jj) {
        T* sj = s + jj * kBlockQ;
        const index_t j = j0 + jj;
        for (index_t i = 0; i < kBlockQ; ++i) sj[i] = i < rows && rm[i].allowed(j) ? sj[i] + rm[i].bias_at(j) : fill;
      }
      return fill != T(-1e6) || hook_masks;
    }
    return (fill != T(-1e6) && (j0 + cnt > min_end || bounded || tile_keep || tile_bias_masks)) || hook_masks;
  }

  // Whether keys [j0, j0 + cnt) must be masked element by element: a keep or additive mask the SIMD
  // path cannot take (elementwise), or segment ids that differ within the block or the tile.
  bool tile_general(index_t j0, index_t cnt) const {
    return elementwise || (segments && !uniform_segments(j0, cnt));  // under the d2l chapter's fill too
  }

  // Lanes [i, i + Lanes) of key j = tile_j0 + jj's scores x (vj = j in every lane) on a tile that is
  // not masked element by element: ALiBi's bias and the additive mask added, `fill` outside each
  // row's [begin, end) (begin compared only when `bounded`) and where the keep-mask says so.
  template <class D>
  HWY_INLINE hn::Vec<D> bias_and_mask(D d, hn::Vec<D> x, hn::Vec<D> vj, index_t jj, index_t i, bool bounded) const {
    if (alibi != T(0)) x = hn::MulAdd(hn::Set(d, -alibi), hn::Abs(hn::Sub(hn::Load(d, pos + i), vj)), x);
    auto keep = hn::Lt(vj, hn::Load(d, end + i));
    if (tile_bias) {
      const T* key = rm[0].bias + (tile_j0 + jj) * bias_stride;  // row i0's
      const hn::RebindToSigned<D> di;
      const auto bias = bias_rows_shared    ? hn::Set(d, *key)
                        : bias_stride == 1 ? hn::Load(d, bias_t + jj * kBlockQ + i)  // look_at_bias transposed it
                                           : hn::GatherIndex(d, key, hn::Load(di, bias_rows + i));
      x = hn::Add(x, bias);
      // -inf masks its key (a NaN score there is never read), as RowMask::allowed says.
      if (tile_bias_masks) keep = hn::And(keep, hn::Ne(bias, hn::Set(d, -std::numeric_limits<T>::infinity())));
    }
    if (bounded) keep = hn::And(keep, hn::Ge(vj, hn::Load(d, begin + i)));
    if (tile_keep) {
      const hn::RebindToUnsigned<D> du;
      const auto words = hn::Load(du, keep_words + (jj / kWordKeys) * kBlockQ + i);
      keep = hn::And(keep, hn::RebindMask(d, hn::TestBit(words, hn::Set(du, Word(1) << (jj % kWordKeys)))));
    }
    return hn::IfThenElse(keep, x, hn::Set(d, fill));
  }

  // Whether key j of the current tile is allowed for lane i, as mask_tile or weigh_tile decided (for the backward).
  bool allowed(index_t i, index_t j) const {
    return general ? rm[i].allowed(j) : static_cast<T>(j) < end[i] && static_cast<T>(j) >= begin[i];
  }

  // Whether every row of the block attends every key of [j0, j0 + cnt) with its score as it is: a
  // whole block, no key outside a row's range, and no keep-mask, additive mask, segment ids, ALiBi,
  // soft-capping or score_mod acting on the tile; and a scale > 0, so that the largest scaled score
  // is the scale times the largest score (a negative one would make it the smallest). Call it after
  // may_attend.
  bool plain_tile(T scale, T softcap, index_t j0, index_t cnt) const {
    return scale > T(0) && rows == kBlockQ && j0 + cnt <= min_end && max_begin <= j0 && hook == nullptr &&
           softcap == T(0) && alibi == T(0) && !tile_keep && !tile_bias && !tile_general(j0, cnt);
  }

  // The scores of keys [j0, j0 + cnt) (raw dot products in s) -> their weights: mask_tile, then
  // softmax_tile; on a plain tile (plain_tile), the scale is applied inside the softmax step, with
  // the same roundings, and the pass of mask_tile is saved (it took an eighth of the bfloat16
  // forward's time on a Zen 5). Returns mask_tile's answer (false on a plain tile).
  template <bool kTileSumInFloat = false, class D>
  bool weigh_tile(D d, T scale, T softcap, index_t j0, index_t cnt) {
    if (plain_tile(scale, softcap, j0, cnt)) {
      general = false;
      softmax_tile<kTileSumInFloat>(d, cnt, scale);
      return false;
    }
    const bool partial = mask_tile(d, scale, softcap, j0, cnt);
    softmax_tile<kTileSumInFloat>(d, cnt);
    return partial;
  }

  // The online softmax step of one tile: new running maximum, alpha = exp(old max - new max),
  // s = exp(scale s - new max) (the tile's weights, unnormalised), sum = alpha sum + the tile's row
  // sums. (Scale > 0: the maximum of the scaled scores is scale times that of the scores, as rounding
  // keeps their order.)
  // The row sums are kept in double; with kTileSumInFloat a tile's (at most kBlockK terms, each at
  // most 1) is first summed in T, within 63 ulp of T, and only then widened: the bfloat16 kernel's
  // choice, whose weights are rounded to bfloat16 (2^-9) before they are used anyway.
  template <bool kTileSumInFloat = false, class D>
  void softmax_tile(D d, index_t cnt, T scale = T(1)) {
    using V = hn::Vec<D>;
    const WideTag<D> dw;
    const index_t L = static_cast<index_t>(hn::Lanes(d));
    const V ninf = hn::Set(d, -std::numeric_limits<T>::infinity()), vscale = hn::Set(d, scale);
    const bool scaled = scale != T(1);
    for (index_t i = 0; i < kBlockQ; i += L) {
      V tile_max = ninf;
      for (index_t jj = 0; jj < cnt; ++jj) tile_max = hn::Max(tile_max, hn::Load(d, s + jj * kBlockQ + i));
      if (scaled) tile_max = hn::Mul(tile_max, vscale);
      const V old_max = hn::Load(d, max + i);
      const V new_max = hn::Max(old_max, tile_max);
      // A row that has seen only masked keys keeps max -inf: subtract 0 instead (exp(-inf) = 0).
      const V shift = hn::IfThenZeroElse(hn::Eq(new_max, ninf), new_max);
      hn::Store(new_max, d, max + i);
      hn::Store(ExpWeight(d, hn::Sub(old_max, shift)), d, alpha + i);
      hn::Vec<WideTag<D>> lo = hn::Zero(dw), hi = hn::Zero(dw);
      V tile_sum = hn::Zero(d);
      for (index_t jj = 0; jj < cnt; ++jj) {
        T* sj = s + jj * kBlockQ + i;
        const V x = hn::Load(d, sj);
        const V w = ExpWeight(d, hn::Sub(scaled ? hn::Mul(x, vscale) : x, shift));
        hn::Store(w, d, sj);
        if constexpr (kTileSumInFloat) {
          tile_sum = hn::Add(tile_sum, w);
        } else {
          AddWide(d, dw, w, lo, hi);
        }
      }
      if constexpr (kTileSumInFloat) AddWide(d, dw, tile_sum, lo, hi);
      const index_t W = static_cast<index_t>(hn::Lanes(dw));
      hn::StoreU(lo, dw, tsum + i);
      if (W < L) hn::StoreU(hi, dw, tsum + i + W);
    }
    for (index_t i = 0; i < kBlockQ; ++i) sum[i] = sum[i] * static_cast<double>(alpha[i]) + tsum[i];
  }

  // Dropout of the tile's weights (after their sum was taken: the softmax is normalised before
  // dropout): a kept weight is scaled by 1/(1-p), a dropped one becomes 0. One Philox call serves
  // four keys: j0 is a multiple of 4 (a plan shifted to another key start draws key by key).
  void drop_tile(const DropoutPlan& dropout, index_t bh, index_t i0, index_t count, index_t j0, index_t cnt) {
    const T scale = static_cast<T>(dropout.scale);
    if (dropout.shifted()) {
      for (index_t i = 0; i < count; ++i)
        for (index_t jj = 0; jj < cnt; ++jj) {
          T& w = s[jj * kBlockQ + i];
          w = dropout.keep(bh, i0 + i, j0 + jj) ? w * scale : T(0);
        }
      return;
    }
    for (index_t i = 0; i < count; ++i)
      for (index_t jj = 0; jj < cnt; jj += 4) {
        const auto r = dropout.draw(bh, i0 + i, (j0 + jj) >> 2);
        for (index_t t = 0; t < 4 && jj + t < cnt; ++t) {
          T& w = s[(jj + t) * kBlockQ + i];
          w = r[static_cast<int>(t)] >= dropout.threshold ? w * scale : T(0);
        }
      }
  }

  // x (count, kBlockQ) *= alpha, lane by lane: earlier partial sums follow the new maximum.
  template <class D>
  void rescale(D d, T* x, index_t count) const {
    const index_t L = static_cast<index_t>(hn::Lanes(d));
    for (index_t i = 0; i < kBlockQ; i += L) {
      const hn::Vec<D> a = hn::Load(d, alpha + i);
      for (index_t r = 0; r < count; ++r) hn::Store(hn::Mul(hn::Load(d, x + r * kBlockQ + i), a), d, x + r * kBlockQ + i);
    }
  }

  // ot (v, kBlockQ) += V_tile^T s, skipping zero weights (see AccumulateSkippingZeros).
  void accumulate_skipping_zeros(const T* v0, index_t v_stride, index_t cnt, index_t v, index_t count) {
    AccumulateSkippingZeros(ot, v0, v_stride, s, cnt, v, count);
  }

 private:
  // Bits of the keys [0, cnt) of a keep-mask row read with `stride` (bit jj: key jj kept).
  static std::uint64_t RowKeepBits(const bool* row, index_t stride, index_t cnt) {
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(row);
    std::uint64_t bits = 0;
    index_t jj = 0;
#if HWY_TARGET != HWY_SCALAR
    if (stride == 1) {  // whole vectors of bytes -> their mask bits
      const hn::ScalableTag<std::uint8_t> du8;
      const index_t N = static_cast<index_t>(hn::Lanes(du8));  // a multiple of 8, at most 64
      for (; jj + N <= cnt; jj += N) {
        std::uint8_t packed[8] = {};
        hn::StoreMaskBits(du8, hn::Ne(hn::LoadU(du8, bytes + jj), hn::Zero(du8)), packed);
        std::uint64_t w = 0;
        std::memcpy(&w, packed, static_cast<std::size_t>(N / 8));
        bits |= w << jj;
      }
    }
#endif
    for (; jj < cnt; ++jj) bits |= static_cast<std::uint64_t>(bytes[jj * stride] != 0) << jj;
    return bits;
  }

  // Asks for the masks' part of the tile at keys j0.. while the current one computes: each row's part
  // is a short run in a long row (64 bytes of a bool mask, 256 of a float one), which the hardware
  // prefetcher does not foresee; unfetched, a mask of (n, m) floats cost a fifth of the kernel's time.
  void prefetch_masks(index_t j0) const {
    const index_t kLine = 64;
    if (has_keep && keep_stride == 1)
      for (index_t i = 0; i < (keep_rows_shared ? 1 : rows); ++i) {
        const auto* row = reinterpret_cast<const char*>(rm[i].keep + j0);
        hwy::Prefetch(row), hwy::Prefetch(row + kBlockK - 1);
      }
    if (has_bias && bias_stride == 1)
      for (index_t i = 0; i < (bias_rows_shared ? 1 : rows); ++i) {
        const auto* row = reinterpret_cast<const char*>(rm[i].bias + j0);
        for (index_t c = 0; c < kBlockK * static_cast<index_t>(sizeof(T)); c += kLine) hwy::Prefetch(row + c);
        hwy::Prefetch(row + kBlockK * sizeof(T) - 1);
      }
  }

  // The keep-mask's part of the tile as bits (keep_words); false when it keeps no key of the block's
  // rows. tile_keep: some key of some row is masked.
  bool look_at_keep(index_t j0, index_t cnt) {
    const std::uint64_t valid = cnt >= 64 ? ~std::uint64_t(0) : (std::uint64_t(1) << cnt) - 1;
    std::uint64_t bits[kBlockQ] = {};  // rows past the block's keep no key
    std::uint64_t all = valid, any = 0;
    for (index_t i = 0; i < rows; ++i) {
      bits[i] = keep_rows_shared && i > 0 ? bits[0] : RowKeepBits(rm[i].keep + j0 * keep_stride, keep_stride, cnt);
      all &= bits[i], any |= bits[i];
    }
    tile_keep = (all & valid) != valid;
    if (tile_keep)
      for (index_t k = 0; k < kBlockK / kWordKeys; ++k)
        for (index_t i = 0; i < kBlockQ; ++i) keep_words[k * kBlockQ + i] = static_cast<Word>(bits[i] >> (k * kWordKeys));
    return any != 0;
  }

  // Whether the additive mask's part of the tile has an entry that is not -inf (false: the tile is
  // masked); tile_bias: some entry is not 0 (a tile of zeros adds nothing and is not read again);
  // tile_bias_masks: some entry is -inf (a weight of exactly 0).
  bool look_at_bias(index_t j0, index_t cnt) {
    const hn::ScalableTag<T> d;
    const index_t L = static_cast<index_t>(hn::Lanes(d));
    const auto zero = hn::Zero(d), ninf = hn::Set(d, -std::numeric_limits<T>::infinity());
    auto nonzero = hn::FirstN(d, 0), finite = nonzero, masks = nonzero;  // lanes: some entry was not 0, not -inf, -inf
    bool tail_nonzero = false, tail_finite = false, tail_masks = false;
    for (index_t i = 0; i < (bias_rows_shared ? 1 : rows); ++i) {
      const T* row = rm[i].bias + j0 * bias_stride;
      index_t jj = 0;
      if (bias_stride == 1)
        for (; jj + L <= cnt; jj += L) {
          const auto v = hn::LoadU(d, row + jj);
          nonzero = hn::Or(nonzero, hn::Ne(v, zero));
          finite = hn::Or(finite, hn::Ne(v, ninf));
          masks = hn::Or(masks, hn::Eq(v, ninf));
        }
      for (; jj < cnt; ++jj) {
        const T v = row[jj * bias_stride];
        tail_nonzero = tail_nonzero || v != T(0);
        tail_finite = tail_finite || v != -std::numeric_limits<T>::infinity();
        tail_masks = tail_masks || v == -std::numeric_limits<T>::infinity();
      }
    }
    tile_bias = tail_nonzero || !hn::AllFalse(d, nonzero);
    if (tile_bias && !bias_rows_shared && bias_stride == 1) {  // rows past the block's: 0 (they are masked)
      TransposeInto(bias_t, kBlockQ, rm[0].bias + j0, rm[std::min<index_t>(1, rows - 1)].bias - rm[0].bias, rows, cnt);
      for (index_t jj = 0; jj < cnt; ++jj) std::fill(bias_t + jj * kBlockQ + rows, bias_t + (jj + 1) * kBlockQ, T(0));
    }
    tile_bias_masks = tail_masks || !hn::AllFalse(d, masks);
    return tail_finite || !hn::AllFalse(d, finite);
  }

  // The smallest and largest segment id of keys [j0, j0 + cnt).
  std::pair<std::int64_t, std::int64_t> key_segments(index_t j0, index_t cnt) const {
    std::int64_t lo = seg_k[j0], hi = lo;
    for (index_t j = j0 + 1; j < j0 + cnt; ++j) lo = std::min(lo, seg_k[j]), hi = std::max(hi, seg_k[j]);
    return {lo, hi};
  }
  // Whether every query of the block and every key of the tile have one segment id: the segments
  // then mask nothing in the tile.
  bool uniform_segments(index_t j0, index_t cnt) const {
    if (seg_lo != seg_hi) return false;
    const auto [lo, hi] = key_segments(j0, cnt);
    return lo == seg_lo && hi == seg_lo;
  }
};

}  // namespace attn::cpu::fused::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // ATTN_CPU_SIMD_SOFTMAX_INL_H_
