// A small drawing layer under the heatmaps and plots of attn/plot.hpp: one interface, two back
// ends. The layout code draws once on a Canvas; SvgCanvas writes the drawing as SVG elements,
// RasterCanvas paints it, anti-aliased, into an RGBA image that png.cpp encodes with libpng.
//
// Coordinates are in layout units (CSS pixels): x to the right, y down, origin at the top-left
// corner. Text is DejaVu Sans; y of a text is its baseline. Both back ends measure text with the
// same font metrics, so the layout (and what fits where) is identical in SVG and PNG.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace attn::io::draw {

// A colour with straight (not premultiplied) alpha; a = 255 is opaque.
struct Color {
  std::uint8_t r = 0, g = 0, b = 0, a = 255;
  bool operator==(const Color&) const = default;
};

// "#rrggbb" -> Color; attn::Error naming `what` otherwise.
Color parse_color(std::string_view hex, std::string_view what);
// "#rrggbb" of the colour (alpha dropped).
std::string hex(Color c);

struct Point {
  double x = 0, y = 0;
};

enum class Anchor { start, middle, end };  // where the given point lies along the text

// DejaVu Sans' vertical metrics, in em: what the layout reserves above and below a baseline.
inline constexpr double kCapHeight = 0.729;  // 'H' above the baseline
inline constexpr double kAscent = 0.928;     // the tallest glyphs (accents, brackets)
inline constexpr double kDescent = 0.236;    // below the baseline ('g', 'p')

// The width of `text` (UTF-8) at font size `size`, from DejaVu Sans' advance widths: exact for
// ASCII, an average width for other characters.
double text_width(std::string_view text, double size);

class Canvas {
 public:
  virtual ~Canvas() = default;

  // A filled axis-aligned rectangle.
  virtual void rect(double x, double y, double w, double h, Color fill) = 0;
  // A rows x cols grid of cells filling the rectangle (x, y, w, h), colours in row-major order,
  // drawn without gaps or anti-aliased seams between cells (a heatmap).
  virtual void cells(double x, double y, double w, double h, int rows, int cols, std::span<const Color> colors) = 0;
  // A line through `points` of the given width; dashed: 3.7 on, 1.6 off, times the width (matplotlib's).
  virtual void polyline(std::span<const Point> points, Color stroke, double width, bool dashed = false) = 0;
  // A filled circle; the colour's alpha makes it translucent.
  virtual void dot(double cx, double cy, double radius, Color fill) = 0;
  // `text` (UTF-8) with its baseline at y; vertical: rotated 90 degrees counter-clockwise about
  // (x, y), reading upwards (a y-axis label).
  virtual void text(double x, double y, std::string_view text, double size, Color color, Anchor anchor,
                    bool vertical = false) = 0;
  // Everything drawn until pop_clip is cut to the rectangle. Clips do not nest.
  virtual void push_clip(double x, double y, double w, double h) = 0;
  virtual void pop_clip() = 0;
  // Writes the drawing to `path`; attn::Error naming the path when that fails.
  virtual void save(const std::string& path) = 0;
};

// A white canvas of width x height units for `path`: SVG for ".svg", PNG for ".png" (case does
// not matter); attn::Error naming the path for any other extension, and for a PNG whose font
// cannot be loaded (so that the caller learns it before drawing).
std::unique_ptr<Canvas> make_canvas(const std::string& path, double width, double height);

// Back ends (svg_canvas.cpp, raster_canvas.cpp).
std::unique_ptr<Canvas> make_svg_canvas(double width, double height);
std::unique_ptr<Canvas> make_raster_canvas(double width, double height);

}  // namespace attn::io::draw
