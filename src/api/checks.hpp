// Argument checks shared by the public entry points in src/api. Each failure throws attn::Error
// with a message of the form "<op>: <argument> has shape (..) but must be (..): <why>".
#pragma once

#include <cmath>
#include <cstddef>
#include <initializer_list>
#include <string>
#include <vector>

#include "attn/config.hpp"
#include "core/switch_plan.hpp"
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

// A required tensor argument: present, and of rank 3 or 4 equal to `rank` when rank > 0, the rank of
// the call's first tensor, named `like` in the message.
template <class T>
View4<T> require_tensor(const TensorView<T>& t, const char* op, const char* name, int rank,
                        const char* like = "queries") {
  if (t.empty()) fail(op, ": ", name, " is required but was not given");
  View4<T> v = to_view4(t, op, name);
  if (rank > 0 && t.rank() != rank)
    fail(op, ": ", name, " has shape ", t.shape_string(), " with ", t.rank(), " dimensions but ", like, " has ", rank,
         "; all tensors of a call must have the same rank");
  return v;
}

// An optional tensor argument: empty, or a tensor that require_tensor accepts.
template <class T>
View4<T> optional_tensor(const TensorView<T>& t, const char* op, const char* name, int rank,
                         const char* like = "queries") {
  return t.empty() ? View4<T>{} : require_tensor(t, op, name, rank, like);
}

// ---- memory: outputs never overlap themselves, each other or an input ---------------------------
// The memory of a tensor argument: its first element, element size, shape and strides (elements).
struct Footprint {
  const void* data = nullptr;
  std::size_t item = 0;
  int rank = 0;
  index_t dims[kMaxRank] = {0, 0, 0, 0};
  index_t strides[kMaxRank] = {0, 0, 0, 0};
};

template <class T>
Footprint footprint(const TensorView<T>& t) {
  Footprint f;
  f.data = t.data(), f.item = sizeof(T), f.rank = t.rank();
  for (int i = 0; i < t.rank(); ++i) f.dims[i] = t.dim(i), f.strides[i] = t.stride(i);
  return f;
}

// Whether two elements of f are the same memory (a broadcast dimension, or strides that fold one
// dimension onto another). Exact; api/overlap.cpp says how. `op` and `name` name f in the error
// thrown for a layout too large to check.
bool overlaps_itself(const Footprint& f, const char* op, const char* name);
// Whether a and b have an element in common (exact; an empty tensor has none).
bool overlap(const Footprint& a, const char* a_name, const Footprint& b, const char* b_name, const char* op);

// A named tensor argument, for the memory checks.
template <class T>
struct Named {
  const char* name;
  TensorView<const T> view;
};

// The kernels write outputs (results and gradients) from several threads while they read the
// inputs: every element of an output must have memory of its own (no broadcast), and no output may
// share memory with an input or another output. Arguments that were not given (empty views) and
// tensors without elements are never in conflict. Inputs of another element type U than the outputs'
// (a 16-bit call's float32 results) are compared byte for byte.
template <class T, class U = T>
void require_no_aliasing(const char* op, std::initializer_list<Named<T>> outputs, std::initializer_list<Named<U>> inputs) {
  for (auto o = outputs.begin(); o != outputs.end(); ++o) {
    if (o->view.empty() || o->view.numel() == 0) continue;
    for (int i = 0; i < o->view.rank(); ++i)
      if (o->view.dim(i) > 1 && o->view.stride(i) == 0)
        fail(op, ": ", o->name, " has stride 0 in dimension ", i, "; an output must not broadcast (shape ",
             o->view.shape_string(), ")");
    if (overlaps_itself(footprint(o->view), op, o->name)) {
      fail(op, ": ", o->name, " has shape ", o->view.shape_string(), " and strides ", dims_string(o->view.strides()),
           " under which two of its elements share memory; an output needs memory of its own for every element");
    }
    auto check = [&](const auto& other) {
      if (other.view.empty() || !overlap(footprint(o->view), o->name, footprint(other.view), other.name, op)) return;
      fail(op, ": ", o->name, " and ", other.name, " share memory (", o->name, " ", o->view.shape_string(), ", ",
           other.name, " ", other.view.shape_string(), "); an output must be a buffer of its own");
    };
    for (const auto& in : inputs) check(in);
    for (auto other = o + 1; other != outputs.end(); ++other) check(*other);
  }
}

// A tensor argument of a fixed rank outside (B, [H,] rows, cols), e.g. a vector (H,), as a view of
// B = H = 1 (core/view4.hpp); empty when not given.
template <class T>
View4<T> require_tensor_of_rank(const TensorView<T>& t, const char* op, const char* name, int rank) {
  return to_view4(t, op, name, rank, rank);
}

// Whether a soft-cap c serves a computation in T: positive and finite as given, and c and 1 / c
// finite and positive in T (the kernels compute c tanh(s / c) as c tanh(s (1 / c)): 1e-46 is 0 in
// float32, which read as no soft-capping, and 1e-40's inverse overflows, which made a score of 0 NaN).
template <class T>
bool softcap_fits(double cap) {
  const T narrow = static_cast<T>(cap);
  return cap > 0 && std::isfinite(cap) && std::isfinite(narrow) && narrow > 0 && std::isfinite(T(1) / narrow);
}

// Operations whose scores take no attention sinks (Mask::sinks) refuse them rather than drop them.
template <class M>
void refuse_sinks(const M& mask, const char* op) {
  if (!mask.sinks.empty())
    fail(op, ": sinks has shape ", mask.sinks.shape_string(),
         "; attention sinks are taken by scaled dot-product attention (sdpa_forward and the calls built on it), "
         "not by this operation");
}

}  // namespace attn::detail

namespace attn::detail {

// f(s) with `s` pinned on the calling thread for the call (core/switch_plan.hpp): every switch read
// under it (read_switches, cpu::simd::current) gives this one reading.
template <class F>
decltype(auto) run_pinned(const Switches& s, F&& f) {
  const PinSwitches pin(s);
  return f(s);
}

}  // namespace attn::detail

// Runs ref::kernel or cpu::kernel (which takes its unfused path under Backend::unfused) on the
// backend of a call's switches, read once (with its plan where it has one), pinned for the kernel.
#define ATTN_DISPATCH_ON(switches, kernel, ...)                                                  \
  ::attn::detail::run_pinned((switches), [&](const ::attn::detail::Switches& attn_switches_) -> decltype(auto) { \
    return attn_switches_.backend == ::attn::Backend::reference ? ::attn::ref::kernel(__VA_ARGS__)               \
                                                                : ::attn::cpu::kernel(__VA_ARGS__);              \
  })
// The same on the calling thread's switches now.
#define ATTN_DISPATCH(kernel, ...) ATTN_DISPATCH_ON(::attn::detail::read_switches(), kernel, __VA_ARGS__)
