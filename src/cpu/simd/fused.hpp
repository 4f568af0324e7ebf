// The fused SIMD kernels of the cpu backend, written once with Google Highway and compiled for
// several targets (AVX-512, AVX2, SSE4 and a portable 128-bit emulation); the best one the CPU
// supports is picked at run time (simd_target in attn/config.hpp overrides it). The kernels work
// on one block of the problem per call; the callers in src/cpu split the problem into blocks and
// run them on OpenMP threads, each with its own scratch (cpu/scratch.hpp).
#pragma once

#include <cstddef>

#include "core/dropout_plan.hpp"
#include "core/mask_plan.hpp"
#include "core/view4.hpp"

namespace attn::cpu::fused {

// Queries per block: each block keeps its queries transposed, (d, kBlockQ), so that the scores of a
// key are one row of kBlockQ lanes and the online softmax runs down columns without shuffles.
inline constexpr index_t kBlockQ = 64;
// Keys per tile: scores and weights of a block for one tile are (kBlockK, kBlockQ).
inline constexpr index_t kBlockK = 64;
// The fused kernels compare key indices in T lanes; beyond 2^24 keys a float no longer holds them.
inline constexpr index_t kMaxKeys = index_t(1) << 24;

// The work space of one block of queries (simd/softmax-inl.h, BlockState): queries transposed
// (d, kBlockQ), scores or weights of a key tile (kBlockK, kBlockQ), the partial output transposed
// (v, kBlockQ), and per-query running maximum, rescale factor, key limit, sums and row masks.
template <class T>
constexpr std::size_t block_state_bytes(index_t d, index_t v) {
  auto bytes = [](std::size_t n) { return (n + 63) / 64 * 64; };
  const std::size_t q = kBlockQ;
  return bytes(sizeof(T) * q * static_cast<std::size_t>(d + kBlockK + v)) + 3 * bytes(sizeof(T) * q) +
         2 * bytes(sizeof(double) * q) + bytes(sizeof(RowMask<T>) * q);
}

// One scaled dot-product attention forward call, checked by src/api: out (B, H, n, v) and, when not
// empty, lse (B, H, n, 1) from queries (B, H, n, d), keys (B, H, m, d), values (B, H, m, v).
template <class T>
struct SdpaForward {
  View4<T> out, lse;
  View4<const T> q, k, v;
  const MaskPlan<T>* mask;
  T scale;
  const DropoutPlan* dropout;
};

// Applies ATTN_SIMD_TARGET once, before the first kernel runs (src/cpu/simd/targets.cpp).
void init_simd_target();

// Bytes of per-thread work space sdpa_forward_block needs for query size d and value size v.
template <class T>
std::size_t sdpa_forward_work_bytes(index_t d, index_t v);

// Rows [i0, i0 + kBlockQ) of batch b, head h (fewer at the end): out and lse of those rows, by an
// online softmax over tiles of kBlockK keys. `work` is sdpa_forward_work_bytes of 64-byte aligned
// memory.
template <class T>
void sdpa_forward_block(const SdpaForward<T>& p, index_t b, index_t h, index_t i0, void* work);

}  // namespace attn::cpu::fused
