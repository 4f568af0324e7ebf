// Dense matrix products C = A B^T for the linear maps of the layers (projections of multi-head and
// additive attention, bilinear's W), with the fused kernels' micro-tiles (gemm-inl.h): per tile of
// kBlockQ columns of C, B's rows are packed transposed (K, kBlockQ) once, and the tile's rows of A
// stream past it. Compiled once per SIMD target (hwy/foreach_target.h).
#include <algorithm>
#include <cstddef>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/simd/matmul.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "cpu/simd/gemm-inl.h"
#include "cpu/simd/matmul.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::fused::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Rows [r0, r0 + rows) and columns [c0, c0 + cols) of C: see matmul.hpp.
template <class T>
void MatmulTile(const Matmul<T>& p, index_t r0, index_t rows, index_t c0, index_t cols, void* work) {
  simd::note_ran(HWY_TARGET);
  const hn::ScalableTag<T> d;
  Carve carve(work);
  const MatmulArrays<T> a(carve, p.K);
  // bt (K, kBlockQ) = rows [c0, c0 + cols) of B transposed, zero past cols.
  for (index_t k = 0; k < p.K; ++k)
    for (index_t c = 0; c < kBlockQ; ++c) a.bt[k * kBlockQ + c] = c < cols ? p.B[(c0 + c) * p.ldb + k] : T(0);
  BlockGemm<false>(d, p.A + r0 * p.lda, p.lda, 1, a.bt, a.c, rows, p.K);
  for (index_t r = 0; r < rows; ++r) {
    T* out = p.C + (r0 + r) * p.ldc + c0;
    const T* tile = a.c + r * kBlockQ;
    if (p.accumulate) {
      for (index_t c = 0; c < cols; ++c) out[c] += tile[c];
    } else {
      for (index_t c = 0; c < cols; ++c) out[c] = tile[c];
    }
  }
}

void MatmulTileF32(const Matmul<float>& p, index_t r0, index_t rows, index_t c0, index_t cols, void* work) {
  MatmulTile(p, r0, rows, c0, cols, work);
}
void MatmulTileF64(const Matmul<double>& p, index_t r0, index_t rows, index_t c0, index_t cols, void* work) {
  MatmulTile(p, r0, rows, c0, cols, work);
}

}  // namespace attn::cpu::fused::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::cpu::fused {

HWY_EXPORT(MatmulTileF32);
HWY_EXPORT(MatmulTileF64);

template <>
void matmul_tile(const Matmul<float>& p, index_t r0, index_t rows, index_t c0, index_t cols, void* work) {
  ATTN_SIMD_CALL(p.simd, MatmulTileF32)(p, r0, rows, c0, cols, work);
}
template <>
void matmul_tile(const Matmul<double>& p, index_t r0, index_t rows, index_t c0, index_t cols, void* work) {
  ATTN_SIMD_CALL(p.simd, MatmulTileF64)(p, r0, rows, c0, cols, work);
}

}  // namespace attn::cpu::fused
#endif  // HWY_ONCE
