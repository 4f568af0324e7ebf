// The demo's pictures (see demo_figures.hpp).
#include "demo_figures.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <system_error>

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

}  // namespace

void write_demo_figures(std::ostream& os, const std::string& dir, const attn::Tensor<float>& additive_weights,
                        const attn::Tensor<float>& dot_product_weights, const RegressionFigure& regression) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) throw attn::Error(dir + ": cannot create the directory: " + error.message());
  os << "\nPictures (SVG and PNG) in " << dir << ":\n";
  write_weights_heatmap(os, dir, "attention-additive", additive_weights, "Additive attention weights");
  write_weights_heatmap(os, dir, "attention-dot-product", dot_product_weights, "Dot-product attention weights");
  write_kernels(os, dir);
  write_regression(os, dir, regression);
}

}  // namespace attn_cli
