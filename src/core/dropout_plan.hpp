// Dropout as the kernels apply it: a keep test keyed by (seed, row stream b*H + h, query i, key j)
// through Philox4x32-10 (Random123), so every pass, thread count and tiling agrees.
#pragma once

#include <Random123/philox.h>

#include <cmath>
#include <cstdint>

#include "attn/dropout.hpp"

namespace attn {

struct DropoutPlan {
  bool active = false;
  std::uint32_t threshold = 0;  // a draw r survives when r >= threshold; P(survive) = 1 - threshold / 2^32
  double scale = 1.0;           // 1 / (1 - p), applied to kept weights
  std::uint64_t seed = 0;

  // One Philox call gives four 32-bit draws: keys 4t .. 4t+3 of a row share the counter
  // (t, i, bh, high bits of i) and take lanes 0..3.
  bool keep(index_t bh, index_t i, index_t j) const {
    if (!active) return true;
    return draw(bh, i, j >> 2)[static_cast<int>(j & 3)] >= threshold;
  }

  r123::Philox4x32::ctr_type draw(index_t bh, index_t i, index_t group) const {
    r123::Philox4x32 philox;
    const r123::Philox4x32::key_type key = {{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)}};
    const r123::Philox4x32::ctr_type ctr = {{static_cast<std::uint32_t>(group), static_cast<std::uint32_t>(i),
                                             static_cast<std::uint32_t>(bh),
                                             static_cast<std::uint32_t>((group >> 32) ^ ((i >> 32) << 16))}};
    return philox(ctr, key);
  }
};

// Validates p (attn::Error naming `op` unless 0 <= p < 1) and builds the plan.
inline DropoutPlan plan_dropout(const Dropout& d, const char* op) {
  if (!(d.p >= 0.0 && d.p < 1.0)) detail::fail(op, ": dropout p is ", d.p, "; it must lie in [0, 1)");
  DropoutPlan plan;
  plan.seed = d.seed;
  if (d.p == 0.0) return plan;
  plan.active = true;
  const double t = std::round(d.p * 4294967296.0);
  plan.threshold = t >= 4294967295.0 ? 4294967295u : static_cast<std::uint32_t>(t);
  plan.scale = 1.0 / (1.0 - d.p);
  return plan;
}

}  // namespace attn
