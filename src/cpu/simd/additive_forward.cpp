// Fused additive attention forward (simd/additive.hpp), one block of kBlockQ queries per call: the
// block's projected queries qpT (h, kBlockQ) = W_q Q_block^T, then per tile of kBlockK keys the
// scores w_v . tanh(qp_i + kp_j) (additive-inl.h), masks, the online softmax, dropout and the
// weighted sum of values exactly as sdpa_forward.cpp. Also the key projection and the SIMD tanh
// entry point the tests measure. Compiled once per SIMD target (hwy/foreach_target.h).
#include <algorithm>
#include <cmath>
#include <cstddef>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/simd/additive_forward.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "cpu/simd/additive-inl.h"
#include "cpu/simd/additive.hpp"
#include "cpu/simd/gemm-inl.h"
#include "cpu/simd/softmax-inl.h"
#include "cpu/simd/tanh-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::fused::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// kp rows [j0, j0 + cnt) of (b, h): keys transposed (k, kBlockK), times W_k (h, k) into a tile
// (h, kBlockK), copied out row by row into kp (B, H, m, h).
template <class T>
void ProjectKeys(T* kp, View4<const T> keys, View4<const T> w_k, index_t b, index_t h, index_t j0, void* work) {
  simd::note_ran(HWY_TARGET);
  const hn::ScalableTag<T> d;
  const index_t m = keys.R, hd = w_k.R, cnt = std::min<index_t>(kBlockK, m - j0);
  Carve carve(work);
  const ProjectKeysArrays<T> a(carve, keys.C, hd);
  T *xt = a.xt, *kpt = a.kpt;
  PackTransposed(xt, keys, b, h, j0, cnt);
  BlockGemm<false>(d, w_k.row(0, 0, 0), w_k.sR, 1, xt, kpt, hd, keys.C);
  T* out = kp + ((b * keys.H + h) * m + j0) * hd;
  for (index_t jj = 0; jj < cnt; ++jj)
    for (index_t p = 0; p < hd; ++p) out[jj * hd + p] = kpt[p * kBlockK + jj];
}

template <class T>
void ForwardBlock(const AdditiveForward<T>& p, index_t b, index_t h, index_t i0, void* work) {
  simd::note_ran(HWY_TARGET);
  const hn::ScalableTag<T> d;
  const index_t n = p.q.R, m = p.k.R, H = p.q.H, hd = p.w_q.R, dv = p.v.C;
  const index_t rows = std::min<index_t>(kBlockQ, n - i0);
  Carve carve(work);
  const AdditiveBlockArrays<T> a(carve, hd, p.q.C, dv);
  BlockState<T> st(a.block);  // qt: qpT (h, kBlockQ)
  T* qt = a.qt;               // (q, kBlockQ)

  // qpT (h, kBlockQ) = W_q Q_block^T; pass 1 of the backward keeps it for pass 2.
  const index_t blocks = (n + kBlockQ - 1) / kBlockQ;
  T* qpt = p.qpt != nullptr ? p.qpt + ((b * H + h) * blocks + i0 / kBlockQ) * hd * kBlockQ : st.qt;
  PackTransposed(qt, p.q, b, h, i0, rows);
  BlockGemm<false>(d, p.w_q.row(0, 0, 0), p.w_q.sR, 1, qt, qpt, hd, p.q.C);

  const KeyRange keys = st.start(*p.mask, b, h, i0, rows);
  for (index_t c = 0; c < dv * kBlockQ; ++c) st.ot[c] = 0;
  const T* kp = p.kp + (b * H + h) * m * hd;
  const T* wv = p.w_v.row(0, 0, 0);
  for (index_t j0 = keys.begin; j0 < keys.end; j0 += kBlockK) {
    const index_t cnt = std::min<index_t>(kBlockK, keys.end - j0);
    if (!st.may_attend(j0, cnt)) continue;  // no common segment
    if (p.out.empty()) {  // pass 1 of the backward: its scores with the backward's tanh
      ScoreTile<true>(d, qpt, kp, wv, hd, j0, cnt, st.s);
    } else {
      ScoreTile<false>(d, qpt, kp, wv, hd, j0, cnt, st.s);
    }
    const bool partial = st.mask_tile(d, T(1), T(0), j0, cnt);
    st.softmax_tile(d, cnt);
    if (p.dropout->active) st.drop_tile(*p.dropout, b * H + h, i0, rows, j0, cnt);
    // out^T (v, kBlockQ) = alpha out^T + V_tile^T P^T.
    st.rescale(d, st.ot, dv);
    const T* v0 = p.v.row(b, h, j0);
    if (partial && !rows_finite(v0, p.v.sR, cnt, dv)) {
      st.accumulate_skipping_zeros(v0, p.v.sR, cnt, dv, rows);  // 0 * Inf must not reach a row
    } else {
      BlockGemm<true>(d, v0, 1, p.v.sR, st.s, st.ot, dv, cnt);
    }
  }

  // out = out^T / sum (an empty row gets 0); or the row statistics of pass 1, with D computed from
  // out as the forward would write it.
  for (index_t i = 0; i < rows; ++i) {
    const double sum = st.sum[i];
    const T inv = sum > 0 ? static_cast<T>(1.0 / sum) : T(0);
    if (!p.out.empty()) {
      T* o = p.out.row(b, h, i0 + i);
      for (index_t c = 0; c < dv; ++c) o[c] = st.ot[c * kBlockQ + i] * inv;
      continue;
    }
    const index_t r = (b * H + h) * n + i0 + i;
    const T* g = p.dout.row(b, h, i0 + i);
    double dot = 0;
    for (index_t c = 0; c < dv; ++c) dot += static_cast<double>(g[c]) * static_cast<double>(st.ot[c * kBlockQ + i] * inv);
    p.row_max[r] = st.max[i];
    p.row_inv[r] = inv;
    p.row_dot[r] = dot;
  }
}

// y = tanh(x), the forward's or (accurate) the backward's.
template <class T>
void TanhArray(const T* x, T* y, std::size_t count, bool accurate) {
  simd::note_ran(HWY_TARGET);
  const hn::ScalableTag<T> d;
  MapArray(d, x, y, count, [&](hn::Vec<decltype(d)> v) { return accurate ? TanhAccurate(d, v) : TanhFast(d, v); });
}

void ProjectKeysF32(float* kp, View4<const float> k, View4<const float> w, index_t b, index_t h, index_t j0, void* work) {
  ProjectKeys(kp, k, w, b, h, j0, work);
}
void ProjectKeysF64(double* kp, View4<const double> k, View4<const double> w, index_t b, index_t h, index_t j0,
                    void* work) {
  ProjectKeys(kp, k, w, b, h, j0, work);
}
void ForwardBlockF32(const AdditiveForward<float>& p, index_t b, index_t h, index_t i0, void* w) { ForwardBlock(p, b, h, i0, w); }
void ForwardBlockF64(const AdditiveForward<double>& p, index_t b, index_t h, index_t i0, void* w) { ForwardBlock(p, b, h, i0, w); }
void TanhF32(const float* x, float* y, std::size_t count, bool accurate) { TanhArray(x, y, count, accurate); }
void TanhF64(const double* x, double* y, std::size_t count, bool accurate) { TanhArray(x, y, count, accurate); }

}  // namespace attn::cpu::fused::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::cpu::fused {

HWY_EXPORT(ProjectKeysF32);
HWY_EXPORT(ProjectKeysF64);
HWY_EXPORT(ForwardBlockF32);
HWY_EXPORT(ForwardBlockF64);
HWY_EXPORT(TanhF32);
HWY_EXPORT(TanhF64);

template <>
void additive_project_keys(float* kp, View4<const float> keys, View4<const float> w_k, index_t b, index_t h,
                           index_t j0, void* work, simd::Target simd) {
  ATTN_SIMD_CALL(simd, ProjectKeysF32)(kp, keys, w_k, b, h, j0, work);
}
template <>
void additive_project_keys(double* kp, View4<const double> keys, View4<const double> w_k, index_t b, index_t h,
                           index_t j0, void* work, simd::Target simd) {
  ATTN_SIMD_CALL(simd, ProjectKeysF64)(kp, keys, w_k, b, h, j0, work);
}
template <>
void additive_forward_block(const AdditiveForward<float>& p, index_t b, index_t h, index_t i0, void* work) {
  ATTN_SIMD_CALL(p.simd, ForwardBlockF32)(p, b, h, i0, work);
}
template <>
void additive_forward_block(const AdditiveForward<double>& p, index_t b, index_t h, index_t i0, void* work) {
  ATTN_SIMD_CALL(p.simd, ForwardBlockF64)(p, b, h, i0, work);
}
template <>
void simd_tanh(const float* x, float* y, std::size_t count, bool accurate) {
  ATTN_SIMD_CALL(simd::current(), TanhF32)(x, y, count, accurate);
}
template <>
void simd_tanh(const double* x, double* y, std::size_t count, bool accurate) {
  ATTN_SIMD_CALL(simd::current(), TanhF64)(x, y, count, accurate);
}

}  // namespace attn::cpu::fused
#endif  // HWY_ONCE
