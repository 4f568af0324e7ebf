// Dropout on attention weights.
//
// Weight (b, h, i, j) is kept with probability 1 - p and then scaled by 1 / (1 - p), or set to 0.
// The decision comes from a counter-based generator (Philox4x32-10, Random123) keyed by the seed
// and the position (b*H + h, i, j), never from a stream: the forward and the backward pass, any
// thread count and any tiling see the same mask. Same seed, same shapes: bit-identical results.
#pragma once

#include <cstdint>

#include "attn/tensor.hpp"

namespace attn {

struct Dropout {
  double p = 0.0;          // probability of dropping a weight, in [0, 1)
  std::uint64_t seed = 0;  // the generator's key
  // Where this call lies in a larger attention whose dropout mask it must reproduce (a block of its
  // keys, a shard of its sequence or of its heads, as attn/distributed.hpp computes them): weight
  // (b, h, i, j) of the call takes the larger attention's decision at (b * heads + head_start + h,
  // row_start + i, key_start + j); heads 0 means the call's own H. Scaled dot-product attention only
  // (sdpa, flex, multi-head and the 16-bit calls); other operations refuse offsets.
  index_t row_start = 0, key_start = 0, head_start = 0, heads = 0;
};

// Writes the keep decisions of `dropout` (offsets included) for scores of shape (B, H, n, m) (or (B, n, m)) into
// `keep`: true where the weight survives. This is the mask every kernel applies.
void dropout_keep_mask(TensorView<bool> keep, const Dropout& dropout);

}  // namespace attn
