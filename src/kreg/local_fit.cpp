#include "kreg/local_fit.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "attn/error.hpp"

namespace attn::kreg {

namespace {

void add_terms(std::vector<std::vector<int>>& terms, std::vector<int>& factors, int order, int first, int kc) {
  if (static_cast<int>(factors.size()) == order) {
    terms.push_back(factors);
    return;
  }
  for (int c = first; c < kc; ++c) {
    factors.push_back(c);
    add_terms(terms, factors, order, c, kc);
    factors.pop_back();
  }
}

}  // namespace

Design::Design(int degree_, int continuous_) : degree(degree_), continuous(continuous_) {
  std::vector<int> factors;
  for (int d = 0; d <= degree; ++d) {
    if (continuous > 0 || d == 0) add_terms(terms, factors, d, 0, continuous);
    terms_up_to.push_back(static_cast<int>(terms.size()));
  }
}

KernelValue continuous_kernel(ContinuousKernel kernel, double xj, double x0, double h) {
  const double u = (xj - x0) / h;
  // K(u) and K'(u); d K / d h = K'(u) (-u / h), d K / d x0 = K'(u) (-1 / h).
  double k = 0, dk = 0;
  switch (kernel) {
    case ContinuousKernel::gaussian:
      k = std::exp(-0.5 * u * u);
      dk = -u * k;
      break;
    case ContinuousKernel::epanechnikov:
      if (std::abs(u) <= 1) k = 1 - u * u, dk = -2 * u;
      break;
    case ContinuousKernel::boxcar:
      if (std::abs(u) <= 1) k = 1;
      break;
    case ContinuousKernel::tricube: {
      const double a = std::abs(u);
      if (a <= 1) {
        const double t = 1 - a * a * a;
        k = t * t * t;
        dk = -9 * u * a * t * t;
      }
      break;
    }
  }
  return {k, -dk * u / h, -dk / h};
}

KernelValue unordered_kernel(double xj, double x0, double lambda, int levels) {
  if (xj == x0) return {1 - lambda, -1, 0};
  const double c = 1.0 / (levels - 1);
  return {lambda * c, c, 0};
}

KernelValue ordered_kernel(double xj, double x0, double lambda) {
  if (xj == x0) return {1 - lambda, -1, 0};
  const double d = std::abs(xj - x0);
  const double p = std::pow(lambda, d);
  const double dp = d * std::pow(lambda, d - 1);
  return {0.5 * (1 - lambda) * p, 0.5 * (-p + (1 - lambda) * dp), 0};
}

double discrete_bandwidth_limit(RegressorType type, int levels) {
  return type == RegressorType::unordered ? static_cast<double>(levels - 1) / levels : 1.0;
}

void check_bandwidths(const KernelRegression& model, std::span<const double> h, const char* op) {
  const auto& types = KernelRegressionAccess::types(model);
  const auto& levels = KernelRegressionAccess::levels(model);
  if (static_cast<index_t>(h.size()) != model.regressors())
    detail::fail(op, ": bandwidths has ", h.size(), " values; it must have one per regressor (", model.regressors(),
                 ")");
  for (std::size_t c = 0; c < h.size(); ++c) {
    if (types[c] == RegressorType::continuous) {
      if (!(h[c] > 0 && std::isfinite(h[c])))
        detail::fail(op, ": bandwidths[", c, "] is ", h[c], "; a continuous regressor's must be positive and finite");
    } else {
      const double limit = discrete_bandwidth_limit(types[c], levels[c]);
      if (!(h[c] >= 0 && h[c] <= limit))
        detail::fail(op, ": bandwidths[", c, "] is ", h[c], "; this ",
                     types[c] == RegressorType::unordered ? "unordered" : "ordered", " regressor's must lie in [0, ",
                     limit, "]");
    }
  }
}

double normal_quantile(double p) {
  // Acklam's coefficients.
  static constexpr double a[] = {-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
                                 1.383577518672690e+02,  -3.066479806614716e+01, 2.506628277459239e+00};
  static constexpr double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                                 6.680131188771972e+01,  -1.328068155288572e+01};
  static constexpr double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                                 -2.549732539343734e+00, 4.374664141464968e+00,  2.938163982698783e+00};
  static constexpr double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                                 3.754408661907416e+00};
  double x;
  if (p < 0.02425) {
    const double q = std::sqrt(-2 * std::log(p));
    x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  } else if (p > 1 - 0.02425) {
    const double q = std::sqrt(-2 * std::log(1 - p));
    x = -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  } else {
    const double q = p - 0.5, r = q * q;
    x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
  }
  // One Halley step on Phi(x) - p, Phi(x) = erfc(-x / sqrt 2) / 2.
  const double e = 0.5 * std::erfc(-x / std::sqrt(2.0)) - p;
  const double u = e * std::sqrt(2 * M_PI) * std::exp(x * x / 2);
  return x - u / (1 + x * u / 2);
}

LocalFitter::LocalFitter(const KernelRegression& model, std::span<const double> bandwidths, const Design& design)
    : model_(model),
      h_(bandwidths),
      design_(design),
      types_(KernelRegressionAccess::types(model)),
      x_(KernelRegressionAccess::x(model)),
      y_(KernelRegressionAccess::y(model)),
      k_(model.regressors()),
      q_(design.size()) {
  for (index_t c = 0; c < k_; ++c)
    if (types_[c] == RegressorType::continuous) continuous_columns_.push_back(static_cast<int>(c));
  r_.resize(static_cast<std::size_t>(q_) * q_);
  rhs_.resize(q_);
  v_.resize(q_);
  work_.resize(q_);
  kval_.resize(k_);
  kdh_.resize(k_);
  kdx_.resize(k_);
  u_.resize(continuous_columns_.size());
  column_norms_.resize(q_);
  beta_.resize(q_);
  sums_dx_.resize(continuous_columns_.size());
  sums_dxy_.resize(continuous_columns_.size());
}

void LocalFitter::reset() {
  rows_.clear(), w_.clear(), z_.clear(), dw_.clear();
  std::fill(r_.begin(), r_.end(), 0.0);
  std::fill(rhs_.begin(), rhs_.end(), 0.0);
  std::fill(column_norms_.begin(), column_norms_.end(), 0.0);
  std::fill(sums_dx_.begin(), sums_dx_.end(), 0.0);
  std::fill(sums_dxy_.begin(), sums_dxy_.end(), 0.0);
  sums_w_ = 0;
}

double LocalFitter::add_row(index_t j, const double* x0, bool with_gradient) {
  const double* xj = x_.data() + j * k_;
  const auto& levels = KernelRegressionAccess::levels(model_);
  double w = 1;
  int p = 0;
  for (index_t c = 0; c < k_; ++c) {
    KernelValue kv;
    switch (types_[c]) {
      case RegressorType::continuous:
        kv = continuous_kernel(model_.options().kernel, xj[c], x0[c], h_[c]);
        u_[p++] = (xj[c] - x0[c]) / h_[c];
        break;
      case RegressorType::unordered:
        kv = unordered_kernel(xj[c], x0[c], h_[c], levels[c]);
        break;
      case RegressorType::ordered:
        kv = ordered_kernel(xj[c], x0[c], h_[c]);
        break;
    }
    kval_[c] = kv.k, kdh_[c] = kv.d_h, kdx_[c] = kv.d_x0;
    w *= kv.k;
  }
  if (w == 0) return 0;  // outside a compact kernel's support (a discrete bandwidth of exactly 0 also
                       // leaves its d W / d h out: the search never reaches 0)
  // The design row z (q,) of the monomials of u.
  const std::size_t base = z_.size();
  z_.resize(base + q_);
  double* z = z_.data() + base;
  for (int t = 0; t < q_; ++t) {
    double term = 1;
    for (int f : design_.terms[t]) term *= u_[f];
    z[t] = term;
  }
  rows_.push_back(j);
  w_.push_back(w);
  if (with_gradient) {
    // d W / d h_c = dK_c prod_{c' != c} K_c', by prefix and suffix products.
    const std::size_t at = dw_.size();
    dw_.resize(at + k_);
    double prefix = 1;
    for (index_t c = 0; c < k_; ++c) {
      dw_[at + c] = prefix * kdh_[c];
      prefix *= kval_[c];
    }
    double suffix = 1;
    for (index_t c = k_ - 1; c >= 0; --c) {
      dw_[at + c] *= suffix;
      suffix *= kval_[c];
    }
  }
  // Givens rotations of the row [sqrt(w) z, sqrt(w) y_j] into R and Q' sqrt(W) y.
  const double s = std::sqrt(w);
  for (int t = 0; t < q_; ++t) work_[t] = s * z[t];
  double b = s * y_[j];
  for (int t = 0; t < q_; ++t) {
    if (work_[t] == 0) continue;
    double* rt = r_.data() + static_cast<std::size_t>(t) * q_;
    const double rr = std::hypot(rt[t], work_[t]);
    const double cs = rt[t] / rr, sn = work_[t] / rr;
    for (int c = t; c < q_; ++c) {
      const double a = rt[c], e = work_[c];
      rt[c] = cs * a + sn * e;
      work_[c] = -sn * a + cs * e;
    }
    const double a = rhs_[t];
    rhs_[t] = cs * a + sn * b;
    b = -sn * a + cs * b;
  }
  for (int t = 0; t < q_; ++t) column_norms_[t] += w * z[t] * z[t];
  // The degree-0 slopes' sums.
  sums_w_ += w;
  for (std::size_t pc = 0; pc < continuous_columns_.size(); ++pc) {
    const int c = continuous_columns_[pc];
    const double dwdx = kval_[c] != 0 ? w / kval_[c] * kdx_[c] : 0;
    sums_dx_[pc] += dwdx;
    sums_dxy_[pc] += dwdx * y_[j];
  }
  return w;
}


void LocalFitter::visit_window(const double* x0, index_t leave_out, bool with_gradient) {
  const auto& order = KernelRegressionAccess::order(model_);
  const auto& sorted = KernelRegressionAccess::sorted(model_);
  const int sc = KernelRegressionAccess::sort_column(model_);
  const index_t n = model_.size();
  auto add = [&](index_t s) { return order[s] == leave_out ? 0.0 : add_row(order[s], x0, with_gradient); };
  if (sc < 0) {  // no continuous regressor: every point
    for (index_t s = 0; s < n; ++s) add(s);
    return;
  }
  const double h = h_[sc], at = x0[sc];
  if (model_.options().kernel != ContinuousKernel::gaussian) {
    // |x - x0| <= h, widened by a few ulps: the kernel itself decides at the edge.
    const double reach = h * (1 + 1e-12);
    const auto lo = std::lower_bound(sorted.begin(), sorted.end(), at - reach) - sorted.begin();
    const auto hi = std::upper_bound(sorted.begin(), sorted.end(), at + reach) - sorted.begin();
    for (index_t s = lo; s < hi; ++s) add(s);
    return;
  }
  // The Gaussian, from the nearest outwards along the sort column. A point at |u_s| along it weighs
  // at most exp(-u_s^2 / 2) and its design terms at most |u|^(2 degree) (u >= u_s); once that bound,
  // decreasing past u_s^2 > 2 degree, is below 2^-60 / n of the largest weight seen, every point
  // further out on that side is dropped.
  const double degree = design_.degree;
  const double floor = std::ldexp(1.0, -60) / static_cast<double>(n);
  index_t right = std::lower_bound(sorted.begin(), sorted.end(), at) - sorted.begin();
  index_t left = right - 1;
  double largest = 0;
  auto negligible = [&](double u) {
    const double t = u * u;
    return t > 2 * degree && std::exp(-0.5 * t) * std::pow(std::max(t, 1.0), degree) < largest * floor;
  };
  while (left >= 0 || right < n) {
    const double ul = left >= 0 ? (at - sorted[left]) / h : std::numeric_limits<double>::infinity();
    const double ur = right < n ? (sorted[right] - at) / h : std::numeric_limits<double>::infinity();
    const bool take_left = ul <= ur;
    if (negligible(take_left ? ul : ur)) break;  // the nearer side is negligible, so is the other
    largest = std::max(largest, add(take_left ? left-- : right++));
  }
}

index_t LocalFitter::nearest_point(const double* x0, index_t leave_out) const {
  index_t best = -1;
  double best_distance = std::numeric_limits<double>::infinity();
  for (index_t j = 0; j < model_.size(); ++j) {
    if (j == leave_out) continue;
    const double* xj = x_.data() + j * k_;
    double d = 0;
    for (index_t c = 0; c < k_; ++c) {
      if (types_[c] == RegressorType::continuous) {
        const double u = (xj[c] - x0[c]) / h_[c];
        d += u * u;
      } else {
        d += xj[c] != x0[c];
      }
    }
    if (d < best_distance) best_distance = d, best = j;
  }
  return best;
}

PointFit LocalFitter::fit(const double* x0, index_t leave_out, bool with_gradient, double* slopes) {
  reset();
  visit_window(x0, leave_out, with_gradient);
  PointFit result;
  if (rows_.empty()) {
    result.empty = true;
    result.nearest = nearest_point(x0, leave_out);
    result.mean = y_[result.nearest];
    if (slopes) std::fill(slopes, slopes + k_, 0.0);
    terms_used_ = 0;
    last_ = result;
    return result;
  }
  // The highest degree whose leading block of R is not singular: a diagonal entry at 1e-9 of its
  // column's weighted norm or less means the column is (nearly) a combination of those before it.
  int degree = design_.degree;
  auto singular = [&](int t) {
    return !(column_norms_[t] > 0) ||
           std::abs(r_[static_cast<std::size_t>(t) * q_ + t]) <= 1e-9 * std::sqrt(column_norms_[t]);
  };
  while (degree > 0) {
    bool ok = true;
    for (int t = 0; t < design_.terms_up_to[degree] && ok; ++t) ok = !singular(t);
    if (ok) break;
    --degree;
  }
  const int T = design_.terms_up_to[degree];
  terms_used_ = T;
  auto row = [&](int t) { return r_.data() + static_cast<std::size_t>(t) * q_; };
  // beta = R^-1 (Q' sqrt(W) y); v = A^-1 e0 = R^-1 R^-T e0.
  std::fill(beta_.begin(), beta_.end(), 0.0);
  std::fill(v_.begin(), v_.end(), 0.0);
  for (int t = T - 1; t >= 0; --t) {
    double acc = rhs_[t];
    for (int c = t + 1; c < T; ++c) acc -= row(t)[c] * beta_[c];
    beta_[t] = acc / row(t)[t];
  }
  for (int t = 0; t < T; ++t) {  // R^T s = e0
    double acc = t == 0 ? 1.0 : 0.0;
    for (int c = 0; c < t; ++c) acc -= row(c)[t] * work_[c];
    work_[t] = acc / row(t)[t];
  }
  for (int t = T - 1; t >= 0; --t) {
    double acc = work_[t];
    for (int c = t + 1; c < T; ++c) acc -= row(t)[c] * v_[c];
    v_[t] = acc / row(t)[t];
  }
  result.mean = beta_[0];
  result.degree_used = degree;
  if (slopes) {
    std::fill(slopes, slopes + k_, 0.0);
    for (std::size_t p = 0; p < continuous_columns_.size(); ++p) {
      const int c = continuous_columns_[p];
      slopes[c] = degree >= 1 ? beta_[1 + p] / h_[c] : (sums_dxy_[p] - result.mean * sums_dx_[p]) / sums_w_;
    }
  }
  last_ = result;
  return result;
}

void LocalFitter::mean_gradient(double* out) const {
  std::fill(out, out + k_, 0.0);
  if (last_.empty) return;
  for (std::size_t r = 0; r < rows_.size(); ++r) {
    const double* z = z_.data() + r * q_;
    double zv = 0, zb = 0;
    for (int t = 0; t < terms_used_; ++t) zv += z[t] * v_[t], zb += z[t] * beta_[t];
    const double g = zv * (y_[rows_[r]] - zb);
    const double* dw = dw_.data() + r * k_;
    for (index_t c = 0; c < k_; ++c) out[c] += dw[c] * g;
  }
}

void LocalFitter::smoother_weights(std::vector<Weight>& out) const {
  out.clear();
  if (last_.empty) {
    out.push_back({last_.nearest, 1.0});
    return;
  }
  for (std::size_t r = 0; r < rows_.size(); ++r) {
    const double* z = z_.data() + r * q_;
    double zv = 0;
    for (int t = 0; t < terms_used_; ++t) zv += z[t] * v_[t];
    out.push_back({rows_[r], w_[r] * zv});
  }
}

double LocalFitter::hat_diagonal(index_t i, double* gradient) const {
  if (gradient) std::fill(gradient, gradient + k_, 0.0);
  if (last_.empty) return last_.nearest == i ? 1.0 : 0.0;
  // z_i = e0 (u = 0), so H_ii = W_ii e0' A^-1 e0 = W_ii v_0, W_ii the product of the kernels at 0:
  // 1 for the continuous ones, 1 - lambda for the discrete.
  double wii = 1;
  for (index_t c = 0; c < k_; ++c)
    if (types_[c] != RegressorType::continuous) wii *= 1 - h_[c];
  const double hii = wii * v_[0];
  if (gradient) {
    // d H_ii = dW_ii v_0 - W_ii v' dA v, dA = sum_j dW_j z_j z_j'.
    for (std::size_t r = 0; r < rows_.size(); ++r) {
      const double* z = z_.data() + r * q_;
      double zv = 0;
      for (int t = 0; t < terms_used_; ++t) zv += z[t] * v_[t];
      const double* dw = dw_.data() + r * k_;
      for (index_t c = 0; c < k_; ++c) gradient[c] -= wii * dw[c] * zv * zv;
    }
    for (index_t c = 0; c < k_; ++c) {
      if (types_[c] == RegressorType::continuous) continue;
      double others = 1;
      for (index_t c2 = 0; c2 < k_; ++c2)
        if (c2 != c && types_[c2] != RegressorType::continuous) others *= 1 - h_[c2];
      gradient[c] -= others * v_[0];
    }
  }
  return hii;
}

}  // namespace attn::kreg
