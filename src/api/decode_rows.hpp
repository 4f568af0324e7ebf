// The decode call over keys and values read in place as 16-bit or int8 rows (cpu/simd/fused.hpp,
// KvRows), for the 16-bit API (src/api/sdpa_half.cpp) and the KV cache (src/api/kv_cache.cpp).
#pragma once

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

}  // namespace attn::detail
