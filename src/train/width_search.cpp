// select_width (attn/width_selection.hpp): a log-spaced grid over a common multiple of the data's
// spread, then a refinement of the best grid point on theta = log(width), where every width is
// positive and a step means the same relative change at any scale:
//   Gaussian, Epanechnikov  BFGS with an Armijo backtracking line search, dCV/dtheta_c = sigma_c dCV/dsigma_c
//   boxcar                  compass search (its criterion is piecewise constant: no gradient)
//   constant                nothing to search: the width has no effect
// theta is kept within box bounds; a coordinate that sits on a bound with its gradient pushing
// outward is held there (a projected gradient), which is how an irrelevant dimension's width ends.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>

#include "api/checks.hpp"
#include "train/loo_cv.hpp"

namespace attn {
namespace train {
namespace {

constexpr double kArmijo = 1e-4;          // sufficient decrease of the line search
constexpr int kHalvings = 40;             // line search: at most this many halvings of the step
constexpr double kRelativeDecrease = 1e-11;  // a BFGS step that gains less than this (relative) converged
constexpr double kCompassStop = 1e-3;     // the compass search stops below this step in log(width)

std::string fmt(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", x);
  return buf;
}

std::string fmt(const std::vector<double>& xs) {
  if (xs.size() == 1) return fmt(xs[0]);
  std::string s = "(";
  for (std::size_t i = 0; i < xs.size(); ++i) s += (i ? ", " : "") + fmt(xs[i]);
  return s + ")";
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

double max_abs(const std::vector<double>& a) {
  double m = 0;
  for (const double x : a) m = std::max(m, std::abs(x));
  return m;
}

// The search over theta = log(widths), P = p or 1 coordinates.
class Search {
 public:
  Search(const LooProblem& problem, Kernel kernel, const WidthSearchOptions& options)
      : P_(problem), kernel_(kernel), o_(options) {
    if (o_.per_dimension) {
      scale_ = P_.spread;
    } else {  // one width for all dimensions: the root mean square of their spreads
      double ms = 0;
      for (const double s : P_.spread) ms += s * s / static_cast<double>(P_.p);
      scale_.assign(1, std::sqrt(ms));
    }
    // Within the widths the data's type holds (LooProblem::narrowest, widest).
    const double floor = std::log(P_.narrowest), ceiling = std::log(P_.widest);
    for (const double s : scale_) {
      lo_.push_back(std::clamp(std::log(s) + std::log(o_.grid_low / 10), floor, ceiling));
      hi_.push_back(std::clamp(std::log(s) + std::log(o_.grid_high * 100), floor, ceiling));
    }
    grid_step_ = std::log(o_.grid_high / o_.grid_low) / static_cast<double>(o_.grid_points - 1);
  }

  WidthSelection run() {
    WidthSelection r;
    std::ostringstream how;
    if (kernel_ == Kernel::constant) {
      theta_ = log_of(scale_);
      error_ = evaluate(theta_, nullptr);
      r.converged = true;
      how << "the constant kernel weighs every point the same at any width; evaluated at the spread " << fmt(scale_);
    } else {
      const std::vector<std::pair<double, std::vector<double>>> starts = grid();
      theta_ = starts[0].second, error_ = starts[0].first;
      r.grid_widths = widths(theta_), r.grid_error = error_;
      how << "grid of " << o_.grid_points << " log-spaced widths " << fmt(o_.grid_low) << " to " << fmt(o_.grid_high)
          << " x spread " << fmt(scale_) << ": " << fmt(r.grid_widths) << " (LOO " << fmt(error_) << ")";
      if (o_.max_steps > 0) {
        // Each start refined; the lowest error wins, the better grid point on ties.
        std::vector<double> best_theta;
        double best_error = INFINITY;
        for (const auto& [error, theta] : starts) {
          theta_ = theta, error_ = error;
          int steps = 0;
          const bool converged = kernel_ == Kernel::boxcar ? compass(steps) : bfgs(steps);
          if (error_ < best_error) best_error = error_, best_theta = theta_, r.steps = steps, r.converged = converged;
        }
        theta_ = best_theta, error_ = best_error;
        how << "; " << (kernel_ == Kernel::boxcar ? "compass search" : "BFGS") << " on log(width) from "
            << starts.size() << (starts.size() == 1 ? " grid minimum" : " grid minima") << ", the best after " << r.steps << " steps"
            << (r.converged ? " (converged)" : " (step limit)") << ": " << fmt(widths(theta_)) << " (LOO "
            << fmt(error_) << ")";
      }
    }
    r.widths = widths(theta_);
    const LooCv final_eval = loo_cv(P_, kernel_, r.widths, false);
    r.loo_error = final_eval.error, r.isolated = final_eval.isolated;
    r.evaluations = evaluations_ + 1;
    r.how = how.str();
    return r;
  }

 private:
  static std::vector<double> log_of(const std::vector<double>& xs) {
    std::vector<double> r;
    for (const double x : xs) r.push_back(std::log(x));
    return r;
  }
  static std::vector<double> widths(const std::vector<double>& theta) {
    std::vector<double> w;
    for (const double t : theta) w.push_back(std::exp(t));
    return w;
  }

  // CV at theta and, when grad is given, dCV/dtheta.
  double evaluate(const std::vector<double>& theta, std::vector<double>* grad) {
    ++evaluations_;
    const std::vector<double> w = widths(theta);
    const LooCv r = loo_cv(P_, kernel_, w, grad != nullptr);
    if (grad != nullptr) {
      grad->resize(w.size());
      for (std::size_t c = 0; c < w.size(); ++c) (*grad)[c] = r.gradient[c] * w[c];
    }
    return r.error;
  }

  std::vector<double> clamp(std::vector<double> theta) const {
    for (std::size_t c = 0; c < theta.size(); ++c) theta[c] = std::clamp(theta[c], lo_[c], hi_[c]);
    return theta;
  }

  // The gradient with the coordinates that sit on a bound and push outward held at 0.
  std::vector<double> projected(std::vector<double> g) const {
    for (std::size_t c = 0; c < g.size(); ++c)
      if ((theta_[c] <= lo_[c] && g[c] > 0) || (theta_[c] >= hi_[c] && g[c] < 0)) g[c] = 0;
    return g;
  }

  // theta_c = log(f_k scale_c) for the grid's multiples f_k. Returns the starts of the refinement:
  // the grid's local minima (the first point of a flat run), lowest error first, at most
  // options.starts of them. A compact kernel's criterion is rough when N is small: the best grid
  // point need not lie in the basin of the best width.
  std::vector<std::pair<double, std::vector<double>>> grid() {
    std::vector<std::pair<double, std::vector<double>>> points;  // (error, theta)
    for (index_t k = 0; k < o_.grid_points; ++k) {
      const double f = std::log(o_.grid_low) + grid_step_ * static_cast<double>(k);
      std::vector<double> theta = log_of(scale_);
      for (std::size_t c = 0; c < theta.size(); ++c) theta[c] = std::clamp(theta[c] + f, lo_[c], hi_[c]);
      points.emplace_back(evaluate(theta, nullptr), theta);
    }
    std::vector<std::pair<double, std::vector<double>>> minima;
    for (std::size_t k = 0; k < points.size(); ++k)
      if ((k == 0 || points[k].first < points[k - 1].first) &&
          (k + 1 == points.size() || points[k].first <= points[k + 1].first))
        minima.push_back(points[k]);
    std::stable_sort(minima.begin(), minima.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    if (minima.size() > static_cast<std::size_t>(o_.starts)) minima.resize(static_cast<std::size_t>(o_.starts));
    return minima;
  }

  // BFGS on theta with an inverse-Hessian estimate Hi (P x P). The first direction is the negative
  // gradient scaled to one grid step (the minimum is within a grid cell or two of the best grid
  // point); Hi is then scaled by s.y / y.y (Nocedal and Wright, 6.20) and updated. Returns whether
  // it converged: gradient 0, no sufficient decrease along a descent direction, or a negligible gain.
  bool bfgs(int& steps) {
    const std::size_t n = theta_.size();
    std::vector<double> g, Hi(n * n, 0.0);
    for (std::size_t c = 0; c < n; ++c) Hi[c * n + c] = 1;
    error_ = evaluate(theta_, &g);
    bool scaled = false;
    for (steps = 0; steps < o_.max_steps; ++steps) {
      const std::vector<double> gp = projected(g);
      if (max_abs(gp) == 0) return true;
      std::vector<double> d(n, 0.0);
      for (std::size_t a = 0; a < n; ++a)
        for (std::size_t b = 0; b < n; ++b) d[a] -= Hi[a * n + b] * gp[b];
      if (dot(d, gp) >= 0) {  // the estimate lost positive definiteness: steepest descent
        for (std::size_t a = 0; a < n; ++a) d[a] = -gp[a];
      }
      if (!scaled) {
        const double m = max_abs(d);
        for (double& x : d) x *= grid_step_ / m;
      }
      // Backtracking: halve until the decrease is at least kArmijo of the linear prediction.
      std::vector<double> next, g_next;
      double e_next = INFINITY;
      bool accepted = false;
      for (int h = 0; h < kHalvings && !accepted; ++h) {
        const double alpha = std::ldexp(1.0, -h);
        next = theta_;
        for (std::size_t c = 0; c < n; ++c) next[c] += alpha * d[c];
        next = clamp(next);
        std::vector<double> s(n);
        for (std::size_t c = 0; c < n; ++c) s[c] = next[c] - theta_[c];
        if (max_abs(s) == 0) break;
        e_next = evaluate(next, &g_next);
        accepted = e_next <= error_ + kArmijo * dot(g, s);
      }
      if (!accepted) return true;  // no decrease left at this precision
      std::vector<double> s(n), y(n);
      for (std::size_t c = 0; c < n; ++c) s[c] = next[c] - theta_[c], y[c] = g_next[c] - g[c];
      const double sy = dot(s, y);
      if (sy > 1e-12 * std::sqrt(dot(s, s) * dot(y, y))) {  // curvature condition: update Hi
        if (!scaled) {
          std::fill(Hi.begin(), Hi.end(), 0.0);
          for (std::size_t c = 0; c < n; ++c) Hi[c * n + c] = sy / dot(y, y);
          scaled = true;
        }
        // Hi <- (I - rho s y^T) Hi (I - rho y s^T) + rho s s^T, rho = 1 / s.y
        std::vector<double> Hy(n, 0.0);
        for (std::size_t a = 0; a < n; ++a)
          for (std::size_t b = 0; b < n; ++b) Hy[a] += Hi[a * n + b] * y[b];
        const double rho = 1 / sy, yHy = dot(y, Hy);
        for (std::size_t a = 0; a < n; ++a)
          for (std::size_t b = 0; b < n; ++b)
            Hi[a * n + b] += rho * ((1 + rho * yHy) * s[a] * s[b] - Hy[a] * s[b] - s[a] * Hy[b]);
      }
      const double gain = error_ - e_next;
      theta_ = next, error_ = e_next, g = g_next;
      if (gain <= kRelativeDecrease * error_) {
        ++steps;
        return true;
      }
    }
    return false;
  }

  // Tries theta_c +- step for each coordinate in turn and keeps any strict improvement; halves the
  // step after a sweep without one. One step = one sweep.
  bool compass(int& steps) {
    double step = grid_step_ / 2;
    for (steps = 0; steps < o_.max_steps; ++steps) {
      bool improved = false;
      for (std::size_t c = 0; c < theta_.size(); ++c)
        for (const double sign : {1.0, -1.0}) {
          std::vector<double> next = theta_;
          next[c] = std::clamp(next[c] + sign * step, lo_[c], hi_[c]);
          if (next[c] == theta_[c]) continue;
          const double e = evaluate(next, nullptr);
          if (e < error_) {
            theta_ = next, error_ = e, improved = true;
            break;
          }
        }
      if (!improved && (step /= 2) < kCompassStop) {
        ++steps;
        return true;
      }
    }
    return false;
  }

  const LooProblem& P_;
  Kernel kernel_;
  WidthSearchOptions o_;
  std::vector<double> scale_, lo_, hi_, theta_;
  double grid_step_ = 0, error_ = 0;
  index_t evaluations_ = 0;
};

void check_options(const char* op, const WidthSearchOptions& o) {
  if (o.grid_points < 2) detail::fail(op, ": options.grid_points is ", o.grid_points, "; it must be at least 2");
  if (!(o.grid_low > 0) || !(o.grid_high > o.grid_low) || !std::isfinite(o.grid_high))
    detail::fail(op, ": options.grid_low is ", o.grid_low, " and options.grid_high is ", o.grid_high,
                 "; they must satisfy 0 < grid_low < grid_high and be finite");
  if (o.max_steps < 0) detail::fail(op, ": options.max_steps is ", o.max_steps, "; it must not be negative");
  if (o.starts < 1) detail::fail(op, ": options.starts is ", o.starts, "; it must be at least 1");
}

}  // namespace
}  // namespace train

template <class T>
WidthSelection select_width(TensorView<const T> x, TensorView<const T> y, Kernel kernel,
                            const WidthSearchOptions& options) {
  train::check_options("select_width", options);
  const train::LooProblem P = train::make_loo_problem("select_width", x, y, kernel);
  return train::Search(P, kernel, options).run();
}

template WidthSelection select_width<float>(TensorView<const float>, TensorView<const float>, Kernel,
                                            const WidthSearchOptions&);
template WidthSelection select_width<double>(TensorView<const double>, TensorView<const double>, Kernel,
                                             const WidthSearchOptions&);

}  // namespace attn
