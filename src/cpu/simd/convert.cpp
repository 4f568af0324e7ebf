// Conversions between float and the 16-bit storage types (attn/half.hpp), compiled once per SIMD
// target, bit for bit as the scalar functions of half.hpp: the integer lanes of half-inl.h, and
// F16C's conversions for float16 on AVX2 and AVX-512 (which round to nearest even under the default
// MXCSR, as attn never changes it).
#include <cstdint>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/simd/convert.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "attn/half.hpp"
#include "cpu/simd/convert.hpp"
#include "cpu/simd/dispatch.hpp"
#include "cpu/simd/half-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void FloatToBfloat(const float* from, std::uint16_t* to, std::size_t count) {
  note_ran(HWY_TARGET);
  const hn::ScalableTag<std::uint32_t> du;
  const hn::Rebind<std::uint16_t, decltype(du)> du16;
  const std::size_t L = hn::Lanes(du);
  std::size_t i = 0;
  for (; i + L <= count; i += L) {
    const auto bits = BfloatBits(du, hn::LoadU(du, reinterpret_cast<const std::uint32_t*>(from) + i));
    hn::StoreU(hn::DemoteTo(du16, hn::BitCast(hn::RebindToSigned<decltype(du)>(), bits)), du16, to + i);
  }
  for (; i < count; ++i) to[i] = to_bfloat16(from[i]).bits;
}

void BfloatToFloat(const std::uint16_t* from, float* to, std::size_t count) {
  note_ran(HWY_TARGET);
  const hn::ScalableTag<float> df;
  const std::size_t L = hn::Lanes(df);
  std::size_t i = 0;
  for (; i + L <= count; i += L) hn::StoreU(LoadWide(df, reinterpret_cast<const bfloat16*>(from) + i), df, to + i);
  for (; i < count; ++i) to[i] = to_float(bfloat16::from_bits(from[i]));
}

void FloatToHalf(const float* from, std::uint16_t* to, std::size_t count) {
  note_ran(HWY_TARGET);
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::Rebind<std::uint16_t, decltype(du)> du16;
  const std::size_t L = hn::Lanes(df);
  std::size_t i = 0;
  for (; i + L <= count; i += L) {
    if constexpr (kF16C) {
      const hn::Rebind<hwy::float16_t, decltype(df)> df16;
      hn::StoreU(hn::BitCast(du16, hn::DemoteTo(df16, hn::LoadU(df, from + i))), du16, to + i);
    } else {
      const auto bits = HalfBits(du, hn::BitCast(du, hn::LoadU(df, from + i)));
      hn::StoreU(hn::DemoteTo(du16, hn::BitCast(hn::RebindToSigned<decltype(du)>(), bits)), du16, to + i);
    }
  }
  for (; i < count; ++i) to[i] = to_float16(from[i]).bits;
}

void HalfToFloat(const std::uint16_t* from, float* to, std::size_t count) {
  note_ran(HWY_TARGET);
  const hn::ScalableTag<float> df;
  const std::size_t L = hn::Lanes(df);
  std::size_t i = 0;
  for (; i + L <= count; i += L) hn::StoreU(LoadWide(df, reinterpret_cast<const float16*>(from) + i), df, to + i);
  for (; i < count; ++i) to[i] = to_float(float16::from_bits(from[i]));
}

}  // namespace attn::cpu::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::cpu::simd {

HWY_EXPORT(FloatToBfloat);
HWY_EXPORT(BfloatToFloat);
HWY_EXPORT(FloatToHalf);
HWY_EXPORT(HalfToFloat);

void float_to_bfloat16(Target t, const float* from, std::uint16_t* to, std::size_t count) {
  ATTN_SIMD_CALL(t, FloatToBfloat)(from, to, count);
}
void bfloat16_to_float(Target t, const std::uint16_t* from, float* to, std::size_t count) {
  ATTN_SIMD_CALL(t, BfloatToFloat)(from, to, count);
}
void float_to_float16(Target t, const float* from, std::uint16_t* to, std::size_t count) {
  ATTN_SIMD_CALL(t, FloatToHalf)(from, to, count);
}
void float16_to_float(Target t, const std::uint16_t* from, float* to, std::size_t count) {
  ATTN_SIMD_CALL(t, HalfToFloat)(from, to, count);
}

}  // namespace attn::cpu::simd
#endif  // HWY_ONCE
