// cpu backend: batched matrix multiplication, one dense product per batch item through the SIMD
// matrix product of the layers (simd/matmul.hpp), which reads either operand transposed through its
// strides, so no transpose is copied. Items run in parallel, one a thread, when there are at least
// two a thread or each alone is too small to spread over threads; otherwise each item spreads its
// own rows over the threads. Every element is summed over k in the product's fixed order, so the
// result does not depend on the number of threads.
#include <omp.h>

#include <algorithm>

#include "core/switch_plan.hpp"
#include "cpu/cpu.hpp"
#include "cpu/simd/matmul.hpp"

namespace attn::cpu {
namespace {

// op(x) of one batch item: x, or x transposed, as the strides of its (row, column) entries.
template <class T>
struct Operand {
  View4<const T> x;
  bool transposed;
  index_t cols() const { return transposed ? x.R : x.C; }
  index_t row_stride() const { return transposed ? 1 : x.sR; }
  index_t col_stride() const { return transposed ? x.sR : 1; }
};

// out(b, h) = op(a)(b, h) op(b)(b, h) for every batch item.
template <class T>
void gemm(View4<T> out, Operand<T> a, Operand<T> b) {
  const index_t M = out.R, N = out.C, K = a.cols(), items = out.B * out.H;
  const auto item = [&](index_t t) {
    const index_t bi = t / out.H, h = t % out.H;
    // fused::matmul: a(r, k) = A[r a_r + k a_k], b(k, c) = B[c b_n + k b_k]
    fused::matmul<T>(out.row(bi, h, 0), out.sR, a.x.row(bi, h, 0), a.row_stride(), a.col_stride(), b.x.row(bi, h, 0),
                     b.col_stride(), b.row_stride(), M, N, K, false);
  };
  const double item_work = static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  const bool many_items = items >= 2 * static_cast<index_t>(omp_get_max_threads()) || item_work < fused::kThreadedMatmul;
  if (items > 1 && many_items && item_work * static_cast<double>(items) >= fused::kThreadedMatmul) {
    // Each item's product runs on its thread alone (a nested region): its scratch is checked here,
    // and each thread takes the calling thread's switches (its SIMD target), as the call's own do.
    check_thread_scratch(layout_bytes<fused::MatmulPanels<T>>(fused::matmul_panel_elements(N, K)) +
                         layout_bytes<fused::MatmulArrays<T>>(K));
    const detail::Switches switches = detail::read_switches();
#pragma omp parallel
    {
      const detail::PinSwitches pin(switches);
#pragma omp for schedule(dynamic)
      for (index_t t = 0; t < items; ++t) item(t);
    }
  } else {
    for (index_t t = 0; t < items; ++t) item(t);
  }
}

}  // namespace

template <class T>
void bmm_forward(View4<T> out, View4<const T> a, View4<const T> b, bool transpose_a, bool transpose_b) {
  gemm(out, Operand<T>{a, transpose_a}, Operand<T>{b, transpose_b});
}

// out = op(a) op(b)  =>  d op(a) = dout op(b)^T,  d op(b) = op(a)^T dout.
// With da laid out like a: da = dout op(b)^T, or (transposed a) da = op(b) dout^T. Likewise for db:
// db = op(a)^T dout, or (transposed b) db = dout^T op(a).
template <class T>
void bmm_backward(View4<T> da, View4<T> db, View4<const T> dout, View4<const T> a, View4<const T> b,
                  bool transpose_a, bool transpose_b) {
  if (!da.empty()) {
    if (!transpose_a) {
      gemm<T>(da, Operand<T>{dout, false}, Operand<T>{b, !transpose_b});
    } else {
      gemm<T>(da, Operand<T>{b, transpose_b}, Operand<T>{dout, true});
    }
  }
  if (!db.empty()) {
    if (!transpose_b) {
      gemm<T>(db, Operand<T>{a, !transpose_a}, Operand<T>{dout, false});
    } else {
      gemm<T>(db, Operand<T>{dout, true}, Operand<T>{a, transpose_a});
    }
  }
}

// core/kernels.inc's bmm kernels, for float and double.
ATTN_KERNELS_BMM(ATTN_INSTANTIATE_KERNEL)

}  // namespace attn::cpu
