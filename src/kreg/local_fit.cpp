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
  // A term's value is its parent's (the term without its last factor, of lower degree, so earlier)
  // times that factor.
  parent.assign(terms.size(), -1);
  last_factor.assign(terms.size(), -1);
  for (std::size_t t = 1; t < terms.size(); ++t) {
    std::vector<int> head(terms[t].begin(), terms[t].end() - 1);
    parent[t] = static_cast<int>(std::find(terms.begin(), terms.end(), head) - terms.begin());
    last_factor[t] = terms[t].back();
  }
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

LocalFitter::LocalFitter(const KernelRegression& model, std::span<const double> bandwidths, const Design& design,
                         cpu::simd::Target simd)
    : model_(model),
      h_(bandwidths),
      design_(design),
      types_(KernelRegressionAccess::types(model)),
      x_(KernelRegressionAccess::x(model)),
      y_(KernelRegressionAccess::y(model)),
      k_(model.regressors()),
      q_(design.size()),
      kernel_(model.options().kernel) {
  for (index_t c = 0; c < k_; ++c) {
    if (types_[c] == RegressorType::continuous) continuous_columns_.push_back(static_cast<int>(c));
    inverse_h_.push_back(1 / h_[c]);
  }
  r_.resize(static_cast<std::size_t>(q_) * q_);
  gram_.resize(static_cast<std::size_t>(q_) * q_);
  rhs_.resize(q_);
  zy_.resize(q_);
  v_.resize(q_);
  work_.resize(q_);
  kval_.resize(k_);
  kdh_.resize(k_);
  kdx_.resize(k_);
  u_.resize(continuous_columns_.size());
  beta_.resize(q_);
  sums_dx_.resize(continuous_columns_.size());
  sums_dxy_.resize(continuous_columns_.size());
  one_regressor_ = k_ == 1 && types_[0] == RegressorType::continuous;
  simd_ = simd;
}

void LocalFitter::reset() {
  rows_.clear(), w_.clear(), z_.clear(), dw_.clear();
  std::fill(gram_.begin(), gram_.end(), 0.0);
  std::fill(zy_.begin(), zy_.end(), 0.0);
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
        u_[p] = (xj[c] - x0[c]) * inverse_h_[c];
        kv = continuous_kernel(kernel_, u_[p++], inverse_h_[c]);
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
  z[0] = 1;
  for (int t = 1; t < q_; ++t) z[t] = z[design_.parent[t]] * u_[design_.last_factor[t]];
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
  // The normal equations' A = sum_j W_j z_j z_j' (upper triangle) and b = sum_j W_j z_j y_j.
  const double wy = w * y_[j];
  for (int t = 0; t < q_; ++t) {
    const double wz = w * z[t];
    double* at = gram_.data() + static_cast<std::size_t>(t) * q_;
    for (int c = t; c < q_; ++c) at[c] += wz * z[c];
    zy_[t] += wy * z[t];
  }
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
  double largest = 0, cut = std::numeric_limits<double>::infinity();
  index_t right = std::lower_bound(sorted.begin(), sorted.end(), at) - sorted.begin();
  index_t left = right - 1;
  while (left >= 0 || right < n) {
    const double ul = left >= 0 ? (at - sorted[left]) / h : std::numeric_limits<double>::infinity();
    const double ur = right < n ? (sorted[right] - at) / h : std::numeric_limits<double>::infinity();
    // (Both sides can be infinitely far, a point x0 - x_j that overflows: then the side that has a
    // point left.)
    const bool take_left = left >= 0 && (right >= n || ul <= ur);
    const double u = take_left ? ul : ur;
    if (u * u > cut) break;  // the nearer side is negligible, so is the other
    const double weight = add(take_left ? left-- : right++);
    if (weight > largest) largest = weight, cut = gaussian_cut(largest);
  }
}

double LocalFitter::gaussian_cut(double largest) const {
  // The u_s^2 past which exp(-t / 2) t^degree < largest 2^-60 / n: t / 2 - degree log t = -log(largest)
  // - log(2^-60 / n), solved by Newton's method (the left side is convex, increasing past t = 2 degree).
  const double degree = design_.degree;
  const double target = -std::log(largest) - std::log(std::ldexp(1.0, -60) / static_cast<double>(model_.size()));
  double t = 2 * target + 4 * degree + 2;
  for (int it = 0; it < 8; ++it) {
    const double g = 0.5 * t - degree * std::log(t) - target, dg = 0.5 - degree / t;
    t = std::max(t - g / dg, 2 * degree + 1e-9);
  }
  return t * (1 + 1e-9);
}

bool LocalFitter::fit_moments(const double* x0, index_t leave_out, bool with_gradient) {
  const auto& sorted = KernelRegressionAccess::sorted(model_);
  const auto& sorted_y = KernelRegressionAccess::sorted_y(model_);
  const index_t n = model_.size();
  const double at = x0[0], h = h_[0];
  const index_t skip = leave_out >= 0 ? KernelRegressionAccess::rank(model_)[leave_out] : -1;
  double reach = h * (1 + 1e-12);
  if (kernel_ == ContinuousKernel::gaussian) {
    // The nearest point other than the one left out weighs most; the window reaches as far as the
    // expansion of visit_window would.
    index_t right = std::lower_bound(sorted.begin(), sorted.end(), at) - sorted.begin(), left = right - 1;
    if (left == skip) --left;
    if (right == skip) ++right;
    double nearest = std::numeric_limits<double>::infinity();
    if (left >= 0) nearest = std::min(nearest, at - sorted[left]);
    if (right < n) nearest = std::min(nearest, sorted[right] - at);
    const double u = nearest * inverse_h_[0];
    const double largest = std::exp(-0.5 * u * u);
    if (!(largest > 0)) return false;
    reach = h * std::sqrt(gaussian_cut(largest));
  }
  const index_t lo = std::lower_bound(sorted.begin(), sorted.end(), at - reach) - sorted.begin();
  const index_t hi = std::upper_bound(sorted.begin(), sorted.end(), at + reach) - sorted.begin();
  moments_ = {};
  auto run = [&](index_t from, index_t to) {
    if (to > from)
      cpu::fused::kreg_moments(sorted.data() + from, sorted_y.data() + from, to - from, at, inverse_h_[0], kernel_,
                               design_.degree, with_gradient, moments_, simd_);
  };
  if (skip >= lo && skip < hi) {
    run(lo, skip);
    run(skip + 1, hi);
  } else {
    run(lo, hi);
  }
  if (!(moments_.s[0] > 0)) return false;
  for (int t = 0; t < q_; ++t) {  // 1-D terms are the powers u^t: A_st = s[s + t], b_t = t[t]
    for (int c = t; c < q_; ++c) gram_[static_cast<std::size_t>(t) * q_ + c] = moments_.s[t + c];
    zy_[t] = moments_.t[t];
  }
  sums_w_ = moments_.s[0];
  sums_dx_[0] = moments_.gs[0] * inverse_h_[0];
  sums_dxy_[0] = moments_.gt[0] * inverse_h_[0];
  return cholesky();
}

index_t LocalFitter::nearest_point(const double* x0, index_t leave_out) const {
  // Distances in long double (x87's 80 bits on x86-64: exponents to 16383): a query no point weighs
  // is one whose u^2 overflowed float64 or whose weights underflowed, and the nearest point must still
  // be told apart (in float64 every distance was inf, and no point was chosen).
  index_t best = -1;
  if (k_ == 1 && types_[0] == RegressorType::continuous) {
    // One regressor: nearer decided exactly where the two points lie on one side of x0 (far from the
    // data, every distance rounds to the same number).
    const double at = x0[0];
    for (index_t j = 0; j < model_.size(); ++j) {
      if (j == leave_out) continue;
      const double a = x_[static_cast<std::size_t>(j)], b = best < 0 ? 0 : x_[static_cast<std::size_t>(best)];
      const bool nearer = best < 0 || (a <= at && b <= at   ? a > b
                                       : a >= at && b >= at ? a < b
                                                            : std::abs(static_cast<long double>(a) - at) <
                                                                  std::abs(static_cast<long double>(b) - at));
      if (nearer) best = j;
    }
    return best;
  }
  long double best_distance = 0;
  for (index_t j = 0; j < model_.size(); ++j) {
    if (j == leave_out) continue;
    const double* xj = x_.data() + j * k_;
    long double d = 0;
    for (index_t c = 0; c < k_; ++c) {
      if (types_[c] == RegressorType::continuous) {
        const long double u = (static_cast<long double>(xj[c]) - x0[c]) / h_[c];  // 1 / h may overflow
        d += u * u;
      } else {
        d += xj[c] != x0[c];
      }
    }
    if (best < 0 || d < best_distance) best_distance = d, best = j;
  }
  return best;
}

bool LocalFitter::cholesky() {
  auto r = [&](int t, int c) -> double& { return r_[static_cast<std::size_t>(t) * q_ + c]; };
  auto a = [&](int t, int c) { return gram_[static_cast<std::size_t>(t) * q_ + c]; };
  // Cholesky, R'R = A. A_tt / R_tt^2 is column t's variance inflation (1 / (1 - R^2) of t on the columns
  // before it); the largest bounds the digits the normal equations lose below cond(A)'s.
  double inflation = 1;
  bool ok = true;
  for (int t = 0; t < q_ && ok; ++t) {
    double d = a(t, t);
    for (int s = 0; s < t; ++s) d -= r(s, t) * r(s, t);
    if (!(d > 0)) {
      ok = false;
      break;
    }
    inflation = std::max(inflation, a(t, t) / d);
    r(t, t) = std::sqrt(d);
    for (int c = t + 1; c < q_; ++c) {
      double e = a(t, c);
      for (int s = 0; s < t; ++s) e -= r(s, t) * r(s, c);
      r(t, c) = e / r(t, t);
    }
  }
  if (!ok || inflation > kMaxInflation) return false;
  for (int t = 0; t < q_; ++t) {  // rhs = R^-T b, what Q' sqrt(W) y is
    double e = zy_[t];
    for (int s = 0; s < t; ++s) e -= r(s, t) * rhs_[s];
    rhs_[t] = e / r(t, t);
  }
  return true;
}

int LocalFitter::householder() {
  auto r = [&](int t, int c) -> double& { return r_[static_cast<std::size_t>(t) * q_ + c]; };
  auto a = [&](int t, int c) { return gram_[static_cast<std::size_t>(t) * q_ + c]; };
  // Householder QR of the stored rows [sqrt(W) Z | sqrt(W) y] (m, q + 1): R and Q' sqrt(W) y without
  // squaring the condition number.
  const std::size_t m = rows_.size(), width = static_cast<std::size_t>(q_) + 1;
  qr_.assign(m * width, 0.0);
  for (std::size_t i = 0; i < m; ++i) {
    const double s = std::sqrt(w_[i]);
    for (int t = 0; t < q_; ++t) qr_[i * width + t] = s * z_[i * q_ + t];
    qr_[i * width + q_] = s * y_[rows_[i]];
  }
  std::fill(r_.begin(), r_.end(), 0.0);
  std::fill(rhs_.begin(), rhs_.end(), 0.0);
  for (int t = 0; t < q_ && static_cast<std::size_t>(t) < m; ++t) {
    double norm = 0;
    for (std::size_t i = t; i < m; ++i) norm += qr_[i * width + t] * qr_[i * width + t];
    norm = std::sqrt(norm);
    if (norm == 0) continue;
    const double alpha = qr_[t * width + t] > 0 ? -norm : norm;  // the reflection's image of the column
    qr_[t * width + t] -= alpha;                                 // v = x - alpha e_t, in place
    double vv = 0;
    for (std::size_t i = t; i < m; ++i) vv += qr_[i * width + t] * qr_[i * width + t];
    for (std::size_t c = t + 1; c < width; ++c) {
      double dot = 0;
      for (std::size_t i = t; i < m; ++i) dot += qr_[i * width + t] * qr_[i * width + c];
      const double f = 2 * dot / vv;
      for (std::size_t i = t; i < m; ++i) qr_[i * width + c] -= f * qr_[i * width + t];
    }
    r(t, t) = alpha;
    for (int c = t + 1; c < q_; ++c) r(t, c) = qr_[t * width + c];
    rhs_[t] = qr_[t * width + q_];
  }
  // The highest degree whose leading block of R is not singular: |R_tt| at 1e-9 of column t's weighted
  // norm or less means the column is (nearly) a combination of those before it.
  auto singular = [&](int t) { return !(a(t, t) > 0) || std::abs(r(t, t)) <= 1e-9 * std::sqrt(a(t, t)); };
  int degree = design_.degree;
  while (degree > 0) {
    bool full = true;
    for (int t = 0; t < design_.terms_up_to[degree] && full; ++t) full = !singular(t);
    if (full) break;
    --degree;
  }
  return degree;
}

PointFit LocalFitter::fit(const double* x0, index_t leave_out, bool with_gradient, double* slopes, bool with_rows) {
  PointFit result;
  int degree = design_.degree;
  // The degree-0 slopes need the derivative moments too. The moments path writes A, b and the sums
  // whole; the rows path starts from cleared ones.
  from_moments_ = one_regressor_ && !with_rows &&
                  fit_moments(x0, leave_out, with_gradient || (slopes != nullptr && design_.degree == 0));
  if (!from_moments_) {
    reset();
    visit_window(x0, leave_out, with_gradient);
    if (rows_.empty()) {
      result.empty = true;
      result.nearest = nearest_point(x0, leave_out);
      result.mean = y_[result.nearest];
      if (slopes) std::fill(slopes, slopes + k_, 0.0);
      terms_used_ = 0;
      last_ = result;
      return result;
    }
    if (!cholesky()) degree = householder();
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
  if (from_moments_) {
    // sum_j dW_j (z_j . v) (y_j - z_j . beta), dW_j = g_j u_j / h: v . E - v' D beta with
    // E_s = gt[s + 1] / h and D_st = gs[s + t + 1] / h.
    double sum = 0;
    for (int s = 0; s < terms_used_; ++s) {
      sum += v_[s] * moments_.gt[s + 1];
      for (int t = 0; t < terms_used_; ++t) sum -= v_[s] * beta_[t] * moments_.gs[s + t + 1];
    }
    out[0] = sum * inverse_h_[0];
    return;
  }
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
  if (from_moments_) detail::fail("LocalFitter::smoother_weights: the fit did not keep its rows (with_rows)");
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
  if (gradient && from_moments_) {  // - v' dA v, dA_st = gs[s + t + 1] / h
    double sum = 0;
    for (int s = 0; s < terms_used_; ++s)
      for (int t = 0; t < terms_used_; ++t) sum += v_[s] * v_[t] * moments_.gs[s + t + 1];
    gradient[0] = -sum * inverse_h_[0];
    return hii;
  }
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
