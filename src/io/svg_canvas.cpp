// The SVG back end of the drawing layer: every call appends an element; save() writes the file.
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "attn/error.hpp"
#include "io/canvas.hpp"

namespace attn::io::draw {
namespace {

using attn::detail::fail;

// A coordinate or size with at most two decimals, trailing zeros dropped: "12.5", "3".
std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  std::string s = buf;
  s.erase(s.find_last_not_of('0') + 1);
  if (s.back() == '.') s.pop_back();
  return s == "-0" ? "0" : s;
}

// `text` with the characters XML reserves escaped.
std::string xml_escape(std::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// ` fill="#rrggbb"` and, when translucent, its opacity; `attribute` is "fill" or "stroke".
std::string paint(const char* attribute, Color c) {
  std::string s = std::string(" ") + attribute + "=\"" + hex(c) + "\"";
  if (c.a != 255) s += std::string(" ") + attribute + "-opacity=\"" + num(c.a / 255.0) + "\"";
  return s;
}

class SvgCanvas final : public Canvas {
 public:
  SvgCanvas(double width, double height) : width_(width), height_(height) {}

  void rect(double x, double y, double w, double h, Color fill) override {
    body_ << "<rect x=\"" << num(x) << "\" y=\"" << num(y) << "\" width=\"" << num(w) << "\" height=\"" << num(h)
          << "\"" << paint("fill", fill) << "/>\n";
  }

  void cells(double x, double y, double w, double h, int rows, int cols, std::span<const Color> colors) override {
    // One rectangle per run of equal cells in a row keeps the file small where a mask left zeros;
    // crispEdges stops renderers from anti-aliasing the seams between neighbouring rectangles.
    const double cw = w / cols, ch = h / rows;
    body_ << "<g shape-rendering=\"crispEdges\">\n";
    for (int i = 0; i < rows; ++i) {
      for (int j = 0; j < cols;) {
        const Color c = colors[static_cast<std::size_t>(i) * static_cast<std::size_t>(cols) + static_cast<std::size_t>(j)];
        int run = 1;
        while (j + run < cols &&
               colors[static_cast<std::size_t>(i) * static_cast<std::size_t>(cols) + static_cast<std::size_t>(j + run)] == c)
          ++run;
        rect(x + j * cw, y + i * ch, run * cw, ch, c);
        j += run;
      }
    }
    body_ << "</g>\n";
  }

  void polyline(std::span<const Point> points, Color stroke, double width, bool dashed) override {
    body_ << "<polyline fill=\"none\"" << paint("stroke", stroke) << " stroke-width=\"" << num(width)
          << "\" stroke-linejoin=\"round\"";
    // Round ends on solid lines, butt ends on dashes: as the raster back end draws them.
    if (dashed)
      body_ << " stroke-dasharray=\"" << num(3.7 * width) << "," << num(1.6 * width) << "\"";
    else
      body_ << " stroke-linecap=\"round\"";
    body_ << " points=\"";
    for (std::size_t i = 0; i < points.size(); ++i) body_ << (i ? " " : "") << num(points[i].x) << "," << num(points[i].y);
    body_ << "\"/>\n";
  }

  void dot(double cx, double cy, double radius, Color fill) override {
    body_ << "<circle cx=\"" << num(cx) << "\" cy=\"" << num(cy) << "\" r=\"" << num(radius) << "\"" << paint("fill", fill)
          << "/>\n";
  }

  void text(double x, double y, std::string_view text, double size, Color color, Anchor anchor,
            bool vertical) override {
    static constexpr const char* kAnchor[] = {"start", "middle", "end"};
    body_ << "<text x=\"" << num(x) << "\" y=\"" << num(y) << "\" font-size=\"" << num(size) << "\""
          << paint("fill", color) << " text-anchor=\"" << kAnchor[static_cast<int>(anchor)] << "\"";
    if (vertical) body_ << " transform=\"rotate(-90 " << num(x) << " " << num(y) << ")\"";
    body_ << ">" << xml_escape(text) << "</text>\n";
  }

  void push_clip(double x, double y, double w, double h) override {
    const int id = ++clips_;
    body_ << "<clipPath id=\"clip" << id << "\"><rect x=\"" << num(x) << "\" y=\"" << num(y) << "\" width=\"" << num(w)
          << "\" height=\"" << num(h) << "\"/></clipPath>\n<g clip-path=\"url(#clip" << id << ")\">\n";
  }

  void pop_clip() override { body_ << "</g>\n"; }

  void save(const std::string& path) override {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out) fail(path, ": cannot open for writing: ", std::strerror(errno));
    out << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
        << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << num(width_) << "\" height=\"" << num(height_)
        << "\" viewBox=\"0 0 " << num(width_) << " " << num(height_) << "\">\n"
        << "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n"
        << "<g font-family=\"DejaVu Sans, Bitstream Vera Sans, Verdana, sans-serif\">\n"
        << body_.str() << "</g>\n</svg>\n";
    out.close();
    if (!out) fail(path, ": writing failed: ", std::strerror(errno));
  }

 private:
  double width_, height_;
  std::ostringstream body_;
  int clips_ = 0;
};

}  // namespace

std::unique_ptr<Canvas> make_svg_canvas(double width, double height) {
  return std::make_unique<SvgCanvas>(width, height);
}

}  // namespace attn::io::draw
