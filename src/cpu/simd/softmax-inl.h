// Per-target weighing of the key tiles of one block of kBlockQ queries (Highway "-inl.h"
// convention, like gemm-inl.h): BlockState puts together the block's units (tile plan, mask bits,
// score modifiers, online softmax; each in its own header). Scores of a tile are stored transposed,
// (kBlockK, kBlockQ): each query is a lane, so the running maximum and sum of every query update
// with plain vector ops.
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
#include <limits>

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include "cpu/simd/fused.hpp"
#include "cpu/simd/gemm-inl.h"
#include "cpu/simd/mask_bits-inl.h"
#include "cpu/simd/online_softmax-inl.h"
#include "cpu/simd/score_mods-inl.h"
#include "cpu/simd/tile_plan.hpp"

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

// The state of one block of queries while its key tiles stream past, over arrays laid out by the
// caller (BlockArrays, simd/fused.hpp): the block's jobs put together. TilePlan (tile_plan.hpp)
// skips tiles no row attends; KeepBits (mask_bits-inl.h) and BiasTile (score_mods-inl.h) read a
// keep-mask's and an additive mask's part of each tile; CapTanh and AddAlibi (score_mods-inl.h)
// modify scores; OnlineSoftmax (online_softmax-inl.h) turns them into weights. Queries past the end
// of the block (the last block of a head) are padding lanes: every key is masked for them and
// nothing of them is stored.
template <class T>
struct BlockState : BlockArrays<T>, TilePlan<T>, KeepBits<T>, BiasTile<T> {
  // qt (d, kBlockQ) queries transposed; s (kBlockK, kBlockQ) scores, then weights, of the current
  // tile; ot (v, kBlockQ) unnormalised output transposed; max, alpha, sum, tsum: the online
  // softmax's; begin, end: keys outside [begin, end) are masked (valid lengths, causal rule,
  // window), as T for lane compares; pos: the queries' positions p(i) (ALiBi); rm: the row masks.
  using BlockArrays<T>::qt, BlockArrays<T>::s, BlockArrays<T>::ot, BlockArrays<T>::max, BlockArrays<T>::alpha,
      BlockArrays<T>::begin, BlockArrays<T>::end, BlockArrays<T>::pos, BlockArrays<T>::sum, BlockArrays<T>::rm;
  using TilePlan<T>::rows, TilePlan<T>::keys_m, TilePlan<T>::segments;
  using KeepBits<T>::has_keep, KeepBits<T>::tile_keep;
  using BiasTile<T>::has_bias, BiasTile<T>::bias_stride, BiasTile<T>::tile_bias, BiasTile<T>::tile_bias_masks;
  OnlineSoftmax<T> online;
  bool elementwise = false;  // a keep or additive mask the SIMD path cannot take: every tile masked element by element
  T alibi = 0;               // the head's ALiBi slope, 0 for none
  T fill = 0;                // what a masked score becomes: -inf, or -1e6 under the d2l chapter's fill
  bool general = false;      // the current tile was masked element by element (mask_tile)
  const detail::ScoreHook<T>* hook = nullptr;  // the caller's score_mod and mask_mod; set by the caller
  index_t b = 0, h = 0, i0 = 0;                // the block: rows [i0, i0 + rows) of (b, h)

  explicit BlockState(const BlockArrays<T>& arrays)
      : BlockArrays<T>(arrays), KeepBits<T>(arrays.keep_words), BiasTile<T>(arrays.bias_rows, arrays.bias_t),
        online{arrays.s, arrays.max, arrays.alpha, arrays.sum, arrays.tsum} {}

  // Starts rows [i0, i0 + count) of (b, h): empty running state, the row masks. Returns the keys
  // that take part in the block: tiles outside every row's range are skipped.
  KeyRange start(const MaskPlan<T>& mask, index_t batch, index_t head, index_t first, index_t count) {
    b = batch, h = head, i0 = first;
    KeepBits<T>::start(mask);
    BiasTile<T>::start(mask, b, h, i0, count);
    // The d2l chapter's -1e6 fill gives masked keys a weight: element by element. So does a bias whose row
    // offsets a gather's signed lanes cannot hold.
    elementwise = (has_keep || has_bias) && (mask.d2l_fill || (has_bias && mask.bias_s[2] > BiasTile<T>::kMaxOffset));
    alibi = mask.alibi_slope(b, h);
    fill = mask.d2l_fill ? T(-1e6) : -std::numeric_limits<T>::infinity();
    online.reset();
    for (index_t i = 0; i < kBlockQ; ++i) {
      begin[i] = 0, end[i] = 0, pos[i] = 0;
      if (i >= count) continue;
      rm[i] = mask.row(b, h, i0 + i);
      begin[i] = static_cast<T>(rm[i].begin), end[i] = static_cast<T>(rm[i].end), pos[i] = static_cast<T>(rm[i].pos);
    }
    return TilePlan<T>::plan(mask, b, rm, count);
  }

  // Whether keys [j0, j0 + cnt) may hold a key some row of the block attends to: false when no key
  // of the tile shares a segment id with the block's queries (their ranges of ids are disjoint), or
  // when the keep-mask or additive mask (-inf) excludes every key of the tile. Looks at the tile's
  // part of those masks for mask_tile: call it before mask_tile for every tile.
  bool may_attend(index_t j0, index_t cnt) {
    tile_keep = false, tile_bias = false, tile_bias_masks = false;
    if (!this->segments_meet(j0, cnt)) return false;
    if (elementwise) return true;
    if (j0 + kBlockK < keys_m) {  // the next tile's masks, while this one computes
      this->prefetch_keep(rm, rows, j0 + kBlockK);
      this->prefetch_bias(rm, rows, j0 + kBlockK);
    }
    if (has_keep && !this->look_at_keep(rm, rows, j0, cnt)) return false;
    if (has_bias && !this->look_at_bias(rm, rows, j0, cnt)) return false;
    return true;
  }

  // Scores of keys [j0, j0 + cnt) (raw dot products in s) -> mod(cap(scale * score)) + ALiBi +
  // additive mask where allowed, `fill` where masked, with cap(x) = softcap tanh(x / softcap)
  // (CapTanh), or x when softcap is 0, and mod the hook's score_mod (masking where its mask_mod says
  // so), or none. tanh_out and raw_out (kBlockK, kBlockQ), when given, receive the tanh and cap(scale
  // * score). Returns whether some row masks a key of the tile outright (its weight is then exactly 0,
  // and the key's value row may hold anything).
  template <class D>
  bool mask_tile(D d, T scale, T softcap, index_t j0, index_t cnt, T* tanh_out = nullptr, T* raw_out = nullptr) {
    using V = hn::Vec<D>;
    const index_t L = static_cast<index_t>(hn::Lanes(d));
    const V vscale = hn::Set(d, scale), vcap = hn::Set(d, softcap);
    const V vcap_inv = hn::Set(d, softcap != T(0) ? T(1) / softcap : T(0));
    general = tile_general(j0, cnt);
    const bool modified = hook != nullptr;          // bias and masks follow score_mod: a second pass
    const bool bounded = this->cuts_left(j0);       // some row's window starts inside or after the tile
    for (index_t jj = 0; jj < cnt; ++jj) {
      T* sj = s + jj * kBlockQ;
      const V vj = hn::Set(d, static_cast<T>(j0 + jj));
      for (index_t i = 0; i < kBlockQ; i += L) {
        V x = hn::Mul(hn::Load(d, sj + i), vscale);
        if (softcap != T(0)) {
          const V t = CapTanh(d, x, vcap_inv);
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
      return !this->d2l_fill || hook_masks;
    }
    return (!this->d2l_fill && (this->cuts(j0, cnt) || tile_keep || tile_bias_masks)) || hook_masks;
  }

  // Whether keys [j0, j0 + cnt) must be masked element by element: a keep or additive mask the SIMD
  // path cannot take (elementwise), or segment ids that differ within the block or the tile.
  bool tile_general(index_t j0, index_t cnt) const {
    return elementwise || (segments && !this->uniform_segments(j0, cnt));  // under the d2l chapter's fill too
  }

  // Lanes [i, i + Lanes) of key j = j0 + jj's scores x (vj = j in every lane) on a tile that is
  // not masked element by element: ALiBi's bias and the additive mask added, `fill` outside each
  // row's [begin, end) (begin compared only when `bounded`) and where the keep-mask says so.
  template <class D>
  HWY_INLINE hn::Vec<D> bias_and_mask(D d, hn::Vec<D> x, hn::Vec<D> vj, index_t jj, index_t i, bool bounded) const {
    if (alibi != T(0)) x = AddAlibi(d, x, alibi, hn::Load(d, pos + i), vj);
    auto keep = hn::Lt(vj, hn::Load(d, end + i));
    if (tile_bias) {
      const auto bias = BiasTile<T>::lanes(d, jj, i);
      x = hn::Add(x, bias);
      // -inf masks its key (a NaN score there is never read), as RowMask::allowed says.
      if (tile_bias_masks) keep = hn::And(keep, hn::Ne(bias, hn::Set(d, -std::numeric_limits<T>::infinity())));
    }
    if (bounded) keep = hn::And(keep, hn::Ge(vj, hn::Load(d, begin + i)));
    if (tile_keep) keep = hn::And(keep, this->kept(d, jj, i));
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
    return scale > T(0) && this->whole(j0, cnt) && hook == nullptr && softcap == T(0) && alibi == T(0) && !tile_keep &&
           !tile_bias && !tile_general(j0, cnt);
  }
  // The same, but with an additive mask that adds something to the tile and masks none of its keys
  // (no -inf): its scores are scale s + bias, whatever any of them is.
  bool biased_plain_tile(index_t j0, index_t cnt) const {
    return this->whole(j0, cnt) && hook == nullptr && alibi == T(0) && !tile_keep && tile_bias && !tile_bias_masks &&
           !tile_general(j0, cnt);
  }

  // The scores of keys [j0, j0 + cnt) (raw dot products in s) -> their weights: mask_tile, then
  // softmax_tile; on a plain tile (plain_tile), the scale is applied inside the softmax step, with
  // the same roundings, and the pass of mask_tile is saved (it took an eighth of the bfloat16
  // forward's time on a Zen 5); so are the scale and an additive mask on a tile that only the
  // additive mask changes and without -inf (biased_plain_tile): its scores become scale s + bias in
  // the softmax's first pass, with mask_tile's operations. Returns mask_tile's answer (false on
  // either kind of tile).
  template <bool kTileSumInFloat = false, class D>
  bool weigh_tile(D d, T scale, T softcap, index_t j0, index_t cnt) {
    if (plain_tile(scale, softcap, j0, cnt)) {
      general = false;
      softmax_tile<kTileSumInFloat>(d, cnt, scale);
      return false;
    }
    if (softcap == T(0) && biased_plain_tile(j0, cnt)) {  // the additive mask added in the softmax's first pass
      general = false;
      if (!this->bias_rows_shared && bias_stride == 1) {
        // The transposed tile (the usual layout) read straight: through BiasTile::lanes, the step
        // reloaded the tile's fields and chose its layout again on every key (2-3% of the forward
        // with a (1, 1, 2048, 2048) mask, one thread).
        const T* transposed = this->transposed;
        online.template step<kTileSumInFloat>(
            d, cnt, scale, [transposed, d](index_t jj, index_t i) { return hn::Load(d, transposed + jj * kBlockQ + i); });
      } else {
        online.template step<kTileSumInFloat>(d, cnt, scale, [&](index_t jj, index_t i) { return BiasTile<T>::lanes(d, jj, i); });
      }
      return false;
    }
    const bool partial = mask_tile(d, scale, softcap, j0, cnt);
    softmax_tile<kTileSumInFloat>(d, cnt);
    return partial;
  }

  // The online softmax step of one tile (OnlineSoftmax::step).
  template <bool kTileSumInFloat = false, class D>
  void softmax_tile(D d, index_t cnt, T scale = T(1)) {
    online.template step<kTileSumInFloat>(d, cnt, scale);
  }

  // Dropout of the tile's weights (after their sum was taken: the softmax is normalised before
  // dropout): a kept weight is scaled by 1/(1-p), a dropped one becomes 0. One Philox call serves
  // four keys: j0 is a multiple of 4 (a plan shifted to another key start draws key by key).
  void drop_tile(const DropoutPlan& dropout, index_t bh, index_t first, index_t count, index_t j0, index_t cnt) {
    const T scale = static_cast<T>(dropout.scale);
    if (dropout.shifted()) {
      for (index_t i = 0; i < count; ++i)
        for (index_t jj = 0; jj < cnt; ++jj) {
          T& w = s[jj * kBlockQ + i];
          w = dropout.keep(bh, first + i, j0 + jj) ? w * scale : T(0);
        }
      return;
    }
    for (index_t i = 0; i < count; ++i)
      for (index_t jj = 0; jj < cnt; jj += 4) {
        const auto r = dropout.draw(bh, first + i, (j0 + jj) >> 2);
        for (index_t t = 0; t < 4 && jj + t < cnt; ++t) {
          T& w = s[(jj + t) * kBlockQ + i];
          w = r[static_cast<int>(t)] >= dropout.threshold ? w * scale : T(0);
        }
      }
  }

  // x (count, kBlockQ) *= alpha, lane by lane: earlier partial sums follow the new maximum.
  template <class D>
  void rescale(D d, T* x, index_t count) const {
    online.rescale(d, x, count);
  }

  // ot (v, kBlockQ) += V_tile^T s, skipping zero weights (see AccumulateSkippingZeros).
  void accumulate_skipping_zeros(const T* v0, index_t v_stride, index_t cnt, index_t v, index_t count) {
    AccumulateSkippingZeros(ot, v0, v_stride, s, cnt, v, count);
  }
};

}  // namespace attn::cpu::fused::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // ATTN_CPU_SIMD_SOFTMAX_INL_H_
