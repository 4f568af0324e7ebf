// Nadaraya-Watson pooling (attn/nadaraya_watson.hpp): both backends against the float64 reference
// under the error budget of STYLE.md, hand-computed weights, the d2l chapter's softmax form of the
// Gaussian, empty and far-away rows, thread-count independence, gradients against finite
// differences, and one test per argument check.
#include "attn/nadaraya_watson.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <tuple>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "attn/config.hpp"
#include "attn/diagnostics.hpp"
#include "core/view4.hpp"
#include "cpu/nw_windowed.hpp"
#include "cpu/unfused.hpp"
#include "support/testing.hpp"

namespace attn {
namespace {

using testing::convert;
using testing::expect_error;
using testing::max_abs_diff;
using testing::random_tensor;

constexpr Kernel kKernels[] = {Kernel::gaussian, Kernel::boxcar, Kernel::epanechnikov, Kernel::constant};
constexpr Backend kBackends[] = {Backend::reference, Backend::cpu};

const char* backend_name(Backend b) { return b == Backend::cpu ? "cpu" : "reference"; }

// The sizes of one problem; rank 3 leaves H (= 1) out of every shape.
struct Shape {
  int rank = 3;
  index_t B = 1, H = 1, n = 1, m = 1, p = 1, v = 1;
  std::vector<index_t> dims(index_t R, index_t C) const {
    return rank == 4 ? std::vector<index_t>{B, H, R, C} : std::vector<index_t>{B, R, C};
  }
};

template <class T>
Tensor<T> zeros(const std::vector<index_t>& dims) {
  return Tensor<T>(std::span<const index_t>(dims));
}

// The inputs of one problem in float64 (each run converts them to its precision); dout also
// defines the loss sum(out * dout) of the gradient tests.
struct Problem {
  Shape s;
  Tensor<double> q, k, v, dout;
};

Problem make_problem(const Shape& s, std::uint64_t seed, double lo = -1, double hi = 1) {
  return {s, random_tensor<double>(s.dims(s.n, s.p), seed, lo, hi),
          random_tensor<double>(s.dims(s.m, s.p), seed + 1, lo, hi), random_tensor<double>(s.dims(s.m, s.v), seed + 2),
          random_tensor<double>(s.dims(s.n, s.v), seed + 3)};
}

// Everything forward and backward write, in precision T; dsigma has shape (1,).
template <class T>
struct Result {
  Tensor<T> out, weights, dq, dk, dv, dsigma;
};

// Forward and backward of `pr`. Without `with_weights` the forward is not asked for the weights
// (r.weights stays 0): for 1-D keys the cpu backend then takes its windowed path, which a call that
// asks for the (n, m) weights leaves for the dense one.
template <class T>
Result<T> run(const Problem& pr, Kernel kernel, double sigma, Backend backend, bool with_weights = true) {
  const ScopedBackend scoped(backend);
  const Shape& s = pr.s;
  const Tensor<T> q = convert<T>(pr.q), k = convert<T>(pr.k), v = convert<T>(pr.v), d = convert<T>(pr.dout);
  Result<T> r{zeros<T>(s.dims(s.n, s.v)), zeros<T>(s.dims(s.n, s.m)), zeros<T>(s.dims(s.n, s.p)),
              zeros<T>(s.dims(s.m, s.p)), zeros<T>(s.dims(s.m, s.v)), zeros<T>({1})};
  nadaraya_watson_forward<T>(r.out.view(), with_weights ? r.weights.view() : TensorView<T>(), q.cview(), k.cview(),
                             v.cview(), kernel, T(sigma));
  nadaraya_watson_backward<T>(r.dq.view(), r.dk.view(), r.dv.view(), r.dsigma.data(), d.cview(), q.cview(),
                              k.cview(), v.cview(), kernel, T(sigma));
  return r;
}

// The tensors of a Result by name, for loops over all of them.
template <class T>
std::vector<std::pair<const char*, const Tensor<T>*>> fields(const Result<T>& r) {
  return {{"out", &r.out}, {"weights", &r.weights}, {"dqueries", &r.dq},
          {"dkeys", &r.dk}, {"dvalues", &r.dv},      {"dsigma", &r.dsigma}};
}

bool bit_identical(const Tensor<float>& a, const Tensor<float>& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), sizeof(float) * a.numel()) == 0;
}

double max_abs(const Tensor<double>& t) { return max_abs_diff(t, zeros<double>(t.shape())); }

// Restores the default thread count when a test ends, failed or not.
struct ThreadGuard {
  ~ThreadGuard() { set_num_threads(0); }
};

// ---- against the float64 reference -------------------------------------------------------------

// dsigma of `count` problems of shape `s` (seeds from `seed` on), one per element, in precision T.
template <class T>
Tensor<T> dsigma_samples(const Shape& s, std::uint64_t seed, int count, double lo, double hi, Kernel kernel,
                         double sigma, Backend backend) {
  const ScopedBackend scoped(backend);
  Tensor<T> ds({count});
  for (int c = 0; c < count; ++c) {
    const Problem pr = make_problem(s, seed + 10 * static_cast<std::uint64_t>(c), lo, hi);
    const Tensor<T> q = convert<T>(pr.q), k = convert<T>(pr.k), v = convert<T>(pr.v), d = convert<T>(pr.dout);
    nadaraya_watson_backward<T>({}, {}, {}, &ds[c], d.cview(), q.cview(), k.cview(), v.cview(), kernel, T(sigma));
  }
  return ds;
}

// cpu float32 within 2x the error of reference float32 (both against reference float64), and cpu
// float64 within a few ulps-worth of reference float64, for every kernel, width and output.
// The budget of a tensor is the worst error over its elements. dsigma is a single number whose
// terms cancel: one float32 sample's error is too noisy a budget (a lucky reference leaves almost
// none), so its budget is the worst over 8 problems of the same case.
TEST(NadarayaWatson, MatchesFloat64ReferenceWithinErrorBudget) {
  struct Case {
    Shape s;
    double lo, hi;
  };
  const Case cases[] = {
      {{3, 2, 1, 113, 203, 3, 5}, -1, 1},  // odd sizes
      {{4, 2, 3, 17, 31, 4, 6}, -1, 1},    // heads
      {{3, 2, 1, 50, 80, 1, 1}, 0, 5},     // 1-D x and y as in the d2l chapter
  };
  std::uint64_t seed = 100;
  for (const Case& c : cases)
    for (const Kernel kernel : kKernels)
      for (const double sigma : {0.1, 0.5, 2.0}) {
        SCOPED_TRACE(::testing::Message() << kernel_name(kernel) << " sigma " << sigma << " rank " << c.s.rank
                                          << " n " << c.s.n << " m " << c.s.m << " p " << c.s.p);
        const Problem pr = make_problem(c.s, seed += 10, c.lo, c.hi);
        const auto oracle = run<double>(pr, kernel, sigma, Backend::reference);
        const auto base = run<float>(pr, kernel, sigma, Backend::reference);
        const auto f32 = run<float>(pr, kernel, sigma, Backend::cpu);
        const auto f64 = run<double>(pr, kernel, sigma, Backend::cpu);
        const auto want = fields(oracle), got64 = fields(f64);
        const auto ref32 = fields(base), got32 = fields(f32);
        for (std::size_t i = 0; i < want.size(); ++i) {
          SCOPED_TRACE(want[i].first);
          if (want[i].second != &oracle.dsigma) {
            EXPECT_TRUE(testing::within_error_budget(*got32[i].second, *ref32[i].second, *want[i].second));
          }
          EXPECT_LE(max_abs_diff(*got64[i].second, *want[i].second), 1e-12 * (1 + max_abs(*want[i].second)));
        }
        const std::uint64_t first = 1'000'000 + seed * 100;
        const auto ds = [&]<class T>(T, Backend backend) {
          return dsigma_samples<T>(c.s, first, 8, c.lo, c.hi, kernel, sigma, backend);
        };
        EXPECT_TRUE(testing::within_error_budget(ds(0.0f, Backend::cpu), ds(0.0f, Backend::reference),
                                                 ds(0.0, Backend::reference)))
            << "dsigma over 8 problems";
      }
}

// ---- exact values --------------------------------------------------------------------------------

// 1-D keys 0, 1, 2, 3 with values 0, 10, 20, 30, one query at 1.2, width 1: u = 1.2, 0.2, 0.8, 1.8.
void expect_hand_computed(Kernel kernel, const std::vector<double>& K) {
  Problem pr{{3, 1, 1, 1, 4, 1, 1}, Tensor<double>({1, 1, 1}, {1.2}), Tensor<double>({1, 4, 1}, {0, 1, 2, 3}),
             Tensor<double>({1, 4, 1}, {0, 10, 20, 30}), Tensor<double>({1, 1, 1}, {1})};
  const double Z = K[0] + K[1] + K[2] + K[3];
  for (const Backend backend : kBackends) {
    SCOPED_TRACE(backend_name(backend));
    const auto r = run<double>(pr, kernel, 1.0, backend);
    double out = 0;
    for (int j = 0; j < 4; ++j) {
      EXPECT_NEAR(r.weights[j], K[j] / Z, 1e-15) << "key " << j;
      out += K[j] / Z * pr.v[j];
    }
    EXPECT_NEAR(r.out[0], out, 1e-14);
  }
}

TEST(NadarayaWatson, HandComputedGaussian) {
  expect_hand_computed(Kernel::gaussian, {std::exp(-0.72), std::exp(-0.02), std::exp(-0.32), std::exp(-1.62)});
}
TEST(NadarayaWatson, HandComputedBoxcar) { expect_hand_computed(Kernel::boxcar, {0, 1, 1, 0}); }  // out 15
TEST(NadarayaWatson, HandComputedEpanechnikov) {
  expect_hand_computed(Kernel::epanechnikov, {0, 0.8, 0.2, 0});  // weights 0.8, 0.2: out 12
}
TEST(NadarayaWatson, HandComputedConstant) { expect_hand_computed(Kernel::constant, {1, 1, 1, 1}); }

// At u = 1 exactly (query 1 against keys 0 and 2) the boxcar includes the key and the Epanechnikov
// kernel is 0.
TEST(NadarayaWatson, SupportBoundary) {
  const Problem pr{{3, 1, 1, 1, 4, 1, 1}, Tensor<double>({1, 1, 1}, {1}), Tensor<double>({1, 4, 1}, {0, 1, 2, 3}),
                   Tensor<double>({1, 4, 1}, {0, 10, 20, 30}), Tensor<double>({1, 1, 1}, {1})};
  for (const Backend backend : kBackends) {
    SCOPED_TRACE(backend_name(backend));
    const auto box = run<double>(pr, Kernel::boxcar, 1.0, backend);
    const auto epa = run<double>(pr, Kernel::epanechnikov, 1.0, backend);
    for (int j = 0; j < 4; ++j) {
      EXPECT_EQ(box.weights[j], j < 3 ? 1.0 / 3 : 0.0) << "key " << j;
      EXPECT_EQ(epa.weights[j], j == 1 ? 1.0 : 0.0) << "key " << j;
    }
  }
}

// The d2l chapter's regression: f(x) = sum_i softmax(-(x - x_i)^2 / 2) y_i, the softmax written out here.
TEST(NadarayaWatson, GaussianIsTheD2lSoftmax) {
  const index_t n = 50, m = 50;
  Tensor<double> x_test({1, n, 1}), x_train = random_tensor<double>({1, m, 1}, 7, 0, 5), y_train({1, m, 1});
  for (index_t i = 0; i < n; ++i) x_test[i] = 0.1 * static_cast<double>(i);
  for (index_t i = 0; i < m; ++i) y_train[i] = 2 * std::sin(x_train[i]) + std::pow(x_train[i], 0.8);
  std::vector<double> expected(n);
  for (index_t i = 0; i < n; ++i) {
    std::vector<double> score(m);
    double top = -INFINITY, sum = 0;
    for (index_t j = 0; j < m; ++j) {
      score[j] = -(x_test[i] - x_train[j]) * (x_test[i] - x_train[j]) / 2;
      top = std::max(top, score[j]);
    }
    for (index_t j = 0; j < m; ++j) sum += std::exp(score[j] - top);
    for (index_t j = 0; j < m; ++j) expected[i] += std::exp(score[j] - top) / sum * y_train[j];
  }
  for (const Backend backend : kBackends) {
    SCOPED_TRACE(backend_name(backend));
    const ScopedBackend scoped(backend);
    Tensor<double> out({1, n, 1});
    nadaraya_watson_forward<double>(out.view(), {}, x_test.cview(), x_train.cview(), y_train.cview(),
                                    Kernel::gaussian, 1.0);
    for (index_t i = 0; i < n; ++i) EXPECT_NEAR(out[i], expected[i], 1e-13) << "x = " << x_test[i];
  }
}

// ---- empty and far-away rows ---------------------------------------------------------------------

// Query 1 (at 100) has no key in a compact kernel's support: out 0, weights 0, no gradient; the
// gradients equal those of query 0 alone.
TEST(NadarayaWatson, EmptyRowsOutputZeroWithZeroGradients) {
  const Tensor<double> keys({1, 4, 1}, {0, 1, 2, 3}), values({1, 4, 2}, {0, 1, 10, 11, 20, 21, 30, 31});
  const Problem both{{3, 1, 1, 2, 4, 1, 2}, Tensor<double>({1, 2, 1}, {1.2, 100}), keys, values,
                     Tensor<double>({1, 2, 2}, {0.5, -1, 2, 3})};
  const Problem first{{3, 1, 1, 1, 4, 1, 2}, Tensor<double>({1, 1, 1}, {1.2}), keys, values,
                      Tensor<double>({1, 1, 2}, {0.5, -1})};
  for (const Kernel kernel : {Kernel::boxcar, Kernel::epanechnikov})
    for (const Backend backend : kBackends) {
      SCOPED_TRACE(::testing::Message() << kernel_name(kernel) << " " << backend_name(backend));
      const auto r = run<double>(both, kernel, 1.0, backend), r1 = run<double>(first, kernel, 1.0, backend);
      EXPECT_EQ(r.out(0, 1, 0), 0.0);
      EXPECT_EQ(r.out(0, 1, 1), 0.0);
      for (int j = 0; j < 4; ++j) EXPECT_EQ(r.weights(0, 1, j), 0.0);
      EXPECT_EQ(r.dq(0, 1, 0), 0.0);
      EXPECT_NE(r.out(0, 0, 0), 0.0);  // query 0 is not empty
      EXPECT_EQ(r.dq(0, 0, 0), r1.dq(0, 0, 0));
      EXPECT_EQ(max_abs_diff(r.dk, r1.dk), 0.0);
      EXPECT_EQ(max_abs_diff(r.dv, r1.dv), 0.0);
      EXPECT_EQ(r.dsigma[0], r1.dsigma[0]);
      EXPECT_TRUE(std::isfinite(r.dsigma[0]));
    }
}

// exp(-||q - k||^2 / 2 sigma^2) underflows for a far query (and 1 / sigma^2 overflows for a tiny
// float sigma); the softmax form still puts weight 1 on the nearest key.
template <class T>
void expect_nearest_key_wins(T query, T sigma) {
  const Problem pr{{3, 1, 1, 1, 4, 1, 1}, Tensor<double>({1, 1, 1}, {static_cast<double>(query)}),
                   Tensor<double>({1, 4, 1}, {0, 1, 2, 3}), Tensor<double>({1, 4, 1}, {5, 6, 7, 8}),
                   Tensor<double>({1, 1, 1}, {1})};
  for (const Backend backend : kBackends) {
    SCOPED_TRACE(::testing::Message() << backend_name(backend) << " query " << query << " sigma " << sigma);
    const auto r = run<T>(pr, Kernel::gaussian, sigma, backend);
    EXPECT_EQ(r.weights[3], T(1));
    EXPECT_EQ(r.out[0], T(8));
    for (const auto& [name, t] : fields(r))
      for (index_t i = 0; i < t->numel(); ++i) EXPECT_TRUE(std::isfinite((*t)[i])) << name << " " << i;
  }
}

TEST(NadarayaWatson, GaussianRowIsNeverEmpty) {
  expect_nearest_key_wins<double>(1000, 0.5);
  expect_nearest_key_wins<float>(1000, 0.5f);
  expect_nearest_key_wins<float>(3.25f, 1e-30f);
}

// ---- threads -------------------------------------------------------------------------------------

TEST(NadarayaWatson, CpuResultsDoNotDependOnThreadCount) {
  const ThreadGuard guard;
  const Problem pr = make_problem({4, 2, 2, 67, 150, 3, 5}, 42);  // 150 keys: several key blocks
  for (const Kernel kernel : kKernels) {
    SCOPED_TRACE(kernel_name(kernel));
    set_num_threads(1);
    const auto one = run<float>(pr, kernel, 0.7, Backend::cpu);
    for (const int threads : {2, 3}) {
      set_num_threads(threads);
      const auto many = run<float>(pr, kernel, 0.7, Backend::cpu);
      const auto a = fields(one), b = fields(many);
      for (std::size_t i = 0; i < a.size(); ++i)
        EXPECT_TRUE(bit_identical(*a[i].second, *b[i].second)) << a[i].first << " at " << threads << " threads";
    }
  }
}

// The cpu backward works through (n, m) buffers in groups of (b, h) pairs sized to a memory budget;
// here each pair is a group of its own (n m > 2^21), and the later groups must land in place.
TEST(NadarayaWatson, LargeRowsAreProcessedInGroups) {
  const Problem pr = make_problem({4, 1, 3, 1100, 1999, 1, 2}, 9, 0, 5);
  const auto want = run<double>(pr, Kernel::epanechnikov, 0.3, Backend::reference);
  const auto got = run<double>(pr, Kernel::epanechnikov, 0.3, Backend::cpu);
  const auto a = fields(want), b = fields(got);
  for (std::size_t i = 0; i < a.size(); ++i)
    EXPECT_LE(max_abs_diff(*b[i].second, *a[i].second), 1e-12 * (1 + max_abs(*a[i].second))) << a[i].first;
}

// ---- gradients -----------------------------------------------------------------------------------

// Whether every u = ||q - k|| / sigma keeps `margin` away from the kinks of the compact kernels
// (u = 0 and u = 1), and every query has a key inside the support and one outside it.
bool away_from_kinks(const Problem& pr, double sigma, double margin) {
  const Shape& s = pr.s;
  const index_t rows = s.B * s.H;
  for (index_t r = 0; r < rows; ++r)
    for (index_t i = 0; i < s.n; ++i) {
      int inside = 0;
      for (index_t j = 0; j < s.m; ++j) {
        double d2 = 0;
        for (index_t x = 0; x < s.p; ++x) {
          const double d = pr.q[(r * s.n + i) * s.p + x] - pr.k[(r * s.m + j) * s.p + x];
          d2 += d * d;
        }
        const double u = std::sqrt(d2) / sigma;
        if (u < margin || std::abs(u - 1) < margin) return false;
        inside += u < 1;
      }
      if (inside == 0 || inside == s.m) return false;
    }
  return true;
}

// The first seed from `seed` on whose problem keeps away from the kinks.
Problem smooth_problem(const Shape& s, std::uint64_t seed, double sigma) {
  for (;; seed += 7) {
    Problem pr = make_problem(s, seed);
    if (away_from_kinks(pr, sigma, 0.02)) return pr;
  }
}

// dL/dx for L = sum(out * dout) by central differences, x one of the problem's inputs or sigma.
std::vector<double> finite_difference(Problem& pr, std::span<double> x, Kernel kernel, const double& sigma) {
  return testing::numeric_gradient(
      [&] {
        Tensor<double> out = zeros<double>(pr.s.dims(pr.s.n, pr.s.v));
        nadaraya_watson_forward<double>(out.view(), {}, pr.q.cview(), pr.k.cview(), pr.v.cview(), kernel, sigma);
        return testing::dot(out, pr.dout);
      },
      x);
}

void expect_gradient(const Tensor<double>& analytic, const std::vector<double>& numeric, const char* name) {
  std::string where;
  EXPECT_LT(testing::gradient_error(analytic.values(), numeric, &where), 1e-6) << name << ": " << where;
}

// Gaussian and Epanechnikov: every gradient against finite differences. Boxcar and constant:
// dvalues against finite differences, the rest exactly 0. The 1-D shapes (p = 1) take the cpu
// backend's windowed backward, and its windowed forward in the finite differences.
TEST(NadarayaWatson, BackwardMatchesFiniteDifferences) {
  const double sigma = 0.9;
  for (const Shape& s : {Shape{3, 2, 1, 3, 5, 2, 2}, Shape{4, 1, 2, 4, 6, 2, 3}, Shape{3, 2, 1, 7, 9, 1, 2},
                         Shape{4, 2, 2, 5, 8, 1, 3}})
    for (const Kernel kernel : kKernels)
      for (const Backend backend : kBackends) {
        SCOPED_TRACE(::testing::Message() << kernel_name(kernel) << " " << backend_name(backend) << " rank "
                                          << s.rank);
        const ScopedBackend scoped(backend);
        Problem pr = smooth_problem(s, 500, sigma);
        const auto r = run<double>(pr, kernel, sigma, backend);
        expect_gradient(r.dv, finite_difference(pr, pr.v.values(), kernel, sigma), "dvalues");
        if (kernel == Kernel::gaussian || kernel == Kernel::epanechnikov) {
          expect_gradient(r.dq, finite_difference(pr, pr.q.values(), kernel, sigma), "dqueries");
          expect_gradient(r.dk, finite_difference(pr, pr.k.values(), kernel, sigma), "dkeys");
          std::vector<double> width{sigma};
          expect_gradient(r.dsigma, finite_difference(pr, width, kernel, width[0]), "dsigma");
          EXPECT_GT(max_abs(r.dq), 1e-3);  // the data exercise the gradient
        } else {
          EXPECT_EQ(max_abs(r.dq), 0.0);
          EXPECT_EQ(max_abs(r.dk), 0.0);
          EXPECT_EQ(r.dsigma[0], 0.0);
        }
      }
}

// Epanechnikov at q == k: ||q - k|| has no derivative there; that key contributes 0.
TEST(NadarayaWatson, EpanechnikovAtCoincidentKeyUsesZero) {
  const Problem pr{{3, 1, 1, 1, 2, 1, 1}, Tensor<double>({1, 1, 1}, {1}), Tensor<double>({1, 2, 1}, {1, 1.5}),
                   Tensor<double>({1, 2, 1}, {2, 4}), Tensor<double>({1, 1, 1}, {1})};
  for (const Backend backend : kBackends) {
    SCOPED_TRACE(backend_name(backend));
    const auto r = run<double>(pr, Kernel::epanechnikov, 1.0, backend);
    // K = (1, 0.5), Z = 1.5, g = (2, 4), c = 8/3: only key 1 (u = 0.5) moves q, with
    // a = -(g - c) / (Z sigma r) = -(4/3) / 0.75, dq = a (q - k) = -(16/9) * -0.5.
    EXPECT_NEAR(r.dq[0], 8.0 / 9.0, 1e-15);
    EXPECT_NEAR(r.dk[0], 0.0, 1e-15);
    EXPECT_NEAR(r.dk[1], -8.0 / 9.0, 1e-15);
  }
}

// A sigma so small that 1 / sigma^2 overflows the precision (float 1e-30, double 1e-200), with the
// query on every key: each pair's coefficient a = b / sigma^2 is out of range but multiplies
// q - k = 0, so dq, dk and dsigma are exactly 0 and dv = dout / m, on the dense (p = 2, or asking
// for the weights) and the windowed (p = 1) path of the cpu backend.
template <class T>
void expect_tiny_sigma_gradients(double sigma) {
  for (const index_t p : {1, 2})
    for (const bool with_weights : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "p " << p << (with_weights ? " dense" : " windowed"));
      const Shape s{3, 1, 1, 1, 3, p, 2};
      const Problem pr{s, Tensor<double>(s.dims(1, p), std::vector<double>(p, -0.71875)),
                       Tensor<double>(s.dims(3, p), std::vector<double>(3 * p, -0.71875)),
                       Tensor<double>(s.dims(3, 2), {-0.75, 2.5, 0, -3, 3.5, 1}), Tensor<double>(s.dims(1, 2), {0.25, -2})};
      const auto r = run<T>(pr, Kernel::gaussian, sigma, Backend::cpu, with_weights);
      for (index_t x = 0; x < r.dq.numel(); ++x) EXPECT_EQ(r.dq[x], T(0)) << "dqueries " << x;
      for (index_t x = 0; x < r.dk.numel(); ++x) EXPECT_EQ(r.dk[x], T(0)) << "dkeys " << x;
      EXPECT_EQ(r.dsigma[0], T(0));
      for (index_t j = 0; j < 3; ++j) {
        EXPECT_NEAR(r.dv[2 * j], 0.25 / 3, 1e-7);
        EXPECT_NEAR(r.dv[2 * j + 1], -2.0 / 3, 1e-7);
      }
    }
}

TEST(NadarayaWatson, TinySigmaWithQueryOnTheKeysHasZeroGradients) {
  expect_tiny_sigma_gradients<float>(1e-30);
  expect_tiny_sigma_gradients<double>(1e-200);
}

// Epanechnikov in float with a key a subnormal distance from the query: a = -(g - c) / (Z sigma r)
// overflows float, a (q - k) = (g - c) / Z does not. Dense and windowed path against the float64
// reference on the same (float) inputs.
TEST(NadarayaWatson, EpanechnikovKeyAtSubnormalDistanceHasFiniteGradients) {
  const float tiny = 8 * std::numeric_limits<float>::denorm_min();
  for (const index_t p : {1, 2})
    for (const bool with_weights : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "p " << p << (with_weights ? " dense" : " windowed"));
      const Shape s{3, 1, 1, 1, 2, p, 1};
      std::vector<double> k(2 * p, 0.0);
      k[0] = tiny, k[p] = 0.5;
      const Problem pr{s, Tensor<double>(s.dims(1, p), std::vector<double>(p, 0.0)), Tensor<double>(s.dims(2, p), k),
                       Tensor<double>(s.dims(2, 1), {2, 4}), Tensor<double>(s.dims(1, 1), {1})};
      const auto got = run<float>(pr, Kernel::epanechnikov, 1.0, Backend::cpu, with_weights);
      const auto want = run<double>(pr, Kernel::epanechnikov, 1.0, Backend::reference);
      // K = (1 - tiny, 0.5), Z = 1.5, g = (2, 4), c = 8/3: key 0 adds -(g - c) / Z (q - k) / r = -4/9
      // to dq whatever r is, key 1 adds 8/9 (as in EpanechnikovAtCoincidentKeyUsesZero).
      EXPECT_NEAR(want.dq[0], 4.0 / 9.0, 1e-6);
      for (const auto& [name, g, w] : {std::tuple{"dqueries", &got.dq, &want.dq}, std::tuple{"dkeys", &got.dk, &want.dk},
                                        std::tuple{"dsigma", &got.dsigma, &want.dsigma}})
        for (index_t x = 0; x < w->numel(); ++x) EXPECT_NEAR((*g)[x], (*w)[x], 1e-6) << name << " " << x;
    }
}

// Any gradient may be left out; the others come out bit for bit the same.
TEST(NadarayaWatson, GradientsMayBeLeftOut) {
  const Problem pr = make_problem({3, 2, 1, 9, 70, 2, 3}, 77);
  const Tensor<float> q = convert<float>(pr.q), k = convert<float>(pr.k), v = convert<float>(pr.v),
                      d = convert<float>(pr.dout);
  for (const Kernel kernel : kKernels)
    for (const Backend backend : kBackends) {
      SCOPED_TRACE(::testing::Message() << kernel_name(kernel) << " " << backend_name(backend));
      const auto all = run<float>(pr, kernel, 0.8, backend);
      const ScopedBackend scoped(backend);
      Result<float> one{{}, {}, zeros<float>(pr.q.shape()), zeros<float>(pr.k.shape()), zeros<float>(pr.v.shape()),
                        zeros<float>({1})};
      const auto backward = [&](TensorView<float> dq, TensorView<float> dk, TensorView<float> dv, float* ds) {
        nadaraya_watson_backward<float>(dq, dk, dv, ds, d.cview(), q.cview(), k.cview(), v.cview(), kernel, 0.8f);
      };
      backward(one.dq.view(), {}, {}, nullptr);
      backward({}, one.dk.view(), {}, nullptr);
      backward({}, {}, one.dv.view(), nullptr);
      backward({}, {}, {}, one.dsigma.data());
      EXPECT_TRUE(bit_identical(one.dq, all.dq));
      EXPECT_TRUE(bit_identical(one.dk, all.dk));
      EXPECT_TRUE(bit_identical(one.dv, all.dv));
      EXPECT_TRUE(bit_identical(one.dsigma, all.dsigma));
    }
}

// ---- the windowed path: 1-D keys with the boxcar, Epanechnikov and truncated Gaussian kernels ------
// (src/cpu/nadaraya_watson_windowed.cpp; the cpu backend takes it for p = 1 when no weights are asked for)

constexpr Kernel kWindowed[] = {Kernel::gaussian, Kernel::boxcar, Kernel::epanechnikov};

// How the keys of a 1-D problem are laid out: ascending per group, in random order, rounded to
// multiples of 1/4 (runs of equal keys), or keys and queries both on multiples of 1/8 (so that for
// sigma = 1/4 or 1/2 many pairs lie at distance sigma exactly, in float and double alike).
enum class KeyOrder { sorted, unsorted, duplicated, grid };

// A 1-D problem (s.p must be 1): keys uniform in [klo, khi), queries in [qlo, qhi), laid out by `order`.
Problem make_1d(const Shape& s, std::uint64_t seed, KeyOrder order, double klo, double khi, double qlo, double qhi) {
  Problem pr = make_problem(s, seed);
  pr.q = random_tensor<double>(s.dims(s.n, 1), seed + 4, qlo, qhi);
  pr.k = random_tensor<double>(s.dims(s.m, 1), seed + 5, klo, khi);
  const auto round_to = [](Tensor<double>& t, double step) {
    for (index_t i = 0; i < t.numel(); ++i) t[i] = std::round(t[i] / step) * step;
  };
  if (order == KeyOrder::duplicated) round_to(pr.k, 0.25);
  if (order == KeyOrder::grid) round_to(pr.k, 0.125), round_to(pr.q, 0.125);
  if (order == KeyOrder::sorted)
    for (index_t g = 0; g < s.B * s.H; ++g) std::sort(pr.k.data() + g * s.m, pr.k.data() + (g + 1) * s.m);
  return pr;
}

// The cpu backend's windowed path against the float64 reference: float32 within 2x the float32
// reference's error, float64 within 1e-12 (relative to the largest element), for every output and
// gradient, over key layouts, boundary distances, empty windows, extreme widths, n != m, odd sizes,
// batches and heads. dsigma in float32: the worst over 8 problems of the case, as above.
TEST(NadarayaWatsonWindowed, MatchesFloat64ReferenceWithinErrorBudget) {
  struct Case {
    const char* what;
    Shape s;
    KeyOrder order;
    double klo, khi, qlo, qhi;
    std::vector<double> sigmas;
  };
  const Case cases[] = {
      {"sorted keys", {3, 2, 1, 113, 203, 1, 1}, KeyOrder::sorted, 0, 5, 0, 5, {0.1, 0.5}},
      {"unsorted keys, n != m, v = 3", {3, 3, 1, 97, 61, 1, 3}, KeyOrder::unsorted, -1, 1, -1, 1, {0.05, 0.3}},
      {"duplicated keys", {3, 2, 1, 50, 80, 1, 2}, KeyOrder::duplicated, 0, 2, 0, 2, {0.25, 0.3}},
      {"keys at distance sigma", {3, 1, 1, 64, 40, 1, 1}, KeyOrder::grid, 0, 4, 0, 4, {0.25, 0.5}},
      {"queries outside the keys", {3, 2, 1, 60, 50, 1, 1}, KeyOrder::unsorted, 0, 1, -3, 4, {0.2}},
      {"tiny and huge sigma", {3, 2, 1, 31, 47, 1, 2}, KeyOrder::unsorted, 0, 5, 0, 5, {1e-4, 1e3}},
      {"heads (rank 4)", {4, 2, 3, 17, 31, 1, 4}, KeyOrder::unsorted, -1, 1, -1, 1, {0.1, 0.5}},
  };
  std::uint64_t seed = 3000;
  for (const Case& c : cases)
    for (const Kernel kernel : kWindowed)
      for (const double sigma : c.sigmas) {
        SCOPED_TRACE(::testing::Message() << c.what << ": " << kernel_name(kernel) << " sigma " << sigma);
        const Problem pr = make_1d(c.s, seed += 10, c.order, c.klo, c.khi, c.qlo, c.qhi);
        const auto oracle = run<double>(pr, kernel, sigma, Backend::reference);
        const auto base = run<float>(pr, kernel, sigma, Backend::reference);
        const auto f32 = run<float>(pr, kernel, sigma, Backend::cpu, false);
        const auto f64 = run<double>(pr, kernel, sigma, Backend::cpu, false);
        const std::pair<const char*, Tensor<double> Result<double>::*> names[] = {
            {"out", &Result<double>::out}, {"dqueries", &Result<double>::dq}, {"dkeys", &Result<double>::dk},
            {"dvalues", &Result<double>::dv}, {"dsigma", &Result<double>::dsigma}};
        const Tensor<float>* got32[] = {&f32.out, &f32.dq, &f32.dk, &f32.dv};
        const Tensor<float>* ref32[] = {&base.out, &base.dq, &base.dk, &base.dv};
        for (std::size_t i = 0; i < 5; ++i) {
          SCOPED_TRACE(names[i].first);
          const Tensor<double>& want = oracle.*names[i].second;
          if (i < 4) {
            EXPECT_TRUE(testing::within_error_budget(*got32[i], *ref32[i], want));
          }
          EXPECT_LE(max_abs_diff(f64.*names[i].second, want), 1e-12 * (1 + max_abs(want)));
        }
        const auto ds = [&]<class T>(T, Backend backend) {
          const ScopedBackend scoped(backend);
          Tensor<T> out({8});
          for (int r = 0; r < 8; ++r) {
            const Problem p8 = make_1d(c.s, seed * 100 + 10 * r, c.order, c.klo, c.khi, c.qlo, c.qhi);
            const Tensor<T> q = convert<T>(p8.q), k = convert<T>(p8.k), v = convert<T>(p8.v), d = convert<T>(p8.dout);
            nadaraya_watson_backward<T>({}, {}, {}, &out[r], d.cview(), q.cview(), k.cview(), v.cview(), kernel,
                                        T(sigma));
          }
          return out;
        };
        EXPECT_TRUE(testing::within_error_budget(ds(0.0f, Backend::cpu), ds(0.0f, Backend::reference),
                                                 ds(0.0, Backend::reference)))
            << "dsigma over 8 problems";
      }
}

// The windowed path against the dense cpu path (attn::cpu::dense) on the same float64 inputs: the
// same support (the same test in the same precision), so the two differ only by rounding and by the
// Gaussian's truncation.
TEST(NadarayaWatsonWindowed, MatchesDensePath) {
  using attn::detail::to_view4;
  const Shape s{4, 2, 2, 300, 500, 1, 2};
  for (const Kernel kernel : kWindowed)
    for (const double sigma : {0.02, 0.3}) {
      SCOPED_TRACE(::testing::Message() << kernel_name(kernel) << " sigma " << sigma);
      const Problem pr = make_1d(s, 77, KeyOrder::unsorted, 0, 5, -0.5, 5.5);
      const auto got = run<double>(pr, kernel, sigma, Backend::cpu, false);
      Result<double> want{zeros<double>(pr.s.dims(s.n, s.v)), {}, zeros<double>(pr.q.shape()),
                          zeros<double>(pr.k.shape()), zeros<double>(pr.v.shape()), zeros<double>({1})};
      const auto in = [](const Tensor<double>& t) { return to_view4(t.cview(), "test", "in"); };
      const auto out = [](Tensor<double>& t) { return to_view4(t.view(), "test", "out"); };
      cpu::dense::nw_forward<double>(out(want.out), {}, in(pr.q), in(pr.k), in(pr.v), kernel, sigma);
      cpu::dense::nw_backward<double>(out(want.dq), out(want.dk), out(want.dv), want.dsigma.data(), in(pr.dout),
                                      in(pr.q), in(pr.k), in(pr.v), kernel, sigma);
      for (const auto& [name, a, b] : {std::tuple{"out", &got.out, &want.out}, std::tuple{"dq", &got.dq, &want.dq},
                                       std::tuple{"dk", &got.dk, &want.dk}, std::tuple{"dv", &got.dv, &want.dv},
                                       std::tuple{"dsigma", &got.dsigma, &want.dsigma}})
        EXPECT_LE(max_abs_diff(*a, *b), 1e-12 * (1 + max_abs(*b))) << name;
      EXPECT_GT(max_abs(want.dv), 1e-3);  // the values' gradient is exercised
      if (kernel == Kernel::boxcar) {
        // Piecewise constant weights (attn/nadaraya_watson.hpp): no gradient of queries, keys or
        // sigma on either path, exactly.
        const Result<double>* const paths[] = {&got, &want};
        for (const Result<double>* r : paths) {
          EXPECT_EQ(max_abs(r->dq), 0.0);
          EXPECT_EQ(max_abs(r->dk), 0.0);
          EXPECT_EQ(r->dsigma[0], 0.0);
        }
      } else {
        EXPECT_GT(max_abs(want.dq), 1e-3);  // the gradients are exercised
      }
    }
}

// A query farther than sigma from every key has an empty window: out 0 and no gradient, while the
// gradients of the keys equal those of the other query alone (windowed forward and backward).
TEST(NadarayaWatsonWindowed, EmptyWindowsOutputZero) {
  const Tensor<double> keys({1, 4, 1}, {3, 0, 2, 1}), values({1, 4, 2}, {30, 31, 0, 1, 20, 21, 10, 11});
  const Problem both{{3, 1, 1, 3, 4, 1, 2}, Tensor<double>({1, 3, 1}, {-7, 1.2, 100}), keys, values,
                     Tensor<double>({1, 3, 2}, {4, 4, 0.5, -1, 2, 3})};
  const Problem middle{{3, 1, 1, 1, 4, 1, 2}, Tensor<double>({1, 1, 1}, {1.2}), keys, values,
                       Tensor<double>({1, 1, 2}, {0.5, -1})};
  for (const Kernel kernel : {Kernel::boxcar, Kernel::epanechnikov}) {
    SCOPED_TRACE(kernel_name(kernel));
    const auto r = run<double>(both, kernel, 1.0, Backend::cpu, false);
    const auto r1 = run<double>(middle, kernel, 1.0, Backend::cpu, false);
    for (const index_t i : {0, 2}) {
      EXPECT_EQ(r.out(0, i, 0), 0.0);
      EXPECT_EQ(r.out(0, i, 1), 0.0);
      EXPECT_EQ(r.dq(0, i, 0), 0.0);
    }
    EXPECT_EQ(r.out(0, 1, 0), r1.out(0, 0, 0));
    EXPECT_NE(r.out(0, 1, 0), 0.0);
    EXPECT_EQ(max_abs_diff(r.dk, r1.dk), 0.0);
    EXPECT_EQ(max_abs_diff(r.dv, r1.dv), 0.0);
    EXPECT_EQ(r.dsigma[0], r1.dsigma[0]);
  }
}

// The truncation stated in nadaraya_watson_windowed.cpp: keys whose exponent a exceeds
// A = ln(4 m / eps) are dropped, and the output moves by less than eps / 2 of the largest |value|.
// One key at the query (value 0, weight 1) and m - 1 keys of value 1 at a = A (1 + delta): just
// beyond the cutoff they are dropped (out exactly 0) while the float64 reference gives
// (m - 1) e^-a / (1 + (m - 1) e^-a), about eps / 4; just inside it they are kept.
template <class T>
void expect_truncation_as_stated() {
  const index_t m = 1000;
  const double eps = std::numeric_limits<T>::epsilon();
  const double A = cpu::windowed::gaussian_cutoff<T>(m);
  EXPECT_DOUBLE_EQ(A, std::log(4.0 * m / eps));
  for (const double delta : {1e-3, -1e-3}) {
    SCOPED_TRACE(::testing::Message() << "a = A (1 + " << delta << ")");
    const double r = std::sqrt(2 * A * (1 + delta));  // distance at sigma = 1
    Problem pr{{3, 1, 1, 1, m, 1, 1}, Tensor<double>({1, 1, 1}, {0}), Tensor<double>({1, m, 1}),
               Tensor<double>({1, m, 1}), Tensor<double>({1, 1, 1}, {1})};
    for (index_t j = 1; j < m; ++j) pr.k[j] = static_cast<double>(static_cast<T>(j % 2 ? r : -r)), pr.v[j] = 1;
    const auto got = run<T>(pr, Kernel::gaussian, 1.0, Backend::cpu, false);
    const auto want = run<double>(pr, Kernel::gaussian, 1.0, Backend::reference);
    const double error = std::abs(static_cast<double>(got.out[0]) - want.out[0]);
    EXPECT_LT(error, eps / 2);  // the stated bound, max |v| = 1
    if (delta > 0) {
      EXPECT_EQ(got.out[0], T(0));  // every far key was dropped
      EXPECT_GT(want.out[0], eps / 8);  // and what they carried was not negligible at this bound
    } else {
      EXPECT_LT(error, 0.01 * want.out[0]);  // kept: what remains is rounding
    }
  }
}

TEST(NadarayaWatsonWindowed, GaussianTruncationIsAsStated) {
  expect_truncation_as_stated<float>();
  expect_truncation_as_stated<double>();
}

// The windowed path visits the pairs of its windows only: for the boxcar exactly the pairs inside
// the support (counted here by brute force in float), and for compact and truncated kernels alike
// far fewer than n m when sigma is small against the keys' range.
TEST(NadarayaWatsonWindowed, VisitsFarFewerPairsThanDense) {
  const Shape s{3, 2, 1, 2000, 2000, 1, 1};
  const Problem pr = make_1d(s, 5, KeyOrder::unsorted, 0, 5, 0, 5);
  const Tensor<float> q = convert<float>(pr.q), k = convert<float>(pr.k);
  const auto q4 = q.cview(), k4 = k.cview();
  const float sigma = 0.05f;
  double inside = 0;
  for (index_t i = 0; i < s.B * s.n; ++i) {
    const index_t g = i / s.n;
    for (index_t j = 0; j < s.m; ++j) {
      const float d = q[i] - k[g * s.m + j];
      inside += std::sqrt(d * d) / sigma <= 1;
    }
  }
  const double dense = static_cast<double>(s.B * s.n * s.m);
  EXPECT_EQ(nadaraya_watson_visited_pairs<float>(q4, k4, Kernel::boxcar, sigma), inside);
  EXPECT_LE(nadaraya_watson_visited_pairs<float>(q4, k4, Kernel::epanechnikov, sigma), inside);
  const double gaussian = nadaraya_watson_visited_pairs<float>(q4, k4, Kernel::gaussian, sigma);
  EXPECT_LT(gaussian, dense / 5) << "visited " << gaussian << " of " << dense;
  EXPECT_LT(inside, dense / 20);
  EXPECT_EQ(nadaraya_watson_visited_pairs<float>(q4, k4, Kernel::constant, sigma), -1);  // dense
}

// Queries or keys that are not finite cannot be ordered: such calls take the dense path and give
// what it gives (bit for bit, NaN included). No key at all (m = 0): every row is empty, out 0.
TEST(NadarayaWatsonWindowed, NonFiniteInputsAndNoKeysAreHandledLikeTheDensePath) {
  using attn::detail::to_view4;
  const Problem finite = make_1d({3, 1, 1, 5, 6, 1, 1}, 8, KeyOrder::unsorted, 0, 1, 0, 1);
  Problem nan_query = finite, inf_key = finite;
  nan_query.q[2] = std::numeric_limits<double>::quiet_NaN();
  inf_key.k[3] = std::numeric_limits<double>::infinity();
  const auto same_bits = [](const Tensor<double>& a, const Tensor<double>& b) {
    return std::memcmp(a.data(), b.data(), sizeof(double) * a.numel()) == 0;
  };
  for (const Problem* pr : {&nan_query, &inf_key})
    for (const Kernel kernel : kWindowed) {
      SCOPED_TRACE(::testing::Message() << kernel_name(kernel) << (pr == &nan_query ? " NaN query" : " inf key"));
      const auto got = run<double>(*pr, kernel, 0.3, Backend::cpu, false);
      Tensor<double> out = zeros<double>(pr->s.dims(pr->s.n, pr->s.v));
      cpu::dense::nw_forward<double>(to_view4(out.view(), "t", "o"), {}, to_view4(pr->q.cview(), "t", "q"),
                                     to_view4(pr->k.cview(), "t", "k"), to_view4(pr->v.cview(), "t", "v"), kernel,
                                     0.3);
      EXPECT_TRUE(same_bits(got.out, out));
    }
  // The forward only: src/api refuses empty (B, 0, C) gradients as outputs that broadcast or share
  // memory with the (empty) keys.
  const Tensor<double> q = random_tensor<double>({2, 4, 1}, 1), k({2, 0, 1}), v({2, 0, 3});
  for (const Kernel kernel : kWindowed) {
    Tensor<double> out = random_tensor<double>({2, 4, 3}, 2);
    const ScopedBackend cpu(Backend::cpu);
    nadaraya_watson_forward<double>(out.view(), {}, q.cview(), k.cview(), v.cview(), kernel, 0.3);
    EXPECT_EQ(max_abs(out), 0.0) << kernel_name(kernel);
  }
}

// Fixed chunks of queries (pass 1) and of sorted keys (pass 2): bit-identical at 1 and 2 threads,
// on problems large enough for a team of threads and several chunks.
TEST(NadarayaWatsonWindowed, SameAtOneAndTwoThreads) {
  const Problem pr = make_1d({3, 2, 1, 3001, 2500, 1, 2}, 21, KeyOrder::unsorted, 0, 5, -0.2, 5.2);
  for (const Kernel kernel : kWindowed)
    for (const double sigma : {0.05, 0.5}) {
      SCOPED_TRACE(::testing::Message() << kernel_name(kernel) << " sigma " << sigma);
      testing::expect_same_at_1_and_2_threads<float>([&] {
        const auto r = run<float>(pr, kernel, sigma, Backend::cpu, false);
        return std::vector<Tensor<float>>{r.out, r.dq, r.dk, r.dv, r.dsigma};
      });
    }
}

// The Gaussian where the weights underflow or the squared distances overflow: a width so small that
// every key but the nearest weighs exp(-1e199), and queries so far from the keys that (q - k)^2 is
// past T's largest value. The softmax then puts all its weight on the nearest key (half on each of
// two equally near), on both paths (windowed, and dense when the weights are asked for) and every
// target. (The windowed path once gave NaN or 0 here on the FMA targets: (q - k)^2 - d2_min was fused
// into one FMA, leaving the product's rounding error over sigma^2; the far queries gave inf - inf.)
template <class T>
void expect_gaussian_limits(T tiny, T far) {
  const auto values = [](const Tensor<T>& t) { return std::vector<T>(t.values().begin(), t.values().end()); };
  const Tensor<T> k({1, 3, 1}, std::vector<T>{0, 1, 2}), v({1, 3, 1}, std::vector<T>{1, 2, 3});
  const Tensor<T> near_q({1, 3, 1}, std::vector<T>{T(0.4), T(0.6), T(1.5)});
  const Tensor<T> far_q({1, 4, 1}, std::vector<T>{far, -far, std::numeric_limits<T>::max(), -std::numeric_limits<T>::max()});
  for (const bool weights : {false, true}) {
    SCOPED_TRACE(weights ? "dense (weights asked for)" : "windowed");
    const ScopedBackend cpu(Backend::cpu);
    Tensor<T> out({1, 3, 1}), w({1, 3, 3}), far_out({1, 4, 1}), far_w({1, 4, 3});
    nadaraya_watson_forward<T>(out.view(), weights ? w.view() : TensorView<T>(), near_q.cview(), k.cview(), v.cview(),
                               Kernel::gaussian, tiny);
    EXPECT_EQ(values(out), (std::vector<T>{1, 2, T(2.5)}));
    nadaraya_watson_forward<T>(far_out.view(), weights ? far_w.view() : TensorView<T>(), far_q.cview(), k.cview(),
                               v.cview(), Kernel::gaussian, T(0.5));
    EXPECT_EQ(values(far_out), (std::vector<T>{3, 1, 3, 1}));
    if (weights) EXPECT_EQ(values(far_w), (std::vector<T>{0, 0, 1, 1, 0, 0, 0, 0, 1, 1, 0, 0}));
  }
  // The far rows' output is the nearest key's value whatever q, k or sigma do nearby: no gradient
  // but dv, the output gradient on the nearest key.
  const Tensor<T> dout({1, 4, 1}, std::vector<T>{1, 10, 100, 1000});
  Tensor<T> dq({1, 4, 1}), dk({1, 3, 1}), dv({1, 3, 1});
  T dsigma = -1;
  const ScopedBackend cpu(Backend::cpu);
  nadaraya_watson_backward<T>(dq.view(), dk.view(), dv.view(), &dsigma, dout.cview(), far_q.cview(), k.cview(), v.cview(),
                              Kernel::gaussian, T(0.5));
  EXPECT_EQ(values(dq), (std::vector<T>{0, 0, 0, 0}));
  EXPECT_EQ(values(dk), (std::vector<T>{0, 0, 0}));
  EXPECT_EQ(values(dv), (std::vector<T>{1010, 0, 101}));
  EXPECT_EQ(dsigma, T(0));
}

// A NaN query makes its row NaN, out and weights, and a NaN key every row's, as a NaN score does
// PyTorch's softmax, for every kernel whose weights read distances (found by probing: a NaN query
// took the Gaussian's limit of overflowing distances, the values' mean 25; the boxcar and the
// Epanechnikov dropped a NaN key and returned the others' average). The constant kernel reads no
// distance. Other rows are untouched.
TEST(NadarayaWatson, NaNQueryOrKeyMakesItsRowsNaN) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor<double> v({1, 4, 1}, std::vector<double>{10, 20, 30, 40});
  const Tensor<double> k({1, 4, 1}, std::vector<double>{0, 1, 2, 3}), q({1, 2, 1}, std::vector<double>{nan, 1.2});
  Tensor<double> k_nan = k;
  k_nan[1] = nan;
  const Tensor<double> q_fine({1, 2, 1}, std::vector<double>{0.5, 1.2});
  for (const Kernel kernel : kKernels) {
    SCOPED_TRACE(kernel_name(kernel));
    const bool reads_distances = kernel != Kernel::constant;
    Tensor<double> out({1, 2, 1}), weights({1, 2, 4}), fine({1, 2, 1}), fine_weights({1, 2, 4});
    nadaraya_watson_forward<double>(out.view(), weights.view(), q.cview(), k.cview(), v.cview(), kernel, 2.5);
    nadaraya_watson_forward<double>(fine.view(), fine_weights.view(), q_fine.cview(), k.cview(), v.cview(), kernel, 2.5);
    EXPECT_EQ(std::isnan(out[0]), reads_distances) << out[0];
    for (index_t j = 0; j < 4; ++j) EXPECT_EQ(std::isnan(weights(0, 0, j)), reads_distances) << j;
    EXPECT_EQ(out[1], fine[1]) << "the other row";
    nadaraya_watson_forward<double>(out.view(), weights.view(), q_fine.cview(), k_nan.cview(), v.cview(), kernel, 2.5);
    for (index_t i = 0; i < 2; ++i) {
      EXPECT_EQ(std::isnan(out[i]), reads_distances) << i;
      for (index_t j = 0; j < 4; ++j) EXPECT_EQ(std::isnan(weights(0, i, j)), reads_distances) << i << ", " << j;
    }
  }
}

TEST(NadarayaWatson, GaussianAtATinyWidthOrFarFromTheKeysIsTheNearestKeysValue) {
  expect_gaussian_limits<float>(1e-10f, 1e20f);
  expect_gaussian_limits<double>(1e-100, 1e155);
}

// ---- kernel names --------------------------------------------------------------------------------

TEST(NadarayaWatson, KernelNamesRoundTrip) {
  for (const Kernel kernel : kKernels) EXPECT_EQ(kernel_from_name(kernel_name(kernel)), kernel);
  EXPECT_STREQ(kernel_name(Kernel::epanechnikov), "epanechnikov");
}

// ---- argument checks -----------------------------------------------------------------------------

// A valid call, which each test below breaks in one way.
struct Call {
  Tensor<double> q{2, 10, 2}, k{2, 10, 2}, v{2, 10, 4}, out{2, 10, 4}, w{2, 10, 10};
  Tensor<double> dq{2, 10, 2}, dk{2, 10, 2}, dv{2, 10, 4}, dout{2, 10, 4};
  Kernel kernel = Kernel::gaussian;
  double sigma = 1.0, ds = 0;  // ds: the backward's dsigma

  void forward() {
    nadaraya_watson_forward<double>(out.view(), w.view(), q.cview(), k.cview(), v.cview(), kernel, sigma);
  }
  void backward() {
    nadaraya_watson_backward<double>(dq.view(), dk.view(), dv.view(), &ds, dout.cview(), q.cview(), k.cview(),
                                     v.cview(), kernel, sigma);
  }
};

// The valid call computes what the Gaussian estimator's formula gives (the d2l chapter's softmax
// form, written out here in float64): w_ij = softmax_j(-||q_i - k_j||^2 / (2 sigma^2)), out_i =
// sum_j w_ij v_j, with sigma = 0.7; its gradients are the float64 reference's.
TEST(NadarayaWatson, ValidCallPasses) {
  const ScopedBackend cpu(Backend::cpu);
  Call c;
  c.q = random_tensor<double>({2, 10, 2}, 730), c.k = random_tensor<double>({2, 10, 2}, 731);
  c.v = random_tensor<double>({2, 10, 4}, 732), c.dout = random_tensor<double>({2, 10, 4}, 733);
  c.sigma = 0.7;
  c.forward();
  for (index_t b = 0; b < 2; ++b)
    for (index_t i = 0; i < 10; ++i) {
      std::vector<double> s(10);
      for (index_t j = 0; j < 10; ++j) {
        const double d0 = c.q(b, i, 0) - c.k(b, j, 0), d1 = c.q(b, i, 1) - c.k(b, j, 1);
        s[static_cast<std::size_t>(j)] = -(d0 * d0 + d1 * d1) / (2 * 0.7 * 0.7);
      }
      const double top = *std::max_element(s.begin(), s.end());
      double sum = 0;
      for (double& x : s) sum += (x = std::exp(x - top));
      for (index_t j = 0; j < 10; ++j) EXPECT_NEAR(c.w(b, i, j), s[static_cast<std::size_t>(j)] / sum, 1e-14) << b << "," << i << "," << j;
      for (index_t e = 0; e < 4; ++e) {
        double want = 0;
        for (index_t j = 0; j < 10; ++j) want += s[static_cast<std::size_t>(j)] / sum * c.v(b, j, e);
        EXPECT_NEAR(c.out(b, i, e), want, 1e-14) << b << "," << i << "," << e;
      }
    }
  c.backward();
  const Problem pr{{3, 2, 1, 10, 10, 2, 4}, c.q, c.k, c.v, c.dout};
  const Result<double> want = run<double>(pr, Kernel::gaussian, 0.7, Backend::reference);
  EXPECT_LE(max_abs_diff(c.dq, want.dq), 1e-12);
  EXPECT_LE(max_abs_diff(c.dk, want.dk), 1e-12);
  EXPECT_LE(max_abs_diff(c.dv, want.dv), 1e-12);
  EXPECT_NEAR(c.ds, want.dsigma[0], 1e-12 * (1 + std::abs(want.dsigma[0])));
}

TEST(NadarayaWatson, RejectsZeroSigma) {
  Call c;
  c.sigma = 0;
  expect_error([&] { c.forward(); }, {"nadaraya_watson_forward: width sigma is 0; it must be positive and finite"});
  expect_error([&] { c.backward(); }, {"nadaraya_watson_backward: width sigma is 0"});
}
TEST(NadarayaWatson, RejectsNegativeSigma) {
  Call c;
  c.sigma = -1;
  expect_error([&] { c.forward(); }, {"width sigma is -1;"});
}
TEST(NadarayaWatson, RejectsNaNSigma) {
  Call c;
  c.sigma = NAN;
  expect_error([&] { c.forward(); }, {"width sigma is nan;"});
}
TEST(NadarayaWatson, RejectsInfiniteSigma) {
  Call c;
  c.sigma = INFINITY;
  expect_error([&] { c.forward(); }, {"width sigma is inf;"});
}

TEST(NadarayaWatson, RejectsMismatchedFeatureSize) {
  Call c;
  c.k = Tensor<double>{2, 10, 3};
  try {
    c.forward();
    ADD_FAILURE() << "no attn::Error was thrown";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "nadaraya_watson_forward: keys has shape (2,10,3) but must be (2,10,2): queries and keys "
                           "must have the same feature size");
  }
}

TEST(NadarayaWatson, RejectsMismatchedKeyCount) {
  Call c;
  c.v = Tensor<double>{2, 9, 4};
  expect_error([&] { c.forward(); }, {"values has shape (2,9,4) but must be (2,10,4)", "same number of rows m"});
}

TEST(NadarayaWatson, RejectsMismatchedBatch) {
  Call c;
  c.k = Tensor<double>{3, 10, 2};
  expect_error([&] { c.forward(); }, {"keys has shape (3,10,2) but must be (2,10,2)", "batch size of queries"});
}

TEST(NadarayaWatson, RejectsWrongRanks) {
  Call c;
  c.q = Tensor<double>{10, 2};
  expect_error([&] { c.forward(); }, {"queries has shape (10,2); it must have 3 to 4 dimensions"});
  Call mixed;
  mixed.k = Tensor<double>{2, 1, 10, 2};
  expect_error([&] { mixed.forward(); }, {"keys has shape (2,1,10,2)", "the same rank"});
}

TEST(NadarayaWatson, RejectsWrongOutShape) {
  Call c;
  c.out = Tensor<double>{2, 10, 3};
  expect_error([&] { c.forward(); }, {"out has shape (2,10,3) but must be (2,10,4)"});
  Call none;
  expect_error([&] { nadaraya_watson_forward<double>({}, {}, none.q.cview(), none.k.cview(), none.v.cview(),
                                                     Kernel::gaussian, 1.0); },
               {"out is required"});
}

TEST(NadarayaWatson, RejectsWrongWeightsShape) {
  Call c;
  c.w = Tensor<double>{2, 10, 9};
  expect_error([&] { c.forward(); }, {"weights has shape (2,10,9) but must be (2,10,10)"});
}

TEST(NadarayaWatson, RejectsWrongGradientShapes) {
  Call c;
  c.dk = Tensor<double>{2, 10, 3};
  expect_error([&] { c.backward(); }, {"nadaraya_watson_backward: dkeys has shape (2,10,3) but must be (2,10,2)"});
  Call d;
  d.dout = Tensor<double>{2, 9, 4};
  expect_error([&] { d.backward(); }, {"dout has shape (2,9,4) but must be (2,10,4)"});
}

TEST(NadarayaWatson, RejectsOutputSharingMemoryWithAnInput) {
  Call c;  // out has the shape of values; dqueries that of queries
  expect_error([&] { nadaraya_watson_forward<double>(c.out.view(), {}, c.q.cview(), c.k.cview(), c.out.cview(),
                                                     Kernel::gaussian, 1.0); },
               {"nadaraya_watson_forward: out and values share memory", "an output must be a buffer of its own"});
  expect_error([&] { nadaraya_watson_backward<double>(c.q.view(), {}, {}, nullptr, c.dout.cview(), c.q.cview(),
                                                      c.k.cview(), c.v.cview(), Kernel::gaussian, 1.0); },
               {"nadaraya_watson_backward: dqueries and queries share memory"});
}

TEST(NadarayaWatson, RejectsBroadcastOutput) {
  Call c;
  const TensorView<double> broadcast(c.out.data(), {2, 10, 4}, {0, 4, 1});
  expect_error([&] { nadaraya_watson_forward<double>(broadcast, {}, c.q.cview(), c.k.cview(), c.v.cview(),
                                                     Kernel::gaussian, 1.0); },
               {"out has stride 0 in dimension 0; an output must not broadcast"});
}

TEST(NadarayaWatson, RejectsUnknownKernel) {
  expect_error([] { kernel_from_name("triangle"); },
               {"unknown kernel \"triangle\"", "gaussian, boxcar, epanechnikov, constant"});
  Call c;
  c.kernel = static_cast<Kernel>(9);
  expect_error([&] { c.forward(); }, {"kernel 9 is not a Kernel"});
}

}  // namespace
}  // namespace attn
