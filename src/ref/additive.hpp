// The additive scoring function's formula for one (query, key) pair, in one place: the reference
// (ref/additive.cpp) loops over every pair with it, and the cpu backend's unfused path
// (cpu/additive_unfused.cpp) calls it from its threaded passes. So the formula is checked apart
// from the reference too: the forward and every gradient against PyTorch's numbers
// (test_torch_parity, whose calls ask for the weights and so take the unfused path), the gradients
// by finite differences in float64 (test_additive).
//   qp = W_q q (h,), kp = W_k k (h,), w_v (h,):  score = sum_p w_v[p] tanh(qp[p] + kp[p])
#pragma once

#include <cmath>

#include "core/buffer.hpp"
#include "core/view4.hpp"

namespace attn::ref {

// The intermediates of a call, which the backward recomputes: the projections qp (B, H, n, h) and
// kp (B, H, m, h) and the raw scores (B, H, n, m).
template <class T>
struct AdditiveScores {
  index_t B, H, n, m, h;
  detail::Buffer<T> qp, kp, scores;
  View4<T> qp_view() { return dense_view4(qp.data(), B, H, n, h); }
  View4<T> kp_view() { return dense_view4(kp.data(), B, H, m, h); }
  View4<T> scores_view() { return dense_view4(scores.data(), B, H, n, m); }
};

// score = w_v . tanh(qp + kp) over the hidden size h, summed over p ascending.
template <class T>
T additive_score(const T* qp, const T* kp, const T* w_v, index_t h) {
  T acc = 0;
  for (index_t p = 0; p < h; ++p) acc += w_v[p] * std::tanh(qp[p] + kp[p]);
  return acc;
}

// The gradient of one pair's score, g = dscore, with t = tanh(qp + kp):
//   dt = g w_v (1 - t^2) added to dqp (Row) and to dkp (Col), g t added to dw_v (Row).
// Row and Col let a caller that owns the query row, or the key row, add to it alone.
template <bool Row, bool Col, class T>
void additive_score_backward(T g, const T* qp, const T* kp, const T* w_v, index_t h, T* dqp, T* dw_v, T* dkp) {
  for (index_t p = 0; p < h; ++p) {
    const T t = std::tanh(qp[p] + kp[p]);
    const T dt = g * w_v[p] * (T(1) - t * t);
    if constexpr (Row) dw_v[p] += g * t, dqp[p] += dt;
    if constexpr (Col) dkp[p] += dt;
  }
}

}  // namespace attn::ref
