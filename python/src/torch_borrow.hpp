// A torch.Tensor as attn reads it, without NumPy and without libtorch: its data_ptr(), shape,
// stride() and dtype, read through Python. Shared by the torch bridges (torch_bridge.cpp: attn.torch;
// torch_varlen.cpp and torch_flash.cpp: attn.flash).
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "attn/half.hpp"
#include "attn/sdpa.hpp"
#include "attn/tensor.hpp"

namespace attn_py {

namespace py = pybind11;
using attn::index_t;

// A torch.Tensor (or None) as attn reads it.
struct Borrowed {
  bool given = false;
  void* data = nullptr;
  std::vector<index_t> shape, strides;  // strides in elements, as torch gives them
  std::string dtype;                    // "float32", "bfloat16", "bool", "int64", ...
};

inline Borrowed borrow(py::handle t) {
  Borrowed b;
  if (t.is_none()) return b;
  b.given = true;
  b.data = reinterpret_cast<void*>(t.attr("data_ptr")().cast<std::uintptr_t>());
  for (py::handle s : t.attr("shape")) b.shape.push_back(s.cast<index_t>());
  for (py::handle s : t.attr("stride")()) b.strides.push_back(s.cast<index_t>());
  const std::string name = py::str(t.attr("dtype"));  // "torch.float32"
  b.dtype = name.rfind("torch.", 0) == 0 ? name.substr(6) : name;
  return b;
}

template <class T>
constexpr const char* dtype_of() {
  if constexpr (std::is_same_v<T, float>) return "float32";
  if constexpr (std::is_same_v<T, double>) return "float64";
  if constexpr (std::is_same_v<T, attn::bfloat16>) return "bfloat16";
  if constexpr (std::is_same_v<T, attn::float16>) return "float16";
  if constexpr (std::is_same_v<T, bool>) return "bool";
  if constexpr (std::is_same_v<T, std::int64_t>) return "int64";
  return "int32";
}

// The view of a borrowed tensor as T (empty for None); the Python layers pass the dtypes the kernel
// reads, so a mismatch here is a bug of theirs, reported as a TypeError all the same.
template <class T>
attn::TensorView<T> view(const Borrowed& b, const char* name) {
  if (!b.given) return {};
  using Element = std::remove_const_t<T>;
  if (b.dtype != dtype_of<Element>())
    throw py::type_error(std::string("attn.torch: ") + name + " has dtype torch." + b.dtype + " where torch." +
                         dtype_of<Element>() + " was expected");
  if (b.shape.size() > static_cast<std::size_t>(attn::kMaxRank))  // named here: a TensorView's own error names none
    throw py::value_error(std::string("attn.torch: ") + name + " has " + std::to_string(b.shape.size()) +
                          " dimensions; at most " + std::to_string(attn::kMaxRank) + " are supported");
  index_t numel = 1;
  for (index_t s : b.shape) numel *= s;
  T* data = static_cast<T*>(b.data);
  if (numel == 0) return {data, b.shape};  // torch gives an empty tensor any strides
  return {data, b.shape, b.strides};
}

// Runs f(T{}) for the dtype of `q`: float32, bfloat16, float16, and float64 when kFloat64; else a
// TypeError naming `who` (the function and its argument, e.g. "attn.torch: query").
template <bool kFloat64 = true, class F>
void for_dtype(const Borrowed& q, const std::string& who, F&& f) {
  if (q.dtype == "float32") return f(float{});
  if constexpr (kFloat64) {
    if (q.dtype == "float64") return f(double{});
  }
  if (q.dtype == "bfloat16") return f(attn::bfloat16{});
  if (q.dtype == "float16") return f(attn::float16{});
  throw py::type_error(who + " has dtype torch." + q.dtype + "; attn computes in float32, " +
                       (kFloat64 ? "float64, " : "") + "bfloat16 or float16");
}

// 16-bit attention keeps lse, the additive mask, the slopes and the sinks in float32.
template <class T>
using Wide = std::conditional_t<attn::Half16<T>, float, T>;

}  // namespace attn_py
