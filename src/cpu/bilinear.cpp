// cpu backend, unfused bilinear attention: qw = Q W once (B, H, n, k), then the scores qw_i . k_j
// row by row into an (n, m) buffer, then the shared pooling pass.
#include <vector>

#include "core/buffer.hpp"
#include "cpu/cpu.hpp"
#include "cpu/linear.hpp"

namespace attn::cpu {
namespace {

// qw (B, H, n, k) = queries W and scores (B, H, n, m) = qw keys^T, which the backward recomputes.
// queries (B, H, n, q), keys (B, H, m, k), w (1, 1, q, k). Rows in parallel; only keys before the
// row's mask limit are scored (the others are never read), their entries are set to 0.
template <class T>
void bilinear_scores(detail::Buffer<T>& qw_buf, detail::Buffer<T>& scores_buf, View4<const T> queries, View4<const T> keys,
                     View4<const T> w, const MaskPlan<T>& mask) {
  const index_t B = queries.B, H = queries.H, n = queries.R, m = keys.R, k = keys.C;
  qw_buf.resize(static_cast<std::size_t>(B * H * n * k));
  scores_buf.resize(static_cast<std::size_t>(B * H * n * m));
  const View4<T> qw = dense_view4(qw_buf.data(), B, H, n, k), s = dense_view4(scores_buf.data(), B, H, n, m);
  rows_times<T>(qw, queries, w, false);
#pragma omp parallel for collapse(3) schedule(static)
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h)
      for (index_t i = 0; i < n; ++i) {
        const index_t end = mask.row(b, h, i).end;
        const T* qi = qw.row(b, h, i);
        T* srow = s.row(b, h, i);
        for (index_t j = 0; j < end; ++j) {
          const T* kj = keys.row(b, h, j);
          T acc = 0;
#pragma omp simd reduction(+ : acc)
          for (index_t c = 0; c < k; ++c) acc += qi[c] * kj[c];
          srow[j] = acc;
        }
        for (index_t j = end; j < m; ++j) srow[j] = 0;
      }
}

}  // namespace

template <class T>
void bilinear_forward(View4<T> out, View4<T> weights, View4<const T> queries, View4<const T> keys,
                      View4<const T> values, View4<const T> w, const MaskPlan<T>& mask, const DropoutPlan& dropout) {
  detail::Buffer<T> qw, scores, own_weights;
  bilinear_scores(qw, scores, queries, keys, w, mask);
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
  bilinear_scores(qw_buf, scores, queries, keys, w, mask);
  // weights = masked_softmax(scores); the scores are then no longer needed and their buffer
  // receives dscores, from out = dropout(weights) @ values.
  detail::Buffer<T> weights(scores.size());
  const View4<T> wt = dense_view4(weights.data(), B, H, n, m), ds = dense_view4(scores.data(), B, H, n, m);
  masked_softmax_forward<T>(wt, ds, mask);
  pool_backward<T>(ds, dvalues, dout, wt, values, mask, dropout);

  // scores[i, j] = qw[i] . keys[j]:  g[i] = dqw[i] = sum_j dscores[i, j] keys[j] (rows in parallel),
  // dkeys[j] = sum_i dscores[i, j] qw[i] (columns in parallel). dscores is exactly 0 for masked
  // keys: skipping zeros skips them, so whatever their rows hold is not read.
  detail::Buffer<T> g_buf(qw_buf.size());
  const View4<T> g = dense_view4(g_buf.data(), B, H, n, k);
  const View4<const T> qw = dense_view4(qw_buf.data(), B, H, n, k);
#pragma omp parallel for collapse(3) schedule(static)
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h)
      for (index_t i = 0; i < n; ++i) {
        T* gi = g.row(b, h, i);
        const T* dsi = ds.row(b, h, i);
        for (index_t j = 0; j < m; ++j) {
          if (dsi[j] == T(0)) continue;
          const T* kj = keys.row(b, h, j);
          for (index_t c = 0; c < k; ++c) gi[c] += dsi[j] * kj[c];
        }
      }
  if (!dkeys.empty()) {
#pragma omp parallel for collapse(3) schedule(static)
    for (index_t b = 0; b < B; ++b)
      for (index_t h = 0; h < H; ++h)
        for (index_t j = 0; j < m; ++j) {
          T* dk = dkeys.row(b, h, j);
          for (index_t c = 0; c < k; ++c) dk[c] = 0;
          for (index_t i = 0; i < n; ++i) {
            const T d = ds.at(b, h, i, j);
            if (d == T(0)) continue;
            const T* qi = qw.row(b, h, i);
            for (index_t c = 0; c < k; ++c) dk[c] += d * qi[c];
          }
        }
  }
  // qw = queries W:  dW = sum over rows of queries^T g,  dqueries = g W^T.
  sum_outer<T>(dw, queries, g);
  if (!dqueries.empty()) rows_times<T>(dqueries, g, w, true);
}

// core/kernels.inc's bilinear kernels, for float and double.
ATTN_KERNELS_BILINEAR(ATTN_INSTANTIATE_KERNEL)

}  // namespace attn::cpu
