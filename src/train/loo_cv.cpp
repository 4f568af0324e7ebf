// The leave-one-out criterion of Nadaraya-Watson regression (attn/width_selection.hpp): argument
// checks, the O(G N^2 (p + v)) evaluation with its gradient, and Nadaraya-Watson pooling with
// per-dimension widths.
//
// The gradient follows the reference backward of nadaraya_watson (src/ref/nadaraya_watson.cpp)
// through t = u^2 = sum_c ((x_ic - x_jc) / sigma_c)^2, with the prediction f_i = sum_j w_ij y_j,
// w_ij = K_ij / Z_i, residual r_i = y_i - f_i and s = 1 / (G N v):
//   dCV/df_i  = -2 s r_i
//   dCV/dK_ij = (dCV/df_i . y_j - sum_l w_il dCV/df_i . y_l) / Z_i = -2 s r_i . (y_j - f_i) / Z_i
//   dCV/dt_ij = dCV/dK_ij K'(t_ij)      (Gaussian K' = -K / 2; Epanechnikov -1 / (2 sqrt t))
//   dt_ij/dsigma_c = -2 ((x_ic - x_jc) / sigma_c)^2 / sigma_c
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "api/checks.hpp"
#include "core/spread.hpp"
#include "train/loo_cv.hpp"

namespace attn {
namespace train {
namespace {

// Below this many (point, point, feature) terms, about 10 ms of work, one thread: select_width
// evaluates the criterion dozens of times, and on a machine shared with other jobs every parallel
// region can cost milliseconds while OpenMP's spinning threads wait for a descheduled one
// (measured: the tests of N = 150 took 29 s at 2 threads, 0.6 s at 1).
constexpr double kParallelWork = 1 << 22;

// K (N) = K(t) for one point's t (N), t = u^2, a loop per kernel so that each vectorises. The
// Gaussian is scaled by exp(t_min / 2), the nearest other point's term (the softmax's max
// subtraction): the scale cancels in K / Z and a row never underflows to 0. Beyond exp(-746) a
// double is exactly 0, so far pairs skip the exp (at a good width most pairs are far, and the exp
// is most of the cost). The Epanechnikov kernel takes u = sqrt(t) as nadaraya_watson_forward
// takes ||q - k|| / sigma.
void kernel_row(Kernel kernel, const double* t, double t_min, double* K, index_t N) {
  switch (kernel) {
    case Kernel::gaussian:
      for (index_t j = 0; j < N; ++j) {
        const double a = (t[j] - t_min) / 2;
        K[j] = a > 746 ? 0.0 : std::exp(-a);
      }
      break;
    case Kernel::boxcar:  // u <= 1 as u^2 <= 1, which needs no square root
#pragma omp simd
      for (index_t j = 0; j < N; ++j) K[j] = t[j] <= 1 ? 1.0 : 0.0;
      break;
    case Kernel::epanechnikov:
#pragma omp simd
      for (index_t j = 0; j < N; ++j) K[j] = std::max(0.0, 1 - std::sqrt(t[j]));
      break;
    case Kernel::constant:
      std::fill(K, K + N, 1.0);
      break;
  }
}

// coef (N) *= dK/dt at each (K, t) of the row: the Gaussian -K / 2, the Epanechnikov
// -1 / (2 sqrt t) inside its support and 0 at t = 0 (as nadaraya_watson_backward).
void times_kernel_dt(Kernel kernel, const double* K, const double* t, double* coef, index_t N) {
  if (kernel == Kernel::gaussian)
#pragma omp simd
    for (index_t j = 0; j < N; ++j) coef[j] *= -K[j] / 2;
  else  // epanechnikov; the piecewise constant kernels never get here
#pragma omp simd
    for (index_t j = 0; j < N; ++j) coef[j] *= K[j] > 0 && t[j] > 0 ? -1 / (2 * std::sqrt(t[j])) : 0.0;
}

// A tensor argument of rank 2 to 4 whose elements are all finite, as (groups, rows, cols).
template <class T>
View4<const T> finite_points(const TensorView<const T>& t, const char* op, const char* name) {
  if (t.empty()) detail::fail(op, ": ", name, " is required but was not given");
  const View4<const T> v = detail::to_view4(t, op, name, 2, 4);
  for (index_t b = 0; b < v.B; ++b)
    for (index_t h = 0; h < v.H; ++h)
      for (index_t r = 0; r < v.R; ++r)
        for (index_t c = 0; c < v.C; ++c)
          if (!std::isfinite(v.at(b, h, r, c)))
            detail::fail(op, ": ", name, " holds ", v.at(b, h, r, c), " in row ", r,
                         "; leave-one-out needs finite inputs and targets");
  return v;
}

// `v` (G, N, C) converted to double and transposed to columns (G, C, N).
template <class T>
std::vector<double> columns(const View4<const T>& v) {
  std::vector<double> out(static_cast<std::size_t>(v.B * v.H * v.C * v.R));
  for (index_t b = 0; b < v.B; ++b)
    for (index_t h = 0; h < v.H; ++h)
      for (index_t r = 0; r < v.R; ++r)
        for (index_t c = 0; c < v.C; ++c) out[((b * v.H + h) * v.C + c) * v.R + r] = v.at(b, h, r, c);
  return out;
}

}  // namespace

template <class T>
LooProblem make_loo_problem(const char* op, TensorView<const T> x, TensorView<const T> y, Kernel kernel) {
  const View4<const T> X = finite_points(x, op, "x");
  const View4<const T> Y = finite_points(y, op, "y");
  std::vector<index_t> expected(x.shape().begin(), x.shape().end());
  expected.back() = y.rank() > 0 ? y.dim(-1) : 0;
  detail::require_shape(y, expected, op, "y",
                        detail::cat("y holds one row of targets per point of x ", x.shape_string()));
  if (X.R < 2)
    detail::fail(op, ": x has shape ", x.shape_string(), " with N = ", X.R,
                 " point(s) per group; leave-one-out needs at least 2");
  if (X.C < 1) detail::fail(op, ": x has shape ", x.shape_string(), "; it must have at least 1 feature");
  if (Y.C < 1) detail::fail(op, ": y has shape ", y.shape_string(), "; it must have at least 1 target");
  if (kernel_name(kernel) == std::string_view("unknown"))
    detail::fail(op, ": kernel ", static_cast<int>(kernel), " is not a Kernel");

  LooProblem P{X.B * X.H, X.R, X.C, Y.C, columns(X), columns(Y), std::vector<double>(static_cast<std::size_t>(X.C))};
  for (index_t c = 0; c < P.p; ++c) {
    const double spread = detail::standard_deviation(P.G * P.N, [&](index_t i) {
      return P.x[(i / P.N * P.p + c) * P.N + i % P.N];
    });
    P.spread[c] = spread > 0 && std::isfinite(spread) ? spread : 1.0;  // a constant feature: any width is the same
  }
  P.narrowest = static_cast<double>(std::numeric_limits<T>::min());
  P.widest = static_cast<double>(std::numeric_limits<T>::max()) * (1 - 1e-6);  // exp(log(w)) within it
  return P;
}

void check_widths(const char* op, std::span<const double> widths, index_t p, const char* of) {
  if (static_cast<index_t>(widths.size()) != p && widths.size() != 1)
    detail::fail(op, ": widths has ", widths.size(), " elements but ", of, " has p = ", p,
                 " features; give one width per feature or one shared width");
  for (std::size_t c = 0; c < widths.size(); ++c)
    if (!(widths[c] > 0) || !std::isfinite(widths[c]))
      detail::fail(op, ": widths[", c, "] is ", widths[c], "; every width must be positive and finite");
}

// One task per point i: its distances to the other points of its group (pass 1), its prediction
// and squared residual, then (pass 2, for the gradient) its share of sum_j dCV/dt_ij ds_ijc^2.
// Every inner loop runs over the N points of a column, contiguous, which the compiler vectorises.
// Per-point partials are summed in point order afterwards: the result does not depend on threads.
LooCv loo_cv(const LooProblem& P, Kernel kernel, std::span<const double> widths, bool with_gradient) {
  const index_t N = P.N, p = P.p, v = P.v, rows = P.G * N;
  const auto width = [&](index_t c) { return widths[widths.size() == 1 ? 0 : static_cast<std::size_t>(c)]; };
  std::vector<double> xs(P.x.size());  // x_c / sigma_c, (G, p, N): t is a plain squared distance
  for (index_t g = 0; g < P.G; ++g)
    for (index_t c = 0; c < p; ++c)
      for (index_t j = 0; j < N; ++j) xs[(g * p + c) * N + j] = P.x[(g * p + c) * N + j] / width(c);
  const bool smooth = with_gradient && (kernel == Kernel::gaussian || kernel == Kernel::epanechnikov);
  const double s = 1.0 / (static_cast<double>(rows) * static_cast<double>(v));
  std::vector<double> row_error(static_cast<std::size_t>(rows)), row_acc(smooth ? xs.size() : 0);
  std::vector<char> row_isolated(static_cast<std::size_t>(rows));
  const bool parallel = static_cast<double>(rows) * static_cast<double>(N) * static_cast<double>(p + v) >= kParallelWork;

#pragma omp parallel if (parallel)
  {
    std::vector<double> t(static_cast<std::size_t>(N)), K(t.size()), coef(t.size()), f(static_cast<std::size_t>(v));
    // Dynamic: a thread the system deschedules does not hold the others up.
#pragma omp for schedule(dynamic, 16)
    for (index_t row = 0; row < rows; ++row) {
      const index_t g = row / N, i = row % N;
      const double* X = xs.data() + g * p * N;  // feature c of point j: X[c * N + j]
      const double* Y = P.y.data() + g * v * N;
      std::fill(t.begin(), t.end(), 0.0);
      for (index_t c = 0; c < p; ++c) {
        const double* col = X + c * N;
        const double xic = col[i];
        for (index_t j = 0; j < N; ++j) t[j] += (xic - col[j]) * (xic - col[j]);
      }
      t[i] = std::numeric_limits<double>::infinity();  // out of the minimum; K[i] is set to 0 below
      double t_min = t[i];
#pragma omp simd reduction(min : t_min)
      for (index_t j = 0; j < N; ++j) t_min = std::min(t_min, t[j]);
      kernel_row(kernel, t.data(), t_min, K.data(), N);
      K[i] = 0;
      double Z = 0;
#pragma omp simd reduction(+ : Z)
      for (index_t j = 0; j < N; ++j) Z += K[j];
      double err = 0;
      for (index_t x = 0; x < v; ++x) {
        const double* yx = Y + x * N;
        double sum = 0;
#pragma omp simd reduction(+ : sum)
        for (index_t j = 0; j < N; ++j) sum += K[j] * yx[j];
        f[x] = Z > 0 ? sum / Z : 0.0;  // an isolated point is predicted as 0
        err += (yx[i] - f[x]) * (yx[i] - f[x]);
      }
      row_error[row] = err;
      row_isolated[row] = Z == 0;
      if (!smooth || Z == 0) continue;  // an isolated point's prediction is a constant 0
      // coef_j = dCV/dt_ij = -2 s r_i . (y_j - f_i) / Z K'(t_ij)
      std::fill(coef.begin(), coef.end(), 0.0);
      for (index_t x = 0; x < v; ++x) {
        const double* yx = Y + x * N;
        const double rx = yx[i] - f[x];
        for (index_t j = 0; j < N; ++j) coef[j] += rx * (yx[j] - f[x]);
      }
      times_kernel_dt(kernel, K.data(), t.data(), coef.data(), N);
      const double scale = -2 * s / Z;
      for (index_t c = 0; c < p; ++c) {
        const double* col = X + c * N;
        const double xic = col[i];
        double acc = 0;
#pragma omp simd reduction(+ : acc)
        for (index_t j = 0; j < N; ++j) acc += coef[j] * (xic - col[j]) * (xic - col[j]);
        row_acc[row * p + c] = scale * acc;
      }
    }
  }

  LooCv result;
  double total = 0;
  for (index_t r = 0; r < rows; ++r) total += row_error[r], result.isolated += row_isolated[r];
  result.error = total * s;
  if (!with_gradient) return result;
  std::vector<double> grad(static_cast<std::size_t>(p), 0.0);  // dCV/dsigma_c
  for (index_t r = 0; r < rows && smooth; ++r)
    for (index_t c = 0; c < p; ++c) grad[c] += row_acc[r * p + c];
  for (index_t c = 0; c < p; ++c) grad[c] *= -2 / width(c);
  if (widths.size() == 1) {  // sigma_c = sigma for every c: the total derivative
    double sum = 0;
    for (const double g : grad) sum += g;
    grad.assign(1, sum);
  }
  result.gradient = std::move(grad);
  return result;
}

}  // namespace train

template <class T>
LooCv loo_cv_error(TensorView<const T> x, TensorView<const T> y, Kernel kernel, std::span<const double> widths,
                   bool with_gradient) {
  const train::LooProblem P = train::make_loo_problem("loo_cv_error", x, y, kernel);
  train::check_widths("loo_cv_error", widths, P.p, "x");
  return train::loo_cv(P, kernel, widths, with_gradient);
}

namespace {

// x (B, [H,] rows, p) with feature c divided by widths[c], as a contiguous tensor.
template <class T>
Tensor<T> divide_by_widths(const TensorView<const T>& x, std::span<const double> widths, const char* name) {
  const View4<const T> v = detail::to_view4(x, "nadaraya_watson_forward", name);
  Tensor<T> out(x.shape());
  T* o = out.data();
  for (index_t b = 0; b < v.B; ++b)
    for (index_t h = 0; h < v.H; ++h)
      for (index_t r = 0; r < v.R; ++r)
        for (index_t c = 0; c < v.C; ++c) *o++ = static_cast<T>(v.at(b, h, r, c) / widths[c]);
  return out;
}

}  // namespace

template <class T>
void nadaraya_watson_forward(TensorView<T> out, TensorView<T> weights, TensorView<const T> queries,
                             TensorView<const T> keys, TensorView<const T> values, Kernel kernel,
                             std::span<const double> widths) {
  const index_t p = queries.rank() > 0 ? queries.dim(-1) : 0;
  train::check_widths("nadaraya_watson_forward", widths, p, "queries");
  // One shared width is the isotropic forward itself, bit for bit.
  if (widths.size() == 1) return nadaraya_watson_forward<T>(out, weights, queries, keys, values, kernel, T(widths[0]));
  if (keys.rank() < 1 || keys.dim(-1) != p)  // before scaling keys by widths meant for p features
    detail::fail("nadaraya_watson_forward: keys has shape ", keys.shape_string(), " but queries has p = ", p,
                 " features; queries and keys must have the same feature size");
  const Tensor<T> q = divide_by_widths(queries, widths, "queries"), k = divide_by_widths(keys, widths, "keys");
  nadaraya_watson_forward<T>(out, weights, q.cview(), k.cview(), values, kernel, T(1));
}

#define ATTN_INSTANTIATE(T)                                                                                    \
  template train::LooProblem train::make_loo_problem<T>(const char*, TensorView<const T>, TensorView<const T>, \
                                                        Kernel);                                               \
  template LooCv loo_cv_error<T>(TensorView<const T>, TensorView<const T>, Kernel, std::span<const double>, bool); \
  template void nadaraya_watson_forward<T>(TensorView<T>, TensorView<T>, TensorView<const T>, TensorView<const T>, \
                                           TensorView<const T>, Kernel, std::span<const double>);
ATTN_INSTANTIATE(float)
ATTN_INSTANTIATE(double)
#undef ATTN_INSTANTIATE

}  // namespace attn
