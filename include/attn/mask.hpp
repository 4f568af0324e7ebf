// Masks: which keys each query may attend to.
//
// Scores have shape (B, H, n, m) (H = 1 for 3-D inputs). A Mask combines any of
//   - valid lengths, exactly as the d2l chapter uses them: shape (B,) — the same length for every query of
//     a batch element — or (B, n) — one length per query; query i of batch b sees keys
//     [0, valid_lens[b] or valid_lens[b, i]). Each length must lie in [0, m]. Int64.
//   - a boolean keep-mask, broadcastable to (B, H, n, m) by NumPy rules (dimensions aligned on the
//     right, size-1 dimensions repeated). true = the query may attend to the key (the convention of
//     torch.nn.functional.scaled_dot_product_attention). A key-padding mask of shape (B, m) is
//     passed as a (B, 1, 1, m) view. Masks are read through their strides, any of them 0 (a
//     broadcast made by PyTorch's expand) and the last one included (a transposed mask): no copy.
//   - an additive float mask, broadcastable the same way, added to the scores before the softmax;
//     -inf entries exclude a key.
//   - an alignment (docs/semantics.md, "Alignment"): where the n queries sit among the m keys, for
//     the causal rule, the window and ALiBi together. Query i is at position p(i) = i (top_left, the
//     default), or p(i) = i + m - n (bottom_right: the queries are the last n of the m tokens, as a
//     decoder continuing a cached prefix, and FlashAttention's convention for every call). `align`
//     sets it whether or not a causal mask is on; Causal::bottom_right implies bottom_right.
//   - a causal mask: query i sees keys j <= p(i): Causal::top_left (j <= i) or Causal::bottom_right
//     (j <= i + m - n). Causal::top_left with align = bottom_right is refused as contradictory.
//   - a sliding window (Mistral, Longformer, FlashAttention's window_size): query i sees keys j with
//     p(i) - left <= j <= p(i) + right; a negative bound leaves that side unbounded.
//   - packed sequences (xFormers' BlockDiagonalMask, FlashAttention's varlen): segment ids of shape
//     (B, n) for the queries and (B, m) for the keys, int32 or int64; query i sees key j only when
//     both have the same id. One tensor serves both when n == m (leave segment_ids_k empty).
// A key is attended to only if every component allows it. Besides masking, a Mask carries the
// position bias of ALiBi (Press et al., 2022): slopes of shape (H,) or (B, H) (H = 1 for 3-D
// inputs), and score += -slope * |p(i) - j| after the scale and the soft-capping, before the additive
// mask; with align = bottom_right this is FlashAttention-2's ALiBi for any n and m.
// It also carries attention sinks (gpt-oss; Xiao et al., 2024): one learned logit per head, shape
// (H,), that joins each row's softmax as one more score with no value. Row i's weights become
// exp(s_ij - lse'_i) with lse'_i = log(exp(sink_h) + sum_j exp(s_ij)), so they sum to less than 1;
// the returned lse is lse'. A row with no key to attend to outputs 0, as without sinks.
//
// Masked keys get weight exactly 0: their scores are never read, so NaN or Inf stored there never
// reaches an output or a gradient. A query row left with no key to attend to (valid length 0, a
// fully false keep row, a causal row with nothing before it, or all scores -inf) outputs 0, has
// weights 0 and zero gradients. MaskedFill::d2l_minus_1e6 reproduces the d2l chapter's code instead:
// masked scores are replaced by -1e6 before an ordinary softmax over all m keys, so an empty row
// becomes a uniform average.
#pragma once

#include <cstdint>
#include <optional>

#include "attn/tensor.hpp"

namespace attn {

enum class Causal { none, top_left, bottom_right };

// Where the queries sit among the keys (see above): p(i) = i, or p(i) = i + m - n.
enum class Align { top_left, bottom_right };

enum class MaskedFill {
  exclude,          // masked keys take no part; an empty row outputs 0 (default)
  d2l_minus_1e6,    // the d2l chapter's masked_softmax: masked scores become -1e6, then softmax over all keys
};

// The bounds of a sliding window around a query's position; -1 (any negative value): unbounded.
struct Window {
  index_t left = -1;
  index_t right = -1;
};

// Segment ids of int32 or int64 elements: (B, n) or (B, m).
struct SegmentIds {
  TensorView<const std::int64_t> i64;
  TensorView<const std::int32_t> i32;

  SegmentIds() = default;
  /// Segment ids from int64 or int32 tensors (either converts implicitly); empty() when none are given.
  SegmentIds(TensorView<const std::int64_t> ids) : i64(ids) {}  // NOLINT(google-explicit-constructor)
  SegmentIds(TensorView<const std::int32_t> ids) : i32(ids) {}  // NOLINT(google-explicit-constructor)
  SegmentIds(TensorView<std::int64_t> ids) : i64(ids) {}        // NOLINT(google-explicit-constructor)
  SegmentIds(TensorView<std::int32_t> ids) : i32(ids) {}        // NOLINT(google-explicit-constructor)
  bool empty() const { return i64.empty() && i32.empty(); }
};

template <class T>
struct Mask {
  TensorView<const std::int64_t> valid_lens;  // empty, (B,) or (B, n)
  TensorView<const bool> keep;                // empty, or broadcastable to (B, H, n, m)
  TensorView<const T> additive;               // empty, or broadcastable to (B, H, n, m)
  Causal causal = Causal::none;
  std::optional<Align> align;                 // unset: bottom_right if causal is, else top_left
  MaskedFill fill = MaskedFill::exclude;
  std::optional<Window> window;               // none, or a sliding window
  SegmentIds segment_ids_q;                   // empty, or (B, n)
  SegmentIds segment_ids_k;                   // empty: the queries' ids (n == m), or (B, m)
  TensorView<const T> alibi_slopes;           // empty, (H,) or (B, H)
  TensorView<const T> sinks;                  // empty, or (H,): attention sinks' logits, finite
  // Where these queries and keys start in longer sequences, when a call computes one block of a
  // larger attention (keys split across calls or machines: sdpa_merge, sdpa_backward_block): query i
  // is at position query_start + i and key j at key_start + j for the causal rule, the window and
  // ALiBi, i.e. p(i) above is shifted by query_start - key_start. Valid lengths, the keep and
  // additive masks and segment ids index the block's own queries and keys; so does dropout. Each in
  // [0, 2^48).
  index_t query_start = 0;
  index_t key_start = 0;

  // The alignment in force: `align` when set, else bottom_right for Causal::bottom_right.
  Align alignment() const {
    return align.value_or(causal == Causal::bottom_right ? Align::bottom_right : Align::top_left);
  }
  // Whether nothing masks, biases or sinks any score (the alignment then changes nothing).
  bool is_none() const {
    return valid_lens.empty() && keep.empty() && additive.empty() && causal == Causal::none && !window &&
           segment_ids_q.empty() && alibi_slopes.empty() && sinks.empty();
  }
};

}  // namespace attn
