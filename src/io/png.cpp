// PNG encoding and decoding with libpng 1.6's simplified API, which handles libpng's setjmp-based
// errors itself and reports them in png_image::message, so no longjmp crosses C++ frames here.
#include "io/png.hpp"

#include <png.h>

#include "attn/error.hpp"

namespace attn::io {

using attn::detail::fail;

void write_png(const std::string& path, const RgbaImage& image) {
  if (image.width <= 0 || image.height <= 0 ||
      image.pixels.size() != static_cast<std::size_t>(image.width) * static_cast<std::size_t>(image.height) * 4)
    fail(path, ": write_png: an image of ", image.width, " x ", image.height, " pixels needs ",
         4L * image.width * image.height, " bytes, not ", image.pixels.size());
  png_image png{};
  png.version = PNG_IMAGE_VERSION;
  png.width = static_cast<png_uint_32>(image.width);
  png.height = static_cast<png_uint_32>(image.height);
  png.format = PNG_FORMAT_RGBA;
  if (!png_image_write_to_file(&png, path.c_str(), /*convert_to_8bit=*/0, image.pixels.data(), /*row_stride=*/0,
                               /*colormap=*/nullptr))
    fail(path, ": cannot write the PNG: ", png.message);
}

RgbaImage read_png(const std::string& path) {
  png_image png{};
  png.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_file(&png, path.c_str())) fail(path, ": cannot read the PNG: ", png.message);
  png.format = PNG_FORMAT_RGBA;
  RgbaImage image;
  image.width = static_cast<int>(png.width);
  image.height = static_cast<int>(png.height);
  image.pixels.resize(PNG_IMAGE_SIZE(png));
  if (!png_image_finish_read(&png, /*background=*/nullptr, image.pixels.data(), /*row_stride=*/0, /*colormap=*/nullptr)) {
    png_image_free(&png);
    fail(path, ": cannot read the PNG: ", png.message);
  }
  return image;
}

}  // namespace attn::io
