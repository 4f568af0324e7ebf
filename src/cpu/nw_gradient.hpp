// The Nadaraya-Watson backward's coefficients, shared by the dense path (nadaraya_watson.cpp) and
// the windowed one (nadaraya_watson_windowed.cpp).
//
// Every gradient is a sum over (query, key) pairs of a_ij (q_i - k_j), or of a_ij ||q_i - k_j||^2
// for dsigma, with a_ij = b_ij / sigma^e, where, for w = K / Z, g = dout_i . v_j, c = dout_i . out_i
// and r = ||q_i - k_j||:
//   gaussian      e = 2, b = -w (g - c)                        (softmax backward of -r^2 / 2 sigma^2)
//   epanechnikov  e = 1, b = -(g - c) / (Z r)  inside the support, r > 0; else 0.
// The kernels sum b-weighted terms and divide by sigma e times once, at the end (divided_by_sigma):
// b stays in range where 1 / sigma^e does not (a tiny sigma), so a pair at distance 0 adds exactly
// 0 instead of 0 x inf = NaN, and a gradient overflows only when its true value does.
#pragma once

#include <cmath>

#include "attn/nadaraya_watson.hpp"

namespace attn::cpu {

// e of the comment above: the power of sigma that a kernel's coefficients were scaled by.
constexpr int sigma_power(Kernel kernel) { return kernel == Kernel::gaussian ? 2 : 1; }

// b of one pair, in double: w = K / Z, d2 = r^2. K is the Gaussian or the Epanechnikov kernel (the
// others have no gradient in q, k or sigma; their paths never call this).
template <Kernel K>
double scaled_coefficient(double w, double d2, double Z, double g, double c, double sigma) {
  if constexpr (K == Kernel::gaussian) {
    return -w * (g - c);
  } else {
    const double r = std::sqrt(d2);
    return 1 - r / sigma > 0 && r > 0 ? -(g - c) / Z / r : 0.0;
  }
}

// x / sigma^times, one division at a time: 0 stays 0 and nothing overflows before the last step.
inline double divided_by_sigma(double x, double sigma, int times) {
  for (int t = 0; t < times; ++t) x /= sigma;
  return x;
}

}  // namespace attn::cpu
