// FlashAttention's KV-cache calls on the CPU, over caches the caller owns (FlashAttention 2.6's
// flash_attn_with_kvcache and flash_attn_varlen_func with a block_table). Forward only.
// FlashAttention's other two calls are attn's own: flash_attn_func is sdpa_forward / sdpa_backward
// (attn/sdpa.hpp) with Mask::align = Align::bottom_right on (B, H, S, d) views of (B, S, H, d)
// tensors (strides, no copy), and flash_attn_varlen_func is varlen_forward / varlen_backward
// (attn/varlen.hpp, included here) with the same alignment. attn.flash (Python) calls these.
//
// Shapes (FlashAttention's layout, tokens before heads):
//   B batch, n queries per sequence (seqlen_q), H query heads, Hk key heads (H a multiple of Hk:
//   query head h reads key head h / (H / Hk)), d head size, s new tokens per sequence (seqlen_new).
//   q, out            (B, n, H, d)                    lse (B, H, n), float32
//   k_cache, v_cache  (B_cache, S, Hk, d)             a contiguous cache: row cache_batch_idx[b] holds
//                                                      sequence b's tokens at positions 0 .. S-1
//                  or (num_blocks, page, Hk, d)        a paged cache, with block_table (B, max_blocks):
//                                                      token t of sequence b is row t % page of block
//                                                      block_table[b, t / page]
//   k_new, v_new      (B, s, Hk, d)                   tokens appended at positions cache_seqlens[b] ..
// Element type T: float, bfloat16 or float16, one type for q, the caches, the new tokens, the rotary
// tables and out (as FlashAttention requires); lse, ALiBi slopes and sinks are float32.
// Strides are in elements; only the last dimension must be contiguous.
//
// What a call does, in FlashAttention's order:
//  1. When k_new is given, its tokens (rotated when rotary tables are given) and v_new's are written
//     into the caller's caches IN PLACE at positions cache_seqlens[b] .. cache_seqlens[b] + s - 1,
//     rounded to T where T is 16-bit.
//  2. Sequence b's keys are then its positions [leftpad_b, L_b), L_b = cache_seqlens[b] + s: m_b =
//     L_b - leftpad_b keys, key j at position j of the sequence (leftpad_b + j of the cache row).
//  3. Attention of q over them. The queries are the sequence's last n tokens whether causal or not:
//     query i sits at position m_b - n + i (bottom-right, attn/mask.hpp) for the causal rule (query
//     i sees keys j <= m_b - n + i), the window (keys j with m_b - n + i - left <= j <= m_b - n + i
//     + right; a negative bound is unbounded) and ALiBi (score -= slope |m_b - n + i - j|). A row
//     with no key outputs 0 (lse -inf). Soft-capping (softcap > 0: s -> softcap tanh(s / softcap)),
//     the scale (default 1/sqrt(d)) and attention sinks (gpt-oss: one more logit per head in each
//     row's softmax, with no value; lse includes it) as in sdpa_forward.
// Rotary embeddings (rotary_cos, rotary_sin (seqlen_ro, rotary_dim / 2), rotary_dim <= d): the first
// rotary_dim elements of each new key at cache position cache_seqlens[b] + t are rotated by row
// cache_seqlens[b] + t of the tables, pairs (2c, 2c+1) when interleaved (GPT-J), else (c, c +
// rotary_dim / 2) (GPT-NeoX): (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin). Query i is rotated by
// row cache_seqlens[b] + i when causal or windowed, else by row cache_seqlens[b] for every i (all
// queries at one position), as FlashAttention. Positions are the cache's, counted from its row's
// start, not from leftpad. Computed in float32, rounded to T.
//
// Paths: up to cpu::fused::kDecodeRows (4) queries per head read the caller's blocks in place (the
// decode path: keys split across threads), the whole batch in one call when there is no window and
// no ALiBi, else one call per sequence; more queries (a prompt chunk) run sdpa_forward per sequence
// over a strided view of a contiguous cache, or over the sequence's pages gathered into scratch.
//
// Validation comes first: a call that raises attn::Error has written nothing. The rules:
// cache_seqlens[b] >= 0 and L_b within the capacity (S, or max_blocks * page); 0 <= leftpad_b <=
// cache_seqlens[b]; the block table's entries for positions [0, L_b) in [0, num_blocks); a block
// the append writes held by no other live position (of any sequence); cache_batch_idx in [0,
// B_cache) and, when appending, distinct; a paged cache takes neither cache_batch_idx nor leftpad
// (FlashAttention refuses both); rotary tables only with new tokens, long enough for every position
// rotated, rotary_dim <= d; sinks (H,) finite; alibi_slopes (H,) or (B, H).
#pragma once

#include <cstdint>
#include <optional>

#include "attn/half.hpp"
#include "attn/mask.hpp"
#include "attn/tensor.hpp"
#include "attn/varlen.hpp"

namespace attn {

// The masks, bias and scaling shared by both calls (FlashAttention's arguments of the same names).
struct FlashAttendOptions {
  bool causal = false;
  Window window{-1, -1};                 // window_size (left, right); negative: unbounded
  TensorView<const float> alibi_slopes;  // (H,) or (B, H), or empty
  double softcap = 0;                    // 0: off
  std::optional<double> softmax_scale;   // default 1 / sqrt(d)
  TensorView<const float> sinks;         // (H,), or empty
};

template <class T>
struct FlashKvCacheParams {
  TensorView<T> k_cache, v_cache;                 // (B_cache, S, Hk, d) or paged (num_blocks, page, Hk, d)
  TensorView<const T> k_new, v_new;               // (B, s, Hk, d), or empty (nothing appended)
  TensorView<const std::int32_t> cache_seqlens;   // (B,); empty: every sequence holds the whole cache (S)
  TensorView<const std::int32_t> cache_batch_idx; // (B,), or empty: sequence b is cache row b
  TensorView<const std::int32_t> cache_leftpad;   // (B,), or empty: 0
  TensorView<const std::int32_t> block_table;     // (B, max_blocks): a paged cache; or empty
  TensorView<const T> rotary_cos, rotary_sin;     // (seqlen_ro, rotary_dim / 2), or empty
  bool rotary_interleaved = true;
  FlashAttendOptions attend;
};

// out (B, n, H, d) and, when not empty, lse (B, H, n): the call described above.
template <class T>
void flash_attn_with_kvcache(TensorView<T> out, TensorView<float> lse, TensorView<const T> q,
                             const FlashKvCacheParams<T>& params);

// flash_attn_varlen_func with a block_table: B sequences packed, sequence b's queries are rows
// cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 of q (total_q, H, d), its keys and values the first m_b
// tokens of its pages, m_b = seqused_k[b] when given, else cu_seqlens_k[b + 1] - cu_seqlens_k[b]
// (FlashAttention's two ways of giving the key lengths with a paged cache). Queries aligned
// bottom-right per sequence as above; no append, no rotary. out (total_q, H, d), lse (H, total_q).
template <class T>
struct FlashPagedVarlenParams {
  TensorView<const T> k_cache, v_cache;         // (num_blocks, page, Hk, d)
  TensorView<const std::int32_t> block_table;   // (B, max_blocks)
  TensorView<const std::int32_t> cu_seqlens_q;  // (B + 1,), from 0, non-decreasing, ending at total_q
  TensorView<const std::int32_t> cu_seqlens_k;  // (B + 1,), from 0, non-decreasing
  TensorView<const std::int32_t> seqused_k;     // (B,), or empty
  FlashAttendOptions attend;
};

/// out (total_q, H, v) and lse (H, total_q) of packed queries q (total_q, H, d), each sequence over its
/// own keys in the paged cache of params (flash_attn_varlen_func with block_table).
template <class T>
void flash_attn_varlen_paged(TensorView<T> out, TensorView<float> lse, TensorView<const T> q,
                             const FlashPagedVarlenParams<T>& params);

}  // namespace attn
