// The parts of the drawing layer both back ends share: colours, text widths, the choice of back end.
#include "io/canvas.hpp"

#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>

#include "attn/error.hpp"

namespace attn::io::draw {
namespace {

using attn::detail::fail;

// DejaVu Sans advance widths of the printable ASCII characters ' ' (32) to '~' (126), in font
// units of 1/2048 em (read from DejaVuSans.ttf 2.37 with FreeType, unscaled and unhinted).
constexpr std::array<int, 95> kAsciiAdvance = {
    651,  821,  942,  1716, 1303, 1946, 1597, 563,  799,  799,  1024, 1716, 651,  739,  651,  690,
    1303, 1303, 1303, 1303, 1303, 1303, 1303, 1303, 1303, 1303, 690,  690,  1716, 1716, 1716, 1087,
    2048, 1401, 1405, 1430, 1577, 1294, 1178, 1587, 1540, 604,  604,  1343, 1141, 1767, 1532, 1612,
    1235, 1612, 1423, 1300, 1251, 1499, 1401, 2025, 1403, 1251, 1403, 799,  690,  799,  1716, 1024,
    1024, 1255, 1300, 1126, 1300, 1260, 721,  1300, 1298, 569,  569,  1186, 569,  1995, 1298, 1253,
    1300, 1300, 842,  1067, 803,  1298, 1212, 1675, 1212, 1212, 1075, 1303, 690,  1303, 1716};
constexpr double kUnitsPerEm = 2048;
constexpr int kOtherAdvance = 1303;  // a digit's width, for characters outside ASCII

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  const char lower = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower >= 'a' && lower <= 'f') return lower - 'a' + 10;
  return -1;
}

// The extension of `path` after its last '.', lowercased ("" when there is none).
std::string extension(const std::string& path) {
  const std::size_t dot = path.find_last_of('.');
  const std::size_t slash = path.find_last_of('/');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return "";
  std::string ext = path.substr(dot + 1);
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext;
}

}  // namespace

Color parse_color(std::string_view text, std::string_view what) {
  Color c;
  bool ok = text.size() == 7 && text[0] == '#';
  for (std::size_t i = 1; ok && i < 7; ++i) ok = hex_digit(text[i]) >= 0;
  if (!ok) fail(what, ": colour \"", text, "\" is not of the form #rrggbb");
  const auto byte = [&](std::size_t i) { return static_cast<std::uint8_t>(hex_digit(text[i]) * 16 + hex_digit(text[i + 1])); };
  c.r = byte(1);
  c.g = byte(3);
  c.b = byte(5);
  return c;
}

std::string hex(Color c) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", c.r, c.g, c.b);
  return buf;
}

double text_width(std::string_view text, double size) {
  long units = 0;
  for (char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 32 && c < 127)
      units += kAsciiAdvance[c - 32];
    else if ((c & 0xC0) != 0x80)  // the first byte of a UTF-8 sequence (or a control character)
      units += kOtherAdvance;
  }
  return static_cast<double>(units) / kUnitsPerEm * size;
}

std::unique_ptr<Canvas> make_canvas(const std::string& path, double width, double height) {
  // Pictures beyond this are refused: a PNG twice this size in pixels already takes ~100 MB.
  constexpr double kMaxSide = 12000, kMaxArea = 6e6;
  if (!(width > 0 && height > 0 && width <= kMaxSide && height <= kMaxSide && width * height <= kMaxArea))
    fail(path, ": a picture of ", std::lround(width), " x ", std::lround(height),
         " units is too large to draw (at most ", kMaxSide, " on a side and ", kMaxArea, " in area)");
  const std::string ext = extension(path);
  if (ext == "svg") return make_svg_canvas(width, height);
  if (ext == "png") {
    try {
      return make_raster_canvas(width, height);
    } catch (const Error& e) {  // the font: name the picture it was needed for
      fail(path, ": ", e.what());
    }
  }
  fail(path, ": cannot tell the picture format from the extension \"", ext.empty() ? "" : "." + ext,
       "\"; use .svg or .png");
}

}  // namespace attn::io::draw
