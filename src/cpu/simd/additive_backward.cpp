// Fused additive attention backward, pass 2 (simd/additive.hpp), compiled once per SIMD target.
// With t_ijp = tanh(qp_ip + kp_jp), s_ij = sum_p w_v[p] t_ijp, P = softmax(s) (masked),
// W = dropout(P) (kept weights x 1/(1-p)):
//   out_i = sum_j W_ij v_j             =>  dV_j = sum_i W_ij dout_i,  dP_ij = f_ij (dout_i . v_j)
//   P = softmax(s)                     =>  dS_ij = P_ij (dP_ij - D_i),  D_i = dout_i . out_i
//   s_ij = sum_p w_v[p] t_ijp          =>  dqp_ip = sum_j dS_ij w_v[p] (1 - t_ijp^2),
//                                          dkp_jp = sum_i dS_ij w_v[p] (1 - t_ijp^2),
//                                          dw_v[p] = sum_ij dS_ij t_ijp
// Each t is computed once here, kept for the h units of one key and one group of query lanes, and
// used for the score (-> P, dS) and then for the three gradients.
#include <algorithm>
#include <cmath>
#include <cstddef>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/simd/additive_backward.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include "cpu/simd/additive-inl.h"
#include "cpu/simd/additive.hpp"
#include "cpu/simd/gemm-inl.h"
#include "cpu/simd/softmax-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::fused::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The gradients of one key j for one group of query lanes, from the group's tanh (tbuf, (h, group
// width), from ScoreGroup) and dS (ds, group width): dqpT[p][lanes] += dt, dwl[p][lanes of one
// vector] += dS t, dkp_j[p] += sum over lanes of dt, with dt = dS w_v[p] (1 - t^2). With kGuard (the
// key's projection is not finite), t is taken as 0 where dS = 0, so that what a masked key holds
// never reaches a gradient (0 * NaN).
template <bool kGuard, class D, class T>
HWY_INLINE void GradGroup(D d, const T* HWY_RESTRICT tbuf, const T* HWY_RESTRICT ds, const T* HWY_RESTRICT wv,
                          index_t h, T* HWY_RESTRICT dqpt, T* HWY_RESTRICT dwl, T* HWY_RESTRICT dkp_j) {
  using V = hn::Vec<D>;
  constexpr int NV = kScoreVectors;
  const index_t L = static_cast<index_t>(hn::Lanes(d));
  V g[NV];
  for (int v = 0; v < NV; ++v) g[v] = hn::Load(d, ds + v * L);
  const V one = hn::Set(d, T(1));
  for (index_t p = 0; p < h; ++p) {
    const V w = hn::Set(d, wv[p]);
    V dw = hn::Load(d, dwl + p * L);
    V dk = hn::Zero(d);
    T* q = dqpt + p * kBlockQ;
    for (int v = 0; v < NV; ++v) {
      V t = hn::Load(d, tbuf + (p * NV + v) * L);
      if constexpr (kGuard) t = hn::IfThenZeroElse(hn::Eq(g[v], hn::Zero(d)), t);
      const V dt = hn::Mul(hn::Mul(g[v], w), hn::NegMulAdd(t, t, one));
      hn::Store(hn::Add(hn::Load(d, q + v * L), dt), d, q + v * L);
      dw = hn::MulAdd(g[v], t, dw);
      dk = hn::Add(dk, dt);
    }
    hn::Store(dw, d, dwl + p * L);
    dkp_j[p] += hn::GetLane(hn::SumOfLanes(d, dk));
  }
}

template <class T>
void ChunkBlock(const AdditiveBackward<T>& p, index_t b, index_t h, index_t chunk, void* work) {
  simd::note_ran(HWY_TARGET);
  const hn::ScalableTag<T> d;
  using V = hn::Vec<decltype(d)>;
  const index_t L = static_cast<index_t>(hn::Lanes(d)), G = ScoreGroupWidth(d);
  const index_t n = p.q.R, m = p.k.R, H = p.q.H, hd = p.h, dv = p.v.C;
  const index_t blocks = (n + kBlockQ - 1) / kBlockQ, bh = b * H + h;
  Carve carve(work);
  const AdditiveChunkArrays<T> a(carve, hd, dv);
  BlockState<T> st(a.block);  // qt: the tanh of one key and group, s: dP^T, ot: dout^T, alpha: 1/sum
  T* tbuf = st.qt;
  double* row_dot = a.row_dot;
  T *pm = a.pm, *dvt = a.dvt, *factors = a.factors, *pk = a.pk, *dsk = a.dsk, *dwl = a.dwl;
  bool* finite = a.finite;

  const index_t k0 = chunk * p.chunk_keys, k1 = std::min(m, k0 + p.chunk_keys);
  T* part = p.dqp_partial + (bh * p.chunks + chunk) * blocks * hd * kBlockQ;
  std::fill(part, part + blocks * hd * kBlockQ, T(0));
  std::fill(dwl, dwl + hd * L, T(0));
  const T* kp = p.kp + bh * m * hd;
  const T* wv = p.w_v.row(0, 0, 0);
  const DropoutPlan& drop = *p.dropout;
  const T keep_scale = static_cast<T>(drop.scale);
  const V ninf = hn::Set(d, -INFINITY);

  for (index_t j0 = k0; j0 < k1; j0 += kBlockK) {
    const index_t cnt = std::min<index_t>(kBlockK, k1 - j0);
    std::fill(dvt, dvt + dv * kBlockK, T(0));
    std::fill(p.dkp + (bh * m + j0) * hd, p.dkp + (bh * m + j0 + cnt) * hd, T(0));
    for (index_t jj = 0; jj < cnt; ++jj) finite[jj] = rows_finite(kp + (j0 + jj) * hd, hd, 1, hd);
    for (index_t blk = 0; blk < blocks; ++blk) {
      const index_t i0 = blk * kBlockQ, rows = std::min<index_t>(kBlockQ, n - i0);
      const KeyRange keys = st.start(*p.mask, b, h, i0, rows);
      // Every key of the tile masked for every row of the block (outside the rows' ranges, or no
      // common segment).
      if (j0 >= keys.end || j0 + cnt <= keys.begin || !st.may_attend(j0, cnt)) continue;
      st.general = st.tile_general(j0, cnt);
      const bool bounded = st.cuts_left(j0);
      const index_t row0 = bh * n + i0;
      for (index_t i = 0; i < kBlockQ; ++i) {
        st.max[i] = i < rows ? p.row_max[row0 + i] : T(0);
        st.alpha[i] = i < rows ? p.row_inv[row0 + i] : T(0);
        row_dot[i] = i < rows ? p.row_dot[row0 + i] : 0.0;
      }
      // dP^T (cnt, kBlockQ) = V_tile dout^T, before dropout.
      PackTransposed(st.ot, p.dout, b, h, i0, rows);
      BlockGemm<false>(d, p.v.row(b, h, j0), p.v.sR, 1, st.ot, st.s, cnt, dv);
      if (drop.active)  // one Philox draw per four keys of a row
        for (index_t i = 0; i < rows; ++i)
          for (index_t jj = 0; jj < cnt; jj += 4) {
            const auto r = drop.draw(bh, i0 + i, (j0 + jj) >> 2);
            for (index_t u = 0; u < 4 && jj + u < cnt; ++u)
              factors[(jj + u) * kBlockQ + i] = r[static_cast<int>(u)] >= drop.threshold ? keep_scale : T(0);
          }
      const T* qpt = p.qpt + (bh * blocks + blk) * hd * kBlockQ;
      T* dqpt = part + blk * hd * kBlockQ;
      const index_t live = std::min(cnt, keys.end - j0);  // keys past every row's limit have W = dS = 0
      for (index_t jj = 0; jj < kBlockK; ++jj)
        for (index_t i = 0; i < kBlockQ; ++i) pm[i * kBlockK + jj] = 0;
      for (index_t jj = 0; jj < live; ++jj) {
        const index_t j = j0 + jj;
        const V vj = hn::Set(d, static_cast<T>(j));
        for (index_t g = 0; g < kBlockQ; g += G) {
          // t and the scores, exactly as the forward; then masks and P = exp(s - max) / sum.
          ScoreGroup<true, true>(d, qpt + g, kp + j * hd, wv, hd, pk + g, tbuf);
          if (st.general) {
            for (index_t i = g; i < g + G; ++i)
              pk[i] = i < rows && st.allowed(i, j) ? pk[i] + st.rm[i].bias_at(j) : st.fill;
          }
          for (index_t i = g; i < g + G; i += L) {
            V s = hn::Load(d, pk + i);
            if (!st.general) s = st.bias_and_mask(d, s, vj, jj, i, bounded);
            const V mx = hn::Load(d, st.max + i);
            const V shift = hn::IfThenZeroElse(hn::Eq(mx, ninf), mx);
            hn::Store(hn::Mul(ExpWeight(d, hn::Sub(s, shift)), hn::Load(d, st.alpha + i)), d, pk + i);
          }
          // dS = P (f dP - D) in float64 as the sdpa kernels (dP - D cancels in a peaked row), 0
          // where the key is masked (dP may be anything there, even NaN); W = f P.
          bool any = false;
          for (index_t i = g; i < g + G; ++i) {
            T ds = 0;
            if (i < rows) {
              const T w = pk[i], f = drop.active ? factors[jj * kBlockQ + i] : T(1);
              if (w != T(0) && st.allowed(i, j))
                ds = static_cast<T>(static_cast<double>(w) *
                                    (static_cast<double>(st.s[jj * kBlockQ + i] * f) - row_dot[i]));
              pm[i * kBlockK + jj] = w * f;
            }
            dsk[i] = ds;
            any = any || ds != T(0);
          }
          if (!any) continue;  // nothing to add: the key is masked for the whole group, or dS = 0
          if (finite[jj]) {
            GradGroup<false>(d, tbuf, dsk + g, wv, hd, dqpt + g, dwl, p.dkp + (bh * m + j) * hd);
          } else {
            GradGroup<true>(d, tbuf, dsk + g, wv, hd, dqpt + g, dwl, p.dkp + (bh * m + j) * hd);
          }
        }
      }
      // dV^T (v, kBlockK) += dout^T W.
      BlockGemm<true>(d, p.dout.row(b, h, i0), 1, p.dout.sR, pm, dvt, dv, rows);
    }
    if (!p.dv.empty())
      for (index_t jj = 0; jj < cnt; ++jj) {
        T* dvr = p.dv.row(b, h, j0 + jj);
        for (index_t c = 0; c < dv; ++c) dvr[c] = dvt[c * kBlockK + jj];
      }
  }
  // The chunk's dw_v: its lanes summed in lane order.
  T* dw = p.dwv_partial + (bh * p.chunks + chunk) * hd;
  for (index_t q = 0; q < hd; ++q) {
    T sum = 0;
    for (index_t l = 0; l < L; ++l) sum += dwl[q * L + l];
    dw[q] = sum;
  }
}

void ChunkBlockF32(const AdditiveBackward<float>& p, index_t b, index_t h, index_t c, void* w) { ChunkBlock(p, b, h, c, w); }
void ChunkBlockF64(const AdditiveBackward<double>& p, index_t b, index_t h, index_t c, void* w) { ChunkBlock(p, b, h, c, w); }

}  // namespace attn::cpu::fused::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::cpu::fused {

HWY_EXPORT(ChunkBlockF32);
HWY_EXPORT(ChunkBlockF64);

template <>
void additive_backward_chunk(const AdditiveBackward<float>& p, index_t b, index_t h, index_t chunk, void* work) {
  ATTN_SIMD_CALL(p.simd, ChunkBlockF32)(p, b, h, chunk, work);
}
template <>
void additive_backward_chunk(const AdditiveBackward<double>& p, index_t b, index_t h, index_t chunk, void* work) {
  ATTN_SIMD_CALL(p.simd, ChunkBlockF64)(p, b, h, chunk, work);
}

}  // namespace attn::cpu::fused
#endif  // HWY_ONCE
