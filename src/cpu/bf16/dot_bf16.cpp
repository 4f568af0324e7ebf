// AVX512-BF16 products (dot_bf16.hpp). Each function that uses the instructions carries the target
// attribute; none is called unless has_avx512_bf16().
#include "cpu/bf16/dot_bf16.hpp"

// GCC 12 reports the _mm512_undefined_* placeholders inside its own intrinsics as uninitialised.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstring>

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

ATTN_BF16_TARGET void scores(const std::uint16_t* k, index_t ks, index_t cnt, index_t d, const std::uint32_t* qp,
                             float* s) {
  const index_t pairs = (d + 1) / 2;
  constexpr index_t kKeys = 6;  // 6 keys x 4 query vectors: 24 accumulators, 4 queries, 1 key pair
  for (index_t j = 0; j < cnt; j += kKeys) {
    const index_t nk = std::min(kKeys, cnt - j);
    __m512 acc[kKeys][4];
    for (index_t r = 0; r < kKeys; ++r)
      for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_setzero_ps();
    for (index_t c = 0; c < pairs; ++c) {
      const std::uint32_t* qc = qp + c * kLanes;
      const __m512bh q0 = (__m512bh)_mm512_loadu_si512(qc), q1 = (__m512bh)_mm512_loadu_si512(qc + 16);
      const __m512bh q2 = (__m512bh)_mm512_loadu_si512(qc + 32), q3 = (__m512bh)_mm512_loadu_si512(qc + 48);
      const bool last_odd = 2 * c + 1 >= d;
      for (index_t r = 0; r < nk; ++r) {
        std::uint32_t word;
        if (last_odd) {
          word = k[(j + r) * ks + 2 * c];
        } else {
          std::memcpy(&word, k + (j + r) * ks + 2 * c, sizeof word);
        }
        const __m512bh kb = (__m512bh)_mm512_set1_epi32(static_cast<int>(word));
        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], q0, kb);
        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], q1, kb);
        acc[r][2] = _mm512_dpbf16_ps(acc[r][2], q2, kb);
        acc[r][3] = _mm512_dpbf16_ps(acc[r][3], q3, kb);
      }
    }
    for (index_t r = 0; r < nk; ++r)
      for (int v = 0; v < 4; ++v) _mm512_storeu_ps(s + (j + r) * kLanes + 16 * v, acc[r][v]);
  }
}

ATTN_BF16_TARGET void pack_weights(const float* w, index_t cnt, std::uint32_t* pp) {
  for (index_t j = 0; j < cnt; j += 2) {
    const float* lo = w + j * kLanes;
    for (int v = 0; v < 4; ++v) {
      const __m512i a = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(lo + 16 * v)));
      __m512i pair = a;
      if (j + 1 < cnt) {
        const __m512i b = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(lo + kLanes + 16 * v)));
        pair = _mm512_or_si512(a, _mm512_slli_epi32(b, 16));
      }
      _mm512_storeu_si512(pp + (j / 2) * kLanes + 16 * v, pair);
    }
  }
}

void pack_values(const std::uint16_t* v, index_t vs, index_t cnt, index_t dv, std::uint32_t* vp) {
  for (index_t j = 0; j < cnt; j += 2) {
    const std::uint16_t* lo = v + j * vs;
    const std::uint16_t* hi = j + 1 < cnt ? lo + vs : nullptr;
    std::uint32_t* out = vp + (j / 2) * dv;
    for (index_t c = 0; c < dv; ++c) out[c] = static_cast<std::uint32_t>(lo[c]) | (hi != nullptr ? static_cast<std::uint32_t>(hi[c]) << 16 : 0u);
  }
}

ATTN_BF16_TARGET void accumulate(const std::uint32_t* vp, const std::uint32_t* pp, index_t cnt, index_t dv, float* ot) {
  const index_t pairs = (cnt + 1) / 2;
  constexpr index_t kCols = 6;  // 6 value columns x 4 query vectors: 24 accumulators
  for (index_t c = 0; c < dv; c += kCols) {
    const index_t nc = std::min(kCols, dv - c);
    __m512 acc[kCols][4];
    for (index_t r = 0; r < nc; ++r)
      for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_loadu_ps(ot + (c + r) * kLanes + 16 * v);
    for (index_t j = 0; j < pairs; ++j) {
      const std::uint32_t* pj = pp + j * kLanes;
      const __m512bh p0 = (__m512bh)_mm512_loadu_si512(pj), p1 = (__m512bh)_mm512_loadu_si512(pj + 16);
      const __m512bh p2 = (__m512bh)_mm512_loadu_si512(pj + 32), p3 = (__m512bh)_mm512_loadu_si512(pj + 48);
      for (index_t r = 0; r < nc; ++r) {
        const __m512bh vb = (__m512bh)_mm512_set1_epi32(static_cast<int>(vp[j * dv + c + r]));
        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], p0, vb);
        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], p1, vb);
        acc[r][2] = _mm512_dpbf16_ps(acc[r][2], p2, vb);
        acc[r][3] = _mm512_dpbf16_ps(acc[r][3], p3, vb);
      }
    }
    for (index_t r = 0; r < nc; ++r)
      for (int v = 0; v < 4; ++v) _mm512_storeu_ps(ot + (c + r) * kLanes + 16 * v, acc[r][v]);
  }
}

}  // namespace attn::cpu::bf16
