// Reference additive attention (attn/additive.hpp), the d2l chapter's AdditiveAttention as plain loops:
//   queries, keys = W_q(queries), W_k(keys)
//   scores[i, j]  = w_v . tanh(queries[i] + keys[j])
//   out           = dropout(masked_softmax(scores)) @ values
// A pair's score and its gradient are ref/additive.hpp's, which the cpu backend's unfused path
// calls too.
#include <cmath>
#include <vector>

#include "core/buffer.hpp"
#include "ref/additive.hpp"
#include "ref/linear.hpp"
#include "ref/ref.hpp"

namespace attn::ref {
namespace {

// queries (B, H, n, q), keys (B, H, m, k), w_q (1, 1, h, q), w_k (1, 1, h, k), w_v (1, 1, 1, h).
template <class T>
AdditiveScores<T> additive_scores(View4<const T> queries, View4<const T> keys, View4<const T> w_q,
                                  View4<const T> w_k, View4<const T> w_v) {
  AdditiveScores<T> a{queries.B, queries.H, queries.R, keys.R, w_q.R, {}, {}, {}};
  a.qp.resize(static_cast<std::size_t>(a.B * a.H * a.n * a.h));
  a.kp.resize(static_cast<std::size_t>(a.B * a.H * a.m * a.h));
  a.scores.resize(static_cast<std::size_t>(a.B * a.H * a.n * a.m));
  const View4<T> qp = a.qp_view(), kp = a.kp_view(), s = a.scores_view();
  rows_times<T>(qp, queries, w_q, true);  // queries = W_q(queries)
  rows_times<T>(kp, keys, w_k, true);     // keys = W_k(keys)
  for (index_t b = 0; b < a.B; ++b)
    for (index_t hd = 0; hd < a.H; ++hd)
      for (index_t i = 0; i < a.n; ++i)
        for (index_t j = 0; j < a.m; ++j)
          s.at(b, hd, i, j) = additive_score(qp.row(b, hd, i), kp.row(b, hd, j), w_v.row(0, 0, 0), a.h);
  return a;
}

}  // namespace

template <class T>
void additive_forward(View4<T> out, View4<T> weights, View4<const T> queries, View4<const T> keys,
                      View4<const T> values, View4<const T> w_q, View4<const T> w_k, View4<const T> w_v,
                      const MaskPlan<T>& mask, const DropoutPlan& dropout) {
  AdditiveScores<T> a = additive_scores(queries, keys, w_q, w_k, w_v);
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
  AdditiveScores<T> a = additive_scores(queries, keys, w_q, w_k, w_v);
  const index_t B = a.B, H = a.H, n = a.n, m = a.m, h = a.h;
  // weights = masked_softmax(scores), then dscores and dvalues from out = dropout(weights) @ values.
  detail::Buffer<T> weights(a.scores.size()), dscores(a.scores.size());
  const View4<T> w = dense_view4(weights.data(), B, H, n, m), ds = dense_view4(dscores.data(), B, H, n, m);
  masked_softmax_forward<T>(w, a.scores_view(), mask);
  pool_backward<T>(ds, dvalues, dout, w, values, mask, dropout);

  // scores[i, j] = sum_p w_v[p] tanh(qp[i, p] + kp[j, p]), with t = tanh(..):
  //   dw_v[p] = sum dscores[i, j] t,  dqp[i, p] += dt,  dkp[j, p] += dt,  dt = dscores[i, j] w_v[p] (1 - t^2).
  // Masked keys have no score (their dscores is 0 and whatever their rows hold is not read).
  detail::Buffer<T> dqp_buf(a.qp.size()), dkp_buf(a.kp.size());
  const View4<T> dqp = dense_view4(dqp_buf.data(), B, H, n, h), dkp = dense_view4(dkp_buf.data(), B, H, m, h);
  const View4<T> qp = a.qp_view(), kp = a.kp_view();
  for (index_t p = 0; p < h; ++p) dw_v.at(0, 0, 0, p) = 0;
  for (index_t b = 0; b < B; ++b)
    for (index_t hd = 0; hd < H; ++hd)
      for (index_t i = 0; i < n; ++i) {
        const RowMask<T> row = mask.row(b, hd, i);
        for (index_t j = 0; j < m; ++j) {
          if (!row.allowed(j)) continue;
          additive_score_backward<true, true, T>(ds.at(b, hd, i, j), qp.row(b, hd, i), kp.row(b, hd, j), w_v.row(0, 0, 0),
                                                 h, dqp.row(b, hd, i), dw_v.row(0, 0, 0), dkp.row(b, hd, j));
        }
      }
  // queries = W_q(queries): dW_q = sum over rows of dqp^T queries, dqueries = dqp W_q; keys alike.
  sum_outer<T>(dw_q, dqp, queries);
  sum_outer<T>(dw_k, dkp, keys);
  if (!dqueries.empty()) rows_times<T>(dqueries, dqp, w_q, false);
  if (!dkeys.empty()) rows_times<T>(dkeys, dkp, w_k, false);
}

// core/kernels.inc's additive kernels, for float and double.
ATTN_KERNELS_ADDITIVE(ATTN_INSTANTIATE_KERNEL)

}  // namespace attn::ref
