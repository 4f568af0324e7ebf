// 16-bit storage types: bfloat16 (1 sign, 8 exponent, 7 mantissa bits: float32's range, 3 decimal
// digits) and float16 (IEEE 754 binary16: 1, 5, 10; largest finite 65504, subnormals from 2^-24).
//
// They store and convert; arithmetic happens in float. Conversion from float rounds to nearest,
// ties to even; values beyond the largest finite become infinity; a NaN stays a NaN (its sign and
// the top of its payload kept, the quiet bit set); infinities and signed zeros are kept. Conversion
// to float is exact. `convert` does whole arrays with SIMD on the chosen target (F16C for float16
// where the CPU has AVX2 or AVX-512) and gives bit for bit what the scalar functions give.
// Usable as the element type of Tensor and TensorView.
#pragma once

#include <bit>
#include <cstdint>
#include <span>

namespace attn {

struct bfloat16 {
  std::uint16_t bits = 0;
  /// The bfloat16 of these 16 bits.
  static constexpr bfloat16 from_bits(std::uint16_t b) { return bfloat16{b}; }
  friend constexpr bool operator==(bfloat16, bfloat16) = default;  // bit equality
};

struct float16 {
  std::uint16_t bits = 0;
  /// The float16 of these 16 bits.
  static constexpr float16 from_bits(std::uint16_t b) { return float16{b}; }
  friend constexpr bool operator==(float16, float16) = default;  // bit equality
};

static_assert(sizeof(bfloat16) == 2 && sizeof(float16) == 2);

// bfloat16 is float32's top half.
constexpr float to_float(bfloat16 x) { return std::bit_cast<float>(static_cast<std::uint32_t>(x.bits) << 16); }

constexpr bfloat16 to_bfloat16(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return bfloat16::from_bits(static_cast<std::uint16_t>((u >> 16) | 0x0040u));  // NaN
  const std::uint32_t rounded = u + 0x7FFFu + ((u >> 16) & 1u);  // ties to even; carries into the exponent
  return bfloat16::from_bits(static_cast<std::uint16_t>(rounded >> 16));
}

constexpr float to_float(float16 x) {
  const std::uint32_t sign = static_cast<std::uint32_t>(x.bits & 0x8000u) << 16;
  const std::uint32_t exponent = (x.bits >> 10) & 0x1Fu, mantissa = x.bits & 0x3FFu;
  if (exponent == 0x1F)  // infinity, or NaN (quieted)
    return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13) | (mantissa != 0 ? 0x00400000u : 0u));
  if (exponent != 0) return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
  // zero or subnormal: mantissa 2^-24, exact in float
  const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
  return sign != 0 ? -magnitude : magnitude;
}

constexpr float16 to_float16(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7FFFFFFFu;
  std::uint32_t h = 0;
  if (a > 0x7F800000u) {
    h = 0x7E00u | ((a >> 13) & 0x3FFu);  // NaN: quiet, top of the payload kept
  } else if (a >= 0x47800000u) {
    h = 0x7C00u;  // 65536 and beyond (and infinity); [65520, 65536) rounds up to it below
  } else if (a >= 0x38800000u) {  // normal: 2^-14 and up; rebias the exponent, round the 13 bits dropped
    const std::uint32_t r = a - 0x38000000u;
    h = (r + 0xFFFu + ((r >> 13) & 1u)) >> 13;
  } else if (a > 0x33000000u) {  // subnormal: above 2^-25 (half the smallest, which rounds to 0)
    const std::uint32_t mantissa = (a & 0x7FFFFFu) | 0x800000u;  // 24 bits, value mantissa 2^(e - 150)
    const std::uint32_t shift = 126u - (a >> 23);                // to units of 2^-24: 14 to 24 bits dropped
    const std::uint32_t kept = mantissa >> shift, rest = mantissa & ((1u << shift) - 1u), half = 1u << (shift - 1);
    h = kept + (rest > half || (rest == half && (kept & 1u)) ? 1u : 0u);
  }
  return float16::from_bits(static_cast<std::uint16_t>(sign | h));
}

// Whole arrays; `from` and `to` must have the same size (attn::Error naming both otherwise).
void convert(std::span<const float> from, std::span<bfloat16> to);
void convert(std::span<const bfloat16> from, std::span<float> to);
void convert(std::span<const float> from, std::span<float16> to);
void convert(std::span<const float16> from, std::span<float> to);

}  // namespace attn
