// Multi-head attention (attn/multi_head.hpp): every argument checked here, once; then the
// projections (the backend's linear kernels) and scaled dot-product attention on strided views of
// them, each head a column block of the projections.
#include "attn/multi_head.hpp"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "api/checks.hpp"
#include "core/linear_init.hpp"
#include "cpu/cpu.hpp"
#include "cpu/scratch.hpp"
#include "ref/ref.hpp"

namespace attn {
namespace {

// The checked sizes of one call and the canonical views of its parameters.
template <class T>
struct Layer {
  index_t B = 0, n = 0, m = 0, q = 0, k = 0, vin = 0, D = 0, H = 0, Hk = 0, dh = 0;
  bool bias = false;
  View4<const T> w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o;
};

template <class T>
View4<const T> param(const TensorView<const T>& t, std::vector<index_t> shape, const char* op, const char* name,
                     const std::string& why) {
  if (t.empty()) detail::fail(op, ": ", name, " is required but was not given");
  const int rank = static_cast<int>(shape.size());
  View4<const T> v = detail::to_view4(t, op, name, rank, rank);
  detail::require_shape(t, shape, op, name, why);
  return v;
}

template <class T>
Layer<T> check_layer(const char* op, const TensorView<const T>& queries, const TensorView<const T>& keys,
                     const TensorView<const T>& values, const MultiHeadParams<T>& p, const MultiHeadConfig& config) {
  Layer<T> L;
  for (const auto& [t, name] : {std::pair{&queries, "queries"}, std::pair{&keys, "keys"}, std::pair{&values, "values"}}) {
    if (t->empty()) detail::fail(op, ": ", name, " is required but was not given");
    detail::to_view4(*t, op, name, 3, 3);
  }
  L.B = queries.dim(0), L.n = queries.dim(1), L.q = queries.dim(2);
  L.m = keys.dim(1), L.k = keys.dim(2), L.vin = values.dim(2);
  detail::require_shape(keys, {L.B, L.m, L.k}, op, "keys", "keys must have the batch size of queries " + queries.shape_string());
  detail::require_shape(values, {L.B, L.m, L.vin}, op, "values",
                        "values must have the batch size and number of rows m of keys " + keys.shape_string());
  L.H = config.num_heads;
  L.Hk = config.num_kv_heads == 0 ? L.H : config.num_kv_heads;
  if (L.H < 1) detail::fail(op, ": num_heads is ", L.H, "; it must be at least 1");
  if (L.Hk < 1 || L.H % L.Hk != 0)
    detail::fail(op, ": num_kv_heads is ", L.Hk, "; it must divide num_heads = ", L.H, " (query head h reads key and "
                 "value head h / (num_heads / num_kv_heads))");
  if (p.w_q.empty() || p.w_q.rank() != 2) detail::fail(op, ": w_q is required as a matrix (num_hiddens, query_size)");
  L.D = p.w_q.dim(0);
  if (L.D % L.H != 0)
    detail::fail(op, ": w_q has shape ", p.w_q.shape_string(), ": num_hiddens = ", L.D, " is not a multiple of num_heads = ",
                 L.H, "; each head takes num_hiddens / num_heads columns");
  L.dh = L.D / L.H;
  const index_t kv = L.Hk * L.dh;
  L.w_q = param(p.w_q, {L.D, L.q}, op, "w_q", "(num_hiddens, query_size)");
  L.w_k = param(p.w_k, {kv, L.k}, op, "w_k", "(num_kv_heads * num_hiddens / num_heads, key_size)");
  L.w_v = param(p.w_v, {kv, L.vin}, op, "w_v", "(num_kv_heads * num_hiddens / num_heads, value_size)");
  L.w_o = param(p.w_o, {L.D, L.D}, op, "w_o", "(num_hiddens, num_hiddens)");
  const int biases = !p.b_q.empty() + !p.b_k.empty() + !p.b_v.empty() + !p.b_o.empty();
  if (biases != 0 && biases != 4)
    detail::fail(op, ": ", biases, " of the 4 biases b_q, b_k, b_v, b_o are given; give all of them or none");
  L.bias = biases == 4;
  if (L.bias) {
    L.b_q = param(p.b_q, {L.D}, op, "b_q", "(num_hiddens,)");
    L.b_k = param(p.b_k, {kv}, op, "b_k", "(num_kv_heads * num_hiddens / num_heads,)");
    L.b_v = param(p.b_v, {kv}, op, "b_v", "(num_kv_heads * num_hiddens / num_heads,)");
    L.b_o = param(p.b_o, {L.D}, op, "b_o", "(num_hiddens,)");
  }
  return L;
}

// A (B, R, heads * dh) projection seen as (B, heads, R, dh): head j is columns [j dh, (j + 1) dh).
template <class T>
TensorView<T> heads_view(T* data, index_t B, index_t R, index_t heads, index_t dh) {
  return TensorView<T>(data, {B, heads, R, dh}, {R * heads * dh, dh, heads * dh, 1});
}

// A (B, R, C) tensor as the kernels' (B, 1, R, C) view.
template <class T>
View4<T> rows_view(Tensor<T>& t) { return dense_view4(t.data(), t.dim(0), 1, t.dim(1), t.dim(2)); }
template <class T>
View4<const T> rows_view(const Tensor<T>& t) { return dense_view4(t.data(), t.dim(0), 1, t.dim(1), t.dim(2)); }
template <class T>
View4<const T> rows_view(const TensorView<const T>& t) {
  return detail::to_view4(t, "multi_head_attention", "input", 3, 3);
}

// The backward's intermediate gradients: dheads (B, n, D), dQ (B, n, D), dK and dV (B, m, Hk dh).
template <class T>
struct BackwardArrays {
  T *dheads, *dqp, *dkp, *dvp;
  BackwardArrays(cpu::Carve& c, const Layer<T>& L)
      : dheads(c.take<T>(static_cast<std::size_t>(L.B * L.n * L.D))), dqp(c.take<T>(static_cast<std::size_t>(L.B * L.n * L.D))),
        dkp(c.take<T>(static_cast<std::size_t>(L.B * L.m * L.Hk * L.dh))),
        dvp(c.take<T>(static_cast<std::size_t>(L.B * L.m * L.Hk * L.dh))) {}
};

template <class T>
void require_state(const MultiHeadState<T>& s, const Layer<T>& L, const char* op) {
  const std::string why = "the state of the forward of the same inputs, parameters and config";
  detail::require_shape(s.q.cview(), {L.B, L.n, L.D}, op, "state.q", why);
  detail::require_shape(s.k.cview(), {L.B, L.m, L.Hk * L.dh}, op, "state.k", why);
  detail::require_shape(s.v.cview(), {L.B, L.m, L.Hk * L.dh}, op, "state.v", why);
  detail::require_shape(s.heads.cview(), {L.B, L.n, L.D}, op, "state.heads", why);
  detail::require_shape(s.lse.cview(), {L.B, L.H, L.n}, op, "state.lse", why);
}

}  // namespace

template <class T>
MultiHeadParams<T> MultiHeadWeights<T>::params() const {
  MultiHeadParams<T> p{w_q.view(), w_k.view(), w_v.view(), w_o.view(), {}, {}, {}, {}};
  if (bias()) p.b_q = b_q.view(), p.b_k = b_k.view(), p.b_v = b_v.view(), p.b_o = b_o.view();
  return p;
}

template <class T>
MultiHeadWeights<T> MultiHeadWeights<T>::init(index_t query_size, index_t key_size, index_t value_size,
                                              index_t num_hiddens, const MultiHeadConfig& config, bool bias,
                                              std::uint64_t seed) {
  const char* op = "MultiHeadWeights::init";
  for (const auto& [size, name] : {std::pair{query_size, "query_size"}, std::pair{key_size, "key_size"},
                                   std::pair{value_size, "value_size"}, std::pair{num_hiddens, "num_hiddens"}})
    if (size < 1) detail::fail(op, ": ", name, " is ", size, "; it must be at least 1");
  const index_t H = config.num_heads, Hk = config.num_kv_heads == 0 ? H : config.num_kv_heads;
  if (H < 1 || num_hiddens % H != 0)
    detail::fail(op, ": num_heads is ", H, "; it must be at least 1 and divide num_hiddens = ", num_hiddens);
  if (Hk < 1 || H % Hk != 0) detail::fail(op, ": num_kv_heads is ", Hk, "; it must divide num_heads = ", H);
  const index_t kv = Hk * (num_hiddens / H);
  constexpr std::uint32_t kTag = 0x4D484154;  // "MHAT": apart from dropout's and the other layers' counters
  MultiHeadWeights w;
  w.w_q = Tensor<T>{num_hiddens, query_size}, w.w_k = Tensor<T>{kv, key_size}, w.w_v = Tensor<T>{kv, value_size};
  w.w_o = Tensor<T>{num_hiddens, num_hiddens};
  const std::pair<Tensor<T>*, index_t> weights[] = {{&w.w_q, query_size}, {&w.w_k, key_size}, {&w.w_v, value_size},
                                                    {&w.w_o, num_hiddens}};
  std::uint32_t stream = 0;
  for (const auto& [t, fan_in] : weights)
    detail::fill_uniform(*t, 1.0 / std::sqrt(static_cast<double>(fan_in)), seed, stream++, kTag);
  if (bias) {
    w.b_q = Tensor<T>{num_hiddens}, w.b_k = Tensor<T>{kv}, w.b_v = Tensor<T>{kv}, w.b_o = Tensor<T>{num_hiddens};
    const std::pair<Tensor<T>*, index_t> biases[] = {{&w.b_q, query_size}, {&w.b_k, key_size}, {&w.b_v, value_size},
                                                     {&w.b_o, num_hiddens}};
    for (const auto& [t, fan_in] : biases)
      detail::fill_uniform(*t, 1.0 / std::sqrt(static_cast<double>(fan_in)), seed, stream++, kTag);
  }
  return w;
}

template <class T>
void multi_head_attention_forward(TensorView<T> out, MultiHeadState<T>* state, TensorView<const T> queries,
                                  TensorView<const T> keys, TensorView<const T> values,
                                  const MultiHeadParams<T>& params, const MultiHeadConfig& config,
                                  const Mask<T>& mask, const SdpaOptions& options) {
  const char* op = "multi_head_attention_forward";
  const Layer<T> L = check_layer(op, queries, keys, values, params, config);
  const View4<T> o = detail::require_tensor(out, op, "out", 3);
  detail::require_shape(out, {L.B, L.n, L.D}, op, "out", "(B, n, num_hiddens)");
  detail::require_no_aliasing<T>(op, {{"out", out}},
                                 {{"queries", queries}, {"keys", keys}, {"values", values}, {"w_q", params.w_q},
                                  {"w_k", params.w_k}, {"w_v", params.w_v}, {"w_o", params.w_o}});
  MultiHeadState<T> own;
  MultiHeadState<T>& s = state != nullptr ? *state : own;
  // The state's tensors, kept when a training loop hands back a state of the same shapes (fresh ones
  // cost a page fault per 4 KiB, and their zeros, every step); every element is written below.
  const auto shaped = [](Tensor<T>& t, std::initializer_list<index_t> dims) {
    if (!std::equal(t.shape().begin(), t.shape().end(), dims.begin(), dims.end())) t = Tensor<T>(dims);
  };
  shaped(s.q, {L.B, L.n, L.D}), shaped(s.k, {L.B, L.m, L.Hk * L.dh}), shaped(s.v, {L.B, L.m, L.Hk * L.dh});
  shaped(s.heads, {L.B, L.n, L.D}), shaped(s.lse, {L.B, L.H, L.n});
  ATTN_DISPATCH(linear_forward<T>, rows_view(s.q), rows_view(queries), L.w_q, L.b_q);
  ATTN_DISPATCH(linear_forward<T>, rows_view(s.k), rows_view(keys), L.w_k, L.b_k);
  ATTN_DISPATCH(linear_forward<T>, rows_view(s.v), rows_view(values), L.w_v, L.b_v);
  sdpa_forward<T>(heads_view(s.heads.data(), L.B, L.n, L.H, L.dh), s.lse.view(), {},
                  heads_view<const T>(s.q.data(), L.B, L.n, L.H, L.dh), heads_view<const T>(s.k.data(), L.B, L.m, L.Hk, L.dh),
                  heads_view<const T>(s.v.data(), L.B, L.m, L.Hk, L.dh), mask, options);
  ATTN_DISPATCH(linear_forward<T>, o, rows_view(std::as_const(s.heads)), L.w_o, L.b_o);
}

template <class T>
void multi_head_attention_backward(TensorView<T> dqueries, TensorView<T> dkeys, TensorView<T> dvalues,
                                   const MultiHeadGrads<T>& grads, TensorView<const T> dout,
                                   TensorView<const T> queries, TensorView<const T> keys, TensorView<const T> values,
                                   const MultiHeadParams<T>& params, const MultiHeadConfig& config,
                                   const MultiHeadState<T>& state, const Mask<T>& mask, const SdpaOptions& options) {
  const char* op = "multi_head_attention_backward";
  const Layer<T> L = check_layer(op, queries, keys, values, params, config);
  const View4<const T> g = detail::require_tensor(dout, op, "dout", 3);
  detail::require_shape(dout, {L.B, L.n, L.D}, op, "dout", "the shape of out, (B, n, num_hiddens)");
  require_state(state, L, op);
  const char* same = "a gradient has the shape of what it differentiates";
  auto optional = [&](const TensorView<T>& t, const TensorView<const T>& like, const char* name) {
    const View4<T> v = detail::optional_tensor(t, op, name, 3);
    if (!t.empty()) detail::require_shape(t, {like.shape().begin(), like.shape().end()}, op, name, same);
    return v;
  };
  const View4<T> dq = optional(dqueries, queries, "dqueries"), dk = optional(dkeys, keys, "dkeys"),
                 dv = optional(dvalues, values, "dvalues");
  auto required = [&](const TensorView<T>& t, const TensorView<const T>& like, const char* name) {
    if (t.empty()) detail::fail(op, ": ", name, " is required but was not given");
    const int rank = like.rank();
    const View4<T> v = detail::to_view4(t, op, name, rank, rank);
    detail::require_shape(t, {like.shape().begin(), like.shape().end()}, op, name, same);
    return v;
  };
  const View4<T> dw_q = required(grads.w_q, params.w_q, "grads.w_q"), dw_k = required(grads.w_k, params.w_k, "grads.w_k");
  const View4<T> dw_v = required(grads.w_v, params.w_v, "grads.w_v"), dw_o = required(grads.w_o, params.w_o, "grads.w_o");
  View4<T> db_q, db_k, db_v, db_o;
  if (L.bias) {
    db_q = required(grads.b_q, params.b_q, "grads.b_q"), db_k = required(grads.b_k, params.b_k, "grads.b_k");
    db_v = required(grads.b_v, params.b_v, "grads.b_v"), db_o = required(grads.b_o, params.b_o, "grads.b_o");
  }
  detail::require_no_aliasing<T>(
      op,
      {{"dqueries", dqueries}, {"dkeys", dkeys}, {"dvalues", dvalues}, {"grads.w_q", grads.w_q},
       {"grads.w_k", grads.w_k}, {"grads.w_v", grads.w_v}, {"grads.w_o", grads.w_o}, {"grads.b_q", grads.b_q},
       {"grads.b_k", grads.b_k}, {"grads.b_v", grads.b_v}, {"grads.b_o", grads.b_o}},
      {{"dout", dout}, {"queries", queries}, {"keys", keys}, {"values", values}, {"w_q", params.w_q},
       {"w_k", params.w_k}, {"w_v", params.w_v}, {"w_o", params.w_o}});
  // out = heads W_o^T + b_o  =>  dheads = dout W_o, dW_o = dout^T heads, db_o = sum of dout.
  // dheads, dQ, dK and dV in the calling thread's scratch (reused from call to call, so a training
  // step touches no fresh pages); every element is written before it is read.
  cpu::Scratch<BackwardArrays<T>> scratch(L);
  T *dheads = scratch->dheads, *dqp = scratch->dqp, *dkp = scratch->dkp, *dvp = scratch->dvp;
  const auto rows = [](T* data, index_t B, index_t R, index_t C) { return dense_view4(data, B, 1, R, C); };
  const index_t kv = L.Hk * L.dh;
  ATTN_DISPATCH(linear_backward<T>, rows(dheads, L.B, L.n, L.D), dw_o, db_o, g, rows_view(state.heads), L.w_o);
  // The heads' attention, on the same strided views as the forward, with its out and lse.
  sdpa_backward<T>(heads_view(dqp, L.B, L.n, L.H, L.dh), heads_view(dkp, L.B, L.m, L.Hk, L.dh),
                   heads_view(dvp, L.B, L.m, L.Hk, L.dh), heads_view<const T>(dheads, L.B, L.n, L.H, L.dh),
                   heads_view<const T>(state.q.data(), L.B, L.n, L.H, L.dh),
                   heads_view<const T>(state.k.data(), L.B, L.m, L.Hk, L.dh),
                   heads_view<const T>(state.v.data(), L.B, L.m, L.Hk, L.dh),
                   heads_view<const T>(state.heads.data(), L.B, L.n, L.H, L.dh), state.lse.cview(), mask, options);
  // Q = queries W_q^T + b_q  =>  dqueries = dQ W_q, dW_q = dQ^T queries, db_q = sum of dQ; K, V alike.
  ATTN_DISPATCH(linear_backward<T>, dq, dw_q, db_q, View4<const T>(rows(dqp, L.B, L.n, L.D)), rows_view(queries), L.w_q);
  ATTN_DISPATCH(linear_backward<T>, dk, dw_k, db_k, View4<const T>(rows(dkp, L.B, L.m, kv)), rows_view(keys), L.w_k);
  ATTN_DISPATCH(linear_backward<T>, dv, dw_v, db_v, View4<const T>(rows(dvp, L.B, L.m, kv)), rows_view(values), L.w_v);
}

template <class T>
void multi_head_attention_weights(TensorView<T> weights, const MultiHeadState<T>& state,
                                  const MultiHeadConfig& config, const Mask<T>& mask, const SdpaOptions& options) {
  const char* op = "multi_head_attention_weights";
  const index_t H = config.num_heads, Hk = config.num_kv_heads == 0 ? H : config.num_kv_heads;
  if (H < 1) detail::fail(op, ": num_heads is ", H, "; it must be at least 1");
  if (Hk < 1 || H % Hk != 0) detail::fail(op, ": num_kv_heads is ", Hk, "; it must divide num_heads = ", H);
  if (state.q.rank() != 3 || state.q.dim(2) % H != 0)
    detail::fail(op, ": state.q has shape ", state.q.shape_string(), "; it must be the forward's (B, n, num_hiddens), ",
                 "num_hiddens a multiple of num_heads = ", H);
  const index_t B = state.q.dim(0), n = state.q.dim(1), dh = state.q.dim(2) / H;
  if (state.k.rank() != 3) detail::fail(op, ": state.k has shape ", state.k.shape_string(), "; it must be (B, m, ", Hk * dh, ")");
  const index_t m = state.k.dim(1);
  const std::string why = "the state of a forward with the same config";
  detail::require_shape(state.k.cview(), {B, m, Hk * dh}, op, "state.k", why);
  detail::require_shape(state.v.cview(), {B, m, Hk * dh}, op, "state.v", why);
  detail::require_tensor_of_rank(weights, op, "weights", 4);
  detail::require_shape(weights, {B, H, n, m}, op, "weights", "(B, num_heads, n, m)");
  SdpaOptions no_dropout = options;
  no_dropout.dropout = {};
  Tensor<T> heads({B, H, n, dh});  // the heads' outputs again, not returned
  sdpa_forward<T>(heads.view(), {}, weights, heads_view<const T>(state.q.data(), B, n, H, dh),
                  heads_view<const T>(state.k.data(), B, m, Hk, dh), heads_view<const T>(state.v.data(), B, m, Hk, dh),
                  mask, no_dropout);
}

#define ATTN_INSTANTIATE(T)                                                                                          \
  template struct MultiHeadWeights<T>;                                                                               \
  template void multi_head_attention_forward<T>(TensorView<T>, MultiHeadState<T>*, TensorView<const T>,              \
                                                TensorView<const T>, TensorView<const T>, const MultiHeadParams<T>&, \
                                                const MultiHeadConfig&, const Mask<T>&, const SdpaOptions&);         \
  template void multi_head_attention_backward<T>(TensorView<T>, TensorView<T>, TensorView<T>, const MultiHeadGrads<T>&, \
                                                 TensorView<const T>, TensorView<const T>, TensorView<const T>,      \
                                                 TensorView<const T>, const MultiHeadParams<T>&,                     \
                                                 const MultiHeadConfig&, const MultiHeadState<T>&, const Mask<T>&,   \
                                                 const SdpaOptions&);                                \
  template void multi_head_attention_weights<T>(TensorView<T>, const MultiHeadState<T>&, const MultiHeadConfig&,     \
                                                const Mask<T>&, const SdpaOptions&);
ATTN_INSTANTIATE(float)
ATTN_INSTANTIATE(double)
#undef ATTN_INSTANTIATE

}  // namespace attn
