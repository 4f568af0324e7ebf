// `attn demo --out-dir DIR`: the chapter's pictures, drawn with attn/plot.hpp, each written twice,
// as DIR/NAME.svg and DIR/NAME.png.
#pragma once

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "attn/nadaraya_watson.hpp"
#include "attn/tensor.hpp"

namespace attn_cli {

// The Nadaraya-Watson example's data and a way to fit it (demo.cpp owns the data set).
struct RegressionFigure {
  std::vector<double> x_train, y_train;  // sorted uniform(0, 5) points, noisy targets
  std::vector<double> x_test, y_truth;   // 0, 0.1, ..., 4.9 and the noiseless curve there
  std::function<std::vector<double>(attn::Kernel, double width)> fit;  // predictions at x_test
};

// Nadaraya-Watson beside local linear regression on the same data (demo.cpp computes the fits).
struct LocalLinearFigure {
  std::vector<double> x_train, y_train;               // the data of RegressionFigure
  std::vector<double> grid, truth, nw, local_linear;  // 0, 0.01, ..., 5: the curve and both fits there
  std::vector<double> nw_mean, local_linear_mean;     // both fits of the noiseless curve (their mean)
  double nw_width = 0, ll_bandwidth = 0;              // each chosen by leave-one-out cross-validation
};

// Writes the five pictures into `dir` (created if missing) and lists them on `os`:
//   attention-additive, attention-dot-product  d2l.show_heatmaps of the (2, 1, 10)
//                                              weights reshaped to (1, 1, 2, 10)
//   kernels                                    the four kernels, as the d2l chapter's figure of them
//   nadaraya-watson                            data, truth and fit for each kernel at width 1,
//                                              and for the Gaussian at widths 0.1, 0.2, 0.5, 1
//   local-linear                               data, truth, the Gaussian Nadaraya-Watson and local
//                                              linear fits over [0, 5], the same near x = 0, and
//                                              there the fits of the noiseless curve (their bias)
// attn::Error naming the path when a file or the directory cannot be written.
void write_demo_figures(std::ostream& os, const std::string& dir, const attn::Tensor<float>& additive_weights,
                        const attn::Tensor<float>& dot_product_weights, const RegressionFigure& regression,
                        const LocalLinearFigure& local_linear);

}  // namespace attn_cli
