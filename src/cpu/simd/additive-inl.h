// Per-target score loop of the fused additive attention kernels (Highway "-inl.h" convention),
// shared by the forward (additive_forward.cpp) and the backward (additive_backward.cpp), which must
// compute bit-identical scores: the backward rebuilds the forward's weights from them.

#if defined(ATTN_CPU_SIMD_ADDITIVE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_CPU_SIMD_ADDITIVE_INL_H_
#undef ATTN_CPU_SIMD_ADDITIVE_INL_H_
#else
#define ATTN_CPU_SIMD_ADDITIVE_INL_H_
#endif

#include <hwy/highway.h>

#include "cpu/simd/fused.hpp"
#include "cpu/simd/tanh-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::fused::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Vectors of query lanes one score group keeps in registers. Two: the tanh's 12 constants, two
// broadcasts and the temporaries of two tanh fill AVX2's 16 registers; with 4 the accumulators were
// spilled to the stack (measured: 26 ms against 37 ms for the bench case on one thread). Out-of-order
// execution overlaps consecutive p, which hides the tanh's latency (about 50 cycles of dependent FMAs
// and a division). kBlockQ is a multiple of 2 lanes on every target.
inline constexpr int kScoreVectors = 2;

template <class D>
constexpr index_t ScoreGroupWidth(D d) {
  return kScoreVectors * static_cast<index_t>(hn::Lanes(d));
}

// The scores of one key for one group of kScoreVectors * Lanes query lanes:
//   s[lanes] = sum over p ascending of w_v[p] tanh(qpt[p * kBlockQ + lanes] + kp_j[p])
// qpt: the block's projected queries transposed at the group's first lane, (h, kBlockQ); kp_j: the
// key's projection (h,); s: kScoreVectors * Lanes outputs. With kKeep, each tanh is also stored in
// tbuf (h, group width), for the backward's gradient loop. kAccurate: TanhAccurate (the backward's
// passes, which must agree bit for bit), else TanhFast (the forward).
template <bool kKeep, bool kAccurate, class D, class T>
HWY_INLINE void ScoreGroup(D d, const T* HWY_RESTRICT qpt, const T* HWY_RESTRICT kp_j, const T* HWY_RESTRICT wv,
                           index_t h, T* HWY_RESTRICT s, T* HWY_RESTRICT tbuf) {
  using V = hn::Vec<D>;
  constexpr int NV = kScoreVectors;
  const index_t L = static_cast<index_t>(hn::Lanes(d));
  V acc[NV];
  for (int v = 0; v < NV; ++v) acc[v] = hn::Zero(d);
  for (index_t p = 0; p < h; ++p) {
    const V k = hn::Set(d, kp_j[p]);
    const V w = hn::Set(d, wv[p]);
    const T* q = qpt + p * kBlockQ;
    for (int v = 0; v < NV; ++v) {
      const V x = hn::Add(hn::Load(d, q + v * L), k);
      const V t = kAccurate ? TanhAccurate(d, x) : TanhFast(d, x);
      if constexpr (kKeep) hn::Store(t, d, tbuf + (p * NV + v) * L);
      acc[v] = hn::MulAdd(w, t, acc[v]);
    }
  }
  for (int v = 0; v < NV; ++v) hn::Store(acc[v], d, s + v * L);
}

// Scores of keys [j0, j0 + cnt) of the block, transposed: s (cnt, kBlockQ) from qpt (h, kBlockQ)
// and the (b, h) slice of kp (m, h). Groups of lanes outer, so that a group's slice of qpt stays in
// the L1 cache while the tile's keys stream past.
template <bool kAccurate, class D, class T>
HWY_INLINE void ScoreTile(D d, const T* qpt, const T* kp, const T* wv, index_t h, index_t j0, index_t cnt, T* s) {
  const index_t G = ScoreGroupWidth(d);
  for (index_t g = 0; g < kBlockQ; g += G)
    for (index_t jj = 0; jj < cnt; ++jj)
      ScoreGroup<false, kAccurate>(d, qpt + g, kp + (j0 + jj) * h, wv, h, s + jj * kBlockQ + g, static_cast<T*>(nullptr));
}

}  // namespace attn::cpu::fused::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // ATTN_CPU_SIMD_ADDITIVE_INL_H_
