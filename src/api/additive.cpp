// Public additive attention (attn/additive.hpp): argument checks, dispatch to the backend, and the
// nn.Linear-style initialisation of its parameters.
#include "attn/additive.hpp"

#include <cmath>

#include "api/qkv_checks.hpp"
#include "core/linear_init.hpp"
#include "cpu/cpu.hpp"
#include "ref/ref.hpp"

namespace attn {
namespace {

constexpr const char* kForward = "additive_attention_forward";
constexpr const char* kBackward = "additive_attention_backward";

// The parameters' canonical views and the hidden size h they agree on.
template <class T>
struct ParamViews {
  index_t h = 0;
  View4<const T> w_q, w_k, w_v;
};

// W_q (h, q) fixes h; W_k must be (h, k) and w_v (h,), with q and k the queries' and keys' last sizes.
template <class T>
ParamViews<T> check_params(const detail::QkvCall<T>& c, const AdditiveParams<T>& p) {
  ParamViews<T> r;
  if (p.w_q.empty()) detail::fail(c.op, ": w_q is required but was not given");
  r.h = p.w_q.rank() == 2 ? p.w_q.dim(0) : 0;
  r.w_q = detail::require_param(p.w_q, {r.h, c.q}, c.op, "w_q",
                                detail::cat("W_q is (h, q) with q = ", c.q, ", the last dimension of queries ",
                                            c.queries_shape));
  if (r.h < 1)
    detail::fail(c.op, ": w_q has shape ", p.w_q.shape_string(),
                 " but its first dimension, the hidden size h, must be at least 1");
  r.w_k = detail::require_param(p.w_k, {r.h, c.k}, c.op, "w_k",
                                detail::cat("W_k is (h, k) with h = ", r.h, " from w_q and k = ", c.k,
                                            ", the last dimension of keys"));
  r.w_v = detail::require_param(p.w_v, {r.h}, c.op, "w_v", detail::cat("w_v is (h,) with h = ", r.h, " from w_q"));
  return r;
}

}  // namespace

// Every argument is checked here, once, in the order of the signature (inputs, mask and dropout,
// parameters, outputs, aliasing); the backend's kernel then trusts the canonical views.
template <class T>
void additive_attention_forward(TensorView<T> out, TensorView<T> weights, TensorView<const T> queries,
                                TensorView<const T> keys, TensorView<const T> values, const AdditiveParams<T>& params,
                                const Mask<T>& mask, const Dropout& dropout) {
  const auto c = detail::check_qkv(kForward, queries, keys, values, mask, dropout);
  const auto p = check_params(c, params);
  const View4<T> o = detail::require_output(out, c.dims(c.n, c.v), kForward, "out", c.rank,
                                            "out is (B, [H,] n, v) for queries (B, [H,] n, q) and values (B, [H,] m, v)");
  const View4<T> w = detail::optional_output(weights, c.dims(c.n, c.m), kForward, "weights", c.rank,
                                             "weights is (B, [H,] n, m), one row of m key weights per query");
  detail::require_no_aliasing<T>(kForward, {{"out", out}, {"weights", weights}},
                                 {{"queries", queries}, {"keys", keys}, {"values", values}, {"w_q", params.w_q},
                                  {"w_k", params.w_k}, {"w_v", params.w_v}});
  ATTN_DISPATCH_ON(c.mask.switches, additive_forward, o, w, c.queries, c.keys, c.values, p.w_q, p.w_k, p.w_v, c.mask,
                   c.dropout);
}

// The forward's checks, plus dout and the gradients: those of queries, keys and values are optional
// (empty = not needed), those of the parameters required, since the kernels write them whole.
template <class T>
void additive_attention_backward(TensorView<T> dqueries, TensorView<T> dkeys, TensorView<T> dvalues,
                                 const AdditiveGrads<T>& grads, TensorView<const T> dout,
                                 TensorView<const T> queries, TensorView<const T> keys, TensorView<const T> values,
                                 const AdditiveParams<T>& params, const Mask<T>& mask, const Dropout& dropout) {
  const auto c = detail::check_qkv(kBackward, queries, keys, values, mask, dropout);
  const auto p = check_params(c, params);
  const char* same = "a gradient has the shape of what it differentiates";
  const View4<const T> go =
      detail::require_output(dout, c.dims(c.n, c.v), kBackward, "dout", c.rank, "dout has the shape of out, (B, [H,] n, v)");
  const View4<T> dq = detail::optional_output(dqueries, c.dims(c.n, c.q), kBackward, "dqueries", c.rank, same);
  const View4<T> dk = detail::optional_output(dkeys, c.dims(c.m, c.k), kBackward, "dkeys", c.rank, same);
  const View4<T> dv = detail::optional_output(dvalues, c.dims(c.m, c.v), kBackward, "dvalues", c.rank, same);
  const View4<T> dw_q = detail::require_param(grads.w_q, {p.h, c.q}, kBackward, "grads.w_q", same);
  const View4<T> dw_k = detail::require_param(grads.w_k, {p.h, c.k}, kBackward, "grads.w_k", same);
  const View4<T> dw_v = detail::require_param(grads.w_v, {p.h}, kBackward, "grads.w_v", same);
  detail::require_no_aliasing<T>(kBackward,
                                 {{"dqueries", dqueries}, {"dkeys", dkeys}, {"dvalues", dvalues},
                                  {"grads.w_q", grads.w_q}, {"grads.w_k", grads.w_k}, {"grads.w_v", grads.w_v}},
                                 {{"dout", dout}, {"queries", queries}, {"keys", keys}, {"values", values},
                                  {"w_q", params.w_q}, {"w_k", params.w_k}, {"w_v", params.w_v}});
  ATTN_DISPATCH_ON(c.mask.switches, additive_backward, dq, dk, dv, dw_q, dw_k, dw_v, go, c.queries, c.keys, c.values,
                   p.w_q, p.w_k, p.w_v, c.mask, c.dropout);
}

// ---- initialisation ----------------------------------------------------------------------------

// Keeps these counters apart from dropout's and the other layers' ("ADDV").
constexpr std::uint32_t kInitTag = 0x41444456;

template <class T>
AdditiveWeights<T> AdditiveWeights<T>::init(index_t query_size, index_t key_size, index_t hidden_size,
                                            std::uint64_t seed) {
  const char* op = "AdditiveWeights::init";
  if (query_size < 1) detail::fail(op, ": query_size is ", query_size, "; it must be at least 1");
  if (key_size < 1) detail::fail(op, ": key_size is ", key_size, "; it must be at least 1");
  if (hidden_size < 1) detail::fail(op, ": hidden_size is ", hidden_size, "; it must be at least 1");
  AdditiveWeights w{Tensor<T>{hidden_size, query_size}, Tensor<T>{hidden_size, key_size}, Tensor<T>{hidden_size}};
  // nn.Linear(fan_in, fan_out) draws its weight from U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
  detail::fill_uniform(w.w_q, 1.0 / std::sqrt(static_cast<double>(query_size)), seed, 0, kInitTag);
  detail::fill_uniform(w.w_k, 1.0 / std::sqrt(static_cast<double>(key_size)), seed, 1, kInitTag);
  detail::fill_uniform(w.w_v, 1.0 / std::sqrt(static_cast<double>(hidden_size)), seed, 2, kInitTag);
  return w;
}

// The public templates exist for float and double.
#define ATTN_INSTANTIATE(T)                                                                                      \
  template struct AdditiveWeights<T>;                                                                            \
  template void additive_attention_forward<T>(TensorView<T>, TensorView<T>, TensorView<const T>,                 \
                                              TensorView<const T>, TensorView<const T>, const AdditiveParams<T>&, \
                                              const Mask<T>&, const Dropout&);                                   \
  template void additive_attention_backward<T>(TensorView<T>, TensorView<T>, TensorView<T>, const AdditiveGrads<T>&, \
                                               TensorView<const T>, TensorView<const T>, TensorView<const T>,    \
                                               TensorView<const T>, const AdditiveParams<T>&, const Mask<T>&,   \
                                               const Dropout&);
ATTN_INSTANTIATE(float)
ATTN_INSTANTIATE(double)
#undef ATTN_INSTANTIATE

}  // namespace attn
