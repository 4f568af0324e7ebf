// The fused additive attention kernels of the cpu backend (additive_forward.cpp,
// additive_backward.cpp), compiled per SIMD target like the SDPA ones (simd/fused.hpp, whose block
// sizes, BlockState and dispatch they share). score(i, j) = w_v . tanh(qp_i + kp_j) with
// qp = Q W_q^T, kp = K W_k^T is computed tile by tile and never stored: the forward's extra memory is
// kp (B, H, m, h) for the call and one block's work space per thread, independent of n m h.
//
// A score tile (kBlockK keys, kBlockQ query lanes) from the block's projected queries transposed,
// qpT (h, kBlockQ): for key j and hidden unit p, kp[j, p] and w_v[p] are broadcast and
//   s[j][lanes] += w_v[p] tanh(qpT[p][lanes] + kp[j, p])
// summed over p in ascending order, queries along the SIMD lanes (no horizontal sums). Masks,
// online softmax, dropout and the weighted sum of values follow as in sdpa_forward.cpp.
#pragma once

#include <algorithm>
#include <cstddef>

#include "core/dropout_plan.hpp"
#include "core/mask_plan.hpp"
#include "core/view4.hpp"
#include "cpu/simd/fused.hpp"

namespace attn::cpu::fused {

// One additive attention call, checked by src/api: queries (B, H, n, q), keys (B, H, m, k), values
// (B, H, m, v), w_q (1, 1, h, q), w_v (1, 1, 1, h); kp (B, H, m, h) = keys W_k^T, dense, computed
// by additive_project_keys. The forward writes out (B, H, n, v). The backward's pass 1 (out empty)
// writes instead, per row r = (b H + h) n + i, row_max[r], row_inv[r] = 1 / sum (0 for an empty
// row), row_dot[r] = dout_r . out_r, and the block's qpT into qpt (B, H, blocks, h, kBlockQ).
template <class T>
struct AdditiveForward {
  View4<T> out;
  View4<const T> q, k, v, w_q, w_v;
  const T* kp;
  const MaskPlan<T>* mask;
  const DropoutPlan* dropout;
  simd::Target simd;
  // Pass 1 of the backward only.
  View4<const T> dout;
  T* row_max = nullptr;
  T* row_inv = nullptr;
  double* row_dot = nullptr;
  T* qpt = nullptr;
};

// kp rows [j0, j0 + kBlockK) (fewer at the end) of (b, h) = keys W_k^T, through a (h, kBlockK)
// tile in `work` (additive_work_bytes): w_k (1, 1, h, k), keys (B, H, m, k), kp (B, H, m, h) dense.
template <class T>
void additive_project_keys(T* kp, View4<const T> keys, View4<const T> w_k, index_t b, index_t h, index_t j0,
                           void* work, simd::Target simd);

// The work space of additive_project_keys for key size k and hidden size h: the keys of a tile
// transposed (k, kBlockK) and their projections (h, kBlockK).
template <class T>
struct ProjectKeysArrays {
  T* xt;
  T* kpt;
  ProjectKeysArrays(Carve& c, index_t k, index_t h)
      : xt(c.take<T>(static_cast<std::size_t>(k * kBlockK))), kpt(c.take<T>(static_cast<std::size_t>(h * kBlockK))) {}
};

// The work space of additive_forward_block for hidden size h, query size q and value size v: a
// block's arrays (its qt holds qpT (h, kBlockQ)), and the queries transposed (q, kBlockQ).
template <class T>
struct AdditiveBlockArrays {
  BlockArrays<T> block;
  T* qt;
  AdditiveBlockArrays(Carve& c, index_t h, index_t q, index_t v)
      : block(c, h, v), qt(c.take<T>(BlockArrays<T>::tile(q))) {}
};

// The work space of additive_backward_chunk for hidden size h and value size v: a block's arrays
// (qt: the tanh of one key and group of lanes, s: dP^T, ot: dout^T, alpha: 1/sum), D (float64) of
// the block's rows, W (kBlockQ, kBlockK) query-major, dV^T (v, kBlockK) of the tile, the dropout
// factors (kBlockK, kBlockQ), P and dS of one key (kBlockQ each), the chunk's dw_v partial per lane
// (h, kBlockQ at most), and per key of the tile whether its projection is finite.
template <class T>
struct AdditiveChunkArrays {
  BlockArrays<T> block;
  double* row_dot;
  T *pm, *dvt, *factors, *pk, *dsk, *dwl;
  bool* finite;
  AdditiveChunkArrays(Carve& c, index_t h, index_t v)
      : block(c, h, v), row_dot(c.take<double>(kBlockQ)), pm(c.take<T>(kBlockQ * kBlockK)),
        dvt(c.take<T>(static_cast<std::size_t>(v * kBlockK))), factors(c.take<T>(kBlockK * kBlockQ)),
        pk(c.take<T>(kBlockQ)), dsk(c.take<T>(kBlockQ)), dwl(c.take<T>(BlockArrays<T>::tile(h))),
        finite(c.take<bool>(kBlockK)) {}
};

// Bytes of per-thread work space for hidden size h, query size q, key size k and value size v:
// enough for the key projection, the forward block and both backward passes.
template <class T>
std::size_t additive_work_bytes(index_t h, index_t q, index_t k, index_t v) {
  return std::max({layout_bytes<ProjectKeysArrays<T>>(k, h), layout_bytes<AdditiveBlockArrays<T>>(h, q, v),
                   layout_bytes<AdditiveChunkArrays<T>>(h, v)});
}

// Rows [i0, i0 + kBlockQ) of (b, h): out, or (pass 1 of the backward) the row statistics.
template <class T>
void additive_forward_block(const AdditiveForward<T>& p, index_t b, index_t h, index_t i0, void* work);

// ---- backward ------------------------------------------------------------------------------
// Pass 1 is additive_forward_block with the statistics. Pass 2, per chunk of keys of one (b, h)
// (chunks sized from the shape alone): for each key tile and query block, t = tanh(qp_i + kp_j) is
// computed once per (i, j, p) and kept for the h units of one key while it serves
//   the score s_ij -> P_ij = exp(s_ij - max_i) / sum_i (masks, exactly pass 1's), dropout factor
//   f_ij, dP_ij = f_ij dout_i . v_j, dS_ij = P_ij (dP_ij - D_i) (0 where masked), and
//   dqp[i, p] += dS_ij w_v[p] (1 - t^2)     into the chunk's partial (summed in chunk order later),
//   dkp[j, p] += the same                     (the chunk owns key j),
//   dw_v[p]  += dS_ij t                       into the chunk's partial,
//   dV_j     += f_ij P_ij dout_i              (owned).
template <class T>
struct AdditiveBackward {
  View4<T> dv;                    // (B, H, m, v), may be empty
  View4<const T> dout, q, k, v, w_v;
  const MaskPlan<T>* mask;
  const DropoutPlan* dropout;
  const T* kp;                    // (B, H, m, h)
  const T* qpt;                   // (B, H, blocks, h, kBlockQ), from pass 1
  const T* row_max;               // (B, H, n)
  const T* row_inv;               // (B, H, n)
  const double* row_dot;          // (B, H, n)
  T* dkp;                         // (B, H, m, h), written whole by the chunks
  T* dqp_partial;                 // (B, H, chunks, blocks, h, kBlockQ)
  T* dwv_partial;                 // (B, H, chunks, h)
  index_t h, chunk_keys, chunks;  // chunk_keys: a multiple of kBlockK
  simd::Target simd;
};

// Pass 2 for chunk `chunk` of (b, h).
template <class T>
void additive_backward_chunk(const AdditiveBackward<T>& p, index_t b, index_t h, index_t chunk, void* work);

// y[i] = tanh(x[i]) for i < count with the kernels' SIMD tanh (simd/tanh-inl.h) on the chosen
// target, the forward's (TanhFast) or with `accurate` the backward's (TanhAccurate): for measuring
// their accuracy and speed.
template <class T>
void simd_tanh(const T* x, T* y, std::size_t count, bool accurate = false);

}  // namespace attn::cpu::fused
