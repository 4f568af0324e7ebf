// Dense matrix products C = A B for the linear maps of the layers (projections of multi-head and
// additive attention, bilinear's W): B packed into panels once per call, then tiles of C from the
// fused kernels' micro-tiles (gemm-inl.h), depth block by depth block (matmul.hpp). Compiled once
// per SIMD target (hwy/foreach_target.h).
#include <algorithm>
#include <cstddef>
#include <cstring>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/simd/matmul.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "cpu/simd/gemm-inl.h"
#include "cpu/simd/matmul.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::fused::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <class T>
void MatmulPack(const Matmul<T>& p, index_t panel) {
  simd::note_ran(HWY_TARGET);
  const index_t c0 = panel * kBlockQ, cols = std::min(kBlockQ, p.N - c0);
  T* dst = p.panels + panel * p.K * kBlockQ;
  if (p.b_n == 1) {  // rows along k: copies
    for (index_t k = 0; k < p.K; ++k) std::memcpy(dst + k * kBlockQ, p.B + k * p.b_k + c0, sizeof(T) * static_cast<std::size_t>(cols));
  } else if (p.b_k == 1) {  // rows along c: a transpose
    TransposeInto(dst, kBlockQ, p.B + c0 * p.b_n, p.b_n, cols, p.K);
  } else {
    for (index_t k = 0; k < p.K; ++k)
      for (index_t c = 0; c < cols; ++c) dst[k * kBlockQ + c] = p.B[(c0 + c) * p.b_n + k * p.b_k];
  }
  for (index_t k = 0; k < p.K; ++k) {
    T* row = dst + k * kBlockQ;
    if (p.zero_rows != nullptr && p.zero_rows[k] != 0) std::fill(row, row + cols, T(0));
    std::fill(row + cols, row + kBlockQ, T(0));
  }
}

// Rows per micro-tile: 12 on AVX-512 (24 accumulators of its 32 registers), 6 elsewhere (12 of
// AVX2's 16); the rows left over in groups of 6 and fewer.
#if HWY_TARGET <= HWY_AVX3
constexpr int kGroup = 12;
#else
constexpr int kGroup = 6;
#endif

// The row groups of a task's rows: [r, r + size) for sizes kGroup, then 6, then what is left.
template <class F>
void ForEachGroup(index_t rows, const F& f) {
  index_t r = 0;
  for (; r + kGroup <= rows; r += kGroup) f(r, index_t{kGroup});
  for (; r + 6 <= rows; r += 6) f(r, index_t{6});
  if (r < rows) f(r, rows - r);
}

// The g rows of a group over depth [k0, k1), A packed (K, g): the first block writes, later ones add.
template <int R, class D, class T>
HWY_INLINE void GroupRows(D d, const T* A, const T* panel, T* c, index_t k0, index_t k1) {
  if (k0 == 0) {
    MicroTile<R, false>(d, A, 1, R, panel, c, k0, k1);
  } else {
    MicroTile<R, true>(d, A, 1, R, panel, c, k0, k1);
  }
}

template <class D, class T>
HWY_INLINE void Group(D d, index_t g, const T* A, const T* panel, T* c, index_t k0, index_t k1) {
  switch (g) {
    case kGroup: GroupRows<kGroup>(d, A, panel, c, k0, k1); break;
#if HWY_TARGET <= HWY_AVX3
    case 6: GroupRows<6>(d, A, panel, c, k0, k1); break;
#endif
    case 5: GroupRows<5>(d, A, panel, c, k0, k1); break;
    case 4: GroupRows<4>(d, A, panel, c, k0, k1); break;
    case 3: GroupRows<3>(d, A, panel, c, k0, k1); break;
    case 2: GroupRows<2>(d, A, panel, c, k0, k1); break;
    case 1: GroupRows<1>(d, A, panel, c, k0, k1); break;
    default: break;
  }
}

template <class T>
void MatmulRows(const Matmul<T>& p, index_t r0, index_t rows, void* work) {
  simd::note_ran(HWY_TARGET);
  const hn::ScalableTag<T> d;
  Carve carve(work);
  const MatmulArrays<T> a(carve, p.K);
  // The rows of A by groups: group [r, r + g) at a.a + r K as (K, g).
  ForEachGroup(rows, [&](index_t r, index_t g) {
    T* dst = a.a + r * p.K;
    const T* src = p.A + (r0 + r) * p.a_r;
    if (p.a_k == 1) {
      TransposeInto(dst, g, src, p.a_r, g, p.K);
    } else if (p.a_r == 1) {
      for (index_t k = 0; k < p.K; ++k) std::memcpy(dst + k * g, src + k * p.a_k, sizeof(T) * static_cast<std::size_t>(g));
    } else {
      for (index_t k = 0; k < p.K; ++k)
        for (index_t i = 0; i < g; ++i) dst[k * g + i] = src[i * p.a_r + k * p.a_k];
    }
  });
  for (index_t panel = 0; panel * kBlockQ < p.N; ++panel) {
    const T* B = p.panels + panel * p.K * kBlockQ;
    if (p.K == 0) std::fill(a.c, a.c + rows * kBlockQ, T(0));
    // Depth blocks outermost: each block of the panel (kDepthBlock x kBlockQ) is read by every row
    // group while it is in the L1 cache. Each element still sums its blocks in order, as BlockGemm.
    for (index_t k0 = 0; k0 < p.K; k0 += kDepthBlock) {
      const index_t k1 = std::min(p.K, k0 + kDepthBlock);
      ForEachGroup(rows, [&](index_t r, index_t g) { Group(d, g, a.a + r * p.K, B, a.c + r * kBlockQ, k0, k1); });
    }
    const index_t c0 = panel * kBlockQ, cols = std::min(kBlockQ, p.N - c0);
    for (index_t r = 0; r < rows; ++r) {
      T* out = p.C + (r0 + r) * p.ldc + c0;
      const T* tile = a.c + r * kBlockQ;
      if (p.accumulate) {
        for (index_t c = 0; c < cols; ++c) out[c] += tile[c];
      } else {
        std::memcpy(out, tile, sizeof(T) * static_cast<std::size_t>(cols));
      }
    }
  }
}

// block_product (matmul.hpp). A read transposed (a_r = 1) takes BlockGemm with a_r written 1, as the
// fused kernels call it (the values of the output's product, the keys of dQ's): with a_r known only
// at run time, GCC keeps the micro-tile's row offsets in vector registers and on the stack, a move
// before each broadcast (64 x 64 x 64 on a Zen 5, one thread, avx3: 144-164 GFLOP/s against 205-217).
template <class T>
void BlockProduct(T* C, const T* A, index_t a_r, index_t a_k, const T* Bm, index_t rows, index_t depth,
                  bool accumulate) {
  simd::note_ran(HWY_TARGET);
  const hn::ScalableTag<T> d;
  if (a_r == 1) {
    if (accumulate) {
      BlockGemm<true>(d, A, 1, a_k, Bm, C, rows, depth);
    } else {
      BlockGemm<false>(d, A, 1, a_k, Bm, C, rows, depth);
    }
  } else if (accumulate) {
    BlockGemm<true>(d, A, a_r, a_k, Bm, C, rows, depth);
  } else {
    BlockGemm<false>(d, A, a_r, a_k, Bm, C, rows, depth);
  }
}

void BlockProductF32(float* C, const float* A, index_t a_r, index_t a_k, const float* Bm, index_t rows, index_t depth,
                     bool accumulate) {
  BlockProduct(C, A, a_r, a_k, Bm, rows, depth, accumulate);
}
void BlockProductF64(double* C, const double* A, index_t a_r, index_t a_k, const double* Bm, index_t rows,
                     index_t depth, bool accumulate) {
  BlockProduct(C, A, a_r, a_k, Bm, rows, depth, accumulate);
}
void MatmulPackF32(const Matmul<float>& p, index_t panel) { MatmulPack(p, panel); }
void MatmulPackF64(const Matmul<double>& p, index_t panel) { MatmulPack(p, panel); }
void MatmulRowsF32(const Matmul<float>& p, index_t r0, index_t rows, void* work) { MatmulRows(p, r0, rows, work); }
void MatmulRowsF64(const Matmul<double>& p, index_t r0, index_t rows, void* work) { MatmulRows(p, r0, rows, work); }

}  // namespace attn::cpu::fused::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::cpu::fused {

HWY_EXPORT(BlockProductF32);
HWY_EXPORT(BlockProductF64);
HWY_EXPORT(MatmulPackF32);
HWY_EXPORT(MatmulPackF64);
HWY_EXPORT(MatmulRowsF32);
HWY_EXPORT(MatmulRowsF64);

template <>
void block_product(float* C, const float* A, index_t a_r, index_t a_k, const float* Bm, index_t rows, index_t depth,
                   bool accumulate, simd::Target simd) {
  ATTN_SIMD_CALL(simd, BlockProductF32)(C, A, a_r, a_k, Bm, rows, depth, accumulate);
}
template <>
void block_product(double* C, const double* A, index_t a_r, index_t a_k, const double* Bm, index_t rows, index_t depth,
                   bool accumulate, simd::Target simd) {
  ATTN_SIMD_CALL(simd, BlockProductF64)(C, A, a_r, a_k, Bm, rows, depth, accumulate);
}
template <>
void matmul_pack(const Matmul<float>& p, index_t panel) {
  ATTN_SIMD_CALL(p.simd, MatmulPackF32)(p, panel);
}
template <>
void matmul_pack(const Matmul<double>& p, index_t panel) {
  ATTN_SIMD_CALL(p.simd, MatmulPackF64)(p, panel);
}
template <>
void matmul_rows(const Matmul<float>& p, index_t r0, index_t rows, void* work) {
  ATTN_SIMD_CALL(p.simd, MatmulRowsF32)(p, r0, rows, work);
}
template <>
void matmul_rows(const Matmul<double>& p, index_t r0, index_t rows, void* work) {
  ATTN_SIMD_CALL(p.simd, MatmulRowsF64)(p, r0, rows, work);
}

}  // namespace attn::cpu::fused
#endif  // HWY_ONCE
