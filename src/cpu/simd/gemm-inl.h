// Per-target building blocks of the fused kernels (Highway's "-inl.h" convention: included once per
// target by each kernel file after hwy/highway.h, inside its foreach_target expansion).
//
// The kernels keep a block of kBlockQ queries transposed, so every product they need has the form
//   C (rows, kBlockQ) (+)= A (rows, depth) Bm (depth, kBlockQ)
// with Bm and C dense (row stride kBlockQ) and A read through two strides: a(r, k) = A[r a_r + k a_k].
// Scores of a key tile are rows = keys, depth = d, A = the keys, Bm = the queries transposed; the
// output is rows = value columns, depth = keys, A = the values read transposed (a_r = 1), Bm = the
// weights. Each micro-tile holds R rows x 2 vectors of accumulators in registers.

#if defined(ATTN_CPU_SIMD_GEMM_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_CPU_SIMD_GEMM_INL_H_
#undef ATTN_CPU_SIMD_GEMM_INL_H_
#else
#define ATTN_CPU_SIMD_GEMM_INL_H_
#endif

#include <algorithm>
#include <type_traits>

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include "cpu/simd/fused.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::fused::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Depth per pass of a micro-tile: each pass sums its products from 0 and then adds the sum to C,
// so a long dot product (dP = dout . v over a value width of 1024) is a sum of short sums, whose
// rounding error grows with kDepthBlock + depth / kDepthBlock rather than with depth. Measured on
// the error of dP at v = 1024 (float32, against float64): 2.7e-5 summed in one chain, 1.1e-5 in
// blocks of 64. Products with depth <= kDepthBlock take one pass.
inline constexpr index_t kDepthBlock = 64;

// R rows of C over all kBlockQ columns, two vectors at a time, over depth [k0, k1): C = the sum
// (kAdd false), or C += the sum (kAdd true; the sum is formed first, then added).
template <int R, bool kAdd, class D, class T>
HWY_INLINE void MicroTile(D d, const T* HWY_RESTRICT A, index_t a_r, index_t a_k, const T* HWY_RESTRICT Bm,
                          T* HWY_RESTRICT C, index_t k0, index_t k1) {
  using V = hn::Vec<D>;
  const index_t L = static_cast<index_t>(hn::Lanes(d));
  for (index_t col = 0; col < kBlockQ; col += 2 * L) {
    V acc0[R], acc1[R];
    for (int r = 0; r < R; ++r) acc0[r] = hn::Zero(d), acc1[r] = hn::Zero(d);
    for (index_t k = k0; k < k1; ++k) {
      const V b0 = hn::Load(d, Bm + k * kBlockQ + col);
      const V b1 = hn::Load(d, Bm + k * kBlockQ + col + L);
      const T* a = A + k * a_k;
      for (int r = 0; r < R; ++r) {
        const V ar = hn::Set(d, a[r * a_r]);
        acc0[r] = hn::MulAdd(ar, b0, acc0[r]);
        acc1[r] = hn::MulAdd(ar, b1, acc1[r]);
      }
    }
    for (int r = 0; r < R; ++r) {
      if constexpr (kAdd) {
        acc0[r] = hn::Add(hn::Load(d, C + r * kBlockQ + col), acc0[r]);
        acc1[r] = hn::Add(hn::Load(d, C + r * kBlockQ + col + L), acc1[r]);
      }
      hn::Store(acc0[r], d, C + r * kBlockQ + col);
      hn::Store(acc1[r], d, C + r * kBlockQ + col + L);
    }
  }
}

// R rows of C (+)= A Bm over the whole depth, in passes of kDepthBlock.
template <int R, bool kAccumulate, class D, class T>
HWY_INLINE void MicroTileBlocked(D d, const T* A, index_t a_r, index_t a_k, const T* Bm, T* C, index_t depth) {
  const index_t first = std::min(depth, kDepthBlock);
  MicroTile<R, kAccumulate>(d, A, a_r, a_k, Bm, C, 0, first);
  for (index_t k0 = first; k0 < depth; k0 += kDepthBlock)
    MicroTile<R, true>(d, A, a_r, a_k, Bm, C, k0, std::min(depth, k0 + kDepthBlock));
}

// C (rows, kBlockQ) (+)= A (rows, depth) Bm (depth, kBlockQ), in micro-tiles of 6 rows (12
// accumulators, 2 loads and a broadcast in flight: 15 of AVX2's 16 registers), 8 on AVX-512 (16 of
// its 32: a tile of 64 keys or values is 8 of them, none left over), then what is left. The grouping
// changes no sum: each element of C is summed over the depth in the same order whatever its group.
template <bool kAccumulate, class D, class T>
HWY_INLINE void BlockGemm(D d, const T* A, index_t a_r, index_t a_k, const T* Bm, T* C, index_t rows,
                          index_t depth) {
  index_t r = 0;
#if HWY_TARGET <= HWY_AVX3
  for (; r + 8 <= rows; r += 8) MicroTileBlocked<8, kAccumulate>(d, A + r * a_r, a_r, a_k, Bm, C + r * kBlockQ, depth);
#endif
  for (; r + 6 <= rows; r += 6) MicroTileBlocked<6, kAccumulate>(d, A + r * a_r, a_r, a_k, Bm, C + r * kBlockQ, depth);
  const T* a = A + r * a_r;
  T* c = C + r * kBlockQ;
  switch (rows - r) {
    case 5: MicroTileBlocked<5, kAccumulate>(d, a, a_r, a_k, Bm, c, depth); break;
    case 4: MicroTileBlocked<4, kAccumulate>(d, a, a_r, a_k, Bm, c, depth); break;
    case 3: MicroTileBlocked<3, kAccumulate>(d, a, a_r, a_k, Bm, c, depth); break;
    case 2: MicroTileBlocked<2, kAccumulate>(d, a, a_r, a_k, Bm, c, depth); break;
    case 1: MicroTileBlocked<1, kAccumulate>(d, a, a_r, a_k, Bm, c, depth); break;
    default: break;
  }
}

#if HWY_TARGET != HWY_SCALAR && HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
// t[c * ts + r] = s[r * ss + c] for an 8 x 8 block of floats in 256-bit vectors: pairs of rows
// interleaved, then pairs of pairs (64-bit lanes), then the 128-bit halves: 24 shuffles for 64
// elements, against 32 in 4 x 4 blocks.
HWY_INLINE void Transpose8x8(float* HWY_RESTRICT t, index_t ts, const float* HWY_RESTRICT s, index_t ss) {
  const hn::FixedTag<float, 8> d;
  const hn::Repartition<double, decltype(d)> dd;
  using V = hn::Vec<decltype(d)>;
  V x[8], pairs[8], quads[8];
  for (int r = 0; r < 8; ++r) x[r] = hn::LoadU(d, s + r * ss);
  for (int r = 0; r < 8; r += 2) {  // rows r, r + 1: elements 0 1 4 5 and 2 3 6 7 side by side
    pairs[r] = hn::InterleaveLower(d, x[r], x[r + 1]);
    pairs[r + 1] = hn::InterleaveUpper(d, x[r], x[r + 1]);
  }
  const auto pair64 = [&](bool upper, V a, V b) HWY_ATTR {
    const auto a64 = hn::BitCast(dd, a), b64 = hn::BitCast(dd, b);
    return hn::BitCast(d, upper ? hn::InterleaveUpper(dd, a64, b64) : hn::InterleaveLower(dd, a64, b64));
  };
  for (int h = 0; h < 8; h += 4) {  // rows h to h + 3: quads[h + c] holds columns c and c + 4
    quads[h] = pair64(false, pairs[h], pairs[h + 2]);
    quads[h + 1] = pair64(true, pairs[h], pairs[h + 2]);
    quads[h + 2] = pair64(false, pairs[h + 1], pairs[h + 3]);
    quads[h + 3] = pair64(true, pairs[h + 1], pairs[h + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    hn::StoreU(hn::ConcatLowerLower(d, quads[4 + c], quads[c]), d, t + c * ts);
    hn::StoreU(hn::ConcatUpperUpper(d, quads[4 + c], quads[c]), d, t + (c + 4) * ts);
  }
}
#endif

// dst[c * dst_stride + r] = src[r * src_stride + c] for r < rows, c < cols: a strided matrix
// transposed, 8 x 8 blocks of floats in 256-bit vectors where the target has them, 4 x 4 (float)
// or 2 x 2 (double) blocks in 128-bit vectors elsewhere (a fifth of the time of an
// element-by-element copy), element by element at the edges.
template <class T>
void TransposeInto(T* HWY_RESTRICT dst, index_t dst_stride, const T* HWY_RESTRICT src, index_t src_stride,
                   index_t rows, index_t cols) {
  index_t r0 = 0;
#if HWY_TARGET != HWY_SCALAR
  index_t R8 = 0, C8 = 0;  // the rows and columns of the 8 x 8 blocks
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  if constexpr (std::is_same_v<T, float>) {
    R8 = rows / 8 * 8, C8 = cols / 8 * 8;
    for (index_t r = 0; r < R8; r += 8)
      for (index_t c = 0; c < C8; c += 8) Transpose8x8(dst + c * dst_stride + r, dst_stride, src + r * src_stride + c, src_stride);
  }
#endif
  const hn::FixedTag<T, 16 / sizeof(T)> d;
  constexpr index_t N = 16 / sizeof(T);
  const index_t R = rows / N * N, C = cols / N * N;
  for (index_t r = 0; r < R; r += N)
    for (index_t c = r < R8 ? C8 : 0; c < C; c += N) {
      const T* s = src + r * src_stride + c;
      T* t = dst + c * dst_stride + r;
      if constexpr (N == 4) {
        const auto a = hn::LoadU(d, s), b = hn::LoadU(d, s + src_stride);
        const auto e = hn::LoadU(d, s + 2 * src_stride), f = hn::LoadU(d, s + 3 * src_stride);
        const auto ab_lo = hn::InterleaveLower(d, a, b), ab_hi = hn::InterleaveUpper(d, a, b);  // a0 b0 a1 b1, a2 b2 a3 b3
        const auto ef_lo = hn::InterleaveLower(d, e, f), ef_hi = hn::InterleaveUpper(d, e, f);
        hn::StoreU(hn::ConcatLowerLower(d, ef_lo, ab_lo), d, t);
        hn::StoreU(hn::ConcatUpperUpper(d, ef_lo, ab_lo), d, t + dst_stride);
        hn::StoreU(hn::ConcatLowerLower(d, ef_hi, ab_hi), d, t + 2 * dst_stride);
        hn::StoreU(hn::ConcatUpperUpper(d, ef_hi, ab_hi), d, t + 3 * dst_stride);
      } else {
        const auto a = hn::LoadU(d, s), b = hn::LoadU(d, s + src_stride);
        hn::StoreU(hn::InterleaveLower(d, a, b), d, t);
        hn::StoreU(hn::InterleaveUpper(d, a, b), d, t + dst_stride);
      }
    }
  r0 = R;
  for (index_t r = 0; r < R; ++r)  // the columns past the last whole block
    for (index_t c = C; c < cols; ++c) dst[c * dst_stride + r] = src[r * src_stride + c];
#endif
  for (index_t r = r0; r < rows; ++r)
    for (index_t c = 0; c < cols; ++c) dst[c * dst_stride + r] = src[r * src_stride + c];
}

// dst (cols, kBlockQ) = rows [i0, i0 + count) of x(b, h) transposed, zero past `count`: a block of
// queries (or of output gradients) laid out as the B operand of BlockGemm.
template <class T>
void PackTransposed(T* dst, View4<const T> x, index_t b, index_t h, index_t i0, index_t count) {
  if (count > 0) TransposeInto(dst, kBlockQ, x.row(b, h, i0), x.sR, count, x.C);
  for (index_t c = 0; c < x.C; ++c) std::fill(dst + c * kBlockQ + count, dst + (c + 1) * kBlockQ, T(0));
}

// dst (kBlockQ, kBlockQ) = src (kBlockQ, kBlockQ) transposed.
template <class T>
void Transpose(T* HWY_RESTRICT dst, const T* HWY_RESTRICT src) {
  TransposeInto(dst, kBlockQ, src, kBlockQ, kBlockQ, kBlockQ);
}

// Adds the lanes of v to two float64 accumulators (float lanes are widened first): row sums of
// softmax weights are kept in double, as the unfused path keeps them.
template <class D, class DW>
HWY_INLINE void AddWide(D d, DW dw, hn::Vec<D> v, hn::Vec<DW>& lo, hn::Vec<DW>& hi) {
  (void)d, (void)hi;
  if constexpr (sizeof(hn::TFromD<D>) == 4) {
#if HWY_TARGET == HWY_SCALAR
    lo = hn::Add(lo, hn::PromoteTo(dw, v));  // one lane: widen it
#else
    const hn::Half<D> dh;
    lo = hn::Add(lo, hn::PromoteTo(dw, hn::LowerHalf(dh, v)));
    hi = hn::Add(hi, hn::PromoteTo(dw, hn::UpperHalf(dh, v)));
#endif
  } else {
    lo = hn::Add(lo, v);
  }
}

// y[i] = f(x[i]) for i < count, f taking and returning a vector of d: whole vectors, then the tail
// through a zero-padded vector. For testing the kernels' elementwise functions on every target.
template <class D, class F>
void MapArray(D d, const hn::TFromD<D>* x, hn::TFromD<D>* y, std::size_t count, const F& f) {
  using T = hn::TFromD<D>;
  const std::size_t L = hn::Lanes(d);
  std::size_t i = 0;
  for (; i + L <= count; i += L) hn::StoreU(f(hn::LoadU(d, x + i)), d, y + i);
  if (i < count) {
    HWY_ALIGN T buf[hn::MaxLanes(d)] = {};
    std::copy(x + i, x + count, buf);
    hn::Store(f(hn::Load(d, buf)), d, buf);
    std::copy(buf, buf + (count - i), y + i);
  }
}

// exp(x) for the softmax's weights (x <= 0), flushed to 0 where it would be subnormal (x below
// ln of the smallest normal: -87.3 in float, -708.4 in double). A subnormal weight changes no sum by
// a representable amount, but arithmetic on subnormals is microcoded on x86 cores: ALiBi's biases
// put most of a long row's weights there, and made the forward 2.4x slower. The argument is
// clamped first, so that exp never forms a subnormal either; a NaN stays NaN (it must reach the
// row's sum, as PyTorch's softmax lets it).
//
// In float, a vector whose lanes are all <= 0 (every call but one given an lse that does not match
// its scores) takes hn::Exp's steps written out for that range, bit for bit what hn::Exp(d, Max(x,
// -87)) returns: its rounding of x / ln 2 (with -0.5, x being <= 0), its reduction and polynomial,
// and one multiply by 2^q where it multiplies by 2^(q/2) twice (-126 <= q <= 0: 2^q is a normal
// float, and both ways round only their last product), without its test against -104 (the argument
// is above -87). Checked bit for bit against hn::Exp over every float of [-87, -0] on avx3, avx2 and
// sse4 (1.1e9 values; test_sdpa's ExpWeightAccuracy samples them). Other vectors (a lane > 0 or NaN)
// take hn::Exp itself. (1,4096,4096,128) on a Zen 5, 2 threads: the bf16 forward 17.3 -> 16.3 ms,
// float32 28.7 -> 27.9 ms. A vector with every lane in [-87, 0], the usual one, skips the clamp, the
// flush and the NaN blend (their results are x, e and e there): the bf16 forward's median 15.6 ->
// 15.1 ms over seven alternated runs.
template <class D>
HWY_INLINE hn::Vec<D> ExpWeight(D d, hn::Vec<D> x) {
  using T = hn::TFromD<D>;
  const auto lowest = hn::Set(d, sizeof(T) == 4 ? T(-87.0) : T(-708.0));
  hn::Vec<D> e;
  if constexpr (sizeof(T) == 4) {
    hn::impl::ExpImpl<float> impl;  // its methods are not const
    const auto steps = [&](hn::Vec<D> y) {
      const auto q = impl.ToInt32(d, hn::MulAdd(y, hn::Set(d, 1.442695040888963407359924681f), hn::Set(d, -0.5f)));
      return hn::Mul(hn::Add(impl.ExpPoly(d, impl.ExpReduce(d, y, q)), hn::Set(d, 1.0f)), impl.Pow2I(d, q));
    };
    // Every lane in [-87, 0] (no NaN): nothing to clamp, flush or carry through.
    if (HWY_LIKELY(hn::AllTrue(d, hn::And(hn::Ge(x, lowest), hn::Le(x, hn::Zero(d)))))) return steps(x);
    const auto clamped = hn::Max(x, lowest);
    e = hn::AllTrue(d, hn::Le(x, hn::Zero(d))) ? steps(clamped) : hn::Exp(d, clamped);
  } else {
    e = hn::Exp(d, hn::Max(x, lowest));
  }
  const auto w = hn::IfThenZeroElse(hn::Lt(x, lowest), e);
  return hn::IfThenElse(hn::IsNaN(x), x, w);
}

// The float64 tag AddWide accumulates in: half the lanes of a float vector (one on the scalar
// target), all of a double one.
#if HWY_TARGET == HWY_SCALAR
template <class D>
using WideTag = hn::Rebind<double, D>;
#else
template <class D>
using WideTag = hn::Repartition<double, D>;
#endif

}  // namespace attn::cpu::fused::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // ATTN_CPU_SIMD_GEMM_INL_H_
