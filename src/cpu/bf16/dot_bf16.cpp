// AVX512-BF16 products (dot_bf16.hpp). Each function that uses the instructions carries the target
// attribute; none is called unless has_avx512_bf16().
#include "cpu/bf16/dot_bf16.hpp"

#include "attn/half.hpp"

// GCC 12 reports the _mm512_undefined_* placeholders inside its own intrinsics as uninitialised.
// (clang, the ThreadSanitizer build's compiler, has no -Wmaybe-uninitialized and warned of it.)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace attn::cpu::bf16 {
namespace {

constexpr index_t kLanes = 64;  // queries of a block: four vectors of 16 float lanes

#define ATTN_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

// The 32-bit word of elements (x[2c], x[2c + 1]) of a row of d elements (the second 0 past d).
inline std::uint32_t pair_of(const std::uint16_t* x, index_t c, index_t d) {
  const std::uint32_t lo = x[2 * c], hi = 2 * c + 1 < d ? x[2 * c + 1] : 0;
  return lo | hi << 16;
}

}  // namespace

bool has_avx512_bf16() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool has = [] {  // asked on every bfloat16 call: CPUID once
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
  }();
  return has;
#else
  return false;
#endif
}

bool dot_pays() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  return has_avx512_bf16() && __builtin_cpu_is("amd");
#else
  return false;
#endif
}

void pack_queries(const std::uint16_t* q, index_t qs, index_t rows, index_t d, std::uint32_t* qp) {
  const index_t pairs = (d + 1) / 2;
  for (index_t c = 0; c < pairs; ++c)
    for (index_t i = 0; i < kLanes; ++i) qp[c * kLanes + i] = i < rows ? pair_of(q + i * qs, c, d) : 0;
}

namespace {

// Scores of K key rows (stride ks) against the block's query pairs, over the first `whole` >= 1
// pairs: s[r][i] for r < K, with the counts known at compile time, so that the K x 4 accumulators
// stay in registers. (With a loop that might run no time, GCC 12 keeps them on the stack at both
// ends: 72 more loads and stores a call.)
template <int K>
ATTN_BF16_TARGET void score_rows(const std::uint16_t* k, index_t ks, index_t whole, const std::uint32_t* qp, float* s) {
  if (whole < 1) __builtin_unreachable();
  __m512 acc[K][4];
  for (int r = 0; r < K; ++r)
    for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_setzero_ps();
  for (index_t c = 0; c < whole; ++c) {
    const std::uint32_t* qc = qp + c * kLanes;
    const __m512bh q0 = (__m512bh)_mm512_loadu_si512(qc), q1 = (__m512bh)_mm512_loadu_si512(qc + 16);
    const __m512bh q2 = (__m512bh)_mm512_loadu_si512(qc + 32), q3 = (__m512bh)_mm512_loadu_si512(qc + 48);
    for (int r = 0; r < K; ++r) {
      std::uint32_t word;
      std::memcpy(&word, k + r * ks + 2 * c, sizeof word);
      const __m512bh kb = (__m512bh)_mm512_set1_epi32(static_cast<int>(word));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], q0, kb);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], q1, kb);
      acc[r][2] = _mm512_dpbf16_ps(acc[r][2], q2, kb);
      acc[r][3] = _mm512_dpbf16_ps(acc[r][3], q3, kb);
    }
  }
  for (int r = 0; r < K; ++r)
    for (int v = 0; v < 4; ++v) _mm512_storeu_ps(s + r * kLanes + 16 * v, acc[r][v]);
}

// An odd d's last pair, element d - 1 alone (its high half 0), added to the scores of cnt key rows:
// s[j][i] += k[j][d - 1] q[i][d - 1] (s starting at 0 when d == 1).
ATTN_BF16_TARGET void score_last_element(const std::uint16_t* k, index_t ks, index_t cnt, index_t d,
                                         const std::uint32_t* qp, float* s) {
  const std::uint32_t* qc = qp + (d / 2) * kLanes;
  for (index_t j = 0; j < cnt; ++j) {
    const __m512bh kb = (__m512bh)_mm512_set1_epi32(k[j * ks + d - 1]);
    for (int v = 0; v < 4; ++v) {
      float* sv = s + j * kLanes + 16 * v;
      const __m512 start = d == 1 ? _mm512_setzero_ps() : _mm512_loadu_ps(sv);
      _mm512_storeu_ps(sv, _mm512_dpbf16_ps(start, (__m512bh)_mm512_loadu_si512(qc + 16 * v), kb));
    }
  }
}

}  // namespace

void scores(const std::uint16_t* k, index_t ks, index_t cnt, index_t d, const std::uint32_t* qp, float* s, bool tiles) {
  if (tiles) {  // A = the key rows in pairs: the rows themselves where d and the stride are even
    const index_t pairs = (d + 1) / 2;
    if (d % 2 == 0 && ks % 2 == 0 && reinterpret_cast<std::uintptr_t>(k) % alignof(std::uint32_t) == 0) {
      tiles::product_bf16(reinterpret_cast<const std::uint32_t*>(k), ks / 2, 1, cnt, pairs, qp, s, false);
    } else {
      thread_local std::vector<std::uint32_t> key_pairs;
      key_pairs.resize(static_cast<std::size_t>(cnt * pairs));
      for (index_t j = 0; j < cnt; ++j)
        for (index_t c = 0; c < pairs; ++c) key_pairs[j * pairs + c] = pair_of(k + j * ks, c, d);
      tiles::product_bf16(key_pairs.data(), pairs, 1, cnt, pairs, qp, s, false);
    }
    return;
  }
  constexpr index_t kKeys = 6;  // 6 keys x 4 query vectors: 24 accumulators, 4 queries, 1 key pair
  const index_t whole = d / 2;  // pairs with both elements
  if (d == 0) std::fill(s, s + cnt * kLanes, 0.0f);  // no element: every score 0 (as the portable path)
  if (whole >= 1) {
    index_t j = 0;
    for (; j + kKeys <= cnt; j += kKeys) score_rows<kKeys>(k + j * ks, ks, whole, qp, s + j * kLanes);
    switch (cnt - j) {
      case 5: score_rows<5>(k + j * ks, ks, whole, qp, s + j * kLanes); break;
      case 4: score_rows<4>(k + j * ks, ks, whole, qp, s + j * kLanes); break;
      case 3: score_rows<3>(k + j * ks, ks, whole, qp, s + j * kLanes); break;
      case 2: score_rows<2>(k + j * ks, ks, whole, qp, s + j * kLanes); break;
      case 1: score_rows<1>(k + j * ks, ks, whole, qp, s + j * kLanes); break;
      default: break;
    }
  }
  if (d % 2 != 0) score_last_element(k, ks, cnt, d, qp, s);
}

namespace {

// The bfloat16 bits of x, rounded to nearest even as vcvtneps2bf16 rounds (NaN quieted).
inline std::uint32_t bf16_bits(float x) { return to_bfloat16(x).bits; }

}  // namespace

ATTN_BF16_TARGET void pack_row_pairs(const float* x, index_t xs, index_t rows, index_t cols, std::uint32_t* out) {
  for (index_t j = 0; j < rows; j += 2) {
    const float* lo = x + j * xs;
    const float* hi = j + 1 < rows ? lo + xs : nullptr;
    std::uint32_t* o = out + (j / 2) * cols;
    index_t c = 0;
    for (; c + 16 <= cols; c += 16) {
      __m512i pair = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(lo + c)));
      if (hi != nullptr)
        pair = _mm512_or_si512(pair, _mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(hi + c))), 16));
      _mm512_storeu_si512(o + c, pair);
    }
    for (; c < cols; ++c) o[c] = bf16_bits(lo[c]) | (hi != nullptr ? bf16_bits(hi[c]) << 16 : 0u);
  }
}

void pack_weights(const float* w, index_t cnt, std::uint32_t* pp) { pack_row_pairs(w, kLanes, cnt, kLanes, pp); }

ATTN_BF16_TARGET void pack_pairs_in_rows(const float* x, index_t xs, index_t rows, index_t cols, std::uint32_t* out) {
  const index_t words = (cols + 1) / 2;
  for (index_t r = 0; r < rows; ++r) {
    const float* row = x + r * xs;
    std::uint32_t* o = out + r * words;
    index_t c = 0;
    for (; c + 32 <= cols; c += 32)  // 32 floats to 32 bfloat16: the lower half from the first 16
      _mm512_storeu_si512(o + c / 2, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(row + c + 16), _mm512_loadu_ps(row + c)));
    for (; c < cols; c += 2) o[c / 2] = bf16_bits(row[c]) | (c + 1 < cols ? bf16_bits(row[c + 1]) << 16 : 0u);
  }
}

namespace {

// K rows of c (+)= A B over `pairs` >= 1 pairs, the K x 4 accumulators in registers (as score_rows).
template <int K>
ATTN_BF16_TARGET void product_rows(const std::uint32_t* a, index_t a_r, index_t a_k, index_t pairs, const std::uint32_t* b,
                                   float* c, bool accumulate) {
  if (pairs < 1) __builtin_unreachable();
  __m512 acc[K][4];
  for (int r = 0; r < K; ++r)
    for (int v = 0; v < 4; ++v) acc[r][v] = accumulate ? _mm512_loadu_ps(c + r * kLanes + 16 * v) : _mm512_setzero_ps();
  for (index_t p = 0; p < pairs; ++p) {
    const std::uint32_t* bp = b + p * kLanes;
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp), b1 = (__m512bh)_mm512_loadu_si512(bp + 16);
    const __m512bh b2 = (__m512bh)_mm512_loadu_si512(bp + 32), b3 = (__m512bh)_mm512_loadu_si512(bp + 48);
    for (int r = 0; r < K; ++r) {
      const __m512bh ab = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[r * a_r + p * a_k]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], b0, ab);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], b1, ab);
      acc[r][2] = _mm512_dpbf16_ps(acc[r][2], b2, ab);
      acc[r][3] = _mm512_dpbf16_ps(acc[r][3], b3, ab);
    }
  }
  for (int r = 0; r < K; ++r)
    for (int v = 0; v < 4; ++v) _mm512_storeu_ps(c + r * kLanes + 16 * v, acc[r][v]);
}

}  // namespace

void products(const std::uint32_t* a, index_t a_r, index_t a_k, index_t rows, index_t pairs, const std::uint32_t* b,
              float* c, bool accumulate, bool tiles) {
  if (tiles) return tiles::product_bf16(a, a_r, a_k, rows, pairs, b, c, accumulate);
  if (pairs == 0) {
    if (!accumulate) std::fill(c, c + rows * kLanes, 0.0f);
    return;
  }
  constexpr index_t kRows = 6;  // 6 rows x 4 lane vectors: 24 accumulators
  index_t r = 0;
  const auto block = [&]<int K>() { product_rows<K>(a + r * a_r, a_r, a_k, pairs, b, c + r * kLanes, accumulate); };
  for (; r + kRows <= rows; r += kRows) block.template operator()<kRows>();
  switch (rows - r) {
    case 5: block.template operator()<5>(); break;
    case 4: block.template operator()<4>(); break;
    case 3: block.template operator()<3>(); break;
    case 2: block.template operator()<2>(); break;
    case 1: block.template operator()<1>(); break;
    default: break;
  }
}

namespace {

inline std::uint32_t bits_of(std::uint16_t x) { return x; }
inline std::uint32_t bits_of(float x) { return bf16_bits(x); }

// out (cols, kLanes / 2) words = the columns of `rows` <= kLanes rows of x (stride xs) in pairs of
// rows: word [c][p] = (x[2p][c], x[2p + 1][c]), zeros past `rows`.
template <class T>
void column_pairs(const T* x, index_t xs, index_t rows, index_t cols, std::uint32_t* out) {
  constexpr index_t kPairs = kLanes / 2;
  for (index_t c = 0; c < cols; ++c)
    for (index_t p = 0; p < kPairs; ++p) {
      const index_t j = 2 * p;
      const std::uint32_t lo = j < rows ? bits_of(x[j * xs + c]) : 0u, hi = j + 1 < rows ? bits_of(x[(j + 1) * xs + c]) : 0u;
      out[c * kPairs + p] = lo | hi << 16;
    }
}

}  // namespace

void pack_column_pairs(const float* x, index_t xs, index_t rows, index_t cols, std::uint32_t* out) {
  column_pairs(x, xs, rows, cols, out);
}

ATTN_BF16_TARGET void pack_values(const std::uint16_t* v, index_t vs, index_t cnt, index_t dv, std::uint32_t* vp,
                                  bool tiles) {
  if (tiles) return column_pairs(v, vs, cnt, dv, vp);  // V^T pairs
  for (index_t j = 0; j < cnt; j += 2) {
    const std::uint16_t* lo = v + j * vs;
    const std::uint16_t* hi = j + 1 < cnt ? lo + vs : nullptr;
    std::uint32_t* out = vp + (j / 2) * dv;
    index_t c = 0;
    // 16 words at a time: the low row's elements zero-extended, the high row's shifted above them.
    for (; c + 16 <= dv; c += 16) {
      __m512i pair = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(lo + c)));
      if (hi != nullptr)
        pair = _mm512_or_si512(
            pair, _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(hi + c))), 16));
      _mm512_storeu_si512(out + c, pair);
    }
    for (; c < dv; ++c)
      out[c] = static_cast<std::uint32_t>(lo[c]) | (hi != nullptr ? static_cast<std::uint32_t>(hi[c]) << 16 : 0u);
  }
}

namespace {

// ot[c][i] = ot[c][i] alpha[i] + sum_j v[j][c] P[j][i] for C value columns, with C known at compile
// time (C x 4 accumulators in registers).
template <int C>
ATTN_BF16_TARGET void accumulate_columns(const std::uint32_t* vp, const std::uint32_t* pp, index_t pairs, index_t dv,
                                         const float* alpha, float* ot) {
  __m512 scale[4], acc[C][4];
  for (int v = 0; v < 4; ++v) scale[v] = _mm512_loadu_ps(alpha + 16 * v);
  for (int r = 0; r < C; ++r)
    for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_mul_ps(_mm512_loadu_ps(ot + r * kLanes + 16 * v), scale[v]);
  if (pairs < 1) __builtin_unreachable();  // a tile has a key (see score_rows)
  for (index_t j = 0; j < pairs; ++j) {
    const std::uint32_t* pj = pp + j * kLanes;
    const __m512bh p0 = (__m512bh)_mm512_loadu_si512(pj), p1 = (__m512bh)_mm512_loadu_si512(pj + 16);
    const __m512bh p2 = (__m512bh)_mm512_loadu_si512(pj + 32), p3 = (__m512bh)_mm512_loadu_si512(pj + 48);
    for (int r = 0; r < C; ++r) {
      const __m512bh vb = (__m512bh)_mm512_set1_epi32(static_cast<int>(vp[j * dv + r]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], p0, vb);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], p1, vb);
      acc[r][2] = _mm512_dpbf16_ps(acc[r][2], p2, vb);
      acc[r][3] = _mm512_dpbf16_ps(acc[r][3], p3, vb);
    }
  }
  for (int r = 0; r < C; ++r)
    for (int v = 0; v < 4; ++v) _mm512_storeu_ps(ot + r * kLanes + 16 * v, acc[r][v]);
}

}  // namespace

namespace {

// ot[c][i] *= alpha[i] for dv rows of 64, unless every alpha is 1 (a row's running maximum unmoved).
ATTN_BF16_TARGET void rescale_rows(const float* alpha, index_t dv, float* ot) {
  __m512 scale[4];
  __mmask16 moved = 0;
  for (int v = 0; v < 4; ++v) {
    scale[v] = _mm512_loadu_ps(alpha + 16 * v);
    moved |= _mm512_cmp_ps_mask(scale[v], _mm512_set1_ps(1.0f), _CMP_NEQ_UQ);
  }
  if (moved == 0) return;
  for (index_t c = 0; c < dv; ++c)
    for (int v = 0; v < 4; ++v) {
      float* o = ot + c * kLanes + 16 * v;
      _mm512_storeu_ps(o, _mm512_mul_ps(_mm512_loadu_ps(o), scale[v]));
    }
}

}  // namespace

void accumulate(const std::uint32_t* vp, const std::uint32_t* pp, index_t cnt, index_t dv, const float* alpha, float* ot,
                bool tiles) {
  const index_t pairs = (cnt + 1) / 2;
  if (tiles) {  // ot = ot alpha, then ot += V^T P^T (A: the V^T pairs, a row of kLanes / 2 words a value column)
    rescale_rows(alpha, dv, ot);
    tiles::product_bf16(vp, kLanes / 2, 1, dv, pairs, pp, ot, true);
    return;
  }
  constexpr index_t kCols = 6;  // 6 value columns x 4 query vectors: 24 accumulators
  index_t c = 0;
  for (; c + kCols <= dv; c += kCols) accumulate_columns<kCols>(vp + c, pp, pairs, dv, alpha, ot + c * kLanes);
  switch (dv - c) {
    case 5: accumulate_columns<5>(vp + c, pp, pairs, dv, alpha, ot + c * kLanes); break;
    case 4: accumulate_columns<4>(vp + c, pp, pairs, dv, alpha, ot + c * kLanes); break;
    case 3: accumulate_columns<3>(vp + c, pp, pairs, dv, alpha, ot + c * kLanes); break;
    case 2: accumulate_columns<2>(vp + c, pp, pairs, dv, alpha, ot + c * kLanes); break;
    case 1: accumulate_columns<1>(vp + c, pp, pairs, dv, alpha, ot + c * kLanes); break;
    default: break;
  }
}

}  // namespace attn::cpu::bf16

namespace attn {

// The public questions of attn/config.hpp about the kernel, answered here, where the CPU is known.
bool bf16_kernel_available() { return cpu::bf16::has_avx512_bf16(); }
bool bf16_tiles_available() { return cpu::bf16::has_avx512_bf16() && cpu::tiles::bf16_available(); }
bool bf16_kernel_pays() { return cpu::bf16::dot_pays() || bf16_tiles_available(); }
bool bf16_kernel_chosen() { return cpu::bf16::dot_chosen(bf16_kernel()); }

cpu::bf16::Unit cpu::bf16::unit_chosen(Bf16Kernel choice) {
  const bool vectors = has_avx512_bf16(), tiles = bf16_tiles_available();
  switch (choice) {
    case Bf16Kernel::off: return Unit::none;
    case Bf16Kernel::on: return vectors ? Unit::vectors : Unit::none;
    case Bf16Kernel::tiles: return tiles ? Unit::tiles : Unit::none;
    case Bf16Kernel::automatic: break;
  }
  return tiles ? Unit::tiles : vectors && dot_pays() ? Unit::vectors : Unit::none;
}

}  // namespace attn
