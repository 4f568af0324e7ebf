// Choosing the width of Nadaraya-Watson regression (attn/nadaraya_watson.hpp) by leave-one-out
// cross-validation, what statsmodels' KernelReg calls cv_ls: every training point is predicted from
// all the others, and the width is the one whose predictions err least.
//
//   x (N, p), (B, N, p) or (B, H, N, p)   training inputs: N points of p features per group
//   y (N, v), (B, N, v) or (B, H, N, v)   training targets
//   widths (p,) one width per input dimension, or (1,) one width shared by all of them
// Each (batch, head) group is its own data set: a point is predicted from the other points of its
// group only, as the keys of one batch element are the only ones its queries see.
//
// With per-dimension widths the distance is anisotropic, u = sqrt(sum_c ((x_c - x'_c) / sigma_c)^2),
// and the kernels of nadaraya_watson.hpp take this u; one shared width is the isotropic
// u = ||x - x'|| / sigma of nadaraya_watson_forward.
//
// The criterion, averaged over all G N v target elements (G groups):
//   CV(sigma) = 1 / (G N v) sum_i ||y_i - f_{-i}(x_i)||^2,
//   f_{-i}(x_i) = sum_{j != i} K(u_ij) y_j / sum_{j != i} K(u_ij)
// A point with no other point inside a compact kernel's support (boxcar, Epanechnikov) is an
// "isolated" point: it is predicted as 0, exactly what nadaraya_watson_forward outputs for a query
// with no key in the support, so it adds ||y_i||^2 and no gradient. Too narrow a width is therefore
// charged for the points it leaves alone rather than rewarded for skipping them. The Gaussian never
// isolates a point.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "attn/nadaraya_watson.hpp"
#include "attn/tensor.hpp"

namespace attn {

// One evaluation of the criterion.
struct LooCv {
  double error = 0;              // CV(sigma) above
  std::vector<double> gradient;  // d error / d widths[c], same size as widths; empty unless asked for
  index_t isolated = 0;          // points predicted as 0 for want of a neighbour in the support
};

// The leave-one-out error at `widths` and, when with_gradient, its gradient with respect to them
// (one shared width: the derivative with respect to that width). Computed in double for float and
// double inputs; O(G N^2 (p + v)), threaded with OpenMP over points, the same result for any thread
// count. The boxcar's and the constant kernel's gradients are 0 (piecewise constant weights); the
// Epanechnikov kernel at u = 0 uses 0, as nadaraya_watson_backward does.
// attn::Error for: x or y missing, of rank other than 2 to 4, or of different shapes except for the
// last dimension; fewer than 2 points per group; p or v of 0; widths of a size other than p or 1;
// a width that is not positive and finite; an unknown kernel.
template <class T>
LooCv loo_cv_error(TensorView<const T> x, TensorView<const T> y, Kernel kernel, std::span<const double> widths,
                   bool with_gradient = true);

// How select_width searches.
struct WidthSearchOptions {
  bool per_dimension = true;  // one width per input dimension; false: one width shared by all
  // The grid: grid_points widths, log-spaced from grid_low to grid_high times the data's spread
  // (per dimension, each dimension's standard deviation; shared, the root mean square of them).
  index_t grid_points = 30;
  double grid_low = 0.01, grid_high = 10;
  // The refinement on log(width), from each of the `starts` lowest local minima of the grid: BFGS
  // with a backtracking line search for the Gaussian and Epanechnikov kernels, a derivative-free
  // compass search for the boxcar (its gradient is 0). At most max_steps steps per start; 0 keeps
  // the grid's best. Several starts, because with few points a compact kernel's criterion is rough
  // and the best grid point need not lie in the basin of the best width.
  int max_steps = 100;
  int starts = 3;
};

// What select_width found and how.
struct WidthSelection {
  std::vector<double> widths;       // (p,) per dimension, or (1,) shared
  double loo_error = 0;             // CV at widths
  index_t isolated = 0;             // isolated points at widths
  std::vector<double> grid_widths;  // the best grid point, and its CV
  double grid_error = 0;
  index_t evaluations = 0;  // evaluations of the criterion, grid included
  int steps = 0;            // refinement steps taken from the start that won
  bool converged = false;   // the refinement stopped on its tolerance rather than on max_steps
  std::string how;          // one line: the grid, the refinement, the errors before and after
};

// Minimises loo_cv_error over the widths: the log-spaced grid, then the refinement of
// WidthSearchOptions. Widths stay within [grid_low / 10, grid_high * 100] times the spread (a width
// beyond that is "this dimension does not matter"). The constant kernel ignores the width: it is
// evaluated once, at widths equal to the spread. Same arguments and errors as loo_cv_error, plus
// options out of range (grid_points < 2, grid bounds not 0 < grid_low < grid_high, max_steps < 0,
// starts < 1).
template <class T>
WidthSelection select_width(TensorView<const T> x, TensorView<const T> y, Kernel kernel,
                            const WidthSearchOptions& options = {});

// Nadaraya-Watson pooling with per-dimension widths (p,) (or one shared width): the queries' and
// keys' feature c divided by widths[c], then nadaraya_watson_forward with sigma = 1, which computes
// the anisotropic u above. Shapes, rules and errors as nadaraya_watson_forward; widths of a size
// other than p or 1, or not positive and finite, are refused.
template <class T>
void nadaraya_watson_forward(TensorView<T> out, TensorView<T> weights, TensorView<const T> queries,
                             TensorView<const T> keys, TensorView<const T> values, Kernel kernel,
                             std::span<const double> widths);

}  // namespace attn
