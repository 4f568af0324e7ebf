// Dense matrix products for the layers' linear maps: C (M, N) = A (M, K) B (K, N), A and B read
// through strides (a(r, k) = A[r a_r + k a_k], b(k, c) = B[c b_n + k b_k]: either may be a
// transposed view, so no caller copies a matrix to transpose it), C row-major with leading dimension
// ldc, written or added to. B is packed once per call into panels of kBlockQ columns, (K, kBlockQ)
// each (a contiguous copy when B's rows run along k, a vectorised transpose when they run along c),
// zero past N; then tasks of kBlockMatmulRows rows pack their rows of A by row groups and compute
// their rows of C panel by panel, in depth blocks of kDepthBlock, every row group per depth block, so
// that a panel's block stays in the L1 cache while the rows stream past it. Each element is summed over k in one fixed
// order (gemm-inl.h's depth blocks): the result does not depend on the number of threads.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

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
  index_t ldc, a_r, a_k, b_n, b_k, M, N, K;
  bool accumulate;
  // Optional, K entries: where zero_rows[k] is nonzero, row k of B is read as zeros (the caller's
  // masked rows, whose values may be NaN and must not reach C through a zero of A).
  const std::uint8_t* zero_rows;
  T* panels;  // (ceil(N / kBlockQ), K, kBlockQ)
  simd::Target simd;
};

inline constexpr index_t kBlockMatmulRows = 96;
// A product of fewer multiply-adds (M N K) runs on the calling thread alone.
inline constexpr double kThreadedMatmul = 1 << 18;
// Elements of B's panels for N columns and depth K.
inline std::size_t matmul_panel_elements(index_t N, index_t K) {
  return static_cast<std::size_t>((N + kBlockQ - 1) / kBlockQ * K * kBlockQ);
}
// A task's work space: its rows of A packed by row groups (each group of g rows as (K, g), so that a
// micro-tile's broadcasts read one pointer), and its tile of C for one panel (kBlockMatmulRows, kBlockQ).
template <class T>
struct MatmulArrays {
  T* a;
  T* c;
  MatmulArrays(Carve& carve, index_t K)
      : a(carve.take<T>(static_cast<std::size_t>(kBlockMatmulRows * K))), c(carve.take<T>(kBlockMatmulRows * kBlockQ)) {}
};
template <class T>
struct MatmulPanels {
  T* panels;
  MatmulPanels(Carve& carve, std::size_t count) : panels(carve.take<T>(count)) {}
};

// Panel `panel` of B: columns [panel kBlockQ, + kBlockQ) as (K, kBlockQ).
template <class T>
void matmul_pack(const Matmul<T>& p, index_t panel);
// Rows [r0, r0 + rows) (rows <= kBlockMatmulRows) of C, every panel.
template <class T>
void matmul_rows(const Matmul<T>& p, index_t r0, index_t rows, void* work);

// C (rows, kBlockQ) (+)= A (rows, depth) Bm (depth, kBlockQ), a(r, k) = A[r a_r + k a_k], Bm and C
// dense and aligned to HWY_ALIGNMENT (whole vectors are loaded and stored): the fused kernels' block
// product (gemm-inl.h's BlockGemm: each of the backward's five products and the forward's two)
// alone on the calling thread, for its test and bench/kernels.cpp.
template <class T>
void block_product(T* C, const T* A, index_t a_r, index_t a_k, const T* Bm, index_t rows, index_t depth, bool accumulate,
                   simd::Target simd);

// C (+)= A B, on OpenMP threads when the product is large enough to pay for them.
template <class T>
void matmul(T* C, index_t ldc, const T* A, index_t a_r, index_t a_k, const T* B, index_t b_n, index_t b_k, index_t M,
            index_t N, index_t K, bool accumulate, const std::uint8_t* zero_rows = nullptr) {
  if (M <= 0 || N <= 0) return;
  const index_t row_tiles = (M + kBlockMatmulRows - 1) / kBlockMatmulRows, panels = (N + kBlockQ - 1) / kBlockQ;
  Scratch<MatmulPanels<T>> packed(matmul_panel_elements(N, K));
  const Matmul<T> p{C, A, B, ldc, a_r, a_k, b_n, b_k, M, N, K, accumulate, zero_rows, packed->panels, simd::current()};
  const double work = static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  const auto pack = [&](index_t t, void*) { matmul_pack<T>(p, t); };
  const auto tile = [&](index_t t, void* w) {
    const index_t r0 = t * kBlockMatmulRows;
    matmul_rows<T>(p, r0, std::min(kBlockMatmulRows, M - r0), w);
  };
  run_phases(layout_bytes<MatmulArrays<T>>(K), work >= kThreadedMatmul, dynamic_phase(panels, pack),
             dynamic_phase(row_tiles, tile));
}

}  // namespace attn::cpu::fused
