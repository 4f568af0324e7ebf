// cpu backend, unfused additive attention: queries and keys are projected once (qp = Q W_q^T,
// kp = K W_k^T), the scores w_v . tanh(qp_i + kp_j) are computed row by row with std::tanh into an
// (n, m) buffer (the (n, m, h) features of the d2l chapter's code are never stored), then the shared
// pooling pass. The path for calls that ask for the weights, and the baseline `attn bench`
// measures the fused kernels (cpu/additive.cpp) against.
#include <omp.h>

#include <cmath>
#include <vector>

#include "core/buffer.hpp"
#include "cpu/linear.hpp"
#include "cpu/unfused.hpp"
#include "ref/additive.hpp"

namespace attn::cpu::unfused {
namespace {

// The score of a pair and its gradient are the reference's formula (ref/additive.hpp); this file
// adds the threading, the schedules and the skipping of masked keys.
using ref::additive_score;
using ref::additive_score_backward;
using ref::AdditiveScores;

// queries (B, H, n, q), keys (B, H, m, k), w_q (1, 1, h, q), w_k (1, 1, h, k), w_v (1, 1, 1, h).
// Rows in parallel. Only keys before the row's mask limit are scored (the others are never read);
// their entries are set to 0.
template <class T>
AdditiveScores<T> additive_scores(View4<const T> queries, View4<const T> keys, View4<const T> w_q,
                                  View4<const T> w_k, View4<const T> w_v, const MaskPlan<T>& mask) {
  AdditiveScores<T> a{queries.B, queries.H, queries.R, keys.R, w_q.R, {}, {}, {}};
  a.qp.resize(static_cast<std::size_t>(a.B * a.H * a.n * a.h));
  a.kp.resize(static_cast<std::size_t>(a.B * a.H * a.m * a.h));
  a.scores.resize(static_cast<std::size_t>(a.B * a.H * a.n * a.m));
  const View4<T> qp = a.qp_view(), kp = a.kp_view(), s = a.scores_view();
  rows_times<T>(qp, queries, w_q, true);
  rows_times<T>(kp, keys, w_k, true);
  const T* wv = w_v.row(0, 0, 0);
  const index_t H = a.H, n = a.n, m = a.m, h = a.h;
#pragma omp parallel for collapse(3) schedule(static)
  for (index_t b = 0; b < a.B; ++b)
    for (index_t hd = 0; hd < H; ++hd)
      for (index_t i = 0; i < n; ++i) {
        const index_t end = mask.row(b, hd, i).end;
        const T* qi = qp.row(b, hd, i);
        T* srow = s.row(b, hd, i);
        for (index_t j = 0; j < end; ++j) srow[j] = additive_score(qi, kp.row(b, hd, j), wv, h);
        for (index_t j = end; j < m; ++j) srow[j] = 0;
      }
  return a;
}

// dqp (B, H, n, h) = sum_j dt_ij, dkp (B, H, m, h) = sum_i dt_ij and dwv_row (B, H, n, h), each
// row's share of dw_v, from ds = dscores (B, H, n, m); all three zero on entry. Two schedules
// with the same sums in the same order (over j ascending for a row, over i ascending for a key):
//   - enough (b, h) slabs to occupy the machine: one task per slab, each tanh computed once;
//   - otherwise rows in parallel, then keys in parallel, recomputing the tanh rather than racing on
//     dkp or storing the (n, m, h) tensor.
// The choice depends on the shape and the machine's core count, never on set_num_threads.
// ds is exactly 0 for masked keys: skipping zeros skips them, so whatever their rows hold is not read.
template <class T>
void projection_grads(View4<T> dqp, View4<T> dkp, View4<T> dwv_row, View4<const T> ds, View4<const T> qp,
                      View4<const T> kp, const T* wv) {
  const index_t B = qp.B, H = qp.H, n = qp.R, m = kp.R, h = qp.C;
  if (B * H >= 2 * omp_get_num_procs()) {
#pragma omp parallel for collapse(2) schedule(static)
    for (index_t b = 0; b < B; ++b)
      for (index_t hd = 0; hd < H; ++hd)
        for (index_t i = 0; i < n; ++i)
          for (index_t j = 0; j < m; ++j) {
            const T g = ds.at(b, hd, i, j);
            if (g != T(0))
              additive_score_backward<true, true, T>(g, qp.row(b, hd, i), kp.row(b, hd, j), wv, h, dqp.row(b, hd, i),
                                                  dwv_row.row(b, hd, i), dkp.row(b, hd, j));
          }
    return;
  }
#pragma omp parallel for collapse(3) schedule(static)
  for (index_t b = 0; b < B; ++b)
    for (index_t hd = 0; hd < H; ++hd)
      for (index_t i = 0; i < n; ++i)
        for (index_t j = 0; j < m; ++j) {
          const T g = ds.at(b, hd, i, j);
          if (g != T(0))
            additive_score_backward<true, false, T>(g, qp.row(b, hd, i), kp.row(b, hd, j), wv, h, dqp.row(b, hd, i),
                                                    dwv_row.row(b, hd, i), nullptr);
        }
#pragma omp parallel for collapse(3) schedule(static)
  for (index_t b = 0; b < B; ++b)
    for (index_t hd = 0; hd < H; ++hd)
      for (index_t j = 0; j < m; ++j)
        for (index_t i = 0; i < n; ++i) {
          const T g = ds.at(b, hd, i, j);
          if (g != T(0))
            additive_score_backward<false, true, T>(g, qp.row(b, hd, i), kp.row(b, hd, j), wv, h, nullptr, nullptr,
                                                    dkp.row(b, hd, j));
        }
}

}  // namespace

template <class T>
void additive_forward(View4<T> out, View4<T> weights, View4<const T> queries, View4<const T> keys,
                      View4<const T> values, View4<const T> w_q, View4<const T> w_k, View4<const T> w_v,
                      const MaskPlan<T>& mask, const DropoutPlan& dropout) {
  AdditiveScores<T> a = additive_scores(queries, keys, w_q, w_k, w_v, mask);
  detail::Buffer<T> own_weights;
  if (weights.empty()) {
    own_weights.resize(a.scores.size());
    weights = dense_view4(own_weights.data(), a.B, a.H, a.n, a.m);
  }
  pool_forward<T>(out, {}, weights, a.scores_view(), values, mask, dropout);
}

template <class T>
void additive_backward(View4<T> dqueries, View4<T> dkeys, View4<T> dvalues, View4<T> dw_q, View4<T> dw_k,
                       View4<T> dw_v, View4<const T> dout, View4<const T> queries, View4<const T> keys,
                       View4<const T> values, View4<const T> w_q, View4<const T> w_k, View4<const T> w_v,
                       const MaskPlan<T>& mask, const DropoutPlan& dropout) {
  AdditiveScores<T> a = additive_scores(queries, keys, w_q, w_k, w_v, mask);
  const index_t B = a.B, H = a.H, n = a.n, m = a.m, h = a.h;
  // weights = masked_softmax(scores); the scores are then no longer needed and their buffer
  // receives dscores, from out = dropout(weights) @ values.
  detail::Buffer<T> weights(a.scores.size());
  const View4<T> w = dense_view4(weights.data(), B, H, n, m), ds = a.scores_view();
  masked_softmax_forward<T>(w, ds, mask);
  pool_backward<T>(ds, dvalues, dout, w, values, mask, dropout);

  // scores[i, j] = sum_p w_v[p] tanh(qp[i, p] + kp[j, p]): the gradients of qp, kp and each
  // row's share of dw_v.
  const T* wv = w_v.row(0, 0, 0);
  detail::Buffer<T> dqp_buf(a.qp.size()), dkp_buf(a.kp.size()), dwv_rows(a.qp.size());
  const View4<T> dqp = dense_view4(dqp_buf.data(), B, H, n, h), dkp = dense_view4(dkp_buf.data(), B, H, m, h);
  projection_grads<T>(dqp, dkp, dense_view4(dwv_rows.data(), B, H, n, h), ds, a.qp_view(), a.kp_view(), wv);
  // dw_v: the rows' shares summed in row order.
  T* dwv = dw_v.row(0, 0, 0);
  for (index_t p = 0; p < h; ++p) dwv[p] = 0;
  for (index_t r = 0; r < B * H * n; ++r)
    for (index_t p = 0; p < h; ++p) dwv[p] += dwv_rows[static_cast<std::size_t>(r * h + p)];
  projections_backward<T>(dqueries, dkeys, dw_q, dw_k, dqp, dkp, queries, keys, w_q, w_k);
}

// core/kernels.inc's additive kernels, for float and double.
ATTN_KERNELS_ADDITIVE(ATTN_INSTANTIATE_KERNEL)

}  // namespace attn::cpu::unfused
