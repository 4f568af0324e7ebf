// cpu backend, unfused additive attention: queries and keys are projected once (qp = Q W_q^T,
// kp = K W_k^T), the scores w_v . tanh(qp_i + kp_j) are computed row by row into an (n, m) buffer
// (the (n, m, h) features of the seeds' code are never stored), then the shared pooling pass.
#include <cmath>
#include <vector>

#include "cpu/cpu.hpp"
#include "cpu/linear.hpp"

namespace attn::cpu {
namespace {

// The forward's intermediates, recomputed by the backward: qp (B, H, n, h), kp (B, H, m, h) and
// the raw scores (B, H, n, m).
template <class T>
struct AdditiveScores {
  index_t B, H, n, m, h;
  std::vector<T> qp, kp, scores;
  View4<T> qp_view() { return dense_view4(qp.data(), B, H, n, h); }
  View4<T> kp_view() { return dense_view4(kp.data(), B, H, m, h); }
  View4<T> scores_view() { return dense_view4(scores.data(), B, H, n, m); }
};

// w_v . tanh(qi + kj) over the hidden size h.
template <class T>
T additive_score(const T* qi, const T* kj, const T* w_v, index_t h) {
  T acc = 0;
  for (index_t p = 0; p < h; ++p) acc += w_v[p] * std::tanh(qi[p] + kj[p]);
  return acc;
}

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

}  // namespace

template <class T>
void additive_forward(View4<T> out, View4<T> weights, View4<const T> queries, View4<const T> keys,
                      View4<const T> values, View4<const T> w_q, View4<const T> w_k, View4<const T> w_v,
                      const MaskPlan<T>& mask, const DropoutPlan& dropout) {
  AdditiveScores<T> a = additive_scores(queries, keys, w_q, w_k, w_v, mask);
  std::vector<T> own_weights;
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
  std::vector<T> weights(a.scores.size());
  const View4<T> w = dense_view4(weights.data(), B, H, n, m), ds = a.scores_view();
  masked_softmax_forward<T>(w, ds, mask);
  pool_backward<T>(ds, dvalues, dout, w, values, mask, dropout);

  // scores[i, j] = sum_p w_v[p] t_ijp, t_ijp = tanh(qp[i, p] + kp[j, p]):
  //   dt_ijp = dscores[i, j] w_v[p] (1 - t_ijp^2),  dqp[i] = sum_j dt_ij,  dkp[j] = sum_i dt_ij,
  //   dw_v[p] = sum over b, h, i, j of dscores[i, j] t_ijp.
  // Rows i in parallel give dqp and each row's share of dw_v; columns j in parallel give dkp
  // (recomputing t rather than racing on dkp or storing the (n, m, h) tensor). dscores is exactly
  // 0 for masked keys: skipping zeros skips them, so whatever their rows hold is not read.
  const View4<const T> qp = a.qp_view(), kp = a.kp_view();
  const T* wv = w_v.row(0, 0, 0);
  std::vector<T> dqp_buf(a.qp.size()), dkp_buf(a.kp.size()), dwv_rows(a.qp.size());
  const View4<T> dqp = dense_view4(dqp_buf.data(), B, H, n, h), dkp = dense_view4(dkp_buf.data(), B, H, m, h);
  const View4<T> dwv_row = dense_view4(dwv_rows.data(), B, H, n, h);
#pragma omp parallel for collapse(3) schedule(static)
  for (index_t b = 0; b < B; ++b)
    for (index_t hd = 0; hd < H; ++hd)
      for (index_t i = 0; i < n; ++i) {
        const T* qi = qp.row(b, hd, i);
        const T* dsi = ds.row(b, hd, i);
        T* dq = dqp.row(b, hd, i);
        T* dv = dwv_row.row(b, hd, i);
        for (index_t j = 0; j < m; ++j) {
          const T g = dsi[j];
          if (g == T(0)) continue;
          const T* kj = kp.row(b, hd, j);
          for (index_t p = 0; p < h; ++p) {
            const T t = std::tanh(qi[p] + kj[p]);
            dv[p] += g * t;
            dq[p] += g * wv[p] * (T(1) - t * t);
          }
        }
      }
#pragma omp parallel for collapse(3) schedule(static)
  for (index_t b = 0; b < B; ++b)
    for (index_t hd = 0; hd < H; ++hd)
      for (index_t j = 0; j < m; ++j) {
        const T* kj = kp.row(b, hd, j);
        T* dk = dkp.row(b, hd, j);
        for (index_t i = 0; i < n; ++i) {
          const T g = ds.at(b, hd, i, j);
          if (g == T(0)) continue;
          const T* qi = qp.row(b, hd, i);
          for (index_t p = 0; p < h; ++p) {
            const T t = std::tanh(qi[p] + kj[p]);
            dk[p] += g * wv[p] * (T(1) - t * t);
          }
        }
      }
  // dw_v: the rows' shares summed in row order.
  T* dwv = dw_v.row(0, 0, 0);
  for (index_t p = 0; p < h; ++p) dwv[p] = 0;
  for (index_t r = 0; r < B * H * n; ++r)
    for (index_t p = 0; p < h; ++p) dwv[p] += dwv_rows[static_cast<std::size_t>(r * h + p)];
  // qp = queries W_q^T: dW_q = sum over rows of dqp^T queries, dqueries = dqp W_q; keys alike.
  sum_outer<T>(dw_q, dqp, queries);
  sum_outer<T>(dw_k, dkp, keys);
  if (!dqueries.empty()) rows_times<T>(dqueries, dqp, w_q, false);
  if (!dkeys.empty()) rows_times<T>(dkeys, dkp, w_k, false);
}

#define ATTN_INSTANTIATE(T)                                                                                     \
  template void additive_forward(View4<T>, View4<T>, View4<const T>, View4<const T>, View4<const T>,             \
                                 View4<const T>, View4<const T>, View4<const T>, const MaskPlan<T>&,             \
                                 const DropoutPlan&);                                                           \
  template void additive_backward(View4<T>, View4<T>, View4<T>, View4<T>, View4<T>, View4<T>, View4<const T>,   \
                                  View4<const T>, View4<const T>, View4<const T>, View4<const T>, View4<const T>, \
                                  View4<const T>, const MaskPlan<T>&, const DropoutPlan&);
ATTN_INSTANTIATE(float)
ATTN_INSTANTIATE(double)
#undef ATTN_INSTANTIATE

}  // namespace attn::cpu
