#include "support/testing.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <random>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "attn/diagnostics.hpp"

// ThreadSanitizer builds (ATTN_TSAN): the OpenMP runtime's own code is not instrumented; its
// synchronisation reaches TSan through the Archer tool linked into the tests (tests/CMakeLists.txt),
// and its internals are left out of the reports, as Archer asks.
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
extern "C" const char* __tsan_default_options() { return "ignore_noninstrumented_modules=1"; }
extern "C" int attn_tsan_options_linked = 1;  // what the test programs' link pulls this object in by
#endif
#endif

namespace attn::testing {
namespace {

// ATTN_SIMD_TARGET names the SIMD target a test run is for (tests/CMakeLists.txt). When this CPU
// cannot run it, the whole executable exits with 77, which CTest reports as skipped.
const bool simd_target_available = [] {
  const char* want = std::getenv("ATTN_SIMD_TARGET");
  if (want == nullptr || *want == '\0') return true;
  for (const std::string& t : simd_targets())
    if (t == want) return true;
  std::fprintf(stderr, "ATTN_SIMD_TARGET=%s: this CPU cannot run it; skipping\n", want);
  std::exit(77);
}();

// The proof that a run for ATTN_SIMD_TARGET ran that target and no other: when the tests end, the
// targets the fused kernels recorded (on every thread) must be the named one alone. A test that
// switches targets itself (test_simd_dispatch) is not run under ATTN_SIMD_TARGET.
class RanTheNamedTarget : public ::testing::Environment {
 public:
  void TearDown() override {
    const char* want = std::getenv("ATTN_SIMD_TARGET");
    if (want == nullptr || *want == '\0') return;
    for (const std::string& ran : simd_targets_ran())
      EXPECT_EQ(ran, want) << "a kernel ran " << ran << " under ATTN_SIMD_TARGET=" << want;
  }
};
[[maybe_unused]] ::testing::Environment* const ran_the_named_target =
    ::testing::AddGlobalTestEnvironment(new RanTheNamedTarget);

}  // namespace

template <class T>
Tensor<T> random_tensor(const std::vector<index_t>& shape, std::uint64_t seed, double lo, double hi) {
  Tensor<T> t{std::span<const index_t>(shape)};
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  for (index_t i = 0; i < t.numel(); ++i) t[i] = static_cast<T>(dist(gen));
  return t;
}

template <class T>
Tensor<T> random_tensor(std::initializer_list<index_t> shape, std::uint64_t seed, double lo, double hi) {
  return random_tensor<T>(std::vector<index_t>(shape), seed, lo, hi);
}

template <class A, class B>
double max_abs_diff(const Tensor<A>& a, const Tensor<B>& b) {
  if (a.shape() != b.shape()) {
    ADD_FAILURE() << "shapes differ: " << a.shape_string() << " vs " << b.shape_string();
    return INFINITY;
  }
  double worst = 0;
  for (index_t i = 0; i < a.numel(); ++i) {
    if (static_cast<double>(a[i]) == static_cast<double>(b[i])) continue;  // equal, infinities included
    const double d = std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    if (std::isnan(d)) return INFINITY;
    worst = std::max(worst, d);
  }
  return worst;
}

template <class A, class B>
::testing::AssertionResult within_error_budget(const Tensor<A>& tested, const Tensor<B>& same_precision_ref,
                                               const Tensor<double>& oracle, double factor, double floor) {
  const double err = max_abs_diff(tested, oracle);
  const double ref_err = max_abs_diff(same_precision_ref, oracle);
  const double budget = factor * ref_err + floor;
  if (err <= budget) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "error " << err << " against float64 exceeds the budget " << budget << " ("
                                       << factor << " x same-precision reference error " << ref_err << " + "
                                       << floor << ")";
}

std::string temp_path(const std::string& name) {
  // The paths handed out, removed when the test process exits.
  struct Handed {
    std::vector<std::string> paths;
    ~Handed() {
      for (const std::string& p : paths) std::remove(p.c_str());
    }
  };
  static Handed handed;
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string file = "attn_" + std::to_string(::getpid()) + "_";
  if (info != nullptr) file += std::string(info->test_suite_name()) + "." + info->name() + "_";
  file += name;
  // Typed and parameterized suites name themselves "Suite/0": no directories in the file name.
  std::replace(file.begin(), file.end(), '/', '_');
  handed.paths.push_back(::testing::TempDir() + file);
  return handed.paths.back();
}

std::vector<double> numeric_gradient(const std::function<double()>& loss, std::span<double> x, double eps) {
  std::vector<double> g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + eps;
    const double up = loss();
    x[i] = saved - eps;
    const double down = loss();
    x[i] = saved;
    g[i] = (up - down) / (2 * eps);
  }
  return g;
}

double gradient_error(std::span<const double> analytic, std::span<const double> numeric, std::string* where) {
  double worst = analytic.size() == numeric.size() ? 0.0 : INFINITY;
  for (std::size_t i = 0; i < std::min(analytic.size(), numeric.size()); ++i) {
    const double e = std::abs(analytic[i] - numeric[i]) / std::max(1.0, std::abs(numeric[i]));
    if (!(e <= worst)) {
      worst = std::isnan(e) ? INFINITY : e;
      if (where) {
        std::ostringstream os;
        os << "element " << i << ": analytic " << analytic[i] << ", finite difference " << numeric[i];
        *where = os.str();
      }
    }
  }
  return worst;
}

double dot(const Tensor<double>& out, const Tensor<double>& weight) {
  double s = 0;
  for (index_t i = 0; i < out.numel(); ++i) s += out[i] * weight[i];
  return s;
}

#define ATTN_INSTANTIATE(T)                                                                                   \
  template Tensor<T> random_tensor<T>(const std::vector<index_t>&, std::uint64_t, double, double);            \
  template Tensor<T> random_tensor<T>(std::initializer_list<index_t>, std::uint64_t, double, double);          \
  template double max_abs_diff<T, double>(const Tensor<T>&, const Tensor<double>&);                          \
  template ::testing::AssertionResult within_error_budget<T, T>(const Tensor<T>&, const Tensor<T>&,           \
                                                                const Tensor<double>&, double, double);
ATTN_INSTANTIATE(float)
ATTN_INSTANTIATE(double)
template double max_abs_diff<float, float>(const Tensor<float>&, const Tensor<float>&);
#undef ATTN_INSTANTIATE

}  // namespace attn::testing
