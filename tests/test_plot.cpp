// Pictures (attn/plot.hpp): the SVG and PNG back ends draw the same layout, colours mean what the
// colormap says, labels and titles are present, every bad argument is refused with its message.
// The PNG files are read back with libpng to look at their pixels.
#include <array>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "attn/plot.hpp"
#include "io/figure.hpp"
#include "io/png.hpp"
#include "support/testing.hpp"

namespace attn {
namespace {

using io::RgbaImage;
using testing::expect_error;
using testing::temp_path;


std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// How many pixels of the image have exactly the colour "#rrggbb".
long count_color(const RgbaImage& image, const std::string& hex) {
  const auto byte = [&](int k) { return static_cast<std::uint8_t>(std::stoi(hex.substr(1 + 2 * k, 2), nullptr, 16)); };
  long n = 0;
  for (int y = 0; y < image.height; ++y)
    for (int x = 0; x < image.width; ++x) {
      const std::uint8_t* p = image.at(x, y);
      n += p[0] == byte(0) && p[1] == byte(1) && p[2] == byte(2);
    }
  return n;
}

// The width and height attributes of an SVG file.
std::pair<double, double> svg_size(const std::string& svg) {
  std::smatch m;
  EXPECT_TRUE(std::regex_search(svg, m, std::regex("<svg [^>]*width=\"([0-9.]+)\" height=\"([0-9.]+)\"")));
  return {std::stod(m[1]), std::stod(m[2])};
}

long count_substr(const std::string& text, const std::string& what) {
  long n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The d2l chapter's dot-product weights: valid lengths 2 and 6 over 10 equal keys, as (1, 1, 2, 10).
Tensor<float> d2l_weights() {
  Tensor<float> w({1, 1, 2, 10});
  for (int j = 0; j < 2; ++j) w(0, 0, 0, j) = 0.5f;
  for (int j = 0; j < 6; ++j) w(0, 0, 1, j) = 1.0f / 6;
  return w;
}

// ---- Heatmaps ---------------------------------------------------------------------------------

TEST(Heatmaps, SvgHasTheLabelsTheColormapEndsAndOneRectPerRunOfEqualCells) {
  const std::string path = temp_path("d2l.svg");
  io::write_heatmaps<float>(path, d2l_weights().cview());
  const std::string svg = read_text(path);
  EXPECT_NE(svg.find(">Keys</text>"), std::string::npos);
  EXPECT_NE(svg.find(">Queries</text>"), std::string::npos);
  EXPECT_NE(svg.find("rotate(-90"), std::string::npos) << "the y label reads upwards";
  // Reds: 0.5, the largest weight, is the darkest colour, 0 (masked) the lightest.
  EXPECT_NE(svg.find("fill=\"#67000d\""), std::string::npos);
  EXPECT_NE(svg.find("fill=\"#fff5f0\""), std::string::npos);
  // The colorbar's ticks: 0.0 to 0.5 in steps of 0.1.
  for (const char* label : {">0.0<", ">0.1<", ">0.5<"}) EXPECT_NE(svg.find(label), std::string::npos) << label;
  EXPECT_EQ(svg.find(">-0.0<"), std::string::npos);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
}

TEST(Heatmaps, PngIsTheSvgLayoutAtTwiceTheSizeWithTheRightColours) {
  io::write_heatmaps<float>(temp_path("d2l.svg"), d2l_weights().cview());
  io::write_heatmaps<float>(temp_path("d2l.png"), d2l_weights().cview());
  const auto [w, h] = svg_size(read_text(temp_path("d2l.svg")));
  const RgbaImage image = io::read_png(temp_path("d2l.png"));
  EXPECT_EQ(image.width, static_cast<int>(std::ceil(2 * w)));
  EXPECT_EQ(image.height, static_cast<int>(std::ceil(2 * h)));
  // Two cells of 0.5 are the darkest red, a third of the 20 cells weigh 1/6, 12 are masked (0):
  // each colour covers at least its cells' area (a cell is well over 20 x 20 pixels).
  const long darkest = count_color(image, "#67000d"), lightest = count_color(image, "#fff5f0");
  EXPECT_GT(darkest, 2 * 20 * 20);
  EXPECT_GT(lightest, 12 * 20 * 20);
  EXPECT_GT(lightest, 4 * darkest) << "12 masked cells against 2 (and the colorbar's ends)";
}

TEST(Heatmaps, ThreeDimensionsAreOneRowAndStridesAreFollowed) {
  // (cols, n, m) draws what (1, cols, n, m) draws.
  Tensor<double> m = testing::random_tensor<double>({2, 3, 4}, 7, 0.0, 1.0);
  io::write_heatmaps<double>(temp_path("row3.svg"), m.cview());
  io::write_heatmaps<double>(temp_path("row4.svg"), TensorView<const double>(m.data(), {1, 2, 3, 4}));
  EXPECT_EQ(read_text(temp_path("row3.svg")), read_text(temp_path("row4.svg")));
  // A transposed view (4, 3) of each matrix draws what a contiguous copy of the transpose draws.
  Tensor<double> t({2, 4, 3});
  for (index_t c = 0; c < 2; ++c)
    for (index_t i = 0; i < 4; ++i)
      for (index_t j = 0; j < 3; ++j) t(c, i, j) = m(c, j, i);
  io::write_heatmaps<double>(temp_path("copy.svg"), t.cview());
  io::write_heatmaps<double>(temp_path("view.svg"), TensorView<const double>(m.data(), {2, 4, 3}, {12, 1, 4}));
  EXPECT_EQ(read_text(temp_path("copy.svg")), read_text(temp_path("view.svg")));
}

TEST(Heatmaps, TitlesPerColumnOrPerHeatmapAndNanCellsAreGrey) {
  Tensor<float> m({2, 2, 3, 3});
  m[0] = std::nanf("");
  m[1] = 1;
  io::HeatmapOptions options;
  options.titles = {"head 0", "head 1"};
  io::write_heatmaps<float>(temp_path("titles.svg"), m.cview(), options);
  std::string svg = read_text(temp_path("titles.svg"));
  EXPECT_EQ(count_substr(svg, ">head 0</text>"), 2) << "one title per column, repeated on each row";
  EXPECT_EQ(count_substr(svg, ">Keys</text>"), 2) << "the x label under each heatmap of the bottom row";
  EXPECT_EQ(count_substr(svg, ">Queries</text>"), 2) << "the y label left of each heatmap of the first column";
  EXPECT_NE(svg.find("fill=\"#bfbfbf\""), std::string::npos) << "NaN is grey";
  options.titles = {"a", "b", "c", "d"};
  io::write_heatmaps<float>(temp_path("titles.svg"), m.cview(), options);
  svg = read_text(temp_path("titles.svg"));
  for (const char* t : {">a<", ">b<", ">c<", ">d<"}) EXPECT_EQ(count_substr(svg, t), 1) << t;
}

// The fills of the rectangles in the k-th group of cells of an SVG, in drawing order (row by row,
// one rectangle per run of equal cells): group 0 is the first heatmap, the last group the colorbar.
std::vector<std::string> cell_fills(const std::string& svg, int k) {
  const std::string open = "<g shape-rendering=\"crispEdges\">";
  std::size_t at = svg.find(open);
  for (int i = 0; i < k && at != std::string::npos; ++i) at = svg.find(open, at + 1);
  std::vector<std::string> fills;
  if (at == std::string::npos) {
    ADD_FAILURE() << "the SVG has no group of cells " << k;
    return fills;
  }
  const std::string group = svg.substr(at, svg.find("</g>", at) - at);
  const std::regex fill("<rect [^>]*fill=\"(#[0-9a-f]{6})\"");
  for (auto it = std::sregex_iterator(group.begin(), group.end(), fill); it != std::sregex_iterator(); ++it)
    fills.push_back((*it)[1]);
  return fills;
}

// The red, green and blue bytes of "#rrggbb", and its luma (Rec. 709 weights): lightness.
std::array<int, 3> rgb(const std::string& hex) {
  return {std::stoi(hex.substr(1, 2), nullptr, 16), std::stoi(hex.substr(3, 2), nullptr, 16),
          std::stoi(hex.substr(5, 2), nullptr, 16)};
}
double luma(const std::string& hex) {
  const auto c = rgb(hex);
  return 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2];
}

// Every colormap is matplotlib's: the ColorBrewer colours its Reds, Blues, ... are built from at
// 0 and 1 (and at every eighth for Reds, the d2l chapter's), viridis' first and last colours; between
// stops, linear interpolation in RGB. Lightness falls from the low end to the high one (rises for
// viridis), and the colorbar runs from the high end (top) to the low end (bottom).
// Values k / 16 for k = 0 .. 16 on the scale [0, 1]: even k on a stop, odd k halfway between two.
TEST(Heatmaps, ColourScaleFromOptionsAndEveryColormap) {
  struct Map {
    const char* name;
    std::vector<std::string> stops;  // all 9 stops (0, 1/8, ..., 1), or the two ends
    bool dark_to_light = false;
  };
  const Map maps[] = {
      {"Reds", {"#fff5f0", "#fee0d2", "#fcbba1", "#fc9272", "#fb6a4a", "#ef3b2c", "#cb181d", "#a50f15", "#67000d"}},
      {"Blues", {"#f7fbff", "#08306b"}},
      {"Greens", {"#f7fcf5", "#00441b"}},
      {"Greys", {"#ffffff", "#000000"}},
      {"Oranges", {"#fff5eb", "#7f2704"}},
      {"Purples", {"#fcfbfd", "#3f007d"}},
      {"viridis", {"#440154", "#fde725"}, true},
  };
  Tensor<float> ramp({1, 17});
  for (index_t k = 0; k < 17; ++k) ramp[k] = static_cast<float>(k) / 16;
  io::HeatmapOptions options;
  options.vmin = 0;
  options.vmax = 1;
  for (const Map& map : maps) {
    SCOPED_TRACE(map.name);
    options.colormap = map.name;
    io::write_heatmaps<float>(temp_path("cmap.svg"), ramp.cview(), options);
    const std::string svg = read_text(temp_path("cmap.svg"));
    const std::vector<std::string> cells = cell_fills(svg, 0);
    ASSERT_EQ(cells.size(), 17u) << "17 distinct colours";
    EXPECT_EQ(cells.front(), map.stops.front());
    EXPECT_EQ(cells.back(), map.stops.back());
    if (map.stops.size() == 9) {
      for (std::size_t k = 0; k < 17; ++k) {
        if (k % 2 == 0) {
          EXPECT_EQ(cells[k], map.stops[k / 2]) << "stop " << k / 2;
        } else {  // each byte the mean of its neighbours' (to a rounding)
          const auto mid = rgb(cells[k]), a = rgb(map.stops[k / 2]), b = rgb(map.stops[k / 2 + 1]);
          for (int c = 0; c < 3; ++c) EXPECT_LE(std::abs(2 * mid[c] - a[c] - b[c]), 1) << k << "/16: " << cells[k];
        }
      }
    }
    for (std::size_t k = 1; k < 17; ++k) {
      const double step = luma(cells[k]) - luma(cells[k - 1]);
      EXPECT_TRUE(map.dark_to_light ? step > 0 : step < 0) << k << "/16: " << cells[k - 1] << " then " << cells[k];
    }
    const std::vector<std::string> bar = cell_fills(svg, 1);
    ASSERT_GE(bar.size(), 2u);
    for (int c = 0; c < 3; ++c) {
      EXPECT_LE(std::abs(rgb(bar.front())[c] - rgb(map.stops.back())[c]), 2) << "top " << bar.front();
      EXPECT_LE(std::abs(rgb(bar.back())[c] - rgb(map.stops.front())[c]), 2) << "bottom " << bar.back();
    }
  }
  // The scale from the options: 0.25 and 0.75 on [0, 1] are stops 2 and 6, neither end, and the
  // colorbar shows 0 and 1; the data's own range would put them at the ends.
  const Tensor<float> m({1, 2}, {0.25f, 0.75f});
  options.colormap = "Greys";
  io::write_heatmaps<float>(temp_path("cmap.svg"), m.cview(), options);
  const std::string svg = read_text(temp_path("cmap.svg"));
  EXPECT_EQ(cell_fills(svg, 0), (std::vector<std::string>{"#d9d9d9", "#525252"}));
  EXPECT_NE(svg.find(">0.0<"), std::string::npos);
  EXPECT_NE(svg.find(">1.0<"), std::string::npos);
  options.vmin.reset(), options.vmax.reset();
  io::write_heatmaps<float>(temp_path("cmap.svg"), m.cview(), options);
  EXPECT_EQ(cell_fills(read_text(temp_path("cmap.svg")), 0), (std::vector<std::string>{"#ffffff", "#000000"}));
  // Constant data: the scale runs from 0 to the value (its top end, the darkest red, on every
  // cell, and 0 on the colorbar), not over an empty interval.
  Tensor<float> flat({2, 2}, {0.5f, 0.5f, 0.5f, 0.5f});
  io::write_heatmaps<float>(temp_path("flat.svg"), flat.cview());
  const std::string flat_svg = read_text(temp_path("flat.svg"));
  EXPECT_EQ(cell_fills(flat_svg, 0), (std::vector<std::string>{"#67000d", "#67000d"}));  // a run per row
  EXPECT_NE(flat_svg.find(">0.0<"), std::string::npos);
  EXPECT_NE(flat_svg.find(">0.5<"), std::string::npos);
}

TEST(Heatmaps, BadArgumentsAreRefusedWithMessages) {
  const Tensor<float> w = d2l_weights();
  expect_error([&] { io::write_heatmaps<float>(temp_path("w.jpg"), w.cview()); }, {"w.jpg", "use .svg or .png"});
  expect_error([&] { io::write_heatmaps<float>(temp_path("w"), w.cview()); }, {"cannot tell the picture format"});
  expect_error([&] { io::write_heatmaps<float>("/nonexistent-dir/w.svg", w.cview()); },
               {"/nonexistent-dir/w.svg", "cannot open for writing"});
  expect_error([&] { io::write_heatmaps<float>("/nonexistent-dir/w.png", w.cview()); },
               {"/nonexistent-dir/w.png", "cannot write the PNG"});
  Tensor<float> v({5});
  expect_error([&] { io::write_heatmaps<float>(temp_path("w.svg"), v.cview()); }, {"shape (5,)", "(rows, cols, n, m)"});
  Tensor<float> empty({2, 0, 3});
  expect_error([&] { io::write_heatmaps<float>(temp_path("w.svg"), empty.cview()); }, {"(2,0,3)", "nothing to draw"});
  io::HeatmapOptions options;
  options.titles = {"a", "b", "c"};
  expect_error([&] { io::write_heatmaps<float>(temp_path("w.svg"), w.cview(), options); }, {"3 titles", "1 x 1"});
  options = {};
  options.colormap = "jet";
  expect_error([&] { io::write_heatmaps<float>(temp_path("w.svg"), w.cview(), options); },
               {"unknown colormap \"jet\"", "Reds", "viridis"});
  options = {};
  options.vmin = 1;
  options.vmax = 0;
  expect_error([&] { io::write_heatmaps<float>(temp_path("w.svg"), w.cview(), options); }, {"vmin 1", "vmax 0"});
  Tensor<float> huge({100, 100, 2, 2});
  expect_error([&] { io::write_heatmaps<float>(temp_path("w.svg"), huge.cview()); }, {"too large to draw"});
}

// ---- Plots ------------------------------------------------------------------------------------

std::vector<io::Series> regression_series() {
  io::Series fit{"fit", {}, {}, io::Series::Style::line, ""};
  io::Series truth{"truth", {}, {}, io::Series::Style::dashed, "#ff00ff"};
  io::Series data{"data", {}, {}, io::Series::Style::points, ""};
  for (int i = 0; i < 50; ++i) {
    const double x = 0.1 * i;
    truth.x.push_back(x), truth.y.push_back(2 * std::sin(x) + std::pow(x, 0.8));
    fit.x.push_back(x), fit.y.push_back(truth.y.back() + 0.2 * std::sin(7 * x));
    data.x.push_back(x), data.y.push_back(truth.y.back() + 0.5 * std::cos(13 * x));
  }
  return {fit, truth, data};
}

// Plot options with a title and axis labels (moved in: assigning a literal to a member string
// trips g++ 12's false -Wrestrict warning).
io::PlotOptions labelled(std::string title, std::string xlabel = "", std::string ylabel = "") {
  io::PlotOptions options;
  options.title = std::move(title);
  options.xlabel = std::move(xlabel);
  options.ylabel = std::move(ylabel);
  return options;
}

io::PlotOptions nw_options() { return labelled("Nadaraya-Watson", "x", "y"); }

TEST(Plots, SvgHasEverySeriesInItsStyleLabelsAndLegend) {
  io::write_plot(temp_path("nw.svg"), regression_series(), nw_options());
  const std::string svg = read_text(temp_path("nw.svg"));
  for (const char* text : {">Nadaraya-Watson<", ">x<", ">y<", ">fit<", ">truth<", ">data<"})
    EXPECT_EQ(count_substr(svg, text), 1) << text;
  // The fit in tab10's first colour, the truth dashed in its own colour, 50 translucent dots
  // in tab10's second colour (the colour cycle skips series with a colour), plus the legend's.
  EXPECT_NE(svg.find("stroke=\"#1f77b4\""), std::string::npos);
  EXPECT_NE(svg.find("stroke=\"#ff00ff\" stroke-width=\"1.5\" stroke-linejoin=\"round\" stroke-dasharray"), std::string::npos);
  EXPECT_EQ(count_substr(svg, "fill=\"#ff7f0e\" fill-opacity=\"0.5\""), 51);
  EXPECT_EQ(count_substr(svg, "<clipPath"), 1) << "the data is clipped to the plot area";
}

TEST(Plots, PngMatchesTheSvgSizeAndShowsTheLines) {
  io::write_plot(temp_path("nw.svg"), regression_series(), nw_options());
  io::write_plot(temp_path("nw.png"), regression_series(), nw_options());
  const auto [w, h] = svg_size(read_text(temp_path("nw.svg")));
  const RgbaImage image = io::read_png(temp_path("nw.png"));
  EXPECT_EQ(image.width, static_cast<int>(std::ceil(2 * w)));
  EXPECT_EQ(image.height, static_cast<int>(std::ceil(2 * h)));
  EXPECT_GT(count_color(image, "#1f77b4"), 500) << "the fit, 1.5 units wide, in solid tab:blue";
  EXPECT_GT(count_color(image, "#ff00ff"), 300) << "the dashed truth";
  EXPECT_GT(count_color(image, "#ffffff"), image.width * image.height / 2) << "mostly white background";
}

TEST(Plots, GridOfPanelsNonFinitePointsAndLimits) {
  io::Series s{"", {0, 1, NAN, 3, 4}, {0, 1, 2, 3, INFINITY}, io::Series::Style::line, ""};
  io::PlotOptions options;
  options.ymin = -2;
  options.ymax = 5;
  options.legend = false;
  const io::PlotOptions second = labelled("second");
  io::write_plots(temp_path("grid.svg"), {{{s}, options}, {{s}, second}}, 2, "Figure");
  const std::string svg = read_text(temp_path("grid.svg"));
  // NaN and infinity cut the line: (0,0)-(1,1), then (3,3) alone, in each plot.
  EXPECT_EQ(count_substr(svg, "<polyline fill=\"none\" stroke=\"#1f77b4\""), 4);
  EXPECT_NE(svg.find(">Figure<"), std::string::npos);
  EXPECT_NE(svg.find(">second<"), std::string::npos);
  EXPECT_NE(svg.find(">-2<"), std::string::npos) << "the given lower limit is a tick";
}

TEST(Plots, BadArgumentsAreRefusedWithMessages) {
  io::Series bad{"fit", {1, 2, 3}, {1, 2}, io::Series::Style::line, ""};
  expect_error([&] { io::write_plot(temp_path("p.svg"), {bad}); }, {"write_plot", "series 0 (\"fit\")", "3 x values but 2 y"});
  io::Series colored{"", {1}, {1}, io::Series::Style::line, "red"};
  expect_error([&] { io::write_plot(temp_path("p.svg"), {colored}); }, {"colour \"red\"", "#rrggbb"});
  io::PlotOptions limits;
  limits.xmin = 2;
  limits.xmax = 1;
  expect_error([&] { io::write_plot(temp_path("p.svg"), {}, limits); }, {"lower axis limit"});
  limits = {};
  limits.ymax = NAN;
  expect_error([&] { io::write_plot(temp_path("p.svg"), {}, limits); }, {"not finite"});
  expect_error([&] { io::write_plots(temp_path("p.svg"), {}, 2); }, {"write_plots", "no plots"});
  expect_error([&] { io::write_plots(temp_path("p.svg"), {io::Panel{}}, 0); }, {"columns is 0"});
  expect_error([&] { io::write_plot(temp_path("p.pdf"), {}); }, {"p.pdf", ".svg or .png"});
}

TEST(Plots, PngWithoutItsFontFailsWithAHintAndSvgStillWorks) {
  setenv("ATTN_FONT", "/nonexistent/font.ttf", 1);
  expect_error([&] { io::write_plot(temp_path("nofont.png"), regression_series()); },
               {"nofont.png", "/nonexistent/font.ttf", "fonts-dejavu-core"});
  io::write_plot(temp_path("nofont.svg"), regression_series());
  unsetenv("ATTN_FONT");
  // The SVG names no font file: it is the one written with the font found.
  io::write_plot(temp_path("font.svg"), regression_series());
  const std::string svg = read_text(temp_path("nofont.svg"));
  EXPECT_EQ(svg, read_text(temp_path("font.svg")));
  for (const char* text : {">fit<", ">truth<", ">data<"}) EXPECT_EQ(count_substr(svg, text), 1) << text;
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
}

TEST(Plots, ExtremeValuesAndTextAreDrawnWithoutOverflow) {
  // Ranges wider than a double's difference can hold, a single repeated value, points far outside
  // the given limits, control characters in a label: a picture, not undefined behaviour.
  io::Series wide{"wide\x01", {-1e308, 0, 1e308}, {1e308, -1e308, 0}, io::Series::Style::line, ""};
  io::Series same{"", {5e300, 5e300}, {7, 7}, io::Series::Style::points, ""};
  io::PlotOptions limits;
  limits.xmin = 0;
  limits.xmax = 1;
  const Tensor<double> m({1, 3}, {-1e308, 0, 1e308});
  for (const char* ext : {"svg", "png"}) {
    const std::string path = temp_path(std::string("extreme.") + ext);
    io::write_plots(path, {{{wide}, {}}, {{same}, {}}, {{wide, same}, limits}}, 3);
    io::write_heatmaps<double>(temp_path(std::string("extreme_heatmap.") + ext), m.cview());
  }
  for (const char* name : {"extreme.png", "extreme_heatmap.png"}) {
    const RgbaImage image = io::read_png(temp_path(name));
    EXPECT_GT(image.width, 100) << name;
    EXPECT_GT(image.height, 100) << name;
  }
  const std::string svg = read_text(temp_path("extreme.svg")), heatmap = read_text(temp_path("extreme_heatmap.svg"));
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  EXPECT_EQ(svg.find('\x01'), std::string::npos);
  // The scale from -1e308 to 1e308 puts 0 in its middle (Reds' fifth stop), the ends at the ends.
  EXPECT_EQ(cell_fills(heatmap, 0), (std::vector<std::string>{"#fff5f0", "#fb6a4a", "#67000d"}));
}

TEST(Png, ReadingAFileThatIsNotAPngNamesIt) {
  std::ofstream(temp_path("not.png")) << "not a png";
  expect_error([&] { io::read_png(temp_path("not.png")); }, {"not.png", "cannot read the PNG"});
}

// ---- Ticks ------------------------------------------------------------------------------------

TEST(Ticks, RoundStepsWithTheDecimalsTheyNeed) {
  using io::figure::nice_ticks;
  EXPECT_EQ(nice_ticks(0, 1, 5).labels, (std::vector<std::string>{"0.0", "0.2", "0.4", "0.6", "0.8", "1.0"}));
  EXPECT_EQ(nice_ticks(-0.05, 0.55, 5).labels, (std::vector<std::string>{"0.0", "0.1", "0.2", "0.3", "0.4", "0.5"}));
  EXPECT_EQ(nice_ticks(-2.75, 2.75, 4).labels, (std::vector<std::string>{"-2", "-1", "0", "1", "2"}));
  EXPECT_EQ(nice_ticks(-2.75, 2.75, 3).labels, (std::vector<std::string>{"-2", "0", "2"}));
  EXPECT_EQ(nice_ticks(0, 2e6, 2).labels, (std::vector<std::string>{"0", "1e+06", "2e+06"}));
  EXPECT_EQ(nice_ticks(3, 3, 5).labels, (std::vector<std::string>{"3"}));
  EXPECT_GE(nice_ticks(0.9, 1.1, 5).values.size(), 2u) << "a narrow range still gets two ticks";
  EXPECT_EQ(io::figure::index_ticks(10, 22, 10).labels.size(), 10u);
  EXPECT_EQ(io::figure::index_ticks(100, 2.2, 12).labels,
            (std::vector<std::string>{"0", "10", "20", "30", "40", "50", "60", "70", "80", "90"}));
}

}  // namespace
}  // namespace attn
