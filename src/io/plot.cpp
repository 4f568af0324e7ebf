// write_plot and write_plots: line and scatter plots of attn/plot.hpp in the manner of matplotlib's
// defaults: a framed area, ticks at round numbers, the tab10 colour cycle, a legend in the corner
// that hides the least data. In a grid every plot area has the same size and they line up.
#include <algorithm>
#include <cfloat>
#include <cmath>

#include "attn/error.hpp"
#include "attn/plot.hpp"
#include "io/figure.hpp"

namespace attn::io {
namespace {

using attn::detail::fail;
using draw::Color;
using draw::Point;
using namespace figure;
using draw::text_width;

// matplotlib's default colour cycle, tab10.
constexpr const char* kCycle[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                  "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
constexpr double kLineWidth = 1.5, kDotRadius = 3, kMargin = 8, kColumnGap = 22, kRowGap = 14;
constexpr double kSuptitleFont = 14;

// One axis' limits and ticks.
struct Axis {
  double lo = 0, hi = 1;
  Ticks ticks;
  double map(double v, double start, double length) const { return start + fraction(v, lo, hi) * length; }
};

// The limits from the finite data with a 5% margin on each side, unless given; then round ticks.
Axis make_axis(const std::vector<const std::vector<double>*>& data, std::optional<double> lo_given,
               std::optional<double> hi_given, int target) {
  double lo = INFINITY, hi = -INFINITY;
  for (const auto* values : data)
    for (double v : *values)
      if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  if (lo > hi) lo = 0, hi = 1;  // no data
  if (lo == hi) {  // one value: a range around it (large enough to differ from it in a double)
    const double pad = std::max(0.5, 0.05 * std::abs(lo));
    lo -= pad, hi += pad;
  }
  const double margin = 0.1 * (0.5 * hi - 0.5 * lo);  // 5% of hi - lo, which may overflow
  Axis axis;
  axis.lo = lo_given.value_or(std::max(lo - margin, -DBL_MAX));
  axis.hi = hi_given.value_or(std::min(hi + margin, DBL_MAX));
  if (axis.lo >= axis.hi) axis.hi = axis.lo + std::max(1.0, std::abs(axis.lo));  // one limit given past the data
  axis.ticks = nice_ticks(axis.lo, axis.hi, target);
  return axis;
}

void check_panel(const Panel& panel, const char* who, std::size_t index) {
  const PlotOptions& o = panel.options;
  for (const auto* limit : {&o.xmin, &o.xmax, &o.ymin, &o.ymax})
    if (*limit && !std::isfinite(**limit)) fail(who, ": plot ", index, " has an axis limit that is not finite: ", **limit);
  if ((o.xmin && o.xmax && *o.xmin >= *o.xmax) || (o.ymin && o.ymax && *o.ymin >= *o.ymax))
    fail(who, ": plot ", index, " has a lower axis limit that is not below the upper one");
  for (std::size_t k = 0; k < panel.series.size(); ++k) {
    const Series& s = panel.series[k];
    if (s.x.size() != s.y.size())
      fail(who, ": plot ", index, ", series ", k, " (\"", s.label, "\") has ", s.x.size(), " x values but ", s.y.size(),
           " y values");
    if (!s.color.empty()) draw::parse_color(s.color, who);
  }
}

// The sizes every plot of the grid shares: the margins are the largest any plot needs.
struct Layout {
  double area_w = 0, area_h = 0;      // the framed plot area
  double left = 0, below = 0, above = 0;  // room around it for ticks, labels and the title
  double top = 0;                     // the figure title's room
  double slot_w() const { return left + area_w + kColumnGap; }
  double slot_h() const { return above + area_h + below + kRowGap; }
};

// A legend's box in the plot area: the corner (upper right, upper left, lower left, lower right,
// matplotlib's order of preference) where the fewest data points fall inside it.
struct Legend {
  std::vector<const Series*> entries;
  std::vector<Color> colors;
  double w = 0, h = 0;
};
constexpr double kLegendPad = 6, kSampleLength = 22;

Point legend_corner(const Legend& legend, const std::vector<std::vector<Point>>& points, double ax, double ay,
                    const Layout& L) {
  const Point corners[] = {{ax + L.area_w - legend.w - kLegendPad, ay + kLegendPad},
                           {ax + kLegendPad, ay + kLegendPad},
                           {ax + kLegendPad, ay + L.area_h - legend.h - kLegendPad},
                           {ax + L.area_w - legend.w - kLegendPad, ay + L.area_h - legend.h - kLegendPad}};
  Point best = corners[0];
  long fewest = -1;
  for (const Point& c : corners) {
    long inside = 0;
    for (const auto& series : points)
      for (const Point& p : series)
        inside += p.x >= c.x && p.x <= c.x + legend.w && p.y >= c.y && p.y <= c.y + legend.h;
    if (fewest < 0 || inside < fewest) fewest = inside, best = c;
  }
  return best;
}

// A translucent white box with a sample of each series' style and colour beside its label.
void draw_legend(draw::Canvas& canvas, const Legend& legend, Point at) {
  canvas.rect(at.x, at.y, legend.w, legend.h, Color{255, 255, 255, 217});
  const Point box[] = {{at.x, at.y}, {at.x + legend.w, at.y}, {at.x + legend.w, at.y + legend.h}, {at.x, at.y + legend.h}, {at.x, at.y}};
  canvas.polyline(box, Color{204, 204, 204, 255}, kFrameWidth);
  const double row = line_height(kTickFont) * 1.15;
  for (std::size_t k = 0; k < legend.entries.size(); ++k) {
    const Series& s = *legend.entries[k];
    const double mid = at.y + kLegendPad + row * (static_cast<double>(k) + 0.5);
    const double x = at.x + kLegendPad;
    if (s.style == Series::Style::points) {
      canvas.dot(x + kSampleLength / 2, mid, kDotRadius, legend.colors[k]);  // translucent, as in the plot
    } else {
      const Point sample[] = {{x, mid}, {x + kSampleLength, mid}};
      canvas.polyline(sample, legend.colors[k], kLineWidth, s.style == Series::Style::dashed);
    }
    canvas.text(x + kSampleLength + kGap, mid + draw::kCapHeight * kTickFont / 2, s.label, kTickFont, kInk,
                draw::Anchor::start);
  }
}

// One plot with its area's top-left corner at (ax, ay).
void draw_panel(draw::Canvas& canvas, const Panel& panel, const Axis& xs, const Axis& ys, double ax, double ay,
                const Layout& L) {
  const PlotOptions& o = panel.options;
  // The data in layout units, each series cut into runs of finite points.
  std::vector<std::vector<Point>> points(panel.series.size());
  std::vector<Color> colors;
  std::size_t cycle = 0;
  for (std::size_t k = 0; k < panel.series.size(); ++k) {
    const Series& s = panel.series[k];
    colors.push_back(draw::parse_color(s.color.empty() ? kCycle[cycle++ % std::size(kCycle)] : s.color, "plot"));
    if (s.style == Series::Style::points) colors.back().a = 128;  // matplotlib's alpha=0.5 of the d2l chapter's data
    for (std::size_t i = 0; i < s.x.size(); ++i)
      points[k].push_back({xs.map(s.x[i], ax, L.area_w), ys.map(s.y[i], ay + L.area_h, -L.area_h)});
  }
  // Data outside given limits is cut at the frame, as matplotlib does.
  canvas.push_clip(ax, ay, L.area_w, L.area_h);
  for (std::size_t k = 0; k < panel.series.size(); ++k) {
    const Series& s = panel.series[k];
    if (s.style == Series::Style::points) {
      for (std::size_t i = 0; i < s.x.size(); ++i)
        if (std::isfinite(s.x[i]) && std::isfinite(s.y[i]))
          canvas.dot(points[k][i].x, points[k][i].y, kDotRadius, colors[k]);
      continue;
    }
    std::vector<Point> run;
    for (std::size_t i = 0; i <= s.x.size(); ++i) {
      if (i < s.x.size() && std::isfinite(s.x[i]) && std::isfinite(s.y[i])) {
        run.push_back(points[k][i]);
      } else {
        if (!run.empty()) canvas.polyline(run, colors[k], kLineWidth, s.style == Series::Style::dashed);
        run.clear();
      }
    }
  }
  canvas.pop_clip();
  frame(canvas, ax, ay, L.area_w, L.area_h);
  for (std::size_t k = 0; k < xs.ticks.values.size(); ++k)
    tick(canvas, xs.map(xs.ticks.values[k], ax, L.area_w), ay + L.area_h, xs.ticks.labels[k], Side::bottom);
  for (std::size_t k = 0; k < ys.ticks.values.size(); ++k)
    tick(canvas, ys.map(ys.ticks.values[k], ay + L.area_h, -L.area_h), ax, ys.ticks.labels[k], Side::left);
  if (!o.title.empty())
    canvas.text(ax + L.area_w / 2, ay - kGap - draw::kDescent * kTitleFont, o.title, kTitleFont, kInk, draw::Anchor::middle);
  if (!o.xlabel.empty())
    canvas.text(ax + L.area_w / 2, ay + L.area_h + tick_room(Side::bottom) + kGap + draw::kAscent * kLabelFont, o.xlabel,
                kLabelFont, kInk, draw::Anchor::middle);
  if (!o.ylabel.empty())
    canvas.text(ax - L.left + draw::kAscent * kLabelFont, ay + L.area_h / 2, o.ylabel, kLabelFont, kInk,
                draw::Anchor::middle, /*vertical=*/true);

  Legend legend;
  for (std::size_t k = 0; k < panel.series.size() && o.legend; ++k)
    if (!panel.series[k].label.empty()) {
      legend.entries.push_back(&panel.series[k]);
      legend.colors.push_back(colors[k]);
      legend.w = std::max(legend.w, text_width(panel.series[k].label, kTickFont));
    }
  if (legend.entries.empty()) return;
  legend.w += 2 * kLegendPad + kSampleLength + kGap;
  legend.h = 2 * kLegendPad + line_height(kTickFont) * 1.15 * static_cast<double>(legend.entries.size());
  draw_legend(canvas, legend, legend_corner(legend, points, ax, ay, L));
}

void draw_plots(const char* who, const std::string& path, const std::vector<Panel>& panels, int columns,
                const std::string& title) {
  if (panels.empty()) fail(who, ": there are no plots to draw");
  if (columns < 1) fail(who, ": columns is ", columns, "; it must be at least 1");
  for (std::size_t i = 0; i < panels.size(); ++i) check_panel(panels[i], who, i);
  const long cols = std::min<long>(columns, static_cast<long>(panels.size()));
  const long rows = (static_cast<long>(panels.size()) + cols - 1) / cols;

  // Every plot area has one size (wide grids get narrower plots) and the margins are the largest
  // any plot needs, so that the areas line up in rows and columns.
  Layout L;
  L.area_w = std::clamp(1000.0 / static_cast<double>(cols), 170.0, 320.0);
  L.area_h = L.area_w * 0.7;
  std::vector<Axis> xs, ys;
  for (const Panel& p : panels) {
    std::vector<const std::vector<double>*> x_data, y_data;
    for (const Series& s : p.series) x_data.push_back(&s.x), y_data.push_back(&s.y);
    xs.push_back(make_axis(x_data, p.options.xmin, p.options.xmax, std::max(3, static_cast<int>(L.area_w / 60))));
    ys.push_back(make_axis(y_data, p.options.ymin, p.options.ymax, std::max(3, static_cast<int>(L.area_h / 45))));
    const PlotOptions& o = p.options;
    L.left = std::max(L.left, (o.ylabel.empty() ? 0 : line_height(kLabelFont) + kGap) +
                                  tick_room(Side::left, widest(ys.back().ticks.labels, kTickFont)));
    L.below = std::max(L.below, tick_room(Side::bottom) + (o.xlabel.empty() ? 0 : kGap + line_height(kLabelFont)));
    L.above = std::max(L.above, o.title.empty() ? 0 : line_height(kTitleFont) + kGap);
  }
  L.top = title.empty() ? 0 : line_height(kSuptitleFont) + kGap;
  // The last x tick label may overhang the area's right edge by half its width.
  double overhang = 0;
  for (const Axis& x : xs) overhang = std::max(overhang, text_width(x.ticks.labels.back(), kTickFont) / 2);
  const double width = std::max(kMargin + L.slot_w() * static_cast<double>(cols) - kColumnGap + std::max(overhang, kMargin),
                                text_width(title, kSuptitleFont) + 2 * kMargin);
  const double height = kMargin + L.top + L.slot_h() * static_cast<double>(rows) - kRowGap + kMargin;

  const auto canvas = draw::make_canvas(path, width, height);
  if (!title.empty())
    canvas->text(width / 2, kMargin + draw::kAscent * kSuptitleFont, title, kSuptitleFont, kInk, draw::Anchor::middle);
  for (std::size_t i = 0; i < panels.size(); ++i) {
    const double ax = kMargin + L.slot_w() * static_cast<double>(static_cast<long>(i) % cols) + L.left;
    const double ay = kMargin + L.top + L.slot_h() * static_cast<double>(static_cast<long>(i) / cols) + L.above;
    draw_panel(*canvas, panels[i], xs[i], ys[i], ax, ay, L);
  }
  canvas->save(path);
}

}  // namespace

void write_plot(const std::string& path, const std::vector<Series>& series, const PlotOptions& options) {
  draw_plots("write_plot", path, {Panel{series, options}}, 1, "");
}

void write_plots(const std::string& path, const std::vector<Panel>& panels, int columns, const std::string& title) {
  draw_plots("write_plots", path, panels, columns, title);
}

}  // namespace attn::io
