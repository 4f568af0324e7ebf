// A boolean keep-mask's part of one key tile as bits, per query lane (Highway "-inl.h" convention,
// like softmax-inl.h, whose BlockState is built on it): bit jj % kWordKeys of word
// (jj / kWordKeys, lane i) is key jj of the tile for query lane i, so that mask_tile tests a key's
// lanes with one vector op.

#if defined(ATTN_CPU_SIMD_MASK_BITS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_CPU_SIMD_MASK_BITS_INL_H_
#undef ATTN_CPU_SIMD_MASK_BITS_INL_H_
#else
#define ATTN_CPU_SIMD_MASK_BITS_INL_H_
#endif

#include <cstdint>
#include <cstring>

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include "core/mask_plan.hpp"
#include "cpu/simd/fused.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::fused::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The keep-mask of a block's rows, tile by tile, into the words of BlockArrays::keep_words.
template <class T>
struct KeepBits {
  using Word = typename BlockArrays<T>::Word;
  static constexpr index_t kWordKeys = BlockArrays<T>::kWordKeys;
  Word* words;                    // (kBlockK / kWordKeys, kBlockQ)
  bool has_keep = false;          // the mask has a keep-mask
  bool keep_rows_shared = false;  // every row of (b, h) reads one row of it (stride 0 over queries)
  index_t keep_stride = 0;        // its stride over keys
  bool tile_keep = false;         // the current tile's words hold its bits: some key of some row is masked

  explicit KeepBits(Word* keep_words) : words(keep_words) {}

  void start(const MaskPlan<T>& mask) {
    has_keep = mask.keep != nullptr;
    keep_rows_shared = has_keep && mask.keep_s[2] == 0;
    keep_stride = mask.keep_s[3];
  }

  // Bits of the keys [0, cnt) (cnt <= 64) of a keep-mask row read with `stride` (bit jj: key jj kept).
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

  // Keys [j0, j0 + cnt) of rows rm[0, rows) as bits: false when the keep-mask keeps no key of those
  // rows. Sets tile_keep, and then the words (lanes past `rows` keep no key).
  bool look_at_keep(const RowMask<T>* rm, index_t rows, index_t j0, index_t cnt) {
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
        for (index_t i = 0; i < kBlockQ; ++i) words[k * kBlockQ + i] = static_cast<Word>(bits[i] >> (k * kWordKeys));
    return any != 0;
  }

  // Lanes [i, i + Lanes(d)) of key jj of the tile: kept or not, from the words look_at_keep wrote.
  template <class D>
  HWY_INLINE hn::Mask<D> kept(D d, index_t jj, index_t i) const {
    const hn::RebindToUnsigned<D> du;
    const auto w = hn::Load(du, words + (jj / kWordKeys) * kBlockQ + i);
    return hn::RebindMask(d, hn::TestBit(w, hn::Set(du, Word(1) << (jj % kWordKeys))));
  }

  // Asks for rows rm[0, rows)' part of the tile at keys j0.. (a short run of a long row, which the
  // hardware prefetcher does not foresee) while the current tile computes.
  void prefetch_keep(const RowMask<T>* rm, index_t rows, index_t j0) const {
    if (!has_keep || keep_stride != 1) return;
    for (index_t i = 0; i < (keep_rows_shared ? 1 : rows); ++i) {
      const auto* row = reinterpret_cast<const char*>(rm[i].keep + j0);
      hwy::Prefetch(row), hwy::Prefetch(row + kBlockK - 1);
    }
  }
};

}  // namespace attn::cpu::fused::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // ATTN_CPU_SIMD_MASK_BITS_INL_H_
