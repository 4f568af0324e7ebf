// `attn nw`: Nadaraya-Watson kernel regression, the d2l chapter's first attention pooling: each query's
// prediction is the kernel-weighted average of the training targets.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <span>
#include <string>
#include <memory>
#include <numeric>
#include <vector>

#include "attention_flags.hpp"
#include "attn/nadaraya_watson.hpp"
#include "attn/plot.hpp"
#include "attn/width_selection.hpp"
#include "commands.hpp"
#include "exit_codes.hpp"

namespace attn_cli {
namespace {

using attn::index_t;

struct NwArgs {
  std::string x_train, y_train, x_query, kernel, out, weights, plot;
  std::string width;  // a positive number, or "auto": chosen by leave-one-out cross-validation
};

// --width as a number; "auto" gives an empty vector (the width is then chosen from the data).
std::vector<double> fixed_width(const std::string& text) {
  if (text == "auto") return {};
  std::size_t used = 0;
  double w = 0;
  try {
    w = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size())
    throw UsageError("--width " + text + ": the width must be a positive number or 'auto'");
  return {w};  // its range is the library's to check
}

std::string widths_string(const std::vector<double>& widths) {
  std::string s;
  for (double w : widths) {
    char text[32];
    std::snprintf(text, sizeof text, "%.6g", w);
    s += (s.empty() ? "" : ",") + std::string(text);
  }
  return s;
}

// x (N,) or (N,p) as the library's (1, N, p): one batch element of N points in p dimensions.
std::vector<index_t> points_shape(const NpyInput& x) {
  const auto& s = x.array.shape;
  if (s.size() == 1) return {1, s[0], 1};
  if (s.size() == 2) return {1, s[0], s[1]};
  throw UsageError(x.where() + " has shape " + attn::shape_string(s) + "; points must be (N,) or (N,p)");
}

// The training data, the fit at the queries (in increasing x) and the title.
template <class T>
void draw_fit(const NwArgs& args, const std::vector<double>& widths, const attn::Tensor<T>& x, const attn::Tensor<T>& y, const attn::Tensor<T>& xq,
              const attn::Tensor<T>& yhat) {
  attn::io::Series data{"training data", {x.values().begin(), x.values().end()}, {y.values().begin(), y.values().end()},
                        attn::io::Series::Style::points, ""};
  // The queries may come in any order; the line through the predictions runs from left to right.
  std::vector<std::size_t> order(static_cast<std::size_t>(xq.numel()));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return xq.values()[a] < xq.values()[b]; });
  attn::io::Series fit{"prediction", {}, {}, attn::io::Series::Style::line, ""};
  for (std::size_t i : order) fit.x.push_back(xq.values()[i]), fit.y.push_back(yhat.values()[i]);
  attn::io::PlotOptions options;
  options.title = "Nadaraya-Watson, " + args.kernel + " kernel, width " + widths_string(widths);
  options.xlabel = "x";
  options.ylabel = "y";
  attn::io::write_plot(args.plot, {fit, data}, options);
}

void run_nw(const NwArgs& args) {
  Progress progress("nw");
  progress.stage("reading inputs");
  const NpyInput x = read_input("--x-train", args.x_train), y = read_input("--y-train", args.y_train),
                 xq = read_input("--x-query", args.x_query);
  const auto dtype = common_float_type({&x, &y, &xq});
  // The shape checks the library would make in terms of its queries, keys and values, made here
  // in terms of the flags, before any tensor is built.
  const std::vector<index_t> keys_shape = points_shape(x), queries_shape = points_shape(xq);
  const index_t n_train = keys_shape[1], n_query = queries_shape[1], p = keys_shape[2];
  if (y.array.shape != std::vector<index_t>{n_train})
    throw UsageError(y.where() + " has shape " + attn::shape_string(y.array.shape) + " but must be (" +
                     std::to_string(n_train) + ",): one target for each point of " + x.where());
  if (queries_shape[2] != p)
    throw UsageError(xq.where() + " has points of dimension " + std::to_string(queries_shape[2]) + " but " +
                     x.where() + " has " + std::to_string(p) + "; they must match");
  if (!args.plot.empty() && p != 1)
    throw UsageError("--plot draws one-dimensional x only, but " + x.where() + " has points of dimension " +
                     std::to_string(p));
  const attn::Kernel kernel = as_usage([&] { return attn::kernel_from_name(args.kernel); });
  std::vector<double> widths = fixed_width(args.width);
  with_float_type(dtype, [&]<class T>() {
    const attn::Tensor<T> keys = to_tensor<T>(x), values = to_tensor<T>(y), queries = to_tensor<T>(xq);
    if (widths.empty()) {  // --width auto: one width per input dimension, by leave-one-out CV
      progress.stage("choosing the width");
      const attn::WidthSelection chosen = as_usage([&] {
        return attn::select_width<T>({keys.data(), {n_train, p}}, {values.data(), {n_train, 1}}, kernel);
      });
      widths = chosen.widths;
      std::printf("width %s (leave-one-out squared error %.6g)\n", widths_string(widths).c_str(), chosen.loo_error);
    }
    progress.stage("computing");
    // x, y and the queries as the library's one batch element: (1, N, p), (1, N, 1), (1, Nq, p);
    // the outputs are written back without the batch axis, (Nq,) and (Nq, N).
    attn::Tensor<T> out({1, n_query, 1}), weights;
    if (!args.weights.empty()) weights = attn::Tensor<T>({1, n_query, n_train});
    as_usage([&] {
      const attn::TensorView<const T> q(queries.data(), queries_shape), k(keys.data(), keys_shape),
          v(values.data(), {1, n_train, 1});
      if (widths.size() == 1)
        attn::nadaraya_watson_forward<T>(out.view(), weights.view(), q, k, v, kernel, static_cast<T>(widths[0]));
      else  // per-dimension widths from --width auto
        attn::nadaraya_watson_forward<T>(out.view(), weights.view(), q, k, v, kernel, std::span<const double>(widths));
    });
    progress.stage("writing " + args.out);
    write_output("--out", args.out, out, std::vector<index_t>{n_query});
    if (!args.weights.empty()) {
      progress.stage("writing " + args.weights);
      write_output("--weights", args.weights, weights, std::vector<index_t>{n_query, n_train});
    }
    if (!args.plot.empty()) {
      progress.stage("drawing " + args.plot);
      naming_flag("--plot", [&] { draw_fit(args, widths, keys, values, queries, out); });
    }
  });
  progress.done();
}

}  // namespace

void add_nw_command(CLI::App& app) {
  auto args = std::make_shared<NwArgs>();
  CLI::App* command = app.add_subcommand("nw", "Nadaraya-Watson kernel regression: kernel-weighted averages of y");
  command->add_option("--x-train", args->x_train, "training points (N,) or (N,p), float32 or float64")
      ->type_name("X.npy")
      ->required();
  command->add_option("--y-train", args->y_train, "training targets (N,), the same float type")
      ->type_name("Y.npy")
      ->required();
  command->add_option("--x-query", args->x_query, "query points (Nq,) or (Nq,p), the same float type")
      ->type_name("XQ.npy")
      ->required();
  command->add_option("--kernel", args->kernel, "the kernel K(u) of u = |x - x_i| / width")
      ->type_name("KERNEL")
      ->required()
      ->check(CLI::IsMember({"gaussian", "boxcar", "epanechnikov", "constant"}));
  command->add_option("--width", args->width,
                      "the kernel's width W, positive; 'auto' chooses one width per input dimension by "
                      "leave-one-out cross-validation and prints it with its leave-one-out error")
      ->type_name("W|auto")
      ->required();
  command->add_option("--out", args->out, "where to write the predictions (Nq,), the inputs' float type")
      ->type_name("YHAT.npy")
      ->required();
  command->add_option("--weights", args->weights, "also write the weights (Nq,N): row i weighs the training points")
      ->type_name("W.npy");
  check_picture_path(*command->add_option(
      "--plot", args->plot, "also draw the training data and the predictions (.svg or .png; one-dimensional x)"));
  command->footer(
      "Kernels: gaussian exp(-u^2/2), boxcar 1 if u <= 1, epanechnikov max(0, 1 - u), constant 1.\n"
      "A query with no training point inside a compact kernel's support predicts 0.\n"
      "Exit codes: 0 success, 1 failed run, 2 bad usage (see attn --help).\n\n"
      "Example (y = 2 sin(x) + x^0.8 + noise):\n"
      "  python3 -c \"import numpy as np; x = np.sort(np.random.rand(50) * 5); np.save('X.npy', x); \\\n"
      "    np.save('Y.npy', 2 * np.sin(x) + x**0.8 + np.random.normal(0, 0.5, 50)); np.save('XQ.npy', np.arange(0, 5, 0.1))\"\n"
      "  attn nw --x-train X.npy --y-train Y.npy --x-query XQ.npy --kernel gaussian --width 0.5 \\\n"
      "          --out YHAT.npy --plot fit.png");
  command->callback([args] { run_nw(*args); });
}

}  // namespace attn_cli
