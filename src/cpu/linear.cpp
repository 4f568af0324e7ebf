// cpu linear layer (core/kernels.inc): nn.Linear on every row as dense products (cpu/linear.hpp),
// the bias added and summed row by row in a fixed order.
#include "cpu/linear.hpp"

#include "cpu/cpu.hpp"

namespace attn::cpu {

template <class T>
void linear_forward(View4<T> out, View4<const T> x, View4<const T> w, View4<const T> b) {
  rows_times<T>(out, x, w, true);
  if (b.empty()) return;
  const T* bias = b.row(0, 0, 0);
#pragma omp parallel for collapse(3) schedule(static) if (out.B * out.H * out.R * out.C >= 65536)
  for (index_t bi = 0; bi < out.B; ++bi)
    for (index_t h = 0; h < out.H; ++h)
      for (index_t r = 0; r < out.R; ++r) {
        T* o = out.row(bi, h, r);
        for (index_t c = 0; c < out.C; ++c) o[c] += bias[c];
      }
}

template <class T>
void linear_backward(View4<T> dx, View4<T> dw, View4<T> db, View4<const T> dy, View4<const T> x, View4<const T> w) {
  if (!dx.empty()) rows_times<T>(dx, dy, w, false);
  if (!dw.empty()) sum_outer<T>(dw, dy, x);
  if (db.empty()) return;
  T* d = db.row(0, 0, 0);
  for (index_t c = 0; c < db.C; ++c) d[c] = 0;
  for (index_t bi = 0; bi < dy.B; ++bi)
    for (index_t h = 0; h < dy.H; ++h)
      for (index_t r = 0; r < dy.R; ++r) {
        const T* g = dy.row(bi, h, r);
        for (index_t c = 0; c < db.C; ++c) d[c] += g[c];
      }
}

// core/kernels.inc's linear kernels, for float and double.
ATTN_KERNELS_LINEAR(ATTN_INSTANTIATE_KERNEL)

}  // namespace attn::cpu
