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
  NarrowArray(from, reinterpret_cast<bfloat16*>(to), count);
}

void BfloatToFloat(const std::uint16_t* from, float* to, std::size_t count) {
  note_ran(HWY_TARGET);
  WidenArray(reinterpret_cast<const bfloat16*>(from), to, count);
}

void FloatToHalf(const float* from, std::uint16_t* to, std::size_t count) {
  note_ran(HWY_TARGET);
  NarrowArray(from, reinterpret_cast<float16*>(to), count);
}

void HalfToFloat(const std::uint16_t* from, float* to, std::size_t count) {
  note_ran(HWY_TARGET);
  WidenArray(reinterpret_cast<const float16*>(from), to, count);
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
