// The canonical form every kernel receives: a 4-D strided view (B, H, rows, cols) with a contiguous
// last dimension. 3-D tensors get H = 1; parameters (rows, cols) and vectors (cols,) get B = H = 1.
// Built once at the API boundary (src/api), after validation; kernels trust it.
#pragma once

#include <algorithm>
#include <span>
#include <type_traits>

#include "attn/tensor.hpp"

namespace attn {

template <class T>
struct View4 {
  T* data = nullptr;
  index_t B = 0, H = 0, R = 0, C = 0;  // batch, heads, rows, columns
  index_t sB = 0, sH = 0, sR = 0;      // element strides; the column stride is 1

  bool empty() const { return data == nullptr; }
  T* row(index_t b, index_t h, index_t r) const { return data + b * sB + h * sH + r * sR; }
  T& at(index_t b, index_t h, index_t r, index_t c) const { return row(b, h, r)[c]; }
  operator View4<const T>() const { return {data, B, H, R, C, sB, sH, sR}; }  // NOLINT
};

// A dense, contiguous (B, H, R, C) view over `data`.
template <class T>
View4<T> dense_view4(T* data, index_t B, index_t H, index_t R, index_t C) {
  return {data, B, H, R, C, H * R * C, R * C, C};
}

// Sets every element of x to 0; nothing for an empty view (a gradient not asked for).
template <class T>
void fill_zero(View4<T> x) {
  if (x.empty()) return;
  for (index_t b = 0; b < x.B; ++b)
    for (index_t h = 0; h < x.H; ++h)
      for (index_t r = 0; r < x.R; ++r) std::fill(x.row(b, h, r), x.row(b, h, r) + x.C, T(0));
}

namespace detail {

// The checks every stride passes before an address is formed from it: none negative, and the
// farthest element's offset (the sum of (dim - 1) * stride) fits in index_t. Throws attn::Error
// naming `op` and `name`.
template <class T>
void check_strides(const TensorView<T>& t, const char* op, const char* name) {
  index_t extent = 0;
  for (int i = 0; i < t.rank(); ++i) {
    if (t.stride(i) < 0)
      fail(op, ": ", name, " has stride ", t.stride(i), " in dimension ", i, "; strides must not be negative");
    if (t.dim(i) > 1) {
      index_t span = 0;
      if (__builtin_mul_overflow(t.dim(i) - 1, t.stride(i), &span) || __builtin_add_overflow(extent, span, &extent))
        fail(op, ": ", name, " with shape ", t.shape_string(), " spans more elements than a 64-bit index holds");
    }
  }
}

// Index i of t's first dimension, as a view of its other dimensions: t.data() + i * t.stride(0).
// src/api steps a view whose strides it has not checked yet only through this, so that no address is
// formed from a stride nobody checked (found by fuzzing: KvCache::attend formed the row of (batch,
// heads) ALiBi slopes through a negative batch stride). t's strides pass check_strides here, and i
// must lie in [0, t.dim(0)). A tensor of no element has no memory to bound its strides (any value is valid):
// its sub-view keeps t.data() (and t's other strides, which to_view4 sets to 0).
template <class T>
TensorView<T> step(const TensorView<T>& t, index_t i, const char* op, const char* name) {
  if (t.rank() < 1 || i < 0 || i >= t.dim(0))
    fail(op, ": ", name, " has shape ", t.shape_string(), "; index ", i, " of its first dimension does not exist");
  check_strides(t, op, name);
  return TensorView<T>(t.numel() == 0 ? t.data() : t.data() + i * t.stride(0), t.shape().subspan(1), t.strides().subspan(1));
}

// t (rank < kMaxRank) as a batch of one: shape (1, t's shape), the new axis of stride 0.
template <class T>
TensorView<T> with_batch_of_one(const TensorView<T>& t) {
  index_t shape[kMaxRank] = {1}, strides[kMaxRank] = {0};
  for (int i = 0; i < t.rank(); ++i) shape[i + 1] = t.dim(i), strides[i + 1] = t.stride(i);
  const auto rank = static_cast<std::size_t>(t.rank() + 1);
  return TensorView<T>(t.data(), std::span<const index_t>(shape, rank), std::span<const index_t>(strides, rank));
}

// The data pointer of a given tensor of no element whose storage is null (an owning Tensor of no
// element): an address that is never read or written (there is no element), so that the view is not
// taken for an optional argument that was not given (View4::empty, a null data pointer).
template <class T>
T* no_element_address() {
  alignas(64) static std::remove_const_t<T> none{};
  return &none;
}

// The checks every tensor argument passes: a rank in [min_rank, max_rank], check_strides, and a
// contiguous last dimension (unless `any_last_stride`: masks are read through every stride).
// Throws attn::Error naming `op` and `name`. Returns the canonical view (nullptr data for an empty
// optional argument; its last stride is 1 whatever t's). A tensor of no element gets strides 0, so
// that every row of it is its data pointer: nothing bounds the strides it came with, and a kernel
// may form the address of one of its rows (a row of no column: values of width 0), which must not
// overflow (clang's UBSan reported one, reached from the additive attention's row statistics).
template <class T>
View4<T> to_view4(const TensorView<T>& t, const char* op, const char* name, int min_rank = 3, int max_rank = 4,
                  bool any_last_stride = false) {
  if (t.empty()) return {};
  if (t.rank() < min_rank || t.rank() > max_rank) {
    if (min_rank == max_rank) fail(op, ": ", name, " has shape ", t.shape_string(), "; it must have ", min_rank, " dimensions");
    fail(op, ": ", name, " has shape ", t.shape_string(), "; it must have ", min_rank, " to ", max_rank, " dimensions");
  }
  if (t.data() == nullptr && t.numel() > 0) fail(op, ": ", name, " has shape ", t.shape_string(), " but no data");
  check_strides(t, op, name);
  if (!any_last_stride && t.rank() > 0 && t.dim(-1) > 1 && t.stride(-1) != 1)
    fail(op, ": ", name, " has stride ", t.stride(-1), " in its last dimension; it must be 1 (contiguous)");
  View4<T> v;
  v.data = t.data();
  index_t dims[4] = {1, 1, 1, 1}, strides[4] = {0, 0, 0, 1};
  const int pad = 4 - t.rank();
  for (int i = 0; i < t.rank(); ++i) {
    dims[pad + i] = t.dim(i);
    strides[pad + i] = t.stride(i);
  }
  if (t.rank() == 3) {  // (B, R, C): the heads axis is inserted, not the batch axis
    dims[0] = t.dim(0), strides[0] = t.stride(0);
    dims[1] = 1, strides[1] = 0;
  }
  v.B = dims[0], v.H = dims[1], v.R = dims[2], v.C = dims[3];
  v.sB = strides[0], v.sH = strides[1], v.sR = strides[2];
  if (t.numel() == 0) v.sB = v.sH = v.sR = 0;
  if (v.data == nullptr) v.data = no_element_address<T>();
  return v;
}

}  // namespace detail
}  // namespace attn
