// SGD and Adam (attn/optim.hpp): steps computed by hand, whole trajectories against torch.optim
// (tests/torch/optim_reference.inc, written by tests/torch/optim_reference.py), state kept per
// parameter, and one test per argument check.
#include "attn/optim.hpp"

#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "support/testing.hpp"

namespace attn {
namespace {

using testing::expect_error;

// The parameter after each step of a trajectory.
using Trajectory = std::vector<std::vector<double>>;

#include "torch/optim_reference.inc"

// One parameter and its gradient, owned.
template <class T>
struct Param {
  Tensor<T> value, grad;
  explicit Param(std::vector<T> v) : value({static_cast<index_t>(v.size())}, v), grad({static_cast<index_t>(v.size())}) {}
  ParamGrad<T> pg() { return {value.view(), grad.cview()}; }
};

// ---- steps by hand -------------------------------------------------------------------------------

TEST(Sgd, PlainStep) {
  Param<double> p({1, -2});
  p.grad[0] = 0.5, p.grad[1] = 1;
  Sgd<double> sgd({p.pg()}, {.lr = 0.1});
  sgd.step();
  EXPECT_DOUBLE_EQ(p.value[0], 0.95);
  EXPECT_DOUBLE_EQ(p.value[1], -2.1);
  EXPECT_EQ(sgd.steps(), 1);
}

// momentum 0.9, dampening 0.5: the buffer starts as the first gradient (1), then 0.9 * 1 + 0.5 * 2.
TEST(Sgd, MomentumAndDampening) {
  Param<double> p({1});
  Sgd<double> sgd({p.pg()}, {.lr = 0.1, .momentum = 0.9, .dampening = 0.5});
  p.grad[0] = 1;
  sgd.step();
  EXPECT_DOUBLE_EQ(p.value[0], 0.9);
  p.grad[0] = 2;
  sgd.step();
  EXPECT_DOUBLE_EQ(p.value[0], 0.9 - 0.1 * 1.9);
}

// Nesterov: the step is g + momentum * buffer = 1 + 0.9 * 1. Weight decay adds wd * p to g.
TEST(Sgd, NesterovAndWeightDecay) {
  Param<double> p({1});
  p.grad[0] = 1;
  Sgd<double>({p.pg()}, {.lr = 0.1, .momentum = 0.9, .nesterov = true}).step();
  EXPECT_DOUBLE_EQ(p.value[0], 1 - 0.1 * 1.9);
  Param<double> q({2});
  Sgd<double>({q.pg()}, {.lr = 0.1, .weight_decay = 0.5}).step();  // gradient 0 + 0.5 * 2
  EXPECT_DOUBLE_EQ(q.value[0], 1.9);
}

// The first Adam step is lr * sign(g) whatever |g|: m / (1 - beta1) = g, sqrt(v / (1 - beta2)) = |g|.
TEST(Adam, FirstStepIsLrTimesSign) {
  Param<double> p({1, 1, 1});
  p.grad[0] = 0.3, p.grad[1] = -5, p.grad[2] = 1e-6;
  Adam<double> adam({p.pg()}, {.lr = 0.01, .eps = 0});
  adam.step();
  EXPECT_NEAR(p.value[0], 0.99, 1e-15);
  EXPECT_NEAR(p.value[1], 1.01, 1e-15);
  EXPECT_NEAR(p.value[2], 0.99, 1e-15);
}

// Two steps with the formulas of the header written out.
TEST(Adam, SecondStepByTheFormula) {
  const double lr = 0.05, b1 = 0.8, b2 = 0.95, eps = 1e-3, wd = 0.1, g1 = 0.4, g2 = -0.7;
  Param<double> p({1.5});
  Adam<double> adam({p.pg()}, {.lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps, .weight_decay = wd});
  double x = 1.5, m = 0, v = 0;
  for (const auto& [t, g] : {std::pair{1, g1}, std::pair{2, g2}}) {
    p.grad[0] = g;
    adam.step();
    const double d = g + wd * x;
    m = b1 * m + (1 - b1) * d;
    v = b2 * v + (1 - b2) * d * d;
    x -= lr / (1 - std::pow(b1, t)) * m / (std::sqrt(v) / std::sqrt(1 - std::pow(b2, t)) + eps);
    EXPECT_NEAR(p.value[0], x, 1e-15) << "step " << t;
  }
}

// ---- against torch.optim -------------------------------------------------------------------------

// Minimises sum((p - c)^2) with gradient 2 (p - c) as optim_reference.py does and compares every step.
template <class T, class Make>
void expect_trajectory(const Make& make, const Trajectory& expected, double tol) {
  const std::vector<T> c{1.0, 0.5, -1.0, 0.25, -2.0};
  Param<T> p({0.5, -1.0, 2.0, -0.25, 0.0});
  auto opt = make(p.pg());
  for (std::size_t t = 0; t < expected.size(); ++t) {
    for (index_t e = 0; e < 5; ++e) p.grad[e] = 2 * (p.value[e] - c[e]);
    opt.step();
    for (index_t e = 0; e < 5; ++e) EXPECT_NEAR(p.value[e], expected[t][e], tol) << "step " << t + 1 << " element " << e;
  }
}

template <class T>
void expect_torch_trajectories(const std::vector<const Trajectory*>& expected, double tol) {
  using S = SgdOptions;
  const auto sgd = [](S o) { return [o](ParamGrad<T> pg) { return Sgd<T>({pg}, o); }; };
  const auto adam = [](AdamOptions o) { return [o](ParamGrad<T> pg) { return Adam<T>({pg}, o); }; };
  SCOPED_TRACE(sizeof(T) == 8 ? "float64" : "float32");
  {
    SCOPED_TRACE("sgd_plain");
    expect_trajectory<T>(sgd({.lr = 0.1}), *expected[0], tol);
  }
  {
    SCOPED_TRACE("sgd_momentum");
    expect_trajectory<T>(sgd({.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01}), *expected[1], tol);
  }
  {
    SCOPED_TRACE("sgd_nesterov");
    expect_trajectory<T>(sgd({.lr = 0.05, .momentum = 0.8, .weight_decay = 0.02, .nesterov = true}), *expected[2], tol);
  }
  {
    SCOPED_TRACE("adam_default");
    expect_trajectory<T>(adam({.lr = 0.1}), *expected[3], tol);
  }
  {
    SCOPED_TRACE("adam_tuned");
    expect_trajectory<T>(adam({.lr = 0.05, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-3, .weight_decay = 0.1}), *expected[4],
                         tol);
  }
}

// float64 to rounding; float32 within a few ulps of values of size about 3.
TEST(TorchOptim, SameTrajectories) {
  expect_torch_trajectories<double>(
      {&k_sgd_plain_f64, &k_sgd_momentum_f64, &k_sgd_nesterov_f64, &k_adam_default_f64, &k_adam_tuned_f64}, 1e-14);
  expect_torch_trajectories<float>(
      {&k_sgd_plain_f32, &k_sgd_momentum_f32, &k_sgd_nesterov_f32, &k_adam_default_f32, &k_adam_tuned_f32}, 1e-6);
}

// ---- state per parameter -------------------------------------------------------------------------

// Two parameters in one Adam step as each would alone; set_lr changes the next step only.
TEST(Adam, StateIsPerParameter) {
  Param<float> a({0.5f, -1, 2}), b({3, -4}), a1({0.5f, -1, 2}), b1({3, -4});
  Adam<float> both({a.pg(), b.pg()}, {.lr = 0.1});
  Adam<float> only_a({a1.pg()}, {.lr = 0.1}), only_b({b1.pg()}, {.lr = 0.1});
  for (int t = 0; t < 4; ++t) {
    for (Param<float>* p : {&a, &b, &a1, &b1})
      for (index_t e = 0; e < p->value.numel(); ++e) p->grad[e] = p->value[e] * p->value[e] - static_cast<float>(t);
    if (t == 2) both.set_lr(0.02), only_a.set_lr(0.02), only_b.set_lr(0.02);
    both.step(), only_a.step(), only_b.step();
  }
  EXPECT_EQ(a.value.values(), a1.value.values());
  EXPECT_EQ(b.value.values(), b1.value.values());
  EXPECT_EQ(both.lr(), 0.02);
  EXPECT_EQ(both.steps(), 4);
}

// ---- argument checks ---------------------------------------------------------------------------

TEST(Optim, RefusesBadParameters) {
  Param<double> p({1, 2}), q({3, 4});
  Tensor<double> wrong({3}), matrix({2, 2}), grad22({2, 2});
  expect_error([] { Sgd<double>({}, {}); }, {"Sgd: no parameters were given"});
  expect_error([&] { Adam<double>({{p.value.view(), wrong.cview()}}, {}); },
               {"Adam: parameter 0 has shape (2,) but its gradient has shape (3,); they must match"});
  expect_error([&] { Sgd<double>({p.pg(), {q.value.view(), p.value.cview()}}, {}); },
               {"Sgd: parameter 0 shares memory with the gradient of parameter 1"});
  expect_error([&] { Adam<double>({p.pg(), p.pg()}, {}); }, {"parameters 0 and 1 share memory"});
  expect_error([&] { Sgd<double>({{TensorView<double>(), p.grad.cview()}}, {}); }, {"Sgd: parameter 0 was not given"});
  expect_error([&] { Sgd<double>({{p.value.view(), TensorView<const double>()}}, {}); },
               {"the gradient of parameter 0 was not given"});
  const TensorView<double> column(matrix.data(), {2, 1}, {2, 1});  // every other element
  const TensorView<const double> column_grad(grad22.data(), {2, 1}, {2, 1});
  expect_error([&] { Adam<double>({{column, column_grad}}, {}); }, {"parameter 0 or its gradient is not contiguous"});
}

TEST(Optim, RefusesBadOptions) {
  Param<double> p({1});
  const auto sgd = [&](SgdOptions o) { return [&p, o] { Sgd<double>({p.pg()}, o); }; };
  const auto adam = [&](AdamOptions o) { return [&p, o] { Adam<double>({p.pg()}, o); }; };
  expect_error(sgd({.lr = -1}), {"Sgd: lr is -1; it must be non-negative and finite"});
  expect_error(sgd({.momentum = -0.5}), {"Sgd: momentum is -0.5"});
  expect_error(sgd({.dampening = 2}), {"Sgd: dampening is 2; it must be in [0, 1]"});
  expect_error(sgd({.weight_decay = -1}), {"Sgd: weight_decay is -1"});
  expect_error(sgd({.nesterov = true}), {"nesterov needs momentum > 0 and dampening 0, but momentum is 0"});
  expect_error(sgd({.momentum = 0.9, .dampening = 0.1, .nesterov = true}), {"and dampening is 0.1"});
  expect_error(adam({.lr = NAN}), {"Adam: lr is nan"});
  expect_error(adam({.beta1 = 1}), {"Adam: beta1 is 1; it must be in [0, 1)"});
  expect_error(adam({.beta2 = -0.1}), {"Adam: beta2 is -0.1"});
  expect_error(adam({.eps = -1e-8}), {"Adam: eps is -1e-08"});
  expect_error(adam({.weight_decay = INFINITY}), {"Adam: weight_decay is inf"});
  Adam<double> ok({p.pg()}, {});
  expect_error([&] { ok.set_lr(-0.1); }, {"Adam: lr is -0.1"});
}

}  // namespace
}  // namespace attn
