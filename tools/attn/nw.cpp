// `attn nw`: Nadaraya-Watson kernel regression, the seeds' first attention pooling: each query's
// prediction is the kernel-weighted average of the training targets.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <numeric>
#include <vector>

#include "attention_flags.hpp"
#include "attn/nadaraya_watson.hpp"
#include "attn/plot.hpp"
#include "commands.hpp"
#include "exit_codes.hpp"

namespace attn_cli {
namespace {

using attn::index_t;

struct NwArgs {
  std::string x_train, y_train, x_query, kernel, out, weights, plot;
  double width = 0;
};

// x (N,) or (N,p) as the library's (1, N, p): one batch element of N points in p dimensions.
std::vector<index_t> points_shape(const NpyInput& x) {
  const auto& s = x.array.shape;
  if (s.size() == 1) return {1, s[0], 1};
  if (s.size() == 2) return {1, s[0], s[1]};
  throw UsageError(x.where() + " has shape " + attn::detail::dims_string(s) + "; points must be (N,) or (N,p)");
}

// The training data, the fit at the queries (in increasing x) and the title.
template <class T>
void draw_fit(const NwArgs& args, const attn::Tensor<T>& x, const attn::Tensor<T>& y, const attn::Tensor<T>& xq,
              const attn::Tensor<T>& yhat) {
  attn::io::Series data{"training data", {x.values().begin(), x.values().end()}, {y.values().begin(), y.values().end()},
                        attn::io::Series::Style::points, ""};
  std::vector<std::size_t> order(static_cast<std::size_t>(xq.numel()));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return xq.values()[a] < xq.values()[b]; });
  attn::io::Series fit{"prediction", {}, {}, attn::io::Series::Style::line, ""};
  for (std::size_t i : order) fit.x.push_back(xq.values()[i]), fit.y.push_back(yhat.values()[i]);
  char width[32];
  std::snprintf(width, sizeof width, "%g", args.width);
  attn::io::PlotOptions options;
  options.title = "Nadaraya-Watson, " + args.kernel + " kernel, width " + width;
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
  const std::vector<index_t> keys_shape = points_shape(x), queries_shape = points_shape(xq);
  const index_t n_train = keys_shape[1], n_query = queries_shape[1], p = keys_shape[2];
  if (y.array.shape != std::vector<index_t>{n_train})
    throw UsageError(y.where() + " has shape " + attn::detail::dims_string(y.array.shape) + " but must be (" +
                     std::to_string(n_train) + ",): one target for each point of " + x.where());
  if (queries_shape[2] != p)
    throw UsageError(xq.where() + " has points of dimension " + std::to_string(queries_shape[2]) + " but " +
                     x.where() + " has " + std::to_string(p) + "; they must match");
  if (!args.plot.empty() && p != 1)
    throw UsageError("--plot draws one-dimensional x only, but " + x.where() + " has points of dimension " +
                     std::to_string(p));
  const attn::Kernel kernel = as_usage([&] { return attn::kernel_from_name(args.kernel); });
  with_float_type(dtype, [&]<class T>() {
    const attn::Tensor<T> keys = to_tensor<T>(x), values = to_tensor<T>(y), queries = to_tensor<T>(xq);
    progress.stage("computing");
    attn::Tensor<T> out({1, n_query, 1}), weights;
    if (!args.weights.empty()) weights = attn::Tensor<T>({1, n_query, n_train});
    as_usage([&] {
      attn::nadaraya_watson_forward<T>(out.view(), weights.view(), {queries.data(), queries_shape},
                                       {keys.data(), keys_shape}, {values.data(), {1, n_train, 1}}, kernel,
                                       static_cast<T>(args.width));
    });
    progress.stage("writing " + args.out);
    write_output(args.out, out, std::vector<index_t>{n_query});
    if (!args.weights.empty()) {
      progress.stage("writing " + args.weights);
      write_output(args.weights, weights, std::vector<index_t>{n_query, n_train});
    }
    if (!args.plot.empty()) {
      progress.stage("drawing " + args.plot);
      draw_fit(args, keys, values, queries, out);
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
  command->add_option("--width", args->width, "the kernel's width W, positive")->type_name("W")->required();
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
