// The inner loop of one-regressor local polynomial regression (src/kreg, attn/kernel_regression.hpp):
// the kernel-weighted moments of a contiguous run of points about one evaluation point, written once
// with Google Highway and compiled for every SIMD target (see fused.hpp).
#pragma once

#include "attn/kernel_regression.hpp"
#include "cpu/simd/dispatch.hpp"

namespace attn::cpu::fused {

// With u_j = (x_j - x0) / h, w_j = K(u_j) and g_j = -K'(u_j) (the kernels of kernel_regression.hpp):
//   s[a] = sum_j w_j u_j^a (a <= 2 degree),  t[a] = sum_j w_j u_j^a y_j (a <= degree)
// and, with_gradient,
//   gs[a] = sum_j g_j u_j^a (a <= 2 degree + 1),  gt[a] = sum_j g_j u_j^a y_j (a <= degree + 1),
// from which d W / d h = g u / h and d W / d x0 = g / h give every derivative the criteria need.
// Sums in double, lane by lane, then across lanes in a fixed order: the result depends on the SIMD
// target, never on the thread count. Accumulates into `out` (not cleared).
struct KregMoments {
  double s[7] = {}, t[4] = {}, gs[8] = {}, gt[5] = {};
};
void kreg_moments(const double* xs, const double* ys, index_t count, double x0, double inverse_h,
                  ContinuousKernel kernel, int degree, bool with_gradient, KregMoments& out, simd::Target simd);

}  // namespace attn::cpu::fused
