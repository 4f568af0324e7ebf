// Local polynomial kernel regression (attn/kernel_regression.hpp) against the long double reference
// (src/ref/kernel_regression.cpp), which fits every point over all n points by the normal equations:
// fits at the data and at queries, cv_ls and AICc, the asymptotic band and R^2 for every degree, every
// continuous kernel and mixed regressors; the criteria's gradients against central differences;
// polynomial reproduction; the local constant's slopes against differences of its fit; the bandwidth
// search; the bootstrap band; the singular-design and empty-window rules; one test per argument check.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "attn/config.hpp"
#include "attn/diagnostics.hpp"
#include "attn/kernel_regression.hpp"
#include "ref/kernel_regression.hpp"
#include "support/testing.hpp"

namespace attn {
namespace {

using testing::expect_error;

constexpr ContinuousKernel kKernels[] = {ContinuousKernel::gaussian, ContinuousKernel::epanechnikov,
                                         ContinuousKernel::boxcar, ContinuousKernel::tricube};
// The kernels with a gradient in the bandwidth (the boxcar's is 0).
constexpr ContinuousKernel kSmoothKernels[] = {ContinuousKernel::gaussian, ContinuousKernel::epanechnikov,
                                               ContinuousKernel::tricube};
const std::string kVarTypes[] = {"c", "cc", "cu", "co", "cuo"};

// ---- data ----------------------------------------------------------------------------------------

// Points of the columns var_type names: 'c' uniform in [lo, hi), 'u' one of 0, 1, 2, 'o' one of 0..3.
Tensor<double> draw_x(const std::string& var_type, index_t n, std::mt19937_64& rng, double lo = 0, double hi = 1) {
  const index_t k = static_cast<index_t>(var_type.size());
  Tensor<double> x({n, k});
  std::uniform_real_distribution<double> uniform(lo, hi);
  std::uniform_int_distribution<int> three(0, 2), four(0, 3);
  for (index_t i = 0; i < n; ++i)
    for (index_t c = 0; c < k; ++c)
      x(i, c) = var_type[c] == 'c' ? uniform(rng) : var_type[c] == 'u' ? three(rng) : four(rng);
  return x;
}

// y = sin(2 pi x_c1) + 0.5 cos(3 x_c2) + a level effect per discrete column + normal(0, noise).
struct Sample {
  Tensor<double> x, y;
};

Sample sample(const std::string& var_type, index_t n, std::uint64_t seed, double noise = 0.1) {
  std::mt19937_64 rng(seed);
  Sample s{draw_x(var_type, n, rng), Tensor<double>({n})};
  std::normal_distribution<double> eps(0, noise);
  for (index_t i = 0; i < n; ++i) {
    double f = 0;
    for (std::size_t c = 0, q = 0; c < var_type.size(); ++c) {
      const double v = s.x(i, static_cast<index_t>(c));
      if (var_type[c] != 'c')
        f += var_type[c] == 'u' ? 0.4 * (v == 1) - 0.3 * (v == 2) : 0.2 * v;
      else
        f += q++ == 0 ? std::sin(2 * M_PI * v) : 0.5 * std::cos(3 * v);
    }
    s.y[i] = f + eps(rng);
  }
  return s;
}

// Points to predict at, inside the data's range.
Tensor<double> queries(const std::string& var_type, index_t nq, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  return draw_x(var_type, nq, rng, 0.05, 0.95);
}

KernelRegOptions options(const std::string& var_type, int degree, ContinuousKernel kernel) {
  KernelRegOptions o;
  o.var_type = var_type;
  o.degree = degree;
  o.kernel = kernel;
  return o;
}

// Bandwidths away from the optimum: narrow enough that a compact kernel's window is a part of the
// data, wide enough that every window of the 70 points holds a degree-3 design (some 15 points at a
// corner of "cc").
std::vector<double> bandwidths(const std::string& var_type, ContinuousKernel kernel) {
  const bool two = std::count(var_type.begin(), var_type.end(), 'c') == 2;
  const double continuous = kernel == ContinuousKernel::gaussian ? (two ? 0.2 : 0.12) : (two ? 0.5 : 0.3);
  std::vector<double> h;
  for (const char t : var_type) h.push_back(t == 'c' ? continuous : t == 'u' ? 0.3 : 0.4);
  return h;
}

std::span<const double> values(const Tensor<double>& t) { return {t.data(), static_cast<std::size_t>(t.numel())}; }

// ---- comparisons ---------------------------------------------------------------------------------

// |got - want| <= tol (1 + |want|) everywhere; names the worst element.
void expect_all_near(std::span<const double> got, std::span<const double> want, double tol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(got[i] - want[i]) / (1 + std::fabs(want[i]));
    if (!(e <= worst)) {  // a NaN is the worst: kept
      worst = e, at = i;
      if (std::isnan(e)) break;
    }
  }
  EXPECT_LE(worst, tol) << what << " [" << at << "]: got " << got[at] << ", expected " << want[at];
}

void expect_fit_matches(const KernelFit& got, const KernelFit& want, double tol) {
  expect_all_near(got.mean, want.mean, tol, "mean");
  expect_all_near(got.slopes, want.slopes, 10 * tol, "slopes");  // divided by h: a larger scale
  EXPECT_EQ(got.reduced, want.reduced);
  EXPECT_EQ(got.empty, want.empty);
}

// Relative agreement of two criterion values; an AICc near 0 is compared on the scale 1, an infinite
// one exactly.
void expect_criterion_near(double got, double want, double tol, const char* what) {
  if (std::isinf(want)) {
    EXPECT_EQ(got, want) << what;
    return;
  }
  EXPECT_LE(std::fabs(got - want), tol * std::max(1.0, std::fabs(want)))
      << what << ": got " << got << ", expected " << want;
}

// The criterion `method` names (what select_bandwidth minimises), its gradient when asked.
double criterion(const KernelRegression& kr, BandwidthMethod method, std::span<const double> h,
                 std::vector<double>* gradient = nullptr) {
  return method == BandwidthMethod::cv_ls ? kr.cv_ls(h, gradient) : kr.aicc(h, gradient);
}
const char* method_name(BandwidthMethod method) { return method == BandwidthMethod::cv_ls ? "cv_ls" : "aicc"; }

// The optimized fit (QR in float64, the Gaussian's negligible tail dropped) against the long double
// reference: measured at most 2e-15 in the means and 2e-14 in the slopes, 1e-15 in cv_ls and AICc,
// over every case below (GCC 12, -O2, AVX-512 host); the bounds leave a factor of 500.
constexpr double kFitTolerance = 1e-12;
constexpr double kCriterionTolerance = 1e-12;

// ---- fits and criteria against the reference -----------------------------------------------------

// Every var_type, kernel and degree, at the data points and at queries.
TEST(KernelRegression, FitMatchesTheReference) {
  for (const std::string& var_type : kVarTypes)
    for (const ContinuousKernel kernel : kKernels)
      for (int degree = 0; degree <= 3; ++degree) {
        SCOPED_TRACE(::testing::Message() << var_type << " " << continuous_kernel_name(kernel) << " degree " << degree);
        const Sample s = sample(var_type, 70, 101);
        const KernelRegression kr(s.x, s.y, options(var_type, degree, kernel));
        const ref::KregData data = ref::kreg_data(s.x, s.y, kr.options());
        const std::vector<double> h = bandwidths(var_type, kernel);
        const Tensor<double> q = queries(var_type, 13, 102);
        expect_fit_matches(kr.fit(h), ref::kreg_fit(data, h), kFitTolerance);
        expect_fit_matches(kr.fit(h, q), ref::kreg_fit(data, h, values(q)), kFitTolerance);
      }
}

// ---- statsmodels --------------------------------------------------------------------------------

// What statsmodels 0.13.5 computes for 12 points, printed to 17 digits by
//   kr = KernelReg(y, x, var_type, reg_type, bw=h, defaults=EstimatorSettings(efficient=False))
//   kr.fit(), kr.cv_loo(h, kr.est[reg_type]), kr.aic_hurvich(h, kr.est[reg_type]), kr.r_squared()
// (Gaussian kernel): a check of the oracle itself, and of the library. Its local linear fit puts
// discrete columns in the design (the header keeps them in the kernel only), so the mixed case is the
// local constant; its aic_hurvich uses the local constant's trace, so AICc is checked at degree 0; its
// local constant slopes are another formula (not the derivative of the fit) and are not compared.
struct Statsmodels {
  std::string var_type;
  int degree;
  std::vector<double> h, mean, slopes;
  double cv, aicc, r2;
};

TEST(KernelRegression, AgreesWithStatsmodels) {
  const std::vector<double> x{0.251, 0.947, 0.189, 0.179, 0.35, 0.231, 0.67, 0.115, 0.896, 0.858, 0.003, 0.541};
  const std::vector<double> u{0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2};
  const Tensor<double> y({12}, {0.809, -0.012, 1.437, 1.08, 1.198, 1.688, -0.882, 1.023, 0.058, -0.813, 0.269, 0.334});
  const Statsmodels cases[] = {
      {"c",
       0,
       {0.15},
       {1.1421920437805915, -0.26429261609479, 1.1267053520923471, 1.1210961418778291, 1.0647639311793275,
        1.1411489926003244, -0.2959243311741798, 1.0678308250254396, -0.30402321908860697, -0.33455000853024686,
        0.9136717550366408, 0.243316402014256},
       {},
       0.2786899229956353,
       0.22404647286802848,
       0.7815691899594718},
      {"c",
       1,
       {0.15},
       {1.1387176248340594, -0.07391816203854379, 1.114553158134724, 1.0968789971613737, 0.9056532157934319,
        1.147432631858276, -0.2522429098794209, 0.9098147525604873, -0.24626663551816855, -0.3295107888501523,
        0.3912758260749123, 0.15729410424555917},
       {-0.1227913035098065, 3.0975967763814682, 1.3857392478380215, 1.61150971007554, -2.263045954368355,
        0.3740494007895203, -1.8404441653740413, 2.848717342610829, 2.2737581563234364, 1.6617447186499097,
        4.190712113316902, -3.8176241814746823},
       0.2638833314209496,
       NAN,
       0.8553426844580444},
      {"cu",
       0,
       {0.15, 0.3},
       {1.0180913396663063, -0.1250635322347944, 1.3473784132351416, 1.0267710405469377, 1.0900903464719227,
        1.3419247301898005, -0.6493037723769557, 0.892585607102703, -0.09943839398985069, -0.6407612364771742,
        0.7159310524659593, 0.4072655902177483},
       {},
       0.1675915566789813,
       1.1708443677142721,
       0.9391884379592393},
  };
  for (const Statsmodels& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.var_type << " degree " << c.degree);
    const index_t k = static_cast<index_t>(c.var_type.size());
    Tensor<double> xt({12, k});
    for (index_t i = 0; i < 12; ++i) {
      xt(i, 0) = x[i];
      if (k == 2) xt(i, 1) = u[i];
    }
    const KernelRegression kr(xt, y, options(c.var_type, c.degree, ContinuousKernel::gaussian));
    const ref::KregData data = ref::kreg_data(xt, y, kr.options());
    for (const KernelFit& fit : {kr.fit(c.h), ref::kreg_fit(data, c.h)}) {
      expect_all_near(fit.mean, c.mean, 1e-13, "mean");
      if (!c.slopes.empty()) expect_all_near(fit.slopes, c.slopes, 1e-12, "slopes");
    }
    for (const double cv : {kr.cv_ls(c.h), ref::kreg_cv_ls(data, c.h)}) expect_criterion_near(cv, c.cv, 1e-13, "cv_ls");
    if (c.degree == 0) {
      for (const double a : {kr.aicc(c.h), ref::kreg_aicc(data, c.h)}) expect_criterion_near(a, c.aicc, 1e-13, "aicc");
    }
    for (const double r2 : {kr.r_squared(c.h), ref::kreg_r_squared(data, c.h)})
      expect_criterion_near(r2, c.r2, 1e-13, "r_squared");
  }
}

// x (n,) is x (n, 1); queries (nq,) are (nq, 1).
TEST(KernelRegression, OneDimensionalShapes) {
  const Sample s = sample("c", 40, 111);
  const Tensor<double> x1({40}, std::vector<double>(s.x.data(), s.x.data() + 40));
  const Tensor<double> q = queries("c", 9, 112), q1({9}, std::vector<double>(q.data(), q.data() + 9));
  const KernelRegression a(s.x, s.y, options("c", 1, ContinuousKernel::gaussian));
  const KernelRegression b(x1, s.y, options("c", 1, ContinuousKernel::gaussian));
  const std::vector<double> h{0.1};
  EXPECT_EQ(b.regressors(), 1);
  EXPECT_EQ(a.fit(h, q).mean, b.fit(h, q1).mean);
  EXPECT_EQ(a.fit(h).slopes, b.fit(h).slopes);
  EXPECT_EQ(a.cv_ls(h), b.cv_ls(h));
}

TEST(KernelRegression, CriteriaMatchTheReference) {
  for (const std::string& var_type : kVarTypes)
    for (const ContinuousKernel kernel : kKernels)
      for (int degree = 0; degree <= 3; ++degree) {
        SCOPED_TRACE(::testing::Message() << var_type << " " << continuous_kernel_name(kernel) << " degree " << degree);
        const Sample s = sample(var_type, 70, 121);
        const KernelRegression kr(s.x, s.y, options(var_type, degree, kernel));
        const ref::KregData data = ref::kreg_data(s.x, s.y, kr.options());
        const std::vector<double> h = bandwidths(var_type, kernel);
        expect_criterion_near(kr.cv_ls(h), ref::kreg_cv_ls(data, h), kCriterionTolerance, "cv_ls");
        expect_criterion_near(kr.aicc(h), ref::kreg_aicc(data, h), kCriterionTolerance, "aicc");
      }
}

// tr(H) + 2 >= n: AICc is +infinity (a tiny bandwidth makes H the identity).
TEST(KernelRegression, AiccIsInfiniteWhenTheTraceFillsTheSample) {
  const Sample s = sample("c", 20, 131);
  const KernelRegression kr(s.x, s.y, options("c", 1, ContinuousKernel::gaussian));
  EXPECT_EQ(kr.aicc(std::vector<double>{1e-4}), INFINITY);
  EXPECT_EQ(ref::kreg_aicc(ref::kreg_data(s.x, s.y, kr.options()), std::vector<double>{1e-4}), INFINITY);
}

// The exact gradients against central differences (step 1e-6) of the criterion, continuous and
// discrete bandwidths, every degree. Measured: at most 1.2e-8 apart (AICc, the differences' own
// error); the bandwidths sit between the kinks where a compact kernel's window gains a point.
TEST(KernelRegression, CriterionGradientsMatchFiniteDifferences) {
  for (const std::string& var_type : kVarTypes)
    for (const ContinuousKernel kernel : kSmoothKernels)
      for (int degree = 0; degree <= 3; ++degree)
        for (const BandwidthMethod method : {BandwidthMethod::cv_ls, BandwidthMethod::aicc}) {
          SCOPED_TRACE(::testing::Message() << var_type << " " << continuous_kernel_name(kernel) << " degree " << degree
                                            << " " << method_name(method));
          const Sample s = sample(var_type, 50, 141);
          const KernelRegression kr(s.x, s.y, options(var_type, degree, kernel));
          std::vector<double> h = bandwidths(var_type, kernel), gradient;
          EXPECT_EQ(criterion(kr, method, h, &gradient), criterion(kr, method, h));
          const std::vector<double> numeric =
              testing::numeric_gradient([&] { return criterion(kr, method, h); }, h, 1e-6);
          std::string where;
          EXPECT_LT(testing::gradient_error(gradient, numeric, &where), 1e-6) << where;
          for (const double g : gradient) EXPECT_NE(g, 0.0);
        }
}

// The boxcar's criteria are piecewise constant in its bandwidth: gradient 0 there; a discrete
// bandwidth beside it has its exact gradient.
TEST(KernelRegression, BoxcarGradientIsZero) {
  const Sample s = sample("cu", 50, 151);
  const KernelRegression kr(s.x, s.y, options("cu", 1, ContinuousKernel::boxcar));
  for (const BandwidthMethod method : {BandwidthMethod::cv_ls, BandwidthMethod::aicc}) {
    SCOPED_TRACE(method_name(method));
    std::vector<double> h = bandwidths("cu", ContinuousKernel::boxcar), gradient;
    criterion(kr, method, h, &gradient);
    ASSERT_EQ(gradient.size(), 2u);
    EXPECT_EQ(gradient[0], 0.0);
    const std::vector<double> numeric =
        testing::numeric_gradient([&] { return criterion(kr, method, h); }, std::span<double>(h).subspan(1), 1e-6);
    EXPECT_NEAR(gradient[1], numeric[0], 1e-6 * (1 + std::fabs(numeric[0])));
  }
}

// ---- exactness -----------------------------------------------------------------------------------

// A polynomial of total degree `degree` in the first two continuous columns (a fixed set of
// coefficients), its value and gradient.
struct Polynomial {
  int degree;
  double value(double a, double b) const { return eval(a, b, nullptr); }
  double eval(double a, double b, double* grad) const {
    static constexpr struct {
      int i, j;
      double coef;
    } kTerms[] = {{0, 0, 0.7}, {1, 0, -1.3}, {0, 1, 0.8}, {2, 0, 2.1}, {1, 1, -0.6},
                  {0, 2, 0.9}, {3, 0, -0.9}, {2, 1, 0.5}, {1, 2, 0.4}, {0, 3, -0.7}};
    double v = 0;
    if (grad) grad[0] = grad[1] = 0;
    for (const auto& t : kTerms) {
      if (t.i + t.j > degree) continue;
      v += t.coef * std::pow(a, t.i) * std::pow(b, t.j);
      if (grad && t.i > 0) grad[0] += t.coef * t.i * std::pow(a, t.i - 1) * std::pow(b, t.j);
      if (grad && t.j > 0) grad[1] += t.coef * t.j * std::pow(a, t.i) * std::pow(b, t.j - 1);
    }
    return v;
  }
};

// A fit of degree p reproduces a polynomial of degree q <= p in the continuous regressors exactly,
// its slopes too, whatever the kernel and the discrete columns.
TEST(KernelRegression, ReproducesPolynomialsUpToItsDegree) {
  for (const std::string var_type : {"c", "cc", "cu"})
    for (const ContinuousKernel kernel : kKernels)
      for (int degree = 0; degree <= 3; ++degree)
        for (int q = 0; q <= degree; ++q) {
          SCOPED_TRACE(::testing::Message() << var_type << " " << continuous_kernel_name(kernel) << " degree " << degree
                                            << " polynomial of degree " << q);
          const Polynomial poly{q};
          Sample s = sample(var_type, 60, 161);
          const bool two = var_type == "cc";
          for (index_t i = 0; i < 60; ++i) s.y[i] = poly.value(s.x(i, 0), two ? s.x(i, 1) : 0.0);
          const KernelRegression kr(s.x, s.y, options(var_type, degree, kernel));
          const Tensor<double> xq = queries(var_type, 11, 162);
          const KernelFit fit = kr.fit(bandwidths(var_type, kernel), xq);
          const index_t k = kr.regressors();
          EXPECT_EQ(fit.reduced, 0);
          for (index_t i = 0; i < 11; ++i) {
            double grad[2];
            const double want = poly.eval(xq(i, 0), two ? xq(i, 1) : 0.0, grad);
            EXPECT_NEAR(fit.mean[i], want, 1e-12) << "query " << i;
            // Degree 0 reproduces a constant, whose slopes are 0.
            EXPECT_NEAR(fit.slopes[i * k], grad[0], 1e-11) << "query " << i;
            if (k == 2) {
              EXPECT_NEAR(fit.slopes[i * k + 1], two ? grad[1] : 0.0, 1e-11) << "query " << i;
            }
          }
        }
}

// Degree 0: the slopes are the derivative of the Nadaraya-Watson estimate in the query point.
TEST(KernelRegression, LocalConstantSlopesAreTheFitsDerivative) {
  for (const std::string var_type : {"c", "cc", "cu"})
    for (const ContinuousKernel kernel : kSmoothKernels) {
      SCOPED_TRACE(::testing::Message() << var_type << " " << continuous_kernel_name(kernel));
      const Sample s = sample(var_type, 60, 171);
      const KernelRegression kr(s.x, s.y, options(var_type, 0, kernel));
      const std::vector<double> h = bandwidths(var_type, kernel);
      Tensor<double> xq = queries(var_type, 9, 172);
      const KernelFit fit = kr.fit(h, xq);
      const index_t k = kr.regressors();
      for (index_t i = 0; i < 9; ++i)
        for (index_t c = 0; c < k; ++c) {
          if (var_type[c] != 'c') continue;
          std::vector<double> point(xq.data() + i * k, xq.data() + (i + 1) * k);
          const std::vector<double> numeric = testing::numeric_gradient(
              [&] {
                return kr.fit(h, Tensor<double>({1, k}, point)).mean[0];
              },
              std::span<double>(point).subspan(static_cast<std::size_t>(c), 1), 1e-6);
          EXPECT_NEAR(fit.slopes[i * k + c], numeric[0], 1e-6 * (1 + std::fabs(numeric[0])))
              << "query " << i << " column " << c;
        }
    }
}

// ---- bandwidth search ----------------------------------------------------------------------------

// Whether h is a point the compass cannot improve on: each bandwidth 2% up and down (a discrete one
// by 0.02 inside its range) gives no lower criterion. The slack of 1e-8 is for a discrete bandwidth
// whose optimum is its bound: the logistic transform stops a hair inside it (4e-10 from 0 seen).
void expect_compass_stable(const KernelRegression& kr, BandwidthMethod method, const BandwidthSelection& sel) {
  for (std::size_t c = 0; c < sel.bandwidths.size(); ++c)
    for (const int sign : {-1, 1}) {
      std::vector<double> h = sel.bandwidths;
      if (kr.options().var_type[c] == 'c')
        h[c] *= 1 + 0.02 * sign;
      else
        h[c] = std::clamp(h[c] + 0.02 * sign, 0.0, kr.options().var_type[c] == 'u' ? 2.0 / 3 : 1.0);
      EXPECT_GE(criterion(kr, method, h), sel.objective - 1e-8 * std::fabs(sel.objective))
          << "bandwidth " << c << (sign > 0 ? " up" : " down") << ": " << sel.how;
    }
}

// The search's result against the rule of thumb and a grid around it (continuous bandwidths times
// 0.5, 0.7, 1, 1.4, 2; discrete ones at 0.1, 0.3, 0.5 of their range's top); the Gaussian's and the
// Epanechnikov's is a local minimum.
void check_selection(const std::string& var_type, int degree, ContinuousKernel kernel, BandwidthMethod method) {
  SCOPED_TRACE(::testing::Message() << var_type << " " << continuous_kernel_name(kernel) << " degree " << degree << " "
                                    << method_name(method));
  const Sample s = sample(var_type, 100, 181, 0.3);
  const KernelRegression kr(s.x, s.y, options(var_type, degree, kernel));
  const BandwidthSelection sel = kr.select_bandwidth(method);
  ASSERT_EQ(sel.bandwidths.size(), var_type.size());
  EXPECT_GT(sel.evaluations, 0);
  EXPECT_TRUE(sel.converged) << sel.how;
  EXPECT_NE(sel.how.find(method_name(method)), std::string::npos) << sel.how;
  EXPECT_NE(sel.how.find(kernel == ContinuousKernel::boxcar ? "compass" : "BFGS"), std::string::npos) << sel.how;
  EXPECT_NEAR(sel.objective, criterion(kr, method, sel.bandwidths), 1e-12 * std::fabs(sel.objective)) << sel.how;
  const std::vector<double> rot = kr.rule_of_thumb();
  EXPECT_LE(sel.objective, criterion(kr, method, rot)) << sel.how;
  std::vector<double> h = rot;
  // One grid value per column, odometer style.
  const std::vector<double> factors{0.5, 0.7, 1.0, 1.4, 2.0}, fractions{0.1, 0.3, 0.5};
  std::vector<std::size_t> at(var_type.size(), 0);
  for (bool more = true; more;) {
    for (std::size_t c = 0; c < var_type.size(); ++c)
      h[c] = var_type[c] == 'c' ? rot[c] * factors[at[c]] : fractions[at[c]] * (var_type[c] == 'u' ? 2.0 / 3 : 1.0);
    EXPECT_LE(sel.objective, criterion(kr, method, h)) << sel.how;
    more = false;
    for (std::size_t c = 0; c < var_type.size() && !more; ++c) {
      const std::size_t size = var_type[c] == 'c' ? factors.size() : fractions.size();
      if (++at[c] < size)
        more = true;
      else
        at[c] = 0;
    }
  }
  if (kernel != ContinuousKernel::boxcar) expect_compass_stable(kr, method, sel);
}

TEST(SelectBandwidth, CvLsGaussianLocalLinear) {
  check_selection("c", 1, ContinuousKernel::gaussian, BandwidthMethod::cv_ls);
}
TEST(SelectBandwidth, AiccGaussianLocalQuadratic) {
  check_selection("c", 2, ContinuousKernel::gaussian, BandwidthMethod::aicc);
}
TEST(SelectBandwidth, CvLsEpanechnikov) {
  check_selection("c", 1, ContinuousKernel::epanechnikov, BandwidthMethod::cv_ls);
}
TEST(SelectBandwidth, CvLsBoxcarByCompass) {
  check_selection("c", 1, ContinuousKernel::boxcar, BandwidthMethod::cv_ls);
}
TEST(SelectBandwidth, CvLsWithAnUnorderedRegressor) {
  check_selection("cu", 0, ContinuousKernel::gaussian, BandwidthMethod::cv_ls);
}
TEST(SelectBandwidth, AiccWithAnOrderedRegressor) {
  check_selection("co", 1, ContinuousKernel::gaussian, BandwidthMethod::aicc);
}

// Continuous: 1.06 sd n^(-1/(4+k)) (sd with either normalisation: within 1%); discrete: half the
// range of their bandwidth.
TEST(SelectBandwidth, RuleOfThumb) {
  const Sample s = sample("cuo", 100, 191);
  const KernelRegression kr(s.x, s.y, options("cuo", 1, ContinuousKernel::gaussian));
  double mean = 0, ss = 0;
  for (index_t i = 0; i < 100; ++i) mean += s.x(i, 0) / 100;
  for (index_t i = 0; i < 100; ++i) ss += (s.x(i, 0) - mean) * (s.x(i, 0) - mean);
  const std::vector<double> rot = kr.rule_of_thumb();
  ASSERT_EQ(rot.size(), 3u);
  EXPECT_NEAR(rot[0], 1.06 * std::sqrt(ss / 99) * std::pow(100.0, -1.0 / 7), 0.01 * rot[0]);
  EXPECT_NEAR(rot[1], 1.0 / 3, 1e-12);  // unordered with 3 levels: range [0, 2/3]
  EXPECT_NEAR(rot[2], 0.5, 1e-12);
}

// ---- bands and R^2 -------------------------------------------------------------------------------

// mean -/+ z se with se from the reference's smoother weights and residual variance.
TEST(ConfidenceBand, AsymptoticMatchesTheReference) {
  for (const std::string var_type : {"c", "cu"})
    for (const ContinuousKernel kernel : kSmoothKernels)
      for (int degree = 0; degree <= 3; ++degree) {
        SCOPED_TRACE(::testing::Message() << var_type << " " << continuous_kernel_name(kernel) << " degree " << degree);
        const Sample s = sample(var_type, 60, 201);
        const KernelRegression kr(s.x, s.y, options(var_type, degree, kernel));
        const ref::KregData data = ref::kreg_data(s.x, s.y, kr.options());
        const std::vector<double> h = bandwidths(var_type, kernel);
        const Tensor<double> q = queries(var_type, 11, 202);
        for (const auto& [level, z] : {std::pair{0.95, 1.959963984540054}, std::pair{0.8, 1.2815515655446004}}) {
          const ConfidenceBand band = kr.confidence_band(h, q, level);
          const std::vector<double> mean = ref::kreg_fit(data, h, values(q)).mean;
          const std::vector<double> se = ref::kreg_standard_errors(data, h, values(q));
          std::vector<double> low, high;
          for (std::size_t i = 0; i < se.size(); ++i)
            low.push_back(mean[i] - z * se[i]), high.push_back(mean[i] + z * se[i]);
          expect_all_near(band.mean, mean, kFitTolerance, "mean");
          expect_all_near(band.standard_error, se, kFitTolerance, "standard_error");
          expect_all_near(band.low, low, kFitTolerance, "low");
          expect_all_near(band.high, high, kFitTolerance, "high");
        }
        const ConfidenceBand at_data = kr.confidence_band(h);
        expect_all_near(at_data.standard_error, ref::kreg_standard_errors(data, h), kFitTolerance,
                        "standard_error at the data");
      }
}

// The wild bootstrap: one fixed draw whatever the thread count; another seed, another draw. Its
// replicates' deviations m*(x0) - E* m*(x0) = sum_j l_j e_j v_j have sd s = sqrt(sum_j l_j^2 e_j^2),
// from the reference's smoother weights, and the band is the fit m(x0) plus their quantiles. 499
// replicates put the 5% and 95% quantiles within about 0.1 s of -/+ 1.645 s (a sum of 200 terms is
// near normal): the band's midpoint within 0.35 s of m(x0), its width and standard error within 15%.
// On this smooth sample its width is about the asymptotic band's.
TEST(ConfidenceBand, BootstrapIsReproducibleAndCentredOnTheFit) {
  const Sample s = sample("c", 200, 211, 0.2);
  const KernelRegression kr(s.x, s.y, options("c", 1, ContinuousKernel::gaussian));
  const std::vector<double> h{0.06};
  const Tensor<double> q = queries("c", 25, 212);
  const auto boot = [&](std::uint64_t seed) { return kr.confidence_band(h, q, 0.9, BandMethod::bootstrap, seed, 499); };
  set_num_threads(1);
  const ConfidenceBand one = boot(7);
  set_num_threads(2);
  const ConfidenceBand two = boot(7);
  set_num_threads(0);
  EXPECT_EQ(one.mean, two.mean);
  EXPECT_EQ(one.low, two.low);
  EXPECT_EQ(one.high, two.high);
  EXPECT_EQ(one.standard_error, two.standard_error);
  EXPECT_NE(boot(8).low, one.low);

  const ref::KregData data = ref::kreg_data(s.x, s.y, kr.options());
  const std::vector<double> fitted = ref::kreg_fit(data, h).mean;
  const ConfidenceBand asymptotic = kr.confidence_band(h, q, 0.9);
  expect_all_near(one.mean, asymptotic.mean, 1e-12, "mean");
  std::vector<double> ratio;
  for (index_t i = 0; i < 25; ++i) {
    const std::vector<double> l = ref::kreg_smoother_weights(data, h, std::span<const double>(q.data() + i, 1));
    const double c = asymptotic.mean[i];
    double s2 = 0;
    for (index_t j = 0; j < 200; ++j) s2 += l[j] * l[j] * (s.y[j] - fitted[j]) * (s.y[j] - fitted[j]);
    const double sd = std::sqrt(s2);
    EXPECT_LE(one.low[i], c) << "query " << i;
    EXPECT_LE(c, one.high[i]) << "query " << i;
    EXPECT_NEAR((one.low[i] + one.high[i]) / 2, c, 0.35 * sd) << "query " << i;
    EXPECT_NEAR(one.high[i] - one.low[i], 2 * 1.6448536269514722 * sd, 0.15 * 3.29 * sd) << "query " << i;
    EXPECT_NEAR(one.standard_error[i], sd, 0.15 * sd) << "query " << i;
    ratio.push_back((one.high[i] - one.low[i]) / (asymptotic.high[i] - asymptotic.low[i]));
  }
  std::sort(ratio.begin(), ratio.end());
  EXPECT_GT(ratio[12], 0.6);  // the median width ratio
  EXPECT_LT(ratio[12], 1.5);
}

// The one-regressor path runs the calling thread's SIMD target on every worker thread, as a
// ScopedSimdTarget is the calling thread's alone.
TEST(KernelRegression, RunsTheCallersSimdTargetOnEveryThread) {
  const Sample s = sample("c", 200, 231);
  const KernelRegression kr(s.x, s.y, options("c", 1, ContinuousKernel::gaussian));
  set_num_threads(2);
  for (const std::string& target : simd_targets()) {
    const ScopedSimdTarget scoped(target);
    simd_targets_ran(true);
    kr.cv_ls(std::vector<double>{0.1});
    EXPECT_EQ(simd_targets_ran(true), std::vector<std::string>{target});
  }
  set_num_threads(0);
}

TEST(KernelRegression, RSquaredMatchesTheReference) {
  for (const std::string var_type : {"c", "cc", "cuo"})
    for (const ContinuousKernel kernel : {ContinuousKernel::gaussian, ContinuousKernel::epanechnikov})
      for (int degree = 0; degree <= 3; ++degree) {
        SCOPED_TRACE(::testing::Message() << var_type << " " << continuous_kernel_name(kernel) << " degree " << degree);
        const Sample s = sample(var_type, 60, 221);
        const KernelRegression kr(s.x, s.y, options(var_type, degree, kernel));
        const std::vector<double> h = bandwidths(var_type, kernel);
        const double want = ref::kreg_r_squared(ref::kreg_data(s.x, s.y, kr.options()), h);
        EXPECT_NEAR(kr.r_squared(h), want, kCriterionTolerance);
        EXPECT_GT(want, 0.5);
      }
}

// Fits, criteria and gradients at 1 and 2 threads: bit-identical.
TEST(KernelRegression, SameResultAtOneAndTwoThreads) {
  const Sample s = sample("cu", 150, 231);
  const KernelRegression kr(s.x, s.y, options("cu", 2, ContinuousKernel::epanechnikov));
  const std::vector<double> h = bandwidths("cu", ContinuousKernel::epanechnikov);
  std::vector<double> g[2], a[2];
  KernelFit fit[2];
  double cv[2], aicc[2];
  for (int t = 0; t < 2; ++t) {
    set_num_threads(t + 1);
    fit[t] = kr.fit(h);
    cv[t] = kr.cv_ls(h, &g[t]);
    aicc[t] = kr.aicc(h, &a[t]);
  }
  set_num_threads(0);
  EXPECT_EQ(fit[0].mean, fit[1].mean);
  EXPECT_EQ(fit[0].slopes, fit[1].slopes);
  EXPECT_EQ(cv[0], cv[1]);
  EXPECT_EQ(g[0], g[1]);
  EXPECT_EQ(aicc[0], aicc[1]);
  EXPECT_EQ(a[0], a[1]);
}

// ---- degenerate windows --------------------------------------------------------------------------

// x on a grid of step 0.1 and an Epanechnikov window of half-width 0.15: 3 points inside (2 at the
// ends, 2 between grid points), too few for a cubic. Every fit drops to the quadratic or the line,
// finite, as the reference does; so do the leave-one-out fits of cv_ls.
TEST(KernelRegression, SingularDesignDropsToALowerDegree) {
  Tensor<double> x({30}), y({30}), xq({10});
  for (index_t i = 0; i < 30; ++i) x[i] = 0.1 * static_cast<double>(i), y[i] = std::sin(3 * x[i]);
  for (index_t i = 0; i < 10; ++i) xq[i] = 0.03 + 0.3 * static_cast<double>(i);
  const KernelRegression kr(x, y, options("c", 3, ContinuousKernel::epanechnikov));
  const ref::KregData data = ref::kreg_data(x, y, kr.options());
  const std::vector<double> h{0.15};
  for (const bool at_queries : {false, true}) {
    SCOPED_TRACE(at_queries ? "queries" : "data");
    const KernelFit fit = at_queries ? kr.fit(h, xq) : kr.fit(h);
    EXPECT_EQ(fit.reduced, at_queries ? 10 : 30);
    EXPECT_EQ(fit.empty, 0);
    for (const double m : fit.mean) EXPECT_TRUE(std::isfinite(m));
    for (const double d : fit.slopes) EXPECT_TRUE(std::isfinite(d));
    expect_fit_matches(fit, at_queries ? ref::kreg_fit(data, h, values(xq)) : ref::kreg_fit(data, h), kFitTolerance);
  }
  std::vector<double> gradient;
  const double cv = kr.cv_ls(h, &gradient);
  EXPECT_TRUE(std::isfinite(cv));
  EXPECT_TRUE(std::isfinite(gradient[0]));
  expect_criterion_near(cv, ref::kreg_cv_ls(data, h), kCriterionTolerance, "cv_ls");
  expect_criterion_near(kr.aicc(h), ref::kreg_aicc(data, h), kCriterionTolerance, "aicc");
}

// A boxcar window of half-width 0.05 around a query far outside the data holds no point: the fit is
// the nearest point's response, slopes 0, counted in `empty`.
TEST(KernelRegression, EmptyWindowTakesTheNearestPoint) {
  const Sample s = sample("c", 40, 241);
  const Tensor<double> xq({3}, {5.0, -3.0, 0.5});
  const index_t top = std::max_element(s.x.data(), s.x.data() + 40) - s.x.data();
  const index_t bottom = std::min_element(s.x.data(), s.x.data() + 40) - s.x.data();
  for (int degree = 0; degree <= 3; ++degree) {
    SCOPED_TRACE(::testing::Message() << "degree " << degree);
    const KernelRegression kr(s.x, s.y, options("c", degree, ContinuousKernel::boxcar));
    const KernelFit fit = kr.fit(std::vector<double>{0.05}, xq);
    EXPECT_EQ(fit.empty, 2);
    EXPECT_EQ(fit.mean[0], s.y[top]);
    EXPECT_EQ(fit.mean[1], s.y[bottom]);
    EXPECT_EQ(fit.slopes[0], 0.0);
    EXPECT_EQ(fit.slopes[1], 0.0);
    expect_fit_matches(fit,
                       ref::kreg_fit(ref::kreg_data(s.x, s.y, kr.options()), std::vector<double>{0.05}, values(xq)),
                       kFitTolerance);
  }
}

// Queries whose distances in bandwidth units overflow float64 (±1e200 from the data, or a
// bandwidth of 1e-300) weigh no point with any kernel: each fit is still the nearest point's
// response, told apart along the regressor exactly (the distances all round to the same number), and
// with two regressors in long double. (In float64 every distance was inf and no point was chosen: the
// fit read a value before the responses.)
TEST(KernelRegression, QueriesWhoseDistancesOverflowTakeTheNearestPoint) {
  const Sample s = sample("c", 40, 241);
  const index_t top = std::max_element(s.x.data(), s.x.data() + 40) - s.x.data();
  const index_t bottom = std::min_element(s.x.data(), s.x.data() + 40) - s.x.data();
  for (const ContinuousKernel kernel : {ContinuousKernel::gaussian, ContinuousKernel::epanechnikov})
    for (int degree = 0; degree <= 1; ++degree) {
      SCOPED_TRACE(::testing::Message() << "degree " << degree);
      const KernelRegression kr(s.x, s.y, options("c", degree, kernel));
      const KernelFit far = kr.fit(std::vector<double>{0.5}, Tensor<double>({2}, {1e200, -1e200}));
      EXPECT_EQ(far.empty, 2);
      EXPECT_EQ(far.mean[0], s.y[top]);
      EXPECT_EQ(far.mean[1], s.y[bottom]);
      // Distances that overflow to inf on both sides of the window's start (the Gaussian's walk
      // outwards once read before the first point).
      const KernelFit farthest = kr.fit(std::vector<double>{0.5}, Tensor<double>({2}, {1e308, -1e308}));
      EXPECT_EQ(farthest.empty, 2);
      EXPECT_EQ(farthest.mean[0], s.y[top]);
      EXPECT_EQ(farthest.mean[1], s.y[bottom]);
      const Tensor<double> at({1}, {s.x[top] - 1e-9});
      const KernelFit tiny = kr.fit(std::vector<double>{1e-300}, at);
      EXPECT_EQ(tiny.mean[0], s.y[top]);
    }
  // A data point that far from the rest, fit at the data.
  Tensor<double> x = s.x;
  x[bottom] = -1e308;
  const KernelRegression outlier(x, s.y, options("c", 1, ContinuousKernel::gaussian));
  const KernelFit at_data = outlier.fit(std::vector<double>{0.5}, x);
  EXPECT_EQ(at_data.mean[bottom], s.y[bottom]);
  for (index_t i = 0; i < 40; ++i) EXPECT_TRUE(std::isfinite(at_data.mean[i])) << i;
  const Sample two = sample("cc", 30, 242);
  const KernelRegression kr(two.x, two.y, options("cc", 0, ContinuousKernel::gaussian));
  const KernelFit fit = kr.fit(std::vector<double>{1e-300, 1e-300}, Tensor<double>({1, 2}, {two.x[2 * 7], two.x[2 * 7 + 1] + 1e-12}));
  EXPECT_EQ(fit.mean[0], two.y[7]);
}

// The search starts from the rule of thumb, 1.06 times the regressor's standard deviation computed
// at any scale: x in other units (about 1e-200 and 1e200, scaled exactly by powers of two) gives the
// same bandwidth in those units. (Squared as they were, x past 1e154 started the search at an
// infinite bandwidth, which fit() then refused, and x below 1e-162 at 1.06.)
TEST(KernelRegression, BandwidthsFollowTheDataAtAnyScale) {
  const Sample s = sample("c", 30, 243);
  const KernelRegression unit(s.x, s.y, options("c", 1, ContinuousKernel::gaussian));
  const BandwidthSelection want = unit.select_bandwidth(BandwidthMethod::cv_ls);
  for (const double scale : {0x1p-664, 0x1p664}) {
    Tensor<double> x = s.x;
    for (index_t i = 0; i < x.numel(); ++i) x[i] *= scale;
    const KernelRegression kr(x, s.y, options("c", 1, ContinuousKernel::gaussian));
    EXPECT_NEAR(kr.rule_of_thumb()[0] / scale, unit.rule_of_thumb()[0], 1e-12 * unit.rule_of_thumb()[0]);
    const BandwidthSelection got = kr.select_bandwidth(BandwidthMethod::cv_ls);
    EXPECT_NEAR(got.bandwidths[0] / scale, want.bandwidths[0], 1e-9 * want.bandwidths[0]) << got.how;
    EXPECT_NEAR(got.objective, want.objective, 1e-9 * want.objective);
  }
}

// Responses at any scale: y times 2^600 (exact) gives the same bandwidths bit for bit, the criteria
// times 2^1200 (cv_ls; aicc plus its log), the same R^2 and the bands times 2^600; y times 1e160, whose
// squared residuals pass float64's range, the same bandwidth and R^2 within rounding and finite bands.
// (Squared as given, y of 1e150 moved the cv_ls bandwidth and gave R^2 NaN; y of 1e160 gave cv_ls inf
// everywhere and a band of -inf to inf.)
TEST(KernelRegression, ResponsesAtAnyScale) {
  const Sample s = sample("c", 30, 244);
  const KernelRegression unit(s.x, s.y, options("c", 1, ContinuousKernel::gaussian));
  const BandwidthSelection want = unit.select_bandwidth(BandwidthMethod::cv_ls);
  const BandwidthSelection want_aicc = unit.select_bandwidth(BandwidthMethod::aicc);
  const ConfidenceBand band = unit.confidence_band(want.bandwidths);
  const ConfidenceBand wild = unit.confidence_band(want.bandwidths, {}, 0.9, BandMethod::bootstrap, 3, 99);
  for (const double scale : {0x1p600, 1e160}) {
    SCOPED_TRACE(::testing::Message() << "y times " << scale);
    const bool exact = scale == 0x1p600;
    Tensor<double> y = s.y;
    for (double& v : y.values()) v *= scale;
    const KernelRegression kr(s.x, y, options("c", 1, ContinuousKernel::gaussian));
    const BandwidthSelection got = kr.select_bandwidth(BandwidthMethod::cv_ls);
    const BandwidthSelection got_aicc = kr.select_bandwidth(BandwidthMethod::aicc);
    const double r2 = kr.r_squared(got.bandwidths);
    const ConfidenceBand b = kr.confidence_band(got.bandwidths);
    const ConfidenceBand w = kr.confidence_band(got.bandwidths, {}, 0.9, BandMethod::bootstrap, 3, 99);
    if (exact) {
      EXPECT_EQ(got.bandwidths, want.bandwidths);
      EXPECT_EQ(got.objective, want.objective * 0x1p1200);
      EXPECT_EQ(got_aicc.bandwidths, want_aicc.bandwidths);
      EXPECT_NEAR(got_aicc.objective, want_aicc.objective + 2 * std::log(scale), 1e-12 * std::log(scale));
      EXPECT_EQ(r2, unit.r_squared(want.bandwidths));
      for (index_t i = 0; i < 30; ++i) {
        EXPECT_EQ(b.low[i], band.low[i] * scale) << i;
        EXPECT_EQ(b.high[i], band.high[i] * scale) << i;
        EXPECT_EQ(w.low[i], wild.low[i] * scale) << i;
      }
      continue;
    }
    EXPECT_NEAR(got.bandwidths[0], want.bandwidths[0], 1e-6 * want.bandwidths[0]) << got.how;
    EXPECT_NEAR(got_aicc.bandwidths[0], want_aicc.bandwidths[0], 1e-6 * want_aicc.bandwidths[0]) << got_aicc.how;
    EXPECT_NEAR(r2, unit.r_squared(want.bandwidths), 1e-9);
    for (index_t i = 0; i < 30; ++i) {
      ASSERT_TRUE(std::isfinite(b.low[i]) && std::isfinite(b.high[i]) && std::isfinite(w.low[i])) << i;
      EXPECT_NEAR(b.high[i] / scale, band.high[i], 1e-6 * std::abs(band.high[i]) + 1e-9) << i;
    }
  }
}

// Responses near 2^520 whose residuals are small: the criterion (about 1e293) is finite and that of
// the residuals alone (the fit reproduces a constant), where the square of the unit overflowed.
TEST(KernelRegression, LargeResponsesWithSmallResidualsKeepAFiniteCriterion) {
  const Sample s = sample("c", 30, 245);
  Tensor<double> big = s.y, small = s.y;
  for (index_t i = 0; i < 30; ++i) small[i] = s.y[i] * 0x1p520 * 1e-10, big[i] = 0x1p520 + small[i];
  const KernelRegression a(s.x, big, options("c", 1, ContinuousKernel::gaussian)),
      b(s.x, small, options("c", 1, ContinuousKernel::gaussian));
  const std::vector<double> h{0.2};
  const double got = a.cv_ls(h), want = b.cv_ls(h);
  ASSERT_TRUE(std::isfinite(got)) << got;
  EXPECT_NEAR(got, want, 1e-3 * want);
}

// A point 2 away from the rest: its leave-one-out window is empty and cv_ls predicts it by its
// nearest other point's response, as the reference does.
TEST(KernelRegression, CvLsPredictsAnIsolatedPointByItsNearestNeighbour) {
  Sample s = sample("c", 30, 251);
  s.x(29, 0) = 3.0;
  for (int degree = 0; degree <= 1; ++degree) {
    SCOPED_TRACE(::testing::Message() << "degree " << degree);
    const KernelRegression kr(s.x, s.y, options("c", degree, ContinuousKernel::boxcar));
    const std::vector<double> h{0.15};
    expect_criterion_near(kr.cv_ls(h), ref::kreg_cv_ls(ref::kreg_data(s.x, s.y, kr.options()), h), kCriterionTolerance,
                          "cv_ls");
  }
}

// ---- argument checks -----------------------------------------------------------------------------

TEST(KernelRegressionErrors, NamesAndLetters) {
  EXPECT_EQ(regressor_types_from_string("cuo"),
            (std::vector<RegressorType>{RegressorType::continuous, RegressorType::unordered, RegressorType::ordered}));
  expect_error([] { regressor_types_from_string(""); }, {"var_type"});
  expect_error([] { regressor_types_from_string("cx"); }, {"var_type", "x"});
  EXPECT_EQ(continuous_kernel_from_name("uniform"), ContinuousKernel::boxcar);
  for (const ContinuousKernel kernel : kKernels)
    EXPECT_EQ(continuous_kernel_from_name(continuous_kernel_name(kernel)), kernel);
  expect_error([] { continuous_kernel_from_name("cosine"); },
               {"cosine", "gaussian", "epanechnikov", "boxcar", "tricube"});
}

TEST(KernelRegressionErrors, Constructor) {
  const Sample s = sample("cu", 10, 261);
  const auto make = [](const Tensor<double>& x, const Tensor<double>& y, const std::string& var_type, int degree = 1) {
    KernelRegression kr(x, y, options(var_type, degree, ContinuousKernel::gaussian));
  };
  expect_error([&] { make(s.x, Tensor<double>({9}), "cu"); }, {"y"});
  expect_error([&] { make(Tensor<double>({1, 2}, {0.5, 1}), Tensor<double>({1}), "cu"); }, {"2 points"});
  expect_error([&] { make(s.x, s.y, "c"); }, {"var_type"});
  expect_error([&] { make(s.x, s.y, "cu", 4); }, {"degree"});
  expect_error([&] { make(s.x, s.y, "cu", -1); }, {"degree"});
  Sample bad = s;
  bad.y[3] = NAN;
  expect_error([&] { make(bad.x, bad.y, "cu"); }, {"y"});
  bad = s;
  bad.x(2, 0) = INFINITY;
  expect_error([&] { make(bad.x, bad.y, "cu"); }, {"x"});
  bad = s;
  bad.x(2, 1) = 1.5;
  expect_error([&] { make(bad.x, bad.y, "cu"); }, {"x", "integer"});
  bad = s;
  for (index_t i = 0; i < 10; ++i) bad.x(i, 1) = 2;
  expect_error([&] { make(bad.x, bad.y, "cu"); }, {"x", "distinct"});
}

TEST(KernelRegressionErrors, BandwidthsQueriesAndLevel) {
  const Sample s = sample("cu", 20, 271);
  const KernelRegression kr(s.x, s.y, options("cu", 1, ContinuousKernel::gaussian));
  const std::vector<double> good{0.2, 0.3};
  for (const std::vector<double>& h :
       {std::vector<double>{0.2}, std::vector<double>{0.0, 0.3}, std::vector<double>{INFINITY, 0.3},
        std::vector<double>{0.2, 0.7}, std::vector<double>{0.2, -0.1}}) {
    expect_error([&] { kr.fit(h); }, {"bandwidths"});
    expect_error([&] { kr.cv_ls(h); }, {"bandwidths"});
    expect_error([&] { kr.aicc(h); }, {"bandwidths"});
    expect_error([&] { kr.confidence_band(h); }, {"bandwidths"});
  }
  expect_error([&] { kr.fit(good, Tensor<double>({4, 3})); }, {"queries"});
  expect_error([&] { kr.fit(good, Tensor<double>({4})); }, {"queries"});
  for (const double level : {0.0, 1.0, 1.5, double(NAN)})
    expect_error([&] { kr.confidence_band(good, {}, level); }, {"level"});
  expect_error([&] { kr.confidence_band(good, {}, 0.9, BandMethod::bootstrap, 0, 1); }, {"replicates", "1"});
  // A bandwidth this narrow interpolates: every point is its own fit, no residual degrees of freedom.
  const Sample c = sample("c", 20, 272);
  const KernelRegression narrow(c.x, c.y, options("c", 0, ContinuousKernel::boxcar));
  expect_error([&] { narrow.confidence_band(std::vector<double>{1e-9}); }, {"interpolate", "degrees of freedom"});
  BandwidthSearchOptions search;
  search.max_steps = -1;
  expect_error([&] { kr.select_bandwidth(BandwidthMethod::cv_ls, search); }, {"max_steps", "-1"});
  search = {};
  search.start_factors = {2.0, 0.0};
  expect_error([&] { kr.select_bandwidth(BandwidthMethod::aicc, search); }, {"start_factors", "0"});
}

TEST(KernelRegressionErrors, PlugInBandwidth) {
  const Sample s = sample("c", 50, 281);
  const std::span<const double> x = values(s.x), y = values(s.y);
  const double h = plug_in_bandwidth(x, y);
  EXPECT_TRUE(h > 0 && h < 1) << h;
  expect_error([&] { plug_in_bandwidth(x.first(4), y.first(4)); }, {"x", "4 points"});
  std::vector<double> bad(y.begin(), y.end());
  bad[7] = NAN;
  expect_error([&] { plug_in_bandwidth(x, bad); }, {"y"});
  const std::vector<double> flat(50, 0.5);
  expect_error([&] { plug_in_bandwidth(flat, y); }, {"x", "spread"});
}

}  // namespace
}  // namespace attn
