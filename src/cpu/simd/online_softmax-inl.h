// The online softmax of one block of kBlockQ queries over the key tiles streaming past (Highway
// "-inl.h" convention, like softmax-inl.h, whose BlockState is built on it). A tile's scores are
// (kBlockK, kBlockQ): each query is a lane, so every row's running maximum and sum update with plain
// vector ops. After the last tile, row i's weights of key j are exp(s_ij - max_i) / sum_i: the
// tiles' weights as left in s, each later multiplied by the alphas of the tiles after it (rescale).

#if defined(ATTN_CPU_SIMD_ONLINE_SOFTMAX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_CPU_SIMD_ONLINE_SOFTMAX_INL_H_
#undef ATTN_CPU_SIMD_ONLINE_SOFTMAX_INL_H_
#else
#define ATTN_CPU_SIMD_ONLINE_SOFTMAX_INL_H_
#endif

#include <limits>

#include <hwy/highway.h>

#include "cpu/simd/fused.hpp"
#include "cpu/simd/gemm-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::fused::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The running state, over arrays of BlockArrays: s (kBlockK, kBlockQ) the current tile's scores,
// then weights; max the running row maximum (-inf while a row has seen no key); alpha exp(previous
// max - new max) of the current tile; sum the running sum of exp(score - max), in double; tsum the
// current tile's part of it.
template <class T>
struct OnlineSoftmax {
  T* s;
  T* max;
  T* alpha;
  double* sum;
  double* tsum;

  // Every row has seen no key.
  void reset() {
    for (index_t i = 0; i < kBlockQ; ++i) max[i] = -std::numeric_limits<T>::infinity(), sum[i] = 0;
  }

  // The step of one tile of cnt keys: new running maximum, alpha = exp(old max - new max), s =
  // exp(scale s - new max) (the tile's weights, unnormalised), sum = alpha sum + the tile's row sums.
  // Scale > 0: the maximum of the scaled scores is scale times that of the scores, as rounding keeps
  // their order. The row sums are kept in double; with kTileSumInFloat a tile's (at most kBlockK
  // terms, each at most 1) is first summed in T, within 63 ulp of T, and only then widened: the
  // forwards' choice (2-5% of the float32 forward's time at d = 64 and 128, against widening every
  // term), whose error stays below the exp's own and does not grow with the number of tiles.
  // With a `bias` (lanes [i, i + L) of key jj's additive mask, none of them -inf), the tile's
  // scores become scale s + bias in the maximum's pass, stored back: mask_tile's Mul and Add, in one
  // pass over the tile instead of two.
  template <bool kTileSumInFloat = false, class D, class Bias = std::nullptr_t>
  void step(D d, index_t cnt, T scale = T(1), const Bias& bias = nullptr) {
    using V = hn::Vec<D>;
    constexpr bool kBiased = !std::is_same_v<Bias, std::nullptr_t>;
    const WideTag<D> dw;
    const index_t L = static_cast<index_t>(hn::Lanes(d));
    const V ninf = hn::Set(d, -std::numeric_limits<T>::infinity()), vscale = hn::Set(d, scale);
    const bool scaled = scale != T(1) && !kBiased;  // the exp pass's scale (a biased tile's is applied)
    for (index_t i = 0; i < kBlockQ; i += L) {
      V tile_max = ninf;
      if constexpr (kBiased) {
        for (index_t jj = 0; jj < cnt; ++jj) {
          const V x = hn::Add(hn::Mul(hn::Load(d, s + jj * kBlockQ + i), vscale), bias(jj, i));
          hn::Store(x, d, s + jj * kBlockQ + i);
          tile_max = hn::Max(tile_max, x);
        }
      } else {
        for (index_t jj = 0; jj < cnt; ++jj) tile_max = hn::Max(tile_max, hn::Load(d, s + jj * kBlockQ + i));
        if (scaled) tile_max = hn::Mul(tile_max, vscale);
      }
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

  // x (count, kBlockQ) *= alpha, lane by lane: earlier partial sums follow the new maximum.
  template <class D>
  void rescale(D d, T* x, index_t count) const {
    const index_t L = static_cast<index_t>(hn::Lanes(d));
    for (index_t i = 0; i < kBlockQ; i += L) {
      const hn::Vec<D> a = hn::Load(d, alpha + i);
      for (index_t r = 0; r < count; ++r) hn::Store(hn::Mul(hn::Load(d, x + r * kBlockQ + i), a), d, x + r * kBlockQ + i);
    }
  }
};

}  // namespace attn::cpu::fused::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // ATTN_CPU_SIMD_ONLINE_SOFTMAX_INL_H_
