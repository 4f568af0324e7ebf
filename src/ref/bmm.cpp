// Reference batched matrix multiplication: out[r, c] = sum_k op(a)[r, k] op(b)[k, c] per (b, h).
#include "ref/ref.hpp"

namespace attn::ref {
namespace {

// op(x)[r, c] for a (maybe transposed) matrix of batch item (b, h).
template <class T>
T element(View4<const T> x, index_t b, index_t h, index_t r, index_t c, bool transpose) {
  return transpose ? x.at(b, h, c, r) : x.at(b, h, r, c);
}

}  // namespace

template <class T>
void bmm_forward(View4<T> out, View4<const T> a, View4<const T> b, bool transpose_a, bool transpose_b) {
  const index_t inner = transpose_a ? a.R : a.C;
  for (index_t bi = 0; bi < out.B; ++bi)
    for (index_t h = 0; h < out.H; ++h)
      for (index_t r = 0; r < out.R; ++r)
        for (index_t c = 0; c < out.C; ++c) {
          T sum = 0;
          for (index_t k = 0; k < inner; ++k)
            sum += element(a, bi, h, r, k, transpose_a) * element(b, bi, h, k, c, transpose_b);
          out.at(bi, h, r, c) = sum;
        }
}

template <class T>
void bmm_backward(View4<T> da, View4<T> db, View4<const T> dout, View4<const T> a, View4<const T> b,
                  bool transpose_a, bool transpose_b) {
  const index_t inner = transpose_a ? a.R : a.C;
  for (index_t bi = 0; bi < dout.B; ++bi)
    for (index_t h = 0; h < dout.H; ++h) {
      // out = op(a) op(b)  =>  d op(a) = dout op(b)^T,  d op(b) = op(a)^T dout
      if (!da.empty())
        for (index_t r = 0; r < dout.R; ++r)
          for (index_t k = 0; k < inner; ++k) {
            T sum = 0;
            for (index_t c = 0; c < dout.C; ++c) sum += dout.at(bi, h, r, c) * element(b, bi, h, k, c, transpose_b);
            (transpose_a ? da.at(bi, h, k, r) : da.at(bi, h, r, k)) = sum;
          }
      if (!db.empty())
        for (index_t k = 0; k < inner; ++k)
          for (index_t c = 0; c < dout.C; ++c) {
            T sum = 0;
            for (index_t r = 0; r < dout.R; ++r) sum += element(a, bi, h, r, k, transpose_a) * dout.at(bi, h, r, c);
            (transpose_b ? db.at(bi, h, c, k) : db.at(bi, h, k, c)) = sum;
          }
    }
}

// core/kernels.inc's bmm kernels, for float and double.
ATTN_KERNELS_BMM(ATTN_INSTANTIATE_KERNEL)

}  // namespace attn::ref
