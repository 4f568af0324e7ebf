// Reference building blocks of the scoring functions with a parameter matrix shared by every batch
// element and head (additive, bilinear): a linear map of every row, and that map's gradient with
// respect to the matrix. Plain loops in the precision of T.
#pragma once

#include "core/view4.hpp"

namespace attn::ref {

// x (B, H, R, K), w (1, 1, P, K) or, with transpose_w = false, (1, 1, K, P); out (B, H, R, P):
//   out[b,h,r,p] = sum_c x[b,h,r,c] * w[p,c]     (x w^T, nn.Linear's y = W x per row)
//   out[b,h,r,p] = sum_c x[b,h,r,c] * w[c,p]     (x w, transpose_w = false)
template <class T>
void rows_times(View4<T> out, View4<const T> x, View4<const T> w, bool transpose_w) {
  const index_t P = out.C;
  for (index_t b = 0; b < x.B; ++b)
    for (index_t h = 0; h < x.H; ++h)
      for (index_t r = 0; r < x.R; ++r)
        for (index_t p = 0; p < P; ++p) {
          T acc = 0;
          for (index_t c = 0; c < x.C; ++c) acc += x.at(b, h, r, c) * (transpose_w ? w.at(0, 0, p, c) : w.at(0, 0, c, p));
          out.at(b, h, r, p) = acc;
        }
}

// The gradient of a matrix applied to every row: a (B, H, R, P), x (B, H, R, C), dw (1, 1, P, C),
//   dw[p,c] = sum over b, h, r of a[b,h,r,p] * x[b,h,r,c]     (written, not accumulated)
template <class T>
void sum_outer(View4<T> dw, View4<const T> a, View4<const T> x) {
  for (index_t p = 0; p < dw.R; ++p)
    for (index_t c = 0; c < dw.C; ++c) dw.at(0, 0, p, c) = 0;
  for (index_t b = 0; b < a.B; ++b)
    for (index_t h = 0; h < a.H; ++h)
      for (index_t r = 0; r < a.R; ++r)
        for (index_t p = 0; p < dw.R; ++p)
          for (index_t c = 0; c < dw.C; ++c) dw.at(0, 0, p, c) += a.at(b, h, r, p) * x.at(b, h, r, c);
}

}  // namespace attn::ref
