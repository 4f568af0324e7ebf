// The windowed Nadaraya-Watson forward's inner loop (simd/nw_window.hpp), compiled once per SIMD
// target: a vector of keys at a time, the window's last partial vector copied into a zero-padded
// buffer so that every key goes through the same vector code (and the same exp).
#include <algorithm>
#include <cmath>
#include <type_traits>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/simd/nw_window.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/aligned_allocator.h>
#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include "cpu/simd/nw_window.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::fused::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The kernel values of the keys in k for query q (all vectors of D), as the dense path writes them.
// This file is compiled with -ffp-contract=off (CMakeLists.txt): d2 is rounded before d2_min is
// subtracted, as the window's search rounded it, so the nearest key weighs exactly exp(0) = 1.
template <Kernel K, class D, class V>
V Weights(D d, V k, V q, V d2_min, V sigma) {
  const V diff = hn::Sub(q, k);
  const V d2 = hn::Mul(diff, diff);
  if constexpr (K == Kernel::gaussian) {
    const V a = hn::Div(hn::Div(hn::Sub(d2, d2_min), sigma), sigma);
    return hn::Exp(d, hn::Mul(hn::Neg(a), hn::Set(d, static_cast<hn::TFromD<D>>(0.5))));  // x / 2 == x * 0.5 exactly
  } else if constexpr (K == Kernel::epanechnikov) {
    return hn::Max(hn::Zero(d), hn::Sub(hn::Set(d, hn::TFromD<D>(1)), hn::Div(hn::Sqrt(d2), sigma)));
  } else {
    return hn::Set(d, hn::TFromD<D>(1));
  }
}

// The accumulators' descriptor: doubles filling a vector of D (float lanes are promoted half by
// half), or, on the one-lane HWY_SCALAR target, one double per lane.
template <class D>
using AccumD = std::conditional_t<HWY_TARGET == HWY_SCALAR, hn::Rebind<double, D>, hn::Repartition<double, D>>;

// Adds K and K v of one vector to the double accumulators: float lanes are promoted (a product of
// two floats is exact in double), double lanes added as they are.
template <class D, class V, class VD>
void Accumulate(D d, V Kv, V vv, VD& z0, VD& z1, VD& s0, VD& s1) {
  using T = hn::TFromD<D>;
  const AccumD<D> dd;
  if constexpr (sizeof(T) == 8) {
    (void)d, (void)dd, (void)z1, (void)s1;
    z0 = hn::Add(z0, Kv);
    s0 = hn::MulAdd(Kv, vv, s0);
  } else {
#if HWY_TARGET == HWY_SCALAR  // one lane: no halves
    (void)d, (void)z1, (void)s1;
    const auto k = hn::PromoteTo(dd, Kv);
    z0 = hn::Add(z0, k);
    s0 = hn::MulAdd(k, hn::PromoteTo(dd, vv), s0);
#else
    (void)d;
    const hn::Half<D> dh;
    const auto klo = hn::PromoteTo(dd, hn::LowerHalf(dh, Kv)), khi = hn::PromoteTo(dd, hn::UpperHalf(dh, Kv));
    z0 = hn::Add(z0, klo), z1 = hn::Add(z1, khi);
    s0 = hn::MulAdd(klo, hn::PromoteTo(dd, hn::LowerHalf(dh, vv)), s0);
    s1 = hn::MulAdd(khi, hn::PromoteTo(dd, hn::UpperHalf(dh, vv)), s1);
#endif
  }
}

template <Kernel K, class T>
WindowSums Sums(const T* ks, const T* vals, index_t count, T q, T d2_min, T sigma) {
  const hn::ScalableTag<T> d;
  const AccumD<decltype(d)> dd;
  const index_t L = static_cast<index_t>(hn::Lanes(d));
  const auto qv = hn::Set(d, q), mv = hn::Set(d, d2_min), sv = hn::Set(d, sigma);
  auto z0 = hn::Zero(dd), z1 = hn::Zero(dd), s0 = hn::Zero(dd), s1 = hn::Zero(dd);
  index_t j = 0;
  for (; j + L <= count; j += L) {
    const auto Kv = Weights<K>(d, hn::LoadU(d, ks + j), qv, mv, sv);
    Accumulate(d, Kv, hn::LoadU(d, vals + j), z0, z1, s0, s1);
  }
  if (j < count) {  // the last keys, padded with copies of the first (their weights are zeroed)
    HWY_ALIGN T kt[hn::MaxLanes(d)], vt[hn::MaxLanes(d)];
    std::fill(kt, kt + L, ks[j]), std::fill(vt, vt + L, T(0));
    std::copy(ks + j, ks + count, kt), std::copy(vals + j, vals + count, vt);
    const auto live = hn::FirstN(d, static_cast<std::size_t>(count - j));
    const auto Kv = hn::IfThenElseZero(live, Weights<K>(d, hn::Load(d, kt), qv, mv, sv));
    Accumulate(d, Kv, hn::Load(d, vt), z0, z1, s0, s1);
  }
  return {hn::GetLane(hn::SumOfLanes(dd, hn::Add(z0, z1))), hn::GetLane(hn::SumOfLanes(dd, hn::Add(s0, s1)))};
}

template <class T>
WindowSums SumsFor(const T* ks, const T* vals, index_t count, T q, T d2_min, T sigma, Kernel kernel) {
  simd::note_ran(HWY_TARGET);
  switch (kernel) {
    case Kernel::gaussian: return Sums<Kernel::gaussian>(ks, vals, count, q, d2_min, sigma);
    case Kernel::epanechnikov: return Sums<Kernel::epanechnikov>(ks, vals, count, q, d2_min, sigma);
    default: return Sums<Kernel::boxcar>(ks, vals, count, q, d2_min, sigma);
  }
}

WindowSums SumsF32(const float* ks, const float* vals, index_t count, float q, float d2_min, float sigma,
                   Kernel kernel) {
  return SumsFor(ks, vals, count, q, d2_min, sigma, kernel);
}
WindowSums SumsF64(const double* ks, const double* vals, index_t count, double q, double d2_min, double sigma,
                   Kernel kernel) {
  return SumsFor(ks, vals, count, q, d2_min, sigma, kernel);
}

}  // namespace attn::cpu::fused::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::cpu::fused {

HWY_EXPORT(SumsF32);
HWY_EXPORT(SumsF64);

template <>
WindowSums nw_window_sums(const float* ks, const float* vals, index_t count, float q, float d2_min, float sigma,
                          Kernel kernel, simd::Target simd) {
  return ATTN_SIMD_CALL(simd, SumsF32)(ks, vals, count, q, d2_min, sigma, kernel);
}
template <>
WindowSums nw_window_sums(const double* ks, const double* vals, index_t count, double q, double d2_min, double sigma,
                          Kernel kernel, simd::Target simd) {
  return ATTN_SIMD_CALL(simd, SumsF64)(ks, vals, count, q, d2_min, sigma, kernel);
}

}  // namespace attn::cpu::fused
#endif  // HWY_ONCE
