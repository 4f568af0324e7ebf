// Per-target widening of the key or value rows a kernel reads in place (fused::KvRows: a tensor's
// or a KV cache's blocks, of any element type the cache stores) into float rows (Highway "-inl.h"
// convention): for the decode path's 4-bit tiles (simd/sdpa_decode.cpp) and the forward's tiles
// over a cache's blocks (simd/sdpa_forward.cpp). The floats are the values the cache's keys() and
// values() return, before a float8 cache's scale (which the caller folds into queries and out).

#if defined(ATTN_CPU_SIMD_KV_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_CPU_SIMD_KV_ROWS_INL_H_
#undef ATTN_CPU_SIMD_KV_ROWS_INL_H_
#else
#define ATTN_CPU_SIMD_KV_ROWS_INL_H_
#endif

#include <cstdint>

#include <hwy/highway.h>

#include "cpu/quant/q4.hpp"
#include "cpu/simd/fused.hpp"
#include "cpu/simd/half-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::fused::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The codes of values [i, i + Lanes(d)) and [16 + i, 16 + i + Lanes(d)) of a 4-bit group (16 bytes
// from `group`, q4.hpp's layout) as floats: the low nibbles of bytes [i, i + Lanes(d)) in lo, the
// high ones in hi. For the widening below and the decode's in-register dot products.
template <class D>
HWY_INLINE void Q4Codes(D d, const std::uint8_t* HWY_RESTRICT group, index_t i, hn::Vec<D>& lo, hn::Vec<D>& hi) {
  const hn::Rebind<std::uint8_t, D> d8;
  const hn::RebindToSigned<D> di;
  const auto bytes = hn::LoadU(d8, group + i);
  lo = hn::ConvertTo(d, hn::PromoteTo(di, hn::And(bytes, hn::Set(d8, std::uint8_t{0x0F}))));
  hi = hn::ConvertTo(d, hn::PromoteTo(di, hn::ShiftRight<4>(bytes)));
}

// Group g's values [i, i + L) and [16 + i, 16 + i + L) of a 4-bit row (16 bytes from `bytes`), as
// floats fma(code, scale, min), the low and the high nibbles of bytes [i, i + L). Where a vector
// holds 16 floats (AVX-512), the group's 16 possible values are formed once, fma(c, scale, min) in
// lane c, and each code picks its lane (two permutes in place of two conversions and two FMAs; the
// same floats).
template <class D>
HWY_INLINE void LoadQ4(D d, const std::uint8_t* HWY_RESTRICT bytes, index_t i, hn::Vec<D> scale, hn::Vec<D> min,
                       hn::Vec<D>& lo, hn::Vec<D>& hi) {
#if HWY_TARGET <= HWY_AVX3 && HWY_NATIVE_FMA
  if constexpr (hn::MaxLanes(d) == 16) {
    const hn::Rebind<std::uint8_t, D> d8;
    const hn::RebindToSigned<D> di;
    const auto values = hn::MulAdd(hn::Iota(d, 0), scale, min);
    const auto codes = hn::PromoteTo(di, hn::LoadU(d8, bytes + i));
    // vpermps reads an index's low 4 bits alone, so a byte picks its low nibble's lane as it is (no
    // mask; 0.96x-0.99x the int4 decode's time, one process, avx3). Through the intrinsic: Highway's
    // IndicesFromVec asserts indices below 16 in debug and sanitizer builds.
    lo = hn::Vec<D>{_mm512_permutexvar_ps(codes.raw, values.raw)};
    hi = hn::TableLookupLanes(values, hn::IndicesFromVec(d, hn::ShiftRight<4>(codes)));
    return;
  }
#endif
  Q4Codes(d, bytes, i, lo, hi);
  lo = hn::MulAdd(lo, scale, min);
  hi = hn::MulAdd(hi, scale, min);
}

// to[0, dim) = a packed 4-bit row (q4.hpp's layout) as floats, code x scale + min by one fused
// multiply-add (q4_value): one scale and min per 32 values (scale[c / 32]), or per value
// (per_channel: scale[c]). 16 bytes widen to 32 values: the low nibbles are values 0 to 15, the
// high ones 16 to 31. Targets without a native FMA widen with std::fma, for the same floats.
template <class D>
HWY_INLINE void WidenQ4Row(D d, const std::uint8_t* HWY_RESTRICT codes, const float* HWY_RESTRICT scale,
                           const float* HWY_RESTRICT min, bool per_channel, index_t dim, float* HWY_RESTRICT to) {
#if HWY_NATIVE_FMA && HWY_TARGET != HWY_SCALAR
  if constexpr (hn::MaxLanes(d) <= 16) {
    const index_t L = static_cast<index_t>(hn::Lanes(d));
    for (index_t g = 0; g < dim; g += 32) {
      const auto gs = hn::Set(d, scale[g / 32]), gm = hn::Set(d, min[g / 32]);
      for (index_t i = 0; i < 16; i += L) {
        hn::Vec<D> lo, hi;
        const index_t c_lo = g + i, c_hi = g + 16 + i;
        if (per_channel) {
          Q4Codes(d, codes + g / 2, i, lo, hi);
          lo = hn::MulAdd(lo, hn::LoadU(d, scale + c_lo), hn::LoadU(d, min + c_lo));
          hi = hn::MulAdd(hi, hn::LoadU(d, scale + c_hi), hn::LoadU(d, min + c_hi));
        } else {
          LoadQ4(d, codes + g / 2, i, gs, gm, lo, hi);
        }
        hn::StoreU(lo, d, to + c_lo);
        hn::StoreU(hi, d, to + c_hi);
      }
    }
    return;
  }
#endif
  (void)d;
  for (index_t c = 0; c < dim; ++c) {
    const index_t at = per_channel ? c : c / 32;
    to[c] = quant::q4_value(quant::q4_code(codes, c), scale[at], min[at]);
  }
}

// to[0, dim) = int8 elements times their group's scale (one per 32), as the q8_0 unpack computes them.
template <class D>
HWY_INLINE void WidenQ8Row(D d, const std::int8_t* HWY_RESTRICT q, const float* HWY_RESTRICT scales, index_t dim,
                           float* HWY_RESTRICT to) {
  const index_t L = static_cast<index_t>(hn::Lanes(d));
  if (32 % L == 0) {
    for (index_t c = 0; c < dim; c += L)
      hn::StoreU(hn::Mul(simd::HWY_NAMESPACE::LoadWide(d, q + c), hn::Set(d, scales[c / 32])), d, to + c);
    return;
  }
  for (index_t c = 0; c < dim; ++c) to[c] = static_cast<float>(q[c]) * scales[c / 32];
}

// Rows [j0, j0 + cnt) of key head hk of batch entry b of x, dim elements each, widened to float rows
// to + jj dim (any rows: across blocks, into a KIVI cache's bfloat16 tail). Addresses are found
// once per run of rows (x.run: to a block's end or the tail), then stepped: found row by row, their
// integer divisions took the 4-bit decode (32,1,8192,128) 0.8x float32's time instead of a third.
inline constexpr index_t kQ4RowsAhead = 64;
template <class D>
void WidenRows(D d, const KvRows& x, index_t b, index_t hk, index_t j0, index_t cnt, index_t dim, float* to) {
  using simd::HWY_NAMESPACE::WidenArray;
  const auto n = static_cast<std::size_t>(dim);
  const index_t sR = x.sR;
  // `run` rows of E from `first` on, sR elements apart.
  const auto widen = [&]<class E>(const E* first, index_t run) {
    for (index_t r = 0; r < run; ++r, to += dim) WidenArray(first + r * sR, to, n);
  };
  for (index_t jj = 0; jj < cnt;) {
    const index_t j = j0 + jj, run = std::min(cnt - jj, x.run(b, j));
    jj += run;
    if (x.tails != nullptr && j >= x.tail_from[b]) {  // a KIVI cache's newest tokens: bfloat16
      widen(reinterpret_cast<const bfloat16*>(x.tails[b]) + (hk * 32 + j - x.tail_from[b]) * sR, run);
      continue;
    }
    switch (x.type) {
      case KvType::f32: widen(x.row<float>(b, hk, j), run); break;
      case KvType::bf16: widen(x.row<bfloat16>(b, hk, j), run); break;
      case KvType::f16: widen(x.row<float16>(b, hk, j), run); break;
      case KvType::f8e4m3: widen(x.row<detail::float8_e4m3>(b, hk, j), run); break;
      case KvType::f8e5m2: widen(x.row<detail::float8_e5m2>(b, hk, j), run); break;
      case KvType::i8: {
        const std::int8_t* q = x.row<std::int8_t>(b, hk, j);
        const float* scales = x.scale_row(b, hk, j);
        for (index_t r = 0; r < run; ++r, to += dim) WidenQ8Row(d, q + r * sR, scales + r * (sR / 32), dim, to);
        break;
      }
      case KvType::i4:
      case KvType::i4_channels: {
        // A run lies in one block (or is a tensor's, which 4-bit rows never are).
        const index_t block = b * x.table_stride + j / x.block_size, row = j % x.block_size, at = hk * x.sH + row * sR;
        const auto* codes = static_cast<const std::uint8_t*>(x.blocks[block]) + at / 2;
        const float* scales = x.scale_blocks[block];
        const float* mins = x.min_blocks[block];
        for (index_t r = 0; r < run; ++r, to += dim) {
          // The codes kQ4RowsAhead rows on, and their scales and minima, asked for into the L2
          // cache (the hardware prefetcher alone left the widening waiting on memory).
          if (r + kQ4RowsAhead < run) {
            const index_t ahead = r + kQ4RowsAhead;
            for (index_t off = 0; off < sR / 2; off += 64) __builtin_prefetch(codes + ahead * (sR / 2) + off, 0, 2);
            if (x.type == KvType::i4 && (at + ahead * sR) / 32 % 16 == 0) {
              __builtin_prefetch(scales + (at + ahead * sR) / 32, 0, 2);
              __builtin_prefetch(mins + (at + ahead * sR) / 32, 0, 2);
            }
          }
          if (x.type == KvType::i4) {  // one scale and min per 32 values of the row
            const index_t group = (at + r * sR) / 32;
            WidenQ4Row(d, codes + r * (sR / 2), scales + group, mins + group, false, dim, to);
          } else {  // per channel, for the 32 tokens from row (row + r) / 32 * 32
            const index_t group = hk * x.sH / 32 + (row + r) / 32 * sR;
            WidenQ4Row(d, codes + r * (sR / 2), scales + group, mins + group, true, dim, to);
          }
        }
        break;
      }
    }
  }
}

}  // namespace attn::cpu::fused::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // ATTN_CPU_SIMD_KV_ROWS_INL_H_
