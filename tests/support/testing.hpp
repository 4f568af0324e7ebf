// Helpers shared by the tests: seeded random tensors, the error-budget rule, finite differences.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include <gtest/gtest.h>

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

// Central finite differences of a scalar loss with respect to every element of `x`, in float64.
std::vector<double> numeric_gradient(const std::function<double()>& loss, std::vector<double>& x,
                                     double eps = 1e-6);

// Checks an analytic gradient against numeric_gradient; returns the worst relative error
// |g - fd| / max(1, |fd|) and names the worst element in `where`.
double gradient_error(const std::vector<double>& analytic, const std::vector<double>& numeric, std::string* where);

// sum(out * weight): the loss whose gradient with respect to out is `weight`.
double dot(const Tensor<double>& out, const Tensor<double>& weight);

}  // namespace attn::testing
