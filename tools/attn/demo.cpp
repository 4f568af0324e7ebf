// `attn demo`: the d2l chapter's examples, one section each (see demo.hpp).
//
// Random inputs come from std::mt19937_64 with a fixed seed per example, so every run prints the
// same numbers and one example can change without shifting the others. The d2l chapter draw from
// PyTorch's generator, so the random numbers (and what depends on them) differ from theirs; the
// shapes, the masking and the values that do not depend on them (bmm, the additive and
// dot-product outputs) are the d2l chapter's own. The distributions are the standard library's, so
// another standard library may print other random values.
#include "demo.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <iostream>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "attn/attn.hpp"
#include "demo_figures.hpp"
#include "print.hpp"

namespace attn_cli {
namespace {

using attn::index_t;
using attn::Tensor;
using Lens = Tensor<std::int64_t>;

// ---------------------------------------------------------------------------------------------
// Inputs and output helpers

// A tensor of `shape` filled with dist(rng) in C order: torch.rand, torch.normal.
template <class Dist>
Tensor<float> random_tensor(std::initializer_list<index_t> shape, std::mt19937_64& rng, Dist dist) {
  Tensor<float> t(shape);
  for (float& x : t.values()) x = dist(rng);
  return t;
}

Tensor<float> ones(std::initializer_list<index_t> shape) {
  Tensor<float> t(shape);
  std::fill(t.values().begin(), t.values().end(), 1.0f);
  return t;
}

// The d2l chapter's valid_lens argument as an attn::Mask.
attn::Mask<float> valid_lens_mask(const Lens& lens) {
  attn::Mask<float> mask;
  mask.valid_lens = lens.cview();
  return mask;
}

// A section heading: the title, underlined, then the d2l chapter's lines it reproduces after `prompt`.
void heading(std::ostream& os, std::string_view title, std::initializer_list<std::string_view> lines,
             std::string_view prompt = ">>> ") {
  os << '\n' << title << '\n' << std::string(title.size(), '=') << '\n';
  for (std::string_view line : lines) os << "  " << prompt << line << '\n';
  os << '\n';
}

// A labelled tensor and a blank line.
template <class T>
void show(std::ostream& os, std::string_view name, const Tensor<T>& t) {
  print_tensor(os, name, t.cview());
  os << '\n';
}

// ---------------------------------------------------------------------------------------------
// The examples, in the order of the chapter

void masked_softmax_example(std::ostream& os) {
  heading(os, "1. Masked softmax",
          {"masked_softmax(torch.rand(2, 2, 4), torch.tensor([2, 3]))",
           "masked_softmax(torch.rand(2, 2, 4), torch.tensor([[1, 3], [2, 4]]))"});
  os << "Each row is a softmax over its first valid_lens entries; the entries after them get weight 0.\n"
        "valid_lens of shape (2,) gives one length per batch element (both rows of it), shape (2, 2)\n"
        "one length per row.\n\n";
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<float> rand01(0.0f, 1.0f);
  const Lens per_batch({2}, {2, 3});
  const Lens per_row({2, 2}, {1, 3, 2, 4});
  for (const Lens* lens : {&per_batch, &per_row}) {
    const Tensor<float> x = random_tensor({2, 2, 4}, rng, rand01);
    show(os, "X = torch.rand(2, 2, 4)", x);
    show(os, "valid_lens", *lens);
    show(os, "masked_softmax(X, valid_lens)", attn::masked_softmax<float>(x.cview(), valid_lens_mask(*lens)));
  }
}

void bmm_example(std::ostream& os) {
  heading(os, "2. Batch matrix multiplication",
          {"Q = d2l.ones((2, 3, 4))", "K = d2l.ones((2, 4, 6))", "torch.bmm(Q, K)  # Result: (2, 3, 6)"});
  const Tensor<float> q = ones({2, 3, 4}), k = ones({2, 4, 6});
  show(os, "torch.bmm(Q, K)", attn::bmm<float>(q.cview(), k.cview()));
  os << "Each of the 2 products is a (3, 4) @ (4, 6) matrix product; every entry sums four 1 * 1.\n";
}

// The keys, values and valid lengths that the d2l chapter's additive and dot-product examples share.
struct SharedInputs {
  Tensor<float> keys = ones({2, 10, 2});
  Tensor<float> values = Tensor<float>({2, 10, 4});
  Lens valid_lens = Lens({2}, {2, 6});

  SharedInputs() {
    // torch.arange(40).reshape(1, 10, 4).repeat(2, 1, 1): both batch elements hold 0..39.
    for (index_t i = 0; i < values.numel(); ++i) values[i] = static_cast<float>(i % 40);
  }
};

// What the printed outputs of examples 3 and 4 show: equal keys give equal scores.
void explain_uniform_weights(std::ostream& os) {
  os << "All 10 keys are equal, so every valid key gets the same score and the same weight: 1/2 over\n"
        "the first 2 keys, 1/6 over the first 6. The output is the mean of those value rows:\n"
        "(0..3 + 4..7) / 2 = [2, 3, 4, 5] and (0..3 + ... + 20..23) / 6 = [10, 11, 12, 13].\n";
}

// Returns the attention weights, for the demo's heatmap.
Tensor<float> additive_example(std::ostream& os, const SharedInputs& in) {
  heading(os, "3. Additive attention",
          {"queries, keys = torch.normal(0, 1, (2, 1, 20)), torch.ones((2, 10, 2))",
           "values = torch.arange(40, dtype=torch.float32).reshape(1, 10, 4).repeat(2, 1, 1)",
           "valid_lens = torch.tensor([2, 6])",
           "attention = AdditiveAttention(key_size=2, query_size=20, num_hiddens=8, dropout=0.1)",
           "attention.eval()", "attention(queries, keys, values, valid_lens)"});
  std::mt19937_64 rng(3);
  const Tensor<float> queries = random_tensor({2, 1, 20}, rng, std::normal_distribution<float>(0.0f, 1.0f));
  // W_q (8, 20), W_k (8, 2), w_v (8,), initialised like nn.Linear; init takes (q, k, h).
  const auto params = attn::AdditiveWeights<float>::init(20, 2, 8, /*seed=*/3);
  Tensor<float> out({2, 1, 4}), weights({2, 1, 10});
  // attention.eval() turns dropout off: the default attn::Dropout has p = 0.
  attn::additive_attention_forward<float>(out, weights, queries.cview(), in.keys.cview(), in.values.cview(),
                                          params.params(), valid_lens_mask(in.valid_lens));
  os << "queries (2, 1, 20) ~ normal(0, 1), keys (2, 10, 2) ones, values (2, 10, 4), valid_lens [2, 6]\n\n";
  show(os, "attention(queries, keys, values, valid_lens)", out);
  show(os, "attention.attention_weights", weights);
  explain_uniform_weights(os);
  return weights;
}

// Returns the attention weights, for the demo's heatmap.
Tensor<float> dot_product_example(std::ostream& os, const SharedInputs& in) {
  heading(os, "4. Scaled dot-product attention",
          {"queries = torch.normal(0, 1, (2, 1, 2))", "attention = DotProductAttention(dropout=0.5)",
           "attention.eval()", "attention(queries, keys, values, valid_lens)"});
  std::mt19937_64 rng(4);
  const Tensor<float> queries = random_tensor({2, 1, 2}, rng, std::normal_distribution<float>(0.0f, 1.0f));
  // attention.eval(): dropout 0.5 is off, so the options keep p = 0; the scale is 1/sqrt(d).
  Tensor<float> weights;
  const Tensor<float> out = attn::scaled_dot_product_attention<float>(
      queries.cview(), in.keys.cview(), in.values.cview(), valid_lens_mask(in.valid_lens), {}, &weights);
  os << "keys, values and valid_lens as in example 3 (the d2l practical guide draws them from normal(0, 1)).\n\n";
  show(os, "queries = torch.normal(0, 1, (2, 1, 2))", queries);
  show(os, "attention(queries, keys, values, valid_lens)", out);
  show(os, "attention.attention_weights", weights);
  explain_uniform_weights(os);
  return weights;
}

// --- Example 5: Nadaraya-Watson regression ---

// The curve the regression recovers.
double truth(double x) { return 2 * std::sin(x) + std::pow(x, 0.8); }

// The toy data set: 50 noisy training pairs and 50 evenly spaced queries, as (1, 50, 1) tensors,
// one batch element with 50 one-dimensional keys, values and queries.
struct Regression {
  static constexpr index_t n = 50;
  Tensor<float> x_train{1, n, 1}, y_train{1, n, 1}, x_test{1, n, 1};
  std::vector<double> y_truth;

  Regression() {
    std::mt19937_64 rng(5);
    std::uniform_real_distribution<float> uniform(0.0f, 5.0f);
    std::normal_distribution<float> noise(0.0f, 0.5f);
    std::vector<float> xs(n);
    for (float& x : xs) x = uniform(rng);
    std::sort(xs.begin(), xs.end());
    for (index_t i = 0; i < n; ++i) {
      x_train[i] = xs[static_cast<std::size_t>(i)];
      y_train[i] = static_cast<float>(truth(x_train[i])) + noise(rng);
      x_test[i] = 0.1f * static_cast<float>(i);  // torch.arange(0, 5, 0.1)
      y_truth.push_back(truth(x_test[i]));
    }
  }

  // The predictions at x_test of the estimator with `kernel` and width `sigma`.
  std::vector<double> fit(attn::Kernel kernel, float sigma) const { return fit_at(x_test, y_train, kernel, sigma); }

  // The same at other queries (1, nq, 1) with other targets (1, n, 1).
  std::vector<double> fit_at(const Tensor<float>& queries, const Tensor<float>& targets, attn::Kernel kernel,
                             float sigma) const {
    Tensor<float> out({1, queries.dim(1), 1});
    attn::nadaraya_watson_forward<float>(out, {}, queries.cview(), x_train.cview(), targets.cview(), kernel, sigma);
    return {out.values().begin(), out.values().end()};
  }

  double mse(const std::vector<double>& y) const {
    double sum = 0;
    for (std::size_t i = 0; i < y.size(); ++i) sum += (y[i] - y_truth[i]) * (y[i] - y_truth[i]);
    return sum / static_cast<double>(y.size());
  }
};

// Queries whose predictions the tables show: x = 0, 1, 2, 3, 4, 4.9.
constexpr std::size_t kShown[] = {0, 10, 20, 30, 40, 49};

// A table with one row per (kernel, width) and, first, the true curve: the mean squared error of
// the fit against the truth at all 50 queries, then the predictions at the kShown queries.
void print_fits(std::ostream& os, const Regression& data,
                const std::vector<std::pair<attn::Kernel, float>>& rows) {
  std::vector<std::string> kernels{"truth"};
  std::vector<double> widths, errors;
  std::vector<std::vector<double>> predicted(std::size(kShown));
  for (std::size_t c = 0; c < std::size(kShown); ++c) predicted[c].push_back(data.y_truth[kShown[c]]);
  for (const auto& [kernel, width] : rows) {
    const std::vector<double> y = data.fit(kernel, width);
    kernels.emplace_back(attn::kernel_name(kernel));
    widths.push_back(width);
    errors.push_back(data.mse(y));
    for (std::size_t c = 0; c < std::size(kShown); ++c) predicted[c].push_back(y[kShown[c]]);
  }
  // The truth row has no width and no error: blank cells above the formatted numbers.
  const auto below_blank = [](std::vector<std::string> cells) {
    cells.insert(cells.begin(), "");
    return cells;
  };
  std::vector<std::string> headers{"kernel", "width", "MSE"};
  std::vector<std::vector<std::string>> columns{kernels, below_blank(format_column(widths)),
                                                below_blank(format_column(errors))};
  for (std::size_t c = 0; c < std::size(kShown); ++c) {
    headers.push_back("f(" + format_column({data.x_test[static_cast<index_t>(kShown[c])]})[0] + ")");
    columns.push_back(format_column(predicted[c]));
  }
  print_table(os, headers, columns);
  os << '\n';
}

void nadaraya_watson_example(std::ostream& os, const Regression& data) {
  heading(os, "5. Nadaraya-Watson kernel regression",
          {"f(x) = sum_i softmax(-1/2 (x - x_i)^2) y_i", "kernels: Gaussian, boxcar, Epanechnikov"},
          "d2l: ");
  os << "The d2l chapter gives the estimator but no code; the data are the usual toy regression:\n"
        "  x_i: 50 sorted uniform(0, 5) draws, y_i = 2 sin(x_i) + x_i^0.8 + normal(0, 0.5) noise,\n"
        "  queries x = 0, 0.1, ..., 4.9 (torch.arange(0, 5, 0.1)); MSE against the noiseless curve.\n"
        "attn::nadaraya_watson_forward with (1, 50, 1) queries, keys and values.\n\n";
  using attn::Kernel;
  os << "Every kernel at width 1 (constant weighs all keys alike: the plain average of y):\n";
  print_fits(os, data, {{Kernel::gaussian, 1}, {Kernel::boxcar, 1}, {Kernel::epanechnikov, 1}, {Kernel::constant, 1}});
  os << "The Gaussian kernel narrowed: a less smooth fit that follows local detail (and noise) more:\n";
  print_fits(os, data, {{Kernel::gaussian, 0.1f}, {Kernel::gaussian, 0.2f}, {Kernel::gaussian, 0.5f}, {Kernel::gaussian, 1}});
}

// --- Example 5, continued: local linear regression at the boundary ---

// The Gaussian Nadaraya-Watson fit and the local linear fit (attn::KernelRegression, degree 1) of the
// toy data, each with its bandwidth chosen by leave-one-out cross-validation, and local linear at
// Nadaraya-Watson's width. Each is also fitted to the noiseless curve at the same points: both fits
// are linear in y, so that fit is the mean of the fit over the noise, and its distance to the truth
// the fit's bias. At the queries for the table, on a grid of 501 points over [0, 5] for the figure.
struct BoundaryFits {
  double nw_width = 0, ll_bandwidth = 0;
  std::vector<double> nw, ll, ll_same;                 // at x_test, of the noisy data
  std::vector<double> nw_mean, ll_mean, ll_same_mean;  // at x_test, of the noiseless curve
  LocalLinearFigure figure;
};

BoundaryFits boundary_fits(const Regression& data) {
  BoundaryFits f;
  // Nadaraya-Watson's width as `attn nw --width auto` chooses it: (N, 1) points, (N, 1) targets.
  const attn::WidthSelection width = attn::select_width<float>(
      {data.x_train.data(), {Regression::n, 1}}, {data.y_train.data(), {Regression::n, 1}}, attn::Kernel::gaussian);
  f.nw_width = width.widths[0];
  const float nw_width = static_cast<float>(f.nw_width);
  // The same data in float64 for KernelRegression; its Gaussian exp(-u^2 / 2) is Nadaraya-Watson's.
  Tensor<float> noiseless({1, Regression::n, 1});
  std::vector<double> x, y, y_mean;
  for (index_t i = 0; i < Regression::n; ++i) {
    x.push_back(data.x_train[i]);
    y.push_back(data.y_train[i]);
    y_mean.push_back(truth(data.x_train[i]));
    noiseless[i] = static_cast<float>(y_mean.back());
  }
  const attn::KernelRegOptions options{"c", 1, attn::ContinuousKernel::gaussian};
  const attn::KernelRegression local_linear({x.data(), {Regression::n}}, {y.data(), {Regression::n}}, options),
      local_linear_mean({x.data(), {Regression::n}}, {y_mean.data(), {Regression::n}}, options);
  f.ll_bandwidth = local_linear.select_bandwidth(attn::BandwidthMethod::cv_ls).bandwidths[0];
  const std::vector<double> ll_h{f.ll_bandwidth}, same_h{f.nw_width};
  const std::vector<double> queries(data.x_test.values().begin(), data.x_test.values().end());
  const attn::TensorView<const double> at_queries(queries.data(), {Regression::n});
  f.nw = data.fit(attn::Kernel::gaussian, nw_width);
  f.ll = local_linear.fit(ll_h, at_queries).mean;
  f.ll_same = local_linear.fit(same_h, at_queries).mean;
  f.nw_mean = data.fit_at(data.x_test, noiseless, attn::Kernel::gaussian, nw_width);
  f.ll_mean = local_linear_mean.fit(ll_h, at_queries).mean;
  f.ll_same_mean = local_linear_mean.fit(same_h, at_queries).mean;

  LocalLinearFigure& fig = f.figure;
  fig.x_train = x;
  fig.y_train = y;
  fig.nw_width = f.nw_width;
  fig.ll_bandwidth = f.ll_bandwidth;
  constexpr index_t grid_points = 501;
  Tensor<float> grid({1, grid_points, 1});
  for (index_t i = 0; i < grid_points; ++i) {
    grid[i] = 0.01f * static_cast<float>(i);
    fig.grid.push_back(grid[i]);
    fig.truth.push_back(truth(grid[i]));
  }
  const attn::TensorView<const double> at_grid(fig.grid.data(), {grid_points});
  fig.nw = data.fit_at(grid, data.y_train, attn::Kernel::gaussian, nw_width);
  fig.local_linear = local_linear.fit(ll_h, at_grid).mean;
  fig.nw_mean = data.fit_at(grid, noiseless, attn::Kernel::gaussian, nw_width);
  fig.local_linear_mean = local_linear_mean.fit(ll_h, at_grid).mean;
  return f;
}

// The mean squared difference of y from the truth over the first `count` queries.
double mse_first(const Regression& data, const std::vector<double>& y, std::size_t count) {
  double sum = 0;
  for (std::size_t i = 0; i < count; ++i) sum += (y[i] - data.y_truth[i]) * (y[i] - data.y_truth[i]);
  return sum / static_cast<double>(count);
}

BoundaryFits local_linear_example(std::ostream& os, const Regression& data) {
  os << "Local linear regression (attn::KernelRegression, degree 1, the same Gaussian kernel) fits a line\n"
        "around each query instead of a constant. At the boundary x = 0 the data lie on one side only and\n"
        "the curve rises steeply, so Nadaraya-Watson's local average is pulled up towards the points to\n"
        "the right; the local line follows the slope down to x = 0. Bandwidths by leave-one-out\n"
        "cross-validation (attn::select_width for Nadaraya-Watson, select_bandwidth(cv_ls) for local\n"
        "linear); the last row is local linear at Nadaraya-Watson's width. MSE against the truth at all\n"
        "50 queries and at the 5 nearest the boundary (x = 0, ..., 0.4). With 50 noisy points the few\n"
        "near x = 0 make both fits noisy there; the bias columns take the noise out: each fit is linear\n"
        "in y, so fitting the noiseless curve at the same x_i gives its mean over the noise, E f. bias^2\n"
        "is the mean of (E f - truth)^2 over those 5 queries.\n";
  BoundaryFits f = boundary_fits(data);
  const std::vector<std::string> names{"truth", "nadaraya-watson", "local linear", "local linear, NW width"};
  const std::vector<std::pair<const std::vector<double>*, const std::vector<double>*>> fits{
      {&f.nw, &f.nw_mean}, {&f.ll, &f.ll_mean}, {&f.ll_same, &f.ll_same_mean}};
  std::vector<double> widths{f.nw_width, f.ll_bandwidth, f.nw_width}, errors, near, at_zero{data.y_truth[0]},
      mean_at_zero{data.y_truth[0]}, bias_near;
  for (const auto& [fit, mean] : fits) {
    errors.push_back(data.mse(*fit));
    near.push_back(mse_first(data, *fit, 5));
    at_zero.push_back((*fit)[0]);
    mean_at_zero.push_back((*mean)[0]);
    bias_near.push_back(mse_first(data, *mean, 5));
  }
  const auto below_blank = [](std::vector<std::string> cells) {
    cells.insert(cells.begin(), "");
    return cells;
  };
  print_table(os, {"fit", "bandwidth", "MSE", "MSE x<0.5", "f(0)", "E f(0)", "bias^2 x<0.5"},
              {names, below_blank(format_column(widths)), below_blank(format_column(errors)),
               below_blank(format_column(near)), format_column(at_zero), format_column(mean_at_zero),
               below_blank(format_column(bias_near))});
  return f;
}

void closing(std::ostream& os) {
  os << "\nMasks beyond valid_lens (attn::Mask, combinable): a boolean keep-mask and an additive float mask,\n"
        "both broadcast to (B, H, n, m), and a causal mask aligned top-left or bottom-right.\n"
        "MaskedFill::d2l_minus_1e6 reproduces the d2l chapter's -1e6 fill exactly (rows with no valid key\n"
        "then average all values instead of giving 0).\n";
}

// The regression data set and its fits, for the demo's figure.
RegressionFigure regression_figure(const Regression& data) {
  const auto values = [](const Tensor<float>& t) { return std::vector<double>(t.values().begin(), t.values().end()); };
  return {values(data.x_train), values(data.y_train), values(data.x_test), data.y_truth,
          [&data](attn::Kernel kernel, double width) { return data.fit(kernel, static_cast<float>(width)); }};
}

}  // namespace

void run_demo(std::ostream& os, const std::string& out_dir) {
  os << "attn demo: the examples of the chapter \"Attention Scoring Functions\", computed by the attn\n"
        "library. Each section quotes the Python it reproduces. Random inputs come from std::mt19937_64\n"
        "with fixed seeds, not from PyTorch's generator: shapes and masks match the d2l chapter, random values\n"
        "do not.\n";
  masked_softmax_example(os);
  bmm_example(os);
  const SharedInputs shared;
  const Tensor<float> additive_weights = additive_example(os, shared);
  const Tensor<float> dot_product_weights = dot_product_example(os, shared);
  const Regression data;
  nadaraya_watson_example(os, data);
  const BoundaryFits boundary = local_linear_example(os, data);
  closing(os);
  if (!out_dir.empty())
    write_demo_figures(os, out_dir, additive_weights, dot_product_weights, regression_figure(data), boundary.figure);
}

void add_demo_command(CLI::App& app) {
  auto out_dir = std::make_shared<std::string>();
  CLI::App* demo = app.add_subcommand("demo", "run every example of the d2l chapter (no input files needed)");
  demo->add_option("--out-dir", *out_dir,
                   "also draw the chapter's pictures into DIR (created if missing), each as .svg and .png: "
                   "the additive and dot-product attention weights, the kernels, the Nadaraya-Watson fits, "
                   "and Nadaraya-Watson beside local linear regression at the boundary")
      ->type_name("DIR");
  demo->footer(
      "Exit codes: 0 success, 1 failed run, 2 bad usage (see attn --help).\n\n"
      "Example:\n"
      "  attn demo --out-dir pictures");
  demo->callback([out_dir] { run_demo(std::cout, *out_dir); });
}

}  // namespace attn_cli
