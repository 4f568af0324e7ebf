// `attn kreg`: local polynomial kernel regression (attn/kernel_regression.hpp) on .npy files: the fit,
// its slopes and a pointwise confidence band at query points, with bandwidths chosen by leave-one-out
// cross-validation, the corrected AIC or the plug-in rule, or given in a file.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "attention_flags.hpp"
#include "attn/kernel_regression.hpp"
#include "attn/plot.hpp"
#include "commands.hpp"
#include "exit_codes.hpp"
#include "npy_inputs.hpp"
#include "progress.hpp"

namespace attn_cli {
namespace {

using attn::index_t;

struct KregArgs {
  std::string x, y, x_query, var_type, kernel = "gaussian", out, slopes, plot;
  std::string bandwidth = "cv_ls";  // cv_ls, aic, dpi or a .npy file of k bandwidths
  int degree = 1;
  std::vector<std::string> band;  // LOW.npy HIGH.npy, or empty
  double level = 0.95;
  std::string band_method = "asymptotic";
  std::uint64_t seed = 0;
  int replicates = 999;
};

// One float input read into float64, with its shape.
struct Doubles {
  std::vector<double> values;
  std::vector<index_t> shape;
};

Doubles read_doubles(const NpyInput& input) {
  Doubles d{{}, input.array.shape};
  with_float_type(input.array.dtype, [&]<class T>() {
    const attn::Tensor<T> t = to_tensor<T>(input);
    d.values.assign(t.values().begin(), t.values().end());
  });
  return d;
}

// A UsageError naming the first value that is not finite.
void check_finite(const NpyInput& input, const std::vector<double>& values) {
  for (std::size_t i = 0; i < values.size(); ++i)
    if (!std::isfinite(values[i]))
      throw UsageError(input.where() + ": element " + std::to_string(i) + " is " + std::to_string(values[i]) +
                       "; every value must be finite");
}

std::string number(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", v);
  return text;
}

std::string numbers(const std::vector<double>& values) {
  std::string s;
  for (double v : values) s += (s.empty() ? "" : ",") + number(v);
  return s;
}

const char* degree_name(int degree) {
  switch (degree) {
    case 0: return "local constant (Nadaraya-Watson)";
    case 1: return "local linear";
    case 2: return "local quadratic";
    default: return "local cubic";
  }
}

// Writes (rows,) or (rows, cols) of float64 values as `dtype` (the inputs' float type).
void write_values(const char* flag, const std::string& path, attn::io::DType dtype, std::span<const index_t> shape,
                  const std::vector<double>& values) {
  naming_flag(flag, [&] {
    if (dtype == attn::io::DType::float64) {
      attn::io::write_npy(path, dtype, shape, values.data());
    } else {
      const std::vector<float> narrow(values.begin(), values.end());
      attn::io::write_npy(path, dtype, shape, narrow.data());
    }
  });
}

// Runs `work` (a library call), turning its argument errors into UsageError with `prefix` (the flags
// the error comes from) before the library's message; memory errors pass through (exit 1).
template <class Work>
decltype(auto) naming(const std::string& prefix, Work&& work) {
  try {
    return std::forward<Work>(work)();
  } catch (const attn::MemoryError&) {
    throw;
  } catch (const attn::Error& e) {
    throw UsageError(prefix + ": " + e.what());
  }
}

// The bandwidths and how they were chosen.
struct Bandwidths {
  std::vector<double> h;
  std::string source;          // cv_ls, aic, dpi or given, for the plot's title
  std::string how;             // one line for the summary
  std::string criterion_name;  // "cv_ls" or "AICc"
  double criterion = 0;
};

// --bandwidth B.npy: k values of a float type, (k,) (or () when k = 1).
std::vector<double> read_bandwidth_file(const std::string& path, index_t k,
                                        const std::vector<attn::RegressorType>& types) {
  const NpyInput input = read_input("--bandwidth", path);
  common_float_type({&input});
  const Doubles b = read_doubles(input);
  const bool fits = (b.shape.size() == 1 && b.shape[0] == k) || (b.shape.empty() && k == 1);
  if (!fits)
    throw UsageError(input.where() + " has shape " + attn::shape_string(b.shape) + " but must be (" +
                     std::to_string(k) + ",): one bandwidth for each column of --x");
  for (std::size_t c = 0; c < b.values.size(); ++c)
    if (types[c] == attn::RegressorType::continuous && !(b.values[c] > 0 && std::isfinite(b.values[c])))
      throw UsageError(input.where() + ": bandwidth " + std::to_string(c) + " is " + number(b.values[c]) +
                       "; a continuous regressor's bandwidth must be positive and finite");
  return b.values;
}

Bandwidths choose_bandwidths(const KregArgs& args, const attn::KernelRegression& reg, const Doubles& x,
                             const std::vector<double>& y, const std::vector<attn::RegressorType>& types) {
  Bandwidths b;
  if (args.bandwidth == "cv_ls" || args.bandwidth == "aic") {
    const bool cv = args.bandwidth == "cv_ls";
    const attn::BandwidthSelection s = naming("--bandwidth " + args.bandwidth, [&] {
      return reg.select_bandwidth(cv ? attn::BandwidthMethod::cv_ls : attn::BandwidthMethod::aicc);
    });
    b.h = s.bandwidths;
    b.source = args.bandwidth;
    b.how = s.how + (s.converged ? "" : " (stopped on the step limit)");
    b.criterion_name = cv ? "cv_ls" : "AICc";
    b.criterion = s.objective;
    return b;
  }
  if (args.bandwidth == "dpi") {
    // Checked before any work (run_kreg); here the rule itself.
    b.h = {naming("--bandwidth dpi", [&] { return attn::plug_in_bandwidth(x.values, y); })};
    b.source = "dpi";
    b.how = "plug-in (Ruppert, Sheather and Wand's direct plug-in, as KernSmooth's dpill)";
  } else {
    b.h = read_bandwidth_file(args.bandwidth, reg.regressors(), types);
    b.source = "given";
    b.how = "given in " + args.bandwidth;
  }
  b.criterion_name = "cv_ls";
  b.criterion = naming("--bandwidth " + args.bandwidth, [&] { return reg.cv_ls(b.h); });
  return b;
}

// The points a plot's line runs through: the queries in increasing x, or 200 points across the data.
struct PlotCurve {
  std::vector<double> x, mean, low, high;
};

void draw(const KregArgs& args, const Bandwidths& bw, const std::vector<double>& x, const std::vector<double>& y,
          const PlotCurve& curve) {
  using attn::io::Series;
  std::vector<Series> series{{"fit", curve.x, curve.mean, Series::Style::line, "#1f77b4"}};
  if (!curve.low.empty()) {
    series.push_back({number(100 * args.level) + "% band (" + args.band_method + ")", curve.x, curve.low,
                      Series::Style::dashed, "#d62728"});
    series.push_back({"", curve.x, curve.high, Series::Style::dashed, "#d62728"});
  }
  series.push_back({"data", x, y, Series::Style::points, "#7f7f7f"});
  attn::io::PlotOptions options;
  // Short enough for the plot's width: the bandwidth to 3 digits (the summary prints 6).
  char h[32];
  std::snprintf(h, sizeof h, "%.3g", bw.h[0]);
  options.title = std::string(args.degree == 0 ? "local constant" : degree_name(args.degree)) + ", " + args.kernel +
                  ", h " + h + " (" + bw.source + ")";
  options.xlabel = "x";
  options.ylabel = "y";
  attn::io::write_plot(args.plot, series, options);
}

void run_kreg(const KregArgs& args) {
  Progress progress("kreg");
  // Checks of the flags alone, before any file is read.
  if (!(args.level > 0 && args.level < 1))
    throw UsageError("--level " + number(args.level) + ": the level must lie strictly between 0 and 1");
  const bool method = args.bandwidth == "cv_ls" || args.bandwidth == "aic" || args.bandwidth == "dpi";
  if (!method && !(args.bandwidth.size() > 4 && args.bandwidth.compare(args.bandwidth.size() - 4, 4, ".npy") == 0))
    throw UsageError("--bandwidth " + args.bandwidth +
                     ": the bandwidths must be cv_ls, aic, dpi or a .npy file holding one bandwidth per column of --x");
  const attn::ContinuousKernel kernel = naming("--kernel " + args.kernel, [&] { return attn::continuous_kernel_from_name(args.kernel); });

  progress.stage("reading inputs");
  const NpyInput x_in = read_input("--x", args.x), y_in = read_input("--y", args.y);
  std::optional<NpyInput> xq_in;
  if (!args.x_query.empty()) xq_in = read_input("--x-query", args.x_query);
  const attn::io::DType dtype = xq_in ? common_float_type({&x_in, &y_in, &*xq_in}) : common_float_type({&x_in, &y_in});
  const Doubles x = read_doubles(x_in), y = read_doubles(y_in);
  Doubles xq;
  if (xq_in) xq = read_doubles(*xq_in);

  // Shapes: x (n,) or (n,k), y (n,), queries (nq,) (k = 1) or (nq,k).
  if (x.shape.size() != 1 && x.shape.size() != 2)
    throw UsageError(x_in.where() + " has shape " + attn::shape_string(x.shape) +
                     "; the regressors must be (n,) or (n,k), one column a regressor");
  const index_t n = x.shape[0], k = x.shape.size() == 2 ? x.shape[1] : 1;
  if (k < 1) throw UsageError(x_in.where() + " has shape " + attn::shape_string(x.shape) + ": no regressor");
  if (y.shape != std::vector<index_t>{n})
    throw UsageError(y_in.where() + " has shape " + attn::shape_string(y.shape) + " but must be (" +
                     std::to_string(n) + ",): one response for each row of " + x_in.where());
  index_t nq = n;
  if (xq_in) {
    const bool fits = (xq.shape.size() == 1 && k == 1) || (xq.shape.size() == 2 && xq.shape[1] == k);
    if (!fits)
      throw UsageError(xq_in->where() + " has shape " + attn::shape_string(xq.shape) + " but " + x_in.where() +
                       " has " + std::to_string(k) + (k == 1 ? " column" : " columns") + "; the queries must be (nq," +
                       std::to_string(k) + ")" + (k == 1 ? " or (nq,)" : ""));
    nq = xq.shape[0];
  }
  check_finite(x_in, x.values);
  check_finite(y_in, y.values);
  if (xq_in) check_finite(*xq_in, xq.values);

  const std::string var_type = args.var_type.empty() ? std::string(static_cast<std::size_t>(k), 'c') : args.var_type;
  const std::vector<attn::RegressorType> types =
      naming("--var-type " + var_type, [&] { return attn::regressor_types_from_string(var_type); });
  if (static_cast<index_t>(types.size()) != k)
    throw UsageError("--var-type " + var_type + " has " + std::to_string(types.size()) + " letters but " +
                     x_in.where() + " has " + std::to_string(k) + (k == 1 ? " column" : " columns") +
                     "; one letter (c, u or o) a column");
  const bool one_continuous = k == 1 && types[0] == attn::RegressorType::continuous;
  if (args.bandwidth == "dpi") {
    if (!one_continuous)
      throw UsageError("--bandwidth dpi: the plug-in rule takes one continuous regressor, but --var-type is " + var_type);
    if (args.degree != 1)
      throw UsageError("--bandwidth dpi: the plug-in rule is for local linear regression (--degree 1), not --degree " +
                       std::to_string(args.degree));
    if (kernel != attn::ContinuousKernel::gaussian)
      throw UsageError("--bandwidth dpi: the plug-in rule is for the Gaussian kernel, not --kernel " + args.kernel);
  }
  if (!args.plot.empty() && !one_continuous)
    throw UsageError("--plot draws one continuous regressor only, but " + x_in.where() + " has " + std::to_string(k) +
                     (k == 1 ? " column" : " columns") + " of --var-type " + var_type);

  const attn::KernelRegOptions options{var_type, args.degree, kernel};
  const attn::TensorView<const double> x_view = x.shape.size() == 1
                                                    ? attn::TensorView<const double>(x.values.data(), {n})
                                                    : attn::TensorView<const double>(x.values.data(), {n, k});
  const attn::TensorView<const double> y_view(y.values.data(), {n});
  const attn::KernelRegression reg = naming(x_in.where() + ", " + y_in.where() + ", --var-type " + var_type,
                                            [&] { return attn::KernelRegression(x_view, y_view, options); });

  progress.stage(args.bandwidth == "cv_ls" || args.bandwidth == "aic" ? "choosing the bandwidths" : "reading the bandwidths");
  const Bandwidths bw = choose_bandwidths(args, reg, x, y.values, types);

  progress.stage("computing");
  attn::TensorView<const double> q_view;  // empty: the fit at the data points
  if (xq_in)
    q_view = xq.shape.size() == 1 ? attn::TensorView<const double>(xq.values.data(), {nq})
                                  : attn::TensorView<const double>(xq.values.data(), {nq, k});
  const attn::KernelFit fit = as_usage([&] { return reg.fit(bw.h, q_view); });
  const double r2 = as_usage([&] { return reg.r_squared(bw.h); });
  const attn::BandMethod band_method =
      args.band_method == "bootstrap" ? attn::BandMethod::bootstrap : attn::BandMethod::asymptotic;
  attn::ConfidenceBand band;
  if (!args.band.empty())
    band = as_usage([&] { return reg.confidence_band(bw.h, q_view, args.level, band_method, args.seed, args.replicates); });

  std::printf("kreg: n %lld, k %lld (var_type %s), degree %d (%s), %s kernel\n", static_cast<long long>(n),
              static_cast<long long>(k), var_type.c_str(), args.degree, degree_name(args.degree), args.kernel.c_str());
  std::printf("bandwidths %s: %s\n", numbers(bw.h).c_str(), bw.how.c_str());
  std::printf("%s %s, R^2 %s\n", bw.criterion_name.c_str(), number(bw.criterion).c_str(), number(r2).c_str());
  std::printf("fit at %lld %s: %lld reduced to a lower degree, %lld empty (the nearest point's response)\n",
              static_cast<long long>(nq), xq_in ? "query points" : "data points", static_cast<long long>(fit.reduced),
              static_cast<long long>(fit.empty));
  std::fflush(stdout);

  progress.stage("writing " + args.out);
  write_values("--out", args.out, dtype, std::vector<index_t>{nq}, fit.mean);
  if (!args.slopes.empty()) {
    progress.stage("writing " + args.slopes);
    // (nq,) when x is (n,), else (nq, k): the slopes keep the layout of x.
    const std::vector<index_t> shape = x.shape.size() == 1 ? std::vector<index_t>{nq} : std::vector<index_t>{nq, k};
    write_values("--slopes", args.slopes, dtype, shape, fit.slopes);
  }
  if (!args.band.empty()) {
    progress.stage("writing " + args.band[0] + " and " + args.band[1]);
    write_values("--band", args.band[0], dtype, std::vector<index_t>{nq}, band.low);
    write_values("--band", args.band[1], dtype, std::vector<index_t>{nq}, band.high);
  }
  if (!args.plot.empty()) {
    progress.stage("drawing " + args.plot);
    PlotCurve curve;
    if (xq_in) {  // the queries in increasing x, with their fit and band
      std::vector<std::size_t> order(static_cast<std::size_t>(nq));
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return xq.values[a] < xq.values[b]; });
      for (std::size_t i : order) {
        curve.x.push_back(xq.values[i]);
        curve.mean.push_back(fit.mean[i]);
        if (!args.band.empty()) curve.low.push_back(band.low[i]), curve.high.push_back(band.high[i]);
      }
    } else {  // 200 points from the smallest x to the largest
      const auto [lo, hi] = std::minmax_element(x.values.begin(), x.values.end());
      for (int i = 0; i < 200; ++i) curve.x.push_back(*lo + (*hi - *lo) * i / 199.0);
      const attn::TensorView<const double> grid(curve.x.data(), {200});
      if (!args.band.empty()) {
        const attn::ConfidenceBand b =
            as_usage([&] { return reg.confidence_band(bw.h, grid, args.level, band_method, args.seed, args.replicates); });
        curve.mean = b.mean;
        curve.low = b.low;
        curve.high = b.high;
      } else {
        curve.mean = as_usage([&] { return reg.fit(bw.h, grid).mean; });
      }
    }
    naming_flag("--plot", [&] { draw(args, bw, x.values, y.values, curve); });
  }
  progress.done();
}

}  // namespace

void add_kreg_command(CLI::App& app) {
  auto args = std::make_shared<KregArgs>();
  CLI::App* command = app.add_subcommand(
      "kreg", "local polynomial kernel regression (local linear by default) with chosen bandwidths and bands");
  command->add_option("--x", args->x, "the regressors (n,) or (n,k), one column a regressor; float32 or float64")
      ->type_name("X.npy")
      ->required();
  command->add_option("--y", args->y, "the responses (n,), the same float type")->type_name("Y.npy")->required();
  command->add_option("--x-query", args->x_query,
                      "where to predict, (nq,k) (or (nq,) for k = 1), the same float type; default: at the rows of --x")
      ->type_name("XQ.npy");
  command->add_option("--var-type", args->var_type,
                      "one letter a column of --x: c continuous, u unordered, o ordered discrete (statsmodels' "
                      "var_type); default: every column continuous")
      ->type_name("cc...");
  command->add_option("--degree", args->degree, "the local polynomial's degree: 0 local constant (Nadaraya-Watson), "
                      "1 local linear (the default), 2, 3")
      ->type_name("0..3")
      ->check(CLI::Range(0, 3));
  command->add_option("--kernel", args->kernel, "the continuous regressors' kernel (default gaussian)")
      ->type_name("KERNEL")
      ->check(CLI::IsMember({"gaussian", "epanechnikov", "boxcar", "uniform", "tricube"}));
  command->add_option("--bandwidth", args->bandwidth,
                      "cv_ls: leave-one-out least-squares cross-validation (the default); aic: the corrected AIC "
                      "(AICc); dpi: the direct plug-in rule (one continuous regressor, --degree 1, gaussian); "
                      "or a .npy file of k bandwidths, one per column")
      ->type_name("cv_ls|aic|dpi|B.npy");
  command->add_option("--out", args->out, "where to write the fit (nq,), the inputs' float type")
      ->type_name("YHAT.npy")
      ->required();
  command->add_option("--slopes", args->slopes,
                      "also write the slopes dm/dx: (nq,) when --x is (n,), else (nq,k); 0 for discrete columns")
      ->type_name("D.npy");
  CLI::Option* band = command->add_option("--band", args->band,
                                           "also write a pointwise confidence band: its lower and upper ends (nq,) each")
                          ->type_name("LOW.npy HIGH.npy")
                          ->expected(2);
  command->add_option("--level", args->level, "the band's confidence level, in (0, 1) (default 0.95)")
      ->type_name("P")
      ->needs(band);
  command->add_option("--band-method", args->band_method,
                      "asymptotic (the default: fit -/+ z se, homoscedastic errors) or bootstrap (the fit plus the "
                      "quantiles of the wild bootstrap's deviations)")
      ->type_name("METHOD")
      ->check(CLI::IsMember({"asymptotic", "bootstrap"}))
      ->needs(band);
  CLI::Option* seed = command->add_option("--seed", args->seed, "the bootstrap's seed (default 0; the same band for any thread count)");
  seed->type_name("N")->needs(band);
  check_seed(*seed);
  command->add_option("--replicates", args->replicates, "the bootstrap's replicates (default 999)")
      ->type_name("R")
      ->check(CLI::Range(2, 1000000))
      ->needs(band);
  check_picture_path(*command->add_option(
      "--plot", args->plot,
      "also draw the data, the fit (over the sorted --x-query, or 200 points across the data) and, with --band, "
      "the band as two dashed lines (.svg or .png; one continuous regressor)"));
  command->footer(
      "Prints one summary: n, k, the degree and kernel, the bandwidths and how they were chosen, the criterion\n"
      "(cv_ls, or AICc for --bandwidth aic) at them, R^2 and how many fits dropped to a lower degree or were empty.\n"
      "Exit codes: 0 success, 1 failed run, 2 bad usage (see attn --help).\n\n"
      "Example (y = 2 sin(x) + x^0.8 + noise; local linear, bandwidth by cross-validation, a 95% band):\n"
      "  python3 -c \"import numpy as np; x = np.sort(np.random.rand(50) * 5); np.save('X.npy', x); \\\n"
      "    np.save('Y.npy', 2 * np.sin(x) + x**0.8 + np.random.normal(0, 0.5, 50)); np.save('XQ.npy', np.arange(0, 5, 0.1))\"\n"
      "  attn kreg --x X.npy --y Y.npy --x-query XQ.npy --bandwidth cv_ls --out YHAT.npy \\\n"
      "            --band LOW.npy HIGH.npy --plot fit.png");
  command->callback([args] { run_kreg(*args); });
}

}  // namespace attn_cli
