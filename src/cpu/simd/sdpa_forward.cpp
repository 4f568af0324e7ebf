// Fused scaled dot-product attention forward, one block of kBlockQ queries per call: for each tile
// of kBlockK keys, scores = scale K Q^T (transposed: a row per key), masks, an online softmax (running
// row maximum and float64 sum; earlier partial outputs rescaled when the maximum grows), dropout, and
// the weighted sum of values. The (n, m) matrix is never formed; tiles past every row's last
// allowed key are skipped. Compiled once per SIMD target (hwy/foreach_target.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/simd/sdpa_forward.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include "attn/half.hpp"
#include "cpu/bf16/dot_bf16.hpp"
#include "cpu/int8/dot_int8.hpp"
#include "cpu/simd/fused.hpp"
#include "cpu/simd/gemm-inl.h"
#include "cpu/simd/half-inl.h"
#include "cpu/simd/kv_rows-inl.h"
#include "cpu/simd/softmax-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::fused::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// A tile of key or value rows: row jj at rows + jj stride.
template <class T>
struct Tile {
  const T* rows;
  index_t stride;
};

// Where a block reads its keys and values: the plan's, in place.
template <class T>
struct PlanKeys {
  Tile<T> key_tile(const SdpaPlan<T>& a, index_t b, index_t hk, index_t j0, index_t) const { return {a.k.row(b, hk, j0), a.k.sR}; }
  Tile<T> value_tile(const SdpaPlan<T>& a, index_t b, index_t hk, index_t j0, index_t) const { return {a.v.row(b, hk, j0), a.v.sR}; }
};

// Where a block reads its queries and writes its output: the plan's float queries and out, in
// place; keys and values the plan's.
template <class T>
struct InPlaceOperands : PlanKeys<T> {
  const SdpaPlan<T>& a;
  const View4<T>& out;
  InPlaceOperands(const SdpaPlan<T>& plan, const View4<T>& o) : a(plan), out(o) {}

  // qt (d, kBlockQ) = rows [i0, i0 + rows) of queries (b, h) transposed, zero past rows.
  void pack_queries(T* qt, index_t b, index_t h, index_t i0, index_t rows) const { PackTransposed(qt, a.q, b, h, i0, rows); }
  // Where row i of out (b, h) is written, and the write finished.
  T* out_row(index_t b, index_t h, index_t i) const { return out.row(b, h, i); }
  void store_row(index_t, index_t, index_t) const {}
};

// 16-bit queries and out (HalfViews of element type H), widened to float a block at a time into
// `tile` (kBlockQ rows of d floats) and narrowed a row at a time from it; the keys and values are
// the plan's, widened to float once per call by the caller (cpu::sdpa_forward_half). The
// conversions are exact (widening) or the one rounding of the result (narrowing): the float
// kernel's results, bit for bit, rounded once.
template <class H>
struct HalfOperands : PlanKeys<float> {
  const HalfViews& x;
  float* tile;
  HalfOperands(const HalfViews& views, float* t) : x(views), tile(t) {}

  void pack_queries(float* qt, index_t b, index_t h, index_t i0, index_t rows) const {
    const index_t d = x.q.C;
    for (index_t r = 0; r < rows; ++r)
      simd::HWY_NAMESPACE::WidenArray(reinterpret_cast<const H*>(x.q.row(b, h, i0 + r)), tile + r * d,
                                      static_cast<std::size_t>(d));
    PackTransposed(qt, View4<const float>{tile, 1, 1, rows, d, 0, 0, d}, 0, 0, 0, rows);
  }
  float* out_row(index_t, index_t, index_t) const { return tile; }
  void store_row(index_t b, index_t h, index_t i) const {
    if (x.float_out) {
      std::copy(tile, tile + x.out_float.C, x.out_float.row(b, h, i));
    } else {
      simd::HWY_NAMESPACE::NarrowArray(tile, reinterpret_cast<H*>(x.out.row(b, h, i)), static_cast<std::size_t>(x.out.C));
    }
  }
};

// The plan's float queries and out in place; keys and values read from rows of any type a cache
// stores (p.keys, p.values: KvRows), widened a tile at a time into key_tile and value_tile
// (kBlockK rows each): the whole prefix is never widened at once.
struct RowsOperands : InPlaceOperands<float> {
  const KvRows& keys;
  const KvRows& values;
  float* key_rows;
  float* value_rows;
  RowsOperands(const SdpaForward<float>& p, float* k, float* v)
      : InPlaceOperands<float>(*p.plan, p.out), keys(*p.keys), values(*p.values), key_rows(k), value_rows(v) {}
  Tile<float> key_tile(const SdpaPlan<float>& plan, index_t b, index_t hk, index_t j0, index_t cnt) const {
    WidenRows(hn::ScalableTag<float>(), keys, b, hk, j0, cnt, plan.k.C, key_rows);
    return {key_rows, plan.k.C};
  }
  Tile<float> value_tile(const SdpaPlan<float>& plan, index_t b, index_t hk, index_t j0, index_t cnt) const {
    WidenRows(hn::ScalableTag<float>(), values, b, hk, j0, cnt, plan.v.C, value_rows);
    return {value_rows, plan.v.C};
  }
};

template <class T, class Operands>
void ForwardBlock(const SdpaForward<T>& p, const Operands& operands, const BlockArrays<T>& arrays, index_t b,
                  index_t h, index_t i0) {
  simd::note_ran(HWY_TARGET);
  const SdpaPlan<T>& a = *p.plan;
  const hn::ScalableTag<T> d;
  const index_t n = a.q.R, dq = a.q.C, dv = a.v.C, hk = a.kv_head(h);
  const index_t rows = std::min<index_t>(kBlockQ, n - i0);
  BlockState<T> st(arrays);
  st.hook = a.hook;

  operands.pack_queries(st.qt, b, h, i0, rows);
  const KeyRange keys = st.start(a.mask, b, h, i0, rows);
  for (index_t c = 0; c < dv * kBlockQ; ++c) st.ot[c] = 0;

  std::int64_t tiles = 0, masked_tiles = 0;  // simd::note_tiles
  for (index_t j0 = keys.begin; j0 < keys.end; j0 += kBlockK) {
    const index_t cnt = std::min<index_t>(kBlockK, keys.end - j0);
    if (!st.may_attend(j0, cnt) || !a.tile_live(b, h, i0, j0)) continue;  // no common segment, or mask_mod
    ++tiles;
    // scores^T (cnt, kBlockQ) = K_tile Q^T, then scale, soft-capping, position bias and masks.
    const Tile<T> k = operands.key_tile(a, b, hk, j0, cnt);
    BlockGemm<false>(d, k.rows, k.stride, 1, st.qt, st.s, cnt, dq);
    const bool partial = st.template weigh_tile</*kTileSumInFloat=*/true>(d, a.scale, a.softcap, j0, cnt);
    if (partial || st.tile_bias) ++masked_tiles;
    if (a.dropout.active) st.drop_tile(a.dropout, b * a.q.H + h, i0, rows, j0, cnt);
    // out^T (dv, kBlockQ) = alpha out^T + V_tile^T P^T.
    st.rescale(d, st.ot, dv);
    const Tile<T> v = operands.value_tile(a, b, hk, j0, cnt);
    if (partial && !rows_finite(v.rows, v.stride, cnt, dv)) {
      st.accumulate_skipping_zeros(v.rows, v.stride, cnt, dv, rows);  // 0 * Inf must not reach a row
    } else {
      BlockGemm<true>(d, v.rows, 1, v.stride, st.s, st.ot, dv, cnt);
    }
  }
  simd::note_tiles(tiles, masked_tiles);

  // out = out^T / sum, lse = max + log(sum), the head's sink joining the sum (row_end); an empty
  // row gets 0 and -inf (or the sink).
  const T* sink = a.mask.sink_of(h);
  for (index_t i = 0; i < rows; ++i) {
    const RowEnd<T> end = row_end(st.max[i], st.sum[i], sink);
    T* o = operands.out_row(b, h, i0 + i);
    for (index_t c = 0; c < dv; ++c) o[c] = st.ot[c * kBlockQ + i] * end.factor;
    operands.store_row(b, h, i0 + i);
    if (!p.lse.empty()) p.lse.at(b, h, i0 + i, 0) = end.lse;
  }
}

template <class T>
void ForwardBlock(const SdpaForward<T>& p, index_t b, index_t h, index_t i0, void* work) {
  Carve carve(work);
  ForwardBlock(p, InPlaceOperands<T>{*p.plan, p.out}, BlockArrays<T>(carve, p.plan->q.C, p.plan->v.C), b, h, i0);
}

// sdpa_forward_block_rows (fused.hpp).
void ForwardBlockRows(const SdpaForward<float>& p, index_t b, index_t h, index_t i0, void* work) {
  Carve carve(work);
  const RowsArrays arrays(carve, p.plan->q.C, p.plan->v.C);
  ForwardBlock(p, RowsOperands(p, arrays.key_rows, arrays.value_rows), arrays.block, b, h, i0);
}

// sdpa_forward_block_half (fused.hpp).
void ForwardBlockHalf(const SdpaForward<float>& p, index_t b, index_t h, index_t i0, void* work) {
  Carve carve(work);
  const HalfArrays arrays(carve, p.plan->q.C, p.plan->v.C);
  if (p.half->type == KvType::bf16)
    ForwardBlock(p, HalfOperands<bfloat16>{*p.half, arrays.tile}, arrays.block, b, h, i0);
  else
    ForwardBlock(p, HalfOperands<float16>{*p.half, arrays.tile}, arrays.block, b, h, i0);
}

// Whether a tile's bfloat16 value rows are all finite (exponent bits not all ones).
inline bool Bf16RowsFinite(const std::uint16_t* v, index_t stride, index_t cnt, index_t dv) {
  for (index_t j = 0; j < cnt; ++j)
    for (index_t c = 0; c < dv; ++c)
      if ((v[j * stride + c] & 0x7F80u) == 0x7F80u) return false;
  return true;
}

// out^T (dv, kBlockQ) = alpha out^T + V_tile^T P^T by the bfloat16 products: the tile's weights
// (st.s, cnt keys) rounded and packed as P pairs into st.bias_t (free once the tile is masked), over
// the tile's values packed as V pairs; bf16::accumulate rescales out^T as it loads it.
inline void AccumulateValuePairs(BlockState<float>& st, index_t cnt, index_t dv, const ValuePairs& values, index_t b,
                                 index_t hk, index_t j0) {
  auto* weight_pairs = reinterpret_cast<std::uint32_t*>(st.bias_t);
  bf16::pack_weights(st.s, cnt, weight_pairs);
  bf16::accumulate(values.of(b, hk, j0), weight_pairs, cnt, dv, st.alpha, st.ot, values.on_tiles);
}

// sdpa_forward_block_bf16 (fused.hpp): ForwardBlock with the bfloat16 products. Compiled for
// every target, called on AVX-512 only (the products carry their own target attribute).
void ForwardBlockBf16(const SdpaForward<float>& p, index_t b, index_t h, index_t i0, void* work) {
  simd::note_ran(HWY_TARGET);
  const SdpaPlan<float>& a = *p.plan;
  const HalfViews& x = *p.half;
  const hn::ScalableTag<float> d;
  const index_t n = a.q.R, dq = a.q.C, dv = a.v.C, hk = a.kv_head(h);
  const index_t rows = std::min<index_t>(kBlockQ, n - i0);
  Carve carve(work);
  const HalfArrays arrays(carve, dq, dv);
  BlockState<float> st(arrays.block);
  const tiles::Scope tile_registers(x.value_pairs.on_tiles);
  auto* query_pairs = reinterpret_cast<std::uint32_t*>(st.qt);  // (d / 2, kBlockQ) words fit in qt
  bf16::pack_queries(x.q.row(b, h, i0), x.q.sR, rows, dq, query_pairs);
  const KeyRange keys = st.start(a.mask, b, h, i0, rows);
  for (index_t c = 0; c < dv * kBlockQ; ++c) st.ot[c] = 0;

  // Tiles start at multiples of kBlockK, where the packed values' tiles start; keys before
  // keys.begin are masked in every row.
  std::int64_t tiles = 0, masked_tiles = 0;  // simd::note_tiles
  for (index_t j0 = keys.begin / kBlockK * kBlockK; j0 < keys.end; j0 += kBlockK) {
    const index_t cnt = std::min<index_t>(kBlockK, keys.end - j0);
    if (!st.may_attend(j0, cnt)) continue;
    ++tiles;
    bf16::scores(x.k.row(b, hk, j0), x.k.sR, cnt, dq, query_pairs, st.s, x.value_pairs.on_tiles);
    const bool partial = st.weigh_tile</*kTileSumInFloat=*/true>(d, a.scale, a.softcap, j0, cnt);
    if (partial || st.tile_bias) ++masked_tiles;
    if (a.dropout.active) st.drop_tile(a.dropout, b * a.q.H + h, i0, rows, j0, cnt);
    const std::uint16_t* v0 = x.v.row(b, hk, j0);
    // The pair products read value rows up to an even count: for an odd cnt, the packed tile's row
    // cnt (a key past keys.end, weight 0) too.
    const index_t read = std::min<index_t>(cnt + (cnt & 1), x.v.R - j0);
    if ((partial || read > cnt) && !Bf16RowsFinite(v0, x.v.sR, read, dv)) {  // 0 * Inf must not reach a row: in float
      st.rescale(d, st.ot, dv);
      for (index_t j = 0; j < cnt; ++j)
        for (index_t c = 0; c < dv; ++c) arrays.tile[j * dv + c] = to_float(bfloat16::from_bits(v0[j * x.v.sR + c]));
      st.accumulate_skipping_zeros(arrays.tile, dv, cnt, dv, rows);
    } else {
      AccumulateValuePairs(st, cnt, dv, x.value_pairs, b, hk, j0);
    }
  }
  simd::note_tiles(tiles, masked_tiles);

  const float* sink = a.mask.sink_of(h);
  for (index_t i = 0; i < rows; ++i) {
    const RowEnd<float> end = row_end(st.max[i], st.sum[i], sink);
    if (x.float_out) {
      float* o = x.out_float.row(b, h, i0 + i);
      for (index_t c = 0; c < dv; ++c) o[c] = st.ot[c * kBlockQ + i] * end.factor;
    } else {
      std::uint16_t* o = x.out.row(b, h, i0 + i);
      for (index_t c = 0; c < dv; ++c) o[c] = to_bfloat16(st.ot[c * kBlockQ + i] * end.factor).bits;
    }
    if (!p.lse.empty()) p.lse.at(b, h, i0 + i, 0) = end.lse;
  }
}

// ---- the int8 forward --------------------------------------------------------------------------

// The 32-bit word of two signed bytes as int16 lanes (lo in the low half).
inline std::uint32_t Int16Pair(std::int8_t lo, std::int8_t hi) {
  return static_cast<std::uint16_t>(lo) | static_cast<std::uint32_t>(static_cast<std::uint16_t>(hi)) << 16;
}

// The portable int8 products (int8/dot_int8.hpp gives the sums they share with vpdpbusd): query rows
// of `bytes` as int16 pairs, (bytes / 2, kBlockQ) words: word [c][i] = (q8[i][2c], q8[i][2c + 1]),
// zeros past the block's rows.
void PackQueryPairsInt8(const std::int8_t* q8, index_t qs, index_t rows, index_t bytes, std::uint32_t* qp) {
  for (index_t c = 0; c < bytes / 2; ++c)
    for (index_t i = 0; i < kBlockQ; ++i) qp[c * kBlockQ + i] = i < rows ? Int16Pair(q8[i * qs + 2 * c], q8[i * qs + 2 * c + 1]) : 0;
}

// s (K, kBlockQ) for K key rows (stride ks bytes) over `pairs` query pairs: the int32 sums of
// products (16-bit multiplies added in pairs), scaled as dot_int8.hpp's scores.
template <int K>
void Int8ScoreRows(const std::int8_t* k, index_t ks, const float* k_scale, index_t pairs, const std::uint32_t* qp,
                   const float* q_scale, const float* q_mean, float* s) {
#if HWY_TARGET == HWY_SCALAR  // one lane: no room for a pair in a 32-bit lane
  for (int r = 0; r < K; ++r)
    for (index_t i = 0; i < kBlockQ; ++i) {
      std::int32_t sum = 0;
      for (index_t c = 0; c < pairs; ++c) {
        const std::uint32_t w = qp[c * kBlockQ + i];
        sum += static_cast<std::int16_t>(w & 0xFFFFu) * k[r * ks + 2 * c] + static_cast<std::int16_t>(w >> 16) * k[r * ks + 2 * c + 1];
      }
      s[r * kBlockQ + i] = static_cast<float>(sum) * (q_scale[i] * k_scale[r]) + q_mean[i];
    }
#else
  const hn::ScalableTag<std::int32_t> di;
  const hn::Repartition<std::int16_t, decltype(di)> dw;
  const hn::Rebind<float, decltype(di)> df;
  const auto L = static_cast<index_t>(hn::Lanes(di));
  for (index_t i = 0; i < kBlockQ; i += L) {
    hn::Vec<decltype(di)> sum0[K], sum1[K];
    for (int r = 0; r < K; ++r) sum0[r] = hn::Zero(di), sum1[r] = hn::Zero(di);
    for (index_t c = 0; c < pairs; ++c) {
      const auto q = hn::BitCast(dw, hn::LoadU(di, reinterpret_cast<const std::int32_t*>(qp + c * kBlockQ + i)));
      for (int r = 0; r < K; ++r) {
        const auto word = static_cast<std::int32_t>(Int16Pair(k[r * ks + 2 * c], k[r * ks + 2 * c + 1]));
        sum0[r] = hn::ReorderWidenMulAccumulate(di, q, hn::BitCast(dw, hn::Set(di, word)), sum0[r], sum1[r]);
      }
    }
    const auto qs = hn::LoadU(df, q_scale + i), qm = hn::LoadU(df, q_mean + i);
    for (int r = 0; r < K; ++r)
      hn::StoreU(hn::MulAdd(hn::ConvertTo(df, hn::Add(sum0[r], sum1[r])), hn::Mul(qs, hn::Set(df, k_scale[r])), qm), df,
                 s + r * kBlockQ + i);
  }
#endif
}

void Int8Scores(const std::int8_t* k8, index_t ks, const float* k_scale, index_t cnt, index_t bytes,
                const std::uint32_t* qp, const float* q_scale, const float* q_mean, float* s) {
  constexpr index_t kKeys = 4;
  const index_t pairs = bytes / 2;
  index_t j = 0;
  for (; j + kKeys <= cnt; j += kKeys)
    Int8ScoreRows<kKeys>(k8 + j * ks, ks, k_scale + j, pairs, qp, q_scale, q_mean, s + j * kBlockQ);
  for (; j < cnt; ++j) Int8ScoreRows<1>(k8 + j * ks, ks, k_scale + j, pairs, qp, q_scale, q_mean, s + j * kBlockQ);
}

// sdpa_forward_block_int8 (fused.hpp): ForwardBlock with the int8 products. Tiles start at multiples
// of kBlockK, where the packed values' tiles start; keys before keys.begin are masked in every row.
void ForwardBlockInt8(const SdpaForward<float>& p, index_t b, index_t h, index_t i0, void* work) {
  simd::note_ran(HWY_TARGET);
  const SdpaPlan<float>& a = *p.plan;
  const Int8Views& x = *p.int8;
  const hn::ScalableTag<float> d;
  const index_t H = a.q.H, n = a.q.R, dv = a.v.C, hk = a.kv_head(h);
  const index_t rows = std::min<index_t>(kBlockQ, n - i0);
  Carve carve(work);
  const Int8Arrays arrays(carve, a.q.C, dv);
  BlockState<float> st(arrays.block);
  const tiles::Scope tile_registers(x.value_pairs.on_tiles || x.scores_on_tiles);
  // The block's quantized queries packed for the products, and their scales and q . mean a lane (0
  // past the block's rows).
  const index_t first = (b * H + h) * n + i0;
  std::uint32_t* query_words = arrays.queries;
  if (x.vnni) {
    int8::pack_queries(x.q8 + first * x.row, x.row, rows, x.row, query_words);
  } else {
    PackQueryPairsInt8(x.q8 + first * x.row, x.row, rows, x.row, query_words);
  }
  for (index_t i = 0; i < kBlockQ; ++i) {
    arrays.q_scale[i] = i < rows ? x.q_scale[first + i] : 0.0f;
    arrays.q_mean[i] = i < rows ? x.q_mean[first + i] : 0.0f;
  }
  const KeyRange keys = st.start(a.mask, b, h, i0, rows);
  for (index_t c = 0; c < dv * kBlockQ; ++c) st.ot[c] = 0;

  const index_t key_row0 = (b * a.k.H + hk) * a.k.R;
  std::int64_t tiles = 0, masked_tiles = 0;  // simd::note_tiles
  for (index_t j0 = keys.begin / kBlockK * kBlockK; j0 < keys.end; j0 += kBlockK) {
    const index_t cnt = std::min<index_t>(kBlockK, keys.end - j0);
    if (!st.may_attend(j0, cnt)) continue;
    ++tiles;
    const std::int8_t* k8 = x.k8 + (key_row0 + j0) * x.row;
    const float* k_scale = x.k_scale + key_row0 + j0;
    if (x.vnni) {
      int8::scores(k8, x.row, x.k_sum + key_row0 + j0, k_scale, cnt, x.row, query_words, arrays.q_scale, arrays.q_mean, st.s,
                   x.scores_on_tiles);
    } else {
      Int8Scores(k8, x.row, k_scale, cnt, x.row, query_words, arrays.q_scale, arrays.q_mean, st.s);
    }
    const bool partial = st.weigh_tile</*kTileSumInFloat=*/true>(d, a.scale, a.softcap, j0, cnt);
    if (partial || st.tile_bias) ++masked_tiles;
    if (a.dropout.active) st.drop_tile(a.dropout, b * H + h, i0, rows, j0, cnt);
    const float* v0 = a.v.row(b, hk, j0);
    // The pair products read value rows up to an even count: for an odd cnt, the packed tile's row
    // cnt (a key past keys.end, weight 0) too.
    const index_t read = x.value_pairs.data != nullptr ? std::min<index_t>(cnt + (cnt & 1), a.v.R - j0) : cnt;
    if ((partial || read > cnt) && !rows_finite(v0, a.v.sR, read, dv)) {  // 0 * Inf must not reach a row
      st.rescale(d, st.ot, dv);
      st.accumulate_skipping_zeros(v0, a.v.sR, cnt, dv, rows);
    } else if (x.value_pairs.data != nullptr) {
      AccumulateValuePairs(st, cnt, dv, x.value_pairs, b, hk, j0);
    } else {
      st.rescale(d, st.ot, dv);
      BlockGemm<true>(d, v0, 1, a.v.sR, st.s, st.ot, dv, cnt);
    }
  }
  simd::note_tiles(tiles, masked_tiles);

  const float* sink = a.mask.sink_of(h);
  for (index_t i = 0; i < rows; ++i) {
    const RowEnd<float> end = row_end(st.max[i], st.sum[i], sink);
    float* o = p.out.row(b, h, i0 + i);
    for (index_t c = 0; c < dv; ++c) o[c] = st.ot[c * kBlockQ + i] * end.factor;
    if (!p.lse.empty()) p.lse.at(b, h, i0 + i, 0) = end.lse;
  }
}

// y = ExpWeight(x), float (simd_exp_weight).
void ExpWeightF32(const float* x, float* y, std::size_t count) {
  simd::note_ran(HWY_TARGET);
  const hn::ScalableTag<float> d;
  MapArray(d, x, y, count, [&](hn::Vec<decltype(d)> v) { return ExpWeight(d, v); });
}

void ForwardBlockF32(const SdpaForward<float>& p, index_t b, index_t h, index_t i0, void* work) {
  ForwardBlock(p, b, h, i0, work);
}
void ForwardBlockF64(const SdpaForward<double>& p, index_t b, index_t h, index_t i0, void* work) {
  ForwardBlock(p, b, h, i0, work);
}

}  // namespace attn::cpu::fused::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::cpu::fused {

HWY_EXPORT(ForwardBlockF32);
HWY_EXPORT(ForwardBlockF64);
HWY_EXPORT(ForwardBlockBf16);
HWY_EXPORT(ForwardBlockHalf);
HWY_EXPORT(ForwardBlockRows);
HWY_EXPORT(ForwardBlockInt8);
HWY_EXPORT(ExpWeightF32);

void simd_exp_weight(const float* x, float* y, std::size_t count) {
  ATTN_SIMD_CALL(simd::current(), ExpWeightF32)(x, y, count);
}

void sdpa_forward_block_half(const SdpaForward<float>& p, index_t b, index_t h, index_t i0, void* work) {
  ATTN_SIMD_CALL(p.simd, ForwardBlockHalf)(p, b, h, i0, work);
}

void sdpa_forward_block_rows(const SdpaForward<float>& p, index_t b, index_t h, index_t i0, void* work) {
  ATTN_SIMD_CALL(p.simd, ForwardBlockRows)(p, b, h, i0, work);
}

void sdpa_forward_block_bf16(const SdpaForward<float>& p, index_t b, index_t h, index_t i0, void* work) {
  ATTN_SIMD_CALL(p.simd, ForwardBlockBf16)(p, b, h, i0, work);
}

void sdpa_forward_block_int8(const SdpaForward<float>& p, index_t b, index_t h, index_t i0, void* work) {
  ATTN_SIMD_CALL(p.simd, ForwardBlockInt8)(p, b, h, i0, work);
}

template <>
void sdpa_forward_block(const SdpaForward<float>& p, index_t b, index_t h, index_t i0, void* work) {
  ATTN_SIMD_CALL(p.simd, ForwardBlockF32)(p, b, h, i0, work);
}
template <>
void sdpa_forward_block(const SdpaForward<double>& p, index_t b, index_t h, index_t i0, void* work) {
  ATTN_SIMD_CALL(p.simd, ForwardBlockF64)(p, b, h, i0, work);
}

}  // namespace attn::cpu::fused
#endif  // HWY_ONCE
