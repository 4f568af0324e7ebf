// The leave-one-out criterion of attn/width_selection.hpp on validated, dense float64 data: what
// loo_cv_error computes and what select_width's searches evaluate many times over.
#pragma once

#include <span>
#include <vector>

#include "attn/width_selection.hpp"

namespace attn::train {

// G groups of N points, in double, stored by columns: x (G, p, N) and y (G, v, N), so that a
// feature of all the points of a group is contiguous; spread (p,) the standard deviation of each
// input dimension over all points (1 where it is 0).
struct LooProblem {
  index_t G = 0, N = 0, p = 0, v = 0;
  std::vector<double> x, y, spread;
  // The widths the data's type holds: the search stays within them (x of 1e306 has a spread whose
  // grid passed float64's range; x of 1e36 in float32, float32's).
  double narrowest = 0, widest = 0;
};

// Validates x, y and the kernel for `op` (the messages of attn/width_selection.hpp) and copies the
// data into a LooProblem.
template <class T>
LooProblem make_loo_problem(const char* op, TensorView<const T> x, TensorView<const T> y, Kernel kernel);

// Widths of size p or 1, each positive and finite; attn::Error naming `op` and the tensor `of`
// whose last dimension is p otherwise.
void check_widths(const char* op, std::span<const double> widths, index_t p, const char* of);

// The criterion and, when with_gradient, its gradient; widths already checked.
LooCv loo_cv(const LooProblem& problem, Kernel kernel, std::span<const double> widths, bool with_gradient);

}  // namespace attn::train
