// The production kernels of the cpu backend: the unfused path (scores, softmax and weighted sum as
// separate threaded passes over an (n, m) buffer), threaded with OpenMP over rows. Same contracts as
// the reference kernels in ref/ref.hpp, tested against them. Arguments were validated in src/api.
#pragma once

#include "attn/nadaraya_watson.hpp"
#include "core/dropout_plan.hpp"
#include "core/mask_plan.hpp"
#include "core/sdpa_plan.hpp"
#include "core/view4.hpp"

namespace attn::cpu {

#include "core/kernels.inc"  // IWYU pragma: export

namespace fused {
struct KvRows;
struct HalfViews;
}
// The fused forward over 16-bit queries, keys and values (the plan's q, k and v give only shapes):
// the bfloat16 kernel's products where chosen (bf16_kernel_chosen, the AVX-512 target), else tiles widened
// to float. At most fused::kMaxKeys keys.
void sdpa_forward_half(View4<float> lse, const SdpaPlan<float>& plan, const fused::HalfViews& inputs);
// The int8 forward (SageAttention's scheme, fused.hpp's sdpa_forward_block_int8): queries and keys
// (the keys less their head's mean) quantized to int8 once per call, a scale a row; Q K^T by vpdpbusd
// where the CPU has AVX512-VNNI and the target is AVX-512 (its sums on AMX-INT8's tiles where the CPU
// has them: int8::scores_on_tiles), else by the portable 16-bit products; P V
// in bfloat16 where the call's switches choose the bfloat16 kernel (bf16_kernel_chosen), else in
// float. The fused kernel whatever the backend; at most fused::kMaxKeys keys, d at most
// kInt8MaxDepth. Returns the first query or key row (queries first, then by position) holding a
// value that is not finite, which int8 cannot hold, and then leaves out and lse unspecified.
inline constexpr index_t kInt8MaxDepth = 65536;  // 255 x 127 x d fits an int32 sum
struct Int8Refusal {
  const char* tensor = nullptr;  // "queries" or "keys"; nullptr: none, the call ran
  index_t b = 0, h = 0, row = 0;
};
Int8Refusal sdpa_forward_int8(View4<float> out, View4<float> lse, const SdpaPlan<float>& plan);
// The decode path (a few queries per head) over keys and values read in place as 16-bit or int8
// rows of a tensor or of a KV cache's blocks (fused::KvRows); the plan's k and v give only shapes.
void sdpa_decode_rows(View4<float> out, View4<float> lse, const SdpaPlan<float>& plan, const fused::KvRows& keys,
                      const fused::KvRows& values);
// The blocked forward (any number of queries) over keys and values read in place the same way, a
// tile of rows widened at a time (fused::sdpa_forward_block_rows).
void sdpa_forward_rows(View4<float> out, View4<float> lse, const SdpaPlan<float>& plan, const fused::KvRows& keys,
                       const fused::KvRows& values);

}  // namespace attn::cpu
