// cpu building blocks of the scoring functions with a parameter matrix shared by every batch element
// and head (additive, bilinear): a linear map of every row, and that map's gradient with respect to
// the matrix. Same contracts as ref/linear.hpp. Every output element is written by one thread with
// a fixed order of summation, so the results do not depend on the number of threads.
#pragma once

#include <vector>

#include "core/view4.hpp"

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
// Rows in parallel (when there is enough work to pay for threads). The matrix is first laid out
// (K, P) so that each row is a sum of K contiguous axpys over P, which the compiler vectorises
// without reordering any sum.
template <class T>
void rows_times(View4<T> out, View4<const T> x, View4<const T> w, bool transpose_w) {
  const std::vector<T> mat = dense_matrix(w, transpose_w);
  const T* M = mat.data();
  const index_t K = x.C, P = out.C;
  const double work = static_cast<double>(x.B) * static_cast<double>(x.H) * static_cast<double>(x.R) *
                      static_cast<double>(K) * static_cast<double>(P);
#pragma omp parallel for collapse(3) schedule(static) if (work >= 65536)
  for (index_t b = 0; b < x.B; ++b)
    for (index_t h = 0; h < x.H; ++h)
      for (index_t r = 0; r < x.R; ++r) {
        T* o = out.row(b, h, r);
        const T* xr = x.row(b, h, r);
        for (index_t p = 0; p < P; ++p) o[p] = 0;
        for (index_t c = 0; c < K; ++c) {
          const T a = xr[c];
          const T* mc = M + c * P;
          for (index_t p = 0; p < P; ++p) o[p] += a * mc[p];
        }
      }
}

// The gradient of a matrix applied to every row: a (B, H, R, P), x (B, H, R, C), dw (1, 1, P, C),
//   dw[p, :] = sum over b, h, r of a[b,h,r,p] * x[b,h,r,:]     (written, not accumulated)
// Parallel over p: each row of dw sums the rows (b, h, r) in order, an axpy over C each. Rows with
// a = 0 are skipped: a masked key has gradient 0, and whatever its row of x holds (NaN) stays out.
// Threads only when there is enough work to pay for them.
template <class T>
void sum_outer(View4<T> dw, View4<const T> a, View4<const T> x) {
  const index_t C = dw.C;
  const double work = static_cast<double>(a.B) * static_cast<double>(a.H) * static_cast<double>(a.R) *
                      static_cast<double>(dw.R) * static_cast<double>(C);
#pragma omp parallel for schedule(static) if (work >= 65536)
  for (index_t p = 0; p < dw.R; ++p) {
    T* d = dw.row(0, 0, p);
    for (index_t c = 0; c < C; ++c) d[c] = 0;
    for (index_t b = 0; b < a.B; ++b)
      for (index_t h = 0; h < a.H; ++h)
        for (index_t r = 0; r < a.R; ++r) {
          const T s = a.at(b, h, r, p);
          if (s == T(0)) continue;
          const T* xr = x.row(b, h, r);
          for (index_t c = 0; c < C; ++c) d[c] += s * xr[c];
        }
  }
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
