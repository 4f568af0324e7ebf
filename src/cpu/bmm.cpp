// cpu backend: batched matrix multiplication, one output row per OpenMP iteration. The inner
// loops run over contiguous memory: an axpy over rows of b (no transpose of b) or a dot product of
// two rows (b transposed, as in Q K^T).
#include <algorithm>
#include <vector>

#include "cpu/cpu.hpp"

namespace attn::cpu {
namespace {

// out(r, :) = sum_k op(a)(r, k) op(b)(k, :) for one batch item.
template <class T>
void gemm_row(T* out, View4<const T> a, View4<const T> b, index_t bi, index_t h, index_t r, bool transpose_a,
              bool transpose_b, index_t cols) {
  const index_t inner = transpose_a ? a.R : a.C;
  auto a_at = [&](index_t k) { return transpose_a ? a.at(bi, h, k, r) : a.at(bi, h, r, k); };
  if (transpose_b) {  // op(b)(k, c) = b(c, k): dot products of contiguous rows
    for (index_t c = 0; c < cols; ++c) {
      const T* bc = b.row(bi, h, c);
      T sum = 0;
      if (transpose_a) {
        for (index_t k = 0; k < inner; ++k) sum += a_at(k) * bc[k];
      } else {
        const T* ar = a.row(bi, h, r);
        for (index_t k = 0; k < inner; ++k) sum += ar[k] * bc[k];
      }
      out[c] = sum;
    }
    return;
  }
  std::fill(out, out + cols, T(0));
  for (index_t k = 0; k < inner; ++k) {
    const T coef = a_at(k);
    const T* bk = b.row(bi, h, k);
    for (index_t c = 0; c < cols; ++c) out[c] += coef * bk[c];
  }
}

// out = op(a) @ op(b), rows in parallel.
template <class T>
void gemm(View4<T> out, View4<const T> a, View4<const T> b, bool transpose_a, bool transpose_b) {
#pragma omp parallel for collapse(3) schedule(static)
  for (index_t bi = 0; bi < out.B; ++bi)
    for (index_t h = 0; h < out.H; ++h)
      for (index_t r = 0; r < out.R; ++r) gemm_row(out.row(bi, h, r), a, b, bi, h, r, transpose_a, transpose_b, out.C);
}

// The transpose of a view: a strided copy is needed because the last dimension must stay
// contiguous; small next to the product that uses it.
template <class T>
std::vector<T> transposed(View4<const T> x) {
  std::vector<T> t(static_cast<std::size_t>(x.B * x.H * x.R * x.C));
  const View4<T> tv = dense_view4(t.data(), x.B, x.H, x.C, x.R);
  for (index_t b = 0; b < x.B; ++b)
    for (index_t h = 0; h < x.H; ++h)
      for (index_t r = 0; r < x.R; ++r)
        for (index_t c = 0; c < x.C; ++c) tv.at(b, h, c, r) = x.at(b, h, r, c);
  return t;
}

}  // namespace

template <class T>
void bmm_forward(View4<T> out, View4<const T> a, View4<const T> b, bool transpose_a, bool transpose_b) {
  gemm(out, a, b, transpose_a, transpose_b);
}

// out = op(a) op(b)  =>  d op(a) = dout op(b)^T,  d op(b) = op(a)^T dout.
// With da laid out like a: da = dout op(b)^T, or (transposed a) da = op(b) dout^T. Likewise for db.
template <class T>
void bmm_backward(View4<T> da, View4<T> db, View4<const T> dout, View4<const T> a, View4<const T> b,
                  bool transpose_a, bool transpose_b) {
  if (!da.empty()) {
    if (!transpose_a) {
      gemm<T>(da, dout, b, false, !transpose_b);
    } else {  // da = op(b) dout^T
      gemm<T>(da, b, dout, transpose_b, true);
    }
  }
  if (!db.empty()) {
    if (!transpose_b) {  // db = op(a)^T dout
      gemm<T>(db, a, dout, !transpose_a, false);
    } else {  // db = dout^T op(a): dout^T needs a contiguous copy
      const std::vector<T> dout_t = transposed(dout);
      gemm<T>(db, dense_view4(dout_t.data(), dout.B, dout.H, dout.C, dout.R), a, false, transpose_a);
    }
  }
}

// core/kernels.inc's bmm kernels, for float and double.
ATTN_KERNELS_BMM(ATTN_INSTANTIATE_KERNEL)

}  // namespace attn::cpu
