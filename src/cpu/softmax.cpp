// cpu backend: masked softmax and attention pooling, one (b, h, i) row per OpenMP iteration.
#include <algorithm>
#include <vector>

#include "cpu/cpu.hpp"
#include "cpu/softmax_row.hpp"

namespace attn::cpu {

template <class T>
void masked_softmax_forward(View4<T> weights, View4<const T> scores, const MaskPlan<T>& mask) {
#pragma omp parallel for collapse(3) schedule(static)
  for (index_t b = 0; b < scores.B; ++b)
    for (index_t h = 0; h < scores.H; ++h)
      for (index_t i = 0; i < scores.R; ++i)
        softmax_row(weights.row(b, h, i), scores.row(b, h, i), mask.row(b, h, i), scores.C);
}

template <class T>
void masked_softmax_backward(View4<T> dscores, View4<const T> dweights, View4<const T> weights,
                             const MaskPlan<T>& mask) {
#pragma omp parallel for collapse(3) schedule(static)
  for (index_t b = 0; b < weights.B; ++b)
    for (index_t h = 0; h < weights.H; ++h)
      for (index_t i = 0; i < weights.R; ++i)
        softmax_row_backward(dscores.row(b, h, i), dweights.row(b, h, i), weights.row(b, h, i), mask.row(b, h, i),
                             weights.C);
}

// The weights after dropout of one row: w_j * 1/(1-p) where key j takes part and survives, else 0.
template <class T>
void dropped_weights(T* out, const T* w, const RowMask<T>& rm, const DropoutPlan& dropout, index_t bh, index_t i,
                     index_t m) {
  const T keep_scale = static_cast<T>(dropout.scale);
  for (index_t j = 0; j < m; ++j) out[j] = rm.participates(j) && dropout.keep(bh, i, j) ? w[j] * keep_scale : T(0);
}

template <class T>
void pool_forward(View4<T> out, View4<T> lse, View4<T> weights, View4<const T> scores, View4<const T> values,
                  const MaskPlan<T>& mask, const DropoutPlan& dropout, index_t group) {
  const index_t m = scores.C, v = out.C;
#pragma omp parallel
  {
    std::vector<T> wd(static_cast<std::size_t>(m));
#pragma omp for collapse(3) schedule(static)
    for (index_t b = 0; b < scores.B; ++b)
      for (index_t h = 0; h < scores.H; ++h)
        for (index_t i = 0; i < scores.R; ++i) {
          const RowMask<T> rm = mask.row(b, h, i);
          T* w = weights.row(b, h, i);
          const T row_lse = softmax_row(w, scores.row(b, h, i), rm, m);
          if (!lse.empty()) lse.at(b, h, i, 0) = row_lse;
          dropped_weights(wd.data(), w, rm, dropout, b * scores.H + h, i, m);
          // out_i = sum_j wd_j v_j over the keys with a weight: nothing in a masked key's row is read
          T* o = out.row(b, h, i);
          std::fill(o, o + v, T(0));
          for (index_t j = 0; j < m; ++j) {
            const T a = wd[static_cast<std::size_t>(j)];
            if (a == T(0)) continue;
            const T* vj = values.row(b, h / group, j);
            for (index_t c = 0; c < v; ++c) o[c] += a * vj[c];
          }
        }
  }
}

template <class T>
void pool_backward(View4<T> dscores, View4<T> dvalues, View4<const T> dout, View4<const T> weights,
                   View4<const T> values, const MaskPlan<T>& mask, const DropoutPlan& dropout, index_t group,
                   View4<const T> out) {
  const index_t H = weights.H, n = weights.R, m = weights.C, v = dout.C;
#pragma omp parallel
  {
    std::vector<T> wd(static_cast<std::size_t>(m)), dw(static_cast<std::size_t>(m));
    // out_i = sum_j wd_ij v_j  =>  d w_ij = D_ij s (dout_i . v_j), then the softmax backward.
#pragma omp for collapse(3) schedule(static)
    for (index_t b = 0; b < weights.B; ++b)
      for (index_t h = 0; h < H; ++h)
        for (index_t i = 0; i < n; ++i) {
          const RowMask<T> rm = mask.row(b, h, i);
          const T* w = weights.row(b, h, i);
          const T* g = dout.row(b, h, i);
          dropped_weights(wd.data(), w, rm, dropout, b * H + h, i, m);
          for (index_t j = 0; j < m; ++j) {
            T dot = 0;
            if (wd[static_cast<std::size_t>(j)] != T(0)) {
              const T* vj = values.row(b, h / group, j);
              for (index_t c = 0; c < v; ++c) dot += g[c] * vj[c];
            }
            // wd_ij = w_ij * D_ij s, so d w_ij = (wd_ij / w_ij) (dout_i . v_j) where w_ij != 0
            dw[static_cast<std::size_t>(j)] = wd[static_cast<std::size_t>(j)] != T(0) ? dot * static_cast<T>(dropout.scale) : T(0);
          }
          double given = 0;  // D_i = dout_i . out_i, in double as the fused backward's
          if (!out.empty()) {
            const T* o = out.row(b, h, i);
            for (index_t c = 0; c < v; ++c) given += static_cast<double>(g[c]) * static_cast<double>(o[c]);
          }
          softmax_row_backward(dscores.row(b, h, i), dw.data(), w, rm, m, out.empty() ? nullptr : &given);
        }
    // dv_j = sum over the group's heads h and queries i of wd_ij dout_i: one value row per
    // iteration, so no two threads write the same row.
    if (!dvalues.empty()) {
#pragma omp for collapse(3) schedule(static)
      for (index_t b = 0; b < weights.B; ++b)
        for (index_t hv = 0; hv < dvalues.H; ++hv)
          for (index_t j = 0; j < m; ++j) {
            T* dv = dvalues.row(b, hv, j);
            std::fill(dv, dv + v, T(0));
            for (index_t h = hv * group; h < (hv + 1) * group; ++h)
              for (index_t i = 0; i < n; ++i) {
                const RowMask<T> rm = mask.row(b, h, i);
                if (!rm.participates(j) || !dropout.keep(b * H + h, i, j)) continue;
                const T a = weights.at(b, h, i, j) * static_cast<T>(dropout.scale);
                const T* g = dout.row(b, h, i);
                for (index_t c = 0; c < v; ++c) dv[c] += a * g[c];
              }
          }
    }
  }
}

// core/kernels.inc's softmax and pool kernels, for float and double.
ATTN_KERNELS_SOFTMAX(ATTN_INSTANTIATE_KERNEL)
ATTN_KERNELS_POOL(ATTN_INSTANTIATE_KERNEL)

}  // namespace attn::cpu
