// 4-bit quantization of the KV cache (q4.hpp): scalar loops, run as tokens are appended to a cache or
// read back from it, never inside an attention kernel.
#include "cpu/quant/q4.hpp"

#include <algorithm>

namespace attn::cpu::quant {

void q4_quantize(const float* x, index_t stride, std::uint8_t* codes, float& scale, float& min) {
  float lo = x[0], hi = x[0];
  for (index_t i = 1; i < kQ4Group; ++i) lo = std::min(lo, x[i * stride]), hi = std::max(hi, x[i * stride]);
  scale = (hi - lo) / 15.0f;
  min = lo;
  for (index_t i = 0; i < kQ4Group; ++i) {
    const float q = scale == 0 ? 0.0f : std::nearbyint((x[i * stride] - lo) / scale);
    codes[i] = static_cast<std::uint8_t>(std::clamp(q, 0.0f, 15.0f));
  }
}

void q4_pack_row(const float* x, index_t count, std::uint8_t* codes, float* scales, float* mins) {
  std::uint8_t group[kQ4Group];
  for (index_t g = 0; g < count / kQ4Group; ++g) {
    q4_quantize(x + g * kQ4Group, 1, group, scales[g], mins[g]);
    for (index_t i = 0; i < kQ4Group; ++i) q4_set_code(codes, g * kQ4Group + i, group[i]);
  }
}

void q4_unpack_row(const std::uint8_t* codes, const float* scales, const float* mins, index_t count, float* x) {
  for (index_t c = 0; c < count; ++c) x[c] = q4_value(q4_code(codes, c), scales[c / kQ4Group], mins[c / kQ4Group]);
}

}  // namespace attn::cpu::quant
