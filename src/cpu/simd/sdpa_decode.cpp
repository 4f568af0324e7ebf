// Fused scaled dot-product attention for a few queries (simd/fused.hpp, decode), compiled once per
// SIMD target: per tile of kDecodeTile keys and query row (or pack of the rows that share a key
// head, each key and value row loaded once for all of them), dot products along d (each key row
// read front to back), masks, an online softmax step, and the weighted sum of the value rows whose
// weight is not 0 (a masked or dropped key's value row never enters that query's sum, and one that
// no query of the pack attends is never read). Keys and values are the plan's
// tensors, or (float queries only) bfloat16, float16 or int8 rows of a tensor or of a KV cache's
// blocks, widened to float as they are loaded (half-inl.h): bound by reading them, the 16-bit ones
// take half the float32 time.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/simd/sdpa_decode.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/cache_control.h>
#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include "cpu/int8/dot_q4.hpp"
#include "cpu/simd/fused.hpp"
#include "cpu/simd/gemm-inl.h"
#include "cpu/simd/half-inl.h"
#include "cpu/simd/kv_rows-inl.h"
#include "cpu/simd/score_mods-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::fused::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using simd::HWY_NAMESPACE::LoadWide;
using simd::HWY_NAMESPACE::Wide;

// The rows of one tile of keys (or values): row jj at rows + jj * stride, elements E (the queries'
// type, or bfloat16, float16 or int8 widened to float); int8 rows scaled by one float per 32
// elements, row jj's at scales + jj * scale_stride. Keys quantized per channel (a KIVI cache's:
// per_channel) share one scale and one minimum per channel among 32 tokens: row jj's are the
// scale_stride floats at scales + (jj + phase) / 32 * scale_stride, phase being the tile's first
// row's place in its group.
template <class E>
struct TileRows {
  const E* rows;
  index_t stride;
  const float* scales = nullptr;
  index_t scale_stride = 0;
  const float* mins = nullptr;  // 4-bit rows: the groups' minima, as the scales
  bool per_channel = false;
  index_t phase = 0;
  const E* row(index_t jj) const { return rows + jj * stride; }
  index_t group(index_t jj) const { return per_channel ? (jj + phase) / 32 : jj; }
  const float* scale(index_t jj) const { return scales + group(jj) * scale_stride; }
  const float* min(index_t jj) const { return mins + group(jj) * scale_stride; }
};

// A byte of a 4-bit row (cpu/quant/q4.hpp's layout: two codes), the element type of the int4
// cache's rows read in place: each group of 32 codes dequantized in registers, fma(code, scale,
// min) as the cache reads it, and used at once, for each query head that reads the row (against
// widening a tile once for all of them into scratch, the int4 decode of (8, 32 heads, 8 key heads,
// 4096, 128) took 0.74x float32's time instead of 0.95x, one thread, avx3).
struct Q4Byte {
  std::uint8_t bits;
};
template <class E>
constexpr index_t RowBytes(index_t dim) {
  if constexpr (std::is_same_v<E, Q4Byte>) return dim / 2;
  return dim * static_cast<index_t>(sizeof(E));
}

// lanes[r][jj] = the lanes of q[r] . k[jj] over dim elements (a multiple of the lanes), before they
// are summed, for R query rows and K key rows: one chain of FMAs a pair, along the row front to back
// (a stream the hardware prefetcher follows), each key vector loaded (and widened) once for the R rows
// and each query vector once for the K keys. A pair's lanes are the same for any R and K; the R x K
// chains (or the next keys' chains, out of order) overlap their latency. (Against four chains a pair
// and one key at a time, which loaded each query vector for every key: the decode of 32 query heads
// over 8 key heads from a float8 KvCache, d = 128, on a Zen 5 (avx3), took 0.73x-0.83x the time
// with its data in the cache, one thread, and 0.89x-0.99x from memory, two threads (the same time
// with one), medians of alternated runs.)
template <int R, int K, class D, class T, class E, std::size_t kStride>
HWY_INLINE void DotLanesPairs(D d, const T* const* q, const E* const* k, index_t dim, hn::Vec<D> (*lanes)[kStride]) {
  static_assert(K <= static_cast<int>(kStride), "lanes holds K keys");
  const index_t L = static_cast<index_t>(hn::Lanes(d));
  _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r)
    _Pragma("GCC unroll 4") for (int jj = 0; jj < K; ++jj) lanes[r][jj] = hn::Zero(d);
  for (index_t c = 0; c < dim; c += L) {
    hn::Vec<D> key[K];
    _Pragma("GCC unroll 4") for (int jj = 0; jj < K; ++jj) key[jj] = LoadWide(d, k[jj] + c);
    _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) {
      const auto query = hn::LoadU(d, q[r] + c);
      _Pragma("GCC unroll 4") for (int jj = 0; jj < K; ++jj) lanes[r][jj] = hn::MulAdd(query, key[jj], lanes[r][jj]);
    }
  }
}

// The lanes of q . k over dim elements (a multiple of the lanes), before they are summed.
template <class D, class T, class E>
HWY_INLINE hn::Vec<D> DotLanes(D d, const T* HWY_RESTRICT q, const E* HWY_RESTRICT k, index_t dim) {
  const T* query = q;
  const E* key = k;
  hn::Vec<D> lanes[1][1];
  DotLanesPairs<1, 1>(d, &query, &key, dim, lanes);
  return lanes[0][0];
}

// lanes[r][jj] = DotLanesPairs's lanes of q[r] . k_(j + jj) for the tile's keys j to j + 3 (rows of
// floats, 16-bit or 8-bit floats, widened as loaded): 8-bit float rows four at a time, wider ones
// one at a time (four rows read side by side, the float32 and bfloat16 decodes from memory of 32
// query heads over 8 key heads took 1.25x to 1.4x the time on a Zen 5, one thread or two).
template <int R, class D, class T, class E>
HWY_INLINE void FourKeysLanes(D d, const T* const* q, const TileRows<E>& k, index_t j, index_t dim,
                              hn::Vec<D> (*lanes)[4]) {
  static_assert(!std::is_same_v<E, std::int8_t> && !std::is_same_v<E, Q4Byte>, "int8 and 4-bit rows are scaled");
  if constexpr (std::is_same_v<E, detail::float8_e4m3> || std::is_same_v<E, detail::float8_e5m2>) {
    const E* rows[4] = {k.row(j), k.row(j + 1), k.row(j + 2), k.row(j + 3)};
    DotLanesPairs<R, 4>(d, q, rows, dim, lanes);
  } else {
    for (int jj = 0; jj < 4; ++jj) {
      const E* row = k.row(j + jj);
      hn::Vec<D> one[R][1];
      DotLanesPairs<R, 1>(d, q, &row, dim, one);
      for (int r = 0; r < R; ++r) lanes[r][jj] = one[r][0];
    }
  }
}

// q . k over dim elements (any dim): DotLanes summed, then the elements past the last whole vector.
template <class D, class T, class E>
HWY_INLINE T Dot(D d, const T* HWY_RESTRICT q, const E* HWY_RESTRICT k, index_t dim) {
  const index_t L = static_cast<index_t>(hn::Lanes(d)), whole = dim / L * L;
  T t = hn::GetLane(hn::SumOfLanes(d, DotLanes(d, q, k, whole)));
  for (index_t c = whole; c < dim; ++c) t += q[c] * Wide(k[c]);
  return t;
}

// The lanes of sum_g scales_r[g] dot_r(g) over the groups of 32 elements of R int8 rows at once (dim a
// multiple of 32), dot_r(g) the unscaled lanes of row r's group g, all R given by group_dots(g,
// dots): each group's lanes scaled once into one of two totals of its row, two groups a step.
template <int R, class D, class GroupDots>
HWY_INLINE void ScaledGroups(D d, const float* const* scales, index_t dim, const GroupDots& group_dots,
                             hn::Vec<D>* lanes) {
  hn::Vec<D> total0[R], total1[R];
  for (int r = 0; r < R; ++r) total0[r] = total1[r] = hn::Zero(d);
  const auto add = [&](index_t g, hn::Vec<D>* total) HWY_ATTR {
    hn::Vec<D> dots[R];
    group_dots(g, dots);
    for (int r = 0; r < R; ++r) total[r] = hn::MulAdd(dots[r], hn::Set(d, scales[r][g / 32]), total[r]);
  };
  index_t g = 0;
  for (; g + 64 <= dim; g += 64) {
    add(g, total0);
    add(g + 32, total1);
  }
  if (g < dim) add(g, total0);
  for (int r = 0; r < R; ++r) lanes[r] = hn::Add(total0[r], total1[r]);
}

// The lanes of q . k over int8 elements, each 32 of them scaled by their float (dim a multiple of
// 32): each group's products summed unscaled, then scaled once (ScaledGroups).
template <class D>
HWY_INLINE hn::Vec<D> DotScaledLanes(D d, const float* HWY_RESTRICT q, const std::int8_t* HWY_RESTRICT k,
                                     const float* scales, index_t dim) {
  const index_t L = static_cast<index_t>(hn::Lanes(d));
  const auto group_dot = [&](index_t g, hn::Vec<D>* dots) HWY_ATTR {
    auto sum = hn::Mul(hn::LoadU(d, q + g), LoadWide(d, k + g));
    for (index_t c = g + L; c < g + 32; c += L) sum = hn::MulAdd(hn::LoadU(d, q + c), LoadWide(d, k + c), sum);
    dots[0] = sum;
  };
  hn::Vec<D> lanes[1];
  ScaledGroups<1>(d, &scales, dim, group_dot, lanes);
  return lanes[0];
}

// The lanes of rounded[0] . k over R int8 rows at once, rows[r] scaled by scales[r] (dim a multiple of
// 32): each 32 products summed in 32-bit integers (at most 32 * 127 * 32767 < 2^31; on AVX2 and
// AVX-512 four or two a lane, under 2^24, so exact in float too), converted once, then scaled by
// the group's float into one of two totals (ScaledGroups). Half the instructions of DotScaledLanes:
// int8 widened to int16 once, two products a multiply-add. Each row's lanes are the same for any R;
// with R = 4 each vector of the query is loaded once for four rows, and their totals stay in
// registers. (Row by row, GCC kept the four rows' lanes and its loop state on the stack: the int8
// decode (32,1,8192,128) on a Zen 5 with two threads took 1.96-2.15 ms against 1.85-1.91 ms four
// rows at a time, four alternated runs.)
// kOneKey: the lanes of rounded[r] . rows[0] for R query rows instead, one int8 key row widened once
// for a pack of queries (DecodeTileRows), each pair's sums formed as above.
template <int R, bool kOneKey = false, class D>
HWY_INLINE void DotRoundedLanes(D d, const std::int16_t* const* rounded, const std::int8_t* const* rows,
                                const float* const* scales, index_t dim, hn::Vec<D>* lanes) {
  const hn::Repartition<std::int32_t, D> di;
#if HWY_TARGET == HWY_SCALAR
  const hn::Rebind<std::int16_t, D> dw;  // one lane
#else
  const hn::Repartition<std::int16_t, D> dw;  // twice the lanes, summed in pairs
#endif
  const hn::Rebind<std::int8_t, decltype(dw)> db;
  const index_t W = static_cast<index_t>(hn::Lanes(dw));
  const auto group_dots = [&](index_t g, hn::Vec<D>* dots) HWY_ATTR {
    hn::Vec<decltype(di)> even[R], odd[R];
    for (int r = 0; r < R; ++r) even[r] = odd[r] = hn::Zero(di);
    for (index_t c = g; c < g + 32; c += W) {
      if constexpr (kOneKey) {
        const auto kv = hn::PromoteTo(dw, hn::LoadU(db, rows[0] + c));
        for (int r = 0; r < R; ++r) even[r] = hn::ReorderWidenMulAccumulate(di, kv, hn::LoadU(dw, rounded[r] + c), even[r], odd[r]);
      } else {
        const auto qv = hn::LoadU(dw, rounded[0] + c);
        for (int r = 0; r < R; ++r)
          even[r] = hn::ReorderWidenMulAccumulate(di, hn::PromoteTo(dw, hn::LoadU(db, rows[r] + c)), qv, even[r], odd[r]);
      }
    }
    for (int r = 0; r < R; ++r) dots[r] = hn::ConvertTo(d, hn::RearrangeToOddPlusEven(even[r], odd[r]));
  };
  ScaledGroups<R>(d, scales, dim, group_dots, lanes);
}

#if HWY_TARGET != HWY_SCALAR  // one lane: nothing to interleave
// out[0, 4) = the sums of the lanes of v[0, 4), in one reduction: within each 128-bit block, pairs
// of lanes are added across the four vectors (two interleaving rounds) so that the block holds one
// partial sum of each, then the blocks are added. A horizontal sum of each vector alone cost a
// fifth of the int8 decode's time.
template <class D>
HWY_INLINE void SumOfBlocks(D d, hn::Vec<D> v, float* out) {
  if constexpr (sizeof(hn::Vec<D>) <= 16) {
    hn::StoreU(v, d, out);
  } else {
    const hn::Half<D> dh;
    SumOfBlocks(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)), out);
  }
}
template <class D>
HWY_INLINE void SumOfLanes4(D d, const hn::Vec<D>* v, float* out) {
  const hn::Repartition<double, D> dd;  // 64-bit halves of the blocks
  const auto a = hn::Add(hn::InterleaveLower(d, v[0], v[1]), hn::InterleaveUpper(d, v[0], v[1]));
  const auto b = hn::Add(hn::InterleaveLower(d, v[2], v[3]), hn::InterleaveUpper(d, v[2], v[3]));
  const auto lo = hn::BitCast(d, hn::InterleaveLower(dd, hn::BitCast(dd, a), hn::BitCast(dd, b)));
  const auto hi = hn::BitCast(d, hn::InterleaveUpper(dd, hn::BitCast(dd, a), hn::BitCast(dd, b)));
  SumOfBlocks(d, hn::Add(lo, hi), out);
}
#endif

// Asks for row jj of a tile (dim elements of E) into the L2 cache (prefetcht1), kPrefetchBytes
// ahead of its use. Measured on the Zen 4, float32 (32,1,8192,128), 2 threads: 8 rows ahead into
// L1 (prefetcht0) 11.0 ms, 24 GB/s, no faster than not asking; 8 KiB ahead into L2 9.1-9.6 ms; 16-bit
// and int8 rows the same or faster. (The hardware prefetcher alone had left the 16-bit decode at
// two thirds of float32's bandwidth.)
inline constexpr index_t kPrefetchBytes = 8192;
template <class E>
HWY_INLINE void PrefetchRow(const TileRows<E>& x, index_t jj, index_t dim) {
  const index_t row_bytes = RowBytes<E>(dim);
  const auto* row = reinterpret_cast<const char*>(x.row(jj));
  for (index_t off = 0; off < row_bytes; off += 64) __builtin_prefetch(row + off, 0, 2);
  if constexpr (std::is_same_v<E, Q4Byte>) {
    if (x.per_channel) {  // the group's scales and minima, one a channel, as its first row is asked for
      if ((jj + x.phase) % 32 == 0)
        for (index_t off = 0; off < dim * static_cast<index_t>(sizeof(float)); off += 64) {
          __builtin_prefetch(reinterpret_cast<const char*>(x.scale(jj)) + off, 0, 2);
          __builtin_prefetch(reinterpret_cast<const char*>(x.min(jj)) + off, 0, 2);
        }
      return;
    }
  }
  // And an int8 row's scales, where they start a line (four rows a line at v = 128; not asking for
  // them, the int8 decode (32,1,8192,128) on a Zen 5 took 2.5-2.8 ms, against 2.1-2.5 ms).
  if constexpr (std::is_same_v<E, std::int8_t> || std::is_same_v<E, Q4Byte>) {
    const auto* scales = reinterpret_cast<const char*>(x.scale(jj));
    if (reinterpret_cast<std::uintptr_t>(scales) % 64 < static_cast<std::uintptr_t>(x.scale_stride) * sizeof(float)) {
      __builtin_prefetch(scales, 0, 2);
      if constexpr (std::is_same_v<E, Q4Byte>) __builtin_prefetch(x.min(jj), 0, 2);  // the minima alike
    }
  }
}
template <class E>
HWY_INLINE index_t RowsAhead(index_t dim) {
  return std::max<index_t>(1, kPrefetchBytes / std::max<index_t>(1, RowBytes<E>(dim)));
}

// The rows read after a pass over a tile: after its keys, its values; after its values, the next
// tile's keys. A pass asks for their first rows as it reads its own last ones, so that the next pass
// does not start on rows still in memory. (A KV cache's blocks are allocations of their own, where
// both the hardware prefetcher's stream and a pass's rows ahead stop: asking for no row past the
// tile, the bf16 decode (32,1,8192,128) through a KvCache took 3.1 ms on a Zen 5, against 2.6 to
// 2.7 ms now.)
template <class E>
struct NextRows {
  TileRows<E> tile{};
  index_t count = 0, cols = 0;  // no rows: nothing follows
  HWY_INLINE void prefetch(index_t r) const {
    if (r < count) PrefetchRow(tile, r, cols);
  }
};

// s[0, cnt) times sigma: the scores of a query rounded to integers (quant::round_query) over int8 or
// 4-bit keys, summed in integers. A sum of up to 32767 / max|q| times q . k can overflow where q . k
// does not (int8 keys near 1e34 max|q|, 4-bit ones near 2^126): such a score is taken again in
// float, again(j).
template <class D, class Again>
void ScaleBySigma(D d, float sigma, index_t cnt, float* s, const Again& again) {
  const index_t L = static_cast<index_t>(hn::Lanes(d));
  const auto vsigma = hn::Set(d, sigma);
  auto poison = hn::Zero(d);  // NaN where a score is not finite
  index_t j = 0;
  for (; j + L <= cnt; j += L) {
    const auto x = hn::Mul(hn::Load(d, s + j), vsigma);
    poison = hn::Add(poison, hn::Mul(x, hn::Zero(d)));
    hn::Store(x, d, s + j);
  }
  bool overflow = std::isnan(hn::GetLane(hn::SumOfLanes(d, poison)));
  for (; j < cnt; ++j) s[j] *= sigma, overflow = overflow || !std::isfinite(s[j]);
  if (overflow)
    for (j = 0; j < cnt; ++j)
      if (!std::isfinite(s[j])) s[j] = again(j);
}

// The score of a query q as given over int8 key row j (ScaleBySigma's again).
template <class D>
HWY_INLINE float ScoreInt8(D d, const float* q, const TileRows<std::int8_t>& k, index_t dim, index_t j) {
  return hn::GetLane(hn::SumOfLanes(d, DotScaledLanes(d, q, k.row(j), k.scale(j), dim)));
}

// s[0, cnt) = q . k_j for the tile's keys, d elements each; `then`: the rows read next. Rows one
// after another, but for 8-bit floats (FourKeysLanes): reading four float32 rows side by side was
// measured 40% slower (keys alone, one thread, (32,1,8192,128): 14.2 ms against 10.1 ms); four
// float8_e4m3 rows of (32 heads, 8192, 128) took 0.76x the time with the data in the cache, one
// thread, and 0.93x-1.04x from memory, two threads or one, on a Zen 5. In float, the lanes of four
// rows are summed in one reduction (SumOfLanes4) where d is a multiple of the lanes. An int8
// cache's keys are multiplied by the query rounded to integers (rounded, sigma: quant::round_query)
// where sigma is not 0. (Rounded, the int8 decode (32,1,8192,128) took 5% to 10% less time on a
// Zen 5 with two threads, and 20% less on its AVX2 path; with its data in the cache, one thread,
// 10.0-10.7 ns a token against 12.3-13.0.)
template <class D, class T, class E>
void Dots(D d, const T* q, const std::int16_t* rounded, float sigma, const TileRows<E>& k, index_t dim, index_t cnt,
          T* s, const NextRows<E>& then) {
  const index_t ahead = RowsAhead<E>(dim);
  auto prefetch = [&](index_t j) {
    if (j + ahead < cnt) PrefetchRow(k, j + ahead, dim);
    else then.prefetch(j + ahead - cnt);
  };
  index_t j = 0;
  if constexpr (std::is_same_v<T, float> && std::is_same_v<E, std::int8_t>) {
    if (sigma != 0) {  // an int8 cache's keys against the query rounded to integers (quant::round_query)
#if HWY_TARGET != HWY_SCALAR
      for (; j + 4 <= cnt; j += 4) {
        for (int r = 0; r < 4; ++r) prefetch(j + r);
        const std::int8_t* rows[4] = {k.row(j), k.row(j + 1), k.row(j + 2), k.row(j + 3)};
        const float* scales[4] = {k.scale(j), k.scale(j + 1), k.scale(j + 2), k.scale(j + 3)};
        hn::Vec<D> lanes[4];
        DotRoundedLanes<4>(d, &rounded, rows, scales, dim, lanes);
        SumOfLanes4(d, lanes, s + j);
      }
#endif
      for (; j < cnt; ++j) {
        prefetch(j);
        const std::int8_t* row = k.row(j);
        const float* scale = k.scale(j);
        hn::Vec<D> lanes[1];
        DotRoundedLanes<1>(d, &rounded, &row, &scale, dim, lanes);
        s[j] = hn::GetLane(hn::SumOfLanes(d, lanes[0]));
      }
      ScaleBySigma(d, sigma, cnt, s, [&](index_t j) HWY_ATTR { return ScoreInt8(d, q, k, dim, j); });
      return;
    }
  }
#if HWY_TARGET != HWY_SCALAR
  if constexpr (std::is_same_v<T, float>) {
    if (dim % static_cast<index_t>(hn::Lanes(d)) == 0)
      for (; j + 4 <= cnt; j += 4) {
        hn::Vec<D> lanes[1][4];
        for (int r = 0; r < 4; ++r) prefetch(j + r);
        if constexpr (std::is_same_v<E, std::int8_t>) {
          for (int r = 0; r < 4; ++r) lanes[0][r] = DotScaledLanes(d, q, k.row(j + r), k.scale(j + r), dim);
        } else {
          FourKeysLanes<1>(d, &q, k, j, dim, lanes);
        }
        SumOfLanes4(d, lanes[0], s + j);
      }
  }
#endif
  for (; j < cnt; ++j) {
    prefetch(j);
    if constexpr (std::is_same_v<E, std::int8_t>) {
      s[j] = hn::GetLane(hn::SumOfLanes(d, DotScaledLanes(d, q, k.row(j), k.scale(j), dim)));
    } else {
      s[j] = Dot(d, q, k.row(j), dim);
    }
  }
}

// ---- Several query rows of a key head at once ------------------------------------------------------
// The query heads of a key head's group (grouped-query attention) and a decode's few queries read the
// same key and value rows. Row by row, each re-read the tile from the L2 cache for every query row
// and did its FMAs between the loads; the float32 decode of 7 sequences of 4,096 tokens, 8 key heads,
// d = 128, 2 threads, took 30 ms with 32 query heads against 18 ms with 8. Here up to PackRows rows
// take each key row and each value row from one load (a 4-bit row's groups dequantized once, an int8
// row widened once for the pack's rounded queries): float queries over every cache type, d and v
// multiples of the lanes (17 ms). Each
// row's dot products and FMAs are those of the row by row path, in the same order (the same results,
// whichever rows share a pack).

// Rows a pack holds: four where 32 vector registers hold, in turn, the dot-product chains of four
// rows over four 8-bit float keys (DotLanesPairs) and 16 accumulators of the rows' values, two on
// targets with 16.
template <class D>
constexpr int PackRows(D d) {
  return hn::MaxLanes(d) >= 16 ? 4 : 2;
}

// lanes[r] = the lanes of q[r] . k_j over the 4-bit key row j (dim a multiple of 32), for R rows,
// before they are summed: each group of the row dequantized once for all of them.
template <int R, class D>
HWY_INLINE void DotQ4LanesRows(D d, const float* const* q, const TileRows<Q4Byte>& k, index_t j, index_t dim,
                               hn::Vec<D>* lanes) {
  const index_t L = static_cast<index_t>(hn::Lanes(d));
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(k.row(j));
  const float* scales = k.scale(j);
  const float* mins = k.min(j);
  hn::Vec<D> a0[R], a1[R];
  _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) a0[r] = a1[r] = hn::Zero(d);
  const auto add = [&](index_t g, index_t i, hn::Vec<D> lo, hn::Vec<D> hi) HWY_ATTR {
    _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) {
      a0[r] = hn::MulAdd(hn::LoadU(d, q[r] + g + i), lo, a0[r]);
      a1[r] = hn::MulAdd(hn::LoadU(d, q[r] + g + 16 + i), hi, a1[r]);
    }
  };
  if (k.per_channel) {  // a scale and a minimum per channel, as WidenQ4Row takes them
    for (index_t g = 0; g < dim; g += 32)
      for (index_t i = 0; i < 16; i += L) {
        hn::Vec<D> lo, hi;
        Q4Codes(d, bytes + g / 2, i, lo, hi);
        add(g, i, hn::MulAdd(lo, hn::LoadU(d, scales + g + i), hn::LoadU(d, mins + g + i)),
            hn::MulAdd(hi, hn::LoadU(d, scales + g + 16 + i), hn::LoadU(d, mins + g + 16 + i)));
      }
  } else {
    for (index_t g = 0; g < dim; g += 32) {
      const auto scale = hn::Set(d, scales[g / 32]), min = hn::Set(d, mins[g / 32]);
      for (index_t i = 0; i < 16; i += L) {
        hn::Vec<D> lo, hi;
        LoadQ4(d, bytes + g / 2, i, scale, min, lo, hi);
        add(g, i, lo, hi);
      }
    }
  }
  _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) lanes[r] = hn::Add(a0[r], a1[r]);
}

// s[r][0, cnt) for R rows from keys_lanes(j, lanes, four), the lanes of the R dot products of the
// keys j + jj before they are summed (lanes[r][jj]; jj < 4 where four is std::true_type, else jj =
// 0): four keys' lanes summed in one reduction a row (SumOfLanes4), as Dots sums them.
template <int R, class D, class E, class KeysLanes>
void PackScores(D d, const TileRows<E>& k, index_t dim, index_t cnt, float* const* s, const NextRows<E>& then,
                const KeysLanes& keys_lanes) {
  const index_t ahead = RowsAhead<E>(dim);
  auto prefetch = [&](index_t j) {
    if (j + ahead < cnt) PrefetchRow(k, j + ahead, dim);
    else then.prefetch(j + ahead - cnt);
  };
  index_t j = 0;
  hn::Vec<D> lanes[R][4];
#if HWY_TARGET != HWY_SCALAR
  for (; j + 4 <= cnt; j += 4) {
    for (int jj = 0; jj < 4; ++jj) prefetch(j + jj);
    keys_lanes(j, lanes, std::true_type{});
    for (int r = 0; r < R; ++r) SumOfLanes4(d, lanes[r], s[r] + j);
  }
#endif
  for (; j < cnt; ++j) {
    prefetch(j);
    keys_lanes(j, lanes, std::false_type{});
    for (int r = 0; r < R; ++r) s[r][j] = hn::GetLane(hn::SumOfLanes(d, lanes[r][0]));
  }
}

// keys_lanes for PackScores from row_lanes(j, lanes), the lanes of key j's R dot products: key by key.
template <int R, class D, class RowLanesOf>
auto KeyByKey(RowLanesOf row_lanes) {
  return [row_lanes](index_t j, hn::Vec<D> (*lanes)[4], auto four) HWY_ATTR {
    for (int jj = 0; jj < (decltype(four)::value ? 4 : 1); ++jj) {
      hn::Vec<D> key_lanes[R];
      row_lanes(j + jj, key_lanes);
      for (int r = 0; r < R; ++r) lanes[r][jj] = key_lanes[r];
    }
  };
}

// Keys with a scale and a minimum per channel shared by a group of 32 tokens (int4_kivi's) and
// heads of at most kFoldedDim: q . (scale x + min) = (q scale) . x + q . min, so each query row is
// multiplied by its group's scales once a group (and its products with the minima summed once),
// and each key row costs one FMA an element on its codes instead of a dequantizing FMA, two loads
// and the FMA. (The same value up to float32's rounding, in another order.)
inline constexpr index_t kFoldedDim = 256;
template <int R, class D>
void DotsRowsQ4Channels(D d, const float* const* q, const TileRows<Q4Byte>& k, index_t dim, index_t cnt,
                        float* const* s, const NextRows<Q4Byte>& then) {
  const index_t L = static_cast<index_t>(hn::Lanes(d));
  HWY_ALIGN float scaled[R][kFoldedDim];  // q[r] times the group's scales
  hn::Vec<D> minima[R];                    // the lanes of q[r] . the group's minima
  index_t group = -1;
  PackScores<R>(d, k, dim, cnt, s, then, KeyByKey<R, D>([&](index_t j, hn::Vec<D>* lanes) HWY_ATTR {
    if (k.group(j) != group) {
      group = k.group(j);
      const float* scale = k.scale(j);
      const float* min = k.min(j);
      for (int r = 0; r < R; ++r) {
        minima[r] = hn::Zero(d);
        for (index_t c = 0; c < dim; c += L) {
          const auto qc = hn::LoadU(d, q[r] + c);
          hn::Store(hn::Mul(qc, hn::LoadU(d, scale + c)), d, scaled[r] + c);
          minima[r] = hn::MulAdd(qc, hn::LoadU(d, min + c), minima[r]);
        }
      }
    }
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(k.row(j));
    hn::Vec<D> a0[R], a1[R];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) a0[r] = minima[r], a1[r] = hn::Zero(d);
    for (index_t g = 0; g < dim; g += 32)
      for (index_t i = 0; i < 16; i += L) {
        hn::Vec<D> lo, hi;
        Q4Codes(d, bytes + g / 2, i, lo, hi);
        _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) {
          a0[r] = hn::MulAdd(hn::Load(d, scaled[r] + g + i), lo, a0[r]);
          a1[r] = hn::MulAdd(hn::Load(d, scaled[r] + g + 16 + i), hi, a1[r]);
        }
      }
    _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) lanes[r] = hn::Add(a0[r], a1[r]);
  }));
}

// s[r][0, cnt) = q[r] . k_j for R rows, as Dots gives each (dim a multiple of the lanes).
template <int R, class D, class E>
void DotsRows(D d, const float* const* q, const TileRows<E>& k, index_t dim, index_t cnt, float* const* s,
              const NextRows<E>& then) {
  if constexpr (std::is_same_v<E, Q4Byte>) {
    if (k.per_channel && dim <= kFoldedDim) return DotsRowsQ4Channels<R>(d, q, k, dim, cnt, s, then);
    PackScores<R>(d, k, dim, cnt, s, then, KeyByKey<R, D>([&](index_t j, hn::Vec<D>* lanes) HWY_ATTR {
      DotQ4LanesRows<R>(d, q, k, j, dim, lanes);
    }));
  } else {
    PackScores<R>(d, k, dim, cnt, s, then, [&](index_t j, hn::Vec<D> (*lanes)[4], auto four) HWY_ATTR {
      if constexpr (decltype(four)::value) {
        FourKeysLanes<R>(d, q, k, j, dim, lanes);
      } else {
        const E* row = k.row(j);
        DotLanesPairs<R, 1>(d, q, &row, dim, lanes);
      }
    });
  }
}

// s[r][0, cnt) = the scores of R query rows over int8 keys, each query rounded to integers (rounded[r],
// sigma[r] not 0; quant::round_query), as Dots gives each: each key row widened once for the pack.
template <int R, class D>
void DotsRowsInt8(D d, const float* const* q, const std::int16_t* const* rounded, const float* sigma,
                  const TileRows<std::int8_t>& k, index_t dim, index_t cnt, float* const* s,
                  const NextRows<std::int8_t>& then) {
  PackScores<R>(d, k, dim, cnt, s, then, KeyByKey<R, D>([&](index_t j, hn::Vec<D>* lanes) HWY_ATTR {
    const std::int8_t* row = k.row(j);
    const float* scales[R];
    for (int r = 0; r < R; ++r) scales[r] = k.scale(j);
    DotRoundedLanes<R, true>(d, rounded, &row, scales, dim, lanes);
  }));
  for (int r = 0; r < R; ++r)
    ScaleBySigma(d, sigma[r], cnt, s[r], [&](index_t j) HWY_ATTR { return ScoreInt8(d, q[r], k, dim, j); });
}

// s[r][0, cnt) = the scores of R query rows over 4-bit keys (an int4 cache's), each query rounded to
// integers (rounded[r], sigma[r] not 0) and followed by its bytes in int8/dot_q4.hpp's layout
// (cpu::decode): the sums in integers by AVX512-VNNI, sixteen key rows at a time, each read once for
// the R rows; then times sigma. A score that overflows there (keys near 2^126) is taken again from
// the float path. A row's scores are the same bits for any R (dot_q4.hpp).
template <int R, class D>
void DotsRowsQ4Rounded(D d, const float* const* q, const std::int16_t* const* rounded, const float* sigma,
                       const TileRows<Q4Byte>& k, index_t dim, index_t cnt, float* const* s, const NextRows<Q4Byte>& then) {
  const std::uint8_t* packed[R];
  for (int r = 0; r < R; ++r) packed[r] = reinterpret_cast<const std::uint8_t*>(rounded[r] + dim);
  const index_t ahead = RowsAhead<Q4Byte>(dim), row_bytes = RowBytes<Q4Byte>(dim);
  // Rows one after another (a KV cache's block), their scales and minima too: the rows asked for as
  // three ranges a step, not row by row (row by row took 1.02x-1.05x the int4 decode's time, one
  // process, avx3).
  const bool adjacent = k.stride == row_bytes && k.scale_stride == dim / 32;
  const auto ask = [](const void* from, index_t bytes) {
    for (index_t off = 0; off < bytes; off += 64) __builtin_prefetch(static_cast<const char*>(from) + off, 0, 2);
  };
  for (index_t j = 0; j < cnt; j += 16) {
    const index_t rows = std::min<index_t>(16, cnt - j), first = j + ahead, end = std::min(j + rows + ahead, cnt);
    if (adjacent && first < end) {
      const index_t scale_bytes = (end - first) * k.scale_stride * static_cast<index_t>(sizeof(float));
      ask(k.row(first), (end - first) * row_bytes), ask(k.scale(first), scale_bytes), ask(k.min(first), scale_bytes);
    } else {
      for (index_t i = first; i < end; ++i) PrefetchRow(k, i, dim);
    }
    for (index_t i = std::max(first, cnt); i < j + rows + ahead; ++i) then.prefetch(i - cnt);
    float* at[R];
    for (int r = 0; r < R; ++r) at[r] = s[r] + j;
    int8::q4_scores(reinterpret_cast<const std::uint8_t*>(k.row(j)), k.stride, k.scale(j), k.min(j), k.scale_stride, rows,
                    dim, R, packed, at);
  }
  for (int r = 0; r < R; ++r)
    ScaleBySigma(d, sigma[r], cnt, s[r], [&](index_t j) HWY_ATTR {
      hn::Vec<D> lanes[1];
      DotQ4LanesRows<1>(d, &q[r], k, j, dim, lanes);
      return hn::GetLane(hn::SumOfLanes(d, lanes[0]));
    });
}

// The same over 4-bit keys (dim a multiple of 32): one row's pack (DotsRows), each group of a key row
// dequantized in registers; or, where the decode rounded the query for them (an int4 cache's keys on
// AVX512-VNNI: cpu::decode), summed in integers (DotsRowsQ4Rounded).
template <class D>
void Dots(D d, const float* q, const std::int16_t* rounded, float sigma, const TileRows<Q4Byte>& k, index_t dim,
          index_t cnt, float* s, const NextRows<Q4Byte>& then) {
#if HWY_TARGET == HWY_AVX3
  if (rounded != nullptr && sigma != 0 && !k.per_channel) return DotsRowsQ4Rounded<1>(d, &q, &rounded, &sigma, k, dim, cnt, &s, then);
#else
  (void)rounded, (void)sigma;
#endif
  DotsRows<1>(d, &q, k, dim, cnt, &s, then);
}

// o[c0, c0 + N L) += the weighted value rows of the tile, those whose weight is not 0, held in N
// vector registers: o is loaded and stored once for the whole tile, and each row's FMAs depend on
// nothing but the row. (Loading and storing o for every two rows left the float32 decode
// (32,1,8192,128) at 55% of the read bandwidth on a Zen 5: each step waited on the last one's
// store, so the loads of the rows ahead could not be issued early.) Rows are added in order, one FMA
// an element each, as before. int8 rows: each 32 elements scaled by their float (L divides 32, so a
// vector lies in one group). The loops over the registers are unrolled by request: left to GCC 12,
// it kept acc in memory with a mask-register flag per vector set on every row (eight `kmovb` a row
// beside 24 vector operations); without them, and with the row pointers stepped, the int8 decode
// (32,1,8192,128) took 0.92x its time on a Zen 4 (median of eight alternated runs, faster in each),
// float32, bf16 and f16 0.94x-0.99x.
template <int N, class D, class T, class E>
HWY_INLINE void AccumulateColumns(D d, const T* w, const TileRows<E>& vals, index_t cnt, T* HWY_RESTRICT o, index_t c0,
                                  index_t dv, index_t ahead, const NextRows<E>& then) {
  const index_t L = static_cast<index_t>(hn::Lanes(d));
  hn::Vec<D> acc[N];
  _Pragma("GCC unroll 16") for (int v = 0; v < N; ++v) acc[v] = hn::LoadU(d, o + c0 + v * L);
  // The tile's fields read once, the row's pointers stepped (int8 rows: and its scales'), but never
  // past the last row: a tile of one row may have any stride, and the step beyond it overflowed the
  // address space (found by the API fuzzer under clang's UBSan). (Forming them as rows + jj * stride
  // instead took the int8 decode 1.05x its time on a Zen 4.)
  constexpr bool kInt8 = std::is_same_v<E, std::int8_t>;
  const E* HWY_RESTRICT x = vals.rows + c0;
  const float* HWY_RESTRICT scales = vals.scales;  // int8 rows: one per 32 elements of the row
  const index_t stride = vals.stride, scale_stride = vals.scale_stride;
  const auto add_row = [&](index_t jj) {
    if (c0 == 0) {
      if (jj + ahead >= cnt) then.prefetch(jj + ahead - cnt);
      else if (w[jj + ahead] != T(0)) PrefetchRow(vals, jj + ahead, dv);
    }
    const T wj = w[jj];
    if (wj == T(0)) return;
    if constexpr (kInt8) {
      constexpr int kPerGroup = static_cast<int>(32 / hn::MaxLanes(d));  // vectors a scale covers
      if constexpr (N % kPerGroup == 0) {  // c0 a multiple of 32: one weight x scale per group
        const float* HWY_RESTRICT group_scales = scales + c0 / 32;
        _Pragma("GCC unroll 16") for (int g = 0; g < N / kPerGroup; ++g) {
          const auto ws = hn::Set(d, wj * group_scales[g]);
          _Pragma("GCC unroll 16") for (int v = g * kPerGroup; v < (g + 1) * kPerGroup; ++v)
            acc[v] = hn::MulAdd(ws, LoadWide(d, x + v * L), acc[v]);
        }
      } else {
        _Pragma("GCC unroll 16") for (int v = 0; v < N; ++v)
          acc[v] = hn::MulAdd(hn::Set(d, wj * scales[(c0 + v * L) / 32]), LoadWide(d, x + v * L), acc[v]);
      }
    } else {
      const auto wv = hn::Set(d, wj);
      _Pragma("GCC unroll 16") for (int v = 0; v < N; ++v) acc[v] = hn::MulAdd(wv, LoadWide(d, x + v * L), acc[v]);
    }
  };
  for (index_t jj = 0; jj < cnt; ++jj) {
    if (jj > 0) {
      x += stride;
      if constexpr (kInt8) scales += scale_stride;
    }
    add_row(jj);
  }
  _Pragma("GCC unroll 16") for (int v = 0; v < N; ++v) hn::StoreU(acc[v], d, o + c0 + v * L);
}

// The columns [c0, c0 + vectors L) of o in groups of at most kAccVectors registers (8: with the
// weight and a row's vector they fit AVX2's 16 registers).
inline constexpr index_t kAccVectors = 8;
template <int N = kAccVectors, class D, class T, class E>
HWY_INLINE void AccumulateVectors(D d, const T* w, const TileRows<E>& vals, index_t cnt, T* o, index_t c0,
                                  index_t vectors, index_t dv, index_t ahead, const NextRows<E>& then) {
  if constexpr (N > 0) {
    const index_t L = static_cast<index_t>(hn::Lanes(d));
    for (; vectors >= N; vectors -= N, c0 += N * L) AccumulateColumns<N>(d, w, vals, cnt, o, c0, dv, ahead, then);
    if (vectors > 0) AccumulateVectors<N - 1>(d, w, vals, cnt, o, c0, vectors, dv, ahead, then);
  }
}

// o += the tile's value rows by their weights w[0, cnt) (a row whose weight is 0 is never read: a
// masked or dropped key's value may be anything): whole vectors of columns in registers, then the
// columns past the last whole vector (none for int8 rows, whose v is a multiple of 32); `then`: the
// rows read next.
template <class D, class T, class E>
void AccumulateValues(D d, const T* w, const TileRows<E>& vals, index_t cnt, T* o, index_t dv, const NextRows<E>& then) {
  const index_t ahead = RowsAhead<E>(dv), L = static_cast<index_t>(hn::Lanes(d));
  for (index_t jj = 0; jj < ahead && jj < cnt; ++jj)
    if (w[jj] != T(0)) PrefetchRow(vals, jj, dv);
  AccumulateVectors(d, w, vals, cnt, o, 0, dv / L, dv, ahead, then);
  if constexpr (!std::is_same_v<E, std::int8_t>)
    for (index_t jj = 0; jj < cnt; ++jj)
      if (w[jj] != T(0))
        for (index_t c = dv / L * L; c < dv; ++c) o[c] += w[jj] * Wide(vals.row(jj)[c]);
}

// o += the tile's 4-bit value rows by their weights: AccumulateQ4Rows (below) for one row.
template <int R, class D>
void AccumulateQ4Rows(D d, const float* const* w, const bool* used, const TileRows<Q4Byte>& vals, index_t cnt,
                      float* const* o, index_t dv, index_t ahead, const NextRows<Q4Byte>& then);
template <class D>
void AccumulateValues(D d, const float* w, const TileRows<Q4Byte>& vals, index_t cnt, float* o, index_t dv,
                      const NextRows<Q4Byte>& then) {
  const index_t ahead = RowsAhead<Q4Byte>(dv);
  for (index_t jj = 0; jj < ahead && jj < cnt; ++jj)
    if (w[jj] != 0.0f) PrefetchRow(vals, jj, dv);
  AccumulateQ4Rows<1>(d, &w, nullptr, vals, cnt, &o, dv, ahead, then);
}

// s[0, cnt) = cap(scale s), with cap(x) = softcap CapTanh(x, 1 / softcap) (the prefill's), or x when softcap is 0.
template <class D, class T>
void ScaleAndCap(D d, T* s, index_t cnt, T scale, T softcap) {
  const index_t L = static_cast<index_t>(hn::Lanes(d));
  const auto vscale = hn::Set(d, scale), vcap = hn::Set(d, softcap);
  const auto vinv = hn::Set(d, softcap != T(0) ? T(1) / softcap : T(0));
  index_t jj = 0;
  for (; jj + L <= cnt; jj += L) {
    auto x = hn::Mul(hn::LoadU(d, s + jj), vscale);
    if (softcap != T(0)) x = hn::Mul(vcap, CapTanh(d, x, vinv));
    hn::StoreU(x, d, s + jj);
  }
  if (jj < cnt) {  // the tail through a zero-padded vector
    HWY_ALIGN T buf[hn::MaxLanes(d)] = {};
    std::copy(s + jj, s + cnt, buf);
    ScaleAndCap(d, buf, L, scale, softcap);
    std::copy(buf, buf + (cnt - jj), s + jj);
  }
}

// A query row's scores s[0, cnt) of the tile of keys [j0, j0 + cnt) turned into its weights:
// scaled, soft-capped with the fused kernels' tanh, the position bias and masks, the online softmax
// step on the row's running maximum mx and sum (o rescaled to the new maximum), dropout. False when
// the row has nothing to add from the tile (every key so far masked); its weights are then not set.
template <class D, class T>
bool TileWeights(D d, const SdpaPlan<T>& a, const RowMask<T>& rm, index_t j0, index_t cnt, index_t bh, index_t i, T* s,
                 T* o, T& mx, double& sum) {
  const T inf = std::numeric_limits<T>::infinity();
  const T fill = a.mask.d2l_fill ? T(-1e6) : -inf;
  ScaleAndCap(d, s, cnt, a.scale, a.softcap);
  if (a.hook != nullptr) a.hook->modify(a.hook->ctx, s, 1, bh / a.q.H, bh % a.q.H, i, 1, j0, cnt);
  const index_t L = static_cast<index_t>(hn::Lanes(d));
  T tile_max = -inf;
  if (rm.plain() && j0 >= rm.begin && j0 + cnt <= rm.end) {  // every key of the tile attended as it is
    auto vmax = hn::Set(d, -inf);
    index_t jj = 0;
    for (; jj + L <= cnt; jj += L) vmax = hn::Max(vmax, hn::Load(d, s + jj));
    tile_max = hn::GetLane(hn::MaxOfLanes(d, vmax));
    for (; jj < cnt; ++jj) tile_max = std::max(tile_max, s[jj]);
  } else {
    for (index_t jj = 0; jj < cnt; ++jj) {
      const index_t j = j0 + jj;
      s[jj] = rm.allowed(j) ? s[jj] + rm.bias_at(j) : fill;
      tile_max = std::max(tile_max, s[jj]);
    }
  }
  T new_max = std::max(mx, tile_max);
  if (new_max == -inf) {  // every key so far masked, or every attended score NaN (the maximum skips NaN)
    bool nan = false;
    for (index_t jj = 0; jj < cnt; ++jj) nan = nan || std::isnan(s[jj]);
    if (!nan) return false;
    new_max = std::numeric_limits<T>::quiet_NaN();  // then the row is NaN, as in PyTorch
  }
  const T alpha = std::exp(mx - new_max);
  mx = new_max;
  for (index_t c = 0; c < a.v.C; ++c) o[c] *= alpha;
  index_t jj = 0;
  for (; jj + L <= cnt; jj += L) hn::Store(ExpWeight(d, hn::Sub(hn::Load(d, s + jj), hn::Set(d, mx))), d, s + jj);
  for (; jj < cnt; ++jj) {
    const T x = s[jj] - mx;
    s[jj] = x < (sizeof(T) == 4 ? T(-87.0) : T(-708.0)) ? T(0) : std::exp(x);  // as ExpWeight
  }
  double sums[4] = {0, 0, 0, 0};  // four chains: the adds' latency overlaps
  for (jj = 0; jj + 4 <= cnt; jj += 4)
    for (int c = 0; c < 4; ++c) sums[c] += static_cast<double>(s[jj + c]);
  for (; jj < cnt; ++jj) sums[0] += static_cast<double>(s[jj]);
  const double tile_sum = (sums[0] + sums[1]) + (sums[2] + sums[3]);
  sum = sum * static_cast<double>(alpha) + tile_sum;
  const DropoutPlan& drop = a.dropout;
  if (drop.active)
    for (jj = 0; jj < cnt; ++jj) s[jj] = drop.keep(bh, i, j0 + jj) ? s[jj] * static_cast<T>(drop.scale) : T(0);
  return true;
}

// One tile of keys [j0, j0 + cnt) for one query row: scores, weights (TileWeights), and o += the
// tile's weighted values. s: kDecodeTile scratch; next_keys: the next tile's keys.
template <class D, class T, class E>
void DecodeTileRow(D d, const SdpaPlan<T>& a, const RowMask<T>& rm, const T* q, const std::int16_t* rounded,
                   float sigma, const TileRows<E>& keys,
                   const TileRows<E>& vals, const NextRows<E>& next_keys, index_t j0, index_t cnt, index_t bh,
                   index_t i, T* s, T* o, T& mx, double& sum) {
  Dots(d, q, rounded, sigma, keys, a.q.C, cnt, s, NextRows<E>{vals, cnt, a.v.C});
  if (TileWeights(d, a, rm, j0, cnt, bh, i, s, o, mx, sum)) AccumulateValues(d, s, vals, cnt, o, a.v.C, next_keys);
}

// ---- Several query rows of a key head at once: values ---------------------------------------------
// (the packs and their dot products: above, beside Dots)

// o[r][c0, c0 + N L) += the tile's value rows by the weights w[r], for R rows: each value row whose
// weight is not 0 for some row (used) loaded once, then one FMA an element for each row whose weight
// is not 0, rows in order, as AccumulateColumns adds them. kEvery: every weight of the tile is not 0
// (no used given), so no weight is tested.
template <int R, int N, bool kEvery, class D, class E>
HWY_INLINE void AccumulateColumnsRows(D d, const float* const* w, const bool* used, const TileRows<E>& vals, index_t cnt,
                                      float* const* o, index_t c0, index_t dv, index_t ahead, const NextRows<E>& then) {
  const index_t L = static_cast<index_t>(hn::Lanes(d));
  hn::Vec<D> acc[R][N];
  _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r)
    _Pragma("GCC unroll 8") for (int v = 0; v < N; ++v) acc[r][v] = hn::LoadU(d, o[r] + c0 + v * L);
  const E* HWY_RESTRICT x = vals.rows + c0;  // stepped, never past the last row (AccumulateColumns)
  for (index_t jj = 0; jj < cnt; ++jj) {
    if (jj > 0) x += vals.stride;
    if (c0 == 0) {
      if (jj + ahead >= cnt) then.prefetch(jj + ahead - cnt);
      else if (kEvery || used[jj + ahead]) PrefetchRow(vals, jj + ahead, dv);
    }
    if (!kEvery && !used[jj]) continue;
    hn::Vec<D> xv[N];
    _Pragma("GCC unroll 8") for (int v = 0; v < N; ++v) xv[v] = LoadWide(d, x + v * L);
    _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) {
      const float wj = w[r][jj];
      if (!kEvery && wj == 0.0f) continue;
      if constexpr (std::is_same_v<E, std::int8_t>) {  // each vector's group scale: the weight times it, as row by row
        const float* scales = vals.scale(jj);
        _Pragma("GCC unroll 8") for (int v = 0; v < N; ++v)
          acc[r][v] = hn::MulAdd(hn::Set(d, wj * scales[(c0 + v * L) / 32]), xv[v], acc[r][v]);
      } else {
        const auto wv = hn::Set(d, wj);
        _Pragma("GCC unroll 8") for (int v = 0; v < N; ++v) acc[r][v] = hn::MulAdd(wv, xv[v], acc[r][v]);
      }
    }
  }
  _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r)
    _Pragma("GCC unroll 8") for (int v = 0; v < N; ++v) hn::StoreU(acc[r][v], d, o[r] + c0 + v * L);
}

// The columns [c0, c0 + vectors L) of R rows' o, N vectors of each in registers at a time (16
// accumulators where 32 registers are, 8 where 16), the last ones fewer.
template <int R, int N, bool kEvery, class D, class E>
HWY_INLINE void AccumulateVectorsRows(D d, const float* const* w, const bool* used, const TileRows<E>& vals, index_t cnt,
                                      float* const* o, index_t c0, index_t vectors, index_t dv, index_t ahead,
                                      const NextRows<E>& then) {
  if constexpr (N > 0) {
    const index_t L = static_cast<index_t>(hn::Lanes(d));
    for (; vectors >= N; vectors -= N, c0 += N * L)
      AccumulateColumnsRows<R, N, kEvery>(d, w, used, vals, cnt, o, c0, dv, ahead, then);
    if (vectors > 0) AccumulateVectorsRows<R, N - 1, kEvery>(d, w, used, vals, cnt, o, c0, vectors, dv, ahead, then);
  }
}

// Whether none of w[0, cnt) is 0 (a NaN is not).
template <class D>
HWY_INLINE bool NoneZero(D d, const float* w, index_t cnt) {
  const index_t L = static_cast<index_t>(hn::Lanes(d));
  index_t j = 0;
  for (; j + L <= cnt; j += L)
    if (!hn::AllFalse(d, hn::Eq(hn::LoadU(d, w + j), hn::Zero(d)))) return false;
  for (; j < cnt; ++j)
    if (w[j] == 0.0f) return false;
  return true;
}

// o[r][c0, c0 + G 32) += the tile's 4-bit value rows by the weights w[r], for R rows (used[jj]:
// some w[r][jj] is not 0; one row: none given): each value row's G groups of 32 columns dequantized
// once in registers for all R (the same floats as the row widened), its FMAs added in row order
// (the same results, whichever rows share a pack). A row's groups are taken in one visit of the
// row: a group of 32 columns a pass over the tile left the int4 decode (32,1,8192,128) at
// 1.13x-1.15x this time, two threads, avx3 (medians of 21 alternated calls, three runs).
template <int R, int G, class D>
HWY_INLINE void AccumulateQ4ColumnsRows(D d, const float* const* w, const bool* used, const TileRows<Q4Byte>& vals,
                                        index_t cnt, float* const* o, index_t c0, index_t dv, index_t ahead,
                                        const NextRows<Q4Byte>& then) {
  constexpr index_t L = static_cast<index_t>(hn::MaxLanes(d)), kHalf = 16 / L, kVectors = G * 32 / L;
  static_assert(16 % L == 0, "whole groups of 32 columns");
  // The tile's fields read once (value rows have their groups along the row: per_channel is false).
  const auto* bytes0 = reinterpret_cast<const std::uint8_t*>(vals.rows) + c0 / 2;
  const float* scales0 = vals.scales + c0 / 32;
  const float* mins0 = vals.mins + c0 / 32;
  const index_t stride = vals.stride, scale_stride = vals.scale_stride;
  hn::Vec<D> acc[R][kVectors];
  _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r)
    _Pragma("GCC unroll 16") for (index_t v = 0; v < kVectors; ++v) acc[r][v] = hn::LoadU(d, o[r] + c0 + v * L);
  for (index_t jj = 0; jj < cnt; ++jj) {
    if (c0 == 0) {  // the first columns' pass asks for the rows ahead
      if (jj + ahead >= cnt) then.prefetch(jj + ahead - cnt);
      else if (R == 1 ? w[0][jj + ahead] != 0.0f : used[jj + ahead]) PrefetchRow(vals, jj + ahead, dv);
    }
    // The rows whose weight is not 0 (bit r): only theirs take the row's FMAs, tested once a value
    // row where every row adds it (a test a row and vector, with the tile's fields read again each
    // row, took the int4 decode of 7 sequences of 4,096 tokens 1.07x this time with 8 query heads
    // over 8 key heads and 1.04x with 32 over 8, two threads, avx3, medians of 20 alternated calls).
    unsigned adding = 0;
    _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) adding |= static_cast<unsigned>(w[r][jj] != 0.0f) << r;
    if (adding == 0) continue;
    const float* scales = scales0 + jj * scale_stride;
    const float* mins = mins0 + jj * scale_stride;
    const std::uint8_t* bytes = bytes0 + jj * stride;
    hn::Vec<D> weight[R];
    _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) weight[r] = hn::Set(d, w[r][jj]);
    const auto add = [&](auto every) HWY_ATTR {
      _Pragma("GCC unroll 8") for (index_t g = 0; g < G; ++g) {
        const auto scale = hn::Set(d, scales[g]), min = hn::Set(d, mins[g]);
        _Pragma("GCC unroll 16") for (index_t v = 0; v < kHalf; ++v) {
          hn::Vec<D> lo, hi;
          LoadQ4(d, bytes + g * 16, v * L, scale, min, lo, hi);
          _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r) {
            if (!decltype(every)::value && !(adding >> r & 1u)) continue;
            acc[r][g * 2 * kHalf + v] = hn::MulAdd(weight[r], lo, acc[r][g * 2 * kHalf + v]);
            acc[r][g * 2 * kHalf + kHalf + v] = hn::MulAdd(weight[r], hi, acc[r][g * 2 * kHalf + kHalf + v]);
          }
        }
      }
    };
    if (adding == (1u << R) - 1) add(std::true_type{});  // every row: no test in the loop
    else add(std::false_type{});
  }
  _Pragma("GCC unroll 4") for (int r = 0; r < R; ++r)
    _Pragma("GCC unroll 16") for (index_t v = 0; v < kVectors; ++v) hn::StoreU(acc[r][v], d, o[r] + c0 + v * L);
}

// o[r][c0, dv) += the tile's 4-bit value rows by the weights w[r], G groups of 32 columns at a time,
// then fewer.
template <int R, int G, class D>
HWY_INLINE void AccumulateQ4GroupsRows(D d, const float* const* w, const bool* used, const TileRows<Q4Byte>& vals,
                                       index_t cnt, float* const* o, index_t c0, index_t dv, index_t ahead,
                                       const NextRows<Q4Byte>& then) {
  if constexpr (G > 0) {
    for (; c0 + G * 32 <= dv; c0 += G * 32) AccumulateQ4ColumnsRows<R, G>(d, w, used, vals, cnt, o, c0, dv, ahead, then);
    if (c0 < dv) AccumulateQ4GroupsRows<R, G - 1>(d, w, used, vals, cnt, o, c0, dv, ahead, then);
  }
}

// o[r] += the tile's 4-bit value rows by the weights w[r], for R rows: as many groups of columns at
// a time as half the vector registers hold for all R rows (at least one).
template <int R, class D>
void AccumulateQ4Rows(D d, const float* const* w, const bool* used, const TileRows<Q4Byte>& vals, index_t cnt,
                      float* const* o, index_t dv, index_t ahead, const NextRows<Q4Byte>& then) {
  constexpr int kRegisters = PackRows(D()) == 4 ? 16 : 8, kPerGroup = 32 / static_cast<int>(hn::MaxLanes(d));
  AccumulateQ4GroupsRows<R, std::max(1, kRegisters / (R * kPerGroup))>(d, w, used, vals, cnt, o, 0, dv, ahead, then);
}

// One tile of keys [j0, j0 + cnt) for R query rows of one key head: their scores from one pass over
// the keys, each row's weights (TileWeights), then their weighted values from one pass over the
// values (per group of columns). rm, bh, i, o, mx, sum: each row's, as DecodeTileRow takes them;
// s: R rows of kDecodeTile scratch.
template <int R, class D, class E>
void DecodeTileRows(D d, const SdpaPlan<float>& a, const RowMask<float>* rm, const float* const* q,
                    const std::int16_t* const* rounded, const float* sigma, const TileRows<E>& keys,
                    const TileRows<E>& vals, const NextRows<E>& next_keys, index_t j0, index_t cnt, const index_t* bh,
                    const index_t* i, float* const* s, float* const* o, float* const* mx, double* const* sum) {
  if constexpr (std::is_same_v<E, std::int8_t>) {
    DotsRowsInt8<R>(d, q, rounded, sigma, keys, a.q.C, cnt, s, NextRows<E>{vals, cnt, a.v.C});
#if HWY_TARGET == HWY_AVX3
  } else if (std::is_same_v<E, Q4Byte> && rounded[0] != nullptr && !keys.per_channel) {
    // (Every row's sigma is not 0 here: run_pack sends a pack with a row rounded to 0 row by row.)
    if constexpr (std::is_same_v<E, Q4Byte>)
      DotsRowsQ4Rounded<R>(d, q, rounded, sigma, keys, a.q.C, cnt, s, NextRows<E>{vals, cnt, a.v.C});
#endif
  } else {
    DotsRows<R>(d, q, keys, a.q.C, cnt, s, NextRows<E>{vals, cnt, a.v.C});
  }
  int adding = 0;
  for (int r = 0; r < R; ++r) {
    if (TileWeights(d, a, rm[r], j0, cnt, bh[r], i[r], s[r], o[r], *mx[r], *sum[r])) ++adding;
    else std::fill(s[r], s[r] + cnt, 0.0f);  // nothing to add: no value row read for it
  }
  if (adding == 0) return;
  const index_t ahead = RowsAhead<E>(a.v.C), L = static_cast<index_t>(hn::Lanes(d));
  constexpr int kAccumulators = PackRows(hn::ScalableTag<float>()) == 4 ? 16 : 8;
  if constexpr (!std::is_same_v<E, Q4Byte>) {
    // The usual tile, no weight of any row 0 (nothing masked or dropped, none flushed to 0): the
    // value rows added without a test a row and query row. (Tested, four query rows over 512
    // float32 keys and values in L2 took 1.05x-1.08x this time on a Zen 5, one thread, avx3,
    // alternated calls in either order; from memory, the decode's time did not change.)
    bool every = adding == R;
    for (int r = 0; r < R && every; ++r) every = NoneZero(d, s[r], cnt);
    if (every) {
      for (index_t jj = 0; jj < ahead && jj < cnt; ++jj) PrefetchRow(vals, jj, a.v.C);
      AccumulateVectorsRows<R, kAccumulators / R, true>(d, s, nullptr, vals, cnt, o, 0, a.v.C / L, a.v.C, ahead, next_keys);
      return;
    }
  }
  HWY_ALIGN bool used[kDecodeTile];
  for (index_t jj = 0; jj < cnt; ++jj) {
    bool any = false;
    for (int r = 0; r < R; ++r) any = any || s[r][jj] != 0.0f;
    used[jj] = any;
  }
  for (index_t jj = 0; jj < ahead && jj < cnt; ++jj)
    if (used[jj]) PrefetchRow(vals, jj, a.v.C);
  if constexpr (std::is_same_v<E, Q4Byte>) {
    AccumulateQ4Rows<R>(d, s, used, vals, cnt, o, a.v.C, ahead, next_keys);
  } else {
    AccumulateVectorsRows<R, kAccumulators / R, false>(d, s, used, vals, cnt, o, 0, a.v.C / L, a.v.C, ahead, next_keys);
  }
}

// The tile of rows from key j0 on of (b, hk): the plan's tensor, or KvRows of element type E.
template <class T>
TileRows<T> tile_of(const View4<const T>& x, index_t b, index_t hk, index_t j0) {
  return {x.row(b, hk, j0), x.sR};
}
template <class E>
TileRows<E> tile_of(const KvRows& x, index_t b, index_t hk, index_t j0) {
  if constexpr (std::is_same_v<E, Q4Byte>) {  // a 4-bit cache's rows: sH and sR count values (fused.hpp)
    const index_t block = b * x.table_stride + j0 / x.block_size, row = j0 % x.block_size, at = hk * x.sH + row * x.sR;
    const auto* codes = static_cast<const Q4Byte*>(x.blocks[block]) + at / 2;
    if (x.type == KvType::i4_channels) {  // the groups of 32 rows from row / 32 * 32 on (fused.hpp)
      const index_t group = hk * x.sH / 32 + row / 32 * x.sR;
      return {codes, x.sR / 2, x.scale_blocks[block] + group, x.sR, x.min_blocks[block] + group, true, row % 32};
    }
    return {codes, x.sR / 2, x.scale_blocks[block] + at / 32, x.sR / 32, x.min_blocks[block] + at / 32};
  }
  const float* scales = x.type == KvType::i8 ? x.scale_row(b, hk, j0) : nullptr;
  return {x.row<E>(b, hk, j0), x.sR, scales, x.sR / 32};
}
template <class T>
index_t run_of(const View4<const T>&, index_t, index_t) {
  return std::numeric_limits<index_t>::max();
}
inline index_t run_of(const KvRows& x, index_t b, index_t j) { return x.run(b, j); }

// 4-bit rows (KvType::i4, i4_channels) and a KIVI cache's bfloat16 tail, widened to float a tile of
// at most kWidenTile rows at a time into `scratch` (kWidenTile, cols), then read as float rows:
// each widened tile serves every query row of the key head's group from the L2 cache.
inline constexpr index_t kWidenTile = 128;
struct WidenedRows {
  const KvRows* rows;
  float* scratch;
  index_t cols;
};
inline index_t run_of(const WidenedRows& x, index_t b, index_t j) { return std::min(kWidenTile, x.rows->run(b, j)); }

// Rows [j0, j0 + cnt) of key head hk of batch entry b widened into x.scratch (cnt within one run).
template <class D>
TileRows<float> Widen(D d, const WidenedRows& x, index_t b, index_t hk, index_t j0, index_t cnt) {
  WidenRows(d, *x.rows, b, hk, j0, cnt, x.cols, x.scratch);
  return {x.scratch, x.cols};
}

// Tiles outer, key heads and query rows inner: each tile of keys and values is read from memory once
// and serves every row of every query head of its key head's group from the cache; the task's key
// heads [hk0, hk0 + heads) take each tile in turn, so keys stored token by token are read in memory
// order. A row's running state lives in its slot of the partial results. Keys and values from `ks`
// and `vs` (the plan's tensors or KvRows of elements E); a tile ends where their rows stop being one
// run (a cache block's end). `span` limits the call to the chunk's keys in [from, to): a chunk read
// from two sources (a KIVI cache's quantized rows, then its bfloat16 tail) takes two calls, the
// second going on from the first's state (first = false), over the same tiles one call would take.
struct KeySpan {
  index_t from = 0, to = std::numeric_limits<index_t>::max();
  bool first = true;
};
template <class E, class T, class Source>
void DecodeChunkFrom(const SdpaDecode<T>& p, index_t b, index_t hk0, index_t heads, index_t chunk, const Source& ks,
                     const Source& vs, KeySpan span = {}) {
  simd::note_ran(HWY_TARGET);
  const hn::ScalableTag<T> d;
  const SdpaPlan<T>& a = *p.f.plan;
  const index_t n = a.q.R, m = a.k.R, dv = a.v.C, H = a.q.H, hk1 = hk0 + heads;
  const index_t k0 = std::max(span.from, chunk * p.chunk_keys), k1 = std::min({m, span.to, chunk * p.chunk_keys + p.chunk_keys});
  // The slot of row i of query head h, and the last key a row of the task may attend to.
  auto slot = [&](index_t h, index_t i) { return ((b * H + h) * n + i) * p.chunks + chunk; };
  index_t begin = k1, end = k0;
  for (index_t h = hk0 * a.group; h < hk1 * a.group; ++h)
    for (index_t i = 0; i < n; ++i) {
      const index_t r = slot(h, i);
      if (span.first) {
        std::fill(p.part_out + r * dv, p.part_out + (r + 1) * dv, T(0));
        p.part_max[r] = -std::numeric_limits<T>::infinity();
        p.part_sum[r] = 0;
      }
      const RowMask<T> rm = a.mask.row(b, h, i);
      begin = std::min(begin, a.mask.d2l_fill ? k0 : std::max(k0, rm.begin));
      end = std::max(end, a.mask.d2l_fill ? k1 : std::min(k1, rm.end));
    }
  if (k0 >= k1) return;  // a span that misses the chunk: the rows' slots started, no key read
  // Rows in packs (DecodeTileRows): float queries over float, 16-bit, 8-bit float, int8 (queries
  // rounded to integers with a sigma not 0) or 4-bit rows, d and v multiples of the lanes; float64 and
  // other d row by row.
  constexpr bool kPackable = std::is_same_v<T, float>;
  constexpr int kPack = kPackable ? PackRows(d) : 1;
  const index_t L = static_cast<index_t>(hn::Lanes(d));
  const bool packs = kPackable && a.q.C % L == 0 && a.v.C % L == 0;
  HWY_ALIGN T s[kPack][kDecodeTile];  // each row's scores of the tile, then its weights
  auto tile_size = [&](index_t j0) { return std::min({kDecodeTile, end - j0, run_of(ks, b, j0), run_of(vs, b, j0)}); };
  for (index_t j0 = begin, cnt = 0; j0 < end; j0 += cnt) {
    cnt = tile_size(j0);
    for (index_t hk = hk0; hk < hk1; ++hk) {
      TileRows<E> keys, vals;
      NextRows<E> next_keys;  // the keys read next: the next head's of this tile, or the next tile's
      if constexpr (std::is_same_v<Source, WidenedRows>) {  // widened into scratch: nothing to ask for ahead
        keys = Widen(d, ks, b, hk, j0, cnt), vals = Widen(d, vs, b, hk, j0, cnt);
      } else {
        keys = tile_of<E>(ks, b, hk, j0), vals = tile_of<E>(vs, b, hk, j0);
        if (hk + 1 < hk1) {
          next_keys = {tile_of<E>(ks, b, hk + 1, j0), cnt, a.q.C};
        } else if (j0 + cnt < end) {
          next_keys = {tile_of<E>(ks, b, hk0, j0 + cnt), tile_size(j0 + cnt), a.q.C};
        }
      }
      // The group's rows that attend a key of the tile, gathered into packs of up to kPack.
      RowMask<T> rm[kPack];
      index_t is[kPack], bh[kPack];
      const T* q[kPack];
      const std::int16_t* rounded[kPack];  // int8 keys: each row's query rounded to integers, and its sigma
      float sigma[kPack];
      T *o[kPack], *mx[kPack], *sp[kPack];
      double* sum[kPack];
      int count = 0;
      auto run_pack = [&] {
        if constexpr (kPackable && kPack >= 2) {
          // Keys met by rounded queries (int8's; an int4 cache's on AVX512-VNNI): a query rounded to 0
          // (sigma 0) takes the float products, row by row.
          const bool rounded_all = p.rounded == nullptr || std::all_of(sigma, sigma + count, [](float x) { return x != 0; });
          if (rounded_all) {
            if (count == kPack)
              return DecodeTileRows<kPack>(d, a, rm, q, rounded, sigma, keys, vals, next_keys, j0, cnt, bh, is, sp, o, mx, sum);
            if constexpr (kPack > 2) {
              if (count == 3)
                return DecodeTileRows<3>(d, a, rm, q, rounded, sigma, keys, vals, next_keys, j0, cnt, bh, is, sp, o, mx, sum);
            }
            if (count == 2)
              return DecodeTileRows<2>(d, a, rm, q, rounded, sigma, keys, vals, next_keys, j0, cnt, bh, is, sp, o, mx, sum);
          }
        }
        for (int r = 0; r < count; ++r)
          DecodeTileRow(d, a, rm[r], q[r], rounded[r], sigma[r], keys, vals, next_keys, j0, cnt, bh[r], is[r], s[0], o[r],
                        *mx[r], *sum[r]);
      };
      for (index_t h = hk * a.group; h < (hk + 1) * a.group; ++h)
        for (index_t i = 0; i < n; ++i) {
          const RowMask<T> row_mask = a.mask.row(b, h, i);
          if (!a.mask.d2l_fill && (j0 >= row_mask.end || j0 + cnt <= row_mask.begin)) continue;
          const index_t r = slot(h, i);
          rm[count] = row_mask, is[count] = i, bh[count] = b * H + h, q[count] = a.q.row(b, h, i);
          const index_t row = (b * H + h) * n + i;  // its rounding, for int8 and int4 keys
          rounded[count] = p.rounded == nullptr ? nullptr : p.rounded + row * p.rounded_stride;
          sigma[count] = p.sigma == nullptr ? 0.0f : p.sigma[row];
          o[count] = p.part_out + r * dv, mx[count] = p.part_max + r, sum[count] = p.part_sum + r, sp[count] = s[count];
          if (++count == (packs ? kPack : 1)) run_pack(), count = 0;
        }
      if (count > 0) run_pack();
    }
  }
}

template <class T>
void DecodeChunk(const SdpaDecode<T>& p, index_t b, index_t hk, index_t heads, index_t chunk) {
  if constexpr (std::is_same_v<T, float>) {
    if (p.keys != nullptr) {
      switch (p.keys->type) {
        case KvType::f32: return DecodeChunkFrom<float>(p, b, hk, heads, chunk, *p.keys, *p.values);
        case KvType::bf16: return DecodeChunkFrom<bfloat16>(p, b, hk, heads, chunk, *p.keys, *p.values);
        case KvType::f16: return DecodeChunkFrom<float16>(p, b, hk, heads, chunk, *p.keys, *p.values);
        case KvType::i8: return DecodeChunkFrom<std::int8_t>(p, b, hk, heads, chunk, *p.keys, *p.values);
        case KvType::f8e4m3: return DecodeChunkFrom<detail::float8_e4m3>(p, b, hk, heads, chunk, *p.keys, *p.values);
        case KvType::f8e5m2: return DecodeChunkFrom<detail::float8_e5m2>(p, b, hk, heads, chunk, *p.keys, *p.values);
        case KvType::i4:
        case KvType::i4_channels: {
          KeySpan widened;  // the keys read through scratch: all of them, or a KIVI cache's tail
#if HWY_NATIVE_FMA && HWY_TARGET != HWY_SCALAR
          // A 4-bit cache's rows dequantized in registers (the widened rows' floats, by the same FMA):
          // int4's, and a KIVI cache's (keys per channel, values per token) up to its bfloat16 tail.
          if (p.values->type == KvType::i4) {
            const index_t tail = p.keys->tails != nullptr ? p.keys->tail_from[b] : std::numeric_limits<index_t>::max();
            DecodeChunkFrom<Q4Byte>(p, b, hk, heads, chunk, *p.keys, *p.values, {0, tail, true});
            if (p.keys->tails == nullptr) return;
            widened = {tail, std::numeric_limits<index_t>::max(), false};
          }
#endif
          thread_local std::vector<float> scratch;  // a widened tile of keys, then of values
          const index_t dk = p.f.plan->q.C, dv = p.f.plan->v.C;
          scratch.resize(static_cast<std::size_t>(kWidenTile * (dk + dv)));
          return DecodeChunkFrom<float>(p, b, hk, heads, chunk, WidenedRows{p.keys, scratch.data(), dk},
                                        WidenedRows{p.values, scratch.data() + kWidenTile * dk, dv}, widened);
        }
      }
    }
  }
  DecodeChunkFrom<T>(p, b, hk, heads, chunk, p.f.plan->k, p.f.plan->v);
}

void DecodeChunkF32(const SdpaDecode<float>& p, index_t b, index_t hk, index_t heads, index_t c) {
  DecodeChunk(p, b, hk, heads, c);
}
void DecodeChunkF64(const SdpaDecode<double>& p, index_t b, index_t hk, index_t heads, index_t c) {
  DecodeChunk(p, b, hk, heads, c);
}

}  // namespace attn::cpu::fused::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::cpu::fused {

HWY_EXPORT(DecodeChunkF32);
HWY_EXPORT(DecodeChunkF64);

template <>
void sdpa_decode_chunk(const SdpaDecode<float>& p, index_t b, index_t hk, index_t heads, index_t chunk) {
  ATTN_SIMD_CALL(p.f.simd, DecodeChunkF32)(p, b, hk, heads, chunk);
}
template <>
void sdpa_decode_chunk(const SdpaDecode<double>& p, index_t b, index_t hk, index_t heads, index_t chunk) {
  ATTN_SIMD_CALL(p.f.simd, DecodeChunkF64)(p, b, hk, heads, chunk);
}

}  // namespace attn::cpu::fused
#endif  // HWY_ONCE
