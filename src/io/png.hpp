// PNG files through libpng's simplified API (png_image): what the raster back end of the drawing
// layer writes, and what the tests read back to look at its pixels.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace attn::io {

// An 8-bit RGBA image, row-major from the top-left corner, 4 bytes a pixel.
struct RgbaImage {
  int width = 0, height = 0;
  std::vector<std::uint8_t> pixels;

  // The (r, g, b, a) bytes of pixel (x, y).
  const std::uint8_t* at(int x, int y) const {
    return pixels.data() + (static_cast<std::size_t>(y) * static_cast<std::size_t>(width) + static_cast<std::size_t>(x)) * 4;
  }
};

// Writes `image` to `path`; attn::Error naming the path and libpng's message on failure.
void write_png(const std::string& path, const RgbaImage& image);

// Reads any PNG libpng can read, converted to 8-bit RGBA; attn::Error naming the path on failure.
RgbaImage read_png(const std::string& path);

}  // namespace attn::io
