// Reference linear layer (core/kernels.inc): nn.Linear on every row, and its gradients, as plain
// loops (ref/linear.hpp).
#include "ref/linear.hpp"

#include "ref/ref.hpp"

namespace attn::ref {

template <class T>
void linear_forward(View4<T> out, View4<const T> x, View4<const T> w, View4<const T> b) {
  rows_times<T>(out, x, w, true);
  if (b.empty()) return;
  for (index_t bi = 0; bi < out.B; ++bi)
    for (index_t h = 0; h < out.H; ++h)
      for (index_t r = 0; r < out.R; ++r)
        for (index_t c = 0; c < out.C; ++c) out.at(bi, h, r, c) += b.at(0, 0, 0, c);
}

template <class T>
void linear_backward(View4<T> dx, View4<T> dw, View4<T> db, View4<const T> dy, View4<const T> x, View4<const T> w) {
  if (!dx.empty()) rows_times<T>(dx, dy, w, false);
  if (!dw.empty()) sum_outer<T>(dw, dy, x);
  if (db.empty()) return;
  for (index_t c = 0; c < db.C; ++c) {
    T sum = 0;
    for (index_t bi = 0; bi < dy.B; ++bi)
      for (index_t h = 0; h < dy.H; ++h)
        for (index_t r = 0; r < dy.R; ++r) sum += dy.at(bi, h, r, c);
    db.at(0, 0, 0, c) = sum;
  }
}

// core/kernels.inc's linear kernels, for float and double.
ATTN_KERNELS_LINEAR(ATTN_INSTANTIATE_KERNEL)

}  // namespace attn::ref
