// Per-target hyperbolic tangent for the fused additive attention kernels (Highway "-inl.h"
// convention, like softmax-inl.h). Highway's contrib Tanh goes through Expm1 (range reduction, a
// polynomial, an exponent rebuild) and is several times slower than what the additive score loop,
// which evaluates h tanh per (query, key) pair, can afford; these are branch-free and NaN-propagating.
//
// float: Eigen's odd rational minimax x P(x^2) / Q(x^2), P of degree 6 and Q of degree 3 in x^2,
//   on x clamped to [-9, 9] (|tanh| is within 3e-8 of 1 beyond), coefficients divided by Q's
//   constant term so that Q(0) = 1 and P(0) = 0.99999988: tiny and subnormal x come out as x rather
//   than x rounded through Eigen's 0.0049 factor (1.2e-5 relative error near the smallest normal).
//   1 mul + 6 FMA + 1 mul + 3 FMA + 1 div + 2 clamps: 14 vector ops.
//   Maximum relative error against std::tanh in double: 3.4e-7 (5.6 float ulps, at x = 0.0323),
//   measured over every float in [0, 10], subnormals included (the evaluation is odd, so [-10, 0]
//   is its mirror image); it stays below that beyond 10 and at +-inf, which give P(81) / Q(81).
// double: Cephes' odd rational x + x^3 P(x^2) / Q(x^2) below |x| = 0.625, and
//   1 - 2 / (exp(2|x|) + 1) (Highway's Exp, 1 ulp) with x's sign above, both computed and blended;
//   |x| clamped to 22 (tanh = 1 in double from 19.1). Maximum relative error against long double
//   std::tanh: 2.7e-16 (about 1.2 ulps), measured on 4.2e7 points of [-25, 25] and 1e6 tiny values
//   down to 2^-1010.
// Both: tanh(+-0) = +-0, +-inf gives +-1 (float: within the bound), NaN in gives NaN out
// (tests/test_additive.cpp, TanhAccuracy, checks the bounds on every compiled target).

#if defined(ATTN_CPU_SIMD_TANH_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_CPU_SIMD_TANH_INL_H_
#undef ATTN_CPU_SIMD_TANH_INL_H_
#else
#define ATTN_CPU_SIMD_TANH_INL_H_
#endif

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::fused::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// x clamped to [-c, c], NaN kept. x86's min/max return their second operand when either is NaN,
// so Min(hi, Max(lo, x)) passes a NaN x through at no cost; Highway's emulated targets return the
// number instead, and the NaN is put back with a blend.
template <class D>
HWY_INLINE hn::Vec<D> ClampKeepNaN(D d, hn::Vec<D> x, hn::TFromD<D> c) {
  const hn::Vec<D> r = hn::Min(hn::Set(d, c), hn::Max(hn::Set(d, -c), x));
#if HWY_ARCH_X86 && HWY_TARGET != HWY_EMU128 && HWY_TARGET != HWY_SCALAR
  return r;
#else
  return hn::IfThenElse(hn::Eq(x, x), r, x);
#endif
}

// tanh of every lane (float or double); see the error bounds above. Not named Tanh: argument-
// dependent lookup would also find Highway's.
template <class D>
HWY_INLINE hn::Vec<D> TanhFast(D d, hn::Vec<D> x) {
  using T = hn::TFromD<D>;
  using V = hn::Vec<D>;
  if constexpr (sizeof(T) == 4) {
    // Eigen's alpha_k / beta_0 and beta_k / beta_0, beta_0 = 4.89352518554385e-03.
    const V xc = ClampKeepNaN(d, x, 9.0f);
    const V x2 = hn::Mul(xc, xc);
    V p = hn::Set(d, -5.64167616e-14f);                   // -2.76076847742355e-16 / beta_0
    p = hn::MulAdd(p, x2, hn::Set(d, 4.08741721e-11f));   // 2.00018790482477e-13
    p = hn::MulAdd(p, x2, hn::Set(d, -1.75837886e-08f));  // -8.60467152213735e-11
    p = hn::MulAdd(p, x2, hn::Set(d, 1.04674991e-05f));   // 5.12229709037114e-08
    p = hn::MulAdd(p, x2, hn::Set(d, 3.03609832e-03f));   // 1.48572235717979e-05
    p = hn::MulAdd(p, x2, hn::Set(d, 1.30225539e-01f));   // 6.37261928875436e-04
    p = hn::MulAdd(p, x2, hn::Set(d, 9.99999881e-01f));   // 4.89352455891786e-03
    V q = hn::Set(d, 2.44866096e-04f);                    // 1.19825839466702e-06 / beta_0
    q = hn::MulAdd(q, x2, hn::Set(d, 2.42227633e-02f));   // 1.18534705686654e-04
    q = hn::MulAdd(q, x2, hn::Set(d, 4.63558376e-01f));   // 2.26843463243900e-03
    q = hn::MulAdd(q, x2, hn::Set(d, 1.0f));
    return hn::Div(hn::Mul(xc, p), q);
  } else {
    const V ax = hn::Min(hn::Abs(x), hn::Set(d, 22.0));
    // Cephes tanh.c, |x| < 0.625: x + x z P(z) / Q(z), z = x^2.
    const V z = hn::Mul(x, x);
    V p = hn::Set(d, -9.64399179425052238628e-1);
    p = hn::MulAdd(p, z, hn::Set(d, -9.92877231001918586564e1));
    p = hn::MulAdd(p, z, hn::Set(d, -1.61468768441708447952e3));
    V q = hn::Add(z, hn::Set(d, 1.12811678491632931402e2));
    q = hn::MulAdd(q, z, hn::Set(d, 2.23548839060100448583e3));
    q = hn::MulAdd(q, z, hn::Set(d, 4.84406305325125486048e3));
    const V small = hn::MulAdd(hn::Mul(x, z), hn::Div(p, q), x);
    // Above: 1 - 2 / (e^(2|x|) + 1), with x's sign.
    const V one = hn::Set(d, 1.0);
    const V e = hn::Exp(d, hn::Add(ax, ax));
    const V big = hn::CopySign(hn::Sub(one, hn::Div(hn::Set(d, 2.0), hn::Add(e, one))), x);
    // The sign again: x + x z (P/Q) of x = -0 is +0.
    const V r = hn::CopySign(hn::IfThenElse(hn::Lt(hn::Abs(x), hn::Set(d, 0.625)), small, big), x);
    return hn::IfThenElse(hn::Eq(x, x), r, x);  // Min lost a NaN on some targets
  }
}

// tanh accurate to about one ulp over the whole range, for the backward of additive attention: its
// gradients pass through w_v (1 - tanh^2) and the softmax of scores that may be large, which
// magnify TanhFast's few-ulp error (measured: dkeys at 2.3x the float32 reference's error for
// scores above 500). float: Cephes' tanhf, the odd polynomial x + x^3 P(x^2) below |x| = 0.625 and
// 1 - 2 / (exp(2|x|) + 1) (Highway's Exp, 1 ulp) above, with x's sign; |x| clamped to 40 (tanh is 1
// in float from 9.1). Maximum relative error against std::tanh in double: 1.42e-7 (1.2 x 2^-23, at
// x = 0.628), measured over every float in [0, 10]; absolute error above |x| = 2 at most 3.3e-8,
// against 3.4e-7 for TanhFast (tests/test_additive.cpp checks 1.5e-7 on every 61st float). double:
// TanhFast (the same construction, 2.7e-16). NaN in gives NaN out; +-0 and +-inf as TanhFast.
template <class D>
HWY_INLINE hn::Vec<D> TanhAccurate(D d, hn::Vec<D> x) {
  using T = hn::TFromD<D>;
  using V = hn::Vec<D>;
  if constexpr (sizeof(T) == 4) {
    const V z = hn::Mul(x, x);
    V p = hn::Set(d, -5.70498872745e-3f);
    p = hn::MulAdd(p, z, hn::Set(d, 2.06390887954e-2f));
    p = hn::MulAdd(p, z, hn::Set(d, -5.37397155531e-2f));
    p = hn::MulAdd(p, z, hn::Set(d, 1.33314422036e-1f));
    p = hn::MulAdd(p, z, hn::Set(d, -3.33332819422e-1f));
    const V small = hn::MulAdd(hn::Mul(p, z), x, x);
    // Every lane below 0.625 (soft-capped scores well under the cap): the polynomial alone. NaN
    // lanes fail the test and take the general path.
    const auto is_small = hn::Lt(hn::Abs(x), hn::Set(d, 0.625f));
    if (hn::AllTrue(d, is_small)) return hn::CopySign(small, x);
    const V ax = hn::Min(hn::Abs(x), hn::Set(d, 40.0f));
    const V one = hn::Set(d, 1.0f);
    const V e = hn::Exp(d, hn::Add(ax, ax));
    const V big = hn::CopySign(hn::Sub(one, hn::Div(hn::Set(d, 2.0f), hn::Add(e, one))), x);
    // x's sign again: x + x^3 P of x = -0 is +0.
    const V r = hn::CopySign(hn::IfThenElse(is_small, small, big), x);
    return hn::IfThenElse(hn::Eq(x, x), r, x);  // Min lost a NaN on some targets
  } else {
    return TanhFast(d, x);
  }
}

}  // namespace attn::cpu::fused::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // ATTN_CPU_SIMD_TANH_INL_H_
