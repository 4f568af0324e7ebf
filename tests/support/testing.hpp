// Helpers shared by the tests: seeded random tensors, the error-budget rule, finite differences.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>

#include "attn/config.hpp"
#include "attn/half.hpp"
#include "attn/memory.hpp"
#include "attn/tensor.hpp"

namespace attn::testing {

// Uniform values in [lo, hi) from a fixed seed (std::mt19937_64), for any float type.
template <class T>
Tensor<T> random_tensor(std::initializer_list<index_t> shape, std::uint64_t seed, double lo = -1.0, double hi = 1.0);
template <class T>
Tensor<T> random_tensor(const std::vector<index_t>& shape, std::uint64_t seed, double lo = -1.0, double hi = 1.0);

// The same values in another precision.
template <class To, class From>
Tensor<To> convert(const Tensor<From>& t) {
  Tensor<To> r(std::span<const index_t>(t.shape()));
  for (index_t i = 0; i < t.numel(); ++i) r[i] = static_cast<To>(t[i]);
  return r;
}

// float32 values rounded to a 16-bit type H (attn/half.hpp's scalar conversions), the 16-bit values
// as float32, and the two in turn: the values a 16-bit call sees.
template <class H>
Tensor<H> to_half(const Tensor<float>& t) {
  Tensor<H> h(std::span<const index_t>(t.shape()));
  for (index_t i = 0; i < t.numel(); ++i) {
    if constexpr (std::is_same_v<H, bfloat16>) {
      h[i] = to_bfloat16(t[i]);
    } else {
      h[i] = to_float16(t[i]);
    }
  }
  return h;
}
template <class H>
Tensor<float> to_single(const Tensor<H>& t) {
  Tensor<float> f(std::span<const index_t>(t.shape()));
  for (index_t i = 0; i < t.numel(); ++i) f[i] = to_float(t[i]);
  return f;
}
template <class H>
Tensor<float> rounded(const Tensor<float>& t) {
  return to_single(to_half<H>(t));
}

// max |a - b| over all elements; the shapes must match (checked).
template <class A, class B>
double max_abs_diff(const Tensor<A>& a, const Tensor<B>& b);

// The error-budget rule of STYLE.md (from flash-attention's tests): the tested result may be off the
// float64 oracle by at most `factor` times the error of the same-precision reference, plus `floor`
// for outputs the reference happens to get exactly right.
template <class A, class B>
::testing::AssertionResult within_error_budget(const Tensor<A>& tested, const Tensor<B>& same_precision_ref,
                                               const Tensor<double>& oracle, double factor = 2.0,
                                               double floor = 1e-6);

// A path in the test temporary directory for a file `name`, unique to the process and the test (its
// suite and name), removed when the process exits: ctest runs each test in a process of its own, two
// at a time, so a name shared by two tests is raced for (a test once read the SVG another was
// writing).
std::string temp_path(const std::string& name);

// Central finite differences of a scalar loss with respect to every element of `x`, in float64.
std::vector<double> numeric_gradient(const std::function<double()>& loss, std::span<double> x,
                                     double eps = 1e-6);

// Checks an analytic gradient against numeric_gradient; returns the worst relative error
// |g - fd| / max(1, |fd|) and names the worst element in `where`.
double gradient_error(std::span<const double> analytic, std::span<const double> numeric, std::string* where);

// sum(out * weight): the loss whose gradient with respect to out is `weight`.
double dot(const Tensor<double>& out, const Tensor<double>& weight);

// Runs `run` (a generic lambda `[&]<class T>() -> std::vector<Tensor<T>>`, computing the same
// outputs and gradients in precision T with the current backend) four ways and checks the cpu
// backend against the float64 reference: in float32 within the error budget of the float32
// reference, and in float64 within `tol64` of it.
template <class Run>
void expect_cpu_matches_reference(const Run& run, double tol64 = 1e-9) {
  std::vector<Tensor<double>> oracle, cpu64;
  std::vector<Tensor<float>> ref32, cpu32;
  {
    ScopedBackend reference(Backend::reference);
    oracle = run.template operator()<double>();
    ref32 = run.template operator()<float>();
  }
  {
    ScopedBackend cpu(Backend::cpu);
    cpu64 = run.template operator()<double>();
    cpu32 = run.template operator()<float>();
  }
  ASSERT_EQ(oracle.size(), cpu32.size());
  for (std::size_t i = 0; i < oracle.size(); ++i) {
    EXPECT_TRUE(within_error_budget(cpu32[i], ref32[i], oracle[i])) << "output " << i << " in float32";
    EXPECT_LE(max_abs_diff(cpu64[i], oracle[i]), tol64) << "output " << i << " in float64";
  }
}

// Runs `run` (returning std::vector<Tensor<T>>) at 1 and 2 threads and expects bit-identical results.
template <class T, class Run>
void expect_same_at_1_and_2_threads(const Run& run) {
  ScopedBackend cpu(Backend::cpu);
  set_num_threads(1);
  const std::vector<Tensor<T>> one = run();
  set_num_threads(2);
  const std::vector<Tensor<T>> two = run();
  set_num_threads(0);
  ASSERT_EQ(one.size(), two.size());
  for (std::size_t i = 0; i < one.size(); ++i) EXPECT_EQ(one[i].values(), two[i].values()) << "output " << i;
}

// Expects `f` to throw attn::Error whose message contains every one of `parts`.
template <class F>
void expect_error(const F& f, std::initializer_list<const char*> parts) {
  try {
    f();
    ADD_FAILURE() << "no attn::Error was thrown";
  } catch (const Error& e) {
    for (const char* p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << "message: " << e.what() << "\nmissing: " << p;
  }
}

// Expects `f` to throw attn::MemoryError whose message contains every one of `parts`.
template <class F>
void expect_memory_error(const F& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no attn::MemoryError was thrown";
  } catch (const MemoryError& e) {
    for (const std::string& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << "\nmissing: " << p;
  }
}

// Sets attn's memory limit for a scope, and puts the default back after it.
struct ScopedLimit {
  explicit ScopedLimit(std::size_t bytes) { set_memory_limit(bytes); }
  ~ScopedLimit() { set_memory_limit(0); }
};

}  // namespace attn::testing
