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
// the AVX512-BF16 products where chosen (bf16_kernel_chosen, the AVX-512 target), else tiles widened
// to float. At most fused::kMaxKeys keys.
void sdpa_forward_half(View4<float> lse, const SdpaPlan<float>& plan, const fused::HalfViews& inputs);
// The decode path (a few queries per head) over keys and values read in place as 16-bit or int8
// rows of a tensor or of a KV cache's blocks (fused::KvRows); the plan's k and v give only shapes.
void sdpa_decode_rows(View4<float> out, View4<float> lse, const SdpaPlan<float>& plan, const fused::KvRows& keys,
                      const fused::KvRows& values);

}  // namespace attn::cpu
