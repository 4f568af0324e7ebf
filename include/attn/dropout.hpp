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
};

// Writes the keep decisions of `dropout` for scores of shape (B, H, n, m) (or (B, n, m)) into
// `keep`: true where the weight survives. This is the mask every kernel applies.
void dropout_keep_mask(TensorView<bool> keep, const Dropout& dropout);

}  // namespace attn
