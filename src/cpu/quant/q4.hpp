// The 4-bit formats of the KV cache (attn/kv_cache.hpp states the rules users see): groups of 32
// values, each stored as a code in [0, 15] with one float32 scale and one float32 minimum per group
// (ggml's q4_1, with float32 scale and minimum). A group is 32 consecutive values of a row (the
// "int4" cache, and the values of "int4_kivi"), or one channel of 32 consecutive tokens (the keys
// of "int4_kivi", as KIVI). Either way a row's codes are laid out alike: value c of a row of d
// values at byte (c / 32) 16 + c % 16, in its low nibble when c % 32 < 16, else its high nibble
// (so that 16 bytes widen to 32 values with one mask and one shift). Quantize, pack and unpack live
// here, scalar (run as tokens are appended or read back); the decode path widens codes with SIMD
// (cpu/simd/sdpa_decode.cpp: WidenQ4Row), to the same floats. Tested by tests/test_quant.cpp
// against float64 formulas.
#pragma once

#include <cmath>
#include <cstdint>

#include "attn/tensor.hpp"

namespace attn::cpu::quant {

inline constexpr index_t kQ4Group = 32;

// The 32 values x[i * stride] (i < 32, finite, |x| <= 2^126) as codes[i] in [0, 15] with their
// group's scale and minimum: min = the smallest x, scale = (max - min) / 15 in float32, code =
// round((x - min) / scale) to nearest even, clamped to [0, 15] (0 when scale is 0).
void q4_quantize(const float* x, index_t stride, std::uint8_t* codes, float& scale, float& min);

// A code's value: code scale + min, one rounding (a fused multiply-add, as the decode path's).
inline float q4_value(unsigned code, float scale, float min) { return std::fma(static_cast<float>(code), scale, min); }

// The code of value c of a packed row, and setting it.
inline unsigned q4_code(const std::uint8_t* row, index_t c) {
  const std::uint8_t byte = row[c / 32 * 16 + c % 16];
  return c % 32 < 16 ? byte & 0xFu : byte >> 4;
}
inline void q4_set_code(std::uint8_t* row, index_t c, unsigned code) {
  std::uint8_t& byte = row[c / 32 * 16 + c % 16];
  byte = c % 32 < 16 ? static_cast<std::uint8_t>((byte & 0xF0u) | code) : static_cast<std::uint8_t>((byte & 0x0Fu) | (code << 4));
}

// A row of count values (a multiple of 32) quantized in groups along it: codes count / 2 bytes,
// scales and mins count / 32 each.
void q4_pack_row(const float* x, index_t count, std::uint8_t* codes, float* scales, float* mins);
// x[c] = q4_value(code c, its group's scale and min), c < count.
void q4_unpack_row(const std::uint8_t* codes, const float* scales, const float* mins, index_t count, float* x);

}  // namespace attn::cpu::quant
