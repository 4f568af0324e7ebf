// libFuzzer target for the .npy reader: any byte string given to parse_npy must either be refused
// with an attn::Error whose message starts with the file name, or be accepted as an array that
// keeps NpyArray's promises and survives serialize_npy -> parse_npy unchanged. Anything else (a
// crash, a sanitizer report, another exception such as std::bad_alloc, a broken promise) aborts.
//
// Build with -DATTN_FUZZ=ON and clang++ (see CMakeLists.txt), then for example
//   build-fuzz/npy_fuzz -dict=fuzz/npy.dict -max_total_time=600 corpus-dir fuzz/corpus/npy
// Or directly (one command):
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude fuzz/npy_fuzz.cpp src/io/npy.cpp -o npy_fuzz
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string_view>

#include "attn/npy.hpp"

namespace {

// Aborts with a note when a promise of the reader is broken.
void require(bool holds, const char* promise) {
  if (holds) return;
  std::fprintf(stderr, "npy_fuzz: broken promise: %s\n", promise);
  std::abort();
}

// to_tensor of the matching element type must accept whatever parse_npy accepted (rank <= 4).
template <class T>
void check_tensor(const attn::io::NpyArray& array) {
  const attn::Tensor<T> tensor = array.to_tensor<T>("fuzz.npy");
  require(tensor.numel() == array.numel(), "to_tensor keeps the number of elements");
  require(attn::io::to_npy(tensor).bytes == array.bytes, "to_npy(to_tensor(a)) has a's bytes");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace attn::io;
  const std::span<const std::byte> file(reinterpret_cast<const std::byte*>(data), size);
  NpyArray array;
  try {
    array = parse_npy(file, "fuzz.npy");
  } catch (const attn::Error& e) {
    require(std::string_view(e.what()).starts_with("fuzz.npy: "), "every message starts with the file name");
    return 0;
  }

  require(array.shape.size() <= static_cast<std::size_t>(kMaxNpyRank), "rank <= kMaxNpyRank");
  require(array.bytes.size() == static_cast<std::size_t>(array.numel()) * dtype_size(array.dtype),
          "bytes.size() == numel() * dtype_size(dtype)");
  require(array.bytes.size() <= size, "the data is no larger than the file");

  const NpyArray again = parse_npy(serialize_npy(array.dtype, array.shape, array.bytes.data()), "again.npy");
  require(again.dtype == array.dtype && again.shape == array.shape && again.bytes == array.bytes,
          "parse_npy(serialize_npy(a)) == a");

  if (array.shape.size() <= static_cast<std::size_t>(attn::kMaxRank)) {
    switch (array.dtype) {
      case DType::float32: check_tensor<float>(array); break;
      case DType::float64: check_tensor<double>(array); break;
      case DType::int32: check_tensor<std::int32_t>(array); break;
      case DType::int64: check_tensor<std::int64_t>(array); break;
      case DType::boolean: check_tensor<bool>(array); break;
      case DType::float16: check_tensor<attn::float16>(array); break;
    }
  }
  return 0;
}
