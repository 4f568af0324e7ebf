// quantize_row (int8_rows.hpp): plain loops, O(rows d) against the forward's O(n m d).
#include "cpu/quant/int8_rows.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace attn::cpu::quant {

float quantize_row(const float* x, const float* center, const double* factor, index_t d, std::int8_t* q,
                   std::int32_t* byte_sum) {
  const auto y = [&](index_t c) {
    const double diff = static_cast<double>(x[c]) - (center != nullptr ? static_cast<double>(center[c]) : 0.0);
    return factor != nullptr ? diff * factor[c] : diff;
  };
  double top = 0;
  for (index_t c = 0; c < d; ++c) {
    const double v = y(c);
    if (!std::isfinite(v)) return std::numeric_limits<float>::quiet_NaN();
    top = std::max(top, std::abs(v));
  }
  const auto scale = static_cast<float>(top / 127);
  // Rounding to nearest even by adding and taking away 1.5 x 2^52, exact for |y / s| < 2^51 (here at
  // most 127 and a rounding): what nearbyint gives, in a loop the compiler vectorises.
  constexpr double kRound = 6755399441055744.0;
  std::int32_t sum = 0;
  if (scale > 0)
    for (index_t c = 0; c < d; ++c) {
      const double r = (y(c) / scale + kRound) - kRound;
      q[c] = static_cast<std::int8_t>(std::clamp(r, -127.0, 127.0));
      sum += q[c];
    }
  else
    std::fill(q, q + d, std::int8_t{0});
  std::fill(q + d, q + int8_row_bytes(d), std::int8_t{0});
  *byte_sum = sum;
  return scale;
}

void balance_channels(const double* key_top, const double* query_top, index_t d, double* lambda) {
  for (index_t c = 0; c < d; ++c)
    lambda[c] = key_top[c] > 0 && query_top[c] > 0 ? std::sqrt(key_top[c] / query_top[c]) : 1.0;
}

}  // namespace attn::cpu::quant
