// The raster back end of the drawing layer: an RGBA image at kScale device pixels per layout unit,
// painted with anti-aliasing (each shape's coverage of a pixel blends its colour in), text drawn
// by FreeType in DejaVu Sans, saved as PNG by png.cpp.
#include <ft2build.h>
#include FT_FREETYPE_H
#include FT_OUTLINE_H

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "attn/error.hpp"
#include "io/canvas.hpp"
#include "io/png.hpp"

#ifndef ATTN_FONT_DIR
#define ATTN_FONT_DIR "/usr/share/fonts/truetype/dejavu"
#endif

namespace attn::io::draw {
namespace {

using attn::detail::fail;

// Device pixels per layout unit: a 400-unit figure is an 800-pixel PNG, sharp on today's screens.
constexpr double kScale = 2.0;

// The next code point of UTF-8 `text` at `i` (advancing i); U+FFFD for a malformed sequence.
char32_t next_code_point(std::string_view text, std::size_t& i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char c = byte(i++);
  if (c < 0x80) return c;
  const int extra = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : -1;
  if (extra < 0) return 0xFFFD;
  char32_t cp = c & (0x3F >> extra);
  for (int k = 0; k < extra; ++k) {
    if (i >= text.size() || (byte(i) & 0xC0) != 0x80) return 0xFFFD;
    cp = (cp << 6) | (byte(i++) & 0x3F);
  }
  return cp;
}

// DejaVu Sans loaded with FreeType: from $ATTN_FONT if set, else from the Debian package's directory.
class Font {
 public:
  Font() {
    const char* env = std::getenv("ATTN_FONT");
    const std::string path = env && *env ? env : ATTN_FONT_DIR "/DejaVuSans.ttf";
    if (FT_Init_FreeType(&library_) != 0) fail("FreeType could not be initialised");
    if (FT_New_Face(library_, path.c_str(), 0, &face_) != 0) {
      FT_Done_FreeType(library_);
      fail("text in a PNG needs the font DejaVu Sans, but ", path,
           " cannot be loaded (install Debian's fonts-dejavu-core, or set ATTN_FONT to a .ttf file)");
    }
  }
  ~Font() {
    FT_Done_Face(face_);
    FT_Done_FreeType(library_);
  }
  Font(const Font&) = delete;
  Font& operator=(const Font&) = delete;

  FT_Face face() const { return face_; }

 private:
  FT_Library library_ = nullptr;
  FT_Face face_ = nullptr;
};

// Coverage (0..1) of a one-pixel interval [p, p + 1) by [lo, hi).
double overlap(double p, double lo, double hi) { return std::clamp(std::min(p + 1, hi) - std::max(p, lo), 0.0, 1.0); }

class RasterCanvas final : public Canvas {
 public:
  RasterCanvas(double width, double height) {
    image_.width = static_cast<int>(std::ceil(width * kScale));
    image_.height = static_cast<int>(std::ceil(height * kScale));
    image_.pixels.assign(static_cast<std::size_t>(image_.width) * static_cast<std::size_t>(image_.height) * 4, 255);
    pop_clip();
  }

  void rect(double x, double y, double w, double h, Color fill) override {
    const double x0 = x * kScale, x1 = (x + w) * kScale, y0 = y * kScale, y1 = (y + h) * kScale;
    for (int py = clamp_y(std::floor(y0)); py < clamp_y(std::ceil(y1)); ++py)
      for (int px = clamp_x(std::floor(x0)); px < clamp_x(std::ceil(x1)); ++px)
        blend(px, py, fill, overlap(px, x0, x1) * overlap(py, y0, y1));
  }

  void cells(double x, double y, double w, double h, int rows, int cols, std::span<const Color> colors) override {
    // Cell edges snapped to whole pixels: every pixel belongs to exactly one cell (the nearest one
    // when cells are smaller than a pixel), so neighbours never blend into a seam.
    const auto edge = [](double start, double size, int k, int n) {
      return static_cast<int>(std::lround((start + size * k / n) * kScale));
    };
    for (int i = 0; i < rows; ++i) {
      const int py0 = clamp_y(edge(y, h, i, rows)), py1 = clamp_y(edge(y, h, i + 1, rows));
      for (int j = 0; j < cols; ++j) {
        const int px0 = clamp_x(edge(x, w, j, cols)), px1 = clamp_x(edge(x, w, j + 1, cols));
        const Color c = colors[static_cast<std::size_t>(i) * static_cast<std::size_t>(cols) + static_cast<std::size_t>(j)];
        for (int py = py0; py < py1; ++py)
          for (int px = px0; px < px1; ++px) blend(px, py, c, 1.0);
      }
    }
  }

  void polyline(std::span<const Point> points, Color stroke, double width, bool dashed) override {
    if (points.empty()) return;
    const double half = width * kScale / 2;
    // The line's coverage of each pixel, the maximum over its segments, blended once at the end so
    // that the joints, where segments overlap, are not painted twice.
    double lo_x = 1e300, lo_y = 1e300, hi_x = -1e300, hi_y = -1e300;
    for (const Point& p : points) {
      lo_x = std::min(lo_x, p.x), hi_x = std::max(hi_x, p.x), lo_y = std::min(lo_y, p.y), hi_y = std::max(hi_y, p.y);
    }
    mask_x0_ = clamp_x(std::floor(lo_x * kScale - half - 1));
    mask_y0_ = clamp_y(std::floor(lo_y * kScale - half - 1));
    mask_w_ = clamp_x(std::ceil(hi_x * kScale + half + 2)) - mask_x0_;
    mask_h_ = clamp_y(std::ceil(hi_y * kScale + half + 2)) - mask_y0_;
    if (mask_w_ <= 0 || mask_h_ <= 0) return;
    mask_.assign(static_cast<std::size_t>(mask_w_) * static_cast<std::size_t>(mask_h_), 0.0f);

    if (!dashed) {
      for (std::size_t i = 0; i + 1 < points.size(); ++i) stroke_segment(scaled(points[i]), scaled(points[i + 1]), half, true);
      if (points.size() == 1) stroke_segment(scaled(points[0]), scaled(points[0]), half, true);
    } else {
      dash(points, half);
    }
    for (int my = 0; my < mask_h_; ++my)
      for (int mx = 0; mx < mask_w_; ++mx)
        if (const float m = mask_[static_cast<std::size_t>(my) * static_cast<std::size_t>(mask_w_) + static_cast<std::size_t>(mx)]; m > 0)
          blend(mask_x0_ + mx, mask_y0_ + my, stroke, m);
  }

  void dot(double cx, double cy, double radius, Color fill) override {
    const double x = cx * kScale, y = cy * kScale, r = radius * kScale;
    for (int py = clamp_y(std::floor(y - r - 1)); py < clamp_y(std::ceil(y + r + 1)); ++py)
      for (int px = clamp_x(std::floor(x - r - 1)); px < clamp_x(std::ceil(x + r + 1)); ++px)
        blend(px, py, fill, std::clamp(r + 0.5 - std::hypot(px + 0.5 - x, py + 0.5 - y), 0.0, 1.0));
  }

  void text(double x, double y, std::string_view text, double size, Color color, Anchor anchor, bool vertical) override;

  void push_clip(double x, double y, double w, double h) override {
    clip_x0_ = std::max(0, static_cast<int>(std::lround(x * kScale)));
    clip_y0_ = std::max(0, static_cast<int>(std::lround(y * kScale)));
    clip_x1_ = std::min(image_.width, static_cast<int>(std::lround((x + w) * kScale)));
    clip_y1_ = std::min(image_.height, static_cast<int>(std::lround((y + h) * kScale)));
  }

  void pop_clip() override {
    clip_x0_ = clip_y0_ = 0;
    clip_x1_ = image_.width;
    clip_y1_ = image_.height;
  }

  void save(const std::string& path) override { write_png(path, image_); }

 private:
  static Point scaled(Point p) { return {p.x * kScale, p.y * kScale}; }
  int clamp_x(double px) const { return static_cast<int>(std::clamp(px, double(clip_x0_), double(clip_x1_))); }
  int clamp_y(double py) const { return static_cast<int>(std::clamp(py, double(clip_y0_), double(clip_y1_))); }

  // Paints `c` over pixel (px, py) with `coverage` (0..1) times its alpha, inside the clip.
  void blend(int px, int py, Color c, double coverage) {
    if (px < clip_x0_ || px >= clip_x1_ || py < clip_y0_ || py >= clip_y1_ || coverage <= 0) return;
    const double a = coverage * c.a / 255.0;
    std::uint8_t* p = image_.pixels.data() +
                      (static_cast<std::size_t>(py) * static_cast<std::size_t>(image_.width) + static_cast<std::size_t>(px)) * 4;
    const std::uint8_t src[3] = {c.r, c.g, c.b};
    for (int k = 0; k < 3; ++k) p[k] = static_cast<std::uint8_t>(std::lround(p[k] + (src[k] - p[k]) * a));
  }

  // Adds the segment a-b (device pixels) of half-width `half` to the mask. round: round caps,
  // which also make round joints between consecutive segments; otherwise butt ends (dashes).
  void stroke_segment(Point a, Point b, double half, bool round) {
    const double dx = b.x - a.x, dy = b.y - a.y, length = std::hypot(dx, dy);
    const double reach = half + (round ? 1 : 1.5);
    const int x0 = std::max(mask_x0_, static_cast<int>(std::floor(std::min(a.x, b.x) - reach)));
    const int x1 = std::min(mask_x0_ + mask_w_, static_cast<int>(std::ceil(std::max(a.x, b.x) + reach)));
    const int y0 = std::max(mask_y0_, static_cast<int>(std::floor(std::min(a.y, b.y) - reach)));
    const int y1 = std::min(mask_y0_ + mask_h_, static_cast<int>(std::ceil(std::max(a.y, b.y) + reach)));
    for (int py = y0; py < y1; ++py) {
      for (int px = x0; px < x1; ++px) {
        const double qx = px + 0.5 - a.x, qy = py + 0.5 - a.y;
        // along: the distance from a along the segment; across: from the segment's line.
        const double along = length > 0 ? (qx * dx + qy * dy) / length : 0;
        const double across = length > 0 ? std::abs(qx * dy - qy * dx) / length : std::hypot(qx, qy);
        double coverage;
        if (round) {
          const double t = std::clamp(along, 0.0, length);
          const double dist = std::hypot(qx - t * (length > 0 ? dx / length : 0), qy - t * (length > 0 ? dy / length : 0));
          coverage = std::clamp(half + 0.5 - dist, 0.0, 1.0);
        } else {
          coverage = std::clamp(half + 0.5 - across, 0.0, 1.0) * std::clamp(std::min(along, length - along) + 0.5, 0.0, 1.0);
        }
        float& m = mask_[static_cast<std::size_t>(py - mask_y0_) * static_cast<std::size_t>(mask_w_) +
                         static_cast<std::size_t>(px - mask_x0_)];
        m = std::max(m, static_cast<float>(coverage));
      }
    }
  }

  // Strokes `points` (layout units) dashed, with butt ends: dashes of 3.7 line widths, gaps of 1.6.
  void dash(std::span<const Point> points, double half) {
    const double on = 3.7 * 2 * half, off = 1.6 * 2 * half;
    bool drawing = true;
    double left = on;  // length left in the current dash or gap
    for (std::size_t i = 0; i + 1 < points.size(); ++i) {
      Point a = scaled(points[i]);
      const Point b = scaled(points[i + 1]);
      double remaining = std::hypot(b.x - a.x, b.y - a.y);
      while (remaining > 0) {
        const double step = std::min(left, remaining);
        const double t = step / remaining;
        const Point c{a.x + (b.x - a.x) * t, a.y + (b.y - a.y) * t};
        if (drawing) stroke_segment(a, c, half, false);
        a = c;
        remaining -= step;
        left -= step;
        if (left <= 0) {
          drawing = !drawing;
          left = drawing ? on : off;
        }
      }
    }
  }

  RgbaImage image_;
  Font font_;
  int clip_x0_ = 0, clip_y0_ = 0, clip_x1_ = 0, clip_y1_ = 0;
  std::vector<float> mask_;  // polyline coverage over the box at (mask_x0_, mask_y0_)
  int mask_x0_ = 0, mask_y0_ = 0, mask_w_ = 0, mask_h_ = 0;
};

void RasterCanvas::text(double x, double y, std::string_view text, double size, Color color, Anchor anchor,
                        bool vertical) {
  FT_Face face = font_.face();
  const double px_size = size * kScale;
  if (FT_Set_Char_Size(face, 0, static_cast<FT_F26Dot6>(std::lround(px_size * 64)), 72, 72) != 0) return;
  // The glyphs with their advances: unhinted, so that they add up to what text_width measured.
  std::vector<FT_UInt> glyphs;
  double width = 0;
  for (std::size_t i = 0; i < text.size();) {
    const FT_UInt glyph = FT_Get_Char_Index(face, next_code_point(text, i));
    if (FT_Load_Glyph(face, glyph, FT_LOAD_NO_HINTING | FT_LOAD_NO_BITMAP) != 0) continue;
    glyphs.push_back(glyph);
    width += face->glyph->linearHoriAdvance / 65536.0;
  }
  // Render the line of text horizontally into a coverage buffer with `pad` pixels around it
  // (glyphs may overhang their advance), then copy it onto the image, turned for vertical text.
  const int pad = static_cast<int>(std::ceil(px_size / 2)) + 2;
  const int ascent = static_cast<int>(std::ceil(kAscent * px_size)) + 1;
  const int buf_w = static_cast<int>(std::ceil(width)) + 2 * pad, buf_h = ascent + static_cast<int>(std::ceil(kDescent * px_size)) + 2;
  std::vector<std::uint8_t> buf(static_cast<std::size_t>(buf_w) * static_cast<std::size_t>(buf_h), 0);
  // Where the text starts along its direction, in device pixels: a fraction of a pixel is kept as
  // a sub-pixel offset of the pen so that the text lands exactly where the layout put it.
  const double shift = anchor == Anchor::start ? 0 : anchor == Anchor::middle ? width / 2 : width;
  const double start = vertical ? y * kScale + shift : x * kScale - shift;
  const double whole = vertical ? std::ceil(start) : std::floor(start);
  double pen = pad + std::abs(start - whole);
  for (FT_UInt glyph : glyphs) {
    if (FT_Load_Glyph(face, glyph, FT_LOAD_NO_HINTING | FT_LOAD_NO_BITMAP) != 0) continue;
    const double advance = face->glyph->linearHoriAdvance / 65536.0;
    const int pen_px = static_cast<int>(std::floor(pen));
    if (face->glyph->format == FT_GLYPH_FORMAT_OUTLINE)
      FT_Outline_Translate(&face->glyph->outline, static_cast<FT_Pos>(std::lround((pen - pen_px) * 64)), 0);
    if (FT_Render_Glyph(face->glyph, FT_RENDER_MODE_NORMAL) == 0) {
      const FT_Bitmap& bitmap = face->glyph->bitmap;
      for (unsigned r = 0; r < bitmap.rows; ++r) {
        for (unsigned c = 0; c < bitmap.width; ++c) {
          const int bx = pen_px + face->glyph->bitmap_left + static_cast<int>(c);
          const int by = ascent - face->glyph->bitmap_top + static_cast<int>(r);
          if (bx < 0 || bx >= buf_w || by < 0 || by >= buf_h) continue;
          std::uint8_t& b = buf[static_cast<std::size_t>(by) * static_cast<std::size_t>(buf_w) + static_cast<std::size_t>(bx)];
          b = std::max(b, bitmap.buffer[static_cast<std::ptrdiff_t>(r) * bitmap.pitch + c]);
        }
      }
    }
    pen += advance;
  }
  // Buffer pixel (u, v) lies at device (origin + u, top + v); turned counter-clockwise, at
  // (top + v, origin - 1 - u): the text reads upwards and the tops of its glyphs face left.
  const int baseline = static_cast<int>(std::lround((vertical ? x : y) * kScale));
  const int origin = static_cast<int>(whole) + (vertical ? pad : -pad);
  for (int v = 0; v < buf_h; ++v)
    for (int u = 0; u < buf_w; ++u)
      if (const std::uint8_t b = buf[static_cast<std::size_t>(v) * static_cast<std::size_t>(buf_w) + static_cast<std::size_t>(u)])
        vertical ? blend(baseline - ascent + v, origin - 1 - u, color, b / 255.0)
                 : blend(origin + u, baseline - ascent + v, color, b / 255.0);
}

}  // namespace

std::unique_ptr<Canvas> make_raster_canvas(double width, double height) {
  return std::make_unique<RasterCanvas>(width, height);
}

}  // namespace attn::io::draw
