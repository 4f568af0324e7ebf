// Reference local polynomial kernel regression: every point's fit from the full dense design over all
// n points and the normal equations in long double (see kernel_regression.hpp). The optimized code
// (src/kreg) shares nothing with this file.
//
// The Gaussian factor of column c is computed as exp(-(u^2 - min_j u^2) / 2): a constant factor
// per column and per x0, which cancels in every weighted least-squares fit and in its smoother weights,
// so a query far from the data keeps weights that do not underflow (the header's Gaussian fit is never
// empty). Its derivative in x0 is taken as if that constant were fixed; the term it drops is
// d(log constant)/dx0 * sum_j W_j (y_j - m) = 0 for the local constant fit, the only one that uses it.
#include "ref/kernel_regression.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

namespace attn::ref {
namespace {

using real = long double;

// A pivot of the Jacobi-scaled normal matrix (unit diagonal) below this marks a singular design. Such
// a design's pivot is a rounding error, about n 1e-19 in long double; a design of condition number
// 1e6 still has pivots near 1e-12 (the normal matrix squares it). The header sets no threshold (the
// optimized QR takes |R_tt| <= 1e-9 of its column's norm, a pivot of 1e-18 here): the tests use
// designs that are exactly singular or far from it.
constexpr real kSingularPivot = 1e-14L;

// The exponent vectors of the monomials of total degree <= degree in nc variables, by total degree:
// the constant first, then u_1, ..., u_nc (in column order), then the higher terms.
std::vector<std::vector<int>> monomials(int nc, int degree) {
  std::vector<std::vector<int>> all;
  std::vector<int> e(static_cast<std::size_t>(nc), 0);
  // Every e with e[pos] + ... + e[nc - 1] = left, e[pos] from the largest down.
  auto fill = [&](auto& self, int pos, int left) -> void {
    if (pos == nc) {
      if (left == 0) all.push_back(e);
      return;
    }
    for (int a = left; a >= 0; --a) {
      e[static_cast<std::size_t>(pos)] = a;
      self(self, pos + 1, left - a);
    }
    e[static_cast<std::size_t>(pos)] = 0;
  };
  for (int total = 0; total <= degree; ++total) fill(fill, 0, total);
  return all;
}

// One column's kernel factor K_c(x, x0; h) and, for a continuous column, dK_c/dx0 (the Gaussian's
// without its per-column constant, see above: `shift` = min_j u^2 of the column).
struct Factor {
  real value = 0, d_x0 = 0;
};

Factor kernel_factor(const KregData& d, int c, real x, real x0, real h, real shift) {
  switch (d.types[static_cast<std::size_t>(c)]) {
    case RegressorType::unordered: {
      const real levels = d.levels[static_cast<std::size_t>(c)];
      return {x == x0 ? 1 - h : h / (levels - 1), 0};
    }
    case RegressorType::ordered:
      return {x == x0 ? 1 - h : (1 - h) * std::pow(h, std::fabs(x - x0)) / 2, 0};
    case RegressorType::continuous:
      break;
  }
  const real u = (x - x0) / h, a = std::fabs(u);
  switch (d.kernel) {
    case ContinuousKernel::gaussian: {
      const real K = std::exp(-(u * u - shift) / 2);
      return {K, K * u / h};  // dK/du = -u K, du/dx0 = -1/h
    }
    case ContinuousKernel::epanechnikov:
      return a <= 1 ? Factor{1 - u * u, 2 * u / h} : Factor{};
    case ContinuousKernel::boxcar:
      return a <= 1 ? Factor{1, 0} : Factor{};
    case ContinuousKernel::tricube: {
      if (a > 1) return {};
      const real t = 1 - a * a * a;
      return {t * t * t, 9 * u * a * t * t / h};  // dK/du = -9 u |u| t^2
    }
  }
  return {};
}

// The product kernel's weights W_j(x0) (n,) and dW_j/dx0_c (n, k), point `leave_out` at 0.
struct Weights {
  std::vector<real> w, dw;
};

Weights product_weights(const KregData& d, std::span<const double> h, std::span<const double> x0, index_t leave_out) {
  const index_t n = d.n, k = d.k;
  Weights W{std::vector<real>(static_cast<std::size_t>(n), 1), std::vector<real>(static_cast<std::size_t>(n * k), 0)};
  for (index_t c = 0; c < k; ++c) {
    real shift = 0;
    if (d.types[c] == RegressorType::continuous && d.kernel == ContinuousKernel::gaussian) {
      shift = std::numeric_limits<real>::infinity();
      for (index_t j = 0; j < n; ++j) {
        if (j == leave_out) continue;
        const real u = (static_cast<real>(d.x[j * k + c]) - x0[c]) / h[c];
        shift = std::min(shift, u * u);
      }
    }
    for (index_t j = 0; j < n; ++j) {
      const Factor f =
          j == leave_out ? Factor{} : kernel_factor(d, static_cast<int>(c), d.x[j * k + c], x0[c], h[c], shift);
      // The product rule: the earlier columns' derivatives take this factor, this column's is the
      // product so far times this factor's derivative.
      for (index_t e = 0; e < c; ++e) W.dw[j * k + e] *= f.value;
      W.dw[j * k + c] = W.w[j] * f.d_x0;
      W.w[j] *= f.value;
    }
  }
  return W;
}

// Solves A x = b in place of b, A (m, m) row-major symmetric with a positive diagonal (a normal
// matrix), by Gaussian elimination with partial pivoting on the Jacobi-scaled system
// (S A S)(S^-1 x) = S b, S = diag(A)^-1/2, whose pivots are free of the columns' scales. false where a
// diagonal entry is 0 or a pivot is below kSingularPivot: the design is singular.
bool solve_normal(std::vector<real> A, std::vector<real>& b, int m) {
  std::vector<real> s(static_cast<std::size_t>(m));
  for (int i = 0; i < m; ++i) {
    if (!(A[i * m + i] > 0)) return false;
    s[i] = 1 / std::sqrt(A[i * m + i]);
  }
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < m; ++j) A[i * m + j] *= s[i] * s[j];
    b[i] *= s[i];
  }
  for (int col = 0; col < m; ++col) {
    int piv = col;
    for (int r = col + 1; r < m; ++r)
      if (std::fabs(A[r * m + col]) > std::fabs(A[piv * m + col])) piv = r;
    if (std::fabs(A[piv * m + col]) < kSingularPivot) return false;
    if (piv != col) {
      for (int j = 0; j < m; ++j) std::swap(A[piv * m + j], A[col * m + j]);
      std::swap(b[piv], b[col]);
    }
    for (int r = col + 1; r < m; ++r) {
      const real f = A[r * m + col] / A[col * m + col];
      for (int j = col; j < m; ++j) A[r * m + j] -= f * A[col * m + j];
      b[r] -= f * b[col];
    }
  }
  for (int i = m - 1; i >= 0; --i) {
    real acc = b[i];
    for (int j = i + 1; j < m; ++j) acc -= A[i * m + j] * b[j];
    b[i] = acc / A[i * m + i];
  }
  for (int i = 0; i < m; ++i) b[i] *= s[i];
  return true;
}

// The weighted least-squares fit at one point, kept whole for the callers: the weights, the degree
// solved and its terms, the design z_j(x0) (n, m), the coefficients beta = A^-1 Z'Wy and
// v = A^-1 e1 (so l_j = W_j v' z_j). Where no point has weight, `nearest` is the point used instead.
struct Local {
  Weights W;
  int degree = 0;
  std::vector<std::vector<int>> terms;
  std::vector<real> design, beta, v;
  index_t nearest = -1;
};

// The nearest point to x0 other than leave_out, by the squared distance in bandwidth units: u^2 for
// a continuous column, 1 for a discrete column whose value differs (the header leaves the discrete
// part open; this is src/kreg's reading); the first such point on ties.
index_t nearest_point(const KregData& d, std::span<const double> h, std::span<const double> x0, index_t leave_out) {
  index_t best = -1;
  real best_d2 = std::numeric_limits<real>::infinity();
  for (index_t j = 0; j < d.n; ++j) {
    if (j == leave_out) continue;
    real d2 = 0;
    for (index_t c = 0; c < d.k; ++c) {
      const real u = (static_cast<real>(d.x[j * d.k + c]) - x0[c]) / h[c];
      d2 += d.types[c] == RegressorType::continuous ? u * u : real(d.x[j * d.k + c] != x0[c]);
    }
    if (d2 < best_d2) best = j, best_d2 = d2;
  }
  return best;
}

Local local_fit(const KregData& d, std::span<const double> h, std::span<const double> x0, index_t leave_out) {
  const index_t n = d.n, k = d.k;
  Local L;
  L.W = product_weights(d, h, x0, leave_out);
  real total = 0;
  for (const real w : L.W.w) total += w;
  if (!(total > 0)) {
    L.nearest = nearest_point(d, h, x0, leave_out);
    return L;
  }
  std::vector<index_t> continuous;
  for (index_t c = 0; c < k; ++c)
    if (d.types[c] == RegressorType::continuous) continuous.push_back(c);
  for (L.degree = d.degree; L.degree >= 0; --L.degree) {
    L.terms = monomials(static_cast<int>(continuous.size()), L.degree);
    const int m = static_cast<int>(L.terms.size());
    L.design.assign(static_cast<std::size_t>(n * m), 0);
    for (index_t j = 0; j < n; ++j)
      for (int t = 0; t < m; ++t) {
        real z = 1;
        for (std::size_t q = 0; q < continuous.size(); ++q) {
          const index_t c = continuous[q];
          const real u = (static_cast<real>(d.x[j * k + c]) - x0[c]) / h[c];
          for (int p = 0; p < L.terms[t][q]; ++p) z *= u;
        }
        L.design[j * m + t] = z;
      }
    std::vector<real> A(static_cast<std::size_t>(m * m), 0);
    L.beta.assign(static_cast<std::size_t>(m), 0);
    for (index_t j = 0; j < n; ++j)
      for (int a = 0; a < m; ++a) {
        for (int b = 0; b < m; ++b) A[a * m + b] += L.W.w[j] * L.design[j * m + a] * L.design[j * m + b];
        L.beta[a] += L.W.w[j] * L.design[j * m + a] * d.y[j];
      }
    L.v.assign(static_cast<std::size_t>(m), 0);
    L.v[0] = 1;
    if (solve_normal(A, L.beta, m) && solve_normal(A, L.v, m)) return L;
  }
  return L;  // not reached: the degree-0 normal matrix is sum W > 0
}

// The estimate and slopes of a solved local fit.
KregPoint point_of(const KregData& d, std::span<const double> h, const Local& L) {
  KregPoint p;
  p.slopes.assign(static_cast<std::size_t>(d.k), 0);
  if (L.nearest >= 0) {
    p.empty = true;
    p.mean = d.y[L.nearest];
    return p;
  }
  p.degree_used = L.degree;
  p.mean = static_cast<double>(L.beta[0]);
  if (L.degree == 0) {
    // The derivative of the local constant m = sum W_j y_j / sum W_j (also where a higher degree fell
    // back to it: the slopes are those of the fit solved; the header leaves this case open):
    //   dm/dx0_c = sum_j dW_j/dx0_c (y_j - m) / sum_j W_j.
    real total = 0;
    for (const real w : L.W.w) total += w;
    for (index_t c = 0; c < d.k; ++c) {
      real acc = 0;
      for (index_t j = 0; j < d.n; ++j) acc += L.W.dw[j * d.k + c] * (d.y[j] - L.beta[0]);
      p.slopes[c] = static_cast<double>(acc / total);
    }
  } else {
    // The coefficient of u_c = (x_c - x0_c) / h_c is h_c times the slope: term 1 + q is u_q's.
    for (index_t c = 0, q = 0; c < d.k; ++c) {
      if (d.types[c] != RegressorType::continuous) continue;
      p.slopes[c] = static_cast<double>(L.beta[1 + q] / h[c]);
      ++q;
    }
  }
  return p;
}

// Its smoother weights l_j = W_j v' z_j (n,).
std::vector<double> weights_of(const KregData& d, const Local& L) {
  std::vector<double> l(static_cast<std::size_t>(d.n), 0);
  if (L.nearest >= 0) {
    l[L.nearest] = 1;
    return l;
  }
  const std::size_t m = L.terms.size();
  for (index_t j = 0; j < d.n; ++j) {
    real vz = 0;
    for (std::size_t t = 0; t < m; ++t) vz += L.v[t] * L.design[j * m + t];
    l[j] = static_cast<double>(L.W.w[j] * vz);
  }
  return l;
}

// The fitted values m(x_i) and the smoother matrix L (n, n), row i = l(x_i).
struct Smoother {
  std::vector<double> fitted, L;
};

Smoother smoother_at_data(const KregData& d, std::span<const double> h) {
  const index_t n = d.n;
  Smoother S{std::vector<double>(static_cast<std::size_t>(n)), std::vector<double>(static_cast<std::size_t>(n * n))};
  for (index_t i = 0; i < n; ++i) {
    const std::span<const double> xi(d.x.data() + i * d.k, static_cast<std::size_t>(d.k));
    const Local L = local_fit(d, h, xi, -1);
    const std::vector<double> l = weights_of(d, L);
    std::copy(l.begin(), l.end(), S.L.begin() + i * n);
    S.fitted[i] = point_of(d, h, L).mean;
  }
  return S;
}

}  // namespace

KregData kreg_data(TensorView<const double> x, TensorView<const double> y, const KernelRegOptions& options) {
  KregData d;
  d.n = x.dim(0);
  d.k = x.rank() == 1 ? 1 : x.dim(1);
  for (const char letter : options.var_type)
    d.types.push_back(letter == 'u'   ? RegressorType::unordered
                      : letter == 'o' ? RegressorType::ordered
                                      : RegressorType::continuous);
  d.degree = options.degree;
  d.kernel = options.kernel;
  d.x.resize(static_cast<std::size_t>(d.n * d.k));
  d.y.resize(static_cast<std::size_t>(d.n));
  for (index_t i = 0; i < d.n; ++i) {
    for (index_t c = 0; c < d.k; ++c) d.x[i * d.k + c] = x.rank() == 1 ? x(i) : x(i, c);
    d.y[i] = y(i);
  }
  d.levels.assign(static_cast<std::size_t>(d.k), 0);
  for (index_t c = 0; c < d.k; ++c) {
    if (d.types[c] != RegressorType::unordered) continue;
    std::set<double> distinct;
    for (index_t i = 0; i < d.n; ++i) distinct.insert(d.x[i * d.k + c]);
    d.levels[c] = static_cast<int>(distinct.size());
  }
  return d;
}

KregPoint kreg_fit_at(const KregData& d, std::span<const double> h, std::span<const double> x0, index_t leave_out) {
  return point_of(d, h, local_fit(d, h, x0, leave_out));
}

KernelFit kreg_fit(const KregData& d, std::span<const double> h, std::span<const double> queries) {
  const std::span<const double> points = queries.empty() ? std::span<const double>(d.x) : queries;
  const index_t nq = static_cast<index_t>(points.size()) / d.k;
  KernelFit f;
  for (index_t i = 0; i < nq; ++i) {
    const KregPoint p =
        kreg_fit_at(d, h, points.subspan(static_cast<std::size_t>(i * d.k), static_cast<std::size_t>(d.k)));
    f.mean.push_back(p.mean);
    f.slopes.insert(f.slopes.end(), p.slopes.begin(), p.slopes.end());
    f.empty += p.empty;
    f.reduced += !p.empty && p.degree_used < d.degree;
  }
  return f;
}

std::vector<double> kreg_smoother_weights(const KregData& d, std::span<const double> h, std::span<const double> x0,
                                          index_t leave_out) {
  return weights_of(d, local_fit(d, h, x0, leave_out));
}

double kreg_cv_ls(const KregData& d, std::span<const double> h) {
  real sum = 0;
  for (index_t i = 0; i < d.n; ++i) {
    const std::span<const double> xi(d.x.data() + i * d.k, static_cast<std::size_t>(d.k));
    const real e = d.y[i] - static_cast<real>(kreg_fit_at(d, h, xi, i).mean);
    sum += e * e;
  }
  return static_cast<double>(sum / d.n);
}

double kreg_aicc(const KregData& d, std::span<const double> h) {
  real rss = 0, trace = 0;
  for (index_t i = 0; i < d.n; ++i) {
    const Local L = local_fit(d, h, std::span<const double>(d.x.data() + i * d.k, static_cast<std::size_t>(d.k)), -1);
    const real e = d.y[i] - static_cast<real>(point_of(d, h, L).mean);
    rss += e * e;
    // H_ii = e1' A_i^-1 z_i(x_i) W_i(x_i): the smoother weight of point i at its own x.
    trace += weights_of(d, L)[i];
  }
  const real n = d.n;
  if (trace + 2 >= n) return std::numeric_limits<double>::infinity();
  return static_cast<double>(std::log(rss / n) + (1 + trace / n) / (1 - (trace + 2) / n));
}

std::vector<double> kreg_standard_errors(const KregData& d, std::span<const double> h,
                                         std::span<const double> queries) {
  const index_t n = d.n;
  const Smoother S = smoother_at_data(d, h);
  real rss = 0, trace = 0, trace_hh = 0;
  for (index_t i = 0; i < n; ++i) {
    rss += (d.y[i] - static_cast<real>(S.fitted[i])) * (d.y[i] - static_cast<real>(S.fitted[i]));
    trace += S.L[i * n + i];
    for (index_t j = 0; j < n; ++j) trace_hh += static_cast<real>(S.L[i * n + j]) * S.L[i * n + j];
  }
  const real sigma2 = rss / (n - 2 * trace + trace_hh);
  const std::span<const double> points = queries.empty() ? std::span<const double>(d.x) : queries;
  std::vector<double> se;
  for (std::size_t q = 0; q < points.size(); q += static_cast<std::size_t>(d.k)) {
    real sum_l2 = 0;
    for (const double l : kreg_smoother_weights(d, h, points.subspan(q, static_cast<std::size_t>(d.k))))
      sum_l2 += static_cast<real>(l) * l;
    se.push_back(static_cast<double>(std::sqrt(sigma2 * sum_l2)));
  }
  return se;
}

double kreg_r_squared(const KregData& d, std::span<const double> h) {
  const std::vector<double> fitted = kreg_fit(d, h).mean;
  real ybar = 0;
  for (const double m : fitted) ybar += m;
  ybar /= d.n;
  real cross = 0, yy = 0, mm = 0;
  for (index_t i = 0; i < d.n; ++i) {
    cross += (d.y[i] - ybar) * (fitted[i] - ybar);
    yy += (d.y[i] - ybar) * (d.y[i] - ybar);
    mm += (fitted[i] - ybar) * (fitted[i] - ybar);
  }
  return static_cast<double>(cross * cross / (yy * mm));
}

}  // namespace attn::ref
