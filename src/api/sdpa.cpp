// Public scaled dot-product attention: argument checks, then the kernels of the current backend.
#include "attn/sdpa.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "api/checks.hpp"
#include "api/decode_rows.hpp"
#include "api/sinks.hpp"
#include "cpu/cpu.hpp"
#include "cpu/simd/fused.hpp"
#include "ref/ref.hpp"

namespace attn {
namespace {

// The checked call: the plan every kernel receives (core/sdpa_plan.hpp), the sizes, the caller's rank.
template <class T>
struct SdpaCall {
  SdpaPlan<T> plan;
  index_t B, H, Hk, n, m, d, dv;
  int rank;
};

template <class T>
SdpaCall<T> check_inputs(const TensorView<const T>& queries, const TensorView<const T>& keys,
                         const TensorView<const T>& values, const Mask<T>& mask, const SdpaOptions& options,
                         const char* op) {
  SdpaCall<T> c;
  SdpaPlan<T>& p = c.plan;
  p.q = detail::require_tensor(queries, op, "queries", 0);
  c.rank = queries.rank();
  p.k = detail::require_tensor(keys, op, "keys", c.rank);
  p.v = detail::require_tensor(values, op, "values", c.rank);
  c.B = p.q.B, c.H = p.q.H, c.n = p.q.R, c.d = p.q.C, c.m = p.k.R, c.dv = p.v.C;
  // Grouped-query attention: keys (and values) with Hk heads, H a multiple of Hk.
  c.Hk = c.rank == 4 ? p.k.H : 1;
  if (c.rank == 4 && (c.Hk == 0 ? c.H != 0 : c.H % c.Hk != 0))
    detail::fail(op, ": keys has shape ", keys.shape_string(), " with ", c.Hk, " heads but queries ",
                 queries.shape_string(), " has ", c.H, "; the query heads must be a multiple of the key heads ",
                 "(grouped-query attention: query head h reads key head h / (H / Hk))");
  p.group = c.Hk > 0 ? c.H / c.Hk : 1;
  detail::require_shape(keys, detail::caller_dims(c.rank, c.B, c.Hk, c.m, c.d), op, "keys",
                        "keys must have the batch size and last dimension d of queries " + queries.shape_string() +
                            (c.rank == 4 ? ", and H / Hk heads" : ""));
  detail::require_shape(values, detail::caller_dims(c.rank, c.B, c.Hk, c.m, c.dv), op, "values",
                        "values must have the batch size, heads and number of keys m of keys " + keys.shape_string());
  if (c.d == 0 && !options.scale)
    detail::fail(op, ": queries has shape ", queries.shape_string(), " with d = 0; the default scale 1/sqrt(d) needs d >= 1");
  const double scale = options.scale ? *options.scale : 1.0 / std::sqrt(static_cast<double>(c.d));
  if (!std::isfinite(scale)) detail::fail(op, ": scale is ", scale, "; it must be finite");
  p.scale = static_cast<T>(scale);
  if (!std::isfinite(p.scale))  // found by fuzzing: 1e300 is finite as a double, not in float32
    detail::fail(op, ": scale is ", scale, "; it must be finite in the computation's type (", sizeof(T) * 8, "-bit float)");
  if (options.softcap) {
    const double cap = *options.softcap;
    if (!(cap > 0) || !std::isfinite(cap))
      detail::fail(op, ": softcap is ", cap, "; it must be positive and finite (scores become softcap tanh(score / softcap))");
    // 1e39 is finite as a double, not in float32; 1e-46 is 0 in float32; 1e-40's inverse is not finite.
    if (!detail::softcap_fits<T>(cap))
      detail::fail(op, ": softcap is ", cap, "; it must be positive and finite in the computation's type (", sizeof(T) * 8,
                   "-bit float), and so must its inverse");
    p.softcap = static_cast<T>(cap);
  }
  p.mask = plan_mask(mask, c.B, c.H, c.n, c.m, c.rank, op);
  p.dropout = plan_dropout(options.dropout, op, c.H, /*offsets=*/true);
  return c;
}

// lse is (B, n) for 3-D calls and (B, H, n) for 4-D ones: one value per score row, as a (B, H, n, 1) view.
template <class L, class T>
View4<L> lse_view(const TensorView<L>& lse, const SdpaCall<T>& c, const char* op) {
  if (lse.empty()) return {};
  const std::vector<index_t> expected =
      c.rank == 4 ? std::vector<index_t>{c.B, c.H, c.n} : std::vector<index_t>{c.B, c.n};
  detail::require_shape(lse, expected, op, "lse", "one log-sum-exp per query row: (B, n) or (B, H, n)");
  for (int i = 0; i < lse.rank(); ++i)
    if (lse.stride(i) < 0) detail::fail(op, ": lse has stride ", lse.stride(i), " in dimension ", i, "; strides must not be negative");
  View4<L> v;
  v.data = lse.data(), v.B = c.B, v.H = c.H, v.R = c.n, v.C = 1;
  v.sB = lse.stride(0), v.sH = c.rank == 4 ? lse.stride(1) : 0, v.sR = lse.stride(-1);
  return v;
}

}  // namespace

template <class T>
void sdpa_forward(TensorView<T> out, TensorView<T> lse, TensorView<T> weights, TensorView<const T> queries,
                  TensorView<const T> keys, TensorView<const T> values, const Mask<T>& mask,
                  const SdpaOptions& options) {
  const char* op = "sdpa_forward";
  const SdpaCall<T> c = check_inputs(queries, keys, values, mask, options, op);
  const View4<T> o = detail::require_tensor(out, op, "out", c.rank);
  detail::require_shape(out, detail::caller_dims(c.rank, c.B, c.H, c.n, c.dv), op, "out",
                        "(B, n, v) from queries and values");
  const View4<T> l = lse_view(lse, c, op);
  const View4<T> w = detail::optional_tensor(weights, op, "weights", c.rank);
  if (!weights.empty())
    detail::require_shape(weights, detail::caller_dims(c.rank, c.B, c.H, c.n, c.m), op, "weights",
                          "(B, n, m) from queries and keys");
  detail::require_no_aliasing<T>(op, {{"out", out}, {"lse", lse}, {"weights", weights}},
                                 {{"queries", queries}, {"keys", keys}, {"values", values}});
  ATTN_DISPATCH_ON(c.plan.switches(), sdpa_forward<T>, o, l, w, c.plan);
}

void sdpa_forward_int8(TensorView<float> out, TensorView<float> lse, TensorView<const float> queries,
                       TensorView<const float> keys, TensorView<const float> values, const Mask<float>& mask,
                       const SdpaOptions& options) {
  const char* op = "sdpa_forward_int8";
  const SdpaCall<float> c = check_inputs(queries, keys, values, mask, options, op);
  const View4<float> o = detail::require_tensor(out, op, "out", c.rank);
  detail::require_shape(out, detail::caller_dims(c.rank, c.B, c.H, c.n, c.dv), op, "out",
                        "(B, n, v) from queries and values");
  const View4<float> l = lse_view(lse, c, op);
  detail::require_no_aliasing<float>(op, {{"out", out}, {"lse", lse}},
                                     {{"queries", queries}, {"keys", keys}, {"values", values}});
  if (c.m > cpu::fused::kMaxKeys)
    detail::fail(op, ": keys has shape ", keys.shape_string(), " with ", c.m, " rows; the int8 kernel takes at most ",
                 cpu::fused::kMaxKeys);
  if (c.d > cpu::kInt8MaxDepth)
    detail::fail(op, ": queries has shape ", queries.shape_string(), " with d = ", c.d, "; the int8 products take d <= ",
                 cpu::kInt8MaxDepth, " (their int32 sums must not overflow)");
  const cpu::Int8Refusal refused = cpu::sdpa_forward_int8(o, l, c.plan);
  if (refused.tensor != nullptr)
    detail::fail(op, ": ", refused.tensor, " holds a value that is not finite in row ", refused.row, " of batch ", refused.b,
                 c.rank == 4 ? ", head " + std::to_string(refused.h) : std::string(),
                 "; int8 quantization needs finite queries and keys (out and lse are unspecified)");
}

// A backward call's checked arguments: the inputs' plan and the kernels' views.
template <class T>
struct BackwardCall {
  SdpaCall<T> c;
  View4<const T> dout, out, lse;
  View4<T> dq, dk, dv;
};

// The checks sdpa_backward and sdpa_backward_block share (dsinks is sdpa_backward's alone).
template <class T>
BackwardCall<T> check_backward(TensorView<T> dqueries, TensorView<T> dkeys, TensorView<T> dvalues, TensorView<const T> dout,
                               TensorView<const T> queries, TensorView<const T> keys, TensorView<const T> values,
                               TensorView<const T> out, TensorView<const T> lse, const Mask<T>& mask,
                               const SdpaOptions& options, TensorView<T> dsinks, const char* op) {
  BackwardCall<T> r{check_inputs(queries, keys, values, mask, options, op), {}, {}, {}, {}, {}, {}};
  const SdpaCall<T>& c = r.c;
  const auto out_dims = detail::caller_dims(c.rank, c.B, c.H, c.n, c.dv);
  r.dout = detail::require_tensor(dout, op, "dout", c.rank);
  detail::require_shape(dout, out_dims, op, "dout", "the shape of sdpa_forward's out");
  r.out = detail::optional_tensor(out, op, "out", c.rank);
  if (!out.empty()) detail::require_shape(out, out_dims, op, "out", "sdpa_forward's out, (B, n, v)");
  r.lse = lse_view(lse, c, op);
  r.dq = detail::optional_tensor(dqueries, op, "dqueries", c.rank);
  r.dk = detail::optional_tensor(dkeys, op, "dkeys", c.rank);
  r.dv = detail::optional_tensor(dvalues, op, "dvalues", c.rank);
  if (!dqueries.empty()) detail::require_shape(dqueries, {queries.shape().begin(), queries.shape().end()}, op, "dqueries", "the shape of queries");
  if (!dkeys.empty()) detail::require_shape(dkeys, {keys.shape().begin(), keys.shape().end()}, op, "dkeys", "the shape of keys");
  if (!dvalues.empty()) detail::require_shape(dvalues, {values.shape().begin(), values.shape().end()}, op, "dvalues", "the shape of values");
  if (!dsinks.empty()) {
    if (c.plan.mask.sinks == nullptr) detail::fail(op, ": dsinks is given but the mask has no sinks");
    detail::require_shape(dsinks, {c.H}, op, "dsinks", "the shape of sinks, (H,)");
  }
  detail::require_no_aliasing<T>(op, {{"dqueries", dqueries}, {"dkeys", dkeys}, {"dvalues", dvalues}, {"dsinks", dsinks}},
                                 {{"dout", dout}, {"queries", queries}, {"keys", keys}, {"values", values}, {"out", out},
                                  {"lse", lse}});
  return r;
}

template <class T>
void sdpa_backward(TensorView<T> dqueries, TensorView<T> dkeys, TensorView<T> dvalues, TensorView<const T> dout,
                   TensorView<const T> queries, TensorView<const T> keys, TensorView<const T> values,
                   TensorView<const T> out, TensorView<const T> lse, const Mask<T>& mask,
                   const SdpaOptions& options, TensorView<T> dsinks) {
  const char* op = "sdpa_backward";
  const BackwardCall<T> call =
      check_backward(dqueries, dkeys, dvalues, dout, queries, keys, values, out, lse, mask, options, dsinks, op);
  const SdpaCall<T>& c = call.c;
  const auto out_dims = detail::caller_dims(c.rank, c.B, c.H, c.n, c.dv);
  const View4<const T> g = call.dout, o = call.out, l = call.lse;
  const View4<T> dq = call.dq, dk = call.dk, dv = call.dv;
  if (c.plan.mask.sinks == nullptr) {
    ATTN_DISPATCH_ON(c.plan.switches(), sdpa_backward<T>, dq, dk, dv, g, o, l, c.plan);
    return;
  }
  // Sinks (api/sinks.hpp): the forward's out and lse' (run again when not given), then the keys'
  // gradients as a block of a longer attention whose other block is the sink.
  const detail::PinSwitches pin(c.plan.switches());  // the forward below runs on this call's switches
  Tensor<T> own_out, own_lse;
  View4<const T> whole_out = o, whole_lse = l;
  if (o.empty() || l.empty()) {
    own_out = Tensor<T>(out_dims);
    own_lse = c.rank == 4 ? Tensor<T>({c.B, c.H, c.n}) : Tensor<T>({c.B, c.n});
    sdpa_forward<T>(own_out.view(), own_lse.view(), {}, queries, keys, values, mask, options);
    whole_out = dense_view4<const T>(own_out.data(), c.B, c.H, c.n, c.dv);
    whole_lse = dense_view4<const T>(own_lse.data(), c.B, c.H, c.n, 1);
  }
  Tensor<T> scaled({c.B, c.H, c.n, c.dv}), lse_keys({c.B, c.H, c.n});
  const View4<T> s = dense_view4(scaled.data(), c.B, c.H, c.n, c.dv), lk = dense_view4(lse_keys.data(), c.B, c.H, c.n, 1);
  const View4<T> ds = detail::require_tensor_of_rank(dsinks, op, "dsinks", 1);
  detail::sinks_backward(s, lk, g, whole_out, whole_lse, [&](index_t h) { return c.plan.mask.sink(h); },
                         [&](index_t h) -> T& { return ds.at(0, 0, 0, h); }, !ds.empty());
  SdpaPlan<T> keys_only = c.plan;  // the kernels' weights over the keys alone, from lse_keys
  keys_only.mask.sinks = nullptr;
  ATTN_DISPATCH_ON(keys_only.switches(), sdpa_backward<T>, dq, dk, dv, s, whole_out, lk, keys_only);
}

// ---- keys and values read in place as 16-bit or int8 rows (fused::KvRows) ------------------------

namespace detail {

namespace {
// The checks of sdpa_decode_rows and sdpa_forward_rows, then `run` (one of the cpu calls).
template <class Run>
void sdpa_rows(TensorView<float> out, TensorView<float> lse, TensorView<const float> queries, TensorView<const float> key_shape,
               TensorView<const float> value_shape, const Mask<float>& mask, const SdpaOptions& options, const char* op,
               const Run& run) {
  const SdpaCall<float> c = check_inputs(queries, key_shape, value_shape, mask, options, op);
  const View4<float> o = require_tensor(out, op, "out", c.rank);
  require_shape(out, caller_dims(c.rank, c.B, c.H, c.n, c.dv), op, "out", "(B, n, v) from queries and values");
  const View4<float> l = lse_view(lse, c, op);
  require_no_aliasing<float>(op, {{"out", out}, {"lse", lse}}, {{"queries", queries}});
  run(o, l, c.plan);
}
}  // namespace

void sdpa_decode_rows(TensorView<float> out, TensorView<float> lse, TensorView<const float> queries,
                      TensorView<const float> key_shape, TensorView<const float> value_shape,
                      const cpu::fused::KvRows& keys, const cpu::fused::KvRows& values, const Mask<float>& mask,
                      const SdpaOptions& options, const char* op) {
  sdpa_rows(out, lse, queries, key_shape, value_shape, mask, options, op,
            [&](View4<float> o, View4<float> l, const SdpaPlan<float>& plan) { cpu::sdpa_decode_rows(o, l, plan, keys, values); });
}

void sdpa_forward_rows(TensorView<float> out, TensorView<float> lse, TensorView<const float> queries,
                       TensorView<const float> key_shape, TensorView<const float> value_shape,
                       const cpu::fused::KvRows& keys, const cpu::fused::KvRows& values, const Mask<float>& mask,
                       const SdpaOptions& options, const char* op) {
  sdpa_rows(out, lse, queries, key_shape, value_shape, mask, options, op,
            [&](View4<float> o, View4<float> l, const SdpaPlan<float>& plan) { cpu::sdpa_forward_rows(o, l, plan, keys, values); });
}

template <Half16 H, class O>
void sdpa_forward_half(TensorView<O> out, TensorView<float> lse, TensorView<const H> queries,
                       TensorView<const H> keys, TensorView<const H> values, const Mask<float>& mask,
                       const SdpaOptions& options) {
  const char* op = "sdpa_forward";
  const SdpaCall<float> c = check_inputs(shape_view(queries), shape_view(keys), shape_view(values), mask, options, op);
  require_shape(out, caller_dims(c.rank, c.B, c.H, c.n, c.dv), op, "out", "(B, n, v) from queries and values");
  const View4<float> l = lse_view(lse, c, op);
  // The float outputs (lse, and out when float) apart from themselves, each other and the 16-bit
  // tensors: the kernel writes them while reading those. (A 16-bit out against the 16-bit inputs:
  // the caller checked.)
  const Named<H> q{"queries", queries}, k{"keys", keys}, v{"values", values};
  if constexpr (std::is_same_v<O, float>) {
    require_no_aliasing<float, H>(op, {{"out", out}, {"lse", lse}}, {q, k, v});
  } else {
    require_no_aliasing<float, H>(op, {{"lse", lse}}, {q, k, v, {"out", out}});
  }
  if (c.m > cpu::fused::kMaxKeys) fail(op, ": keys has ", c.m, " rows; the fused 16-bit kernel takes at most ", cpu::fused::kMaxKeys);
  cpu::fused::HalfViews x;
  x.type = std::is_same_v<H, bfloat16> ? cpu::fused::KvType::bf16 : cpu::fused::KvType::f16;
  x.q = require_tensor(retyped<const std::uint16_t>(queries), op, "queries", c.rank);
  x.k = require_tensor(retyped<const std::uint16_t>(keys), op, "keys", c.rank);
  x.v = require_tensor(retyped<const std::uint16_t>(values), op, "values", c.rank);
  if constexpr (std::is_same_v<O, float>) {
    x.out_float = require_tensor(out, op, "out", c.rank), x.float_out = true;
  } else {
    x.out = require_tensor(retyped<std::uint16_t>(out), op, "out", c.rank);
  }
  cpu::sdpa_forward_half(l, c.plan, x);
}
#define ATTN_INSTANTIATE(H, O)                                                                                      \
  template void sdpa_forward_half(TensorView<O>, TensorView<float>, TensorView<const H>, TensorView<const H>,       \
                                  TensorView<const H>, const Mask<float>&, const SdpaOptions&);
ATTN_INSTANTIATE(bfloat16, bfloat16)
ATTN_INSTANTIATE(float16, float16)
ATTN_INSTANTIATE(bfloat16, float)
ATTN_INSTANTIATE(float16, float)
#undef ATTN_INSTANTIATE

}  // namespace detail

// ---- score_mod and mask_mod (attn/flex.hpp): the same checks, the hook in the plan, the cpu
// backend's fused kernels whatever the backend --------------------------------------------------

namespace detail {

template <class T>
void flex_forward(TensorView<T> out, TensorView<T> lse, TensorView<const T> queries, TensorView<const T> keys,
                  TensorView<const T> values, const Mask<T>& mask, const SdpaOptions& options, const ScoreHook<T>& hook) {
  const char* op = "flex_attention_forward";
  refuse_sinks(mask, op);
  SdpaCall<T> c = check_inputs(queries, keys, values, mask, options, op);
  if (c.m > cpu::fused::kMaxKeys)
    fail(op, ": keys has ", c.m, " rows; flex attention takes at most ", cpu::fused::kMaxKeys, " keys");
  const View4<T> o = require_tensor(out, op, "out", c.rank);
  require_shape(out, caller_dims(c.rank, c.B, c.H, c.n, c.dv), op, "out", "(B, n, v) from queries and values");
  const View4<T> l = lse_view(lse, c, op);
  require_no_aliasing<T>(op, {{"out", out}, {"lse", lse}}, {{"queries", queries}, {"keys", keys}, {"values", values}});
  c.plan.hook = &hook;
  cpu::sdpa_forward<T>(o, l, {}, c.plan);
}

template <class T>
void flex_backward(TensorView<T> dqueries, TensorView<T> dkeys, TensorView<T> dvalues, TensorView<const T> dout,
                   TensorView<const T> queries, TensorView<const T> keys, TensorView<const T> values,
                   TensorView<const T> out, TensorView<const T> lse, const Mask<T>& mask, const SdpaOptions& options,
                   const ScoreHook<T>& hook) {
  const char* op = "flex_attention_backward";
  refuse_sinks(mask, op);
  SdpaCall<T> c = check_inputs(queries, keys, values, mask, options, op);
  if (c.m > cpu::fused::kMaxKeys)
    fail(op, ": keys has ", c.m, " rows; flex attention takes at most ", cpu::fused::kMaxKeys, " keys");
  const auto out_dims = caller_dims(c.rank, c.B, c.H, c.n, c.dv);
  const View4<const T> g = require_tensor(dout, op, "dout", c.rank);
  require_shape(dout, out_dims, op, "dout", "the shape of flex_attention_forward's out");
  const View4<const T> o = optional_tensor(out, op, "out", c.rank);
  if (!out.empty()) require_shape(out, out_dims, op, "out", "flex_attention_forward's out, (B, n, v)");
  const View4<const T> l = lse_view(lse, c, op);
  const View4<T> dq = optional_tensor(dqueries, op, "dqueries", c.rank);
  const View4<T> dk = optional_tensor(dkeys, op, "dkeys", c.rank);
  const View4<T> dv = optional_tensor(dvalues, op, "dvalues", c.rank);
  if (!dqueries.empty()) require_shape(dqueries, {queries.shape().begin(), queries.shape().end()}, op, "dqueries", "the shape of queries");
  if (!dkeys.empty()) require_shape(dkeys, {keys.shape().begin(), keys.shape().end()}, op, "dkeys", "the shape of keys");
  if (!dvalues.empty()) require_shape(dvalues, {values.shape().begin(), values.shape().end()}, op, "dvalues", "the shape of values");
  require_no_aliasing<T>(op, {{"dqueries", dqueries}, {"dkeys", dkeys}, {"dvalues", dvalues}},
                         {{"dout", dout}, {"queries", queries}, {"keys", keys}, {"values", values}, {"out", out},
                          {"lse", lse}});
  c.plan.hook = &hook;
  cpu::sdpa_backward<T>(dq, dk, dv, g, o, l, c.plan);
}

}  // namespace detail

// ---- keys in blocks ------------------------------------------------------------------------------

namespace {

// lse-shaped rows of out (B, [H,] n, v): what lse_view reads for a merge.
template <class T>
SdpaCall<T> rows_of(const View4<T>& out, int rank) {
  SdpaCall<T> c{};
  c.B = out.B, c.H = out.H, c.n = out.R, c.dv = out.C, c.rank = rank;
  return c;
}

}  // namespace

template <class T>
void sdpa_merge(TensorView<T> out, TensorView<T> lse, TensorView<const T> out_part, TensorView<const T> lse_part) {
  const char* op = "sdpa_merge";
  const View4<T> o = detail::require_tensor(out, op, "out", 0);
  const int rank = out.rank();
  const View4<const T> p = detail::require_tensor(out_part, op, "out_part", rank, "out");
  detail::require_shape(out_part, {out.shape().begin(), out.shape().end()}, op, "out_part", "the shape of out");
  const SdpaCall<T> rows = rows_of(o, rank);
  if (lse.empty()) detail::fail(op, ": lse is required: the log-sum-exp of each row of out");
  if (lse_part.empty()) detail::fail(op, ": lse_part is required: the log-sum-exp of each row of out_part");
  const View4<T> l = lse_view(lse, rows, op);
  const View4<const T> lp = lse_view(lse_part, rows, op);
  detail::require_no_aliasing<T>(op, {{"out", out}, {"lse", lse}}, {{"out_part", out_part}, {"lse_part", lse_part}});
  const T neg_inf = -std::numeric_limits<T>::infinity();
#pragma omp parallel for collapse(3) schedule(static) if (o.B * o.H * o.R * o.C > 65536)
  for (index_t b = 0; b < o.B; ++b)
    for (index_t h = 0; h < o.H; ++h)
      for (index_t i = 0; i < o.R; ++i) {
        const T la = l.at(b, h, i, 0), lb = lp.at(b, h, i, 0);
        T* row = o.row(b, h, i);
        const T* part = p.row(b, h, i);
        if (lb == neg_inf) continue;  // the part has no key: the row stays
        if (la == neg_inf) {          // only the part has keys
          for (index_t c = 0; c < o.C; ++c) row[c] = part[c];
          l.at(b, h, i, 0) = lb;
          continue;
        }
        const T top = std::max(la, lb), ea = std::exp(la - top), eb = std::exp(lb - top), sum = ea + eb;
        const T wa = ea / sum, wb = eb / sum;  // NaN in either lse reaches both
        for (index_t c = 0; c < o.C; ++c) row[c] = wa * row[c] + wb * part[c];
        l.at(b, h, i, 0) = top + std::log(sum);
      }
}

template <class T>
void sdpa_apply_sinks(TensorView<T> out, TensorView<T> lse, TensorView<const T> sinks) {
  const char* op = "sdpa_apply_sinks";
  const View4<T> o = detail::require_tensor(out, op, "out", 0);
  const int rank = out.rank();
  if (lse.empty()) detail::fail(op, ": lse is required: the log-sum-exp of each row of out");
  const View4<T> l = lse_view(lse, rows_of(o, rank), op);
  Mask<T> mask;
  mask.sinks = sinks;
  const MaskPlan<T> plan = plan_mask(mask, o.B, o.H, o.R, 0, rank, op);
  detail::require_no_aliasing<T>(op, {{"out", out}, {"lse", lse}}, {{"sinks", sinks}});
  detail::apply_sinks(o, l, View4<T>{}, [&](index_t h) { return plan.sink(h); });
}

template <class T>
void sdpa_sinks_backward(TensorView<T> dsinks, TensorView<const T> dout, TensorView<const T> out,
                         TensorView<const T> lse, TensorView<const T> sinks) {
  const char* op = "sdpa_sinks_backward";
  const View4<const T> o = detail::require_tensor(out, op, "out", 0);
  const int rank = out.rank();
  const View4<const T> g = detail::require_tensor(dout, op, "dout", rank, "out");
  detail::require_shape(dout, {out.shape().begin(), out.shape().end()}, op, "dout", "the shape of out");
  if (lse.empty()) detail::fail(op, ": lse is required: the log-sum-exp of each row of out, with the sinks");
  const View4<const T> l = lse_view(lse, rows_of(o, rank), op);
  Mask<T> mask;
  mask.sinks = sinks;
  const MaskPlan<T> plan = plan_mask(mask, o.B, o.H, o.R, 0, rank, op);
  if (dsinks.empty()) detail::fail(op, ": dsinks is required: (H,), the sinks' gradient");
  const View4<T> ds = detail::require_tensor_of_rank(dsinks, op, "dsinks", 1);
  detail::require_shape(dsinks, {o.H}, op, "dsinks", "the shape of sinks, (H,)");
  detail::require_no_aliasing<T>(op, {{"dsinks", dsinks}}, {{"dout", dout}, {"out", out}, {"lse", lse}, {"sinks", sinks}});
  detail::sinks_backward(View4<T>{}, View4<T>{}, g, o, l, [&](index_t h) { return plan.sink(h); },
                         [&](index_t h) -> T& { return ds.at(0, 0, 0, h); }, true);
}

template <class T>
void sdpa_backward_block(TensorView<T> dqueries, TensorView<T> dkeys, TensorView<T> dvalues, TensorView<const T> dout,
                         TensorView<const T> queries, TensorView<const T> keys, TensorView<const T> values,
                         TensorView<const T> out, TensorView<const T> lse, const Mask<T>& mask,
                         const SdpaOptions& options) {
  const char* op = "sdpa_backward_block";
  if (!mask.sinks.empty())
    detail::fail(op, ": sinks has shape ", mask.sinks.shape_string(), "; sinks belong to the whole attention, not to a ",
                 "block: leave them out of the blocks' masks, apply them once to the merged out and lse ",
                 "(sdpa_apply_sinks), and pass that out and lse here");
  if (out.empty() || lse.empty())
    detail::fail(op, ": out and lse, the whole attention's (over every block), are both required: out has shape ",
                 out.shape_string(), ", lse ", lse.shape_string());
  const BackwardCall<T> call =
      check_backward(dqueries, dkeys, dvalues, dout, queries, keys, values, out, lse, mask, options, TensorView<T>{}, op);
  SdpaPlan<T> plan = call.c.plan;  // weights exp(s - lse) from the whole attention's lse, D from its out
  plan.keys_are_a_block = true;
  ATTN_DISPATCH_ON(plan.switches(), sdpa_backward<T>, call.dq, call.dk, call.dv, call.dout, call.out, call.lse, plan);
}

template <class T>
Tensor<T> scaled_dot_product_attention(TensorView<const T> queries, TensorView<const T> keys,
                                       TensorView<const T> values, const Mask<T>& mask, const SdpaOptions& options,
                                       Tensor<T>* weights) {
  const char* op = "scaled_dot_product_attention";
  const SdpaCall<T> c = check_inputs(queries, keys, values, mask, options, op);
  Tensor<T> out(detail::caller_dims(c.rank, c.B, c.H, c.n, c.dv));
  if (weights != nullptr) *weights = Tensor<T>(detail::caller_dims(c.rank, c.B, c.H, c.n, c.m));
  sdpa_forward<T>(out.view(), {}, weights != nullptr ? weights->view() : TensorView<T>{}, queries, keys, values, mask,
                  options);
  return out;
}

#define ATTN_INSTANTIATE(T)                                                                                         \
  template void sdpa_forward(TensorView<T>, TensorView<T>, TensorView<T>, TensorView<const T>, TensorView<const T>, \
                             TensorView<const T>, const Mask<T>&, const SdpaOptions&);                              \
  template void sdpa_backward(TensorView<T>, TensorView<T>, TensorView<T>, TensorView<const T>, TensorView<const T>, \
                              TensorView<const T>, TensorView<const T>, TensorView<const T>, TensorView<const T>,   \
                              const Mask<T>&, const SdpaOptions&, TensorView<T>);                                   \
  template Tensor<T> scaled_dot_product_attention(TensorView<const T>, TensorView<const T>, TensorView<const T>,    \
                                                  const Mask<T>&, const SdpaOptions&, Tensor<T>*);                  \
  template void sdpa_merge(TensorView<T>, TensorView<T>, TensorView<const T>, TensorView<const T>);                   \
  template void sdpa_apply_sinks(TensorView<T>, TensorView<T>, TensorView<const T>);                                  \
  template void sdpa_sinks_backward(TensorView<T>, TensorView<const T>, TensorView<const T>, TensorView<const T>,      \
                                    TensorView<const T>);                                                             \
  template void sdpa_backward_block(TensorView<T>, TensorView<T>, TensorView<T>, TensorView<const T>,                 \
                                    TensorView<const T>, TensorView<const T>, TensorView<const T>,                    \
                                    TensorView<const T>, TensorView<const T>, const Mask<T>&, const SdpaOptions&);
ATTN_INSTANTIATE(float)
ATTN_INSTANTIATE(double)
#undef ATTN_INSTANTIATE

#define ATTN_INSTANTIATE(T)                                                                                        \
  template void detail::flex_forward(TensorView<T>, TensorView<T>, TensorView<const T>, TensorView<const T>,      \
                                     TensorView<const T>, const Mask<T>&, const SdpaOptions&, const ScoreHook<T>&); \
  template void detail::flex_backward(TensorView<T>, TensorView<T>, TensorView<T>, TensorView<const T>,            \
                                      TensorView<const T>, TensorView<const T>, TensorView<const T>,               \
                                      TensorView<const T>, TensorView<const T>, const Mask<T>&, const SdpaOptions&, \
                                      const ScoreHook<T>&);
ATTN_INSTANTIATE(float)
ATTN_INSTANTIATE(double)
#undef ATTN_INSTANTIATE

}  // namespace attn
