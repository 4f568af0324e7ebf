// 16-bit scaled dot-product attention (attn/sdpa.hpp): the 16-bit tensors widened to float32 (SIMD
// conversions, attn/half.hpp), the float32 call, its results rounded once to the 16-bit type. The
// float32 call checks every argument; the caller's 16-bit outputs lend it their shapes, so a wrong
// one is named as in float32.
#include <vector>

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

}  // namespace

template <Half16 H>
void sdpa_forward(TensorView<H> out, TensorView<float> lse, TensorView<const H> queries, TensorView<const H> keys,
                  TensorView<const H> values, const Mask<float>& mask, const SdpaOptions& options) {
  const Tensor<float> q = widen(queries, "queries"), k = widen(keys, "keys"), v = widen(values, "values");
  Tensor<float> o = like(out);
  sdpa_forward<float>(view_or_empty(o), lse, {}, cview_or_empty(q), cview_or_empty(k), cview_or_empty(v), mask, options);
  narrow(o, out, "out");
}

template <Half16 H>
void sdpa_forward(TensorView<float> out, TensorView<float> lse, TensorView<const float> queries,
                  TensorView<const H> keys, TensorView<const H> values, const Mask<float>& mask,
                  const SdpaOptions& options) {
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
