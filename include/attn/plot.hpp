// Pictures of attention: grids of heatmaps (d2l.show_heatmaps) and line plots (the
// Nadaraya-Watson figures), written as SVG or PNG.
//
// The format follows the path's extension: ".svg" (text, scalable) or ".png" (an RGBA raster
// encoded by libpng; its text is drawn with FreeType in DejaVu Sans, found in
// /usr/share/fonts/truetype/dejavu/ — Debian's fonts-dejavu-core — or at the path in the
// environment variable ATTN_FONT). Any other extension, a file that cannot be written, a missing
// font for a PNG or a bad argument raises attn::Error naming the path or the argument.
// Both formats share one layout, sized so that no label is clipped.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "attn/tensor.hpp"

namespace attn::io {

// ---- Heatmaps ---------------------------------------------------------------------------------

struct HeatmapOptions {
  std::string xlabel = "Keys";     // under the bottom row of heatmaps
  std::string ylabel = "Queries";  // left of the first column
  // Empty, one title per column (as d2l.show_heatmaps' titles[j]) or one per heatmap in row-major
  // order.
  std::vector<std::string> titles;
  // A sequential colormap from matplotlib: "Reds" (the d2l chapter's), "Blues", "Greens", "Greys",
  // "Oranges", "Purples" or "viridis". Low values are light (dark for viridis).
  std::string colormap = "Reds";
  // The values at the two ends of the colour scale, shared by every heatmap and shown by the
  // colorbar. Default: the smallest and largest finite value of all the matrices.
  std::optional<double> vmin, vmax;
};

// A grid of heatmaps, one per matrix, with axis labels, titles and one colorbar, as
// d2l.show_heatmaps(matrices, xlabel, ylabel, titles, cmap=colormap) draws with matplotlib.
//   matrices (rows, cols, n, m): heatmap (r, c) shows an n x m matrix, row i (a query) from the top,
//            column j (a key) from the left, one square cell per element.
//            (cols, n, m) is one row of heatmaps and (n, m) a single one.
// NaN cells are drawn grey. attn::Error for an empty matrix, a titles list of the wrong length, an
// unknown colormap, vmin > vmax, or a grid too large to draw.
template <class T>  // float or double
void write_heatmaps(const std::string& path, TensorView<const T> matrices, const HeatmapOptions& options = {});

// ---- Line plots -------------------------------------------------------------------------------

// One data series of a plot: y[i] against x[i].
struct Series {
  enum class Style {
    line,    // a solid line through the points in the given order
    dashed,  // a dashed line (the d2l chapter's truth curves, 'm--')
    points,  // a half-transparent dot per point (training data, 'o' with alpha 0.5)
  };
  std::string label;  // its legend entry; empty: not in the legend
  std::vector<double> x, y;
  Style style = Style::line;
  std::string color;  // "#rrggbb"; empty: the next colour of matplotlib's default cycle (tab10)
};

struct PlotOptions {
  std::string title, xlabel, ylabel;
  // Axis limits; each one not given comes from the data, with a 5% margin (as matplotlib's).
  std::optional<double> xmin, xmax, ymin, ymax;
  bool legend = true;  // drawn when some series has a label, in the corner that hides least data
};

// One plot of a grid.
struct Panel {
  std::vector<Series> series;
  PlotOptions options;
};

// One plot. attn::Error when a series' x and y differ in length, a colour is not "#rrggbb", or
// a limit is not finite or not below its partner. Non-finite points are skipped (a line breaks there).
void write_plot(const std::string& path, const std::vector<Series>& series, const PlotOptions& options = {});

// A grid of plots, `columns` per row, filled row by row, with `title` above them all (if not empty).
// attn::Error as for write_plot, for no panels, or for columns < 1.
void write_plots(const std::string& path, const std::vector<Panel>& panels, int columns, const std::string& title = {});

}  // namespace attn::io
