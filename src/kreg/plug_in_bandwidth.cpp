// Ruppert, Sheather and Wand's (1995) direct plug-in bandwidth for local linear regression with the
// Gaussian kernel, step for step as KernSmooth's dpill (2.23) with its defaults: blockmax 5, divisor 20,
// trim 0.01, proptrun 0.05, gridsize 401, truncate TRUE. The AMISE-optimal bandwidth is
//   h = ( sigma^2 (b - a) / (2 sqrt(pi) theta_22 n) )^(1/5),   theta_22 = mean of m''(x_i)^2,
// and dpill estimates sigma^2 and theta_22 in four steps (n points after trimming, x units):
//   1. Sort by x and drop floor(0.01 n) points at each end; [a, b] is the range of what is left
//      (dpill's range.x = range(x) is evaluated after that trimming). Linear binning of x and y on
//      M = 401 equally spaced points a + k delta, delta = (b - a) / 400: xcounts, ycounts (M,).
//   2. Blocks: for N = 1..Nmax, Nmax = max(min(floor(n / 20), 5), 1), split the sorted points into N
//      blocks of floor(n / N) (the last takes the rest) and fit a quartic by least squares in each;
//      N is the first minimiser of Mallows' Cp(N) = (n - 5 Nmax) RSS(N) / RSS(Nmax) + 10 N - n.
//      With that N, the quartic fits give sigma^2_Q = RSS / (n - 5 N) (y units^2) and
//      theta_24 = mean m''(x_i) m''''(x_i) (y^2 / x^6).
//   3. The pilot for theta_22: g = (C sigma^2_Q (b - a) / (|theta_24| n))^(1/7) (x units), C = 3 / (8
//      sqrt(pi)) where theta_24 < 0 and 15 / (16 sqrt(pi)) where > 0; m'' at the grid points by binned
//      local cubic fits with bandwidth g; theta_22 = sum over the grid points 21..381 (proptrun 0.05 at
//      each end) of m''(g_k)^2 xcounts_k / n (y^2 / x^4).
//   4. The pilot for sigma^2: lambda = C3 (sigma^4_Q (b - a) / (theta_22 n)^2)^(1/9), C3 = (4 (1/2 + 2
//      sqrt(2) - 4/3 sqrt(3)) / sqrt(2 pi))^(1/9); binned local linear fits with bandwidth lambda give
//      the fitted values m_k and the diagonals S_kk and (S S')_kk of the binned smoother, and
//      sigma^2 = (sum y^2 - 2 sum m_k ycounts_k + sum m_k^2 xcounts_k)
//              / (n - 2 sum S_kk xcounts_k + sum (S S')_kk xcounts_k).
// The binned fits (KernSmooth's locpol, sdiag, sstdg) weight bin j's neighbours k, |k - j| <= L =
// floor(4 h / delta), by exp(-((k - j) delta / h)^2 / 2) and solve the moment equations at each bin.
//
// Where this differs from KernSmooth, on purpose (elsewhere the value agrees to 1e-13 relative on the
// 50 data sets tried, n = 6 to 5000):
//  - Points are sorted by x, ties by y: the result does not depend on the order of the input. R sorts
//    by x alone, stably, so with tied x its trimming and block edges follow the input order.
//  - The quartic in each block is in u = (x - centre) / half-width (R: raw powers of x), and the binned
//    fits in (k - j) delta / h (R: (k - j) delta); the fits are the same, better conditioned: R loses
//    digits when |x| is large against the spread of x (1e-5 relative for x in [100, 101], 5% for x in
//    [1000, 1001]). y is centred on its mean, which no step sees (R: 2e-8 relative at y + 1e4).
//  - Only the grid points that carry data are fitted (the sums weight the others by 0); R fits all of
//    them, and where one without data has none within 4 bandwidths (a gap in x wider than 8 pilot
//    bandwidths) its 0 * NaN makes dpill return NaN or stop.
//  - Where R returns NaN, a number from a singular fit, or stops, this throws attn::Error: fewer than 6
//    points (sigma^2 would be 0 / 0), a block with fewer than 5 distinct x, a bandwidth under a quarter
//    of the grid spacing (R: "Binning grid too coarse"), a binned fit at a grid point that carries data
//    with fewer occupied bins in its window than coefficients, or an estimate that is zero, negative
//    where it must be positive, or not finite.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <numeric>
#include <span>
#include <vector>

#include "attn/error.hpp"
#include "core/spread.hpp"
#include "attn/kernel_regression.hpp"

namespace attn {
namespace {

constexpr const char* kFn = "plug_in_bandwidth";
constexpr int kGrid = 401;          // gridsize
constexpr int kBlockMax = 5;        // blockmax
constexpr index_t kDivisor = 20;    // divisor
constexpr double kTrim = 0.01;      // trim
constexpr double kPropTrun = 0.05;  // proptrun
constexpr int kQuartic = 5;         // coefficients of the block fits (q + 1, q = 4)
constexpr double kTau = 4;          // the binned fits' window, in bandwidths

// The sums one block's quartic fit contributes: RSS, sum m''^2, sum m'' m''''.
struct BlockSums {
  double rss = 0, th22 = 0, th24 = 0;
};

// Least-squares quartic through the points (x, y) (nj,), x sorted with at least 5 distinct values,
// by Householder QR of the design in u = (x - c) / s, u in [-1, 1].
BlockSums quartic_block(const double* x, const double* y, index_t nj, std::vector<double>& z,
                        std::vector<double>& r) {
  const double c = 0.5 * (x[0] + x[nj - 1]), s = 0.5 * (x[nj - 1] - x[0]);
  z.assign(static_cast<size_t>(nj) * kQuartic, 0.0);  // (5, nj) column-major: column p is u^p
  r.assign(y, y + nj);
  auto col = [&](int p) { return z.data() + static_cast<size_t>(p) * nj; };
  for (index_t i = 0; i < nj; ++i) {
    const double u = (x[i] - c) / s;
    double v = 1;
    for (int p = 0; p < kQuartic; ++p, v *= u) col(p)[i] = v;
  }
  // Householder: column p becomes R's diagonal in col(p)[p] and the reflector below it (v[0] in diag).
  double diag[kQuartic], vhead[kQuartic];
  for (int p = 0; p < kQuartic; ++p) {
    double* a = col(p);
    double norm = 0;
    for (index_t i = p; i < nj; ++i) norm = std::hypot(norm, a[i]);
    const double alpha = a[p] > 0 ? -norm : norm;
    vhead[p] = a[p] - alpha;
    diag[p] = alpha;
    double vv = vhead[p] * vhead[p];
    for (index_t i = p + 1; i < nj; ++i) vv += a[i] * a[i];
    auto reflect = [&](double* t) {
      double d = vhead[p] * t[p];
      for (index_t i = p + 1; i < nj; ++i) d += a[i] * t[i];
      const double f = 2 * d / vv;
      t[p] -= f * vhead[p];
      for (index_t i = p + 1; i < nj; ++i) t[i] -= f * a[i];
    };
    if (vv > 0) {
      for (int q = p + 1; q < kQuartic; ++q) reflect(col(q));
      reflect(r.data());
    }
  }
  // Back substitution: R coef = (Q' y)[0..4]; R's strict upper part is in col(q)[p], p < q.
  double coef[kQuartic];
  for (int p = kQuartic - 1; p >= 0; --p) {
    double t = r[p];
    for (int q = p + 1; q < kQuartic; ++q) t -= col(q)[p] * coef[q];
    coef[p] = t / diag[p];
  }
  BlockSums out;
  const double s2 = s * s, s4 = s2 * s2;
  const double d4 = 24 * coef[4] / s4;  // m'''' in x units, constant over the block
  for (index_t i = 0; i < nj; ++i) {
    const double u = (x[i] - c) / s;
    const double fit = coef[0] + u * (coef[1] + u * (coef[2] + u * (coef[3] + u * coef[4])));
    const double d2 = (2 * coef[2] + u * (6 * coef[3] + u * 12 * coef[4])) / s2;
    out.rss += (y[i] - fit) * (y[i] - fit);
    out.th22 += d2 * d2;
    out.th24 += d2 * d4;
  }
  return out;
}

// The quartic fits over N blocks of the sorted points (n,), summed.
BlockSums blocked_fits(const std::vector<double>& x, const std::vector<double>& y, index_t blocks,
                       std::vector<double>& z, std::vector<double>& r) {
  const index_t n = static_cast<index_t>(x.size()), width = n / blocks;
  BlockSums total;
  for (index_t j = 0; j < blocks; ++j) {
    const index_t lo = j * width, hi = j + 1 == blocks ? n : (j + 1) * width;  // [lo, hi)
    index_t distinct = 1;
    for (index_t i = lo + 1; i < hi; ++i) distinct += x[i] != x[i - 1];
    if (distinct < kQuartic)
      detail::fail(kFn, ": x has ", distinct, " distinct values among the sorted points ", lo, "..", hi - 1,
                   " (a block of the quartic pilot fits, ", blocks, " blocks); at least ", kQuartic,
                   " are needed");
    const BlockSums b = quartic_block(x.data() + lo, y.data() + lo, hi - lo, z, r);
    total.rss += b.rss;
    total.th22 += b.th22;
    total.th24 += b.th24;
  }
  return total;
}

// Linear binning (KernSmooth's rlbin, truncate = TRUE) on the grid a + k delta, k = 0..M-1.
struct Binned {
  double a = 0, delta = 0;
  std::vector<double> xc, yc;  // (M,) each
};

Binned bin(const std::vector<double>& x, const std::vector<double>& y, double a, double b) {
  Binned g{a, (b - a) / (kGrid - 1), std::vector<double>(kGrid, 0.0), std::vector<double>(kGrid, 0.0)};
  for (size_t i = 0; i < x.size(); ++i) {
    // 1-based bin li and the share rem of the next one, rounded as rlbin rounds them.
    const double lxi = (x[i] - a) / g.delta + 1;
    index_t li = static_cast<index_t>(lxi);
    double rem = lxi - static_cast<double>(li);
    if (x[i] == b) li = kGrid - 1, rem = 1;
    if (li >= 1 && li < kGrid) {
      g.xc[li - 1] += 1 - rem;
      g.xc[li] += rem;
      g.yc[li - 1] += (1 - rem) * y[i];
      g.yc[li] += rem * y[i];
    }
  }
  return g;
}

// Binned local polynomial fits with one Gaussian bandwidth h, at the grid points asked for. The
// moments at bin j are in t = (k - j) delta / h:
//   s_p = sum_k xc_k w_k t^p (p = 0..2 degree),  t_p = sum_k yc_k w_k t^p,  u_p = sum_k xc_k w_k^2 t^p,
// over the occupied bins k with |k - j| <= L, w_k = exp(-((k - j) delta / h)^2 / 2).
class BinnedFit {
 public:
  BinnedFit(const Binned& g, double h, const char* what) : g_(g), h_(h) {
    const double l = std::floor(kTau * h / g.delta);
    if (!(l >= 1))
      detail::fail(kFn, ": the ", what, " bandwidth ", h, " is under a quarter of the ", kGrid,
                   "-point grid's spacing ", g.delta, "; the binned fit cannot resolve it (KernSmooth: "
                   "\"Binning grid too coarse\")");
    L_ = static_cast<index_t>(std::min(l, static_cast<double>(kGrid - 1)));
    w_.resize(static_cast<size_t>(L_) + 1);
    for (index_t d = 0; d <= L_; ++d) {
      const double t = g.delta * static_cast<double>(d) / h;
      w_[d] = std::exp(-(t * t) / 2);
    }
    what_ = what;
  }

  // The moments at bin j of a fit with `coefs` coefficients; throws when fewer occupied bins than
  // coefficients lie in the window (the moment matrix is singular).
  void moments(index_t j, int coefs, bool squared, double* s, double* t, double* u) const {
    const int ns = 2 * coefs - 1;
    std::fill(s, s + ns, 0.0);
    std::fill(t, t + coefs, 0.0);
    if (squared) std::fill(u, u + ns, 0.0);
    int occupied = 0;
    for (index_t k = std::max<index_t>(0, j - L_); k <= std::min<index_t>(kGrid - 1, j + L_); ++k) {
      const double c = g_.xc[k];
      if (c == 0) continue;
      ++occupied;
      const double w = w_[std::abs(k - j)], tk = static_cast<double>(k - j) * g_.delta / h_;
      double f = 1;
      for (int p = 0; p < ns; ++p, f *= tk) {
        s[p] += c * w * f;
        if (p < coefs) t[p] += g_.yc[k] * w * f;
        if (squared) u[p] += c * w * w * f;
      }
    }
    if (occupied < coefs)
      detail::fail(kFn, ": the ", what_, " fit (", coefs == 2 ? "local linear" : "local cubic",
                   ", bandwidth ", h_, ") at x = ", g_.a + static_cast<double>(j) * g_.delta, " has ", occupied,
                   " occupied bins within ", kTau, " bandwidths; it needs ", coefs);
  }

  double h() const { return h_; }

 private:
  const Binned& g_;
  double h_;
  index_t L_ = 0;
  std::vector<double> w_;  // (L + 1,)
  const char* what_ = "";
};

// Solves the symmetric positive definite Hankel system S beta = t, S_pq = s_{p+q} (n, n), n <= 4,
// by Cholesky; false when S is not numerically positive definite.
bool solve_hankel(const double* s, const double* t, int n, double* beta) {
  double lo[4][4] = {};
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j <= i; ++j) {
      double v = s[i + j];
      for (int k = 0; k < j; ++k) v -= lo[i][k] * lo[j][k];
      if (i == j) {
        if (!(v > 0)) return false;
        lo[i][i] = std::sqrt(v);
      } else {
        lo[i][j] = v / lo[j][j];
      }
    }
  }
  double z[4];
  for (int i = 0; i < n; ++i) {
    double v = t[i];
    for (int k = 0; k < i; ++k) v -= lo[i][k] * z[k];
    z[i] = v / lo[i][i];
  }
  for (int i = n - 1; i >= 0; --i) {
    double v = z[i];
    for (int k = i + 1; k < n; ++k) v -= lo[k][i] * beta[k];
    beta[i] = v / lo[i][i];
  }
  return true;
}

// A positive, finite estimate, or attn::Error naming it.
double positive(double v, const char* what) {
  if (!(v > 0) || !std::isfinite(v))
    detail::fail(kFn, ": the estimate of ", what, " is ", v, "; it must be positive and finite (the data "
                 "are degenerate for the plug-in rule)");
  return v;
}

}  // namespace

double plug_in_bandwidth(std::span<const double> x, std::span<const double> y) {
  const index_t n_all = static_cast<index_t>(x.size());
  if (y.size() != x.size())
    detail::fail(kFn, ": x has ", x.size(), " points but y has ", y.size(), "; they must match");
  if (n_all < kQuartic + 1)
    detail::fail(kFn, ": x has ", n_all, " points; at least ", kQuartic + 1, " are needed (the quartic "
                 "pilot fit has ", kQuartic, " coefficients and must leave a residual)");
  for (index_t i = 0; i < n_all; ++i) {
    if (!std::isfinite(x[i])) detail::fail(kFn, ": x[", i, "] = ", x[i], " is not finite");
    if (!std::isfinite(y[i])) detail::fail(kFn, ": y[", i, "] = ", y[i], " is not finite");
  }

  // 1. Sort (ties by y), trim floor(trim n) points at each end, centre y.
  std::vector<index_t> order(static_cast<size_t>(n_all));
  std::iota(order.begin(), order.end(), index_t{0});
  std::sort(order.begin(), order.end(), [&](index_t i, index_t j) {
    return x[i] < x[j] || (x[i] == x[j] && (y[i] < y[j] || (y[i] == y[j] && i < j)));
  });
  const index_t cut = static_cast<index_t>(std::floor(kTrim * static_cast<double>(n_all)));
  const index_t n = n_all - 2 * cut;
  std::vector<double> xs(static_cast<size_t>(n)), ys(static_cast<size_t>(n));
  for (index_t i = 0; i < n; ++i) xs[i] = x[order[cut + i]], ys[i] = y[order[cut + i]];
  // y in units of a power of two near max|y|: h is the same at any scale of y (sigma^2 and theta_22
  // both scale with y^2), and their sums neither overflow (y of 1e150) nor underflow (1e-160).
  const double unit = detail::power_of_two_unit(ys);
  for (double& v : ys) v /= unit;
  const double a = xs.front(), b = xs.back();
  if (!(b > a))
    detail::fail(kFn, ": x has zero spread", cut > 0 ? " after trimming 1% at each end" : "", " (all ", n,
                 " values are ", a, ")");
  const double ybar = std::accumulate(ys.begin(), ys.end(), 0.0) / static_cast<double>(n);
  for (double& v : ys) v -= ybar;
  const double nd = static_cast<double>(n), range = b - a;
  const Binned g = bin(xs, ys, a, b);

  // 2. Blocks by Mallows' Cp, then sigma^2 and theta_24 from the quartic fits.
  const index_t nmax = std::max<index_t>(std::min<index_t>(n / kDivisor, kBlockMax), 1);
  std::vector<double> z, r;
  std::vector<BlockSums> fits;
  for (index_t blocks = 1; blocks <= nmax; ++blocks) fits.push_back(blocked_fits(xs, ys, blocks, z, r));
  index_t best = 0;
  double best_cp = 0;
  for (index_t i = 0; i < nmax; ++i) {
    const double cp = static_cast<double>(n - kQuartic * nmax) * fits[i].rss / fits[nmax - 1].rss +
                      static_cast<double>(2 * kQuartic * (i + 1)) - nd;
    if (i == 0 || cp < best_cp) best = i, best_cp = cp;
  }
  const index_t blocks = best + 1;
  const double sigsq_q =
      positive(fits[best].rss / static_cast<double>(n - kQuartic * blocks), "sigma^2 from the quartic fits");
  const double th24 = fits[best].th24 / nd;
  if (!(th24 != 0) || !std::isfinite(th24))
    detail::fail(kFn, ": the estimate of theta_24 from the quartic fits is ", th24, "; it must be nonzero and "
                 "finite (the data are degenerate for the plug-in rule)");

  // 3. theta_22 from binned local cubic fits with the pilot bandwidth g.
  const double sqpi = std::sqrt(std::numbers::pi);
  const double gfac = th24 < 0 ? 3 / (8 * sqpi) : 15 / (16 * sqpi);
  const double gam = std::pow(gfac * sigsq_q * range / (std::abs(th24) * nd), 1.0 / 7);
  const BinnedFit cubic(g, gam, "theta_22 pilot");
  const index_t llow = static_cast<index_t>(std::floor(kPropTrun * kGrid)), lupp = kGrid - 1 - llow;
  double th22 = 0;
  for (index_t k = llow; k <= lupp; ++k) {
    if (g.xc[k] == 0) continue;
    double s[7], t[4], beta[4];
    cubic.moments(k, 4, false, s, t, nullptr);
    if (!solve_hankel(s, t, 4, beta))
      detail::fail(kFn, ": the local cubic fit at x = ", g.a + static_cast<double>(k) * g.delta,
                   " (bandwidth ", gam, ") is singular");
    const double mdd = 2 * beta[2] / (gam * gam);  // m'' in y / x^2
    th22 += mdd * mdd * g.xc[k];
  }
  th22 = positive(th22 / nd, "theta_22");

  // 4. sigma^2 from binned local linear fits with the pilot bandwidth lambda.
  const double c3k = std::pow(4 * (0.5 + 2 * std::numbers::sqrt2 - 4.0 / 3 * std::sqrt(3.0)) /
                                  std::sqrt(2 * std::numbers::pi), 1.0 / 9);
  const double lam = c3k * std::pow(sigsq_q * sigsq_q * range / ((th22 * nd) * (th22 * nd)), 1.0 / 9);
  const BinnedFit linear(g, lam, "sigma^2 pilot");
  double yy = 0;
  for (double v : ys) yy += v * v;
  double num = yy, den = nd;
  for (index_t k = 0; k < kGrid; ++k) {
    if (g.xc[k] == 0) continue;
    double s[3], t[2], u[3];
    linear.moments(k, 2, true, s, t, u);
    const double det = s[0] * s[2] - s[1] * s[1];
    if (!(det > 0))
      detail::fail(kFn, ": the local linear fit at x = ", g.a + static_cast<double>(k) * g.delta,
                   " (bandwidth ", lam, ") is singular");
    const double e0 = s[2] / det, e1 = -s[1] / det;  // first row of S^-1
    const double mest = e0 * t[0] + e1 * t[1];
    const double sdg = e0;
    const double sstdg = e0 * e0 * u[0] + 2 * e0 * e1 * u[1] + e1 * e1 * u[2];
    num += -2 * mest * g.yc[k] + mest * mest * g.xc[k];
    den += (-2 * sdg + sstdg) * g.xc[k];
  }
  const double sigsq = positive(num / den, "sigma^2 from the local linear fits");
  return std::pow(sigsq * range / (2 * sqpi * th22 * nd), 0.2);
}

}  // namespace attn
