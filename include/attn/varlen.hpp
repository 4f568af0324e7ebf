// Attention over variable-length sequences packed into one tensor (FlashAttention's
// flash_attn_varlen_func; xFormers' BlockDiagonalMask): B sequences of n_b queries and m_b keys,
// concatenated along the first axis, each attending only to its own keys.
//
//   cu_seqlens_q (B+1,) int32   cu_seqlens_q[b] .. cu_seqlens_q[b+1]: the rows of sequence b's queries;
//   cu_seqlens_k (B+1,) int32   starts at 0, never decreases, ends at total_q (total_k)
//   queries (total_q, H, d)     keys (total_k, Hk, d)     values (total_k, Hk, v)
//   out     (total_q, H, v)     lse  (H, total_q)         FlashAttention's varlen layout of the
//                                                         log-sum-exp (-inf for a row with no key)
//   weights (B, H, max_seqlen_q, max_seqlen_k)            sequence b's weights before dropout in the
//                                                         corner [0, n_b) x [0, m_b), 0 elsewhere
//
// Each sequence is one scaled dot-product attention (attn/sdpa.hpp) with n = n_b queries and m = m_b
// keys, computed by the fused sdpa kernels on strided views of the packed tensors: nothing is
// copied, no tile spans two sequences and no padding is computed. n_b != m_b is allowed, and either
// may be 0 (a sequence without queries outputs nothing and its keys get zero gradients; queries
// without keys output 0, lse -inf, or the sink with sinks).
//
// The mask applies per sequence, with the sequence's own n_b and m_b:
//   causal, align, window: as in attn/mask.hpp for a call of n_b queries and m_b keys, so with
//     Causal::bottom_right or align = bottom_right query i of sequence b sits at i + m_b - n_b
//     (FlashAttention's convention for every sequence);
//   alibi_slopes (H,) for every sequence, or (B, H): row b for sequence b;
//   sinks (H,): the same sinks in every sequence; softcap, scale (SdpaOptions) likewise;
//   query_start, key_start: added to every sequence's positions.
// Valid lengths, keep and additive masks and segment ids are refused (the lengths are the packing
// itself; a mask of the packed (total_q, total_k) scores is what varlen avoids).
// Grouped-query attention as in attn/sdpa.hpp (H a multiple of Hk).
// Dropout: the decisions are those of one (1, H, total_q, total_k) attention (attn/dropout.hpp):
// weight (h, i, j) of sequence b takes that attention's decision at (h, cu_seqlens_q[b] + i,
// cu_seqlens_k[b] + j), through Dropout's row_start and key_start (added to the caller's own
// offsets, which place the whole packed attention in a larger one).
// max_seqlen_q and max_seqlen_k (FlashAttention's arguments) must be at least every n_b (m_b); they
// size weights.
#pragma once

#include <cstdint>

#include "attn/sdpa.hpp"

namespace attn {

struct VarlenSeqs {
  TensorView<const std::int32_t> cu_seqlens_q;  // (B+1,)
  TensorView<const std::int32_t> cu_seqlens_k;  // (B+1,)
  index_t max_seqlen_q = 0;
  index_t max_seqlen_k = 0;
};

// out (and lse and weights when given, each optional) from the packed queries, keys and values.
template <class T>
void varlen_forward(TensorView<T> out, TensorView<T> lse, TensorView<T> weights, TensorView<const T> queries,
                    TensorView<const T> keys, TensorView<const T> values, const VarlenSeqs& seqs,
                    const Mask<T>& mask = {}, const SdpaOptions& options = {});

// dqueries, dkeys, dvalues (each optional) from dout (total_q, H, v), with out and lse from
// varlen_forward (optional, recomputed per sequence when missing; as sdpa_backward). dsinks (H,),
// when given with sinks, is the sum over the sequences of their sinks' gradients (summed in double).
// Keys of a sequence without queries get dkeys = dvalues = 0.
template <class T>
void varlen_backward(TensorView<T> dqueries, TensorView<T> dkeys, TensorView<T> dvalues, TensorView<const T> dout,
                     TensorView<const T> queries, TensorView<const T> keys, TensorView<const T> values,
                     TensorView<const T> out, TensorView<const T> lse, const VarlenSeqs& seqs,
                     const Mask<T>& mask = {}, const SdpaOptions& options = {}, TensorView<T> dsinks = {});

// 16-bit tensors (bfloat16, float16) with float32 lse, slopes, sinks and dsinks, as the 16-bit sdpa
// calls (attn/sdpa.hpp). No weights: a caller wanting them widens to float32.
template <Half16 H>
void varlen_forward(TensorView<H> out, TensorView<float> lse, TensorView<const H> queries, TensorView<const H> keys,
                    TensorView<const H> values, const VarlenSeqs& seqs, const Mask<float>& mask = {},
                    const SdpaOptions& options = {});

/// The 16-bit backward: gradients in the 16-bit type, lse and dsinks float32.
template <Half16 H>
void varlen_backward(TensorView<H> dqueries, TensorView<H> dkeys, TensorView<H> dvalues, TensorView<const H> dout,
                     TensorView<const H> queries, TensorView<const H> keys, TensorView<const H> values,
                     TensorView<const H> out, TensorView<const float> lse, const VarlenSeqs& seqs,
                     const Mask<float>& mask = {}, const SdpaOptions& options = {}, TensorView<float> dsinks = {});

}  // namespace attn
