// cpu building blocks of the scoring functions with a parameter matrix shared by every batch element
// and head (additive, bilinear) and of the linear layers: a linear map of every row, and that map's
// gradient with respect to the matrix, as dense products (simd/matmul.hpp). Same contracts as
// ref/linear.hpp. Every output element is summed in a fixed order, so the results do not depend on
// the number of threads.
#pragma once

#include <algorithm>
#include <vector>

#include "core/view4.hpp"
#include "cpu/simd/matmul.hpp"

namespace attn::cpu {

// The (1, 1, R, C) matrix w copied into a dense row-major buffer, (R, C) or transposed (C, R).
template <class T>
std::vector<T> dense_matrix(View4<const T> w, bool transpose) {
  std::vector<T> d(static_cast<std::size_t>(w.R * w.C));
  for (index_t r = 0; r < w.R; ++r)
    for (index_t c = 0; c < w.C; ++c) d[static_cast<std::size_t>(transpose ? c * w.R + r : r * w.C + c)] = w.at(0, 0, r, c);
  return d;
}

// x (B, H, R, K), w (1, 1, P, K) or, with transpose_w = false, (1, 1, K, P); out (B, H, R, P):
//   out[b,h,r,:] = x[b,h,r,:] w^T     (or x[b,h,r,:] w)
// One dense product per (b, h) (simd/matmul.hpp), every element summed over K in a fixed order.
template <class T>
void rows_times(View4<T> out, View4<const T> x, View4<const T> w, bool transpose_w) {
  // The product takes w as (P, K) rows: as it is, or a transposed copy.
  std::vector<T> copy;
  const T* M = w.row(0, 0, 0);
  index_t ldm = w.sR;
  if (!transpose_w) copy = dense_matrix(w, true), M = copy.data(), ldm = x.C;
  for (index_t b = 0; b < x.B; ++b)
    for (index_t h = 0; h < x.H; ++h)
      fused::matmul_abt<T>(out.row(b, h, 0), out.sR, x.row(b, h, 0), x.sR, M, ldm, x.R, out.C, x.C, false);
}

// The gradient of a matrix applied to every row: a (B, H, R, P), x (B, H, R, C), dw (1, 1, P, C),
//   dw[p, :] = sum over b, h, r of a[b,h,r,p] * x[b,h,r,:]     (written, not accumulated)
// One dense product dw = A^T X over all rows, from transposed copies of a and x. Rows whose a is 0
// take no part: a masked key has gradient 0, and whatever its row of x holds (NaN) stays out.
template <class T>
void sum_outer(View4<T> dw, View4<const T> a, View4<const T> x) {
  const index_t P = dw.R, C = dw.C, rows = a.B * a.H * a.R;
  std::vector<T> at(static_cast<std::size_t>(P * rows)), xt(static_cast<std::size_t>(C * rows));
  index_t r = 0;
  for (index_t b = 0; b < a.B; ++b)
    for (index_t h = 0; h < a.H; ++h)
      for (index_t i = 0; i < a.R; ++i, ++r) {
        const T* ar = a.row(b, h, i);
        const T* xr = x.row(b, h, i);
        const bool used = std::any_of(ar, ar + P, [](T v) { return v != T(0); });
        for (index_t p = 0; p < P; ++p) at[static_cast<std::size_t>(p * rows + r)] = ar[p];
        for (index_t c = 0; c < C; ++c) xt[static_cast<std::size_t>(c * rows + r)] = used ? xr[c] : T(0);
      }
  fused::matmul_abt<T>(dw.row(0, 0, 0), dw.sR, at.data(), rows, xt.data(), rows, P, C, rows, false);
}

// The backward of the two projections of additive attention, qp = queries W_q^T and
// kp = keys W_k^T, from dqp (B, H, n, h) and dkp (B, H, m, h): dW_q = sum over rows of dqp^T queries
// and dqueries = dqp W_q (when dqueries is not empty); keys alike.
template <class T>
void projections_backward(View4<T> dqueries, View4<T> dkeys, View4<T> dw_q, View4<T> dw_k, View4<const T> dqp,
                          View4<const T> dkp, View4<const T> queries, View4<const T> keys, View4<const T> w_q,
                          View4<const T> w_k) {
  sum_outer<T>(dw_q, dqp, queries);
  sum_outer<T>(dw_k, dkp, keys);
  if (!dqueries.empty()) rows_times<T>(dqueries, dqp, w_q, false);
  if (!dkeys.empty()) rows_times<T>(dkeys, dkp, w_k, false);
}

}  // namespace attn::cpu
