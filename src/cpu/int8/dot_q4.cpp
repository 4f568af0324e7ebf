// AVX512-VNNI scores over 4-bit keys (dot_q4.hpp). Each function that uses the instructions carries
// the target attribute; none is called unless has_avx512_vnni().
#include "cpu/int8/dot_q4.hpp"

#include "cpu/int8/vnni.hpp"

#include <algorithm>
#include <cstring>
#include <utility>

namespace attn::cpu::int8 {
namespace {

constexpr index_t kChunkBytes = 64;                           // codes of four groups of 32
constexpr index_t kPackedChunk = 4 * kChunkBytes + 16 * 4;    // hL, hH, lL, lH, then 16 floats

// Sums the 16 lanes of each of v[0, 4) into out[0, 4). Each output adds its own lanes only, in the
// same tree whatever the other three hold, so a row gets the same bits in any group of four.
ATTN_VNNI_INLINE void sum_of_lanes4(const __m512* v, float* out) {
  const __m512 a = _mm512_add_ps(_mm512_unpacklo_ps(v[0], v[1]), _mm512_unpackhi_ps(v[0], v[1]));
  const __m512 b = _mm512_add_ps(_mm512_unpacklo_ps(v[2], v[3]), _mm512_unpackhi_ps(v[2], v[3]));
  const __m512d ad = _mm512_castps_pd(a), bd = _mm512_castps_pd(b);
  const __m512 x = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(ad, bd)), _mm512_castpd_ps(_mm512_unpackhi_pd(ad, bd)));
  const __m256 y = _mm256_add_ps(_mm512_castps512_ps256(x), _mm512_extractf32x8_ps(x, 1));
  _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(y), _mm256_extractf128_ps(y, 1)));
}

// One chunk of a key row (64 bytes of codes, four groups): its codes split into low and high
// nibbles, and its groups' scales and minima spread over the lanes, lane 4 g + i holding group g's.
struct Chunk {
  __m512i lo, hi;
  __m512 scale, min;
};
ATTN_VNNI_INLINE Chunk chunk_of(__m512i bytes, __m128 scale4, __m128 min4) {
  const __m512i nibble = _mm512_set1_epi8(15);
  const __m512i expand = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  return {_mm512_and_si512(bytes, nibble), _mm512_and_si512(_mm512_srli_epi16(bytes, 4), nibble),
          _mm512_permutexvar_ps(expand, _mm512_castps128_ps512(scale4)),
          _mm512_permutexvar_ps(expand, _mm512_castps128_ps512(min4))};
}

// lanes + the chunk's products with one query's chunk (packed): each group's sum of r code in
// integers, times its scale, plus its minimum times the group's sum of r.
ATTN_VNNI_INLINE __m512 add_chunk(__m512 lanes, const Chunk& k, const std::uint8_t* packed) {
  __m512i high = dpbusd(_mm512_setzero_si512(), k.lo, _mm512_loadu_si512(packed));
  high = dpbusd(high, k.hi, _mm512_loadu_si512(packed + kChunkBytes));
  __m512i low = dpbusd(_mm512_setzero_si512(), _mm512_loadu_si512(packed + 2 * kChunkBytes), k.lo);
  low = dpbusd(low, _mm512_loadu_si512(packed + 3 * kChunkBytes), k.hi);
  const __m512i sums = _mm512_add_epi32(_mm512_slli_epi32(high, 8), low);
  const __m512 quarter_sums = _mm512_loadu_ps(reinterpret_cast<const float*>(packed + 4 * kChunkBytes));
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), k.scale, _mm512_fmadd_ps(k.min, quarter_sums, lanes));
}

// A row of dim / 2 bytes: kChunks whole chunks (1 or 2: head_dim 128 or 256, straight-line), or (0)
// whole chunks then a last one under masks, counted at run time.
struct RowShape {
  index_t whole;         // chunks of 64 bytes
  __mmask64 tail_bytes;  // the last chunk's, none when the row ends a chunk
  __mmask8 tail_groups;
};

// s[r][0, cnt) for R queries (packed[r]) over the cnt key rows: each key row's chunks split once for
// all R, each query's lanes summed four key rows at a time. A query's score of a row is the same
// arithmetic for any R.
template <int R, int kChunks>
ATTN_VNNI_TARGET void scores_rows(const std::uint8_t* codes, index_t stride, const float* scales, const float* mins,
                                  index_t scale_stride, index_t cnt, const RowShape& shape,
                                  const std::uint8_t* const* packed, float* const* s) {
  __m512 v[R][4];
  const auto row_into = [&](index_t j) ATTN_VNNI_TARGET {
    const std::uint8_t* row = codes + j * stride;
    const float* scale = scales + j * scale_stride;
    const float* min = mins + j * scale_stride;
    __m512 lanes[R];
    for (int r = 0; r < R; ++r) lanes[r] = _mm512_setzero_ps();
    const index_t whole = kChunks > 0 ? kChunks : shape.whole;
    for (index_t c = 0; c < whole; ++c) {
      const Chunk k = chunk_of(_mm512_loadu_si512(row + c * kChunkBytes), _mm_loadu_ps(scale + 4 * c), _mm_loadu_ps(min + 4 * c));
      for (int r = 0; r < R; ++r) lanes[r] = add_chunk(lanes[r], k, packed[r] + c * kPackedChunk);
    }
    if (kChunks == 0 && shape.tail_bytes != 0) {
      const index_t c = shape.whole;
      const Chunk k = chunk_of(_mm512_maskz_loadu_epi8(shape.tail_bytes, row + c * kChunkBytes),
                               _mm_maskz_loadu_ps(shape.tail_groups, scale + 4 * c), _mm_maskz_loadu_ps(shape.tail_groups, min + 4 * c));
      for (int r = 0; r < R; ++r) lanes[r] = add_chunk(lanes[r], k, packed[r] + c * kPackedChunk);
    }
    for (int r = 0; r < R; ++r) v[r][j % 4] = lanes[r];
  };
  index_t j = 0;
  for (; j + 4 <= cnt; j += 4) {
    row_into(j), row_into(j + 1), row_into(j + 2), row_into(j + 3);
    for (int r = 0; r < R; ++r) sum_of_lanes4(v[r], s[r] + j);
  }
  if (j < cnt) {
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < 4; ++i) v[r][i] = _mm512_setzero_ps();
    for (index_t i = j; i < cnt; ++i) row_into(i);
    for (int r = 0; r < R; ++r) {
      float sums[4];
      sum_of_lanes4(v[r], sums);
      std::copy(sums, sums + (cnt - j), s[r] + j);
    }
  }
}

template <int R>
ATTN_VNNI_TARGET void scores_of(const std::uint8_t* codes, index_t stride, const float* scales, const float* mins,
                                index_t scale_stride, index_t cnt, index_t dim, const std::uint8_t* const* packed,
                                float* const* s) {
  const index_t bytes = dim / 2, tail = bytes % kChunkBytes;
  const RowShape shape{bytes / kChunkBytes, (__mmask64{1} << tail) - 1, static_cast<__mmask8>((1u << (tail / 16)) - 1)};
  if (dim == 128) return scores_rows<R, 1>(codes, stride, scales, mins, scale_stride, cnt, shape, packed, s);
  if (dim == 256) return scores_rows<R, 2>(codes, stride, scales, mins, scale_stride, cnt, shape, packed, s);
  scores_rows<R, 0>(codes, stride, scales, mins, scale_stride, cnt, shape, packed, s);
}

}  // namespace

index_t q4_query_bytes(index_t dim) { return (dim / 2 + kChunkBytes - 1) / kChunkBytes * kPackedChunk; }

void q4_pack_query(const std::int16_t* r, index_t dim, std::uint8_t* packed) {
  const index_t bytes = dim / 2;
  std::fill(packed, packed + q4_query_bytes(dim), std::uint8_t{0});
  for (index_t c = 0; c * kChunkBytes < bytes; ++c, packed += kPackedChunk) {
    float quarter_sums[16] = {};  // exact: multiples of 1/4 below 2^18
    for (index_t b = 0; b < kChunkBytes && c * kChunkBytes + b < bytes; ++b) {
      const index_t at = c * kChunkBytes + b, low_nibble = at / 16 * 32 + at % 16;  // q4.hpp: byte `at` holds these two
      for (const auto& [element, half] : {std::pair{low_nibble, index_t{0}}, std::pair{low_nibble + 16, index_t{1}}}) {
        const int x = r[element];
        packed[half * kChunkBytes + b] = static_cast<std::uint8_t>(static_cast<std::int8_t>(x >> 8));  // h, signed
        packed[(2 + half) * kChunkBytes + b] = static_cast<std::uint8_t>(x & 0xFF);                   // l
        for (int i = 0; i < 4; ++i) quarter_sums[b / 16 * 4 + i] += static_cast<float>(x) / 4;
      }
    }
    std::memcpy(packed + 4 * kChunkBytes, quarter_sums, sizeof quarter_sums);
  }
}

void q4_scores(const std::uint8_t* codes, index_t stride, const float* scales, const float* mins, index_t scale_stride,
               index_t cnt, index_t dim, int rows, const std::uint8_t* const* packed, float* const* s) {
  switch (rows) {
    case 1: return scores_of<1>(codes, stride, scales, mins, scale_stride, cnt, dim, packed, s);
    case 2: return scores_of<2>(codes, stride, scales, mins, scale_stride, cnt, dim, packed, s);
    case 3: return scores_of<3>(codes, stride, scales, mins, scale_stride, cnt, dim, packed, s);
    default: return scores_of<4>(codes, stride, scales, mins, scale_stride, cnt, dim, packed, s);
  }
}

}  // namespace attn::cpu::int8
