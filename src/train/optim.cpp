// SGD and Adam (attn/optim.hpp): the update rules of torch.optim's single-tensor implementations,
// element by element in the parameter's precision, in the same order of operations so that a
// float32 step rounds as PyTorch's does (up to the last bit of fused multiply-adds).
#include "attn/optim.hpp"

#include <algorithm>
#include <cmath>
#include <span>

namespace attn {
namespace {

bool contiguous(std::span<const index_t> shape, std::span<const index_t> strides) {
  index_t expected = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    if (shape[i] > 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

template <class T>
bool overlap(const T* a, index_t na, const T* b, index_t nb) {
  return a < b + nb && b < a + na;
}

// The checks both optimizers share: at least one parameter; each parameter and gradient given,
// contiguous, non-empty and of the same shape; no parameter overlapping another or any gradient.
template <class T>
void check_params(const char* op, const std::vector<ParamGrad<T>>& params) {
  if (params.empty()) detail::fail(op, ": no parameters were given");
  for (std::size_t i = 0; i < params.size(); ++i) {
    const ParamGrad<T>& pg = params[i];
    if (pg.param.data() == nullptr) detail::fail(op, ": parameter ", i, " was not given");
    if (pg.grad.data() == nullptr) detail::fail(op, ": the gradient of parameter ", i, " was not given");
    if (pg.param.numel() == 0) detail::fail(op, ": parameter ", i, " has shape ", pg.param.shape_string(), " with no elements");
    if (!std::equal(pg.param.shape().begin(), pg.param.shape().end(), pg.grad.shape().begin(), pg.grad.shape().end()))
      detail::fail(op, ": parameter ", i, " has shape ", pg.param.shape_string(), " but its gradient has shape ",
                   pg.grad.shape_string(), "; they must match");
    if (!contiguous(pg.param.shape(), pg.param.strides()) || !contiguous(pg.grad.shape(), pg.grad.strides()))
      detail::fail(op, ": parameter ", i, " or its gradient is not contiguous; optimizers need dense tensors");
    for (std::size_t j = 0; j < params.size(); ++j) {
      const index_t n = pg.param.numel();
      if (overlap<T>(pg.param.data(), n, params[j].grad.data(), params[j].grad.numel()))
        detail::fail(op, ": parameter ", i, " shares memory with the gradient of parameter ", j);
      if (j > i && overlap<T>(pg.param.data(), n, params[j].param.data(), params[j].param.numel()))
        detail::fail(op, ": parameters ", i, " and ", j, " share memory; each parameter must be given once");
    }
  }
}

void check_at_least_0(const char* op, const char* name, double x) {
  if (!(x >= 0) || !std::isfinite(x)) detail::fail(op, ": ", name, " is ", x, "; it must be non-negative and finite");
}

void check_beta(const char* op, const char* name, double beta) {
  if (!(beta >= 0 && beta < 1)) detail::fail(op, ": ", name, " is ", beta, "; it must be in [0, 1)");
}

}  // namespace

template <class T>
Optimizer<T>::Optimizer(const char* name, double lr) : name_(name), lr_(0) {
  set_lr(lr);
}

template <class T>
void Optimizer<T>::set_lr(double lr) {
  if (!(lr >= 0) || !std::isfinite(lr)) detail::fail(name_, ": lr is ", lr, "; it must be non-negative and finite");
  lr_ = lr;
}

template <class T>
Sgd<T>::Sgd(std::vector<ParamGrad<T>> params, const SgdOptions& options)
    : Optimizer<T>("Sgd", options.lr), params_(std::move(params)), o_(options), momentum_(params_.size()) {
  const char* op = "Sgd";
  check_params(op, params_);
  check_at_least_0(op, "momentum", o_.momentum);
  check_at_least_0(op, "weight_decay", o_.weight_decay);
  if (!(o_.dampening >= 0 && o_.dampening <= 1))
    detail::fail(op, ": dampening is ", o_.dampening, "; it must be in [0, 1]");
  if (o_.nesterov && (o_.momentum <= 0 || o_.dampening != 0))
    detail::fail(op, ": nesterov needs momentum > 0 and dampening 0, but momentum is ", o_.momentum,
                 " and dampening is ", o_.dampening);
}

template <class T>
void Sgd<T>::step() {
  const T wd = static_cast<T>(o_.weight_decay), mu = static_cast<T>(o_.momentum);
  const T keep = static_cast<T>(1 - o_.dampening), neg_lr = static_cast<T>(-this->lr_);
  for (std::size_t k = 0; k < params_.size(); ++k) {
    T* p = params_[k].param.data();
    const T* grad = params_[k].grad.data();
    const index_t n = params_[k].param.numel();
    std::vector<T>& buf = momentum_[k];
    const bool first = buf.empty();
    if (mu != 0 && first) buf.resize(static_cast<std::size_t>(n));
    for (index_t e = 0; e < n; ++e) {
      T g = wd != 0 ? grad[e] + wd * p[e] : grad[e];
      if (mu != 0) {
        buf[e] = first ? g : buf[e] * mu + keep * g;  // torch.clone(d_p) on the first step
        g = o_.nesterov ? g + mu * buf[e] : buf[e];
      }
      p[e] = p[e] + neg_lr * g;
    }
  }
  ++this->steps_;
}

template <class T>
Adam<T>::Adam(std::vector<ParamGrad<T>> params, const AdamOptions& options)
    : Optimizer<T>("Adam", options.lr), params_(std::move(params)), o_(options) {
  const char* op = "Adam";
  check_params(op, params_);
  check_beta(op, "beta1", o_.beta1);
  check_beta(op, "beta2", o_.beta2);
  check_at_least_0(op, "eps", o_.eps);
  check_at_least_0(op, "weight_decay", o_.weight_decay);
  for (const ParamGrad<T>& pg : params_) {
    m_.emplace_back(static_cast<std::size_t>(pg.param.numel()), T(0));
    v_.emplace_back(static_cast<std::size_t>(pg.param.numel()), T(0));
  }
}

template <class T>
void Adam<T>::step() {
  const long t = ++this->steps_;
  // The bias corrections in double, as PyTorch computes them from Python floats.
  const double bc1 = 1 - std::pow(o_.beta1, static_cast<double>(t));
  const double bc2 = 1 - std::pow(o_.beta2, static_cast<double>(t));
  const T b1 = static_cast<T>(o_.beta1), b2 = static_cast<T>(o_.beta2);
  const T one_b1 = static_cast<T>(1 - o_.beta1), one_b2 = static_cast<T>(1 - o_.beta2);
  const T wd = static_cast<T>(o_.weight_decay), eps = static_cast<T>(o_.eps);
  const T neg_step = static_cast<T>(-this->lr_ / bc1), bc2_sqrt = static_cast<T>(std::sqrt(bc2));
  for (std::size_t k = 0; k < params_.size(); ++k) {
    T* p = params_[k].param.data();
    const T* grad = params_[k].grad.data();
    T* m = m_[k].data();
    T* v = v_[k].data();
    const index_t n = params_[k].param.numel();
    for (index_t e = 0; e < n; ++e) {
      const T g = wd != 0 ? grad[e] + wd * p[e] : grad[e];
      m[e] = m[e] * b1 + one_b1 * g;
      v[e] = v[e] * b2 + one_b2 * g * g;
      const T denom = std::sqrt(v[e]) / bc2_sqrt + eps;
      p[e] = p[e] + neg_step * m[e] / denom;  // addcdiv: (value * m) / denom
    }
  }
}

template class Optimizer<float>;
template class Optimizer<double>;
template class Sgd<float>;
template class Sgd<double>;
template class Adam<float>;
template class Adam<double>;

}  // namespace attn
