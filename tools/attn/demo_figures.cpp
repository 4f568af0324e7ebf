// The demo's pictures (see demo_figures.hpp).
#include "demo_figures.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <system_error>
#include <utility>

#include "attn/error.hpp"
#include "attn/plot.hpp"

namespace attn_cli {
namespace {

using attn::io::Panel;
using attn::io::PlotOptions;
using attn::io::Series;

// Draws one picture as DIR/NAME.svg and DIR/NAME.png and lists both on `os`.
template <class Draw>
void write_both(std::ostream& os, const std::string& dir, const std::string& name, const Draw& draw) {
  for (const char* ext : {".svg", ".png"}) {
    const std::string path = (std::filesystem::path(dir) / (name + ext)).string();
    draw(path);
    os << "  " << path << '\n';
  }
}

// The d2l chapter's heatmap: d2l.show_heatmaps(attention.attention_weights.reshape((1, 1, 2, 10)),
// xlabel='Keys', ylabel='Queries') — the two batch elements' single queries as two rows.
void write_weights_heatmap(std::ostream& os, const std::string& dir, const std::string& name,
                           const attn::Tensor<float>& weights, const std::string& title) {
  attn::io::HeatmapOptions options;
  options.titles = {title};
  const attn::TensorView<const float> grid(weights.data(), {1, 1, weights.dim(0) * weights.dim(1), weights.dim(2)});
  write_both(os, dir, name, [&](const std::string& path) { attn::io::write_heatmaps<float>(path, grid, options); });
}

PlotOptions labelled(std::string title, std::string xlabel, std::string ylabel) {
  PlotOptions options;
  options.title = std::move(title);
  options.xlabel = std::move(xlabel);
  options.ylabel = std::move(ylabel);
  return options;
}

// The d2l chapter's kernels of the distance u = |x - x_i| at width 1, on x - x_i in [-2.5, 2.5], one plot
// each as in the d2l chapter's figure (the formulas of attn/nadaraya_watson.hpp).
void write_kernels(std::ostream& os, const std::string& dir) {
  std::vector<Panel> panels;
  for (const attn::Kernel kernel :
       {attn::Kernel::gaussian, attn::Kernel::boxcar, attn::Kernel::epanechnikov, attn::Kernel::constant}) {
    Series curve;
    for (int i = 0; i <= 500; ++i) {
      const double x = -2.5 + 0.01 * i, u = std::abs(x);
      curve.x.push_back(x);
      switch (kernel) {
        case attn::Kernel::gaussian: curve.y.push_back(std::exp(-u * u / 2)); break;
        case attn::Kernel::boxcar: curve.y.push_back(u <= 1 ? 1 : 0); break;
        case attn::Kernel::epanechnikov: curve.y.push_back(std::max(0.0, 1 - u)); break;
        case attn::Kernel::constant: curve.y.push_back(1); break;
      }
    }
    PlotOptions options = labelled(attn::kernel_name(kernel), "x - x_i", panels.empty() ? "K" : "");
    options.ymin = -0.05;
    options.ymax = 1.1;
    panels.push_back({{curve}, options});
  }
  write_both(os, dir, "kernels", [&](const std::string& path) {
    attn::io::write_plots(path, panels, 4, "Kernels of Nadaraya-Watson regression (width 1)");
  });
}

// One plot per (kernel, width): the training data, the true curve and the fit, with the d2l chapter's
// styles ('o' at alpha 0.5, 'm--', a solid line); one legend, on the first plot; one y range.
void write_regression(std::ostream& os, const std::string& dir, const RegressionFigure& data) {
  using attn::Kernel;
  const std::pair<Kernel, double> fits[] = {{Kernel::gaussian, 1},   {Kernel::boxcar, 1},   {Kernel::epanechnikov, 1},
                                            {Kernel::constant, 1},   {Kernel::gaussian, 0.1}, {Kernel::gaussian, 0.2},
                                            {Kernel::gaussian, 0.5}, {Kernel::gaussian, 1}};
  const double lo = std::min(*std::min_element(data.y_train.begin(), data.y_train.end()), 0.0);
  const double hi = *std::max_element(data.y_train.begin(), data.y_train.end());
  std::vector<Panel> panels;
  for (const auto& [kernel, width] : fits) {
    char title[64];
    std::snprintf(title, sizeof title, "%s, width %g", attn::kernel_name(kernel), width);
    const bool first_column = panels.size() % 4 == 0, bottom_row = panels.size() >= 4;
    PlotOptions options = labelled(title, bottom_row ? "x" : "", first_column ? "y" : "");
    options.ymin = lo - 0.05 * (hi - lo);
    options.ymax = hi + 0.05 * (hi - lo);
    options.legend = panels.empty();
    panels.push_back({{Series{"fit", data.x_test, data.fit(kernel, width), Series::Style::line, ""},
                       Series{"truth", data.x_test, data.y_truth, Series::Style::dashed, "#bf00bf"},
                       Series{"data", data.x_train, data.y_train, Series::Style::points, ""}},
                      options});
  }
  write_both(os, dir, "nadaraya-watson", [&](const std::string& path) {
    attn::io::write_plots(path, panels, 4, "Nadaraya-Watson regression of y = 2 sin(x) + x^0.8 + noise");
  });
}

// Three plots: both fits over the data's whole range; the same over [0, 1], where the data lie on one
// side of the boundary x = 0; and there the fits of the noiseless curve, their mean over the noise,
// where Nadaraya-Watson's bias at the boundary shows without the noise of 50 points.
void write_local_linear(std::ostream& os, const std::string& dir, const LocalLinearFigure& data) {
  char nw_label[64], ll_label[64];
  std::snprintf(nw_label, sizeof nw_label, "Nadaraya-Watson, width %.3g", data.nw_width);
  std::snprintf(ll_label, sizeof ll_label, "local linear, bandwidth %.3g", data.ll_bandwidth);
  // The points with x <= right.
  const auto up_to = [](double right, const std::vector<double>& x, const std::vector<double>& y) {
    std::pair<std::vector<double>, std::vector<double>> kept;
    for (std::size_t i = 0; i < x.size(); ++i)
      if (x[i] <= right) kept.first.push_back(x[i]), kept.second.push_back(y[i]);
    return kept;
  };
  struct View {
    const char* title;
    double right;
    bool mean;  // the fits of the noiseless curve, without the data
  };
  std::vector<Panel> panels;
  for (const View view : {View{"the fits", 5.0, false}, View{"near the boundary x = 0", 1.0, false},
                          View{"their means: the fits of the noiseless curve", 1.0, true}}) {
    const std::vector<double> grid = up_to(view.right, data.grid, data.truth).first;
    const auto only = [&](const std::vector<double>& y) { return up_to(view.right, data.grid, y).second; };
    PlotOptions options = labelled(view.title, "x", panels.empty() ? "y" : "");
    options.legend = panels.empty();
    std::vector<Series> series{
        Series{nw_label, grid, only(view.mean ? data.nw_mean : data.nw), Series::Style::line, "#1f77b4"},
        Series{ll_label, grid, only(view.mean ? data.local_linear_mean : data.local_linear), Series::Style::line,
               "#2ca02c"},
        Series{"truth", grid, only(data.truth), Series::Style::dashed, "#bf00bf"}};
    if (!view.mean) {
      const auto [x, y] = up_to(view.right, data.x_train, data.y_train);
      series.push_back(Series{"data", x, y, Series::Style::points, "#7f7f7f"});
    }
    panels.push_back({series, options});
  }
  write_both(os, dir, "local-linear", [&](const std::string& path) {
    attn::io::write_plots(path, panels, 3, "Nadaraya-Watson and local linear regression, bandwidths by cross-validation");
  });
}

}  // namespace

void write_demo_figures(std::ostream& os, const std::string& dir, const attn::Tensor<float>& additive_weights,
                        const attn::Tensor<float>& dot_product_weights, const RegressionFigure& regression,
                        const LocalLinearFigure& local_linear) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) throw attn::Error(dir + ": cannot create the directory: " + error.message());
  os << "\nPictures (SVG and PNG) in " << dir << ":\n";
  write_weights_heatmap(os, dir, "attention-additive", additive_weights, "Additive attention weights");
  write_weights_heatmap(os, dir, "attention-dot-product", dot_product_weights, "Dot-product attention weights");
  write_kernels(os, dir);
  write_regression(os, dir, regression);
  write_local_linear(os, dir, local_linear);
}

}  // namespace attn_cli
