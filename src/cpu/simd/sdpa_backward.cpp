// Fused scaled dot-product attention backward (passes 1 and 2 of simd/fused.hpp), compiled once per
// SIMD target. Layouts follow the forward: a query block is kBlockQ lanes; scores, weights and their
// gradients of a key tile are (keys, kBlockQ); the partial dQ is kept transposed, dK and dV key-major
// or transposed (backward_grads_key_major in simd/fused.hpp).
//
// With s_ij = scale q_i . k_j, P = softmax(s) (masked), W = dropout(P) (kept weights x 1/(1-p)):
//   out_i = sum_j W_ij v_j                 =>  dV_j = sum_i W_ij dout_i,  dP_ij = drop_ij (dout_i . v_j)
//   P = softmax(s)                         =>  dS_ij = P_ij (dP_ij - D_i),  D_i = sum_j P_ij dP_ij = dout_i . out_i
//   s_ij = scale q_i . k_j                 =>  dQ_i = scale sum_j dS_ij k_j,  dK_j = scale sum_i dS_ij q_i
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/simd/sdpa_backward.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include "cpu/bf16/dot_bf16.hpp"
#include "cpu/simd/fused.hpp"
#include "cpu/simd/gemm-inl.h"
#include "cpu/simd/softmax-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::fused::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// w (dp - D) lane by lane, computed in float64 and rounded once, as the scalar path does; D holds
// the lanes' float64 row dots.
template <class D>
HWY_INLINE hn::Vec<D> ScoreGrad(D d, hn::Vec<D> w, hn::Vec<D> dp, const double* row_dot) {
  if constexpr (sizeof(hn::TFromD<D>) == 8) {
    return hn::Mul(w, hn::Sub(dp, hn::LoadU(d, row_dot)));
  } else {
#if HWY_TARGET == HWY_SCALAR
    const hn::Rebind<double, D> dw;
    return hn::DemoteTo(d, hn::Mul(hn::PromoteTo(dw, w), hn::Sub(hn::PromoteTo(dw, dp), hn::LoadU(dw, row_dot))));
#else
    const hn::Half<D> dh;
    const hn::Repartition<double, D> dw;
    const size_t W = hn::Lanes(dw);
    const auto lo = hn::Mul(hn::PromoteTo(dw, hn::LowerHalf(dh, w)),
                            hn::Sub(hn::PromoteTo(dw, hn::LowerHalf(dh, dp)), hn::LoadU(dw, row_dot)));
    const auto hi = hn::Mul(hn::PromoteTo(dw, hn::UpperHalf(dh, w)),
                            hn::Sub(hn::PromoteTo(dw, hn::UpperHalf(dh, dp)), hn::LoadU(dw, row_dot + W)));
    return hn::Combine(d, hn::DemoteTo(dh, hi), hn::DemoteTo(dh, lo));
#endif
  }
}

// Whether rows [i0, i0 + rows) of (b, h) can rebuild their weights from the forward's lse (see
// pass 1 in simd/fused.hpp). Always for a block of a longer attention: its lse is the only
// normaliser there is.
template <class T>
bool LseTrusted(const SdpaBackward<T>& p, index_t b, index_t h, index_t i0, index_t rows) {
  if (p.lse.empty()) return false;
  if (p.plan->keys_are_a_block) return true;
  for (index_t i = 0; i < rows; ++i) {
    const T l = p.lse.at(b, h, i0 + i, 0);
    if (!(std::abs(l) <= T(kLseTrusted) || l == -INFINITY)) return false;  // NaN too
  }
  return true;
}

// Pass 1: max, 1/sum and D per row: from lse where it is trusted, else the forward's running
// maximum and sum over every key tile.
template <class T>
void StatsBlock(const SdpaBackward<T>& p, index_t b, index_t h, index_t i0, void* work) {
  simd::note_ran(HWY_TARGET);
  const SdpaPlan<T>& a = *p.plan;
  const hn::ScalableTag<T> d;
  const index_t rows = std::min<index_t>(kBlockQ, a.q.R - i0);
  const index_t row0 = (b * a.q.H + h) * a.q.R + i0;
  if (LseTrusted(p, b, h, i0, rows)) {
    // weights = exp(s - lse) x 1; an empty row (lse = -inf) keeps max -inf and gets 1/sum = 0.
    for (index_t i = 0; i < rows; ++i) {
      const T l = p.lse.at(b, h, i0 + i, 0);
      p.row_max[row0 + i] = l;
      p.row_inv[row0 + i] = l == -INFINITY ? T(0) : T(1);
    }
  } else {
    Carve carve(work);
    BlockState<T> st(BlockArrays<T>(carve, a.q.C, 0));
    st.hook = a.hook;
    PackTransposed(st.qt, a.q, b, h, i0, rows);
    const KeyRange keys = st.start(a.mask, b, h, i0, rows);
    std::int64_t tiles = 0;  // simd::note_tiles
    for (index_t j0 = keys.begin; j0 < keys.end; j0 += kBlockK) {
      const index_t cnt = std::min<index_t>(kBlockK, keys.end - j0);
      if (!st.may_attend(j0, cnt) || !a.tile_live(b, h, i0, j0)) continue;  // no common segment, or mask_mod
      ++tiles;
      BlockGemm<false>(d, a.k.row(b, a.kv_head(h), j0), a.k.sR, 1, st.qt, st.s, cnt, a.q.C);
      st.weigh_tile(d, a.scale, a.softcap, j0, cnt);
    }
    simd::note_tiles(tiles);
    for (index_t i = 0; i < rows; ++i) {
      p.row_max[row0 + i] = st.max[i];
      p.row_inv[row0 + i] = st.sum[i] > 0 ? static_cast<T>(1.0 / st.sum[i]) : T(0);
    }
  }
  for (index_t i = 0; i < rows; ++i) {
    const T* g = p.dout.row(b, h, i0 + i);
    const T* o = p.out.row(b, h, i0 + i);
    double dot = 0;
    for (index_t c = 0; c < p.dout.C; ++c) dot += static_cast<double>(g[c]) * static_cast<double>(o[c]);
    p.row_dot[row0 + i] = dot;
  }
}

// Pass 2's steps for one query block and one key tile of a chunk (ChunkBlock below puts them in
// order). Layouts as above: s, dst (kBlockK, kBlockQ); pm, dsm (kBlockQ, kBlockK).

// Starts rows [i0, i0 + rows) of (b, h): the row maxima and 1/sums of pass 1 (in st.max and
// st.alpha) and D (row_dot), queries and output gradients transposed (st.qt, st.ot). A row with no
// key to attend (1/sum = 0) has dS = 0, but its query was never read by the forward and may hold
// anything (NaN, Inf): zeroed in Q^T. Returns whether there is such a row (dK then takes Q^T from
// st.qt rather than from the queries).
template <class T>
bool StartChunkRows(const SdpaBackward<T>& p, BlockState<T>& st, double* row_dot, index_t b, index_t h, index_t i0,
                    index_t rows) {
  const SdpaPlan<T>& a = *p.plan;
  const index_t row0 = (b * a.q.H + h) * a.q.R + i0;
  for (index_t i = 0; i < kBlockQ; ++i) {
    st.max[i] = i < rows ? p.row_max[row0 + i] : T(0);
    st.alpha[i] = i < rows ? p.row_inv[row0 + i] : T(0);
    row_dot[i] = i < rows ? p.row_dot[row0 + i] : 0.0;
  }
  PackTransposed(st.qt, a.q, b, h, i0, rows);
  PackTransposed(st.ot, p.dout, b, h, i0, rows);
  bool dead_rows = false;
  for (index_t i = 0; i < rows; ++i)
    if (st.alpha[i] == T(0)) {
      dead_rows = true;
      for (index_t c = 0; c < a.q.C; ++c) st.qt[c * kBlockQ + i] = T(0);
    }
  return dead_rows;
}

// The tile's scores (raw dot products in st.s) -> P^T = exp(masked scores - max) / sum, exactly the
// forward's weights: on a plain tile the scale is applied as they are taken, as the forward's
// weigh_tile does; otherwise mask_tile (keeping the soft-capping's tanh and the scores before
// score_mod where they are needed). Returns mask_tile's answer (false on a plain tile).
template <class D, class T>
bool RebuildWeights(D d, const SdpaPlan<T>& a, BlockState<T>& st, index_t j0, index_t cnt, T* tanh_tile,
                    T* raw_tile) {
  using V = hn::Vec<D>;
  const index_t L = static_cast<index_t>(hn::Lanes(d));
  const bool plain = st.plain_tile(a.scale, a.softcap, j0, cnt);
  bool partial = false;
  if (plain) {
    st.general = false;
  } else {
    partial = st.mask_tile(d, a.scale, a.softcap, j0, cnt, a.softcap != T(0) ? tanh_tile : nullptr,
                           a.hook != nullptr ? raw_tile : nullptr);
  }
  const V factor = hn::Set(d, plain ? a.scale : T(1));  // times 1: exact
  for (index_t i = 0; i < kBlockQ; i += L) {
    const V mx = hn::Load(d, st.max + i), inv = hn::Load(d, st.alpha + i);
    const V shift = hn::IfThenZeroElse(hn::Eq(mx, hn::Set(d, -INFINITY)), mx);
    for (index_t jj = 0; jj < cnt; ++jj) {
      T* sj = st.s + jj * kBlockQ + i;
      hn::Store(hn::Mul(ExpWeight(d, hn::Sub(hn::Mul(hn::Load(d, sj), factor), shift)), inv), d, sj);
    }
  }
  return partial;
}

// dS = P (dP - D), in float64 as the unfused path (dP - D cancels in a peaked row), and W = P, on a
// tile whose masks are key ranges only and with no dropout: the tile's lanes at once. 0 where the key
// is masked (dP may be anything there, even NaN) or the weight is 0. dst holds dP^T on entry, dS^T
// on return; W^T is st.s, and pm, unless null, receives W (query-major); keys past cnt are 0 in all.
// single: in T with D rounded to T, for the bfloat16 products, as FlashAttention's 16-bit backward:
// there dP is a float sum of bfloat16 products (and D comes from the forward's out rounded to
// bfloat16, when the caller passes it), and dS is rounded to bfloat16 for its products, each far
// coarser than float's rounding of P (dP - D) (the forward+backward (4,1024,1024,64) 1.04x faster
// on one thread, 1.02x on two, on a Zen 5).
template <class D, class T>
void RangeScoreGrads(D d, BlockState<T>& st, T* dst, T* pm, const double* row_dot, index_t j0, index_t cnt,
                     bool single) {
  using V = hn::Vec<D>;
  const index_t L = static_cast<index_t>(hn::Lanes(d));
  alignas(64) T dot[kBlockQ];
  if (single)
    for (index_t i = 0; i < kBlockQ; ++i) dot[i] = static_cast<T>(row_dot[i]);
  for (index_t jj = 0; jj < kBlockK; ++jj) {
    T* ds = dst + jj * kBlockQ;
    if (jj >= cnt) {
      std::fill(ds, ds + kBlockQ, T(0));
      std::fill(st.s + jj * kBlockQ, st.s + (jj + 1) * kBlockQ, T(0));
      continue;
    }
    const V vj = hn::Set(d, static_cast<T>(j0 + jj));
    for (index_t i = 0; i < kBlockQ; i += L) {
      const V w = hn::Load(d, st.s + jj * kBlockQ + i);
      const auto in_range = hn::And(hn::Lt(vj, hn::Load(d, st.end + i)), hn::Ge(vj, hn::Load(d, st.begin + i)));
      const auto keep = hn::And(in_range, hn::Ne(w, hn::Zero(d)));
      const V grad = single ? hn::Mul(w, hn::Sub(hn::Load(d, ds + i), hn::Load(d, dot + i)))
                            : ScoreGrad(d, w, hn::Load(d, ds + i), row_dot + i);
      hn::Store(hn::IfThenElseZero(keep, grad), d, ds + i);
    }
  }
  if (pm != nullptr) Transpose(pm, st.s);
}

// The same element by element, for a tile masked element by element or under dropout: dS = P (drop
// dP - D) and W = drop P, where drop is the dropout factor 1/(1-p) or 0 of each weight (bh = b H + h).
// W goes to pm (query-major), or with pm null to st.s in place of P (key-major; there only the block's
// rows and the tile's keys, the only ones the products read).
template <class T>
void ElementScoreGrads(const DropoutPlan& drop, const BlockState<T>& st, T* dst, T* pm, const double* row_dot,
                       index_t bh, index_t i0, index_t rows, index_t j0, index_t cnt) {
  const T keep_scale = static_cast<T>(drop.scale);
  for (index_t i = 0; i < rows; ++i)
    for (index_t jj = 0; jj < cnt; ++jj) {
      const index_t j = j0 + jj;
      T& w = st.s[jj * kBlockQ + i];  // P on entry
      T& ds = dst[jj * kBlockQ + i];  // dP on entry
      T factor = T(1);
      if (drop.active) factor = drop.keep(bh, i0 + i, j) ? keep_scale : T(0);
      ds = w != T(0) && st.allowed(i, j)
               ? static_cast<T>(static_cast<double>(w) * (static_cast<double>(ds * factor) - row_dot[i]))
               : T(0);
      (pm != nullptr ? pm[i * kBlockK + jj] : w) = w * factor;
    }
  // 0 past the block's rows and the tile's keys.
  for (index_t jj = 0; jj < kBlockK; ++jj)
    for (index_t i = jj < cnt ? rows : 0; i < kBlockQ; ++i) dst[jj * kBlockQ + i] = 0;
  if (pm != nullptr)
    for (index_t i = 0; i < kBlockQ; ++i)
      for (index_t jj = i < rows ? cnt : 0; jj < kBlockK; ++jj) pm[i * kBlockK + jj] = 0;
}

// Soft-capping: the score was softcap tanh(x / softcap) of x = scale q . k, so the gradient of x is
// dS (1 - tanh^2), over the cnt keys of dst (kBlockK, kBlockQ) with the tile's tanh. Only where dS
// is not 0: a masked key's tanh may be NaN.
template <class D, class T>
void SoftcapGrads(D d, T* dst, const T* tanh_tile, index_t cnt) {
  using V = hn::Vec<D>;
  const index_t L = static_cast<index_t>(hn::Lanes(d));
  for (index_t e = 0; e < cnt * kBlockQ; e += L) {
    const V t = hn::Load(d, tanh_tile + e), ds = hn::Load(d, dst + e);
    const V grad = hn::Mul(ds, hn::NegMulAdd(t, t, hn::Set(d, T(1))));
    hn::Store(hn::IfThenElseZero(hn::Ne(ds, hn::Zero(d)), grad), d, dst + e);
  }
}

// The chunk's dK and dV rows [k0, k1) of key head hk, from its dK (times the scale) and dV in
// either layout of SdpaChunkArrays.
template <class T>
void StoreChunkGrads(const SdpaBackward<T>& p, index_t b, index_t hk, index_t k0, index_t k1, const T* dk_chunk,
                     const T* dv_chunk, bool key_major) {
  const SdpaPlan<T>& a = *p.plan;
  const index_t dq = a.q.C, dv = a.v.C;
  if (key_major) {  // column c of key j: panel c / kBlockQ, its row j - k0, its column c % kBlockQ
    const index_t panel = p.chunk_keys * kBlockQ;
    for (index_t j = k0; j < k1; ++j)
      for (index_t c0 = 0; c0 < std::max(dq, dv); c0 += kBlockQ) {
        const index_t at = c0 / kBlockQ * panel + (j - k0) * kBlockQ;
        if (c0 < dq && !p.dk.empty()) {
          T* dk = p.dk.row(b, hk, j) + c0;
          for (index_t c = 0; c < kBlockQ; ++c) dk[c] = a.scale * dk_chunk[at + c];
        }
        if (c0 < dv && !p.dv.empty()) std::copy(dv_chunk + at, dv_chunk + at + kBlockQ, p.dv.row(b, hk, j) + c0);
      }
    return;
  }
  for (index_t j = k0; j < k1; ++j) {
    const index_t jj = (j - k0) % kBlockK;
    const T* dkt = dk_chunk + (j - k0 - jj) * dq;
    const T* dvt = dv_chunk + (j - k0 - jj) * dv;
    if (!p.dk.empty()) {
      T* dk = p.dk.row(b, hk, j);
      for (index_t c = 0; c < dq; ++c) dk[c] = a.scale * dkt[c * kBlockK + jj];
    }
    if (!p.dv.empty()) {
      T* dvr = p.dv.row(b, hk, j);
      for (index_t c = 0; c < dv; ++c) dvr[c] = dvt[c * kBlockK + jj];
    }
  }
}

// panels (cols / kBlockQ) x (kBlockQ, kBlockQ) = rows [i0, i0 + rows) of x(b, h), query-major in
// panels of kBlockQ columns (cols = x.C, a multiple of kBlockQ), the rows whose 1/sum (inv) is 0
// zeroed when zero_dead (as StartChunkRows does in Q^T); rows past `rows` are left as they are (the
// products' depth is the block's rows).
template <class T>
void PackPanels(T* panels, View4<const T> x, index_t b, index_t h, index_t i0, index_t rows, const T* inv,
                bool zero_dead) {
  for (index_t i = 0; i < rows; ++i) {
    const T* row = x.row(b, h, i0 + i);
    const bool dead = zero_dead && inv[i] == T(0);
    for (index_t c0 = 0; c0 < x.C; c0 += kBlockQ) {
      T* dst = panels + (c0 + i) * kBlockQ;
      if (dead) {
        std::fill(dst, dst + kBlockQ, T(0));
      } else {
        std::copy(row + c0, row + c0 + kBlockQ, dst);
      }
    }
  }
}

// The bfloat16 products of pass 2 (SdpaBackward::bf16_products; bf16/dot_bf16.hpp gives the
// layouts), for float arrays only (T = double never takes them).
//
// The chunk's key tiles as the products take them, once per chunk (SdpaChunkArrays: k_a, v_a, k_t):
// the keys' and values' rows in pairs along them, and the keys for the partial dQ.
template <class T>
void PackChunkTilesBf16(const SdpaChunkArrays<T>& arrays, const SdpaPlan<T>& a, index_t b, index_t hk, index_t k0,
                        index_t k1, bool tiles) {
  if constexpr (std::is_same_v<T, float>) {
    const index_t dq = a.q.C, dv = a.v.C;
    for (index_t j0 = k0; j0 < k1; j0 += kBlockK) {
      const index_t cnt = std::min<index_t>(kBlockK, k1 - j0), at = j0 - k0;
      const T* k_tile = a.k.row(b, hk, j0);
      bf16::pack_pairs_in_rows(k_tile, a.k.sR, cnt, dq, arrays.k_a + at * ((dq + 1) / 2));
      bf16::pack_pairs_in_rows(a.v.row(b, hk, j0), a.v.sR, cnt, dv, arrays.v_a + at * ((dv + 1) / 2));
      if (tiles) {
        bf16::pack_column_pairs(k_tile, a.k.sR, cnt, dq, arrays.k_t + at / 2 * dq);  // (dq, kBlockK / 2)
      } else {
        bf16::pack_row_pairs(k_tile, a.k.sR, cnt, dq, arrays.k_t + at / 2 * dq);  // (ceil(cnt / 2), dq)
      }
    }
  }
}

// c (cnt, kBlockQ) = X_tile B for the tile's cnt rows, packed (k_a or v_a) in pairs along their
// `cols` elements, B the block's operand in pairs of rows: the scores (the keys, B = Q^T) and dP^T
// (the values, B = dout^T).
template <class T>
void TileProductsBf16(const std::uint32_t* packed, index_t cnt, index_t cols, const std::uint32_t* b, T* c, bool tiles) {
  if constexpr (std::is_same_v<T, float>) {
    const index_t pairs = (cols + 1) / 2;
    bf16::products(packed, pairs, 1, cnt, pairs, b, c, false, tiles);
  }
}

// The block's queries and output gradients as the products of dK and dV take them (q_a, o_a):
// key-major, Q and dout in pairs of rows a panel of kBlockQ columns at a time, from the panels
// (the rows past `rows` 0, not what the panels hold there); else Q^T and dout^T in pairs along the
// queries.
template <class T>
void PackBlockPairsBf16(const SdpaChunkArrays<T>& arrays, const BlockState<T>& st, index_t rows, index_t dq,
                        index_t dv, bool key_major) {
  if constexpr (std::is_same_v<T, float>) {
    if (!key_major) {
      bf16::pack_pairs_in_rows(st.qt, kBlockQ, dq, kBlockQ, arrays.q_a);
      bf16::pack_pairs_in_rows(st.ot, kBlockQ, dv, kBlockQ, arrays.o_a);
      return;
    }
    for (index_t c0 = 0; c0 < dq; c0 += kBlockQ)
      bf16::pack_row_pairs(arrays.q_panels + c0 * kBlockQ, kBlockQ, rows, kBlockQ, arrays.q_a + c0 * kBlockQ / 2);
    for (index_t c0 = 0; c0 < dv; c0 += kBlockQ)
      bf16::pack_row_pairs(arrays.o_panels + c0 * kBlockQ, kBlockQ, rows, kBlockQ, arrays.o_a + c0 * kBlockQ / 2);
  }
}

// The tile's shares of the gradients over the block's `rows` queries, W and dS rounded to bfloat16:
// key-major, dV += W^T dout and dK += dS^T Q, a panel of kBlockQ columns at a time (W^T in st.s and
// dS^T in dst, as the tile holds them; `panel` floats apart in dvt and dkt); else dV^T += dout^T W
// and dK^T += Q^T dS (pm and dsm, query-major). Then, unless skip_dq (a masked tile whose keys are
// not all finite: the caller adds them skipping zeros, in float), the partial dQ^T += K_tile^T dS^T
// over the tile's cnt keys (k_t: the tile's keys packed by PackChunkTilesBf16). Both layouts give
// the same sums: the same pairs, in the same order.
template <class T>
void AccumulateGradsBf16(const SdpaChunkArrays<T>& arrays, const BlockState<T>& st, const std::uint32_t* k_t,
                         index_t cnt, index_t rows, index_t dq, index_t dv, bool key_major, index_t panel, bool skip_dq,
                         bool tiles, T* dvt, T* dkt, T* part_blk) {
  if constexpr (std::is_same_v<T, float>) {
    // Pairs of the block's rows; an odd count's last pair takes a 0 for the row past it (whose W may
    // be NaN where a masked key is; Q^T and dout^T are 0 there).
    const index_t query_pairs = (rows + 1) / 2;
    if (key_major) {  // A: the tile's key rows in pairs along the queries; B: a panel of Q or dout pairs
      bf16::pack_pairs_in_rows(st.s, kBlockQ, cnt, rows, arrays.w_b);
      for (index_t c0 = 0; c0 < dv; c0 += kBlockQ)
        bf16::products(arrays.w_b, query_pairs, 1, cnt, query_pairs, arrays.o_a + c0 * kBlockQ / 2,
                       dvt + c0 / kBlockQ * panel, true, tiles);
      bf16::pack_pairs_in_rows(arrays.dst, kBlockQ, cnt, rows, arrays.ds_b);
      for (index_t c0 = 0; c0 < dq; c0 += kBlockQ)
        bf16::products(arrays.ds_b, query_pairs, 1, cnt, query_pairs, arrays.q_a + c0 * kBlockQ / 2,
                       dkt + c0 / kBlockQ * panel, true, tiles);
    } else {
      bf16::pack_row_pairs(arrays.pm, kBlockK, rows, kBlockK, arrays.w_b);
      bf16::products(arrays.o_a, kBlockQ / 2, 1, dv, query_pairs, arrays.w_b, dvt, true, tiles);
      bf16::pack_row_pairs(arrays.dsm, kBlockK, rows, kBlockK, arrays.ds_b);
      bf16::products(arrays.q_a, kBlockQ / 2, 1, dq, query_pairs, arrays.ds_b, dkt, true, tiles);
    }
    if (skip_dq) return;
    bf16::pack_row_pairs(arrays.dst, kBlockQ, cnt, kBlockQ, arrays.dst_b);  // (ceil(cnt / 2), kBlockQ)
    if (tiles) {  // A = K^T in pairs along the keys: rows of kBlockK / 2 words
      bf16::products(k_t, kBlockK / 2, 1, dq, (cnt + 1) / 2, arrays.dst_b, part_blk, true, tiles);
    } else {  // A(c, p) = k_t[p][c]
      bf16::products(k_t, 1, dq, dq, (cnt + 1) / 2, arrays.dst_b, part_blk, true, tiles);
    }
  }
}

// Pass 2 for the keys of one chunk of key head hk: see simd/fused.hpp.
template <class T>
void ChunkBlock(const SdpaBackward<T>& p, index_t b, index_t hk, index_t chunk, void* work) {
  simd::note_ran(HWY_TARGET);
  const SdpaPlan<T>& a = *p.plan;
  const hn::ScalableTag<T> d;
  const index_t n = a.q.R, m = a.k.R, dq = a.q.C, dv = a.v.C, H = a.q.H;
  const index_t blocks = (n + kBlockQ - 1) / kBlockQ;
  Carve carve(work);
  const SdpaChunkArrays<T> arrays(carve, dq, dv, p.chunk_keys, p.bf16_products, p.bf16_tiles);
  const bool bf16 = std::is_same_v<T, float> && p.bf16_products;
  const bool key_major = backward_grads_key_major(dq, dv, bf16 && p.bf16_tiles);
  const index_t panel = p.chunk_keys * kBlockQ;  // key-major: the floats of a panel of dK or dV
  BlockState<T> st(arrays.block);
  const tiles::Scope tile_registers(bf16 && p.bf16_tiles);
  st.hook = a.hook;
  double* row_dot = arrays.row_dot;
  T *pm = arrays.pm, *dst = arrays.dst, *dsm = arrays.dsm, *dk_chunk = arrays.dk_chunk, *dv_chunk = arrays.dv_chunk;
  const index_t k0 = chunk * p.chunk_keys, k1 = std::min(m, k0 + p.chunk_keys);
  std::fill(dk_chunk, dk_chunk + dq * p.chunk_keys, T(0));
  std::fill(dv_chunk, dv_chunk + dv * p.chunk_keys, T(0));
  if (bf16) PackChunkTilesBf16(arrays, a, b, hk, k0, k1, p.bf16_tiles);

  // The query heads of the group, then query blocks, then key tiles: a block's queries and output
  // gradients are transposed once per chunk. Every sum keeps its order (dK, dV over heads and blocks
  // ascending, dQ over tiles ascending), whatever the thread count.
  for (index_t h = hk * a.group; h < (hk + 1) * a.group; ++h) {
    T* part = p.dq_partial + ((b * H + h) * p.chunks + chunk) * blocks * dq * kBlockQ;
    std::fill(part, part + blocks * dq * kBlockQ, T(0));
    for (index_t blk = 0; blk < blocks; ++blk) {
      const index_t i0 = blk * kBlockQ, rows = std::min<index_t>(kBlockQ, n - i0);
      const KeyRange keys = st.start(a.mask, b, h, i0, rows);
      // The chunk's tiles that meet the block's keys (tiles keep their place in the chunk).
      const index_t keys_end = std::min(k1, keys.end);
      const index_t first = std::max(k0, keys.begin);
      if (keys_end <= first) continue;
      const bool dead_rows = StartChunkRows(p, st, row_dot, b, h, i0, rows);
      if (key_major) {
        PackPanels(arrays.q_panels, a.q, b, h, i0, rows, st.alpha, dead_rows);
        PackPanels(arrays.o_panels, p.dout, b, h, i0, rows, st.alpha, false);
      }
      if constexpr (std::is_same_v<T, float>) {
        if (bf16) {  // the block's Q^T and dout^T as bfloat16 pairs, for each product
          bf16::pack_row_pairs(st.qt, kBlockQ, dq, kBlockQ, arrays.q_b);
          bf16::pack_row_pairs(st.ot, kBlockQ, dv, kBlockQ, arrays.o_b);
          PackBlockPairsBf16(arrays, st, rows, dq, dv, key_major);
        }
      }
      T* part_blk = part + blk * dq * kBlockQ;
      std::int64_t tiles = 0;  // simd::note_tiles
      for (index_t j0 = first; j0 < keys_end; j0 += kBlockK) {
        const index_t cnt = std::min<index_t>(kBlockK, k1 - j0);
        if (!st.may_attend(j0, cnt) || !a.tile_live(b, h, i0, j0)) continue;  // no common segment, or mask_mod
        ++tiles;
        T* dkt = dk_chunk + (j0 - k0) * (key_major ? kBlockQ : dq);  // this tile's dK: rows or dK^T (d, kBlockK)
        T* dvt = dv_chunk + (j0 - k0) * (key_major ? kBlockQ : dv);
        const T* k_tile = a.k.row(b, hk, j0);
        const T* v_tile = a.v.row(b, hk, j0);
        if (bf16) {
          TileProductsBf16(arrays.k_a + (j0 - k0) * ((dq + 1) / 2), cnt, dq, arrays.q_b, st.s, p.bf16_tiles);
        } else {
          BlockGemm<false>(d, k_tile, a.k.sR, 1, st.qt, st.s, cnt, dq);
        }
        const bool partial = RebuildWeights(d, a, st, j0, cnt, arrays.softcap_tanh, arrays.raw);
        // dP^T = V_tile dout^T, then dS^T and W.
        if (bf16) {
          TileProductsBf16(arrays.v_a + (j0 - k0) * ((dv + 1) / 2), cnt, dv, arrays.o_b, dst, p.bf16_tiles);
        } else {
          BlockGemm<false>(d, v_tile, a.v.sR, 1, st.ot, dst, cnt, dv);
        }
        T* w_out = key_major ? nullptr : pm;  // key-major: W^T in st.s
        if (!a.dropout.active && !st.general) {
          RangeScoreGrads(d, st, dst, w_out, row_dot, j0, cnt, bf16);
        } else {
          ElementScoreGrads(a.dropout, st, dst, w_out, row_dot, b * H + h, i0, rows, j0, cnt);
        }
        // score_mod: dS is the gradient of the modified score; the hook takes its share for score_mod's
        // parameters (this chunk task's part) and turns it into the gradient of the score before it.
        if (a.hook != nullptr)
          a.hook->backward(a.hook->ctx, (b * a.k.H + hk) * p.chunks + chunk, dst, arrays.raw, kBlockQ, b, h, i0, rows,
                           j0, cnt);
        if (a.softcap != T(0)) SoftcapGrads(d, dst, arrays.softcap_tanh, cnt);
        if (!key_major) Transpose(dsm, dst);
        // dV += W^T dout, dK += dS^T Q (scaled at the end; both key-major or transposed), partial
        // dQ^T += K_tile^T dS^T.
        const bool keys_not_finite = partial && !rows_finite(k_tile, a.k.sR, cnt, dq);
        if (bf16) {
          AccumulateGradsBf16(arrays, st, arrays.k_t + (j0 - k0) / 2 * dq, cnt, rows, dq, dv, key_major, panel,
                              keys_not_finite, p.bf16_tiles, dvt, dkt, part_blk);
          if (keys_not_finite) AccumulateSkippingZeros(part_blk, k_tile, a.k.sR, dst, cnt, dq, rows);
          continue;
        }
        if (key_major) {  // each panel of kBlockQ columns: (cnt, kBlockQ) += (cnt, rows) (rows, kBlockQ)
          for (index_t c0 = 0; c0 < dv; c0 += kBlockQ)
            BlockGemm<true>(d, st.s, kBlockQ, 1, arrays.o_panels + c0 * kBlockQ, dvt + c0 / kBlockQ * panel, cnt, rows);
          for (index_t c0 = 0; c0 < dq; c0 += kBlockQ)
            BlockGemm<true>(d, dst, kBlockQ, 1, arrays.q_panels + c0 * kBlockQ, dkt + c0 / kBlockQ * panel, cnt, rows);
        } else {  // transposed: (v, kBlockK) += (v, rows) (rows, kBlockK), d alike
          BlockGemm<true>(d, p.dout.row(b, h, i0), 1, p.dout.sR, pm, dvt, dv, rows);
          if (dead_rows) {
            BlockGemm<true>(d, st.qt, kBlockQ, 1, dsm, dkt, dq, rows);
          } else {
            BlockGemm<true>(d, a.q.row(b, h, i0), 1, a.q.sR, dsm, dkt, dq, rows);
          }
        }
        if (keys_not_finite) {
          AccumulateSkippingZeros(part_blk, k_tile, a.k.sR, dst, cnt, dq, rows);
        } else {
          BlockGemm<true>(d, k_tile, 1, a.k.sR, dst, part_blk, dq, cnt);
        }
      }
      simd::note_tiles(tiles);
    }
  }
  StoreChunkGrads(p, b, hk, k0, k1, dk_chunk, dv_chunk, key_major);
}

// sum_chunk_partials (fused.hpp): the sums of a panel of columns at a time, (panel, kBlockQ),
// scaled in vectors, then transposed into rows of out; each element the same sum, in chunk order
// from 0, times scale, as lane by lane.
template <class T>
void SumChunkPartials(T* out, index_t out_stride, const T* partials, index_t bh, index_t blk, index_t rows,
                      index_t chunks, index_t blocks, index_t cols, T scale) {
  const hn::ScalableTag<T> d;
  const index_t L = static_cast<index_t>(hn::Lanes(d));
  constexpr index_t kPanel = 64;
  const T* part = partials + (bh * chunks * blocks + blk) * cols * kBlockQ;
  const index_t chunk_stride = blocks * cols * kBlockQ;
  HWY_ALIGN T sums[kPanel * kBlockQ];
  const auto factor = hn::Set(d, scale);
  for (index_t c0 = 0; c0 < cols; c0 += kPanel) {
    const index_t panel = std::min(kPanel, cols - c0);
    for (index_t c = 0; c < panel; ++c)
      for (index_t i = 0; i < kBlockQ; i += L) {
        const T* lanes = part + (c0 + c) * kBlockQ + i;
        auto sum = hn::Zero(d);
        for (index_t ch = 0; ch < chunks; ++ch) sum = hn::Add(sum, hn::Load(d, lanes + ch * chunk_stride));
        hn::Store(hn::Mul(factor, sum), d, sums + c * kBlockQ + i);
      }
    TransposeInto(out + c0, out_stride, sums, kBlockQ, panel, rows);
  }
}

void StatsBlockF32(const SdpaBackward<float>& p, index_t b, index_t h, index_t i0, void* w) { StatsBlock(p, b, h, i0, w); }
void StatsBlockF64(const SdpaBackward<double>& p, index_t b, index_t h, index_t i0, void* w) { StatsBlock(p, b, h, i0, w); }
void ChunkBlockF32(const SdpaBackward<float>& p, index_t b, index_t h, index_t c, void* w) { ChunkBlock(p, b, h, c, w); }
void ChunkBlockF64(const SdpaBackward<double>& p, index_t b, index_t h, index_t c, void* w) { ChunkBlock(p, b, h, c, w); }
void SumChunkPartialsF32(float* out, index_t out_stride, const float* partials, index_t bh, index_t blk, index_t rows,
                         index_t chunks, index_t blocks, index_t cols, float scale) {
  SumChunkPartials(out, out_stride, partials, bh, blk, rows, chunks, blocks, cols, scale);
}
void SumChunkPartialsF64(double* out, index_t out_stride, const double* partials, index_t bh, index_t blk, index_t rows,
                         index_t chunks, index_t blocks, index_t cols, double scale) {
  SumChunkPartials(out, out_stride, partials, bh, blk, rows, chunks, blocks, cols, scale);
}

}  // namespace attn::cpu::fused::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::cpu::fused {

HWY_EXPORT(StatsBlockF32);
HWY_EXPORT(StatsBlockF64);
HWY_EXPORT(ChunkBlockF32);
HWY_EXPORT(ChunkBlockF64);
HWY_EXPORT(SumChunkPartialsF32);
HWY_EXPORT(SumChunkPartialsF64);

template <>
void sdpa_backward_stats(const SdpaBackward<float>& p, index_t b, index_t h, index_t i0, void* work) {
  ATTN_SIMD_CALL(p.simd, StatsBlockF32)(p, b, h, i0, work);
}
template <>
void sdpa_backward_stats(const SdpaBackward<double>& p, index_t b, index_t h, index_t i0, void* work) {
  ATTN_SIMD_CALL(p.simd, StatsBlockF64)(p, b, h, i0, work);
}
template <>
void sdpa_backward_chunk(const SdpaBackward<float>& p, index_t b, index_t hk, index_t chunk, void* work) {
  ATTN_SIMD_CALL(p.simd, ChunkBlockF32)(p, b, hk, chunk, work);
}
template <>
void sdpa_backward_chunk(const SdpaBackward<double>& p, index_t b, index_t hk, index_t chunk, void* work) {
  ATTN_SIMD_CALL(p.simd, ChunkBlockF64)(p, b, hk, chunk, work);
}

template <>
void sum_chunk_partials(float* out, index_t out_stride, const float* partials, index_t bh, index_t blk, index_t rows,
                        index_t chunks, index_t blocks, index_t cols, float scale, simd::Target simd) {
  ATTN_SIMD_CALL(simd, SumChunkPartialsF32)(out, out_stride, partials, bh, blk, rows, chunks, blocks, cols, scale);
}
template <>
void sum_chunk_partials(double* out, index_t out_stride, const double* partials, index_t bh, index_t blk, index_t rows,
                        index_t chunks, index_t blocks, index_t cols, double scale, simd::Target simd) {
  ATTN_SIMD_CALL(simd, SumChunkPartialsF64)(out, out_stride, partials, bh, blk, rows, chunks, blocks, cols, scale);
}

}  // namespace attn::cpu::fused
#endif  // HWY_ONCE
