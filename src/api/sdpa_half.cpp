// 16-bit scaled dot-product attention (attn/sdpa.hpp). The forward on the cpu backend runs the fused
// 16-bit kernels over the tensors in place (cpu::sdpa_forward_half), and decoding reads 16-bit keys
// and values in place; the rest (the backward, other backends) widens the 16-bit tensors to float32
// (SIMD conversions, attn/half.hpp), makes the float32 call and rounds its results once to the
// 16-bit type. Every path checks its arguments as the float32 call does; the caller's 16-bit outputs
// lend it their shapes, so a wrong one is named as in float32.
#include <array>
#include <vector>

#include "api/checks.hpp"
#include "api/decode_rows.hpp"
#include "attn/error.hpp"
#include "attn/sdpa.hpp"
#include "core/switch_plan.hpp"
#include "core/view4.hpp"
#include "cpu/scratch.hpp"

namespace attn {
namespace {

// Calls f(row, width) for every last-axis row of t (any strides): row points at its first element.
// A contiguous t is one row of all its elements.
template <class T, class F>
void for_each_row(const TensorView<T>& t, F f) {
  if (t.numel() == 0) return;
  const int r = t.rank();
  bool contiguous = true;
  for (index_t a = r - 1, expected = 1; a >= 0; expected *= t.dim(static_cast<int>(a)), --a)
    contiguous = contiguous && (t.dim(static_cast<int>(a)) == 1 || t.stride(static_cast<int>(a)) == expected);
  if (contiguous) return f(t.data(), t.numel());
  const index_t width = r == 0 ? 1 : t.dim(r - 1);
  index_t rows = 1;
  for (int a = 0; a + 1 < r; ++a) rows *= t.dim(a);
  for (index_t row = 0; row < rows; ++row) {
    index_t offset = 0, rest = row;
    for (int a = r - 2; a >= 0; --a) {
      offset += rest % t.dim(a) * t.stride(a);
      rest /= t.dim(a);
    }
    f(t.data() + offset, width);
  }
}

// float32 copies of a call's 16-bit tensors and buffers for its float32 results: N arrays of the
// given numbers of elements (0 for a tensor the call does not widen), laid out in one frame of the
// calling thread's scratch arena (cpu/scratch.hpp), reused from call to call, so a call touches no
// fresh pages (a fresh tensor's first touch cost a 16-bit forward a fifth of its time here).
template <std::size_t N>
struct WideArrays {
  std::array<float*, N> at{};
  WideArrays(cpu::Carve& c, const std::array<index_t, N>& sizes) {
    for (std::size_t i = 0; i < N; ++i) at[i] = c.take<float>(static_cast<std::size_t>(sizes[i]));
  }
};

// A contiguous float32 copy of t in `wide` (its elements; empty for an empty view).
template <class H>
TensorView<const float> widen(TensorView<const H> t, float* wide, const char* name) {
  if (t.empty()) return {};
  if (t.data() == nullptr && t.numel() > 0) detail::fail("sdpa (16-bit): ", name, " has shape ", t.shape_string(), " but no data");
  float* to = wide;
  for_each_row(t, [&](const H* row, index_t width) {
    convert(std::span<const H>(row, static_cast<std::size_t>(width)), std::span<float>(to, static_cast<std::size_t>(width)));
    to += width;
  });
  return TensorView<const float>(wide, t.shape());
}

// A float32 result of t's shape in `wide` (its elements; empty for an empty view).
template <class H>
TensorView<float> like(const TensorView<H>& t, float* wide) {
  if (t.empty()) return {};
  return TensorView<float>(wide, t.shape());
}

template <class V>
index_t elements(const V& t) {
  return t.empty() ? 0 : t.numel();
}

// The caller's 16-bit tensor (any strides) from a contiguous float32 result of its shape.
template <class H>
void narrow(TensorView<const float> wide, TensorView<H> t, const char* name) {
  if (t.empty()) return;  // a gradient not asked for
  if (t.data() == nullptr && t.numel() > 0) detail::fail("sdpa (16-bit): ", name, " has shape ", t.shape_string(), " but no data");
  const float* from = wide.data();
  for_each_row(t, [&](H* row, index_t width) {
    convert(std::span<const float>(from, static_cast<std::size_t>(width)), std::span<H>(row, static_cast<std::size_t>(width)));
    from += width;
  });
}

// A 16-bit tensor (B, m, c) or (B, Hk, m, c) as the decode path's rows.
template <class H>
cpu::fused::KvRows rows_of(const TensorView<const H>& t) {
  cpu::fused::KvRows r;
  r.type = std::is_same_v<H, bfloat16> ? cpu::fused::KvType::bf16 : cpu::fused::KvType::f16;
  r.data = t.data();
  const bool heads = t.rank() == 4;
  r.sB = t.stride(0), r.sH = heads ? t.stride(1) : 0, r.sR = t.stride(heads ? 2 : 1);
  return r;
}

// Whether the decode path reads the 16-bit keys and values in place: n queries per head, few, on the
// cpu backend.
bool decodes_in_place(index_t n, const detail::Switches& sw) {
  return sw.backend == Backend::cpu && n > 0 && n <= cpu::fused::kDecodeRows;
}

// The layout checks of every tensor argument (core/view4.hpp: rank, non-negative strides that fit
// in 64 bits, a contiguous last dimension) and of the outputs' memory (api/checks.hpp), made on the
// 16-bit tensors before they are widened or narrowed through their strides (found by fuzzing: a
// last stride of 0 was read as contiguous, an overflowing stride crashed the widening).
template <class H>
void check_layouts(const char* op, std::initializer_list<detail::Named<H>> outputs,
                   std::initializer_list<detail::Named<H>> inputs) {
  for (const auto* list : {&outputs, &inputs})
    for (const detail::Named<H>& t : *list) detail::to_view4(t.view, op, t.name);
  detail::require_no_aliasing(op, outputs, inputs);
}

// The 16-bit forward, out in H (rounded once) or float (before that rounding).
template <Half16 H, class O>
void forward_16(TensorView<O> out, TensorView<float> lse, TensorView<const H> queries, TensorView<const H> keys,
                TensorView<const H> values, const Mask<float>& mask, const SdpaOptions& options) {
  constexpr bool kFloatOut = std::is_same_v<O, float>;
  // The switches, read once: the float32 calls below (and their plans) run on the same ones.
  const detail::Switches sw = detail::read_switches();
  const detail::PinSwitches pin(sw);
  if constexpr (kFloatOut) {
    check_layouts<H>("sdpa_forward", {}, {{"queries", queries}, {"keys", keys}, {"values", values}});
    detail::to_view4(TensorView<const float>(out), "sdpa_forward", "out");
    detail::require_no_aliasing<float, H>("sdpa_forward", {{"out", out}},
                                          {{"queries", queries}, {"keys", keys}, {"values", values}});
  } else {
    check_layouts<H>("sdpa_forward", {{"out", out}}, {{"queries", queries}, {"keys", keys}, {"values", values}});
  }
  // The fused 16-bit kernels read the tensors in place (cpu::sdpa_forward_half); decoding reads the
  // keys and values in place too (below). The unfused and reference backends, and more keys than the
  // fused kernels index, take the float32 call.
  const index_t n = queries.rank() >= 3 ? queries.dim(-2) : 0, m = keys.rank() >= 3 ? keys.dim(-2) : 0;
  if (sw.backend == Backend::cpu && n > cpu::fused::kDecodeRows && m <= cpu::fused::kMaxKeys)
    return detail::sdpa_forward_half(out, lse, queries, keys, values, mask, options);
  const bool in_place = decodes_in_place(n, sw);
  // queries, out (a 16-bit out only), keys and values (unless read in place)
  cpu::Scratch<WideArrays<4>> wide(std::array<index_t, 4>{elements(queries), kFloatOut ? 0 : elements(out),
                                                          in_place ? 0 : elements(keys), in_place ? 0 : elements(values)});
  const TensorView<const float> q = widen(queries, wide->at[0], "queries");
  TensorView<float> o;
  if constexpr (kFloatOut) {
    o = out;
  } else {
    o = like(out, wide->at[1]);
  }
  if (in_place) {  // the queries widened, the keys and values read in place
    sdpa_forward<H>(o, lse, q, keys, values, mask, options);
  } else {
    sdpa_forward<float>(o, lse, {}, q, widen(keys, wide->at[2], "keys"), widen(values, wide->at[3], "values"), mask,
                        options);
  }
  if constexpr (!kFloatOut) narrow(TensorView<const float>(o), out, "out");
}

}  // namespace

template <Half16 H>
void sdpa_forward(TensorView<H> out, TensorView<float> lse, TensorView<const H> queries, TensorView<const H> keys,
                  TensorView<const H> values, const Mask<float>& mask, const SdpaOptions& options) {
  forward_16(out, lse, queries, keys, values, mask, options);
}

template <Half16 H>
void sdpa_forward(TensorView<float> out, TensorView<float> lse, TensorView<const H> queries, TensorView<const H> keys,
                  TensorView<const H> values, const Mask<float>& mask, const SdpaOptions& options) {
  forward_16(out, lse, queries, keys, values, mask, options);
}

template <Half16 H>
void sdpa_forward(TensorView<float> out, TensorView<float> lse, TensorView<const float> queries,
                  TensorView<const H> keys, TensorView<const H> values, const Mask<float>& mask,
                  const SdpaOptions& options) {
  check_layouts<H>("sdpa_forward", {}, {{"keys", keys}, {"values", values}});
  const detail::Switches sw = detail::read_switches();
  const detail::PinSwitches pin(sw);
  if (decodes_in_place(queries.rank() >= 3 ? queries.dim(-2) : 0, sw) && !keys.empty() && !values.empty() && keys.rank() >= 3 &&
      values.rank() >= 3)
    return detail::sdpa_decode_rows(out, lse, queries, detail::shape_view(keys), detail::shape_view(values), rows_of(keys),
                                    rows_of(values), mask, options, "sdpa_forward");
  cpu::Scratch<WideArrays<2>> wide(std::array<index_t, 2>{elements(keys), elements(values)});
  sdpa_forward<float>(out, lse, {}, queries, widen(keys, wide->at[0], "keys"), widen(values, wide->at[1], "values"), mask,
                      options);
}

template <Half16 H>
void sdpa_backward(TensorView<H> dqueries, TensorView<H> dkeys, TensorView<H> dvalues, TensorView<const H> dout,
                   TensorView<const H> queries, TensorView<const H> keys, TensorView<const H> values,
                   TensorView<const H> out, TensorView<const float> lse, const Mask<float>& mask,
                   const SdpaOptions& options, TensorView<float> dsinks) {
  check_layouts<H>("sdpa_backward", {{"dqueries", dqueries}, {"dkeys", dkeys}, {"dvalues", dvalues}},
                   {{"dout", dout}, {"queries", queries}, {"keys", keys}, {"values", values}, {"out", out}});
  // One setting for the float32 call, which knows its inputs are bfloat16 values (for the bfloat16
  // products of its backward, where the bfloat16 kernel is chosen).
  detail::Switches sw = detail::read_switches();
  sw.bf16_values = std::is_same_v<H, bfloat16>;
  const detail::PinSwitches pin(sw);
  // dout, queries, keys, values, out, dqueries, dkeys, dvalues
  cpu::Scratch<WideArrays<8>> wide(std::array<index_t, 8>{elements(dout), elements(queries), elements(keys),
                                                          elements(values), elements(out), elements(dqueries),
                                                          elements(dkeys), elements(dvalues)});
  const std::array<float*, 8>& at = wide->at;
  const TensorView<const float> g = widen(dout, at[0], "dout"), q = widen(queries, at[1], "queries");
  const TensorView<const float> k = widen(keys, at[2], "keys"), v = widen(values, at[3], "values");
  const TensorView<const float> o = widen(out, at[4], "out");
  const TensorView<float> dq = like(dqueries, at[5]), dk = like(dkeys, at[6]), dv = like(dvalues, at[7]);
  sdpa_backward<float>(dq, dk, dv, g, q, k, v, o, lse, mask, options, dsinks);
  narrow(TensorView<const float>(dq), dqueries, "dqueries"), narrow(TensorView<const float>(dk), dkeys, "dkeys");
  narrow(TensorView<const float>(dv), dvalues, "dvalues");
}

#define ATTN_INSTANTIATE(H)                                                                                          \
  template void sdpa_forward(TensorView<H>, TensorView<float>, TensorView<const H>, TensorView<const H>,              \
                             TensorView<const H>, const Mask<float>&, const SdpaOptions&);                            \
  template void sdpa_forward(TensorView<float>, TensorView<float>, TensorView<const H>, TensorView<const H>,          \
                             TensorView<const H>, const Mask<float>&, const SdpaOptions&);                            \
  template void sdpa_forward(TensorView<float>, TensorView<float>, TensorView<const float>, TensorView<const H>,      \
                             TensorView<const H>, const Mask<float>&, const SdpaOptions&);                            \
  template void sdpa_backward(TensorView<H>, TensorView<H>, TensorView<H>, TensorView<const H>, TensorView<const H>, \
                              TensorView<const H>, TensorView<const H>, TensorView<const H>, TensorView<const float>, \
                              const Mask<float>&, const SdpaOptions&, TensorView<float>);
ATTN_INSTANTIATE(bfloat16)
ATTN_INSTANTIATE(float16)
#undef ATTN_INSTANTIATE

}  // namespace attn
