// Tensor views and an owning tensor.
//
// Shape legend used across attn:
//   B batch, H heads, n queries, m keys (and values), d query/key size, v value size,
//   q and k the query and key sizes of additive and bilinear attention, h hidden size.
// Tensors are 3-D (B, n, d) as in the d2l chapter, or 4-D (B, H, n, d) with a heads axis.
//
// A TensorView does not own its data. Strides are counted in elements, not bytes. Only the last
// dimension must be contiguous (stride 1); the others may have any non-negative stride, so a
// slice, a transposed batch/head layout or a broadcast (stride 0) is used without a copy.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "attn/error.hpp"
#include "attn/memory.hpp"

namespace attn {

using index_t = std::int64_t;
inline constexpr int kMaxRank = 4;

namespace detail {

// a * b, or an attn::Error naming `what` when the product does not fit in index_t.
inline index_t checked_mul(index_t a, index_t b, const char* what) {
  index_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) fail(what, ": the product of the sizes overflows a 64-bit index");
  return r;
}

inline std::string dims_string(std::span<const index_t> dims) {
  std::string s = "(";
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (i > 0) s += ',';
    s += std::to_string(dims[i]);
  }
  s += dims.size() == 1 ? ",)" : ")";
  return s;
}

}  // namespace detail

// A shape as attn's messages write it: "(2,10,3)", "(5,)" with one dimension, "()" with none; for
// front ends that word their own messages the library's way.
inline std::string shape_string(std::span<const index_t> dims) { return detail::dims_string(dims); }

template <class T>
class TensorView {
 public:
  using value_type = T;

  TensorView() = default;

  // A contiguous (row-major) view of `shape`.
  TensorView(T* data, std::span<const index_t> shape) : data_(data) { set_shape(shape, {}); }
  TensorView(T* data, std::initializer_list<index_t> shape)
      : TensorView(data, std::span<const index_t>(shape.begin(), shape.size())) {}

  // A strided view: strides[i] elements between neighbours along dimension i.
  TensorView(T* data, std::span<const index_t> shape, std::span<const index_t> strides) : data_(data) {
    set_shape(shape, strides);
  }
  TensorView(T* data, std::initializer_list<index_t> shape, std::initializer_list<index_t> strides)
      : TensorView(data, std::span<const index_t>(shape.begin(), shape.size()),
                   std::span<const index_t>(strides.begin(), strides.size())) {}

  // A view of mutable data converts to a view of const data.
  template <class U>
    requires(std::is_same_v<const U, T> && !std::is_same_v<U, T>)
  TensorView(const TensorView<U>& other)  // NOLINT(google-explicit-constructor)
      : data_(other.data()), rank_(other.rank()), shape_(other.shape_array()), strides_(other.strides_array()) {}

  /// The first element, the rank (number of dimensions).
  T* data() const { return data_; }
  int rank() const { return rank_; }
  // The view was default-constructed: an optional argument that was not given.
  bool empty() const { return data_ == nullptr && rank_ == 0; }
  /// A size and a stride (negative i counts from the end), the shape and the strides (as spans or
  /// arrays), the shape as messages write it.
  index_t dim(int i) const { return shape_[static_cast<std::size_t>(i < 0 ? i + rank_ : i)]; }
  index_t stride(int i) const { return strides_[static_cast<std::size_t>(i < 0 ? i + rank_ : i)]; }
  std::span<const index_t> shape() const { return {shape_.data(), static_cast<std::size_t>(rank_)}; }
  std::span<const index_t> strides() const { return {strides_.data(), static_cast<std::size_t>(rank_)}; }
  const std::array<index_t, kMaxRank>& shape_array() const { return shape_; }
  const std::array<index_t, kMaxRank>& strides_array() const { return strides_; }
  std::string shape_string() const { return detail::dims_string(shape()); }

  /// The number of elements (the product of the sizes).
  index_t numel() const {
    index_t n = 1;
    for (int i = 0; i < rank_; ++i) n = detail::checked_mul(n, shape_[i], "TensorView::numel");
    return n;
  }

  // Element access by full index: view(b, i, j) on a 3-D view.
  template <class... I>
  T& operator()(I... idx) const {
    static_assert(sizeof...(I) >= 1 && sizeof...(I) <= kMaxRank);
    const index_t ix[] = {static_cast<index_t>(idx)...};
    index_t off = 0;
    for (std::size_t i = 0; i < sizeof...(I); ++i) off += ix[i] * strides_[i];
    return data_[off];
  }

 private:
  void set_shape(std::span<const index_t> shape, std::span<const index_t> strides) {
    if (shape.size() > static_cast<std::size_t>(kMaxRank))
      detail::fail("TensorView: rank ", shape.size(), " is not supported; at most ", kMaxRank, " dimensions");
    if (!strides.empty() && strides.size() != shape.size())
      detail::fail("TensorView: shape ", detail::dims_string(shape), " has ", shape.size(),
                   " dimensions but strides has ", strides.size());
    rank_ = static_cast<int>(shape.size());
    index_t running = 1;
    for (int i = rank_ - 1; i >= 0; --i) {
      if (shape[i] < 0) detail::fail("TensorView: shape ", detail::dims_string(shape), " has a negative size");
      shape_[i] = shape[i];
      strides_[i] = strides.empty() ? running : strides[i];
      running = detail::checked_mul(running, shape[i], "TensorView shape");
    }
  }

  T* data_ = nullptr;
  int rank_ = 0;
  std::array<index_t, kMaxRank> shape_{};
  std::array<index_t, kMaxRank> strides_{};
};

namespace detail {
// Element storage of Tensor<T>: T itself, except for bool, where std::vector<bool> packs bits and
// has no data(); a one-byte struct whose only member is a bool stands in (pointer-interconvertible).
struct StoredBool {
  bool value = false;
  StoredBool(bool v = false) : value(v) {}       // NOLINT(google-explicit-constructor)
  operator bool() const { return value; }        // NOLINT(google-explicit-constructor)
};
static_assert(sizeof(StoredBool) == sizeof(bool));
template <class T>
struct Stored {
  using type = T;
};
template <>
struct Stored<bool> {
  using type = StoredBool;
};
}  // namespace detail

// An owning, contiguous tensor, zero-initialised, its elements aligned to a cache line. view() and
// cview() give TensorViews of it. Its elements count against the memory attn may use
// (attn/memory.hpp): a shape too large for it throws attn::MemoryError before anything is allocated.
template <class T>
class Tensor {
 public:
  // The elements' storage (values()): a std::vector of cache-line aligned memory.
  using Storage = std::vector<typename detail::Stored<T>::type, detail::CacheLineAllocator<typename detail::Stored<T>::type>>;

  Tensor() = default;
  /// A zero-filled tensor of this shape (attn::Error for a negative size, attn::MemoryError past the
  /// memory limit); or filled with `values`, in C order, whose count must be the shape's.
  explicit Tensor(std::span<const index_t> shape) : shape_(shape.begin(), shape.end()) {
    index_t n = 1;
    for (index_t s : shape_) {
      if (s < 0) detail::fail("Tensor: shape ", detail::dims_string(shape_), " has a negative size");
      n = detail::checked_mul(n, s, "Tensor shape");
    }
    reservation_ = detail::MemoryReservation(
        static_cast<std::size_t>(detail::checked_mul(n, sizeof(typename Storage::value_type), "Tensor bytes")), "a tensor",
        shape_);
    values_.assign(static_cast<std::size_t>(n), {});
  }
  Tensor(std::initializer_list<index_t> shape) : Tensor(std::span<const index_t>(shape.begin(), shape.size())) {}
  Tensor(std::span<const index_t> shape, const std::vector<T>& values) : Tensor(shape) {
    if (values.size() != values_.size())
      detail::fail("Tensor: shape ", detail::dims_string(shape_), " holds ", values_.size(), " elements but ",
                   values.size(), " values were given");
    for (std::size_t i = 0; i < values.size(); ++i) data()[i] = values[i];
  }
  Tensor(std::initializer_list<index_t> shape, const std::vector<T>& values)
      : Tensor(std::span<const index_t>(shape.begin(), shape.size()), values) {}

  /// Views of the whole tensor (cview(): a read-only one); a Tensor converts to its view.
  TensorView<T> view() { return {data(), shape_}; }
  TensorView<const T> view() const { return {data(), shape_}; }
  TensorView<const T> cview() const { return view(); }
  operator TensorView<T>() { return view(); }              // NOLINT(google-explicit-constructor)
  operator TensorView<const T>() const { return view(); }  // NOLINT(google-explicit-constructor)

  /// The elements, the rank, a size (negative i counts from the end), the shape, the shape as messages
  /// write it, the number of elements.
  T* data() { return reinterpret_cast<T*>(values_.data()); }
  const T* data() const { return reinterpret_cast<const T*>(values_.data()); }
  int rank() const { return static_cast<int>(shape_.size()); }
  index_t dim(int i) const { return shape_[static_cast<std::size_t>(i < 0 ? i + rank() : i)]; }
  const std::vector<index_t>& shape() const { return shape_; }
  std::string shape_string() const { return detail::dims_string(shape_); }
  index_t numel() const { return static_cast<index_t>(values_.size()); }
  // The elements in C order (for bool, one-byte wrappers of them).
  Storage& values() { return values_; }
  const Storage& values() const { return values_; }
  T& operator[](index_t i) { return data()[i]; }
  const T& operator[](index_t i) const { return data()[i]; }
  template <class... I>
  T& operator()(I... idx) { return view()(idx...); }
  template <class... I>
  const T& operator()(I... idx) const { return view()(idx...); }

 private:
  std::vector<index_t> shape_;
  detail::MemoryReservation reservation_;  // values_'s bytes, counted against attn's memory limit
  Storage values_;
};

}  // namespace attn
