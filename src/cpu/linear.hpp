// cpu building blocks of the scoring functions with a parameter matrix shared by every batch element
// and head (additive, bilinear) and of the linear layers: a linear map of every row, and that map's
// gradient with respect to the matrix, as dense products (simd/matmul.hpp). Same contracts as
// ref/linear.hpp. Every output element is summed in a fixed order, so the results do not depend on
// the number of threads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/view4.hpp"
#include "cpu/simd/matmul.hpp"

namespace attn::cpu {

// x (B, H, R, K), w (1, 1, P, K) or, with transpose_w = false, (1, 1, K, P); out (B, H, R, P):
//   out[b,h,r,:] = x[b,h,r,:] w^T     (or x[b,h,r,:] w)
// One dense product per (b, h) (simd/matmul.hpp), reading w through its strides either way, every
// element summed over K in a fixed order.
template <class T>
void rows_times(View4<T> out, View4<const T> x, View4<const T> w, bool transpose_w) {
  const T* M = w.row(0, 0, 0);
  // b(k, p) = w[p][k] (w^T), or w[k][p]
  const index_t b_n = transpose_w ? w.sR : 1, b_k = transpose_w ? 1 : w.sR;
  for (index_t b = 0; b < x.B; ++b)
    for (index_t h = 0; h < x.H; ++h)
      fused::matmul<T>(out.row(b, h, 0), out.sR, x.row(b, h, 0), x.sR, 1, M, b_n, b_k, x.R, out.C, x.C, false);
}

// The gradient of a matrix applied to every row: a (B, H, R, P), x (B, H, R, C), dw (1, 1, P, C),
//   dw[p, :] = sum over b, h, r of a[b,h,r,p] * x[b,h,r,:]     (written, not accumulated)
// One dense product dw = A^T X over all rows, read in place where the rows of a and of x each lie a
// fixed stride apart (else from dense copies). Rows whose a is 0 take no part: a masked key has
// gradient 0, and whatever its row of x holds (NaN) stays out.
template <class T>
void sum_outer(View4<T> dw, View4<const T> a, View4<const T> x) {
  const index_t P = dw.R, C = dw.C, rows = a.B * a.H * a.R;
  const auto even_rows = [](const View4<const T>& v) {
    return (v.H == 1 || v.sH == v.R * v.sR) && (v.B == 1 || v.sB == v.H * v.R * v.sR);
  };
  std::vector<T> a_copy, x_copy;
  View4<const T> ad = a, xd = x;
  if (!even_rows(a) || !even_rows(x)) {  // dense copies, (rows, P) and (rows, C)
    a_copy.resize(static_cast<std::size_t>(rows * P)), x_copy.resize(static_cast<std::size_t>(rows * C));
    index_t r = 0;
    for (index_t b = 0; b < a.B; ++b)
      for (index_t h = 0; h < a.H; ++h)
        for (index_t i = 0; i < a.R; ++i, ++r) {
          std::copy(a.row(b, h, i), a.row(b, h, i) + P, a_copy.begin() + r * P);
          std::copy(x.row(b, h, i), x.row(b, h, i) + C, x_copy.begin() + r * C);
        }
    ad = dense_view4<const T>(a_copy.data(), 1, 1, rows, P), xd = dense_view4<const T>(x_copy.data(), 1, 1, rows, C);
  }
  std::vector<std::uint8_t> unused(static_cast<std::size_t>(rows));
  bool any_unused = false;
  for (index_t r = 0; r < rows; ++r) {
    const T* ar = ad.row(0, 0, 0) + r * ad.sR;
    unused[static_cast<std::size_t>(r)] = std::all_of(ar, ar + P, [](T v) { return v == T(0); });
    any_unused = any_unused || unused[static_cast<std::size_t>(r)] != 0;
  }
  // a(p, r) = a[r][p], b(r, c) = x[r][c]
  fused::matmul<T>(dw.row(0, 0, 0), dw.sR, ad.row(0, 0, 0), 1, ad.sR, xd.row(0, 0, 0), 1, xd.sR, P, C, rows, false,
                   any_unused ? unused.data() : nullptr);
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
