// Argument checks shared by the public entry points in src/api. Each failure throws attn::Error
// with a message of the form "<op>: <argument> has shape (..) but must be (..): <why>".
#pragma once

#include <string>
#include <vector>

#include "attn/config.hpp"
#include "core/view4.hpp"

namespace attn::detail {

// The dims (B, H, R, C) written the way a caller of rank 3 or 4 sees them.
inline std::vector<index_t> caller_dims(int rank, index_t B, index_t H, index_t R, index_t C) {
  if (rank == 4) return {B, H, R, C};
  return {B, R, C};
}

template <class T>
void require_shape(const TensorView<T>& t, const std::vector<index_t>& expected, const char* op, const char* name,
                   const std::string& why) {
  const auto got = t.shape();
  if (got.size() != expected.size() || !std::equal(got.begin(), got.end(), expected.begin()))
    fail(op, ": ", name, " has shape ", t.shape_string(), " but must be ", dims_string(expected), ": ", why);
}

// A required tensor argument: present, and of rank 3 or 4 equal to `rank` when rank > 0.
template <class T>
View4<T> require_tensor(const TensorView<T>& t, const char* op, const char* name, int rank) {
  if (t.empty()) fail(op, ": ", name, " is required but was not given");
  View4<T> v = to_view4(t, op, name);
  if (rank > 0 && t.rank() != rank)
    fail(op, ": ", name, " has shape ", t.shape_string(), " with ", t.rank(), " dimensions but queries has ", rank,
         "; all tensors of a call must have the same rank");
  return v;
}

// An optional tensor argument: empty, or a tensor that require_tensor accepts.
template <class T>
View4<T> optional_tensor(const TensorView<T>& t, const char* op, const char* name, int rank) {
  return t.empty() ? View4<T>{} : require_tensor(t, op, name, rank);
}

// Two tensors the kernels read and write must not share memory where the op does not allow it.
template <class A, class B>
void require_distinct(const TensorView<A>& out, const TensorView<B>& in, const char* op, const char* out_name,
                      const char* in_name) {
  if (!out.empty() && !in.empty() && static_cast<const void*>(out.data()) == static_cast<const void*>(in.data()))
    fail(op, ": ", out_name, " and ", in_name, " share memory; the output must be a separate buffer");
}

}  // namespace attn::detail

// Runs the kernel of the current backend: ref::kernel or cpu::kernel.
#define ATTN_DISPATCH(kernel, ...)                    \
  (::attn::backend() == ::attn::Backend::reference    \
       ? ::attn::ref::kernel(__VA_ARGS__)             \
       : ::attn::cpu::kernel(__VA_ARGS__))
