// The cpu backend's masked softmax of one score row, shared by every attention op of the backend.
#pragma once

#include <cmath>
#include <limits>

#include "core/mask_plan.hpp"

namespace attn::cpu {

// The value softmax sees for key j: score + additive mask where allowed; -1e6 where masked under
// the d2l chapter's fill; -inf (weight exactly 0) where masked otherwise.
template <class T>
T masked_score(const T* s, const RowMask<T>& rm, index_t j) {
  if (rm.allowed(j)) return s[j] + rm.bias_at(j);
  return rm.d2l_fill ? T(-1e6) : -std::numeric_limits<T>::infinity();
}

// w (m) = masked softmax of s (m); w may alias s. Returns the row's log-sum-exp, -inf for an empty
// row, whose weights are then all 0. A NaN among the attended scores makes the row's weights and
// log-sum-exp NaN (as PyTorch's softmax does), even when every attended score is NaN: the maximum
// keeps a NaN once it meets one. Three passes over contiguous memory the compiler vectorises:
// masked values, maximum, exponentials and their sum, then a scale by 1/sum. The sum is kept in
// double: summed in float over hundreds of keys it drifts by several ulp, more than PyTorch's.
// An attention sink (rm.has_sink) is one more score, rm.sink, in the maximum and the sum, with no
// weight of its own.
template <class T>
T softmax_row(T* w, const T* s, const RowMask<T>& rm, index_t m) {
  const T inf = std::numeric_limits<T>::infinity();
  T max = rm.has_sink ? rm.sink : -inf;
  for (index_t j = 0; j < m; ++j) {
    w[j] = masked_score(s, rm, j);
    max = w[j] > max || w[j] != w[j] ? w[j] : max;
  }
  if (max == -inf) {
    for (index_t j = 0; j < m; ++j) w[j] = 0;
    return -inf;
  }
  double sum = rm.has_sink ? std::exp(static_cast<double>(rm.sink) - static_cast<double>(max)) : 0.0;
  for (index_t j = 0; j < m; ++j) {
    w[j] = std::exp(w[j] - max);
    sum += static_cast<double>(w[j]);
  }
  const T inv = static_cast<T>(1.0 / sum);
  for (index_t j = 0; j < m; ++j) w[j] *= inv;
  return max + static_cast<T>(std::log(sum));
}

// ds (m) from dw (m) and w (m): w_j (dw_j - sum_k w_k dw_k) for allowed keys, 0 for masked ones.
// The sum is kept in double: in a peaked row dw_j - sum cancels, and a float sum's drift would
// reach ds directly. *given, when not null, replaces the sum (pool_backward's D from out).
template <class T>
void softmax_row_backward(T* ds, const T* dw, const T* w, const RowMask<T>& rm, index_t m,
                          const double* given = nullptr) {
  double dot = 0;
  for (index_t j = 0; j < m; ++j)
    if (rm.participates(j)) dot += static_cast<double>(w[j]) * static_cast<double>(dw[j]);
  if (given != nullptr) dot = *given;
  for (index_t j = 0; j < m; ++j)
    ds[j] = rm.allowed(j) ? static_cast<T>(static_cast<double>(w[j]) * (static_cast<double>(dw[j]) - dot)) : T(0);
}

}  // namespace attn::cpu
