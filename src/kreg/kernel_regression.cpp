// KernelRegression (attn/kernel_regression.hpp): the data's checks, and the fits and criteria over
// every point, threaded over the points with one LocalFitter (kreg/local_fit.hpp) a thread. Each
// point's results land in its own slot and are summed in point order afterwards, so every result is
// the same for any thread count.
#include <Random123/philox.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>

#include "attn/error.hpp"
#include "core/spread.hpp"
#include "kreg/local_fit.hpp"

namespace attn {

std::vector<RegressorType> regressor_types_from_string(std::string_view var_type) {
  if (var_type.empty()) detail::fail("kernel regression: var_type is empty; it needs one letter per regressor");
  std::vector<RegressorType> types;
  for (char c : var_type) {
    switch (c) {
      case 'c': types.push_back(RegressorType::continuous); break;
      case 'u': types.push_back(RegressorType::unordered); break;
      case 'o': types.push_back(RegressorType::ordered); break;
      default:
        detail::fail("kernel regression: var_type \"", var_type, "\" has the letter '", c,
                     "'; each must be 'c' (continuous), 'u' (unordered) or 'o' (ordered)");
    }
  }
  return types;
}

ContinuousKernel continuous_kernel_from_name(std::string_view name) {
  if (name == "gaussian") return ContinuousKernel::gaussian;
  if (name == "epanechnikov") return ContinuousKernel::epanechnikov;
  if (name == "boxcar" || name == "uniform") return ContinuousKernel::boxcar;
  if (name == "tricube") return ContinuousKernel::tricube;
  detail::fail("kernel regression: unknown continuous kernel \"", name,
               "\"; known: gaussian, epanechnikov, boxcar (or uniform), tricube");
}

const char* continuous_kernel_name(ContinuousKernel kernel) {
  switch (kernel) {
    case ContinuousKernel::gaussian: return "gaussian";
    case ContinuousKernel::epanechnikov: return "epanechnikov";
    case ContinuousKernel::boxcar: return "boxcar";
    case ContinuousKernel::tricube: return "tricube";
  }
  return "?";
}

KernelRegression::KernelRegression(TensorView<const double> x, TensorView<const double> y, KernelRegOptions options)
    : options_(std::move(options)) {
  const char* op = "KernelRegression";
  if (x.empty() || y.empty()) detail::fail(op, ": x and y are required");
  if (x.rank() != 1 && x.rank() != 2)
    detail::fail(op, ": x has shape ", x.shape_string(), "; it must be (n, k) or (n,)");
  if (y.rank() != 1) detail::fail(op, ": y has shape ", y.shape_string(), "; it must be (n,)");
  n_ = x.dim(0);
  k_ = x.rank() == 2 ? x.dim(1) : 1;
  if (y.dim(0) != n_)
    detail::fail(op, ": y has shape ", y.shape_string(), " but x has shape ", x.shape_string(), "; both need n = ", n_,
                 " points");
  if (n_ < 2) detail::fail(op, ": x has shape ", x.shape_string(), "; at least 2 points are needed");
  if (k_ < 1) detail::fail(op, ": x has shape ", x.shape_string(), "; at least 1 regressor is needed");
  types_ = regressor_types_from_string(options_.var_type);
  if (static_cast<index_t>(types_.size()) != k_)
    detail::fail(op, ": var_type \"", options_.var_type, "\" has ", types_.size(), " letters but x has shape ",
                 x.shape_string(), " with ", k_, " regressors");
  if (options_.degree < 0 || options_.degree > 3)
    detail::fail(op, ": degree is ", options_.degree, "; it must be 0, 1, 2 or 3");
  x_.resize(static_cast<std::size_t>(n_ * k_));
  y_.resize(static_cast<std::size_t>(n_));
  for (index_t i = 0; i < n_; ++i) {
    for (index_t c = 0; c < k_; ++c) {
      const double v = x.rank() == 2 ? x(i, c) : x(i);
      if (!std::isfinite(v)) detail::fail(op, ": x[", i, ", ", c, "] is ", v, "; every value must be finite");
      if (types_[c] != RegressorType::continuous && v != std::round(v))
        detail::fail(op, ": x[", i, ", ", c, "] is ", v, "; a discrete regressor's values must be integers");
      x_[i * k_ + c] = v;
    }
    y_[i] = y(i);
    if (!std::isfinite(y_[i])) detail::fail(op, ": y[", i, "] is ", y_[i], "; every value must be finite");
  }
  y_unit_ = detail::power_of_two_unit(y_);
  levels_.assign(k_, 0);
  for (index_t c = 0; c < k_; ++c) {
    if (types_[c] == RegressorType::continuous) {
      if (sort_column_ < 0) sort_column_ = static_cast<int>(c);
      continue;
    }
    std::set<double> distinct;
    for (index_t i = 0; i < n_; ++i) distinct.insert(x_[i * k_ + c]);
    levels_[c] = static_cast<int>(distinct.size());
    if (types_[c] == RegressorType::unordered && levels_[c] < 2)
      detail::fail(op, ": x's column ", c, " (unordered) has ", levels_[c],
                   " distinct value; the Aitchison-Aitken kernel needs at least 2");
  }
  order_.resize(n_);
  std::iota(order_.begin(), order_.end(), index_t{0});
  if (sort_column_ >= 0) {
    std::stable_sort(order_.begin(), order_.end(),
                     [&](index_t a, index_t b) { return x_[a * k_ + sort_column_] < x_[b * k_ + sort_column_]; });
    sorted_.resize(n_), sorted_y_.resize(n_), rank_.resize(n_);
    for (index_t s = 0; s < n_; ++s) {
      sorted_[s] = x_[order_[s] * k_ + sort_column_];
      sorted_y_[s] = y_[order_[s]];
      rank_[order_[s]] = s;
    }
  }
}

namespace {

// Fewer points than this are fitted on the calling thread: starting a team costs more than they take.
constexpr index_t kThreadedPoints = 64;

// The points to fit at: queries (nq, k) / (nq,) copied row-major, or the data's x when empty.
std::vector<double> query_points(const KernelRegression& model, TensorView<const double> queries, const char* op) {
  const index_t k = model.regressors();
  if (queries.empty()) return KernelRegressionAccess::x(model);
  const bool flat = queries.rank() == 1 && k == 1;
  if (!flat && !(queries.rank() == 2 && queries.dim(1) == k))
    detail::fail(op, ": queries has shape ", queries.shape_string(), "; it must be (nq, ", k, ")",
                 k == 1 ? " or (nq,)" : "");
  const index_t nq = queries.dim(0);
  std::vector<double> points(static_cast<std::size_t>(nq * k));
  for (index_t i = 0; i < nq; ++i)
    for (index_t c = 0; c < k; ++c) {
      const double v = flat ? queries(i) : queries(i, c);
      if (!std::isfinite(v)) detail::fail(op, ": queries[", i, ", ", c, "] is ", v, "; every value must be finite");
      points[i * k + c] = v;
    }
  return points;
}

int continuous_count(const KernelRegression& model) {
  const auto& types = KernelRegressionAccess::types(model);
  return static_cast<int>(std::count(types.begin(), types.end(), RegressorType::continuous));
}

// Per data point i: the fit at x_i (without i when leave_out), its gradient and H_ii.
struct PointResults {
  std::vector<double> mean, gradient, hat, hat_gradient;
};

PointResults fit_data_points(const KernelRegression& model, std::span<const double> h, bool leave_out, bool gradient,
                             bool hat) {
  const index_t n = model.size(), k = model.regressors();
  const kreg::Design design(model.options().degree, continuous_count(model));
  const cpu::simd::Target simd = cpu::simd::current();
  PointResults out;
  out.mean.resize(n);
  if (gradient) out.gradient.resize(n * k);
  if (hat) out.hat.resize(n), out.hat_gradient.resize(gradient ? n * k : 0);
  const double* x = KernelRegressionAccess::x(model).data();
#pragma omp parallel if (n >= kThreadedPoints)
  {
    kreg::LocalFitter fitter(model, h, design, simd);
#pragma omp for schedule(dynamic, 8)
    for (index_t i = 0; i < n; ++i) {
      out.mean[i] = fitter.fit(x + i * k, leave_out ? i : -1, gradient, nullptr).mean;
      if (gradient) fitter.mean_gradient(out.gradient.data() + i * k);
      if (hat) out.hat[i] = fitter.hat_diagonal(i, gradient ? out.hat_gradient.data() + i * k : nullptr);
    }
  }
  return out;
}

}  // namespace

KernelFit KernelRegression::fit(std::span<const double> bandwidths, TensorView<const double> queries) const {
  kreg::check_bandwidths(*this, bandwidths, "KernelRegression::fit");
  const std::vector<double> points = query_points(*this, queries, "KernelRegression::fit");
  const index_t nq = static_cast<index_t>(points.size()) / k_;
  const kreg::Design design(options_.degree, continuous_count(*this));
  const cpu::simd::Target simd = cpu::simd::current();
  KernelFit out;
  out.mean.resize(nq);
  out.slopes.resize(nq * k_);
  std::vector<unsigned char> reduced(nq), empty(nq);
#pragma omp parallel if (nq >= kThreadedPoints)
  {
    kreg::LocalFitter fitter(*this, bandwidths, design, simd);
#pragma omp for schedule(dynamic, 8)
    for (index_t i = 0; i < nq; ++i) {
      const kreg::PointFit f = fitter.fit(points.data() + i * k_, -1, false, out.slopes.data() + i * k_);
      out.mean[i] = f.mean;
      empty[i] = f.empty;
      reduced[i] = !f.empty && f.degree_used < options_.degree;
    }
  }
  out.reduced = std::count(reduced.begin(), reduced.end(), 1);
  out.empty = std::count(empty.begin(), empty.end(), 1);
  return out;
}

double KernelRegression::cv_ls_in_units(std::span<const double> bandwidths, std::vector<double>* gradient) const {
  kreg::check_bandwidths(*this, bandwidths, "KernelRegression::cv_ls");
  const PointResults r = fit_data_points(*this, bandwidths, true, gradient != nullptr, false);
  double sum = 0;
  if (gradient) gradient->assign(k_, 0.0);
  for (index_t i = 0; i < n_; ++i) {
    const double e = residual_in_units(i, r.mean[i]);
    sum += e * e;
    if (gradient)
      for (index_t c = 0; c < k_; ++c) (*gradient)[c] -= 2 * e * (r.gradient[i * k_ + c] / y_unit_) / n_;
  }
  return sum / n_;
}

double KernelRegression::cv_ls(std::span<const double> bandwidths, std::vector<double>* gradient) const {
  // Times the unit twice, not its square: y_unit_^2 alone overflows from 2^512 on, where a criterion
  // of small residuals still fits (inf only where the criterion itself passes float64's range).
  const double value = cv_ls_in_units(bandwidths, gradient);
  if (gradient)
    for (double& g : *gradient) g = g * y_unit_ * y_unit_;
  return value * y_unit_ * y_unit_;
}

double KernelRegression::aicc(std::span<const double> bandwidths, std::vector<double>* gradient) const {
  return aicc_in_units(bandwidths, gradient) + 2 * std::log(y_unit_);  // log(sigma^2) with sigma in y's units
}

double KernelRegression::aicc_in_units(std::span<const double> bandwidths, std::vector<double>* gradient) const {
  kreg::check_bandwidths(*this, bandwidths, "KernelRegression::aicc");
  const PointResults r = fit_data_points(*this, bandwidths, false, gradient != nullptr, true);
  const double n = static_cast<double>(n_);
  double rss = 0, trace = 0;
  std::vector<double> drss(k_, 0.0), dtrace(k_, 0.0);
  for (index_t i = 0; i < n_; ++i) {  // rss and its gradient in units of y_unit_ squared
    const double e = residual_in_units(i, r.mean[i]);
    rss += e * e;
    trace += r.hat[i];
    if (gradient)
      for (index_t c = 0; c < k_; ++c) {
        drss[c] -= 2 * e * (r.gradient[i * k_ + c] / y_unit_);
        dtrace[c] += r.hat_gradient[i * k_ + c];
      }
  }
  if (gradient) gradient->assign(k_, 0.0);
  const double denominator = 1 - (trace + 2) / n;
  if (!(denominator > 0)) return std::numeric_limits<double>::infinity();
  const double value = std::log(rss / n) + (1 + trace / n) / denominator;
  if (gradient) {
    const double dfrac = 2 / n * (1 - 1 / n) / (denominator * denominator);
    for (index_t c = 0; c < k_; ++c) (*gradient)[c] = drss[c] / rss + dfrac * dtrace[c];
  }
  return value;
}

double KernelRegression::r_squared(std::span<const double> bandwidths) const {
  const KernelFit f = fit(bandwidths);
  const double mean_fit = std::accumulate(f.mean.begin(), f.mean.end(), 0.0) / n_;
  double cross = 0, yy = 0, ff = 0;
  for (index_t i = 0; i < n_; ++i) {  // in units of y_unit_: the same ratio at any scale
    const double dy = residual_in_units(i, mean_fit), df = f.mean[i] / y_unit_ - mean_fit / y_unit_;
    cross += dy * df, yy += dy * dy, ff += df * df;
  }
  return cross / yy * (cross / ff);
}

ConfidenceBand KernelRegression::confidence_band(std::span<const double> bandwidths, TensorView<const double> queries,
                                                 double level, BandMethod method, std::uint64_t seed,
                                                 int replicates) const {
  const char* op = "KernelRegression::confidence_band";
  kreg::check_bandwidths(*this, bandwidths, op);
  if (!(level > 0 && level < 1)) detail::fail(op, ": level is ", level, "; it must lie in (0, 1)");
  if (method == BandMethod::bootstrap && replicates < 2)
    detail::fail(op, ": replicates is ", replicates, "; the bootstrap needs at least 2");
  const std::vector<double> points = query_points(*this, queries, op);
  const index_t nq = static_cast<index_t>(points.size()) / k_;
  const kreg::Design design(options_.degree, continuous_count(*this));
  const cpu::simd::Target simd = cpu::simd::current();
  using Weights = std::vector<kreg::LocalFitter::Weight>;

  // The fit at the data, its residuals, and the traces of H and H'H.
  std::vector<double> fitted(n_), hat(n_), row_squares(n_);
#pragma omp parallel if (n_ >= kThreadedPoints)
  {
    kreg::LocalFitter fitter(*this, bandwidths, design, simd);
    Weights l;
#pragma omp for schedule(dynamic, 8)
    for (index_t i = 0; i < n_; ++i) {
      fitted[i] = fitter.fit(x_.data() + i * k_, -1, false, nullptr, true).mean;
      fitter.smoother_weights(l);
      double squares = 0, own = 0;
      for (const auto& w : l) squares += w.l * w.l, own += w.point == i ? w.l : 0;
      hat[i] = own, row_squares[i] = squares;
    }
  }
  double rss = 0, trace = 0, trace_hh = 0;  // rss in units of y_unit_ squared, as sigma2 below
  for (index_t i = 0; i < n_; ++i) {
    const double e = residual_in_units(i, fitted[i]);
    rss += e * e, trace += hat[i], trace_hh += row_squares[i];
  }
  const double dof = static_cast<double>(n_) - 2 * trace + trace_hh;
  if (!(dof > 0))
    detail::fail(op, ": the bandwidths interpolate the data (n - 2 tr(H) + tr(H'H) = ", dof,
                 "): no degrees of freedom are left for the residual variance");
  const double sigma2 = rss / dof;
  const double alpha = (1 - level) / 2;
  const double z = kreg::normal_quantile(1 - alpha);

  ConfidenceBand band;
  band.mean.resize(nq), band.low.resize(nq), band.high.resize(nq), band.standard_error.resize(nq);
#pragma omp parallel if (nq >= kThreadedPoints)
  {
    kreg::LocalFitter fitter(*this, bandwidths, design, simd);
    Weights l;
    std::vector<double> draws;
#pragma omp for schedule(dynamic, 4)
    for (index_t i = 0; i < nq; ++i) {
      const double m = fitter.fit(points.data() + i * k_, -1, false, nullptr, true).mean;
      fitter.smoother_weights(l);
      band.mean[i] = m;
      if (method == BandMethod::asymptotic) {
        double squares = 0;
        for (const auto& w : l) squares += w.l * w.l;
        const double se = std::sqrt(sigma2 * squares) * y_unit_;
        band.standard_error[i] = se, band.low[i] = m - z * se, band.high[i] = m + z * se;
        continue;
      }
      // The wild bootstrap through the smoother's linearity: m*(x0) = sum_j l_j (m(x_j) + e_j v_j), so
      // m*(x0) - E* m*(x0) = sum_j l_j e_j v_j, v_j = -/+1 from bit b % 128 of Philox(counter (j, b / 128),
      // key seed). The band is m(x0) plus that deviation's quantiles (symmetric in law, so the basic
      // and the percentile intervals agree): centred on the fit, not on the twice-smoothed sum_j l_j m(x_j).
      draws.assign(replicates, 0.0);
      const r123::Philox4x32::key_type key = {
          {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)}};
      r123::Philox4x32 philox;
      for (const auto& w : l) {
        const double e = w.l * residual_in_units(w.point, fitted[w.point]);  // draws in units of y_unit_
        for (int b0 = 0; b0 < replicates; b0 += 128) {
          const r123::Philox4x32::ctr_type ctr = {{static_cast<std::uint32_t>(w.point),
                                                   static_cast<std::uint32_t>(w.point >> 32),
                                                   static_cast<std::uint32_t>(b0 / 128), 0}};
          const auto bits = philox(ctr, key);
          for (int b = b0; b < std::min(replicates, b0 + 128); ++b)
            draws[b] += (bits[(b - b0) / 32] >> ((b - b0) % 32) & 1u) ? e : -e;
        }
      }
      double sum = 0, sum2 = 0;
      for (double d : draws) sum += d, sum2 += d * d;
      const double mean_draw = sum / replicates;
      band.standard_error[i] = std::sqrt(std::max(0.0, sum2 / replicates - mean_draw * mean_draw)) * y_unit_;
      std::sort(draws.begin(), draws.end());
      auto quantile = [&](double p) {  // linear interpolation between order statistics (R's type 7)
        const double at = p * (replicates - 1);
        const auto lo = static_cast<std::size_t>(std::floor(at));
        const std::size_t hi = std::min<std::size_t>(lo + 1, draws.size() - 1);
        return draws[lo] + (at - lo) * (draws[hi] - draws[lo]);
      };
      band.low[i] = m + quantile(alpha) * y_unit_, band.high[i] = m + quantile(1 - alpha) * y_unit_;
    }
  }
  return band;
}

}  // namespace attn
