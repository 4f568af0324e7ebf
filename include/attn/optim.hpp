// Optimizers over the library's learnable parameters (additive attention's W_q, W_k, w_v,
// bilinear attention's W, ...), with the semantics of torch.optim so that a training loop ported
// from PyTorch takes the same steps:
//
//   SGD    g = grad + weight_decay p
//          b = g on the first step, then momentum b + (1 - dampening) g      (when momentum != 0)
//          g = nesterov ? g + momentum b : b
//          p -= lr g
//   Adam   g = grad + weight_decay p                                         (L2, as torch.optim.Adam)
//          m = beta1 m + (1 - beta1) g,   v = beta2 v + (1 - beta2) g^2,   t = step count
//          p -= lr / (1 - beta1^t) m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//
// An optimizer holds (parameter, gradient) views: each step reads the gradients the backward wrote
// (the backward writes them whole, so there is nothing to zero) and updates the parameters in
// place. State (momentum buffers, moments) is kept per parameter, in the parameter's precision
// like PyTorch's. The views must stay valid for the optimizer's lifetime.
#pragma once

#include <vector>

#include "attn/tensor.hpp"

namespace attn {

// A parameter and the gradient that the backward writes for it; same shape, both contiguous.
template <class T>
struct ParamGrad {
  TensorView<T> param;
  TensorView<const T> grad;
};

struct SgdOptions {
  double lr = 1e-3;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;  // needs momentum > 0 and dampening 0, as in PyTorch
};

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;
};

// The interface a training loop needs: step() after each backward, lr() and set_lr() for
// schedules (the next step uses the new rate).
template <class T>
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  /// One update of every parameter from its gradient; lr(): the rate the next step uses; steps(): the
  /// steps taken so far.
  virtual void step() = 0;
  double lr() const { return lr_; }
  void set_lr(double lr);  // attn::Error when lr is negative or not finite
  long steps() const { return steps_; }  // steps taken so far

 protected:
  /// name: the optimizer's, for messages; lr: the first learning rate (attn::Error when negative).
  Optimizer(const char* name, double lr);
  const char* name_;
  double lr_;
  long steps_ = 0;
};

// attn::Error from the constructors for: no parameters; a parameter or gradient not given, not
// contiguous or without elements; a gradient whose shape differs from its parameter's; a parameter
// given twice or sharing memory with a gradient; options out of range (lr < 0, momentum < 0,
// dampening outside [0, 1], weight_decay < 0, nesterov without momentum or with dampening, betas
// outside [0, 1), eps < 0), each message naming the parameter's index or the option and its value.
template <class T>
class Sgd final : public Optimizer<T> {
 public:
  /// Stochastic gradient descent (PyTorch's torch.optim.SGD) over these parameters; step() updates them.
  Sgd(std::vector<ParamGrad<T>> params, const SgdOptions& options);
  void step() override;

 private:
  std::vector<ParamGrad<T>> params_;
  SgdOptions o_;
  std::vector<std::vector<T>> momentum_;  // per parameter; empty until the first step
};

template <class T>
class Adam final : public Optimizer<T> {
 public:
  /// Adam (PyTorch's torch.optim.Adam) over these parameters; step() updates them.
  Adam(std::vector<ParamGrad<T>> params, const AdamOptions& options);
  void step() override;

 private:
  std::vector<ParamGrad<T>> params_;
  AdamOptions o_;
  std::vector<std::vector<T>> m_, v_;  // first and second moments per parameter
};

}  // namespace attn
