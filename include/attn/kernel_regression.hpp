// Kernel regression past Nadaraya-Watson: local polynomial regression of degree 0 to 3 over mixed
// continuous and discrete regressors, with bandwidths by leave-one-out cross-validation, the corrected
// AIC or a plug-in rule, and pointwise confidence bands. The d2l chapter's attention pooling is the
// degree-0 case (attn/nadaraya_watson.hpp); degree 1, local linear regression, removes its bias at the
// boundary of the data.
//
//   x (n, k) regressors, one column a regressor, or (n,) with k = 1      y (n,) the response
//   queries (nq, k) or (nq,) points to predict at                         float64 throughout
//
// The estimate at a point x0 is the intercept of a weighted least-squares polynomial fit,
//   beta(x0) = argmin_b sum_j W_j(x0) (y_j - z_j(x0)' b)^2,   m(x0) = beta_0(x0),
// where z_j(x0) holds the monomials of total degree <= degree in the continuous deviations
// u_jc = (x_jc - x0_c) / h_c (scaled by the bandwidth for conditioning; the slopes are divided back),
// and W_j(x0) = prod_c K_c(x_jc, x0_c; h_c) is a product kernel (Racine and Li):
//   continuous  'c'  gaussian      exp(-u^2 / 2)
//                    epanechnikov  1 - u^2            for |u| <= 1, else 0
//                    boxcar        1                  for |u| <= 1, else 0     (statsmodels' "uniform")
//                    tricube       (1 - |u|^3)^3      for |u| <= 1, else 0
//   unordered   'u'  Aitchison-Aitken  1 - h if x = x0, else h / (c - 1)   (c: the column's distinct
//                                      values in x), 0 <= h <= (c - 1) / c
//   ordered     'o'  Wang-van Ryzin    1 - h if x = x0, else (1 - h) h^|x - x0| / 2,   0 <= h <= 1
// Kernel constants cancel in every estimator here, so the kernels are left unnormalised. Discrete
// regressors enter through their kernel only, as in Racine and Li's estimator and R's np package; the
// polynomial is in the continuous regressors (statsmodels' local linear fit also puts discrete columns
// in its design; the two agree when every regressor is continuous).
//
// The local fit is solved from the normal equations Z'WZ b = Z'Wy by Cholesky where the scaled
// design's columns are far from dependent (every column's variance inflation 1 / (1 - R^2) at most
// 1e4: at most 4 digits lost beyond the conditioning of the problem itself), and otherwise by a
// Householder QR factorisation of sqrt(W) Z, which does not square the condition number. Where the
// local design is singular (too few distinct points inside a compact kernel's window for the degree),
// the fit drops to the highest degree whose design is not (down to 0, the local mean); where no point
// has weight (a compact kernel's window is empty), the fit is the response of the nearest point (in
// bandwidth units) and its slopes are 0. KernelFit counts both.
//
// Marginal effects (slopes): for degree >= 1 the local fit's first-order coefficients, d/dx0_c of the
// local polynomial at x0 (statsmodels' convention for local linear); for degree 0 the derivative of
// the Nadaraya-Watson estimate itself. 0 for discrete regressors.
//
// Speed: the points are sorted along the first continuous regressor; a compact kernel visits only the
// points inside its window there, the Gaussian only those whose weight times |u|^(2 degree) is at
// least 2^-60 / n of the largest weight's (below float64's resolution of the sums; the rest are
// dropped). OpenMP threads over the prediction points; the same result for any thread count.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "attn/tensor.hpp"

namespace attn {

enum class RegressorType { continuous, unordered, ordered };
enum class ContinuousKernel { gaussian, epanechnikov, boxcar, tricube };

// "cco" -> {continuous, continuous, ordered}: statsmodels' var_type letters 'c', 'u', 'o'. attn::Error
// for an empty string or another letter.
std::vector<RegressorType> regressor_types_from_string(std::string_view var_type);
// "gaussian", "epanechnikov", "boxcar" (also "uniform"), "tricube"; attn::Error listing them otherwise.
ContinuousKernel continuous_kernel_from_name(std::string_view name);
const char* continuous_kernel_name(ContinuousKernel kernel);

struct KernelRegOptions {
  std::string var_type = "c";  // one letter per column of x
  int degree = 1;              // 0 (local constant, Nadaraya-Watson) to 3
  ContinuousKernel kernel = ContinuousKernel::gaussian;
};

// A fit at nq points.
struct KernelFit {
  std::vector<double> mean;    // (nq,)
  std::vector<double> slopes;  // (nq, k), row-major; 0 in discrete columns
  index_t reduced = 0;         // points whose fit dropped to a lower degree (singular local design)
  index_t empty = 0;           // points with no weighted neighbour (nearest point's response used)
};

enum class BandwidthMethod { cv_ls, aicc };

struct BandwidthSearchOptions {
  // Starts: the rule of thumb (continuous: 1.06 sd n^(-1/(4+k)), statsmodels' start, times the
  // kernel's canonical bandwidth over the Gaussian's for the compact kernels; discrete: half their
  // largest value), and the rule of thumb times each of these factors for the continuous bandwidths.
  std::vector<double> start_factors = {0.25, 4.0};
  int max_steps = 200;  // quasi-Newton (BFGS) steps per start on log(h) and a logistic transform of
                        // the discrete bandwidths; the boxcar takes a compass search (its gradient is 0)
};

struct BandwidthSelection {
  std::vector<double> bandwidths;  // (k,)
  double objective = 0;            // the criterion at bandwidths
  index_t evaluations = 0;
  bool converged = false;  // the winning start stopped on its tolerance rather than on max_steps
  std::string how;         // one line: the method, the starts, the objective before and after
};

// What confidence_band returns: (nq,) each.
struct ConfidenceBand {
  std::vector<double> mean, low, high, standard_error;
};

enum class BandMethod { asymptotic, bootstrap };

class KernelRegression {
 public:
  // Copies x (n, k) or (n,) and y (n,). attn::Error for: shapes that disagree, fewer than 2 points,
  // var_type of another length than k, a degree outside 0..3, a value that is not finite, a discrete
  // column with a non-integer value or (unordered) fewer than 2 distinct values.
  KernelRegression(TensorView<const double> x, TensorView<const double> y, KernelRegOptions options);

  /// The number of points n.
  index_t size() const { return n_; }
  /// The number of regressors k (columns of x).
  index_t regressors() const { return k_; }
  /// The options the model was made with.
  const KernelRegOptions& options() const { return options_; }

  // The fit at queries (nq, k) or (nq,); an empty view fits at the data points x.
  // attn::Error for bandwidths of a size other than k or outside their range (continuous: positive
  // and finite; discrete: above), or queries of the wrong width.
  KernelFit fit(std::span<const double> bandwidths, TensorView<const double> queries = {}) const;

  // Leave-one-out least-squares cross-validation, what statsmodels' KernelReg calls cv_ls:
  //   CV(h) = 1/n sum_i (y_i - m_{-i}(x_i))^2,  m_{-i} the fit at x_i without point i.
  // The corrected AIC of Hurvich, Simonoff and Tsai (1998):
  //   AICc(h) = log(sigma^2) + (1 + tr(H) / n) / (1 - (tr(H) + 2) / n),  sigma^2 = 1/n sum_i (y_i - m(x_i))^2,
  // H the smoother's hat matrix of this degree (statsmodels uses the local-constant trace for every
  // reg_type); +infinity where tr(H) + 2 >= n. With gradient not null, d/dh of the criterion, exact
  // (0 for the boxcar, piecewise constant). A point whose leave-one-out window is empty is predicted as
  // its nearest other point's response.
  double cv_ls(std::span<const double> bandwidths, std::vector<double>* gradient = nullptr) const;
  double aicc(std::span<const double> bandwidths, std::vector<double>* gradient = nullptr) const;

  // Minimises cv_ls or aicc from several starts (BandwidthSearchOptions).
  BandwidthSelection select_bandwidth(BandwidthMethod method, const BandwidthSearchOptions& search = {}) const;
  // The rule-of-thumb bandwidths the search starts from.
  std::vector<double> rule_of_thumb() const;

  // Pointwise bands at queries (empty: the data points) for the bandwidths:
  //   asymptotic  mean -/+ z se, se^2 = sigma^2 sum_j l_j(x0)^2, the smoother's weights l(x0) and the
  //               residual variance sigma^2 = RSS / (n - 2 tr(H) + tr(H'H)) (homoscedastic errors)
  //   bootstrap   the wild bootstrap: y*_j = m(x_j) + e_j v_j, Rademacher v from `seed` (counter-based,
  //               the same draws for any thread count), `replicates` refits (exact, through the
  //               smoother's linearity); the band is m(x0) plus the quantiles of m*(x0) - E* m*(x0)
  // Both cover the smoothed curve E m(x0), not m(x0) (no bias correction). level in (0, 1).
  ConfidenceBand confidence_band(std::span<const double> bandwidths, TensorView<const double> queries = {},
                                 double level = 0.95, BandMethod method = BandMethod::asymptotic,
                                 std::uint64_t seed = 0, int replicates = 999) const;

  // statsmodels' R^2: corr(y, m(x))^2 around the mean of the fitted values.
  double r_squared(std::span<const double> bandwidths) const;

 private:
  friend struct KernelRegressionAccess;  // the implementation's helpers (src/kreg)
  KernelRegOptions options_;
  std::vector<RegressorType> types_;
  index_t n_ = 0, k_ = 0;
  std::vector<double> x_, y_;    // (n, k), (n,), in the order given
  std::vector<index_t> order_;   // the points sorted along the sort column
  std::vector<double> sorted_;   // that column's values, sorted
  std::vector<double> sorted_y_; // the responses in that order
  std::vector<index_t> rank_;    // (n,) point i's position in that order
  int sort_column_ = -1;         // the first continuous regressor, -1 when none
  std::vector<int> levels_;      // per column: distinct values (unordered), 0 otherwise
  // A power of two near max|y|: residuals are squared in its units, so the criteria, R^2 and the
  // bands hold at any scale of y (squared as given, y of 1e160 overflowed).
  double y_unit_ = 1;
  // y_i - fit in units of y_unit_ (each divided first, so that the difference cannot overflow).
  double residual_in_units(index_t i, double fit) const { return y_[i] / y_unit_ - fit / y_unit_; }
  double cv_ls_in_units(std::span<const double> bandwidths, std::vector<double>* gradient) const;
  double aicc_in_units(std::span<const double> bandwidths, std::vector<double>* gradient) const;
};

// Ruppert, Sheather and Wand's (1995) direct plug-in bandwidth for local linear regression with the
// Gaussian kernel and one continuous regressor, as KernSmooth's dpill computes it (binned, its
// defaults: 401 bins, blocks by Mallows' Cp, 1% of the points trimmed at each end, 5% of the grid for
// the curvature). attn::Error for fewer than 6 points, values that are not finite, or x with zero spread.
double plug_in_bandwidth(std::span<const double> x, std::span<const double> y);

}  // namespace attn
