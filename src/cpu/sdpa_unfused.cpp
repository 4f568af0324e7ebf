// cpu backend, unfused scaled dot-product attention: scores = cap(scale Q K^T) into an (n, m)
// buffer, then the shared pooling pass. The path for calls that ask for the weights, and the
// baseline `attn bench` measures the fused kernels against. The backward recomputes the weights
// from the scores exactly as the forward did (rebuilding them as exp(s - lse) would lose the low bits
// of lse when |s| is large), a block of a longer attention's times e^(lse_block - lse); D comes from
// out when it is given, as in the fused backward.
#include <cmath>
#include <vector>

#include "core/buffer.hpp"
#include "cpu/unfused.hpp"
#include "cpu/softmax_row.hpp"

namespace attn::cpu::unfused {
namespace {

// scores (B, H, n, m) = cap(scale * queries keys^T), with cap(s) = softcap tanh(s / softcap) or s.
// One batched product per key head: its group's query heads against that head seen with a head
// stride of 0 (nothing is copied).
template <class T>
detail::Buffer<T> scaled_scores(const SdpaPlan<T>& p) {
  const View4<const T>& q = p.q;
  const index_t m = p.k.R, G = p.group;
  detail::Buffer<T> s(static_cast<std::size_t>(q.B * q.H * q.R * m));
  if (s.empty()) return s;  // no scores: no head's rows to point at (found by fuzzing)
  const View4<T> sv = dense_view4(s.data(), q.B, q.H, q.R, m);
  for (index_t hk = 0; hk < p.k.H; ++hk) {
    const View4<const T> qg{q.row(0, hk * G, 0), q.B, G, q.R, q.C, q.sB, q.sH, q.sR};
    const View4<const T> kg{p.k.row(0, hk, 0), p.k.B, G, m, p.k.C, p.k.sB, 0, p.k.sR};
    const View4<T> sg{sv.row(0, hk * G, 0), sv.B, G, q.R, m, sv.sB, sv.sH, sv.sR};
    bmm_forward<T>(sg, qg, kg, false, true);
  }
  const index_t total = static_cast<index_t>(s.size());
  const T scale = p.scale, cap = p.softcap;
#pragma omp parallel for schedule(static)
  for (index_t e = 0; e < total; ++e) {
    T& x = s[static_cast<std::size_t>(e)];
    x = cap != T(0) ? cap * std::tanh(x * scale / cap) : x * scale;
  }
  return s;
}

}  // namespace

template <class T>
void sdpa_forward(View4<T> out, View4<T> lse, View4<T> weights, const SdpaPlan<T>& p) {
  const index_t B = p.q.B, H = p.q.H, n = p.q.R, m = p.k.R;
  const detail::Buffer<T> scores = scaled_scores(p);
  detail::Buffer<T> own_weights;
  if (weights.empty()) {
    own_weights.resize(scores.size());
    weights = dense_view4(own_weights.data(), B, H, n, m);
  }
  pool_forward<T>(out, lse, weights, dense_view4(scores.data(), B, H, n, m), p.v, p.mask, p.dropout, p.group);
}

template <class T>
void sdpa_backward(View4<T> dqueries, View4<T> dkeys, View4<T> dvalues, View4<const T> dout, View4<const T> out,
                   View4<const T> lse, const SdpaPlan<T>& p) {
  const index_t B = p.q.B, H = p.q.H, n = p.q.R, m = p.k.R, d = p.q.C;
  detail::Buffer<T> scores = scaled_scores(p);
  detail::Buffer<T> weights(scores.size());
  const View4<T> s = dense_view4(scores.data(), B, H, n, m), w = dense_view4(weights.data(), B, H, n, m);
#pragma omp parallel for collapse(3) schedule(static)
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h)
      for (index_t i = 0; i < n; ++i) {
        T* wi = w.row(b, h, i);
        const T own_lse = softmax_row(wi, s.row(b, h, i), p.mask.row(b, h, i), m);
        if (!p.keys_are_a_block) continue;
        const T factor = block_weight_factor(own_lse, lse.at(b, h, i, 0));
        for (index_t j = 0; j < m; ++j) wi[j] *= factor;
      }
  // The capped scores' tanh, t = s / softcap, before their buffer receives dscores.
  detail::Buffer<T> t;
  if (p.softcap != T(0)) {
    t.resize(scores.size());
    for (std::size_t e = 0; e < scores.size(); ++e) t[e] = scores[e] / p.softcap;
  }
  pool_backward<T>(s, dvalues, dout, w, p.v, p.mask, p.dropout, p.group, out);
  // cap(x) = softcap tanh(x / softcap)  =>  d x = d cap (1 - t^2), with x = scale q . k.
  if (p.softcap != T(0))
    for (std::size_t e = 0; e < scores.size(); ++e) scores[e] *= T(1) - t[e] * t[e];
  // s_ij = scale q_i . k_j  =>  dq_i = scale sum_j ds_ij k_j,  dk_j = scale sum of ds_ij q_i over the
  // queries i of every head of the key head's group. ds is 0 for masked keys; skipping zeros keeps
  // whatever their rows hold out of the sums.
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
            const T a = p.scale * ds[j];
            const T* kj = p.k.row(b, p.kv_head(h), j);
            for (index_t c = 0; c < d; ++c) dq[c] += a * kj[c];
          }
        }
  }
  if (!dkeys.empty()) {
#pragma omp parallel for collapse(3) schedule(static)
    for (index_t b = 0; b < B; ++b)
      for (index_t hk = 0; hk < p.k.H; ++hk)
        for (index_t j = 0; j < m; ++j) {
          T* dk = dkeys.row(b, hk, j);
          for (index_t c = 0; c < d; ++c) dk[c] = 0;
          for (index_t h = hk * p.group; h < (hk + 1) * p.group; ++h)
            for (index_t i = 0; i < n; ++i) {
              const T ds = s.at(b, h, i, j);
              if (ds == T(0)) continue;
              const T a = p.scale * ds;
              const T* qi = p.q.row(b, h, i);
              for (index_t c = 0; c < d; ++c) dk[c] += a * qi[c];
            }
        }
  }
}

// core/kernels.inc's sdpa kernels, for float and double.
ATTN_KERNELS_SDPA(ATTN_INSTANTIATE_KERNEL)

}  // namespace attn::cpu::unfused
