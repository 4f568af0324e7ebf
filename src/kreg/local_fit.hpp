// The local polynomial fit at one point, the engine of attn/kernel_regression.hpp: the product
// kernel's weights over the points a window admits, the weighted least squares (Cholesky of the
// normal equations where the design is well conditioned, Householder QR where it is not), the degree
// the design supports, and the pieces the criteria's gradients need.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "attn/kernel_regression.hpp"
#include "cpu/simd/kreg_moments.hpp"

namespace attn {

// Read access to a KernelRegression's data for the implementation (src/kreg).
struct KernelRegressionAccess {
  static const std::vector<RegressorType>& types(const KernelRegression& m) { return m.types_; }
  static const std::vector<double>& x(const KernelRegression& m) { return m.x_; }
  static const std::vector<double>& y(const KernelRegression& m) { return m.y_; }
  static const std::vector<index_t>& order(const KernelRegression& m) { return m.order_; }
  static const std::vector<double>& sorted(const KernelRegression& m) { return m.sorted_; }
  static const std::vector<double>& sorted_y(const KernelRegression& m) { return m.sorted_y_; }
  static const std::vector<index_t>& rank(const KernelRegression& m) { return m.rank_; }
  static int sort_column(const KernelRegression& m) { return m.sort_column_; }
  static const std::vector<int>& levels(const KernelRegression& m) { return m.levels_; }
  // cv_ls and aicc with y in units of y_unit_ (what the bandwidth search minimises: cv_ls over
  // y_unit_ squared, aicc less 2 log y_unit_), and that unit.
  static double cv_ls_in_units(const KernelRegression& m, std::span<const double> h, std::vector<double>* gradient) {
    return m.cv_ls_in_units(h, gradient);
  }
  static double aicc_in_units(const KernelRegression& m, std::span<const double> h, std::vector<double>* gradient) {
    return m.aicc_in_units(h, gradient);
  }
  static double y_unit(const KernelRegression& m) { return m.y_unit_; }
};

namespace kreg {

// The monomials of total degree <= degree in the continuous deviations, degree-major: term 0 is the
// constant, terms 1..kc the first-order ones in column order, then the second- and third-order ones.
// A term is the list of its factors (continuous-column positions 0..kc-1, non-decreasing).
struct Design {
  int degree = 0;
  int continuous = 0;                       // kc
  std::vector<std::vector<int>> terms;      // (q,) factor lists
  std::vector<int> terms_up_to;             // (degree + 1,): terms of total degree <= d
  std::vector<int> parent, last_factor;     // (q,) term t = term parent[t] times u[last_factor[t]]
  Design(int degree, int continuous);
  int size() const { return static_cast<int>(terms.size()); }
};

// What one local fit gives.
struct PointFit {
  double mean = 0;
  int degree_used = 0;
  bool empty = false;                // no weighted point: the nearest point's response
  index_t nearest = -1;              // that point, when empty
};

// One thread's fitter: call fit() for a point, then read the pieces it leaves behind.
class LocalFitter {
 public:
  // simd: the calling thread's target (cpu::simd::current()), read before the parallel region, as a
  // ScopedSimdTarget is the calling thread's alone.
  LocalFitter(const KernelRegression& model, std::span<const double> bandwidths, const Design& design,
              cpu::simd::Target simd);

  // The fit at x0 (k,) without point leave_out (-1: all points), and its slopes (k,) when not null.
  // With one continuous regressor the fit comes from the kernel-weighted moments of the window
  // (cpu/simd/kreg_moments.hpp) unless with_rows; otherwise, or where the normal equations are too
  // ill-conditioned, from the window's rows, kept for smoother_weights.
  PointFit fit(const double* x0, index_t leave_out, bool with_gradient, double* slopes, bool with_rows = false);

  // After fit(..., with_gradient): d mean / d h_c (k,).
  void mean_gradient(double* out) const;
  // After fit(..., with_rows): the smoother's weights l_j (mean = sum_j l_j y_j) over the kept rows.
  struct Weight { index_t point; double l; };
  void smoother_weights(std::vector<Weight>& out) const;
  // After fit() at a data point i (leave_out -1): H_ii and (with_gradient) d H_ii / d h_c (k,).
  double hat_diagonal(index_t i, double* gradient) const;

 private:
  void reset();
  // R (R'R = A) and rhs = R^-T b by Cholesky, where A's columns are far enough from dependent (a
  // largest variance inflation of at most kMaxInflation: the normal equations then lose at most 4
  // digits more than QR); false otherwise.
  static constexpr double kMaxInflation = 1e4;
  bool cholesky();
  // R and rhs = Q' sqrt(W) y by Householder QR of the kept rows; returns the degree the design supports.
  int householder();
  // The one-regressor path: A and b from the window's moments; false where it does not apply (no
  // weight, or A too ill-conditioned for Cholesky).
  bool fit_moments(const double* x0, index_t leave_out, bool with_gradient);
  // The u_s^2 past which a Gaussian weight is negligible next to `largest` (visit_window).
  double gaussian_cut(double largest) const;
  // Adds the points the window admits: a compact kernel's along the sort column, or the Gaussian's
  // from the nearest outwards until the rest weigh below float64's resolution.
  void visit_window(const double* x0, index_t leave_out, bool with_gradient);
  // Point j's weight and design row, kept and added to A and b; returns its weight.
  double add_row(index_t j, const double* x0, bool with_gradient);
  index_t nearest_point(const double* x0, index_t leave_out) const;

  const KernelRegression& model_;
  std::span<const double> h_;
  const Design& design_;
  const std::vector<RegressorType>& types_;
  const std::vector<double>& x_;
  const std::vector<double>& y_;
  index_t k_;
  int q_;
  ContinuousKernel kernel_;
  std::vector<double> inverse_h_;  // (k,) 1 / h
  std::vector<int> continuous_columns_;  // (kc,) the columns of x the polynomial is in
  // Kept rows: points, weights, designs (m, q) and weight derivatives (m, k).
  std::vector<index_t> rows_;
  std::vector<double> w_, z_, dw_;
  std::vector<double> gram_, zy_;  // A = Z'WZ (q, q) upper triangle, b = Z'Wy (q,)
  std::vector<double> r_, rhs_;    // R (q, q) upper triangular with R'R = A, R^-T b = Q' sqrt(W) y (q,)
  std::vector<double> qr_;         // the Householder path's work space (m, q + 1)
  std::vector<double> beta_, v_;      // the coefficients and A^-1 e0 over the used terms (q,)
  double sums_w_ = 0;                 // sum_j W_j; and per continuous column sum_j dW_j/dx0 (y_j)
  std::vector<double> sums_dx_, sums_dxy_;
  std::vector<double> work_, kval_, kdh_, kdx_, u_;
  int terms_used_ = 0;
  PointFit last_;
  bool one_regressor_ = false;  // k = 1, continuous: the moments path applies
  bool from_moments_ = false;   // the last fit took it
  cpu::fused::KregMoments moments_;
  cpu::simd::Target simd_;
};

// Per-column kernel value and derivatives at one pair.
struct KernelValue {
  double k = 0;     // K
  double d_h = 0;   // d K / d h (or d lambda)
  double d_x0 = 0;  // d K / d x0 (continuous only)
};
// A continuous kernel at u = (x_j - x0) / h: K(u) and K'(u), and d K / d h = K'(u) (-u / h),
// d K / d x0 = K'(u) (-1 / h).
inline KernelValue continuous_kernel(ContinuousKernel kernel, double u, double inverse_h) {
  double k = 0, dk = 0;
  switch (kernel) {
    case ContinuousKernel::gaussian:
      k = std::exp(-0.5 * u * u);
      dk = -u * k;
      break;
    case ContinuousKernel::epanechnikov:
      if (std::abs(u) <= 1) k = 1 - u * u, dk = -2 * u;
      break;
    case ContinuousKernel::boxcar:
      if (std::abs(u) <= 1) k = 1;
      break;
    case ContinuousKernel::tricube: {
      const double a = std::abs(u);
      if (a <= 1) {
        const double t = 1 - a * a * a;
        k = t * t * t;
        dk = -9 * u * a * t * t;
      }
      break;
    }
  }
  return {k, -dk * u * inverse_h, -dk * inverse_h};
}
KernelValue unordered_kernel(double xj, double x0, double lambda, int levels);
KernelValue ordered_kernel(double xj, double x0, double lambda);

// The largest bandwidth a discrete column may take: (c - 1) / c unordered, 1 ordered.
double discrete_bandwidth_limit(RegressorType type, int levels);
// Checks bandwidths (k,) against the model; attn::Error naming `op`.
void check_bandwidths(const KernelRegression& model, std::span<const double> bandwidths, const char* op);

// The standard normal's quantile function (Acklam's rational approximation, refined by one Halley
// step on erfc: about 1e-15 relative).
double normal_quantile(double p);

}  // namespace kreg
}  // namespace attn
