// What changes a score before the softmax, lane by lane (Highway "-inl.h" convention, like
// softmax-inl.h, whose BlockState is built on these): soft-capping, ALiBi's distance bias, and an
// additive mask's part of a key tile. Scores are laid out as in softmax-inl.h: key jj of a tile is a
// row of kBlockQ query lanes.

#if defined(ATTN_CPU_SIMD_SCORE_MODS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_CPU_SIMD_SCORE_MODS_INL_H_
#undef ATTN_CPU_SIMD_SCORE_MODS_INL_H_
#else
#define ATTN_CPU_SIMD_SCORE_MODS_INL_H_
#endif

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <type_traits>

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include "core/mask_plan.hpp"
#include "cpu/simd/fused.hpp"
#include "cpu/simd/gemm-inl.h"
#include "cpu/simd/tanh-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::fused::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Soft-capping's tanh(x / cap) of scores x, given cap_inv = 1 / cap: the capped score is cap times it
// (Mul(cap, t)), and the backward's gradient factor 1 - t^2. The accurate tanh (tanh-inl.h), so that
// forward and backward agree bit for bit.
template <class D>
HWY_INLINE hn::Vec<D> CapTanh(D d, hn::Vec<D> x, hn::Vec<D> cap_inv) {
  return TanhAccurate(d, hn::Mul(x, cap_inv));
}

// ALiBi: x - slope |p - j| for query positions p and key index j (both as lanes; one rounding where
// the target fuses multiply and add).
template <class D>
HWY_INLINE hn::Vec<D> AddAlibi(D d, hn::Vec<D> x, hn::TFromD<D> slope, hn::Vec<D> p, hn::Vec<D> j) {
  return hn::MulAdd(hn::Set(d, -slope), hn::Abs(hn::Sub(p, j)), x);
}

// An additive mask's part of a block's key tile: whether it masks the whole tile (-inf everywhere),
// adds nothing (0 everywhere: the tile is not read again) or must be added, and then its entries as
// lanes: one shared row, the tile transposed (rows of stride 1), or a gather by row offsets.
template <class T>
struct BiasTile {
  using SWord = std::make_signed_t<typename BlockArrays<T>::Word>;
  SWord* offsets;                 // (kBlockQ): row i0 + min(i, rows - 1)'s offset from row i0 (BlockArrays::bias_rows)
  T* transposed;                  // (kBlockK, kBlockQ): the tile's entries transposed (BlockArrays::bias_t)
  bool has_bias = false;          // the mask has an additive mask
  bool bias_rows_shared = false;  // every row of (b, h) reads one row of it (stride 0 over queries)
  index_t bias_stride = 0;        // its stride over keys
  const T* bias_tile = nullptr;   // row i0's entry of the tile's first key
  bool tile_bias = false;         // some entry of the tile is not 0: lanes() must be added
  bool tile_bias_masks = false;   // some entry of the tile is -inf: a weight of exactly 0
  std::atomic<std::uint8_t>* classes = nullptr;  // the block's cells of the call's BiasTileClasses, or none
  index_t bias_keys = 0;                         // the mask's keys

  BiasTile(SWord* row_offsets, T* tile_transposed) : offsets(row_offsets), transposed(tile_transposed) {}

  // A bias whose row offsets a gather's signed lanes cannot hold is masked element by element.
  static constexpr index_t kMaxOffset = std::numeric_limits<SWord>::max() / kBlockQ;

  // Starts rows [i0, i0 + count) of (b, h): the offsets of its rows (lanes past it repeat the last
  // row), and its row of the call's tile classes where the block is a whole one of the table's.
  void start(const MaskPlan<T>& mask, index_t b, index_t h, index_t i0, index_t count) {
    has_bias = mask.bias != nullptr;
    bias_rows_shared = has_bias && mask.bias_s[2] == 0;
    bias_stride = mask.bias_s[3];
    for (index_t i = 0; i < kBlockQ; ++i) offsets[i] = static_cast<SWord>(std::min(i, count - 1) * mask.bias_s[2]);
    const BiasTileClasses* table = mask.bias_classes;
    classes = table != nullptr && table->rows_per_block == kBlockQ && table->keys_per_tile == kBlockK &&
                      i0 % kBlockQ == 0 && count == std::min(kBlockQ, mask.n - i0)
                  ? table->row(b, h, i0)
                  : nullptr;
    bias_keys = mask.m;
  }

  // Whether the additive mask's part of keys [j0, j0 + cnt) of rows rm[0, rows) has an entry that is
  // not -inf (false: the tile is masked); sets tile_bias and tile_bias_masks, and, for rows of stride
  // 1 that are not shared, the transposed tile (lanes past `rows`: 0, they are masked). A whole tile
  // whose cell of the call's table is filled is not scanned again; a scanned one fills its cell.
  bool look_at_bias(const RowMask<T>* rm, index_t rows, index_t j0, index_t cnt) {
    using Classes = BiasTileClasses;
    std::atomic<std::uint8_t>* cell = cnt == std::min(kBlockK, bias_keys - j0) ? cell_of(j0) : nullptr;
    std::uint8_t found = cell != nullptr ? cell->load(std::memory_order_relaxed) : 0;
    if (!(found & Classes::kKnown)) {
      found = Classes::kKnown | scan_bias(rm, rows, j0, cnt);
      if (cell != nullptr) cell->store(found, std::memory_order_relaxed);
    }
    bias_tile = rm[0].bias + j0 * bias_stride;
    tile_bias = (found & Classes::kNonzero) != 0;
    tile_bias_masks = (found & Classes::kMasks) != 0;
    if (!(found & Classes::kFinite)) return false;
    if (tile_bias && !bias_rows_shared && bias_stride == 1) {
      TransposeInto(transposed, kBlockQ, rm[0].bias + j0, rm[std::min<index_t>(1, rows - 1)].bias - rm[0].bias, rows, cnt);
      for (index_t jj = 0; jj < cnt; ++jj) std::fill(transposed + jj * kBlockQ + rows, transposed + (jj + 1) * kBlockQ, T(0));
    }
    return true;
  }

  // The block's cell of the call's table for the whole tile of keys from j0, or none.
  std::atomic<std::uint8_t>* cell_of(index_t j0) const {
    return classes != nullptr && j0 % kBlockK == 0 ? classes + j0 / kBlockK : nullptr;
  }

  // The BiasTileClasses bits of the additive mask's part of keys [j0, j0 + cnt) of rows rm[0, rows).
  std::uint8_t scan_bias(const RowMask<T>* rm, index_t rows, index_t j0, index_t cnt) const {
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
    using Classes = BiasTileClasses;
    return static_cast<std::uint8_t>((tail_finite || !hn::AllFalse(d, finite) ? Classes::kFinite : 0) |
                                     (tail_nonzero || !hn::AllFalse(d, nonzero) ? Classes::kNonzero : 0) |
                                     (tail_masks || !hn::AllFalse(d, masks) ? Classes::kMasks : 0));
  }

  // The entries of key jj of the tile look_at_bias last looked at, lanes [i, i + Lanes(d)) (only
  // when tile_bias).
  template <class D>
  HWY_INLINE hn::Vec<D> lanes(D d, index_t jj, index_t i) const {
    const T* key = bias_tile + jj * bias_stride;  // row i0's
    const hn::RebindToSigned<D> di;
    return bias_rows_shared    ? hn::Set(d, *key)
           : bias_stride == 1 ? hn::Load(d, transposed + jj * kBlockQ + i)
                              : hn::GatherIndex(d, key, hn::Load(di, offsets + i));
  }

  // Asks for rows rm[0, rows)' part of the tile at keys j0.. while the current tile computes: a run
  // of 256 bytes of a long float row, which the hardware prefetcher does not foresee (unfetched, a
  // mask of (n, m) floats cost a fifth of the kernel's time); not when the call's table knows the tile
  // to be all 0 or all -inf (it is then not read).
  void prefetch_bias(const RowMask<T>* rm, index_t rows, index_t j0) const {
    if (!has_bias || bias_stride != 1) return;
    using Classes = BiasTileClasses;
    if (const std::atomic<std::uint8_t>* cell = cell_of(j0)) {  // known to be all 0 or all -inf: not read
      const std::uint8_t found = cell->load(std::memory_order_relaxed);
      if ((found & Classes::kKnown) && !((found & Classes::kFinite) && (found & Classes::kNonzero))) return;
    }
    const index_t kLine = 64;
    for (index_t i = 0; i < (bias_rows_shared ? 1 : rows); ++i) {
      const auto* row = reinterpret_cast<const char*>(rm[i].bias + j0);
      for (index_t c = 0; c < kBlockK * static_cast<index_t>(sizeof(T)); c += kLine) hwy::Prefetch(row + c);
      hwy::Prefetch(row + kBlockK * sizeof(T) - 1);
    }
  }
};

}  // namespace attn::cpu::fused::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // ATTN_CPU_SIMD_SCORE_MODS_INL_H_
