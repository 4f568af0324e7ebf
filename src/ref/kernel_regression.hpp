// Reference local polynomial kernel regression (attn/kernel_regression.hpp), the oracle of
// tests/test_kernel_regression.cpp. Written straight from the header's formulas and nothing else:
// every estimate visits all n points (no sorting, no windows, no truncation of the Gaussian's tail),
// builds the dense design and the product-kernel weights, and solves the normal equations Z'WZ b = Z'Wy
// in long double by Gaussian elimination with partial pivoting. Single-threaded, O(n) per point and
// O(n^2) per criterion: for the tens to hundreds of points of the tests.
//
//   x (n, k) row-major, y (n,), a point x0 (k,), bandwidths h (k,)
#pragma once

#include <span>
#include <vector>

#include "attn/kernel_regression.hpp"

namespace attn::ref {

// The data and the estimator, as the reference reads them. levels[c]: the distinct values of an
// unordered column over all n points (the Aitchison-Aitken kernel's c), 0 for other columns.
struct KregData {
  index_t n = 0, k = 0;
  std::vector<double> x, y;
  std::vector<RegressorType> types;
  std::vector<int> levels;
  int degree = 1;
  ContinuousKernel kernel = ContinuousKernel::gaussian;
};

// Copies x (n, k) or (n,) and y (n,); trusts them (the tests pass valid data).
KregData kreg_data(TensorView<const double> x, TensorView<const double> y, const KernelRegOptions& options);

// The estimate at one point. degree_used: the degree of the local fit actually solved (below
// data.degree where the design of that degree is singular); empty: no point had weight, and mean is
// the nearest point's response.
struct KregPoint {
  double mean = 0;
  std::vector<double> slopes;  // (k,), 0 in discrete columns
  int degree_used = 0;
  bool empty = false;
};

// The local fit at x0 over all points but `leave_out` (-1: none).
KregPoint kreg_fit_at(const KregData& data, std::span<const double> h, std::span<const double> x0,
                      index_t leave_out = -1);

// The fit at queries (nq, k) row-major, or at the data points when queries is empty, with the counts
// of reduced and empty points, as KernelRegression::fit reports them.
KernelFit kreg_fit(const KregData& data, std::span<const double> h, std::span<const double> queries = {});

// The smoother's weights at x0: m(x0) = sum_j l_j y_j, l_j = e1' (Z'WZ)^-1 z_j W_j (n,), of the degree
// kreg_fit_at solves; a one at the nearest point where no point has weight.
std::vector<double> kreg_smoother_weights(const KregData& data, std::span<const double> h, std::span<const double> x0,
                                          index_t leave_out = -1);

// CV(h) = 1/n sum_i (y_i - m_{-i}(x_i))^2.
double kreg_cv_ls(const KregData& data, std::span<const double> h);

// AICc(h) = log(sigma^2) + (1 + tr(H)/n) / (1 - (tr(H) + 2)/n), +infinity where tr(H) + 2 >= n;
// sigma^2 = RSS / n, H_ii = e1' A_i^-1 z_i(x_i) W_ii built from the local normal matrix A_i at x_i.
double kreg_aicc(const KregData& data, std::span<const double> h);

// The asymptotic band's standard errors at queries (nq, k) (empty: the data points):
// se^2 = sigma^2 sum_j l_j(x0)^2, sigma^2 = RSS / (n - 2 tr(H) + tr(H'H)).
std::vector<double> kreg_standard_errors(const KregData& data, std::span<const double> h,
                                         std::span<const double> queries = {});

// statsmodels' R^2: Ybar the mean of the fitted values m(x_i),
// R^2 = (sum (y - Ybar)(m - Ybar))^2 / (sum (y - Ybar)^2 sum (m - Ybar)^2).
double kreg_r_squared(const KregData& data, std::span<const double> h);

}  // namespace attn::ref
