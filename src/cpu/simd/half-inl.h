// Per-target 16-bit conversions (Highway "-inl.h" convention): float32 bits to bfloat16 and float16
// bits rounded to nearest even, float16 bits to float32, on integer lanes (Highway 1.0.3's DemoteTo
// truncates; F16C is used instead where the target has it), LoadWide, which reads L elements of
// float, bfloat16, float16 or int8 as L float lanes (the decode path's loads of 16-bit and int8 keys
// and values, simd/sdpa_decode.cpp), StoreNarrow, its inverse for the 16-bit types, and the array
// conversions built on them (simd/convert.cpp, the 16-bit forward's tiles in simd/sdpa_forward.cpp).

#if defined(ATTN_CPU_SIMD_HALF_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_CPU_SIMD_HALF_INL_H_
#undef ATTN_CPU_SIMD_HALF_INL_H_
#else
#define ATTN_CPU_SIMD_HALF_INL_H_
#endif

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <hwy/highway.h>

#include "attn/half.hpp"
#include "core/float8.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// F16C where Highway uses it (AVX2 and up), the integer lanes elsewhere.
#if HWY_TARGET <= HWY_AVX2 && !defined(HWY_DISABLE_F16C)
inline constexpr bool kF16C = true;
#else
inline constexpr bool kF16C = false;
#endif

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
  // Kept in [1, 31] for every lane (lanes that are not subnormal compute nonsense, then are not
  // selected): a shift by 32 or more is undefined for the scalar target's C++ shifts.
  const auto shift = hn::Max(hn::Min(hn::Sub(hn::Set(du, 126u), hn::ShiftRight<23>(a)), hn::Set(du, 31u)), hn::Set(du, 1u));
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

// L elements at p as lanes of d: d's own type loaded as it is; bfloat16, float16 and int8 widened to
// float lanes.
template <class D>
HWY_INLINE hn::Vec<D> LoadWide(D d, const hn::TFromD<D>* p) {
  return hn::LoadU(d, p);
}
template <class D>
HWY_INLINE hn::Vec<D> LoadWide(D d, const bfloat16* p) {
  const hn::RebindToUnsigned<D> du;
  const hn::Rebind<std::uint16_t, D> du16;
  return hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(du16, reinterpret_cast<const std::uint16_t*>(p)))));
}
template <class D>
HWY_INLINE hn::Vec<D> LoadWide(D d, const float16* p) {
  if constexpr (kF16C) {
    const hn::Rebind<hwy::float16_t, D> df16;
    return hn::PromoteTo(d, hn::LoadU(df16, reinterpret_cast<const hwy::float16_t*>(p)));
  } else {
    const hn::RebindToUnsigned<D> du;
    const hn::Rebind<std::uint16_t, D> du16;
    return hn::BitCast(d, FloatBitsOfHalf(du, hn::PromoteTo(du, hn::LoadU(du16, reinterpret_cast<const std::uint16_t*>(p)))));
  }
}
template <class D>
HWY_INLINE hn::Vec<D> LoadWide(D d, const std::int8_t* p) {
  const hn::RebindToSigned<D> di;
  const hn::Rebind<std::int8_t, D> di8;
  return hn::ConvertTo(d, hn::PromoteTo(di, hn::LoadU(di8, p)));
}

// 8-bit floats (core/float8.hpp) through float16's bits: e5m2 is float16's top byte; e4m3's sign,
// exponent and mantissa placed as float16's give its value times 2^-8 (the biases differ by 8; a
// subnormal stays one), and e4m3 is widened to that: its value / detail::kE4m3WideningFactor, the
// factor folded into the caller's queries and output. e4m3's NaN codes read as 480 / 256 (the cache
// stores finite values only).
// float16 bits h (in 16-bit lanes of du16, one per lane of d) as float lanes: F16C where the target
// has it, else FloatBitsOfHalf.
template <class D, class DU16>
HWY_INLINE hn::Vec<D> FloatOfHalfBits(D d, [[maybe_unused]] DU16 du16, hn::Vec<DU16> h) {
  if constexpr (kF16C) {
    const hn::Rebind<hwy::float16_t, D> df16;
    return hn::PromoteTo(d, hn::BitCast(df16, h));
  } else {
    const hn::RebindToUnsigned<D> du;
    return hn::BitCast(d, FloatBitsOfHalf(du, hn::PromoteTo(du, h)));
  }
}
template <class D>
HWY_INLINE hn::Vec<D> LoadWide(D d, const detail::float8_e5m2* p) {
  const hn::Rebind<std::uint16_t, D> du16;
  const hn::Rebind<std::uint8_t, D> du8;
  return FloatOfHalfBits(d, du16, hn::ShiftLeft<8>(hn::PromoteTo(du16, hn::LoadU(du8, reinterpret_cast<const std::uint8_t*>(p)))));
}
// e4m3's byte sign-extended to 16 bits and shifted left by 7 holds its sign in bit 15, a copy of it
// in bit 14 (cleared: float16's exponent has one bit more) and exponent and mantissa below, where
// float16 keeps them: three operations for the bits.
template <class D>
HWY_INLINE hn::Vec<D> LoadWide(D d, const detail::float8_e4m3* p) {
  const hn::Rebind<std::int16_t, D> di16;
  const hn::Rebind<std::uint16_t, D> du16;
  const hn::Rebind<std::int8_t, D> di8;
  const auto shifted = hn::ShiftLeft<7>(hn::PromoteTo(di16, hn::LoadU(di8, reinterpret_cast<const std::int8_t*>(p))));
  const auto half = hn::And(hn::BitCast(du16, shifted), hn::Set(du16, std::uint16_t{0xBF80}));
  return FloatOfHalfBits(d, du16, half);
}

// L float lanes v stored as L bfloat16 or float16 elements at p, rounded to nearest even.
template <class D>
HWY_INLINE void StoreNarrow(D /*d*/, hn::Vec<D> v, bfloat16* p) {
  const hn::RebindToUnsigned<D> du;
  const hn::Rebind<std::uint16_t, D> du16;
  const auto bits = BfloatBits(du, hn::BitCast(du, v));
  hn::StoreU(hn::DemoteTo(du16, hn::BitCast(hn::RebindToSigned<decltype(du)>(), bits)), du16, reinterpret_cast<std::uint16_t*>(p));
}
template <class D>
HWY_INLINE void StoreNarrow(D /*d*/, hn::Vec<D> v, float16* p) {
  const hn::Rebind<std::uint16_t, D> du16;
  if constexpr (kF16C) {
    const hn::Rebind<hwy::float16_t, D> df16;
    hn::StoreU(hn::BitCast(du16, hn::DemoteTo(df16, v)), du16, reinterpret_cast<std::uint16_t*>(p));
  } else {
    const hn::RebindToUnsigned<D> du;
    const auto bits = HalfBits(du, hn::BitCast(du, v));
    hn::StoreU(hn::DemoteTo(du16, hn::BitCast(hn::RebindToSigned<decltype(du)>(), bits)), du16, reinterpret_cast<std::uint16_t*>(p));
  }
}

// One element as a float (a float or double as it is; e4m3 as LoadWide widens it, over the factor).
template <class T>
inline T Wide(T x) { return x; }
inline float Wide(bfloat16 x) { return to_float(x); }
inline float Wide(float16 x) { return to_float(x); }
inline float Wide(std::int8_t x) { return static_cast<float>(x); }
inline float Wide(detail::float8_e4m3 x) { return detail::to_float(x) / detail::kE4m3WideningFactor; }
inline float Wide(detail::float8_e5m2 x) { return detail::to_float(x); }

// to[0, count) = from[0, count) as floats (from: any type LoadWide reads).
template <class E>
void WidenArray(const E* HWY_RESTRICT from, float* HWY_RESTRICT to, std::size_t count) {
  const hn::ScalableTag<float> df;
  const std::size_t L = hn::Lanes(df);
  std::size_t i = 0;
  for (; i + L <= count; i += L) hn::StoreU(LoadWide(df, from + i), df, to + i);
  for (; i < count; ++i) to[i] = Wide(from[i]);
}

// to[0, count) = from[0, count) rounded to the 16-bit type H (nearest even).
template <class H>
void NarrowArray(const float* HWY_RESTRICT from, H* HWY_RESTRICT to, std::size_t count) {
  const hn::ScalableTag<float> df;
  const std::size_t L = hn::Lanes(df);
  std::size_t i = 0;
  for (; i + L <= count; i += L) StoreNarrow(df, hn::LoadU(df, from + i), to + i);
  for (; i < count; ++i) {
    if constexpr (std::is_same_v<H, bfloat16>) to[i] = to_bfloat16(from[i]);
    else to[i] = to_float16(from[i]);
  }
}

}  // namespace attn::cpu::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // ATTN_CPU_SIMD_HALF_INL_H_
