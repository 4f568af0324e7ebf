// Reference bilinear attention (attn/bilinear.hpp) as plain loops:
//   qw[i]        = queries[i]^T W                   (B, H, n, k)
//   scores[i, j] = qw[i] . keys[j]                 = q_i^T W k_j
//   out          = dropout(masked_softmax(scores)) @ values
#include <vector>

#include "core/buffer.hpp"
#include "ref/linear.hpp"
#include "ref/ref.hpp"

namespace attn::ref {
namespace {

// qw (B, H, n, k) = queries W and scores (B, H, n, m) = qw keys^T, which the backward recomputes.
// queries (B, H, n, q), keys (B, H, m, k), w (1, 1, q, k).
template <class T>
void bilinear_scores(detail::Buffer<T>& qw_buf, detail::Buffer<T>& scores_buf, View4<const T> queries, View4<const T> keys,
                     View4<const T> w) {
  const index_t B = queries.B, H = queries.H, n = queries.R, m = keys.R, k = keys.C;
  qw_buf.assign(static_cast<std::size_t>(B * H * n * k), T(0));
  scores_buf.assign(static_cast<std::size_t>(B * H * n * m), T(0));
  const View4<T> qw = dense_view4(qw_buf.data(), B, H, n, k), s = dense_view4(scores_buf.data(), B, H, n, m);
  rows_times<T>(qw, queries, w, false);
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h)
      for (index_t i = 0; i < n; ++i)
        for (index_t j = 0; j < m; ++j) {
          T acc = 0;
          for (index_t c = 0; c < k; ++c) acc += qw.at(b, h, i, c) * keys.at(b, h, j, c);
          s.at(b, h, i, j) = acc;
        }
}

}  // namespace

template <class T>
void bilinear_forward(View4<T> out, View4<T> weights, View4<const T> queries, View4<const T> keys,
                      View4<const T> values, View4<const T> w, const MaskPlan<T>& mask, const DropoutPlan& dropout) {
  detail::Buffer<T> qw, scores, own_weights;
  bilinear_scores(qw, scores, queries, keys, w);
  const index_t B = queries.B, H = queries.H, n = queries.R, m = keys.R;
  if (weights.empty()) {
    own_weights.resize(scores.size());
    weights = dense_view4(own_weights.data(), B, H, n, m);
  }
  pool_forward<T>(out, {}, weights, dense_view4(scores.data(), B, H, n, m), values, mask, dropout);
}

template <class T>
void bilinear_backward(View4<T> dqueries, View4<T> dkeys, View4<T> dvalues, View4<T> dw, View4<const T> dout,
                       View4<const T> queries, View4<const T> keys, View4<const T> values, View4<const T> w,
                       const MaskPlan<T>& mask, const DropoutPlan& dropout) {
  const index_t B = queries.B, H = queries.H, n = queries.R, m = keys.R, k = keys.C;
  detail::Buffer<T> qw_buf, scores;
  bilinear_scores(qw_buf, scores, queries, keys, w);
  // weights = masked_softmax(scores), then dscores and dvalues from out = dropout(weights) @ values.
  detail::Buffer<T> weights(scores.size()), dscores(scores.size());
  const View4<T> wt = dense_view4(weights.data(), B, H, n, m), ds = dense_view4(dscores.data(), B, H, n, m);
  masked_softmax_forward<T>(wt, dense_view4(scores.data(), B, H, n, m), mask);
  pool_backward<T>(ds, dvalues, dout, wt, values, mask, dropout);

  // scores[i, j] = qw[i] . keys[j]:  dkeys[j] = sum_i dscores[i, j] qw[i],  g[i] = dqw[i] = sum_j dscores[i, j] keys[j].
  // Masked keys have no score: they are skipped, so whatever their rows hold is not read.
  detail::Buffer<T> g_buf(qw_buf.size());
  const View4<T> g = dense_view4(g_buf.data(), B, H, n, k);
  const View4<const T> qw = dense_view4(qw_buf.data(), B, H, n, k);
  if (!dkeys.empty())
    for (index_t b = 0; b < B; ++b)
      for (index_t h = 0; h < H; ++h)
        for (index_t j = 0; j < m; ++j)
          for (index_t c = 0; c < k; ++c) dkeys.at(b, h, j, c) = 0;
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h)
      for (index_t i = 0; i < n; ++i) {
        const RowMask<T> row = mask.row(b, h, i);
        for (index_t j = 0; j < m; ++j) {
          if (!row.allowed(j)) continue;
          const T d = ds.at(b, h, i, j);
          for (index_t c = 0; c < k; ++c) {
            g.at(b, h, i, c) += d * keys.at(b, h, j, c);
            if (!dkeys.empty()) dkeys.at(b, h, j, c) += d * qw.at(b, h, i, c);
          }
        }
      }
  // qw = queries W:  dW = sum over rows of queries^T g,  dqueries = g W^T.
  sum_outer<T>(dw, queries, g);
  if (!dqueries.empty()) rows_times<T>(dqueries, g, w, true);
}

// core/kernels.inc's bilinear kernels, for float and double.
ATTN_KERNELS_BILINEAR(ATTN_INSTANTIATE_KERNEL)

}  // namespace attn::ref
