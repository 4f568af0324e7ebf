// Array conversions between float and the 16-bit types' bits (attn/half.hpp), on a SIMD target.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cpu/simd/dispatch.hpp"

namespace attn::cpu::simd {

void float_to_bfloat16(Target t, const float* from, std::uint16_t* to, std::size_t count);
void bfloat16_to_float(Target t, const std::uint16_t* from, float* to, std::size_t count);
void float_to_float16(Target t, const float* from, std::uint16_t* to, std::size_t count);
void float16_to_float(Target t, const std::uint16_t* from, float* to, std::size_t count);

}  // namespace attn::cpu::simd
