// The kernel regression cases of `attn bench` (attn/kernel_regression.hpp): one cv_ls evaluation with
// its gradient (a step of the bandwidth search) and one fit at the data points, on a sin curve plus
// noise, at the cv_ls bandwidth of that data (checked: the criterion is stationary there). One
// continuous regressor takes the moments path (cpu/simd/kreg_moments); "cc" takes the per-point rows
// path. There is no unfused path to time beside them: the long double reference (src/ref) is the
// tests' oracle, dense and far slower.
#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "attn/error.hpp"
#include "attn/kernel_regression.hpp"
#include "bench.hpp"

namespace attn_cli {
namespace {

using attn::index_t;

// x uniform in [0, 5) (k columns), y = 2 sin(x_0) + x_0^0.8 (+ cos(x_1) for k = 2) + N(0, 0.5^2):
// the d2l chapter's curve, as the nw case draws it, from a fixed seed.
struct KregData {
  index_t n = 0, k = 1;
  std::vector<double> x, y;
  void draw() {
    std::mt19937_64 gen(7);
    std::uniform_real_distribution<double> u(0.0, 5.0);
    std::normal_distribution<double> noise(0.0, 0.5);
    x.resize(static_cast<std::size_t>(n * k)), y.resize(static_cast<std::size_t>(n));
    for (double& v : x) v = u(gen);
    for (index_t i = 0; i < n; ++i) {
      const double* xi = &x[static_cast<std::size_t>(i * k)];
      y[i] = 2 * std::sin(xi[0]) + std::pow(xi[0], 0.8) + (k > 1 ? std::cos(xi[1]) : 0.0) + noise(gen);
    }
  }
};

// The (point, point) pairs a pass over the data visits, approximately: for each point, the points
// whose first column lies inside its window there (a compact kernel's h; the Gaussian's reach with the
// largest weight taken as 1, where exp(-u^2 / 2) u^(2 degree) = 2^-60 / n). The rows path (k = 2)
// visits the same window along its sort column.
double visited_pairs(const KregData& d, attn::ContinuousKernel kernel, int degree, double h) {
  std::vector<double> s(static_cast<std::size_t>(d.n));
  for (index_t i = 0; i < d.n; ++i) s[i] = d.x[static_cast<std::size_t>(i * d.k)];
  std::sort(s.begin(), s.end());
  double reach = h;
  if (kernel == attn::ContinuousKernel::gaussian) {  // t / 2 - degree log t = log(2^60 n), by Newton
    const double target = std::log(std::ldexp(1.0, 60) * static_cast<double>(d.n));
    double t = 2 * target + 4 * degree + 2;
    for (int it = 0; it < 8; ++it)
      t = std::max(t - (0.5 * t - degree * std::log(t) - target) / (0.5 - degree / t), 2 * degree + 1e-9);
    reach = h * std::sqrt(t);
  }
  double pairs = 0;
  for (double at : s)
    pairs += static_cast<double>(std::upper_bound(s.begin(), s.end(), at + reach) -
                                 std::lower_bound(s.begin(), s.end(), at - reach));
  return pairs;
}

// What: "cv_ls" (the criterion and its gradient) or "fit" (at the data points). bandwidths: the cv_ls
// bandwidths of the data (select_bandwidth(cv_ls) on it, recorded here so that the bench does not
// spend its time searching).
BenchCase kreg_case(const std::string& what, index_t n, const std::string& var_type, attn::ContinuousKernel kernel,
                    std::vector<double> bandwidths) {
  struct State {
    KregData data;
    std::unique_ptr<attn::KernelRegression> model;
    std::vector<double> h, gradient;
    attn::KernelFit fit;
    double criterion = 0;
  };
  auto s = std::make_shared<State>();
  s->data.n = n, s->data.k = static_cast<index_t>(var_type.size()), s->h = std::move(bandwidths);
  attn::KernelRegOptions options;
  options.var_type = var_type, options.degree = 1, options.kernel = kernel;
  BenchCase c;
  c.name = "kreg " + what + " " + var_type + " " + attn::continuous_kernel_name(kernel) + " degree 1 (" +
           std::to_string(n) + ")";
  c.formula = std::string("(point, point) pairs in the windows along the first column (") +
              (kernel == attn::ContinuousKernel::gaussian ? "the Gaussian's reach at weight 1" : "|u| <= 1") +
              "), approximately those visited";
  c.prepare = [s, options] {
    s->data.draw();
    const attn::index_t k = s->data.k;
    s->model = std::make_unique<attn::KernelRegression>(
        k == 1 ? attn::TensorView<const double>(s->data.x.data(), {s->data.n})
               : attn::TensorView<const double>(s->data.x.data(), {s->data.n, k}),
        attn::TensorView<const double>(s->data.y.data(), {s->data.n}), options);
    // Validates the data against its recorded bandwidths: cv_ls is stationary there (|h dCV/dh| / CV
    // measured at most 1.6e-5 over the cases; 1.8e-3 at 1.1 times the Gaussian's h for n = 2000).
    const double cv = s->model->cv_ls(s->h, &s->gradient);
    for (std::size_t c = 0; c < s->h.size(); ++c)
      if (!(std::abs(s->gradient[c] * s->h[c]) <= 1e-4 * cv))
        throw attn::Error("bench: kreg data of n = " + std::to_string(s->data.n) +
                          " is not at its cv_ls minimum: h dCV/dh = " + std::to_string(s->gradient[c] * s->h[c]) +
                          " against CV = " + std::to_string(cv));
  };
  c.pairs = [s, kernel] { return visited_pairs(s->data, kernel, 1, s->h[0]); };
  if (what == "cv_ls")
    c.run_fused = [s] { s->criterion = s->model->cv_ls(s->h, &s->gradient); };
  else
    c.run_fused = [s] { s->fit = s->model->fit(s->h); };
  c.release = [s] { s->model.reset(), s->data = KregData{s->data.n, s->data.k, {}, {}}, s->fit = {}; };
  return c;
}

}  // namespace

std::vector<BenchCase> kreg_cases() {
  using K = attn::ContinuousKernel;
  std::vector<BenchCase> cases;
  // (n, kernel, cv_ls bandwidth of that data)
  struct One { index_t n; K kernel; double h; };
  for (const One& o : {One{2000, K::gaussian, 0.137108}, One{20000, K::gaussian, 0.100680},
                       One{2000, K::epanechnikov, 0.246508}, One{20000, K::epanechnikov, 0.239337}})
    for (const char* what : {"cv_ls", "fit"}) cases.push_back(kreg_case(what, o.n, "c", o.kernel, {o.h}));
  for (const char* what : {"cv_ls", "fit"})
    cases.push_back(kreg_case(what, 2000, "cc", K::gaussian, {0.221293, 0.367422}));
  return cases;
}

}  // namespace attn_cli
