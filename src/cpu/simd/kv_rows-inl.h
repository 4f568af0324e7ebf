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

// to[0, dim) = a packed 4-bit row (q4.hpp's layout) as floats, code x scale + min by one fused
// multiply-add (q4_value): one scale and min per 32 values (scale[c / 32]), or per value
// (per_channel: scale[c]). 16 bytes widen to 32 values: the low nibbles are values 0 to 15, the
// high ones 16 to 31. Targets without a native FMA widen with std::fma, for the same floats.
template <class D>
HWY_INLINE void WidenQ4Row(D d, const std::uint8_t* HWY_RESTRICT codes, const float* HWY_RESTRICT scale,
                           const float* HWY_RESTRICT min, bool per_channel, index_t dim, float* HWY_RESTRICT to) {
#if HWY_NATIVE_FMA && HWY_TARGET != HWY_SCALAR
  if constexpr (hn::MaxLanes(d) <= 16) {
    const hn::Rebind<std::uint8_t, D> d8;
    const hn::RebindToSigned<D> di;
    const index_t L = static_cast<index_t>(hn::Lanes(d));
    const auto low = hn::Set(d8, std::uint8_t{0x0F});
    for (index_t g = 0; g < dim; g += 32) {
      const std::uint8_t* group = codes + g / 2;
      const auto gs = hn::Set(d, scale[g / 32]), gm = hn::Set(d, min[g / 32]);
      for (index_t i = 0; i < 16; i += L) {
        const auto bytes = hn::LoadU(d8, group + i);
        const auto lo = hn::ConvertTo(d, hn::PromoteTo(di, hn::And(bytes, low)));
        const auto hi = hn::ConvertTo(d, hn::PromoteTo(di, hn::ShiftRight<4>(bytes)));
        const index_t c_lo = g + i, c_hi = g + 16 + i;
        if (per_channel) {
          hn::StoreU(hn::MulAdd(lo, hn::LoadU(d, scale + c_lo), hn::LoadU(d, min + c_lo)), d, to + c_lo);
          hn::StoreU(hn::MulAdd(hi, hn::LoadU(d, scale + c_hi), hn::LoadU(d, min + c_hi)), d, to + c_hi);
        } else {
          hn::StoreU(hn::MulAdd(lo, gs, gm), d, to + c_lo);
          hn::StoreU(hn::MulAdd(hi, gs, gm), d, to + c_hi);
        }
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
// to + jj dim (any rows: across blocks, into a KIVI cache's bfloat16 tail).
template <class D>
void WidenRows(D d, const KvRows& x, index_t b, index_t hk, index_t j0, index_t cnt, index_t dim, float* to) {
  using simd::HWY_NAMESPACE::WidenArray;
  const auto n = static_cast<std::size_t>(dim);
  for (index_t jj = 0; jj < cnt; ++jj, to += dim) {
    const index_t j = j0 + jj;
    if (x.tails != nullptr && j >= x.tail_from[b]) {  // a KIVI cache's newest tokens: bfloat16
      WidenArray(reinterpret_cast<const bfloat16*>(x.tails[b]) + (hk * 32 + j - x.tail_from[b]) * x.sR, to, n);
      continue;
    }
    switch (x.type) {
      case KvType::f32: WidenArray(x.row<float>(b, hk, j), to, n); break;
      case KvType::bf16: WidenArray(x.row<bfloat16>(b, hk, j), to, n); break;
      case KvType::f16: WidenArray(x.row<float16>(b, hk, j), to, n); break;
      case KvType::f8e4m3: WidenArray(x.row<detail::float8_e4m3>(b, hk, j), to, n); break;
      case KvType::f8e5m2: WidenArray(x.row<detail::float8_e5m2>(b, hk, j), to, n); break;
      case KvType::i8: WidenQ8Row(d, x.row<std::int8_t>(b, hk, j), x.scale_row(b, hk, j), dim, to); break;
      case KvType::i4:
      case KvType::i4_channels: {
        const index_t block = b * x.table_stride + j / x.block_size, at = hk * x.sH + j % x.block_size * x.sR;
        const bool per_channel = x.type == KvType::i4_channels;
        const index_t group = per_channel ? hk * x.sH / 32 + j % x.block_size / 32 * x.sR : at / 32;
        WidenQ4Row(d, static_cast<const std::uint8_t*>(x.blocks[block]) + at / 2, x.scale_blocks[block] + group,
                   x.min_blocks[block] + group, per_channel, dim, to);
        break;
      }
    }
  }
}

}  // namespace attn::cpu::fused::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // ATTN_CPU_SIMD_KV_ROWS_INL_H_
