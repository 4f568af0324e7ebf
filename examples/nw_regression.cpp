// The d2l chapter's Nadaraya-Watson regression with the width chosen by leave-one-out cross-validation
// (attn::select_width) beside the fixed widths 0.1, 0.2, 0.5 and 1, for every kernel.
//
// The data are those of `attn demo` (example 5): 50 training points x_i sorted uniform(0, 5),
// y_i = 2 sin(x_i) + x_i^0.8 + normal(0, 0.5) noise (std::mt19937_64 seed 5, float), and the
// validation queries x = 0, 0.1, ..., 4.9 against the noiseless curve. Columns:
//   LOO         the leave-one-out error of the width on the training data (what auto minimises)
//   train MSE   each training point predicted from all of them, itself included, against its y
//   valid MSE   the validation queries against the noiseless curve
//
//   nw_regression [--points N] [--seed S]
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "attn/width_selection.hpp"

namespace {

using attn::index_t;
using attn::Tensor;

double truth(double x) { return 2 * std::sin(x) + std::pow(x, 0.8); }

struct Data {
  Tensor<float> x_train, y_train, x_valid, y_valid;  // (1, N, 1) each
};

Data make_data(index_t n, std::uint64_t seed) {
  Data d{Tensor<float>{1, n, 1}, Tensor<float>{1, n, 1}, Tensor<float>{1, 50, 1}, Tensor<float>{1, 50, 1}};
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(0.0f, 5.0f);
  std::normal_distribution<float> noise(0.0f, 0.5f);
  for (index_t i = 0; i < n; ++i) d.x_train[i] = uniform(rng);
  std::sort(d.x_train.data(), d.x_train.data() + n);
  // As the demo draws them: the noise after all the x, in sorted order.
  for (index_t i = 0; i < n; ++i) d.y_train[i] = static_cast<float>(truth(d.x_train[i])) + noise(rng);
  for (index_t i = 0; i < 50; ++i) {
    d.x_valid[i] = 0.1f * static_cast<float>(i);  // torch.arange(0, 5, 0.1)
    d.y_valid[i] = static_cast<float>(truth(d.x_valid[i]));
  }
  return d;
}

// The mean squared error of the estimator at `queries` against `targets`.
double mse(const Data& d, const Tensor<float>& queries, const Tensor<float>& targets, attn::Kernel kernel,
           double width) {
  Tensor<float> out({1, queries.dim(1), 1});
  attn::nadaraya_watson_forward<float>(out, {}, queries, d.x_train, d.y_train, kernel, static_cast<float>(width));
  double sum = 0;
  for (index_t i = 0; i < out.numel(); ++i) sum += (out[i] - targets[i]) * (out[i] - targets[i]);
  return sum / static_cast<double>(out.numel());
}

}  // namespace

int main(int argc, char** argv) {
  index_t points = 50;
  std::uint64_t seed = 5;
  CLI::App app{"Nadaraya-Watson regression: train and validation error per kernel, auto and fixed widths"};
  app.add_option("--points", points, "training points")->check(CLI::Range(2, 100000))->capture_default_str();
  app.add_option("--seed", seed, "seed of the data (5: the data of attn demo)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  const Data d = make_data(points, seed);
  std::printf("y = 2 sin(x) + x^0.8 + normal(0, 0.5): %lld training points, 50 validation queries 0..4.9\n\n",
              static_cast<long long>(points));
  std::printf("| kernel | width | LOO | train MSE | valid MSE |\n|---|---:|---:|---:|---:|\n");
  std::vector<std::string> hows;
  for (const attn::Kernel kernel :
       {attn::Kernel::gaussian, attn::Kernel::boxcar, attn::Kernel::epanechnikov, attn::Kernel::constant}) {
    const attn::WidthSelection auto_width = attn::select_width<float>(d.x_train, d.y_train, kernel);
    hows.push_back(std::string(attn::kernel_name(kernel)) + ": " + auto_width.how);
    std::vector<std::pair<double, const char*>> rows{{auto_width.widths[0], "auto "}};
    for (const double w : {0.1, 0.2, 0.5, 1.0}) rows.emplace_back(w, "");
    for (const auto& [width, label] : rows) {
      const std::vector<double> widths{width};
      const double loo = attn::loo_cv_error<float>(d.x_train, d.y_train, kernel, widths, false).error;
      std::printf("| %s | %s%.4g | %.4f | %.4f | %.4f |\n", attn::kernel_name(kernel), label, width, loo,
                  mse(d, d.x_train, d.y_train, kernel, width), mse(d, d.x_valid, d.y_valid, kernel, width));
    }
  }
  std::printf("\nHow each auto width was found:\n");
  for (const std::string& how : hows) std::printf("  %s\n", how.c_str());
  return 0;
}
