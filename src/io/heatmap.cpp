// write_heatmaps: the grid of heatmaps of attn/plot.hpp, laid out as d2l.show_heatmaps' matplotlib
// figure: square cells, integer ticks at the cell centres, the x label under the bottom row and
// the y label left of the first column (the axes are shared), titles above, one colorbar.
#include <algorithm>
#include <array>
#include <cmath>
#include <string_view>

#include "attn/error.hpp"
#include "attn/plot.hpp"
#include "io/figure.hpp"

namespace attn::io {
namespace {

using attn::detail::fail;
using draw::Color;
using namespace figure;
using draw::text_width;

// ---- Colormaps: matplotlib's, from 9 evenly spaced colours each (ColorBrewer's 9-class
// sequential schemes, which matplotlib's Reds, Blues, ... are built from; viridis sampled at
// 0, 1/8, ..., 1), interpolated linearly in RGB as matplotlib does.
struct Colormap {
  std::string_view name;
  std::array<std::string_view, 9> stops;
};
constexpr Colormap kColormaps[] = {
    {"Reds", {"#fff5f0", "#fee0d2", "#fcbba1", "#fc9272", "#fb6a4a", "#ef3b2c", "#cb181d", "#a50f15", "#67000d"}},
    {"Blues", {"#f7fbff", "#deebf7", "#c6dbef", "#9ecae1", "#6baed6", "#4292c6", "#2171b5", "#08519c", "#08306b"}},
    {"Greens", {"#f7fcf5", "#e5f5e0", "#c7e9c0", "#a1d99b", "#74c476", "#41ab5d", "#238b45", "#006d2c", "#00441b"}},
    {"Greys", {"#ffffff", "#f0f0f0", "#d9d9d9", "#bdbdbd", "#969696", "#737373", "#525252", "#252525", "#000000"}},
    {"Oranges", {"#fff5eb", "#fee6ce", "#fdd0a2", "#fdae6b", "#fd8d3c", "#f16913", "#d94801", "#a63603", "#7f2704"}},
    {"Purples", {"#fcfbfd", "#efedf5", "#dadaeb", "#bcbddc", "#9e9ac8", "#807dba", "#6a51a3", "#54278f", "#3f007d"}},
    {"viridis", {"#440154", "#472d7b", "#3b528b", "#2c728e", "#21918c", "#28ae80", "#5ec962", "#addc30", "#fde725"}},
};
constexpr Color kNanColor{191, 191, 191, 255};

const Colormap& find_colormap(const std::string& name) {
  std::string known;
  for (const Colormap& c : kColormaps) {
    if (c.name == name) return c;
    known += (known.empty() ? "" : ", ") + std::string(c.name);
  }
  fail("write_heatmaps: unknown colormap \"", name, "\"; known: ", known);
}

// The colour of t in [0, 1] on the colormap.
Color color_at(const Colormap& map, double t) {
  const double pos = std::clamp(t, 0.0, 1.0) * 8;
  const int k = std::min(7, static_cast<int>(pos));
  const Color a = draw::parse_color(map.stops[k], "colormap"), b = draw::parse_color(map.stops[k + 1], "colormap");
  const double f = pos - k;
  const auto mix = [f](std::uint8_t u, std::uint8_t v) { return static_cast<std::uint8_t>(std::lround(u + (v - u) * f)); };
  return {mix(a.r, b.r), mix(a.g, b.g), mix(a.b, b.b), 255};
}

// The matrices as doubles in a (rows, cols, n, m) grid.
struct Grid {
  long rows = 1, cols = 1, n = 1, m = 1;
  std::vector<double> values;  // C order
  double at(long r, long c, long i, long j) const { return values[static_cast<std::size_t>(((r * cols + c) * n + i) * m + j)]; }
};

template <class T>
Grid to_grid(TensorView<const T> matrices) {
  const int rank = matrices.rank();
  if (rank < 2 || rank > 4)
    fail("write_heatmaps: matrices has shape ", matrices.shape_string(), " with ", rank,
         " dimensions; it must be (rows, cols, n, m), (cols, n, m) or (n, m)");
  for (index_t d : matrices.shape())
    if (d < 1) fail("write_heatmaps: matrices has shape ", matrices.shape_string(), ": there is nothing to draw");
  std::array<index_t, 4> dims{1, 1, 1, 1};
  std::copy(matrices.shape().begin(), matrices.shape().end(), dims.begin() + (4 - rank));
  Grid grid{dims[0], dims[1], dims[2], dims[3], {}};
  grid.values.reserve(static_cast<std::size_t>(matrices.numel()));
  // The view's strides, with 0 for the leading dimensions a lower rank lacks.
  std::array<index_t, 4> strides{};
  std::copy(matrices.strides().begin(), matrices.strides().end(), strides.begin() + (4 - rank));
  for (index_t r = 0; r < dims[0]; ++r)
    for (index_t c = 0; c < dims[1]; ++c)
      for (index_t i = 0; i < dims[2]; ++i)
        for (index_t j = 0; j < dims[3]; ++j)
          grid.values.push_back(static_cast<double>(
              matrices.data()[r * strides[0] + c * strides[1] + i * strides[2] + j * strides[3]]));
  return grid;
}

// Where everything goes, in layout units.
struct Layout {
  double cell = 0, panel_w = 0, panel_h = 0, slot_w = 0, slot_h = 0;
  double grid_x = 0, grid_y = 0;  // the top-left corner of the first panel
  double bar_x = 0, bar_y = 0, bar_h = 0;
  double width = 0, height = 0;
};
constexpr double kMargin = 8, kColumnGap = 16, kRowGap = 12, kBarGap = 20, kBarWidth = 14, kMinBarHeight = 120;

void draw_heatmaps(const std::string& path, const Grid& grid, const HeatmapOptions& options) {
  const std::size_t panels = static_cast<std::size_t>(grid.rows * grid.cols);
  if (!options.titles.empty() && options.titles.size() != static_cast<std::size_t>(grid.cols) &&
      options.titles.size() != panels)
    fail("write_heatmaps: ", options.titles.size(), " titles for a grid of ", grid.rows, " x ", grid.cols,
         " heatmaps; give none, one per column (", grid.cols, ") or one per heatmap (", panels, ")");
  const Colormap& map = find_colormap(options.colormap);

  // The colour scale: the given ends, or the finite data's range.
  double lo = INFINITY, hi = -INFINITY;
  for (double v : grid.values)
    if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  if (lo > hi) lo = 0, hi = 1;  // nothing finite
  lo = options.vmin.value_or(lo);
  hi = options.vmax.value_or(hi);
  if (!std::isfinite(lo) || !std::isfinite(hi) || lo > hi || (options.vmin && options.vmax && lo == hi))
    fail("write_heatmaps: the colour scale from vmin ", lo, " to vmax ", hi,
         " is not an interval of finite numbers with vmin < vmax");
  if (lo == hi) {  // every value alike: a scale from 0 to that value (or to 1) rather than a point
    lo = std::min(lo, 0.0);
    hi = std::max(hi, 0.0);
    if (lo == hi) hi = lo + 1;
  }
  const auto color_of = [&](double v) {
    if (std::isnan(v)) return kNanColor;
    return color_at(map, hi > lo ? (v - lo) / (hi - lo) : 0.0);
  };

  // Sizes: square cells, a panel's longer side at most 220 units (less for wide or tall grids).
  Layout L;
  const double max_w = std::clamp(1000.0 / static_cast<double>(grid.cols), 60.0, 220.0);
  const double max_h = std::clamp(800.0 / static_cast<double>(grid.rows), 60.0, 220.0);
  L.cell = std::min({max_w / static_cast<double>(grid.m), max_h / static_cast<double>(grid.n), 30.0});
  L.panel_w = L.cell * static_cast<double>(grid.m);
  L.panel_h = L.cell * static_cast<double>(grid.n);
  const Ticks x_ticks = index_ticks(grid.m, L.cell, text_width(std::to_string(grid.m - 1), kTickFont) + 6);
  const Ticks y_ticks = index_ticks(grid.n, L.cell, line_height(kTickFont));
  const double title_room = options.titles.empty() ? 0 : line_height(kTitleFont) + kGap;
  L.slot_w = std::max(L.panel_w, widest(options.titles, kTitleFont) + 6) + kColumnGap;
  L.slot_h = L.panel_h + title_room + kRowGap;
  const double grid_w = L.slot_w * static_cast<double>(grid.cols) - kColumnGap;
  const double grid_h = L.slot_h * static_cast<double>(grid.rows) - kRowGap - title_room;  // panels, not titles
  const double left = kMargin + (options.ylabel.empty() ? 0 : line_height(kLabelFont) + kGap) +
                      tick_room(Side::left, widest(y_ticks.labels, kTickFont));
  const double below = tick_room(Side::bottom) + (options.xlabel.empty() ? 0 : kGap + line_height(kLabelFont)) + kMargin;
  // The colorbar is as tall as the panels, but not shorter than kMinBarHeight; whichever is
  // shorter is centred on the other.
  L.bar_h = std::max(grid_h, kMinBarHeight);
  const Ticks bar_ticks = nice_ticks(lo, hi, 5);
  const double top = kMargin + title_room;
  L.grid_x = left + (L.slot_w - kColumnGap - L.panel_w) / 2;
  L.grid_y = top + (L.bar_h - grid_h) / 2;
  L.bar_x = left + grid_w + kBarGap;
  L.bar_y = top;
  L.width = L.bar_x + kBarWidth + tick_room(Side::right, widest(bar_ticks.labels, kTickFont)) + kMargin;
  L.height = top + L.bar_h + std::max(below - (L.bar_h - grid_h) / 2, kMargin);

  const auto canvas = draw::make_canvas(path, L.width, L.height);
  // An axis label goes beside every heatmap of the bottom row or first column, as d2l's does, or,
  // when the heatmaps are too small for it, once beside the middle of the whole grid.
  const bool per_column_xlabel = text_width(options.xlabel, kLabelFont) + 2 * kGap <= L.slot_w;
  const bool per_row_ylabel = text_width(options.ylabel, kLabelFont) + 2 * kGap <= L.panel_h + title_room + kRowGap;
  const double label_y = L.grid_y + grid_h + tick_room(Side::bottom) + kGap + draw::kAscent * kLabelFont;
  const auto x_label = [&](double centre) {
    if (!options.xlabel.empty()) canvas->text(centre, label_y, options.xlabel, kLabelFont, kInk, draw::Anchor::middle);
  };
  const auto y_label = [&](double centre) {
    if (!options.ylabel.empty())
      canvas->text(kMargin + draw::kAscent * kLabelFont, centre, options.ylabel, kLabelFont, kInk, draw::Anchor::middle,
                   /*vertical=*/true);
  };
  for (long r = 0; r < grid.rows; ++r) {
    for (long c = 0; c < grid.cols; ++c) {
      const double x = L.grid_x + L.slot_w * static_cast<double>(c), y = L.grid_y + L.slot_h * static_cast<double>(r);
      std::vector<Color> colors;
      colors.reserve(static_cast<std::size_t>(grid.n * grid.m));
      for (long i = 0; i < grid.n; ++i)
        for (long j = 0; j < grid.m; ++j) colors.push_back(color_of(grid.at(r, c, i, j)));
      canvas->cells(x, y, L.panel_w, L.panel_h, static_cast<int>(grid.n), static_cast<int>(grid.m), colors);
      frame(*canvas, x, y, L.panel_w, L.panel_h);
      // Shared axes: tick labels on the outer edges only, marks everywhere.
      for (std::size_t k = 0; k < x_ticks.values.size(); ++k)
        tick(*canvas, x + (x_ticks.values[k] + 0.5) * L.cell, y + L.panel_h, r == grid.rows - 1 ? x_ticks.labels[k] : "",
             Side::bottom);
      for (std::size_t k = 0; k < y_ticks.values.size(); ++k)
        tick(*canvas, y + (y_ticks.values[k] + 0.5) * L.cell, x, c == 0 ? y_ticks.labels[k] : "", Side::left);
      if (!options.titles.empty()) {
        const std::string& title = options.titles[options.titles.size() == panels ? static_cast<std::size_t>(r * grid.cols + c)
                                                                                 : static_cast<std::size_t>(c)];
        canvas->text(x + L.panel_w / 2, y - kGap - draw::kDescent * kTitleFont, title, kTitleFont, kInk, draw::Anchor::middle);
      }
      if (r == grid.rows - 1 && per_column_xlabel) x_label(x + L.panel_w / 2);
      if (c == 0 && per_row_ylabel) y_label(y + L.panel_h / 2);
    }
  }
  if (!per_column_xlabel) x_label(L.grid_x + (grid_w - (L.slot_w - kColumnGap)) / 2 + L.panel_w / 2);
  if (!per_row_ylabel) y_label(L.grid_y + grid_h / 2);

  // The colorbar: the colormap from hi (top) to lo (bottom), ticked at round values.
  constexpr int kBarSteps = 256;
  std::vector<Color> bar;
  for (int k = 0; k < kBarSteps; ++k) bar.push_back(color_at(map, 1.0 - (k + 0.5) / kBarSteps));
  canvas->cells(L.bar_x, L.bar_y, kBarWidth, L.bar_h, kBarSteps, 1, bar);
  frame(*canvas, L.bar_x, L.bar_y, kBarWidth, L.bar_h);
  for (std::size_t k = 0; k < bar_ticks.values.size(); ++k) {
    const double t = hi > lo ? (bar_ticks.values[k] - lo) / (hi - lo) : 0.5;
    tick(*canvas, L.bar_y + L.bar_h * (1 - t), L.bar_x + kBarWidth, bar_ticks.labels[k], Side::right);
  }
  canvas->save(path);
}

}  // namespace

template <class T>
void write_heatmaps(const std::string& path, TensorView<const T> matrices, const HeatmapOptions& options) {
  draw_heatmaps(path, to_grid(matrices), options);
}

template void write_heatmaps<float>(const std::string&, TensorView<const float>, const HeatmapOptions&);
template void write_heatmaps<double>(const std::string&, TensorView<const double>, const HeatmapOptions&);

}  // namespace attn::io
