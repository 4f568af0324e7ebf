// One-regressor local polynomial moments (simd/kreg_moments.hpp), compiled once per SIMD target: a
// vector of points at a time, the run's last partial vector padded and its weights zeroed.
#include <algorithm>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/simd/kreg_moments.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include "cpu/simd/kreg_moments.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::fused::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// K(u) and -K'(u) for a vector of u.
template <ContinuousKernel K, class D, class V>
void Kernel(D d, V u, V& w, V& g) {
  const V one = hn::Set(d, 1.0);
  const V inside = hn::IfThenElseZero(hn::Le(hn::Abs(u), one), one);  // 1 where |u| <= 1
  if constexpr (K == ContinuousKernel::gaussian) {
    w = hn::Exp(d, hn::Mul(hn::Mul(u, u), hn::Set(d, -0.5)));
    g = hn::Mul(u, w);
  } else if constexpr (K == ContinuousKernel::epanechnikov) {
    w = hn::Mul(inside, hn::NegMulAdd(u, u, one));
    g = hn::Mul(inside, hn::Add(u, u));
  } else if constexpr (K == ContinuousKernel::boxcar) {
    w = inside;
    g = hn::Zero(d);
  } else {
    const V a = hn::Abs(u);
    const V t = hn::Mul(inside, hn::NegMulAdd(hn::Mul(a, a), a, one));  // 1 - |u|^3 inside, else 0
    const V t2 = hn::Mul(t, t);
    w = hn::Mul(t2, t);
    g = hn::Mul(hn::Mul(hn::Set(d, 9.0), hn::Mul(u, a)), t2);
  }
}

template <ContinuousKernel K, int P, bool G>
void Moments(const double* xs, const double* ys, index_t count, double x0, double inverse_h, KregMoments& out) {
  const hn::ScalableTag<double> d;
  using V = hn::Vec<decltype(d)>;
  const index_t L = static_cast<index_t>(hn::Lanes(d));
  const V x0v = hn::Set(d, x0), ihv = hn::Set(d, inverse_h);
  V s[2 * P + 1], t[P + 1], gs[2 * P + 2], gt[P + 2];
  for (auto& v : s) v = hn::Zero(d);
  for (auto& v : t) v = hn::Zero(d);
  for (auto& v : gs) v = hn::Zero(d);
  for (auto& v : gt) v = hn::Zero(d);
  auto add = [&](V x, V y, V live) {
    const V u = hn::Mul(hn::Sub(x, x0v), ihv);
    V w, g;
    Kernel<K>(d, u, w, g);
    w = hn::Mul(w, live);
    V pw = w, py = hn::Mul(w, y);
    for (int a = 0; a <= 2 * P; ++a) {
      s[a] = hn::Add(s[a], pw);
      if (a <= P) t[a] = hn::Add(t[a], py), py = hn::Mul(py, u);
      pw = hn::Mul(pw, u);
    }
    if constexpr (G) {
      g = hn::Mul(g, live);
      V pg = g, pgy = hn::Mul(g, y);
      for (int a = 0; a <= 2 * P + 1; ++a) {
        gs[a] = hn::Add(gs[a], pg);
        if (a <= P + 1) gt[a] = hn::Add(gt[a], pgy), pgy = hn::Mul(pgy, u);
        pg = hn::Mul(pg, u);
      }
    }
  };
  const V one = hn::Set(d, 1.0);
  index_t j = 0;
  for (; j + L <= count; j += L) add(hn::LoadU(d, xs + j), hn::LoadU(d, ys + j), one);
  if (j < count) {  // the last points, padded with copies of x0 (their weights are zeroed)
    HWY_ALIGN double xt[hn::MaxLanes(d)], yt[hn::MaxLanes(d)];
    std::fill(xt, xt + L, x0), std::fill(yt, yt + L, 0.0);
    std::copy(xs + j, xs + count, xt), std::copy(ys + j, ys + count, yt);
    const V live = hn::IfThenElseZero(hn::FirstN(d, static_cast<std::size_t>(count - j)), one);
    add(hn::Load(d, xt), hn::Load(d, yt), live);
  }
  for (int a = 0; a <= 2 * P; ++a) out.s[a] += hn::GetLane(hn::SumOfLanes(d, s[a]));
  for (int a = 0; a <= P; ++a) out.t[a] += hn::GetLane(hn::SumOfLanes(d, t[a]));
  if constexpr (G) {
    for (int a = 0; a <= 2 * P + 1; ++a) out.gs[a] += hn::GetLane(hn::SumOfLanes(d, gs[a]));
    for (int a = 0; a <= P + 1; ++a) out.gt[a] += hn::GetLane(hn::SumOfLanes(d, gt[a]));
  }
}

template <ContinuousKernel K, int P>
void ForDegree(const double* xs, const double* ys, index_t count, double x0, double inverse_h, bool with_gradient,
               KregMoments& out) {
  if (with_gradient)
    Moments<K, P, true>(xs, ys, count, x0, inverse_h, out);
  else
    Moments<K, P, false>(xs, ys, count, x0, inverse_h, out);
}

template <ContinuousKernel K>
void ForKernel(const double* xs, const double* ys, index_t count, double x0, double inverse_h, int degree,
               bool with_gradient, KregMoments& out) {
  switch (degree) {
    case 0: return ForDegree<K, 0>(xs, ys, count, x0, inverse_h, with_gradient, out);
    case 1: return ForDegree<K, 1>(xs, ys, count, x0, inverse_h, with_gradient, out);
    case 2: return ForDegree<K, 2>(xs, ys, count, x0, inverse_h, with_gradient, out);
    default: return ForDegree<K, 3>(xs, ys, count, x0, inverse_h, with_gradient, out);
  }
}

void KregMomentsFor(const double* xs, const double* ys, index_t count, double x0, double inverse_h,
                    ContinuousKernel kernel, int degree, bool with_gradient, KregMoments& out) {
  simd::note_ran(HWY_TARGET);
  switch (kernel) {
    case ContinuousKernel::gaussian:
      return ForKernel<ContinuousKernel::gaussian>(xs, ys, count, x0, inverse_h, degree, with_gradient, out);
    case ContinuousKernel::epanechnikov:
      return ForKernel<ContinuousKernel::epanechnikov>(xs, ys, count, x0, inverse_h, degree, with_gradient, out);
    case ContinuousKernel::boxcar:
      return ForKernel<ContinuousKernel::boxcar>(xs, ys, count, x0, inverse_h, degree, with_gradient, out);
    case ContinuousKernel::tricube:
      return ForKernel<ContinuousKernel::tricube>(xs, ys, count, x0, inverse_h, degree, with_gradient, out);
  }
}

}  // namespace attn::cpu::fused::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::cpu::fused {

HWY_EXPORT(KregMomentsFor);

void kreg_moments(const double* xs, const double* ys, index_t count, double x0, double inverse_h,
                  ContinuousKernel kernel, int degree, bool with_gradient, KregMoments& out, simd::Target simd) {
  ATTN_SIMD_CALL(simd, KregMomentsFor)(xs, ys, count, x0, inverse_h, kernel, degree, with_gradient, out);
}

}  // namespace attn::cpu::fused
#endif  // HWY_ONCE
