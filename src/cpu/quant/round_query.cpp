// The 16-bit rounding of a query row that meets int8 keys (q8_0.hpp: round_query), compiled once
// per SIMD target (hwy/foreach_target.h) so that the decode path rounds with the target it runs.
#include <cmath>
#include <cstdint>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/quant/round_query.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "cpu/quant/q8_0.hpp"
#include "cpu/simd/dispatch.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::quant::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// round_query on this target: every target rounds alike (the maximum is exact, and NearestInt
// rounds to nearest even).
float RoundQueryRow(const float* HWY_RESTRICT q, index_t dim, std::int16_t* HWY_RESTRICT rounded) {
  const hn::ScalableTag<float> d;
  const index_t L = static_cast<index_t>(hn::Lanes(d));
  auto top = hn::Zero(d), poison = hn::Zero(d);  // poison: NaN where an element is not finite
  for (index_t c = 0; c < dim; c += L) {  // dim a multiple of 32, so of L
    const auto x = hn::LoadU(d, q + c);
    top = hn::Max(top, hn::Abs(x));
    poison = hn::Add(poison, hn::Mul(x, hn::Zero(d)));
  }
  const float m = hn::GetLane(hn::MaxOfLanes(d, top));
  if (std::isnan(hn::GetLane(hn::SumOfLanes(d, poison))) || !(m >= 0x1p-100f)) return 0;
  const auto inv = hn::Set(d, 32767.0f / m);  // |q inv| <= 32767 (1 + 2^-23): within int16
  const hn::Rebind<std::int16_t, decltype(d)> dw;
  for (index_t c = 0; c < dim; c += L)
    hn::StoreU(hn::DemoteTo(dw, hn::NearestInt(hn::Mul(hn::LoadU(d, q + c), inv))), dw, rounded + c);
  return m / 32767.0f;
}

}  // namespace attn::cpu::quant::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::cpu::quant {

HWY_EXPORT(RoundQueryRow);

float round_query(simd::Target target, const float* q, index_t d, std::int16_t* r) {
  return ATTN_SIMD_CALL(target, RoundQueryRow)(q, d, r);
}

void rounded_query(simd::Target target, const float* q, index_t d, std::int16_t* r, float* out) {
  const float sigma = round_query(target, q, d, r);
  for (index_t c = 0; c < d; ++c) out[c] = sigma != 0 ? static_cast<float>(r[c]) * sigma : q[c];
}

}  // namespace attn::cpu::quant
#endif  // HWY_ONCE
