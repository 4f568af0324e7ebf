// nn.Linear's default initialisation of a weight or bias, drawn from a counter-based generator instead
// of PyTorch's stream: every element uniform in [-bound, bound] with bound = 1/sqrt(fan_in)
// (kaiming_uniform with a = sqrt(5) for weights, and the same bound for biases).
#pragma once

#include <Random123/philox.h>

#include <cstdint>

#include "attn/tensor.hpp"

namespace attn::detail {

// Fills `t` with U(-bound, bound) from Philox4x32-10 keyed by `seed`. Element e uses the counter
// (e / 2, stream, tag), so each parameter tensor (its own `stream`, its layer's `tag`) gets an
// independent sequence and the values do not depend on how the tensor is filled. 53 random bits
// per value.
template <class T>
void fill_uniform(Tensor<T>& t, double bound, std::uint64_t seed, std::uint32_t stream, std::uint32_t tag) {
  const r123::Philox4x32::key_type key = {{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)}};
  r123::Philox4x32 philox;
  for (index_t e = 0; e < t.numel(); ++e) {
    const auto pair = static_cast<std::uint64_t>(e / 2);
    const r123::Philox4x32::ctr_type ctr = {
        {static_cast<std::uint32_t>(pair), static_cast<std::uint32_t>(pair >> 32), stream, tag}};
    const auto r = philox(ctr, key);
    const int lane = static_cast<int>(e % 2) * 2;
    const std::uint64_t bits = (static_cast<std::uint64_t>(r[lane]) << 32) | r[lane + 1];
    const double u = (static_cast<double>(bits >> 11) + 0.5) * 0x1p-53;  // in (0, 1)
    t[e] = static_cast<T>(bound * (2.0 * u - 1.0));
  }
}

}  // namespace attn::detail
