// Reading and writing NumPy .npy files: how the attn CLI and the PyTorch-parity tests exchange
// tensors with Python.
//
// The format (numpy.lib.format): the magic "\x93NUMPY", a major and a minor version byte, the
// header length as a little-endian integer (2 bytes in version 1.0, 4 bytes in 2.0 and 3.0), the
// header, then the raw elements. The header is a Python dict literal such as
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// padded with spaces and ended by '\n'; version 3.0 allows UTF-8 in it.
//
// Supported: little-endian float16, float32, float64, int32, int64 and bool ('<f2', '<f4', '<f8',
// '<i4', '<i8', '|b1'), ranks 0 to 8, C or Fortran order. Reading is strict: a malformed, truncated or
// unsupported file gives an attn::Error that names the file and the problem, and nothing is
// allocated before the sizes the header declares have been checked against the file's length.
// Writing produces version 1.0 in C order, byte for byte what numpy.save writes for the array.
//
// attn assumes a little-endian host; element bytes are copied, never swapped.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "attn/half.hpp"
#include "attn/tensor.hpp"

namespace attn::io {

// The element types a .npy file may hold for attn.
enum class DType { float32, float64, int32, int64, boolean, float16 };

// "float32", "float64", "int32", "int64", "bool" or "float16" (numpy's names).
const char* dtype_name(DType dtype);

// Bytes per element: 4, 8, 4, 8, 1 or 2.
std::size_t dtype_size(DType dtype);

// The most dimensions a .npy file may have for attn (Tensor itself holds at most kMaxRank).
inline constexpr int kMaxNpyRank = 8;

// The C++ element types that map one-to-one onto a DType.
template <class T>
concept NpyElement = std::same_as<T, float> || std::same_as<T, double> || std::same_as<T, std::int32_t> ||
                     std::same_as<T, std::int64_t> || std::same_as<T, bool> || std::same_as<T, float16>;

// The DType of a C++ element type: dtype_of<float>() == DType::float32.
template <NpyElement T>
constexpr DType dtype_of() {
  if constexpr (std::same_as<T, float>) return DType::float32;
  else if constexpr (std::same_as<T, double>) return DType::float64;
  else if constexpr (std::same_as<T, std::int32_t>) return DType::int32;
  else if constexpr (std::same_as<T, std::int64_t>) return DType::int64;
  else if constexpr (std::same_as<T, float16>) return DType::float16;
  else return DType::boolean;
}

// A whole .npy array in memory: its elements in C (row-major) order as little-endian bytes.
// parse_npy and read_npy promise bytes.size() == numel() * dtype_size(dtype) and, for bool,
// that every byte is 0 or 1.
struct NpyArray {
  DType dtype = DType::float32;
  std::vector<index_t> shape;
  std::vector<std::byte> bytes;

  // The product of the dimensions (1 for rank 0); attn::Error if it overflows index_t.
  index_t numel() const;

  // The elements as a Tensor of exactly the file's dtype; no conversion is done, so reading a
  // float64 file as float is an error rather than a silent rounding. attn::Error, naming `name`,
  // if the dtype differs (naming both dtypes), the rank exceeds attn::kMaxRank, or bytes does not
  // match the shape.
  template <NpyElement T>
  Tensor<T> to_tensor(const std::string& name) const;
};

// Parses a complete .npy file held in memory. `name` (usually the path) starts every message.
// Accepts versions 1.0, 2.0 and 3.0; the header's keys in any order, any whitespace and a trailing
// comma; Fortran-order data, which is transposed to C order. Refuses, with attn::Error: a bad
// magic or version, a header that is truncated, runs past the file or is not the dict numpy
// writes, an unsupported descr, a negative dimension or rank above kMaxNpyRank, sizes that
// overflow 64 bits, data shorter or longer than the shape needs, and bool bytes other than 0 or 1.
NpyArray parse_npy(std::span<const std::byte> file, const std::string& name);

// Reads and parses the file at `path`; every message starts with the path.
NpyArray read_npy(const std::string& path);

// The bytes of a version 1.0 .npy file of `shape` holding numel elements of `dtype` at `data`
// (C order, native little-endian; may be null when numel is 0). The header is padded with spaces
// and '\n' so the data starts at a multiple of 64 bytes, exactly as numpy.save does.
// attn::Error for a negative dimension, a rank above kMaxNpyRank, a size that overflows, null
// data with numel > 0, or bool bytes other than 0 or 1.
std::vector<std::byte> serialize_npy(DType dtype, std::span<const index_t> shape, const void* data);

// serialize_npy, written to `path` (created or truncated); messages start with the path.
void write_npy(const std::string& path, DType dtype, std::span<const index_t> shape, const void* data);

// The tensor as an NpyArray (a copy of its elements).
template <NpyElement T>
NpyArray to_npy(const Tensor<T>& tensor);

// Writes the tensor to `path` with its own dtype and shape.
template <NpyElement T>
void write_npy(const std::string& path, const Tensor<T>& tensor);

}  // namespace attn::io
