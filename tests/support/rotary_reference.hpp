// The float64 oracle of rotary position embeddings (attn/rotary.hpp), written from FlashAttention's
// torch formula (apply_rotary_emb_torch: x cos_rep + rotate_half(x) sin_rep, the tables repeated over
// the rotated features), not from the kernel's pairs; and RoPE's tables.
#pragma once

#include <cmath>
#include <utility>
#include <vector>

#include "attn/tensor.hpp"

namespace attn::testing {

// Tokens (N, H, d) rotated in precision F at positions pos[t], as FlashAttention's
// apply_rotary_emb_torch: out = x * cos_rep + rotate_half(x) * sin_rep on the first r features.
template <class F, class X, class C>
Tensor<F> rotary_reference(const Tensor<X>& x, const std::vector<index_t>& pos, const Tensor<C>& cos, const Tensor<C>& sin,
                    bool interleaved, bool inverse = false) {
  const index_t N = x.dim(0), H = x.dim(1), d = x.dim(2), half = cos.dim(1), r = 2 * half;
  Tensor<F> out({N, H, d});
  for (index_t t = 0; t < N; ++t)
    for (index_t h = 0; h < H; ++h)
      for (index_t j = 0; j < d; ++j) {
        const F v = static_cast<F>(x(t, h, j));
        if (j >= r) {
          out(t, h, j) = v;
          continue;
        }
        const index_t k = interleaved ? j / 2 : j % half;  // the tables repeated "(d 2)" or "(2 d)"
        // rotate_half: (-x2, x1) of the halves, or of each pair
        const index_t partner = interleaved ? (j % 2 == 0 ? j + 1 : j - 1) : (j < half ? j + half : j - half);
        const F first = interleaved ? (j % 2 == 0 ? F(-1) : F(1)) : (j < half ? F(-1) : F(1));
        const F rotated = first * static_cast<F>(x(t, h, partner));
        const F c = static_cast<F>(cos(pos[static_cast<std::size_t>(t)], k));
        const F s = static_cast<F>(sin(pos[static_cast<std::size_t>(t)], k)) * (inverse ? F(-1) : F(1));
        out(t, h, j) = v * c + rotated * s;
      }
  return out;
}

// Tables for P positions of a rotary_dim = 2 * half, base 10000 (RoPE's frequencies).
template <class C>
std::pair<Tensor<C>, Tensor<C>> rope_tables(index_t P, index_t half) {
  Tensor<C> cos({P, half}), sin({P, half});
  for (index_t p = 0; p < P; ++p)
    for (index_t k = 0; k < half; ++k) {
      const double angle = static_cast<double>(p) * std::pow(10000.0, -static_cast<double>(k) / static_cast<double>(half));
      cos(p, k) = static_cast<C>(std::cos(angle)), sin(p, k) = static_cast<C>(std::sin(angle));
    }
  return {std::move(cos), std::move(sin)};
}

}  // namespace attn::testing
