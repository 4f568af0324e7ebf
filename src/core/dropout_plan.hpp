// Dropout as the kernels apply it: a keep test keyed by (seed, row stream b*H + h, query i, key j)
// through Philox4x32-10 (Random123), so every pass, thread count and tiling agrees.
#pragma once

#include <Random123/philox.h>

#include <algorithm>
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
  // The call's place in a larger attention (Dropout's offsets): draws are keyed by the larger one's
  // row stream, row and key. call_heads: the call's H, set by the plan.
  index_t row_start = 0, key_start = 0, head_start = 0, heads = 0, call_heads = 1;

  bool shifted() const { return row_start != 0 || key_start != 0 || head_start != 0 || heads != 0; }

  bool keep(index_t bh, index_t i, index_t j) const {
    if (!active) return true;
    if (shifted()) {
      const index_t b = bh / call_heads, h = bh % call_heads, g = key_start + j;
      return draw(b * (heads != 0 ? heads : call_heads) + head_start + h, row_start + i, g >> 2)[static_cast<int>(g & 3)] >=
             threshold;
    }
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

// Validates p (attn::Error naming `op` unless 0 <= p < 1) and the offsets, and builds the plan for
// a call of `call_heads` heads; `offsets`: whether the operation honours Dropout's offsets (draw()
// callers that take four keys at once must then take them one by one when the plan is shifted()).
inline DropoutPlan plan_dropout(const Dropout& d, const char* op, index_t call_heads = 1, bool offsets = false) {
  if (!(d.p >= 0.0 && d.p < 1.0)) detail::fail(op, ": dropout p is ", d.p, "; it must lie in [0, 1)");
  DropoutPlan plan;
  plan.seed = d.seed;
  plan.row_start = d.row_start, plan.key_start = d.key_start, plan.head_start = d.head_start, plan.heads = d.heads;
  plan.call_heads = std::max<index_t>(call_heads, 1);
  if (plan.shifted()) {
    if (!offsets) detail::fail(op, ": dropout's row_start, key_start, head_start and heads apply to scaled dot-product attention only");
    constexpr index_t kMaxStart = index_t(1) << 48;
    if (d.row_start < 0 || d.key_start < 0 || d.head_start < 0 || d.heads < 0 || d.row_start >= kMaxStart ||
        d.key_start >= kMaxStart || d.head_start >= kMaxStart || d.heads >= kMaxStart)
      detail::fail(op, ": dropout's row_start ", d.row_start, ", key_start ", d.key_start, ", head_start ", d.head_start,
                   " and heads ", d.heads, " must lie in [0, 2^48)");
    if (d.heads != 0 && d.head_start + call_heads > d.heads)
      detail::fail(op, ": dropout's head_start ", d.head_start, " plus the call's ", call_heads, " heads pass its heads ",
                   d.heads);
  }
  if (d.p == 0.0) return plan;
  plan.active = true;
  const double t = std::round(d.p * 4294967296.0);
  plan.threshold = t >= 4294967295.0 ? 4294967295u : static_cast<std::uint32_t>(t);
  plan.scale = 1.0 / (1.0 - d.p);
  return plan;
}

}  // namespace attn
