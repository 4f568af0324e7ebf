// One scaled dot-product attention call as every backend's kernels receive it (core/kernels.inc):
// the inputs, their head grouping, the mask and the score transform, built and validated once by
// src/api/sdpa.cpp, in the manner of FlashAttention's params struct. Kernels trust it.
#pragma once

#include <cmath>
#include <limits>

#include "attn/flex.hpp"
#include "core/dropout_plan.hpp"
#include "core/mask_plan.hpp"
#include "core/view4.hpp"

namespace attn {

template <class T>
struct SdpaPlan {
  View4<const T> q;  // (B, H, n, d)
  View4<const T> k;  // (B, Hk, m, d): Hk = H / group key heads
  View4<const T> v;  // (B, Hk, m, dv)
  // Query heads per key and value head: 1 for multi-head attention, H / Hk for grouped-query
  // attention (Hk = 1: multi-query). Query head h reads key and value head h / group, as PyTorch's
  // enable_gqa and FlashAttention do; nothing is copied per query head.
  index_t group = 1;
  MaskPlan<T> mask;
  T scale = 1;
  // Soft-capping (Gemma 2): the scaled score s becomes softcap tanh(s / softcap) before the position
  // bias and masks; 0 = none.
  T softcap = 0;
  DropoutPlan dropout;
  // The caller's score_mod and mask_mod (attn/flex.hpp), called on every tile; null for none.
  const detail::ScoreHook<T>* hook = nullptr;
  // The backward of one block of a longer attention (sdpa_backward_block): these keys are some of
  // the attention's, and the backward's lse and out are the whole attention's. The weights are then
  // exp(s - lse), the whole attention's, never renormalised over these keys.
  bool keys_are_a_block = false;

  // The call's run-time switches (read once at the API boundary, with the mask's plan).
  const detail::Switches& switches() const { return mask.switches; }
  index_t kv_head(index_t h) const { return h / group; }
  // Whether the block mask of the hook leaves key tile j0 / kFlexBlock of query block i0 / kFlexBlock live.
  bool tile_live(index_t b, index_t h, index_t i0, index_t j0) const {
    if (hook == nullptr || hook->live == nullptr) return true;
    const index_t block = i0 / detail::kFlexBlock, tile = j0 / detail::kFlexBlock;
    return hook->live[((b * q.H + h) * hook->live_blocks + block) * hook->live_tiles + tile] != 0;
  }
};

// The factor that turns a block's own weights (normalised over its keys, log-sum-exp lse_block)
// into the whole attention's (log-sum-exp lse): e^(lse_block - lse), 0 where either has no key.
template <class T>
T block_weight_factor(T lse_block, T lse) {
  const T neg_inf = -std::numeric_limits<T>::infinity();
  return lse_block == neg_inf || lse == neg_inf ? T(0) : std::exp(lse_block - lse);
}

}  // namespace attn
