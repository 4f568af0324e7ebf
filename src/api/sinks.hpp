// Attention sinks (attn/mask.hpp) on attention computed without them, and their backward. A sink is
// one more score per row with no value, so it changes only each row's normaliser. The forward
// kernels add it when they finish a row (fused::row_end, the unfused and reference softmax rows);
// here, for rows merged from parts (the ring, sdpa_apply_sinks):
//   lse' = log(e^lse + e^sink),   out' = e^(lse - lse') out,
// exact for every mask and dropout (dropout scales weights, not the normaliser). The backward is a
// block's share of a longer attention (sdpa_backward_block): the keys are one block, the sink the
// other, with lse_keys = lse' + log(1 - e^(sink - lse')); and
//   d sink_h = -sum over (b, i) of e^(sink_h - lse'_bhi) (dout_bhi . out'_bhi).
#pragma once

#include <cmath>
#include <limits>

#include "core/view4.hpp"

namespace attn::detail {

// The sink's share of a row whose log-sum-exp over its keys is `lse` (-inf: no key): writes lse'
// and returns e^(lse - lse'), the factor of the row's weights (0 for a row with no key).
template <class T>
T sink_row(T& lse, T sink) {
  if (lse == -std::numeric_limits<T>::infinity()) {
    lse = sink;
    return T(0);
  }
  const T top = std::max(lse, sink), keys = std::exp(lse - top), rest = std::exp(sink - top);
  const T total = top + std::log(keys + rest);
  const T factor = keys / (keys + rest);
  lse = total;
  return factor;
}

// Forward: out (B, H, n, v), lse (B, H, n, 1) and, when not empty, weights (B, H, n, m) of the
// attention over the keys become those of the attention over the keys and the sinks; sink(h) gives
// head h's logit.
template <class T, class Sink>
void apply_sinks(View4<T> out, View4<T> lse, View4<T> weights, const Sink& sink) {
#pragma omp parallel for collapse(2) schedule(static) if (out.B * out.H * out.R * out.C > 65536)
  for (index_t b = 0; b < out.B; ++b)
    for (index_t h = 0; h < out.H; ++h)
      for (index_t i = 0; i < out.R; ++i) {
        const T factor = sink_row(lse.at(b, h, i, 0), static_cast<T>(sink(h)));
        T* o = out.row(b, h, i);
        for (index_t c = 0; c < out.C; ++c) o[c] *= factor;
        if (!weights.empty()) {
          T* w = weights.row(b, h, i);
          for (index_t c = 0; c < weights.C; ++c) w[c] *= factor;
        }
      }
}

// Backward, before the keys' gradients: from lse' (B, H, n, 1), writes lse_keys (the keys' own
// log-sum-exp, -inf where the sink takes the whole row) and dout scaled by e^(lse_keys - lse') into
// scaled (B, H, n, v), unless scaled is empty; writes each head's d sink into dsink(h) (a T&) when dsinks are asked for.
template <class T, class Sink, class DSink>
void sinks_backward(View4<T> scaled, View4<T> lse_keys, View4<const T> dout, View4<const T> out, View4<const T> lse,
                    const Sink& sink, const DSink& dsink, bool want_dsinks) {
  for (index_t h = 0; h < out.H; ++h) {
    double dsum = 0;
    const T s = static_cast<T>(sink(h));
    for (index_t b = 0; b < out.B; ++b)
      for (index_t i = 0; i < out.R; ++i) {
        const T whole = lse.at(b, h, i, 0);
        const T p_sink = whole == -std::numeric_limits<T>::infinity() ? T(1) : std::exp(s - whole);
        const T alpha = p_sink >= T(1) ? T(0) : -std::expm1(s - whole);  // 1 - p_sink, to full precision
        const T* g = dout.row(b, h, i);
        const T* o = out.row(b, h, i);
        double dot = 0;
        for (index_t c = 0; c < out.C; ++c) dot += static_cast<double>(g[c]) * o[c];
        if (!scaled.empty()) {
          lse_keys.at(b, h, i, 0) = alpha == T(0) ? -std::numeric_limits<T>::infinity() : whole + std::log(alpha);
          T* dst = scaled.row(b, h, i);
          for (index_t c = 0; c < out.C; ++c) dst[c] = alpha * g[c];
        }
        if (alpha != T(0)) dsum -= static_cast<double>(p_sink) * dot;
      }
    if (want_dsinks) dsink(h) = static_cast<T>(dsum);
  }
}

}  // namespace attn::detail
