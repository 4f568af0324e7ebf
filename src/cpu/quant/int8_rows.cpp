// The int8 forward's quantization (int8_rows.hpp), compiled once per SIMD target
// (hwy/foreach_target.h): double lanes, so that every target computes the same values bit for bit
// (differences, products, a maximum, one division and the rounding are exact IEEE operations in a
// fixed order). The scalar loops of a first version took a tenth of the (1,4096,4096,128) forward.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/quant/int8_rows.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "cpu/quant/int8_rows.hpp"
#include "cpu/simd/dispatch.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::quant::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DD = hn::ScalableTag<double>;
using DF = hn::Rebind<float, DD>;  // as many float lanes, widened exactly

// Elements [c, c + L) of x less center (nullptr: 0), in double.
HWY_INLINE hn::Vec<DD> Difference(const float* x, const float* center, index_t c) {
  const auto v = hn::PromoteTo(DD(), hn::LoadU(DF(), x + c));
  return center != nullptr ? hn::Sub(v, hn::PromoteTo(DD(), hn::LoadU(DF(), center + c))) : v;
}
inline double ScalarDifference(const float* x, const float* center, index_t c) {
  return static_cast<double>(x[c]) - (center != nullptr ? static_cast<double>(center[c]) : 0.0);
}

float QuantizeRow(const float* HWY_RESTRICT x, const float* HWY_RESTRICT center, const double* HWY_RESTRICT factor,
                  index_t d, std::int8_t* HWY_RESTRICT q, std::int32_t* byte_sum) {
  simd::note_ran(HWY_TARGET);
  const DD dd;
  const auto L = static_cast<index_t>(hn::Lanes(dd));
  auto top = hn::Zero(dd), poison = hn::Zero(dd);  // poison: NaN where some y is not finite
  double rest_top = 0, rest_poison = 0;
  index_t c = 0;
  for (; c + L <= d; c += L) {
    const auto y = hn::Mul(Difference(x, center, c), hn::LoadU(dd, factor + c));
    top = hn::Max(top, hn::Abs(y)), poison = hn::Add(poison, hn::Mul(y, hn::Zero(dd)));
  }
  for (; c < d; ++c) {
    const double y = ScalarDifference(x, center, c) * factor[c];
    rest_top = std::max(rest_top, std::abs(y)), rest_poison += y * 0.0;
  }
  if (std::isnan(hn::GetLane(hn::SumOfLanes(dd, poison)) + rest_poison)) return std::numeric_limits<float>::quiet_NaN();
  const auto scale = static_cast<float>(std::max(hn::GetLane(hn::MaxOfLanes(dd, top)), rest_top) / 127);
  // Rounding to nearest even by adding and taking away 1.5 x 2^52, exact for |y / s| < 2^51 (here at
  // most 127 and a rounding): what nearbyint gives, on every target.
  constexpr double kRound = 6755399441055744.0;
  const double s = scale > 0 ? scale : 1.0;  // s = 0: every y is 0 (or below 127 subnormals: q = 0)
  const hn::Rebind<std::int32_t, DD> di;
  const hn::Rebind<std::int8_t, DD> db;
  auto sum = hn::Zero(di);
  std::int32_t rest_sum = 0;
  for (c = 0; c + L <= d; c += L) {
    auto r = hn::Sub(hn::Add(hn::Div(hn::Mul(Difference(x, center, c), hn::LoadU(dd, factor + c)), hn::Set(dd, s)),
                             hn::Set(dd, kRound)),
                     hn::Set(dd, kRound));
    r = hn::Min(hn::Max(r, hn::Set(dd, -127.0)), hn::Set(dd, 127.0));
    if (!(scale > 0)) r = hn::Zero(dd);
    const auto i = hn::DemoteTo(di, r);
    sum = hn::Add(sum, i);
    hn::StoreU(hn::DemoteTo(db, i), db, q + c);
  }
  for (; c < d; ++c) {
    const double r = std::clamp((ScalarDifference(x, center, c) * factor[c] / s + kRound) - kRound, -127.0, 127.0);
    q[c] = static_cast<std::int8_t>(scale > 0 ? r : 0.0);
    rest_sum += q[c];
  }
  std::fill(q + d, q + int8_row_bytes(d), std::int8_t{0});
  *byte_sum = hn::GetLane(hn::SumOfLanes(di, sum)) + rest_sum;
  return scale;
}

// sum[c] += x[c] for `rows` rows of w elements (stride `stride`), in row order; returns the first
// row holding a value that is not finite, or -1.
index_t SumRows(const float* HWY_RESTRICT x, index_t stride, index_t rows, index_t w, double* HWY_RESTRICT sum) {
  simd::note_ran(HWY_TARGET);
  const DD dd;
  const auto L = static_cast<index_t>(hn::Lanes(dd));
  auto poison = hn::Zero(dd);
  double rest_poison = 0;
  for (index_t j = 0; j < rows; ++j) {
    const float* row = x + j * stride;
    index_t c = 0;
    for (; c + L <= w; c += L) {
      const auto v = Difference(row, nullptr, c);
      hn::StoreU(hn::Add(hn::LoadU(dd, sum + c), v), dd, sum + c), poison = hn::Add(poison, hn::Mul(v, hn::Zero(dd)));
    }
    for (; c < w; ++c) sum[c] += row[c], rest_poison += row[c] * 0.0;
  }
  if (!std::isnan(hn::GetLane(hn::SumOfLanes(dd, poison)) + rest_poison)) return -1;
  for (index_t j = 0; j < rows; ++j)  // found at the end: look for the row
    for (index_t c = 0; c < w; ++c)
      if (!std::isfinite(x[j * stride + c])) return j;
  return -1;
}

// top[c] = max(top[c], |x[c] - center[c]|) over `rows` rows of w elements (center nullptr: 0).
void TopOfRows(const float* HWY_RESTRICT x, index_t stride, index_t rows, index_t w, const float* HWY_RESTRICT center,
               double* HWY_RESTRICT top) {
  simd::note_ran(HWY_TARGET);
  const DD dd;
  const auto L = static_cast<index_t>(hn::Lanes(dd));
  for (index_t j = 0; j < rows; ++j) {
    const float* row = x + j * stride;
    index_t c = 0;
    for (; c + L <= w; c += L) hn::StoreU(hn::Max(hn::LoadU(dd, top + c), hn::Abs(Difference(row, center, c))), dd, top + c);
    for (; c < w; ++c) top[c] = std::max(top[c], std::abs(ScalarDifference(row, center, c)));
  }
}

}  // namespace attn::cpu::quant::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::cpu::quant {

HWY_EXPORT(QuantizeRow);
HWY_EXPORT(SumRows);
HWY_EXPORT(TopOfRows);

float quantize_row(simd::Target target, const float* x, const float* center, const double* factor, index_t d,
                   std::int8_t* q, std::int32_t* byte_sum) {
  return ATTN_SIMD_CALL(target, QuantizeRow)(x, center, factor, d, q, byte_sum);
}

index_t sum_rows(simd::Target target, const float* x, index_t stride, index_t rows, index_t w, double* sum) {
  return ATTN_SIMD_CALL(target, SumRows)(x, stride, rows, w, sum);
}

void top_of_rows(simd::Target target, const float* x, index_t stride, index_t rows, index_t w, const float* center,
                 double* top) {
  ATTN_SIMD_CALL(target, TopOfRows)(x, stride, rows, w, center, top);
}

void balance_channels(const double* key_top, const double* query_top, index_t d, double* lambda) {
  for (index_t c = 0; c < d; ++c)
    lambda[c] = key_top[c] > 0 && query_top[c] > 0 ? std::sqrt(key_top[c] / query_top[c]) : 1.0;
}

}  // namespace attn::cpu::quant
#endif  // HWY_ONCE
