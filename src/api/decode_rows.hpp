// The calls over 16-bit or int8 elements read in place, checked as sdpa_forward<float> checks: the
// decode path over KvRows (cpu/simd/fused.hpp), for the 16-bit API (src/api/sdpa_half.cpp) and the
// KV cache (src/api/kv_cache.cpp), and the fused 16-bit forward.
#pragma once

#include <vector>

#include "attn/sdpa.hpp"
#include "cpu/simd/fused.hpp"

namespace attn::detail {

// Checks as sdpa_forward<float> checks, with `key_shape` and `value_shape` standing for the keys and
// values (float views of their shapes and strides, never read), then the cpu backend's decode path
// reading `keys` and `values`. For at most cpu::fused::kDecodeRows queries per head.
void sdpa_decode_rows(TensorView<float> out, TensorView<float> lse, TensorView<const float> queries,
                      TensorView<const float> key_shape, TensorView<const float> value_shape,
                      const cpu::fused::KvRows& keys, const cpu::fused::KvRows& values, const Mask<float>& mask,
                      const SdpaOptions& options, const char* op);

// The same checks, then the cpu backend's blocked forward (any number of queries) reading `keys`
// and `values` a tile at a time (cpu::sdpa_forward_rows).
void sdpa_forward_rows(TensorView<float> out, TensorView<float> lse, TensorView<const float> queries,
                       TensorView<const float> key_shape, TensorView<const float> value_shape,
                       const cpu::fused::KvRows& keys, const cpu::fused::KvRows& values, const Mask<float>& mask,
                       const SdpaOptions& options, const char* op);

// The fused forward over 16-bit tensors read in place (cpu::sdpa_forward_half), out 16-bit (H) or
// float32 (the result before its rounding): the caller checked the 16-bit tensors' layouts and that
// the cpu backend runs; at most cpu::fused::kMaxKeys keys.
template <Half16 H, class O>
void sdpa_forward_half(TensorView<O> out, TensorView<float> lse, TensorView<const H> queries,
                       TensorView<const H> keys, TensorView<const H> values, const Mask<float>& mask,
                       const SdpaOptions& options);

// t's shape and strides over its memory read as elements of U: a float view of 16-bit tensors for
// the float checks (never read), or their raw 16-bit words for the bfloat16 kernel.
template <class U, class H>
TensorView<U> retyped(const TensorView<H>& t) {
  std::vector<index_t> strides(static_cast<std::size_t>(t.rank()));
  for (int i = 0; i < t.rank(); ++i) strides[static_cast<std::size_t>(i)] = t.stride(i);
  return TensorView<U>(reinterpret_cast<U*>(t.data()), t.shape(), strides);
}
template <class H>
TensorView<const float> shape_view(const TensorView<const H>& t) {
  return retyped<const float>(t);
}

}  // namespace attn::detail
