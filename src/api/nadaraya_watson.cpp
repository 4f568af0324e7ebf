// Public entry points of Nadaraya-Watson pooling (attn/nadaraya_watson.hpp): kernel names, the
// one place where every argument is validated, and the dispatch to the reference or cpu kernels,
// which trust what they are given.
#include "attn/nadaraya_watson.hpp"

#include <array>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "attn/diagnostics.hpp"
#include "api/checks.hpp"
#include "cpu/cpu.hpp"
#include "cpu/nw_windowed.hpp"
#include "ref/ref.hpp"

namespace attn {
namespace {

constexpr std::array<std::pair<const char*, Kernel>, 4> kKernels = {{
    {"gaussian", Kernel::gaussian},
    {"boxcar", Kernel::boxcar},
    {"epanechnikov", Kernel::epanechnikov},
    {"constant", Kernel::constant},
}};

std::string known_kernels() {
  std::string s;
  for (const auto& [name, kernel] : kKernels) s += (s.empty() ? "" : ", ") + std::string(name);
  return s;
}

// The sizes of one call, read from queries, keys and values once they passed their checks.
struct Sizes {
  int rank = 3;
  index_t B = 0, H = 0, n = 0, m = 0, p = 0, v = 0;
  // (B, [H,] R, C) the way the caller writes it.
  std::vector<index_t> dims(index_t R, index_t C) const { return detail::caller_dims(rank, B, H, R, C); }
  const char* same_batch() const {
    return rank == 4 ? "all tensors must have the batch and heads sizes of queries"
                     : "all tensors must have the batch size of queries";
  }
};

template <class T>
struct Inputs {
  View4<const T> q, k, v;
  Sizes s;
};

// An output that is given: its shape (memory is checked by require_no_aliasing).
template <class T>
View4<T> check_output(const TensorView<T>& t, const std::vector<index_t>& dims, const char* why, const char* op,
                      const char* name, const Sizes& s) {
  const View4<T> view = detail::optional_tensor(t, op, name, s.rank);
  if (!t.empty()) detail::require_shape(t, dims, op, name, why);
  return view;
}

// The checks forward and backward share: queries, keys and values (rank, batch/heads, feature
// size p, key count m), the kernel and the width sigma.
template <class T>
Inputs<T> check_inputs(const char* op, const TensorView<const T>& queries, const TensorView<const T>& keys,
                       const TensorView<const T>& values, Kernel kernel, T sigma) {
  Inputs<T> in;
  in.q = detail::require_tensor(queries, op, "queries", 0);
  Sizes& s = in.s;
  s.rank = queries.rank();
  in.k = detail::require_tensor(keys, op, "keys", s.rank);
  in.v = detail::require_tensor(values, op, "values", s.rank);
  s.B = in.q.B, s.H = in.q.H, s.n = in.q.R, s.p = in.q.C, s.m = in.k.R, s.v = in.v.C;
  // Batch and heads first, so that the later messages can speak of one size only.
  detail::require_shape(keys, s.dims(in.k.R, in.k.C), op, "keys", s.same_batch());
  detail::require_shape(keys, s.dims(s.m, s.p), op, "keys", "queries and keys must have the same feature size");
  detail::require_shape(values, s.dims(in.v.R, in.v.C), op, "values", s.same_batch());
  detail::require_shape(values, s.dims(s.m, s.v), op, "values",
                        "keys and values must have the same number of rows m (one value per key)");
  bool known = false;
  for (const auto& entry : kKernels) known = known || entry.second == kernel;
  if (!known)
    detail::fail(op, ": kernel ", static_cast<int>(kernel), " is not a Kernel; the known kernels are ",
                 known_kernels());
  if (!(sigma > 0) || !std::isfinite(sigma))
    detail::fail(op, ": width sigma is ", sigma, "; it must be positive and finite");
  return in;
}

}  // namespace

Kernel kernel_from_name(std::string_view name) {
  for (const auto& [known, kernel] : kKernels)
    if (name == known) return kernel;
  detail::fail("kernel_from_name: unknown kernel \"", name, "\"; the known kernels are ", known_kernels());
}

const char* kernel_name(Kernel kernel) {
  for (const auto& [name, known] : kKernels)
    if (kernel == known) return name;
  return "unknown";
}

// out (B,[H,]n,v) required; weights (B,[H,]n,m) optional.
template <class T>
void nadaraya_watson_forward(TensorView<T> out, TensorView<T> weights, TensorView<const T> queries,
                             TensorView<const T> keys, TensorView<const T> values, Kernel kernel, T sigma) {
  constexpr const char* op = "nadaraya_watson_forward";
  const Inputs<T> in = check_inputs(op, queries, keys, values, kernel, sigma);
  const Sizes& s = in.s;
  if (out.empty()) detail::fail(op, ": out is required but was not given");
  const View4<T> o = check_output(out, s.dims(s.n, s.v), "out holds one row of values' size v per query", op, "out", s);
  const View4<T> w = check_output(weights, s.dims(s.n, s.m), "weights holds one weight per query and key", op,
                                  "weights", s);
  detail::require_no_aliasing<T>(op, {{"out", out}, {"weights", weights}},
                                 {{"queries", queries}, {"keys", keys}, {"values", values}});
  ATTN_DISPATCH(nw_forward, o, w, in.q, in.k, in.v, kernel, sigma);
}

// dout (B,[H,]n,v) required; dqueries, dkeys, dvalues shaped like queries, keys, values, each
// optional; dsigma a scalar, optional.
template <class T>
void nadaraya_watson_backward(TensorView<T> dqueries, TensorView<T> dkeys, TensorView<T> dvalues, T* dsigma,
                              TensorView<const T> dout, TensorView<const T> queries, TensorView<const T> keys,
                              TensorView<const T> values, Kernel kernel, T sigma) {
  constexpr const char* op = "nadaraya_watson_backward";
  const Inputs<T> in = check_inputs(op, queries, keys, values, kernel, sigma);
  const Sizes& s = in.s;
  const View4<const T> d = detail::require_tensor(dout, op, "dout", s.rank);
  detail::require_shape(dout, s.dims(s.n, s.v), op, "dout", "dout has the shape of out");
  const char* why = "a gradient has the shape of what it differentiates";
  const View4<T> dq = check_output(dqueries, s.dims(s.n, s.p), why, op, "dqueries", s);
  const View4<T> dk = check_output(dkeys, s.dims(s.m, s.p), why, op, "dkeys", s);
  const View4<T> dv = check_output(dvalues, s.dims(s.m, s.v), why, op, "dvalues", s);
  detail::require_no_aliasing<T>(op, {{"dqueries", dqueries}, {"dkeys", dkeys}, {"dvalues", dvalues}},
                                 {{"dout", dout}, {"queries", queries}, {"keys", keys}, {"values", values}});
  ATTN_DISPATCH(nw_backward, dq, dk, dv, dsigma, d, in.q, in.k, in.v, kernel, sigma);
}

template <class T>
double nadaraya_watson_visited_pairs(TensorView<const T> queries, TensorView<const T> keys, Kernel kernel, T sigma) {
  const char* op = "nadaraya_watson_visited_pairs";
  return cpu::windowed::visited_pairs<T>(detail::to_view4(queries, op, "queries"), detail::to_view4(keys, op, "keys"),
                                         kernel, sigma);
}

#define ATTN_INSTANTIATE(T)                                                                                   \
  template double nadaraya_watson_visited_pairs<T>(TensorView<const T>, TensorView<const T>, Kernel, T);       \
  template void nadaraya_watson_forward<T>(TensorView<T>, TensorView<T>, TensorView<const T>,                \
                                           TensorView<const T>, TensorView<const T>, Kernel, T);             \
  template void nadaraya_watson_backward<T>(TensorView<T>, TensorView<T>, TensorView<T>, T*,                 \
                                            TensorView<const T>, TensorView<const T>, TensorView<const T>,   \
                                            TensorView<const T>, Kernel, T);
ATTN_INSTANTIATE(float)
ATTN_INSTANTIATE(double)
#undef ATTN_INSTANTIATE

}  // namespace attn
