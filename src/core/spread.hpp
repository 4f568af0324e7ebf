// The population standard deviation of count values x(0), ..., x(count - 1), computed at any scale:
// the deviations from the mean divided by the largest of them before they are squared, the root of
// their mean square multiplied back. (Squared as they are, deviations past 1e154 overflow float64
// and ones below 1e-162 underflow to 0: data of such a scale read as having an infinite spread, or
// none.) 0 for constant values; not finite only where a deviation itself overflows (values of
// opposite signs near the largest double). The scale of the bandwidth searches (kreg's rule of
// thumb, select_width's grid), so that data in other units get the same widths in those units.
// And power_of_two_unit, below.
#pragma once

#include <algorithm>
#include <cmath>

#include "attn/tensor.hpp"

namespace attn::detail {

template <class X>
double standard_deviation(index_t count, const X& x) {
  const double n = static_cast<double>(count);
  double mean = 0, largest = 0, squares = 0;
  for (index_t i = 0; i < count; ++i) mean += x(i) / n;
  for (index_t i = 0; i < count; ++i) largest = std::max(largest, std::abs(x(i) - mean));
  if (!(largest > 0)) return largest == 0 ? 0.0 : largest;  // constant, or NaN
  for (index_t i = 0; i < count; ++i) squares += std::pow((x(i) - mean) / largest, 2);
  return largest * std::sqrt(squares / n);
}

// A power of two near the largest |v| (|v| / unit < 2), 1 when every v is 0: the unit in which
// kernel regression squares its responses, so that its criteria and bands hold at any scale of y
// (a power of two: y in other units by one gives the same bits).
template <class Range>
double power_of_two_unit(const Range& values) {
  double top = 0;
  for (const double v : values) top = std::max(top, std::abs(v));
  return top > 0 ? std::ldexp(1.0, std::ilogb(top)) : 1.0;
}

}  // namespace attn::detail
