// Reference scaled dot-product attention: scores = scale * Q K^T, then attention pooling.
#include <vector>

#include "ref/ref.hpp"

namespace attn::ref {
namespace {

// scores (B, H, n, m) = scale * queries keys^T, every entry (masked ones are simply never read).
template <class T>
std::vector<T> scaled_scores(View4<const T> q, View4<const T> k, T scale) {
  std::vector<T> s(static_cast<std::size_t>(q.B * q.H * q.R * k.R));
  const View4<T> sv = dense_view4(s.data(), q.B, q.H, q.R, k.R);
  for (index_t b = 0; b < q.B; ++b)
    for (index_t h = 0; h < q.H; ++h)
      for (index_t i = 0; i < q.R; ++i)
        for (index_t j = 0; j < k.R; ++j) {
          T dot = 0;
          for (index_t c = 0; c < q.C; ++c) dot += q.at(b, h, i, c) * k.at(b, h, j, c);
          sv.at(b, h, i, j) = scale * dot;
        }
  return s;
}

}  // namespace

template <class T>
void sdpa_forward(View4<T> out, View4<T> lse, View4<T> weights, View4<const T> queries, View4<const T> keys,
                  View4<const T> values, const MaskPlan<T>& mask, T scale, const DropoutPlan& dropout) {
  const std::vector<T> scores = scaled_scores(queries, keys, scale);
  std::vector<T> own_weights;
  if (weights.empty()) {
    own_weights.resize(scores.size());
    weights = dense_view4(own_weights.data(), queries.B, queries.H, queries.R, keys.R);
  }
  pool_forward<T>(out, lse, weights, dense_view4(scores.data(), queries.B, queries.H, queries.R, keys.R), values,
                  mask, dropout);
}

// The reference ignores out and lse and recomputes the weights from the formula.
template <class T>
void sdpa_backward(View4<T> dqueries, View4<T> dkeys, View4<T> dvalues, View4<const T> dout,
                   View4<const T> queries, View4<const T> keys, View4<const T> values, View4<const T> /*out*/,
                   View4<const T> /*lse*/, const MaskPlan<T>& mask, T scale, const DropoutPlan& dropout) {
  const index_t B = queries.B, H = queries.H, n = queries.R, m = keys.R, d = queries.C;
  const std::vector<T> scores = scaled_scores(queries, keys, scale);
  std::vector<T> weights(scores.size()), dscores(scores.size()), out(static_cast<std::size_t>(B * H * n * values.C));
  const View4<T> w = dense_view4(weights.data(), B, H, n, m), ds = dense_view4(dscores.data(), B, H, n, m);
  pool_forward<T>(dense_view4(out.data(), B, H, n, values.C), {}, w, dense_view4(scores.data(), B, H, n, m), values,
                  mask, dropout);
  pool_backward<T>(ds, dvalues, dout, w, values, mask, dropout);
  // s_ij = scale q_i . k_j  =>  dq_i = scale sum_j ds_ij k_j,  dk_j = scale sum_i ds_ij q_i
  // (masked keys have ds_ij = 0 and are skipped, so nothing stored in their rows is read)
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h) {
      if (!dqueries.empty())
        for (index_t i = 0; i < n; ++i)
          for (index_t c = 0; c < d; ++c) {
            T sum = 0;
            for (index_t j = 0; j < m; ++j)
              if (mask.row(b, h, i).allowed(j)) sum += ds.at(b, h, i, j) * keys.at(b, h, j, c);
            dqueries.at(b, h, i, c) = scale * sum;
          }
      if (!dkeys.empty())
        for (index_t j = 0; j < m; ++j)
          for (index_t c = 0; c < d; ++c) {
            T sum = 0;
            for (index_t i = 0; i < n; ++i)
              if (mask.row(b, h, i).allowed(j)) sum += ds.at(b, h, i, j) * queries.at(b, h, i, c);
            dkeys.at(b, h, j, c) = scale * sum;
          }
    }
}

#define ATTN_INSTANTIATE(T)                                                                                         \
  template void sdpa_forward(View4<T>, View4<T>, View4<T>, View4<const T>, View4<const T>, View4<const T>,          \
                             const MaskPlan<T>&, T, const DropoutPlan&);                                           \
  template void sdpa_backward(View4<T>, View4<T>, View4<T>, View4<const T>, View4<const T>, View4<const T>,         \
                              View4<const T>, View4<const T>, View4<const T>, const MaskPlan<T>&, T, const DropoutPlan&);
ATTN_INSTANTIATE(float)
ATTN_INSTANTIATE(double)
#undef ATTN_INSTANTIATE

}  // namespace attn::ref
