// 16-bit scaled dot-product attention (attn/sdpa.hpp): the 16-bit tensors widened to float32 (SIMD
// conversions, attn/half.hpp), the float32 call, its results rounded once to the 16-bit type. The
// float32 call checks every argument; the caller's 16-bit outputs lend it their shapes, so a wrong
// one is named as in float32.
#include <vector>

#include "api/decode_rows.hpp"
#include "attn/config.hpp"
#include "attn/error.hpp"
#include "attn/sdpa.hpp"

namespace attn {
namespace {

// Calls f(row, width) for every last-axis row of t (any strides): row points at its first element.
template <class T, class F>
void for_each_row(const TensorView<T>& t, F f) {
  if (t.numel() == 0) return;
  const int r = t.rank();
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

std::vector<index_t> shape_of(const auto& t) { return {t.shape().begin(), t.shape().end()}; }

// A contiguous float32 copy of a 16-bit tensor (empty for an empty view with no shape).
template <class H>
Tensor<float> widen(TensorView<const H> t, const char* name) {
  if (t.empty()) return {};
  if (t.data() == nullptr && t.numel() > 0) detail::fail("sdpa (16-bit): ", name, " has shape ", t.shape_string(), " but no data");
  Tensor<float> wide(shape_of(t));
  float* to = wide.data();
  for_each_row(t, [&](const H* row, index_t width) {
    convert(std::span<const H>(row, static_cast<std::size_t>(width)), std::span<float>(to, static_cast<std::size_t>(width)));
    to += width;
  });
  return wide;
}

// The caller's 16-bit tensor (any strides) from a float32 result of its shape.
template <class H>
void narrow(const Tensor<float>& wide, TensorView<H> t, const char* name) {
  if (t.data() == nullptr && t.numel() > 0) detail::fail("sdpa (16-bit): ", name, " has shape ", t.shape_string(), " but no data");
  const float* from = wide.data();
  for_each_row(t, [&](H* row, index_t width) {
    convert(std::span<const float>(from, static_cast<std::size_t>(width)), std::span<H>(row, static_cast<std::size_t>(width)));
    from += width;
  });
}

// A float32 buffer of the caller's output shape (none for an empty output).
template <class H>
Tensor<float> like(const TensorView<H>& t) {
  return t.empty() ? Tensor<float>() : Tensor<float>(shape_of(t));
}

// Tensor() (rank 0) stands for an argument not given.
TensorView<float> view_or_empty(Tensor<float>& t) { return t.rank() == 0 ? TensorView<float>() : t.view(); }
TensorView<const float> cview_or_empty(const Tensor<float>& t) { return t.rank() == 0 ? TensorView<const float>() : t.view(); }


// A float view with t's shape and strides, for the checks only (never read).
template <class H>
TensorView<const float> shape_view(const TensorView<const H>& t) {
  std::vector<index_t> strides(static_cast<std::size_t>(t.rank()));
  for (int i = 0; i < t.rank(); ++i) strides[static_cast<std::size_t>(i)] = t.stride(i);
  return TensorView<const float>(reinterpret_cast<const float*>(t.data()), t.shape(), strides);
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

// Whether the decode path reads the 16-bit keys and values in place: few queries, the cpu backend.
bool decodes_in_place(const TensorView<const float>& queries) {
  return backend() == Backend::cpu && queries.rank() >= 3 && queries.dim(-2) <= cpu::fused::kDecodeRows;
}

}  // namespace

template <Half16 H>
void sdpa_forward(TensorView<H> out, TensorView<float> lse, TensorView<const H> queries, TensorView<const H> keys,
                  TensorView<const H> values, const Mask<float>& mask, const SdpaOptions& options) {
  const Tensor<float> q = widen(queries, "queries");
  Tensor<float> o = like(out);
  if (decodes_in_place(cview_or_empty(q))) {  // the queries widened, the keys and values read in place
    sdpa_forward<H>(view_or_empty(o), lse, cview_or_empty(q), keys, values, mask, options);
  } else {
    const Tensor<float> k = widen(keys, "keys"), v = widen(values, "values");
    sdpa_forward<float>(view_or_empty(o), lse, {}, cview_or_empty(q), cview_or_empty(k), cview_or_empty(v), mask,
                        options);
  }
  narrow(o, out, "out");
}


template <Half16 H>
void sdpa_forward(TensorView<float> out, TensorView<float> lse, TensorView<const float> queries,
                  TensorView<const H> keys, TensorView<const H> values, const Mask<float>& mask,
                  const SdpaOptions& options) {
  if (decodes_in_place(queries) && !keys.empty() && !values.empty() && keys.rank() >= 3 && values.rank() >= 3)
    return detail::sdpa_decode_rows(out, lse, queries, shape_view(keys), shape_view(values), rows_of(keys),
                                    rows_of(values), mask, options, "sdpa_forward");
  const Tensor<float> k = widen(keys, "keys"), v = widen(values, "values");
  sdpa_forward<float>(out, lse, {}, queries, cview_or_empty(k), cview_or_empty(v), mask, options);
}

template <Half16 H>
void sdpa_backward(TensorView<H> dqueries, TensorView<H> dkeys, TensorView<H> dvalues, TensorView<const H> dout,
                   TensorView<const H> queries, TensorView<const H> keys, TensorView<const H> values,
                   TensorView<const H> out, TensorView<const float> lse, const Mask<float>& mask,
                   const SdpaOptions& options) {
  const Tensor<float> g = widen(dout, "dout"), q = widen(queries, "queries"), k = widen(keys, "keys");
  const Tensor<float> v = widen(values, "values"), o = widen(out, "out");
  Tensor<float> dq = like(dqueries), dk = like(dkeys), dv = like(dvalues);
  sdpa_backward<float>(view_or_empty(dq), view_or_empty(dk), view_or_empty(dv), cview_or_empty(g), cview_or_empty(q),
                       cview_or_empty(k), cview_or_empty(v), cview_or_empty(o), lse, mask, options);
  narrow(dq, dqueries, "dqueries"), narrow(dk, dkeys, "dkeys"), narrow(dv, dvalues, "dvalues");
}

#define ATTN_INSTANTIATE(H)                                                                                          \
  template void sdpa_forward(TensorView<H>, TensorView<float>, TensorView<const H>, TensorView<const H>,              \
                             TensorView<const H>, const Mask<float>&, const SdpaOptions&);                            \
  template void sdpa_forward(TensorView<float>, TensorView<float>, TensorView<const float>, TensorView<const H>,      \
                             TensorView<const H>, const Mask<float>&, const SdpaOptions&);                            \
  template void sdpa_backward(TensorView<H>, TensorView<H>, TensorView<H>, TensorView<const H>, TensorView<const H>, \
                              TensorView<const H>, TensorView<const H>, TensorView<const H>, TensorView<const float>, \
                              const Mask<float>&, const SdpaOptions&);
ATTN_INSTANTIATE(bfloat16)
ATTN_INSTANTIATE(float16)
#undef ATTN_INSTANTIATE

}  // namespace attn
