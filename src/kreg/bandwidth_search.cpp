// KernelRegression::select_bandwidth: the criterion (cv_ls or aicc) minimised over unconstrained
// parameters theta, h = exp(theta) for a continuous bandwidth and lambda = L / (1 + exp(-theta)) for a
// discrete one (L its largest value), by BFGS with a backtracking line search on the exact gradient,
// or by a compass search for the boxcar, from several starts.
#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "attn/error.hpp"
#include "core/spread.hpp"
#include "kreg/local_fit.hpp"

namespace attn {

namespace {

// The canonical bandwidth of each kernel over the Gaussian's (Marron and Nolan's delta_0 ratios), so
// that the rule of thumb means the same smoothing for every kernel: delta_0 = (R(K) / mu_2(K)^2)^(1/5).
double canonical_ratio(ContinuousKernel kernel) {
  switch (kernel) {
    case ContinuousKernel::gaussian: return 1.0;
    case ContinuousKernel::epanechnikov: return 2.2138;  // 1.7188 / 0.7764
    case ContinuousKernel::boxcar: return 1.7401;        // 1.3510 / 0.7764
    case ContinuousKernel::tricube: return 2.6099;       // 2.0263 / 0.7764
  }
  return 1.0;
}

struct Search {
  const KernelRegression& model;
  BandwidthMethod method;
  std::vector<double> limits;  // (k,) L of each discrete column, 0 for continuous
  index_t evaluations = 0;

  std::vector<double> bandwidths(const std::vector<double>& theta) const {
    std::vector<double> h(theta.size());
    for (std::size_t c = 0; c < theta.size(); ++c)
      h[c] = limits[c] == 0 ? std::exp(theta[c]) : limits[c] / (1 + std::exp(-theta[c]));
    return h;
  }
  std::vector<double> parameters(const std::vector<double>& h) const {
    std::vector<double> theta(h.size());
    for (std::size_t c = 0; c < h.size(); ++c)
      theta[c] = limits[c] == 0 ? std::log(h[c]) : std::log(h[c] / (limits[c] - h[c]));
    return theta;
  }
  // The criterion at theta and, when gradient is not null, its gradient in theta.
  double operator()(const std::vector<double>& theta, std::vector<double>* gradient) {
    ++evaluations;
    const std::vector<double> h = bandwidths(theta);
    for (std::size_t c = 0; c < h.size(); ++c)  // a bandwidth that overflowed or reached a limit
      if (!(h[c] > 0 && std::isfinite(h[c])) || (limits[c] != 0 && !(h[c] < limits[c])))
        return std::numeric_limits<double>::infinity();
    // With y in units of its scale (the same minimum, found alike at any scale; finite for any finite y).
    const double f = method == BandwidthMethod::cv_ls ? KernelRegressionAccess::cv_ls_in_units(model, h, gradient)
                                                      : KernelRegressionAccess::aicc_in_units(model, h, gradient);
    if (gradient)
      for (std::size_t c = 0; c < h.size(); ++c)
        (*gradient)[c] *= limits[c] == 0 ? h[c] : h[c] * (1 - h[c] / limits[c]);
    return f;
  }
};

struct Result {
  std::vector<double> theta;
  double value = std::numeric_limits<double>::infinity();
  int steps = 0;
  bool converged = false;
};

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double e : v) m = std::max(m, std::abs(e));
  return m;
}

Result bfgs(Search& f, std::vector<double> x, int max_steps) {
  const std::size_t k = x.size();
  std::vector<double> g(k), g_new(k), p(k), x_new(k), s(k), y(k);
  Result r;
  double fx = f(x, &g);
  std::vector<double> inv(k * k, 0.0);  // the inverse Hessian's estimate
  auto identity = [&] {
    std::fill(inv.begin(), inv.end(), 0.0);
    for (std::size_t i = 0; i < k; ++i) inv[i * k + i] = 1;
  };
  identity();
  if (!std::isfinite(fx)) return {x, fx, 0, false};
  for (r.steps = 0; r.steps < max_steps; ++r.steps) {
    if (max_abs(g) <= 1e-7 * std::max(std::abs(fx), 1e-300)) {
      r.converged = true;
      break;
    }
    for (std::size_t i = 0; i < k; ++i) {
      p[i] = 0;
      for (std::size_t j = 0; j < k; ++j) p[i] -= inv[i * k + j] * g[j];
    }
    double slope = 0;
    for (std::size_t i = 0; i < k; ++i) slope += g[i] * p[i];
    if (!(slope < 0)) {  // not a descent direction: restart from the gradient
      identity();
      for (std::size_t i = 0; i < k; ++i) p[i] = -g[i];
      slope = 0;
      for (std::size_t i = 0; i < k; ++i) slope += g[i] * p[i];
    }
    // At most a factor e^2 on a bandwidth a step.
    const double longest = max_abs(p);
    if (longest > 2) {
      for (std::size_t i = 0; i < k; ++i) p[i] *= 2 / longest;
      slope *= 2 / longest;
    }
    double t = 1, f_new = 0;
    for (;;) {
      for (std::size_t i = 0; i < k; ++i) x_new[i] = x[i] + t * p[i];
      f_new = f(x_new, &g_new);
      if (std::isfinite(f_new) && f_new <= fx + 1e-4 * t * slope) break;
      t *= 0.5;
      if (t < 1e-10) break;
    }
    if (t < 1e-10) {  // no decrease along the direction: as flat as float64 can tell
      r.converged = true;
      break;
    }
    double sy = 0;
    for (std::size_t i = 0; i < k; ++i) s[i] = x_new[i] - x[i], y[i] = g_new[i] - g[i], sy += s[i] * y[i];
    const double change = fx - f_new;
    x = x_new, g = g_new, fx = f_new;
    if (sy > 1e-300) {  // the BFGS update of the inverse: (I - rho s y') inv (I - rho y s') + rho s s'
      const double rho = 1 / sy;
      std::vector<double> iy(k, 0.0);
      for (std::size_t i = 0; i < k; ++i)
        for (std::size_t j = 0; j < k; ++j) iy[i] += inv[i * k + j] * y[j];
      double yiy = 0;
      for (std::size_t i = 0; i < k; ++i) yiy += y[i] * iy[i];
      for (std::size_t i = 0; i < k; ++i)
        for (std::size_t j = 0; j < k; ++j)
          inv[i * k + j] += rho * ((1 + rho * yiy) * s[i] * s[j] - iy[i] * s[j] - s[i] * iy[j]);
    }
    if (change <= 1e-14 * std::abs(fx) && max_abs(s) <= 1e-9) {
      r.converged = true;
      ++r.steps;
      break;
    }
  }
  r.theta = x, r.value = fx;
  return r;
}

Result compass(Search& f, std::vector<double> x, int max_steps) {
  Result r;
  double fx = f(x, nullptr);
  double step = 0.5;
  for (r.steps = 0; r.steps < max_steps && step > 1e-6; ++r.steps) {
    bool improved = false;
    for (std::size_t c = 0; c < x.size(); ++c)
      for (double sign : {1.0, -1.0}) {
        std::vector<double> trial = x;
        trial[c] += sign * step;
        const double ft = f(trial, nullptr);
        if (ft < fx) x = trial, fx = ft, improved = true;
      }
    if (!improved) step /= 2;
  }
  r.converged = step <= 1e-6;
  r.theta = x, r.value = fx;
  return r;
}

}  // namespace

std::vector<double> KernelRegression::rule_of_thumb() const {
  std::vector<double> h(k_);
  const double shrink = std::pow(static_cast<double>(n_), -1.0 / (4 + static_cast<double>(k_)));
  for (index_t c = 0; c < k_; ++c) {
    if (types_[c] != RegressorType::continuous) {
      h[c] = kreg::discrete_bandwidth_limit(types_[c], levels_[c]) / 2;
      continue;
    }
    const double sd = detail::standard_deviation(n_, [&](index_t i) { return x_[i * k_ + c]; });
    h[c] = 1.06 * (sd > 0 && std::isfinite(sd) ? sd : 1.0) * shrink * canonical_ratio(options_.kernel);
  }
  return h;
}

BandwidthSelection KernelRegression::select_bandwidth(BandwidthMethod method,
                                                      const BandwidthSearchOptions& search) const {
  const char* op = "KernelRegression::select_bandwidth";
  if (search.max_steps < 0) detail::fail(op, ": max_steps is ", search.max_steps, "; it must be >= 0");
  for (double factor : search.start_factors)
    if (!(factor > 0 && std::isfinite(factor)))
      detail::fail(op, ": start_factors holds ", factor, "; each must be positive and finite");
  Search f{*this, method, std::vector<double>(k_, 0.0)};
  for (index_t c = 0; c < k_; ++c)
    if (types_[c] != RegressorType::continuous) f.limits[c] = kreg::discrete_bandwidth_limit(types_[c], levels_[c]);
  const std::vector<double> start = rule_of_thumb();
  std::vector<std::vector<double>> starts = {f.parameters(start)};
  for (double factor : search.start_factors) {
    std::vector<double> theta = starts[0];
    for (index_t c = 0; c < k_; ++c)
      if (types_[c] == RegressorType::continuous) theta[c] += std::log(factor);
    starts.push_back(theta);
  }
  const bool derivative_free = options_.kernel == ContinuousKernel::boxcar;
  double at_start = std::numeric_limits<double>::quiet_NaN();
  Result best;
  for (const auto& theta : starts) {
    const Result r = derivative_free ? compass(f, theta, search.max_steps) : bfgs(f, theta, search.max_steps);
    if (std::isnan(at_start)) at_start = f(theta, nullptr);
    if (r.value < best.value || best.theta.empty()) best = r;
  }
  // The criterion as the user's y gives it, back from the search's units.
  const auto in_y = [&](double value) {
    return method == BandwidthMethod::cv_ls ? value * y_unit_ * y_unit_ : value + 2 * std::log(y_unit_);
  };
  at_start = in_y(at_start), best.value = in_y(best.value);
  BandwidthSelection out;
  out.bandwidths = f.bandwidths(best.theta);
  out.objective = best.value;
  out.evaluations = f.evaluations;
  out.converged = best.converged;
  std::ostringstream how;
  how.precision(6);
  how << (method == BandwidthMethod::cv_ls ? "cv_ls" : "aicc") << " by "
      << (derivative_free ? "compass search" : "BFGS") << " on log bandwidths from " << starts.size()
      << " starts (the rule of thumb";
  for (double factor : search.start_factors) how << ", x" << factor;
  how << "): " << at_start << " at the rule of thumb, " << best.value << " at [";
  for (index_t c = 0; c < k_; ++c) how << (c ? ", " : "") << out.bandwidths[c];
  how << "] after " << best.steps << " steps" << (best.converged ? " (converged)" : " (step limit)") << ", "
      << out.evaluations << " evaluations";
  out.how = how.str();
  return out;
}

}  // namespace attn
