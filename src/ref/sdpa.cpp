// Reference scaled dot-product attention: scores = scale * Q K^T (soft-capped when asked), then
// attention pooling. Query head h reads key and value head h / group (grouped-query attention).
#include <cmath>
#include <vector>

#include "core/buffer.hpp"
#include "ref/ref.hpp"

namespace attn::ref {
namespace {

// scores (B, H, n, m) = cap(scale * queries keys^T), every entry (masked ones are simply never
// read); cap(s) = softcap tanh(s / softcap), or s without soft-capping. With `tanh_out`, also
// tanh(s / softcap) per entry, for the backward.
template <class T>
detail::Buffer<T> scores_of(const SdpaPlan<T>& p, detail::Buffer<T>* tanh_out = nullptr) {
  const View4<const T>& q = p.q;
  const index_t m = p.k.R;
  detail::Buffer<T> s;  // (B, H, n, m), dense
  s.reserve(static_cast<std::size_t>(q.B * q.H * q.R * m));
  if (tanh_out != nullptr) tanh_out->clear();
  for (index_t b = 0; b < q.B; ++b)
    for (index_t h = 0; h < q.H; ++h)
      for (index_t i = 0; i < q.R; ++i)
        for (index_t j = 0; j < m; ++j) {
          T dot = 0;
          for (index_t c = 0; c < q.C; ++c) dot += q.at(b, h, i, c) * p.k.at(b, p.kv_head(h), j, c);
          T score = p.scale * dot;
          if (p.softcap != T(0)) {
            const T t = std::tanh(score / p.softcap);
            score = p.softcap * t;
            if (tanh_out != nullptr) tanh_out->push_back(t);
          }
          s.push_back(score);
        }
  return s;
}

}  // namespace

template <class T>
void sdpa_forward(View4<T> out, View4<T> lse, View4<T> weights, const SdpaPlan<T>& p) {
  const index_t B = p.q.B, H = p.q.H, n = p.q.R, m = p.k.R;
  const detail::Buffer<T> scores = scores_of(p);
  detail::Buffer<T> own_weights;
  if (weights.empty()) {
    own_weights.resize(scores.size());
    weights = dense_view4(own_weights.data(), B, H, n, m);
  }
  pool_forward<T>(out, lse, weights, dense_view4(scores.data(), B, H, n, m), p.v, p.mask, p.dropout, p.group);
}

// The reference recomputes the weights from the formula (the block of a longer attention's times
// e^(lse_block - lse), block_weight_factor); out, when given, gives D (pool_backward).
template <class T>
void sdpa_backward(View4<T> dqueries, View4<T> dkeys, View4<T> dvalues, View4<const T> dout, View4<const T> given_out,
                   View4<const T> lse, const SdpaPlan<T>& p) {
  const index_t B = p.q.B, H = p.q.H, n = p.q.R, m = p.k.R, d = p.q.C;
  detail::Buffer<T> t;  // tanh(s / softcap)
  const detail::Buffer<T> scores = scores_of(p, &t);
  detail::Buffer<T> weights(scores.size()), dscores(scores.size()), out(static_cast<std::size_t>(B * H * n * p.v.C));
  detail::Buffer<T> own_lse(p.keys_are_a_block ? static_cast<std::size_t>(B * H * n) : 0);
  const View4<T> w = dense_view4(weights.data(), B, H, n, m), ds = dense_view4(dscores.data(), B, H, n, m);
  const View4<T> lb = p.keys_are_a_block ? dense_view4(own_lse.data(), B, H, n, 1) : View4<T>{};
  pool_forward<T>(dense_view4(out.data(), B, H, n, p.v.C), lb, w, dense_view4(scores.data(), B, H, n, m), p.v,
                  p.mask, p.dropout, p.group);
  if (p.keys_are_a_block)
    for (index_t b = 0; b < B; ++b)
      for (index_t h = 0; h < H; ++h)
        for (index_t i = 0; i < n; ++i) {
          const T factor = block_weight_factor(lb.at(b, h, i, 0), lse.at(b, h, i, 0));
          for (index_t j = 0; j < m; ++j) w.at(b, h, i, j) *= factor;
        }
  pool_backward<T>(ds, dvalues, dout, w, p.v, p.mask, p.dropout, p.group, given_out);
  // cap(s) = softcap tanh(s / softcap)  =>  d s = d cap (1 - tanh^2)
  if (p.softcap != T(0))
    for (std::size_t e = 0; e < dscores.size(); ++e) dscores[e] *= T(1) - t[e] * t[e];
  // s_ij = scale q_i . k_j  =>  dq_i = scale sum_j ds_ij k_j,  dk_j = scale sum over the group's
  // heads and their queries i of ds_ij q_i (masked keys have ds_ij = 0 and are skipped, so nothing
  // stored in their rows is read)
  for (index_t b = 0; b < B; ++b) {
    for (index_t h = 0; h < H; ++h)
      if (!dqueries.empty())
        for (index_t i = 0; i < n; ++i)
          for (index_t c = 0; c < d; ++c) {
            T sum = 0;
            for (index_t j = 0; j < m; ++j)
              if (p.mask.row(b, h, i).allowed(j)) sum += ds.at(b, h, i, j) * p.k.at(b, p.kv_head(h), j, c);
            dqueries.at(b, h, i, c) = p.scale * sum;
          }
    if (!dkeys.empty())
      for (index_t hk = 0; hk < p.k.H; ++hk)
        for (index_t j = 0; j < m; ++j)
          for (index_t c = 0; c < d; ++c) {
            T sum = 0;
            for (index_t h = hk * p.group; h < (hk + 1) * p.group; ++h)
              for (index_t i = 0; i < n; ++i)
                if (p.mask.row(b, h, i).allowed(j)) sum += ds.at(b, h, i, j) * p.q.at(b, h, i, c);
            dkeys.at(b, hk, j, c) = p.scale * sum;
          }
  }
}

// core/kernels.inc's sdpa kernels, for float and double.
ATTN_KERNELS_SDPA(ATTN_INSTANTIATE_KERNEL)

}  // namespace attn::ref
