// cpu backend, unfused scaled dot-product attention: scores = scale Q K^T into an (n, m) buffer,
// then the shared pooling pass. The path for calls that ask for the weights, and the baseline
// `attn bench` measures the fused kernels against. The backward recomputes the weights from the scores exactly as the
// forward did (rebuilding them as exp(s - lse) would lose the low bits of lse when |s| is large).
#include <vector>

#include "cpu/unfused.hpp"
#include "cpu/softmax_row.hpp"

namespace attn::cpu::unfused {
namespace {

// scores (B, H, n, m) = scale * queries keys^T, rows in parallel.
template <class T>
std::vector<T> scaled_scores(View4<const T> q, View4<const T> k, T scale) {
  std::vector<T> s(static_cast<std::size_t>(q.B * q.H * q.R * k.R));
  const View4<T> sv = dense_view4(s.data(), q.B, q.H, q.R, k.R);
  bmm_forward<T>(sv, q, k, false, true);
  const index_t total = static_cast<index_t>(s.size());
#pragma omp parallel for schedule(static)
  for (index_t e = 0; e < total; ++e) s[static_cast<std::size_t>(e)] *= scale;
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

template <class T>
void sdpa_backward(View4<T> dqueries, View4<T> dkeys, View4<T> dvalues, View4<const T> dout,
                   View4<const T> queries, View4<const T> keys, View4<const T> values, View4<const T> /*out*/,
                   View4<const T> /*lse*/, const MaskPlan<T>& mask, T scale, const DropoutPlan& dropout) {
  const index_t B = queries.B, H = queries.H, n = queries.R, m = keys.R, d = queries.C;
  std::vector<T> scores = scaled_scores(queries, keys, scale);
  std::vector<T> weights(scores.size());
  const View4<T> s = dense_view4(scores.data(), B, H, n, m), w = dense_view4(weights.data(), B, H, n, m);
#pragma omp parallel for collapse(3) schedule(static)
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h)
      for (index_t i = 0; i < n; ++i)
        softmax_row(w.row(b, h, i), s.row(b, h, i), mask.row(b, h, i), m);
  // The scores are no longer needed: their buffer receives dscores.
  pool_backward<T>(s, dvalues, dout, w, values, mask, dropout);
  // s_ij = scale q_i . k_j  =>  dq_i = scale sum_j ds_ij k_j,  dk_j = scale sum_i ds_ij q_i.
  // ds is 0 for masked keys; skipping zeros keeps whatever their rows hold out of the sums.
  if (!dqueries.empty()) {
#pragma omp parallel for collapse(3) schedule(static)
    for (index_t b = 0; b < B; ++b)
      for (index_t h = 0; h < H; ++h)
        for (index_t i = 0; i < n; ++i) {
          T* dq = dqueries.row(b, h, i);
          for (index_t c = 0; c < d; ++c) dq[c] = 0;
          const T* ds = s.row(b, h, i);
          for (index_t j = 0; j < m; ++j) {
            if (ds[j] == T(0)) continue;
            const T a = scale * ds[j];
            const T* kj = keys.row(b, h, j);
            for (index_t c = 0; c < d; ++c) dq[c] += a * kj[c];
          }
        }
  }
  if (!dkeys.empty()) {
#pragma omp parallel for collapse(3) schedule(static)
    for (index_t b = 0; b < B; ++b)
      for (index_t h = 0; h < H; ++h)
        for (index_t j = 0; j < m; ++j) {
          T* dk = dkeys.row(b, h, j);
          for (index_t c = 0; c < d; ++c) dk[c] = 0;
          for (index_t i = 0; i < n; ++i) {
            const T ds = s.at(b, h, i, j);
            if (ds == T(0)) continue;
            const T a = scale * ds;
            const T* qi = queries.row(b, h, i);
            for (index_t c = 0; c < d; ++c) dk[c] += a * qi[c];
          }
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

}  // namespace attn::cpu::unfused
