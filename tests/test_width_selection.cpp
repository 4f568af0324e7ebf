// Width selection by leave-one-out cross-validation (attn/width_selection.hpp): the criterion against
// N literal refits with nadaraya_watson_forward, a hand-computed case with an isolated point, the
// gradient against finite differences, thread-count independence, select_width against a dense
// grid's minimum and with an irrelevant input dimension, the per-dimension forward, and one test
// per argument check.
#include "attn/width_selection.hpp"

#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "attn/config.hpp"
#include "attn/nadaraya_watson.hpp"
#include "support/testing.hpp"

namespace attn {
namespace {

using testing::expect_error;
using testing::random_tensor;

constexpr Kernel kKernels[] = {Kernel::gaussian, Kernel::boxcar, Kernel::epanechnikov, Kernel::constant};

// The criterion computed the slow, obvious way: for each group g and point i, the keys and values
// of the group without row i, one query x_i, one call of nadaraya_watson_forward with sigma = 1 on
// x divided by the widths; the squared errors summed over all G N v elements. `isolated` counts
// the refits whose weights are all 0.
struct BruteForce {
  double error = 0;
  index_t isolated = 0;
};

BruteForce brute_force(const Tensor<double>& x, const Tensor<double>& y, Kernel kernel,
                       const std::vector<double>& widths) {
  const index_t G = x.dim(0), N = x.dim(1), p = x.dim(2), v = y.dim(2);
  BruteForce r;
  for (index_t g = 0; g < G; ++g)
    for (index_t i = 0; i < N; ++i) {
      Tensor<double> q({1, 1, p}), k({1, N - 1, p}), val({1, N - 1, v}), out({1, 1, v}), w({1, 1, N - 1});
      for (index_t c = 0; c < p; ++c) q[c] = x(g, i, c) / widths[widths.size() == 1 ? 0 : c];
      for (index_t j = 0, row = 0; j < N; ++j) {
        if (j == i) continue;
        for (index_t c = 0; c < p; ++c) k(0, row, c) = x(g, j, c) / widths[widths.size() == 1 ? 0 : c];
        for (index_t c = 0; c < v; ++c) val(0, row, c) = y(g, j, c);
        ++row;
      }
      nadaraya_watson_forward<double>(out.view(), w.view(), q.cview(), k.cview(), val.cview(), kernel, 1.0);
      double weight_sum = 0;
      for (index_t j = 0; j < N - 1; ++j) weight_sum += w[j];
      r.isolated += weight_sum == 0;
      for (index_t c = 0; c < v; ++c) r.error += (y(g, i, c) - out[c]) * (y(g, i, c) - out[c]);
    }
  r.error /= static_cast<double>(G * N * v);
  return r;
}

// 1-D keys 0, 1, 3 with targets 0, 1, 3, boxcar width 1.5: point 0 sees only point 1 (prediction 1,
// error 1), point 1 only point 0 (prediction 0, error 1), point 2 nothing within 1.5: isolated,
// predicted 0, error 9. CV = (1 + 1 + 9) / 3.
TEST(LooCv, HandComputedWithAnIsolatedPoint) {
  const Tensor<double> x({3, 1}, {0, 1, 3}), y({3, 1}, {0, 1, 3});
  const std::vector<double> widths{1.5};
  const LooCv r = loo_cv_error<double>(x, y, Kernel::boxcar, widths);
  EXPECT_DOUBLE_EQ(r.error, 11.0 / 3);
  EXPECT_EQ(r.isolated, 1);
  ASSERT_EQ(r.gradient.size(), 1u);
  EXPECT_EQ(r.gradient[0], 0.0);  // the boxcar's weights are piecewise constant
}

// Every kernel, shared and per-dimension widths, one group and three: the criterion equals the N
// refits. Widths narrow enough that the compact kernels leave some points isolated.
TEST(LooCv, MatchesRefittingWithOnePointLeftOut) {
  for (const index_t G : {1, 3}) {
    const Tensor<double> x = random_tensor<double>({G, 23, 2}, 11, 0, 4), y = random_tensor<double>({G, 23, 3}, 12);
    for (const std::vector<double>& widths : {std::vector<double>{0.45}, std::vector<double>{0.3, 0.9}})
      for (const Kernel kernel : kKernels) {
        SCOPED_TRACE(::testing::Message() << kernel_name(kernel) << " G = " << G << " widths " << widths.size());
        const BruteForce expected = brute_force(x, y, kernel, widths);
        const LooCv got = loo_cv_error<double>(x, y, kernel, widths, false);
        EXPECT_NEAR(got.error, expected.error, 1e-13 * expected.error);
        EXPECT_EQ(got.isolated, expected.isolated);
        if (kernel == Kernel::boxcar || kernel == Kernel::epanechnikov) {
          EXPECT_GT(expected.isolated, 0);  // the case the rule is about is covered
        }
        EXPECT_TRUE(got.gradient.empty());
      }
  }
}

// (N, p) is one group; float inputs are read exactly and computed in double.
TEST(LooCv, RankTwoAndFloatInputs) {
  const Tensor<double> x3 = random_tensor<double>({1, 30, 2}, 21), y3 = random_tensor<double>({1, 30, 1}, 22);
  const Tensor<double> x2({30, 2}, {x3.values().begin(), x3.values().end()});
  const Tensor<double> y2({30, 1}, {y3.values().begin(), y3.values().end()});
  const std::vector<double> widths{0.3, 0.5};
  const LooCv a = loo_cv_error<double>(x3, y3, Kernel::gaussian, widths);
  const LooCv b = loo_cv_error<double>(x2, y2, Kernel::gaussian, widths);
  EXPECT_EQ(a.error, b.error);
  EXPECT_EQ(a.gradient, b.gradient);
  const Tensor<float> xf = testing::convert<float>(x2), yf = testing::convert<float>(y2);
  const LooCv f = loo_cv_error<float>(xf, yf, Kernel::gaussian, widths);
  const LooCv d = loo_cv_error<double>(testing::convert<double>(xf), testing::convert<double>(yf), Kernel::gaussian,
                                       widths);
  EXPECT_EQ(f.error, d.error);
}

// The gradient with respect to each width against central differences, in float64, for the two
// kernels with a gradient, per-dimension and shared widths.
TEST(LooCv, GradientMatchesFiniteDifferences) {
  const Tensor<double> x = random_tensor<double>({2, 31, 3}, 31, 0, 3), y = random_tensor<double>({2, 31, 2}, 32);
  for (const Kernel kernel : {Kernel::gaussian, Kernel::epanechnikov})
    for (std::vector<double> widths : {std::vector<double>{0.8}, std::vector<double>{0.7, 1.3, 2.1}}) {
      SCOPED_TRACE(::testing::Message() << kernel_name(kernel) << " widths " << widths.size());
      const LooCv r = loo_cv_error<double>(x, y, kernel, widths);
      const std::vector<double> numeric = testing::numeric_gradient(
          [&] { return loo_cv_error<double>(x, y, kernel, widths, false).error; }, widths, 1e-6);
      std::string where;
      EXPECT_LT(testing::gradient_error(r.gradient, numeric, &where), 1e-7) << where;
      for (const double g : r.gradient) EXPECT_NE(g, 0.0);
    }
}

// 1200 points of 2 features and 1 target: enough work (N^2 (p + v) > 2^22) for the threaded path.
TEST(LooCv, SameResultAtOneAndTwoThreads) {
  const Tensor<double> x = random_tensor<double>({1, 1200, 2}, 41), y = random_tensor<double>({1, 1200, 1}, 42);
  const std::vector<double> widths{0.2, 0.3};
  for (const Kernel kernel : kKernels) {
    set_num_threads(1);
    const LooCv one = loo_cv_error<double>(x, y, kernel, widths);
    set_num_threads(2);
    const LooCv two = loo_cv_error<double>(x, y, kernel, widths);
    set_num_threads(0);
    EXPECT_EQ(one.error, two.error) << kernel_name(kernel);
    EXPECT_EQ(one.gradient, two.gradient) << kernel_name(kernel);
  }
}

// ---- select_width --------------------------------------------------------------------------------

// y = sin(x) + normal(0, noise) at n points uniform in [0, 10]: a smooth curve with one best width.
void sine_data(index_t n, std::uint64_t seed, double noise, Tensor<double>& x, Tensor<double>& y) {
  x = random_tensor<double>({n, 1}, seed, 0, 10);
  y = Tensor<double>({n, 1});
  std::mt19937_64 rng(seed + 1);
  std::normal_distribution<double> eps(0, noise);
  for (index_t i = 0; i < n; ++i) y[i] = std::sin(x[i]) + eps(rng);
}

// The minimum of the criterion over 600 log-spaced widths from 0.05 to 2 (ratio 1.006 apart).
std::pair<double, double> dense_grid_minimum(const Tensor<double>& x, const Tensor<double>& y, Kernel kernel) {
  std::pair<double, double> best{0, INFINITY};  // width, error
  for (int k = 0; k < 600; ++k) {
    const std::vector<double> w{0.05 * std::pow(40.0, k / 599.0)};
    const double e = loo_cv_error<double>(x, y, kernel, w, false).error;
    if (e < best.second) best = {w[0], e};
  }
  return best;
}

// The dense grid's best width is the known best. The Gaussian's criterion is smooth: BFGS lands
// within 1% of that width (the dense grid's own spacing is 0.6%). The Epanechnikov's has kinks
// wherever a pair enters or leaves the support, and here a flat stretch from 0.456 to 0.48 whose
// error varies by 1e-5 relative: within 5% of the width and 1e-4 of the error. The boxcar's is
// piecewise constant with many narrow steps: its error within 1%.
TEST(SelectWidth, FindsTheDenseGridMinimum) {
  Tensor<double> x, y;
  sine_data(150, 51, 0.3, x, y);
  for (const Kernel kernel : {Kernel::gaussian, Kernel::epanechnikov, Kernel::boxcar}) {
    SCOPED_TRACE(kernel_name(kernel));
    const auto [best_width, best_error] = dense_grid_minimum(x, y, kernel);
    const WidthSelection s = select_width<double>(x, y, kernel);
    ASSERT_EQ(s.widths.size(), 1u);
    EXPECT_TRUE(s.converged) << s.how;
    EXPECT_LE(s.loo_error, s.grid_error);
    if (kernel == Kernel::gaussian) {
      EXPECT_LE(s.loo_error, best_error) << s.how;
      EXPECT_NEAR(s.widths[0], best_width, 0.01 * best_width) << s.how;
    } else if (kernel == Kernel::epanechnikov) {
      EXPECT_LE(s.loo_error, best_error * (1 + 1e-4)) << s.how;
      EXPECT_NEAR(s.widths[0], best_width, 0.05 * best_width) << s.how;
    } else {
      EXPECT_LE(s.loo_error, best_error * 1.01) << s.how;
    }
    EXPECT_EQ(s.loo_error, loo_cv_error<double>(x, y, kernel, s.widths, false).error);
    EXPECT_NE(s.how.find(kernel == Kernel::boxcar ? "compass" : "BFGS"), std::string::npos) << s.how;
  }
}

// x = (x0, x1) with y = sin(x0) + noise: the width of the irrelevant x1 grows far beyond its
// spread (about 2.9), while x0's stays near the 1-D optimum; the anisotropic fit beats the best
// shared width.
TEST(SelectWidth, IrrelevantDimensionGetsAWideWidth) {
  Tensor<double> x0, y;
  sine_data(300, 61, 0.2, x0, y);
  const Tensor<double> x1 = random_tensor<double>({300, 1}, 63, 0, 10);
  Tensor<double> x({300, 2});
  for (index_t i = 0; i < 300; ++i) x(i, 0) = x0[i], x(i, 1) = x1[i];
  const WidthSelection both = select_width<double>(x, y, Kernel::gaussian);
  ASSERT_EQ(both.widths.size(), 2u);
  EXPECT_GT(both.widths[1], 10 * 2.9) << both.how;
  const WidthSelection alone = select_width<double>(x0, y, Kernel::gaussian);
  EXPECT_NEAR(both.widths[0], alone.widths[0], 0.05 * alone.widths[0]) << both.how << "\n" << alone.how;
  WidthSearchOptions shared;
  shared.per_dimension = false;
  const WidthSelection one = select_width<double>(x, y, Kernel::gaussian, shared);
  ASSERT_EQ(one.widths.size(), 1u);
  EXPECT_LT(both.loo_error, 0.9 * one.loo_error) << both.how << "\n" << one.how;
}

// The grid is scaled by the data's spread, computed at any scale: x in other units gives the same
// widths in those units and the same error, down to 1e-200 and up to 1e200 (its deviations squared
// as they were, x past 1e154 read as infinitely spread and x below 1e-162 as constant).
TEST(SelectWidth, WidthsFollowTheDataAtAnyScale) {
  Tensor<double> x, y;
  sine_data(40, 73, 0.3, x, y);
  const WidthSelection unit = select_width<double>(x, y, Kernel::gaussian);
  for (const double scale : {0x1p-664, 0x1p664}) {  // powers of two, about 1e-200 and 1e200: x scaled exactly
    Tensor<double> scaled = x;
    for (index_t i = 0; i < x.numel(); ++i) scaled[i] = x[i] * scale;
    const WidthSelection s = select_width<double>(scaled, y, Kernel::gaussian);
    ASSERT_EQ(s.widths.size(), 1u);
    EXPECT_NEAR(s.widths[0] / scale, unit.widths[0], 1e-12 * unit.widths[0]) << s.how;
    EXPECT_NEAR(s.loo_error, unit.loo_error, 1e-12 * unit.loo_error);
  }
}

// x spread so far that the grid (up to 100 times its largest multiple of the spread) passes the
// type's range: every width searched, and the one chosen, stays finite in the data's type (they
// reached inf in float64 and 7e38 in float32, which the forward then refused).
TEST(SelectWidth, WidthsStayWithinTheDataType) {
  const Tensor<double> x({4, 1}, {1e306, -1e306, 0, 5e305}), y({4, 1}, {1, 2, 3, 4});
  const WidthSelection wide = select_width<double>(x, y, Kernel::gaussian);
  EXPECT_TRUE(std::isfinite(wide.widths[0]) && std::isfinite(wide.loo_error)) << wide.how;
  const Tensor<float> x32({4, 1}, {1e36f, -1e36f, 0, 5e35f}), y32({4, 1}, {1, 2, 3, 4});
  const WidthSelection wide32 = select_width<float>(x32, y32, Kernel::gaussian);
  EXPECT_TRUE(std::isfinite(static_cast<float>(wide32.widths[0])) && std::isfinite(wide32.loo_error)) << wide32.how;
  Tensor<float> out({1, 4, 1});
  const TensorView<const float> points(x32.data(), {1, 4, 1}), targets(y32.data(), {1, 4, 1});
  nadaraya_watson_forward<float>(out.view(), {}, points, points, targets, Kernel::gaussian, static_cast<float>(wide32.widths[0]));
  for (const float v : out.values()) EXPECT_TRUE(std::isfinite(v));
}

TEST(SelectWidth, ConstantKernelAndGridOnly) {
  Tensor<double> x, y;
  sine_data(40, 71, 0.3, x, y);
  const WidthSelection c = select_width<double>(x, y, Kernel::constant);
  EXPECT_EQ(c.steps, 0);
  EXPECT_NE(c.how.find("constant kernel"), std::string::npos);
  WidthSearchOptions grid_only;
  grid_only.max_steps = 0;
  const WidthSelection g = select_width<double>(x, y, Kernel::gaussian, grid_only);
  EXPECT_EQ(g.widths, g.grid_widths);
  EXPECT_EQ(g.evaluations, grid_only.grid_points + 1);  // the grid, then the result's own evaluation
}

// ---- Nadaraya-Watson with per-dimension widths -----------------------------------------------------

TEST(NadarayaWatsonWidths, ScalesEachDimension) {
  const Tensor<double> q = random_tensor<double>({2, 5, 2}, 81), k = random_tensor<double>({2, 7, 2}, 82),
                       v = random_tensor<double>({2, 7, 3}, 83);
  const std::vector<double> widths{0.4, 1.7};
  Tensor<double> qs({2, 5, 2}), ks({2, 7, 2});
  for (index_t e = 0; e < q.numel(); ++e) qs[e] = q[e] / widths[e % 2];
  for (index_t e = 0; e < k.numel(); ++e) ks[e] = k[e] / widths[e % 2];
  for (const Kernel kernel : kKernels) {
    Tensor<double> got({2, 5, 3}), expected({2, 5, 3}), shared({2, 5, 3}), shared_expected({2, 5, 3});
    nadaraya_watson_forward<double>(got, {}, q, k, v, kernel, std::span<const double>(widths));
    nadaraya_watson_forward<double>(expected, {}, qs, ks, v, kernel, 1.0);
    EXPECT_EQ(got.values(), expected.values()) << kernel_name(kernel);
    const std::vector<double> one{0.9};
    nadaraya_watson_forward<double>(shared, {}, q, k, v, kernel, std::span<const double>(one));
    nadaraya_watson_forward<double>(shared_expected, {}, q, k, v, kernel, 0.9);
    EXPECT_EQ(shared.values(), shared_expected.values()) << kernel_name(kernel);
  }
}

// ---- argument checks ---------------------------------------------------------------------------

TEST(LooCv, RefusesBadArguments) {
  const Tensor<double> x({4, 2}), y({4, 1}), one_point({1, 2}), one_y({1, 1}), short_y({3, 1}), y3({1, 4, 1});
  const std::vector<double> w2{1, 1}, w1{1};
  const auto loo = [&](const Tensor<double>& a, const Tensor<double>& b, std::vector<double> w) {
    return [&a, &b, w] { loo_cv_error<double>(a, b, Kernel::gaussian, w); };
  };
  expect_error(loo(x, y, {1, 0}), {"loo_cv_error: widths[1] is 0", "positive and finite"});
  expect_error(loo(x, y, {-0.5}), {"widths[0] is -0.5"});
  expect_error(loo(x, y, {NAN, 1}), {"widths[0] is nan"});
  expect_error(loo(x, y, {1, 1, 1}), {"widths has 3 elements but x has p = 2 features"});
  expect_error(loo(one_point, one_y, w1), {"x has shape (1,2) with N = 1 point(s) per group", "at least 2"});
  expect_error(loo(x, short_y, w1), {"y has shape (3,1) but must be (4,1)", "one row of targets per point of x (4,2)"});
  expect_error(loo(x, y3, w1), {"y has shape (1,4,1) but must be (4,1)"});
  expect_error([&] { loo_cv_error<double>({}, y, Kernel::gaussian, w1); }, {"loo_cv_error: x is required"});
  const Tensor<double> flat({4});
  expect_error(loo(flat, y, w1), {"x has shape (4,); it must have 2 to 4 dimensions"});
  Tensor<double> bad_y({4, 1});
  bad_y[2] = INFINITY;
  expect_error(loo(x, bad_y, w1), {"y holds inf in row 2", "finite"});
  expect_error([&] { loo_cv_error<double>(x, y, static_cast<Kernel>(9), w2); }, {"kernel 9 is not a Kernel"});
}

TEST(SelectWidth, RefusesBadOptions) {
  const Tensor<double> x({4, 1}), y({4, 1});
  const auto with = [&](WidthSearchOptions o) { return [&x, &y, o] { select_width<double>(x, y, Kernel::gaussian, o); }; };
  expect_error(with({.grid_points = 1}), {"select_width: options.grid_points is 1; it must be at least 2"});
  expect_error(with({.grid_low = 0}), {"options.grid_low is 0", "0 < grid_low < grid_high"});
  expect_error(with({.grid_low = 2, .grid_high = 1}), {"options.grid_low is 2 and options.grid_high is 1"});
  expect_error(with({.max_steps = -1}), {"options.max_steps is -1"});
  expect_error(with({.starts = 0}), {"options.starts is 0; it must be at least 1"});
  const Tensor<double> one_point({1, 1}), one_y({1, 1});
  expect_error([&] { select_width<double>(one_point, one_y, Kernel::gaussian); }, {"select_width: x has shape (1,1)"});
}

TEST(NadarayaWatsonWidths, RefusesBadWidths) {
  const Tensor<double> q({1, 2, 2}), k({1, 3, 2}), k3({1, 3, 3}), v({1, 3, 1});
  Tensor<double> out({1, 2, 1});
  const auto run = [&](const Tensor<double>& keys, std::vector<double> w) {
    return [&, w] { nadaraya_watson_forward<double>(out, {}, q, keys, v, Kernel::gaussian, std::span<const double>(w)); };
  };
  expect_error(run(k, {1, 2, 3}), {"nadaraya_watson_forward: widths has 3 elements but queries has p = 2"});
  expect_error(run(k, {1, 0}), {"widths[1] is 0"});
  expect_error(run(k3, {1, 2}), {"keys has shape (1,3,3) but queries has p = 2 features"});
}

}  // namespace
}  // namespace attn
