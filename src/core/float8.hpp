// 8-bit floating point of the KV cache (attn/kv_cache.hpp), as OCP's 8-bit formats and PyTorch's
// float8_e4m3fn and float8_e5m2 define them:
//   e4m3: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinity, 0x7F and 0xFF are NaN; largest
//         finite 448, smallest normal 2^-6, subnormals k 2^-9 (k = 1..7).
//   e5m2: 1 sign, 5 exponent (bias 15), 2 mantissa bits: float16's top byte; infinities; largest
//         finite 57344, smallest normal 2^-14, subnormals k 2^-16 (k = 1..3).
// Conversion to float is exact; from float it rounds to nearest, ties to even, for finite values
// within the largest finite (the cache refuses others before converting).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace attn::detail {

struct float8_e4m3 {
  std::uint8_t bits = 0;
};
struct float8_e5m2 {
  std::uint8_t bits = 0;
};

// Each format's numbers: mantissa bits, exponent bias, largest finite.
template <class F>
struct Float8Format;
template <>
struct Float8Format<float8_e4m3> {
  static constexpr int kMantissa = 3, kBias = 7;
  static constexpr float kMax = 448.0f;
};
template <>
struct Float8Format<float8_e5m2> {
  static constexpr int kMantissa = 2, kBias = 15;
  static constexpr float kMax = 57344.0f;
};

// The value of an 8-bit float (NaN for e4m3's 0x7F and 0xFF, e5m2's NaNs and infinities as float16's).
template <class F>
inline float to_float(F x) {
  using Fmt = Float8Format<F>;
  const int sign = x.bits >> 7, exponent = (x.bits >> Fmt::kMantissa) & ((1 << (7 - Fmt::kMantissa)) - 1);
  const int mantissa = x.bits & ((1 << Fmt::kMantissa) - 1);
  const int top = (1 << (7 - Fmt::kMantissa)) - 1;
  float value;
  if constexpr (Fmt::kMantissa == 3) {
    if (exponent == top && mantissa == 7) return std::nanf("");
  } else {
    if (exponent == top) return mantissa == 0 ? (sign ? -INFINITY : INFINITY) : std::nanf("");
  }
  if (exponent == 0) {
    value = std::ldexp(static_cast<float>(mantissa), 1 - Fmt::kBias - Fmt::kMantissa);
  } else {
    value = std::ldexp(static_cast<float>(mantissa + (1 << Fmt::kMantissa)), exponent - Fmt::kBias - Fmt::kMantissa);
  }
  return sign ? -value : value;
}

// The SIMD kernels widen e4m3 in three integer operations and a float16 conversion, which give its
// value times 2^-8 (cpu/simd/half-inl.h); the cache folds this factor into the softmax scale (the
// queries where the key heads' scales differ) and the output of every call that reads e4m3 rows in
// place (api/kv_cache.cpp), rather than multiplying every element. Powers of two: the dot products
// and sums are the same bits.
inline constexpr float kE4m3WideningFactor = 256.0f;

// x (finite, |x| at most the largest finite after rounding) to the nearest 8-bit float, ties to even.
template <class F>
inline F to_float8(float x) {
  using Fmt = Float8Format<F>;
  const auto sign = static_cast<std::uint8_t>(std::signbit(x) ? 0x80 : 0);
  const double a = std::fabs(static_cast<double>(x));
  const int min_exponent = 1 - Fmt::kBias;  // of the smallest normal
  int e = a == 0 ? min_exponent : std::ilogb(a);
  if (e < min_exponent) e = min_exponent;  // subnormals share the smallest normal's quantum
  const double quantum = std::ldexp(1.0, e - Fmt::kMantissa);
  // a / quantum and back are exact (powers of two); nearbyint rounds to even in the default mode.
  auto units = static_cast<int>(std::nearbyint(a / quantum));  // mantissa with its leading bit
  if (units == (2 << Fmt::kMantissa)) units >>= 1, ++e;         // rounded up into the next binade
  std::uint8_t bits;
  if (units < (1 << Fmt::kMantissa)) {
    bits = static_cast<std::uint8_t>(units);  // subnormal (or zero): exponent field 0
  } else {
    bits = static_cast<std::uint8_t>(((e + Fmt::kBias) << Fmt::kMantissa) | (units - (1 << Fmt::kMantissa)));
  }
  return F{static_cast<std::uint8_t>(sign | bits)};
}

}  // namespace attn::detail
