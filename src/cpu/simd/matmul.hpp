// Dense matrix products for the layers' linear maps: C (M, N) = A (M, K) B^T, with B (N, K), all
// row-major with leading dimensions in elements; C written, or added to. Threaded over tiles of
// kBlockMatmulRows rows and kBlockQ columns, each summed over K in one fixed order (gemm-inl.h): the
// result does not depend on the number of threads.
#pragma once

#include <algorithm>
#include <cstddef>

#include "core/view4.hpp"
#include "cpu/scratch.hpp"
#include "cpu/simd/dispatch.hpp"
#include "cpu/simd/fused.hpp"

namespace attn::cpu::fused {

template <class T>
struct Matmul {
  T* C;
  const T* A;
  const T* B;
  index_t ldc, lda, ldb, M, N, K;
  bool accumulate;
  simd::Target simd;
};

// A task's work space: B's rows of the tile transposed (K, kBlockQ), and the tile of C (rows, kBlockQ).
inline constexpr index_t kBlockMatmulRows = 96;
template <class T>
struct MatmulArrays {
  T* bt;
  T* c;
  MatmulArrays(Carve& carve, index_t K)
      : bt(carve.take<T>(static_cast<std::size_t>(K * kBlockQ))), c(carve.take<T>(kBlockMatmulRows * kBlockQ)) {}
};

// Rows [r0, r0 + rows) (rows <= kBlockMatmulRows) and columns [c0, c0 + cols) (cols <= kBlockQ) of C.
template <class T>
void matmul_tile(const Matmul<T>& p, index_t r0, index_t rows, index_t c0, index_t cols, void* work);

// C = A B^T (or C += A B^T), on OpenMP threads when the product is large enough to pay for them.
template <class T>
void matmul_abt(T* C, index_t ldc, const T* A, index_t lda, const T* B, index_t ldb, index_t M, index_t N, index_t K,
                bool accumulate) {
  if (M <= 0 || N <= 0) return;
  const Matmul<T> p{C, A, B, ldc, lda, ldb, M, N, K, accumulate, simd::current()};
  const index_t row_tiles = (M + kBlockMatmulRows - 1) / kBlockMatmulRows, col_tiles = (N + kBlockQ - 1) / kBlockQ;
  const double work = static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  run_tasks(row_tiles * col_tiles, layout_bytes<MatmulArrays<T>>(K), work >= (1 << 18), [&](index_t t, void* w) {
    const index_t r0 = t / col_tiles * kBlockMatmulRows, c0 = t % col_tiles * kBlockQ;
    matmul_tile<T>(p, r0, std::min(kBlockMatmulRows, M - r0), c0, std::min(kBlockQ, N - c0), w);
  });
}

}  // namespace attn::cpu::fused
