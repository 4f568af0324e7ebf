// Public bilinear attention (attn/bilinear.hpp): argument checks and dispatch to the backend.
#include "attn/bilinear.hpp"

#include "api/qkv_checks.hpp"
#include "cpu/cpu.hpp"
#include "ref/ref.hpp"

namespace attn {
namespace {

constexpr const char* kForward = "bilinear_attention_forward";
constexpr const char* kBackward = "bilinear_attention_backward";

// W is (q, k): it maps a key into query space, so a(q, k) = q^T W k is defined for q != k.
template <class T>
std::string w_rule(const detail::QkvCall<T>& c) {
  return detail::cat("W is (q, k) with q = ", c.q, ", the last dimension of queries ", c.queries_shape, ", and k = ",
                     c.k, ", the last dimension of keys");
}

}  // namespace

template <class T>
void bilinear_attention_forward(TensorView<T> out, TensorView<T> weights, TensorView<const T> queries,
                                TensorView<const T> keys, TensorView<const T> values, TensorView<const T> w,
                                const Mask<T>& mask, const Dropout& dropout) {
  const auto c = detail::check_qkv(kForward, queries, keys, values, mask, dropout);
  const View4<const T> wv = detail::require_param(w, {c.q, c.k}, kForward, "w", w_rule(c));
  const View4<T> o = detail::require_output(out, c.dims(c.n, c.v), kForward, "out", c.rank,
                                            "out is (B, [H,] n, v) for queries (B, [H,] n, q) and values (B, [H,] m, v)");
  const View4<T> wts = detail::optional_output(weights, c.dims(c.n, c.m), kForward, "weights", c.rank,
                                               "weights is (B, [H,] n, m), one row of m key weights per query");
  detail::require_no_aliasing<T>(kForward, {{"out", out}, {"weights", weights}},
                                 {{"queries", queries}, {"keys", keys}, {"values", values}, {"w", w}});
  ATTN_DISPATCH(bilinear_forward, o, wts, c.queries, c.keys, c.values, wv, c.mask, c.dropout);
}

template <class T>
void bilinear_attention_backward(TensorView<T> dqueries, TensorView<T> dkeys, TensorView<T> dvalues, TensorView<T> dw,
                                 TensorView<const T> dout, TensorView<const T> queries, TensorView<const T> keys,
                                 TensorView<const T> values, TensorView<const T> w, const Mask<T>& mask,
                                 const Dropout& dropout) {
  const auto c = detail::check_qkv(kBackward, queries, keys, values, mask, dropout);
  const View4<const T> wv = detail::require_param(w, {c.q, c.k}, kBackward, "w", w_rule(c));
  const char* same = "a gradient has the shape of what it differentiates";
  const View4<const T> go =
      detail::require_output(dout, c.dims(c.n, c.v), kBackward, "dout", c.rank, "dout has the shape of out, (B, [H,] n, v)");
  const View4<T> dq = detail::optional_output(dqueries, c.dims(c.n, c.q), kBackward, "dqueries", c.rank, same);
  const View4<T> dk = detail::optional_output(dkeys, c.dims(c.m, c.k), kBackward, "dkeys", c.rank, same);
  const View4<T> dv = detail::optional_output(dvalues, c.dims(c.m, c.v), kBackward, "dvalues", c.rank, same);
  const View4<T> dwv = detail::require_param(dw, {c.q, c.k}, kBackward, "dw", same);
  detail::require_no_aliasing<T>(kBackward, {{"dqueries", dqueries}, {"dkeys", dkeys}, {"dvalues", dvalues}, {"dw", dw}},
                                 {{"dout", dout}, {"queries", queries}, {"keys", keys}, {"values", values}, {"w", w}});
  ATTN_DISPATCH(bilinear_backward, dq, dk, dv, dwv, go, c.queries, c.keys, c.values, wv, c.mask, c.dropout);
}

#define ATTN_INSTANTIATE(T)                                                                                        \
  template void bilinear_attention_forward<T>(TensorView<T>, TensorView<T>, TensorView<const T>, TensorView<const T>, \
                                              TensorView<const T>, TensorView<const T>, const Mask<T>&,            \
                                              const Dropout&);                                                     \
  template void bilinear_attention_backward<T>(TensorView<T>, TensorView<T>, TensorView<T>, TensorView<T>,         \
                                               TensorView<const T>, TensorView<const T>, TensorView<const T>,      \
                                               TensorView<const T>, TensorView<const T>, const Mask<T>&,          \
                                               const Dropout&);
ATTN_INSTANTIATE(float)
ATTN_INSTANTIATE(double)
#undef ATTN_INSTANTIATE

}  // namespace attn
