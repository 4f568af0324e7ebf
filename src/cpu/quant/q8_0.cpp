// q8_0 pack and unpack (q8_0.hpp): scalar loops, run as keys and values are appended to a KV cache
// or read back from it, never inside an attention kernel.
#include "cpu/quant/q8_0.hpp"

#include <algorithm>
#include <cmath>

namespace attn::cpu::quant {

void q8_0_pack(const float* x, index_t count, std::int8_t* q, float* scales) {
  for (index_t g = 0; g < count; g += kQ8Block) {
    const index_t end = std::min(g + kQ8Block, count);
    float top = 0;  // std::max(top, NaN) keeps top: a NaN does not enter the scale
    for (index_t c = g; c < end; ++c) top = std::max(top, std::abs(x[c]));
    float scale = top / 127.0f;
    // Near float32's largest value the division can round up so far that 127 s overflows: the
    // largest value would dequantise to infinity. The next float below keeps 127 s finite (that
    // value's q is then clamped to 127, within s / 2 of it).
    if (std::isfinite(top) && std::isinf(127.0f * scale)) scale = std::nextafter(scale, 0.0f);
    scales[g / kQ8Block] = scale;
    for (index_t c = g; c < end; ++c) {
      const float v = scale == 0 ? 0.0f : std::nearbyint(x[c] / scale);
      // v is NaN for a NaN x or an infinite x over an infinite scale: stored as 0 (a NaN cast to an
      // integer is undefined behaviour).
      q[c] = std::isnan(v) ? std::int8_t(0) : static_cast<std::int8_t>(std::clamp(v, -127.0f, 127.0f));
    }
  }
}

void q8_0_unpack(const std::int8_t* q, const float* scales, index_t count, float* x) {
  for (index_t c = 0; c < count; ++c) x[c] = static_cast<float>(q[c]) * scales[c / kQ8Block];
}

}  // namespace attn::cpu::quant
