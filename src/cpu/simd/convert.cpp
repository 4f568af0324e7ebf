// Conversions between float and the 16-bit storage types (attn/half.hpp), compiled once per SIMD
// target. Highway 1.0.3's DemoteTo truncates to bfloat16, and to float16 too where the target has no
// F16C; these round to nearest even with integer lanes, bit for bit as the scalar functions of
// half.hpp. float16 uses F16C's conversions on AVX2 and AVX-512 (which round to nearest even under
// the default MXCSR, as attn never changes it).
#include <cstdint>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/simd/convert.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "attn/half.hpp"
#include "cpu/simd/convert.hpp"
#include "cpu/simd/dispatch.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Lanes of float32 bits -> bfloat16 bits in the low half of each u32 lane (round to nearest even;
// NaN quieted).
template <class DU>
HWY_INLINE hn::Vec<DU> BfloatBits(DU du, hn::Vec<DU> u) {
  const auto is_nan = hn::Gt(hn::And(u, hn::Set(du, 0x7FFFFFFFu)), hn::Set(du, 0x7F800000u));
  const auto rounded = hn::Add(hn::Add(u, hn::Set(du, 0x7FFFu)), hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u)));
  return hn::ShiftRight<16>(hn::IfThenElse(is_nan, hn::Or(u, hn::Set(du, 0x00400000u)), rounded));
}

// float32 bits -> float16 bits (as to_float16), for targets without F16C.
template <class DU>
HWY_INLINE hn::Vec<DU> HalfBits(DU du, hn::Vec<DU> u) {
  const hn::RebindToSigned<DU> di;
  const auto sign = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 0x8000u));
  const auto a = hn::And(u, hn::Set(du, 0x7FFFFFFFu));
  // Signed compares: a < 2^31 in every lane.
  auto gt = [&](hn::Vec<DU> x, std::uint32_t c) { return hn::RebindMask(du, hn::Gt(hn::BitCast(di, x), hn::Set(di, static_cast<std::int32_t>(c)))); };
  const auto nan = hn::Or(hn::Set(du, 0x7E00u), hn::And(hn::ShiftRight<13>(a), hn::Set(du, 0x3FFu)));
  const auto r = hn::Sub(a, hn::Set(du, 0x38000000u));
  const auto normal = hn::ShiftRight<13>(hn::Add(hn::Add(r, hn::Set(du, 0xFFFu)), hn::And(hn::ShiftRight<13>(r), hn::Set(du, 1u))));
  // Subnormal: the 24-bit mantissa shifted right by 126 - exponent (14 to 24), rounded to even.
  const auto mantissa = hn::Or(hn::And(a, hn::Set(du, 0x7FFFFFu)), hn::Set(du, 0x800000u));
  const auto shift = hn::Min(hn::Sub(hn::Set(du, 126u), hn::ShiftRight<23>(a)), hn::Set(du, 31u));  // capped: lanes not subnormal
  const auto kept = hn::operator>>(mantissa, shift);
  const auto rest = hn::Sub(mantissa, hn::operator<<(kept, shift));
  const auto half = hn::operator>>(hn::Set(du, 0x80000000u), hn::Sub(hn::Set(du, 32u), shift));  // 1 << (shift - 1)
  const auto round_up = hn::Or(hn::RebindMask(du, hn::Gt(hn::BitCast(di, rest), hn::BitCast(di, half))),
                               hn::And(hn::Eq(rest, half), hn::Eq(hn::And(kept, hn::Set(du, 1u)), hn::Set(du, 1u))));
  const auto subnormal = hn::Add(kept, hn::IfThenElseZero(round_up, hn::Set(du, 1u)));
  auto h = hn::IfThenElseZero(gt(a, 0x33000000u), subnormal);
  h = hn::IfThenElse(gt(a, 0x387FFFFFu), normal, h);
  h = hn::IfThenElse(gt(a, 0x477FFFFFu), hn::Set(du, 0x7C00u), h);
  h = hn::IfThenElse(gt(a, 0x7F800000u), nan, h);
  return hn::Or(sign, h);
}

// float16 bits (u32 lanes) -> float32 bits (as to_float(float16)), for targets without F16C.
template <class DU>
HWY_INLINE hn::Vec<DU> FloatBitsOfHalf(DU du, hn::Vec<DU> h) {
  const hn::Rebind<float, DU> df;
  const auto sign = hn::ShiftLeft<16>(hn::And(h, hn::Set(du, 0x8000u)));
  const auto exponent = hn::And(hn::ShiftRight<10>(h), hn::Set(du, 0x1Fu));
  const auto mantissa = hn::And(h, hn::Set(du, 0x3FFu));
  const auto normal = hn::Or(hn::ShiftLeft<23>(hn::Add(exponent, hn::Set(du, 112u))), hn::ShiftLeft<13>(mantissa));
  const auto special = hn::Or(hn::Or(hn::Set(du, 0x7F800000u), hn::ShiftLeft<13>(mantissa)),
                              hn::IfThenElseZero(hn::Ne(mantissa, hn::Zero(du)), hn::Set(du, 0x00400000u)));
  // Zero or subnormal: mantissa x 2^-24, exact in float.
  const auto tiny = hn::BitCast(du, hn::Mul(hn::ConvertTo(df, hn::BitCast(hn::RebindToSigned<DU>(), mantissa)),
                                            hn::Set(df, 5.9604644775390625e-8f)));
  auto f = hn::IfThenElse(hn::Eq(exponent, hn::Zero(du)), tiny, normal);
  f = hn::IfThenElse(hn::Eq(exponent, hn::Set(du, 0x1Fu)), special, f);
  return hn::Or(sign, f);
}

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
  const hn::ScalableTag<std::uint32_t> du;
  const hn::Rebind<std::uint16_t, decltype(du)> du16;
  const std::size_t L = hn::Lanes(du);
  std::size_t i = 0;
  for (; i + L <= count; i += L)
    hn::StoreU(hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(du16, from + i))), du, reinterpret_cast<std::uint32_t*>(to) + i);
  for (; i < count; ++i) to[i] = to_float(bfloat16::from_bits(from[i]));
}

// F16C where Highway uses it (AVX2 and up), the integer lanes elsewhere.
#undef ATTN_F16C
#if HWY_TARGET <= HWY_AVX2 && !defined(HWY_DISABLE_F16C)
#define ATTN_F16C 1
#else
#define ATTN_F16C 0
#endif

void FloatToHalf(const float* from, std::uint16_t* to, std::size_t count) {
  note_ran(HWY_TARGET);
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::Rebind<std::uint16_t, decltype(du)> du16;
  const std::size_t L = hn::Lanes(df);
  std::size_t i = 0;
  for (; i + L <= count; i += L) {
#if ATTN_F16C
    const hn::Rebind<hwy::float16_t, decltype(df)> df16;
    hn::StoreU(hn::BitCast(du16, hn::DemoteTo(df16, hn::LoadU(df, from + i))), du16, to + i);
#else
    const auto bits = HalfBits(du, hn::BitCast(du, hn::LoadU(df, from + i)));
    hn::StoreU(hn::DemoteTo(du16, hn::BitCast(hn::RebindToSigned<decltype(du)>(), bits)), du16, to + i);
#endif
  }
  for (; i < count; ++i) to[i] = to_float16(from[i]).bits;
}

void HalfToFloat(const std::uint16_t* from, float* to, std::size_t count) {
  note_ran(HWY_TARGET);
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::Rebind<std::uint16_t, decltype(du)> du16;
  const std::size_t L = hn::Lanes(df);
  std::size_t i = 0;
  for (; i + L <= count; i += L) {
#if ATTN_F16C
    const hn::Rebind<hwy::float16_t, decltype(df)> df16;
    hn::StoreU(hn::PromoteTo(df, hn::BitCast(df16, hn::LoadU(du16, from + i))), df, to + i);
#else
    const auto bits = FloatBitsOfHalf(du, hn::PromoteTo(du, hn::LoadU(du16, from + i)));
    hn::StoreU(bits, du, reinterpret_cast<std::uint32_t*>(to) + i);
#endif
  }
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
