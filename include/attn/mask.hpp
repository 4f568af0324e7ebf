// Masks: which keys each query may attend to.
//
// Scores have shape (B, H, n, m) (H = 1 for 3-D inputs). A Mask combines any of
//   - valid lengths, exactly as the seeds use them: shape (B,) — the same length for every query of
//     a batch element — or (B, n) — one length per query; query i of batch b sees keys
//     [0, valid_lens[b] or valid_lens[b, i]). Each length must lie in [0, m]. Int64.
//   - a boolean keep-mask, broadcastable to (B, H, n, m) by NumPy rules (dimensions aligned on the
//     right, size-1 dimensions repeated). true = the query may attend to the key (the convention of
//     torch.nn.functional.scaled_dot_product_attention). A key-padding mask of shape (B, m) is
//     passed as a (B, 1, 1, m) view.
//   - an additive float mask, broadcastable the same way, added to the scores before the softmax;
//     -inf entries exclude a key.
//   - a causal mask: query i sees keys j <= i (top_left), or j <= i + m - n (bottom_right, the
//     alignment of a decoder continuing a cached prefix when n != m).
// A key is attended to only if every component allows it.
//
// Masked keys get weight exactly 0: their scores are never read, so NaN or Inf stored there never
// reaches an output or a gradient. A query row left with no key to attend to (valid length 0, a
// fully false keep row, a causal row with nothing before it, or all scores -inf) outputs 0, has
// weights 0 and zero gradients. MaskedFill::seeds_minus_1e6 reproduces the seeds' d2l code instead:
// masked scores are replaced by -1e6 before an ordinary softmax over all m keys, so an empty row
// becomes a uniform average.
#pragma once

#include <cstdint>

#include "attn/tensor.hpp"

namespace attn {

enum class Causal { none, top_left, bottom_right };

enum class MaskedFill {
  exclude,          // masked keys take no part; an empty row outputs 0 (default)
  seeds_minus_1e6,  // the seeds' masked_softmax: masked scores become -1e6, then softmax over all keys
};

template <class T>
struct Mask {
  TensorView<const std::int64_t> valid_lens;  // empty, (B,) or (B, n)
  TensorView<const bool> keep;                // empty, or broadcastable to (B, H, n, m)
  TensorView<const T> additive;               // empty, or broadcastable to (B, H, n, m)
  Causal causal = Causal::none;
  MaskedFill fill = MaskedFill::exclude;

  bool is_none() const {
    return valid_lens.empty() && keep.empty() && additive.empty() && causal == Causal::none;
  }
};

}  // namespace attn
