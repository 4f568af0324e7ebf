// AVX512-VNNI products (dot_int8.hpp). Each function that uses the instructions carries the target
// attribute; none is called unless has_avx512_vnni().
#include "cpu/int8/dot_int8.hpp"

#include "attn/config.hpp"
#include "cpu/int8/vnni.hpp"
#include "cpu/tiles/tiles.hpp"

#include <cstring>
#include <vector>

namespace attn::cpu::int8 {
namespace {

constexpr index_t kLanes = 64;  // queries of a block: four vectors of 16 int32 lanes

// A key's scores for 16 queries from their int32 sums (each already less 128 times the key's byte
// sum): converted, times the query's scale times the key's, plus the query's mean term. Both units
// end here, so that their scores are the same floats.
ATTN_VNNI_TARGET inline __m512 score_of(__m512i acc, __m512 q_scale, __m512 q_mean, float k_scale) {
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_mul_ps(q_scale, _mm512_set1_ps(k_scale)), q_mean);
}

// Scores of K key rows (stride ks) against the block's query quads over `quads` >= 1 words, with
// the counts known at compile time so that the K x 4 accumulators stay in registers (as the
// bfloat16 kernel's score_rows): each starts at -128 times its key's byte sum, the unsigned
// queries' correction, and ends converted and scaled to float.
template <int K>
ATTN_VNNI_TARGET void score_rows(const std::int8_t* k, index_t ks, const std::int32_t* k_sum, const float* k_scale,
                                 index_t quads, const std::uint32_t* qp, const float* q_scale, const float* q_mean,
                                 float* s) {
  if (quads < 1) __builtin_unreachable();
  __m512i acc[K][4];
  for (int r = 0; r < K; ++r)
    for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_set1_epi32(-128 * k_sum[r]);
  for (index_t c = 0; c < quads; ++c) {
    const std::uint32_t* qc = qp + c * kLanes;
    const __m512i q0 = _mm512_loadu_si512(qc), q1 = _mm512_loadu_si512(qc + 16);
    const __m512i q2 = _mm512_loadu_si512(qc + 32), q3 = _mm512_loadu_si512(qc + 48);
    for (int r = 0; r < K; ++r) {
      std::int32_t word;
      std::memcpy(&word, k + r * ks + 4 * c, sizeof word);
      const __m512i kb = _mm512_set1_epi32(word);
      acc[r][0] = dpbusd(acc[r][0], q0, kb);
      acc[r][1] = dpbusd(acc[r][1], q1, kb);
      acc[r][2] = dpbusd(acc[r][2], q2, kb);
      acc[r][3] = dpbusd(acc[r][3], q3, kb);
    }
  }
  for (int v = 0; v < 4; ++v) {
    const __m512 qs = _mm512_loadu_ps(q_scale + 16 * v), qm = _mm512_loadu_ps(q_mean + 16 * v);
    for (int r = 0; r < K; ++r) _mm512_storeu_ps(s + r * kLanes + 16 * v, score_of(acc[r][v], qs, qm, k_scale[r]));
  }
}

}  // namespace

bool has_avx512_vnni() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool has = [] {  // asked on every int8 call: CPUID once
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vnni");
  }();
  return has;
#else
  return false;
#endif
}

void pack_queries(const std::int8_t* q8, index_t qs, index_t rows, index_t d4, std::uint32_t* qp) {
  for (index_t c = 0; c < d4 / 4; ++c)
    for (index_t i = 0; i < kLanes; ++i) {
      std::uint32_t word = 0;
      if (i < rows) {
        std::memcpy(&word, q8 + i * qs + 4 * c, sizeof word);
        word ^= 0x80808080u;  // each byte + 128: signed to unsigned
      }
      qp[c * kLanes + i] = word;
    }
}

namespace {

// s (cnt, 64) from the tiles' sums (cnt, 64) of the unsigned queries: each less 128 times its key's
// byte sum, then score_of, as score_rows ends.
ATTN_VNNI_TARGET void scale_sums(const std::int32_t* sums, const std::int32_t* k_sum, const float* k_scale, index_t cnt,
                                 const float* q_scale, const float* q_mean, float* s) {
  for (int v = 0; v < 4; ++v) {
    const __m512 qs = _mm512_loadu_ps(q_scale + 16 * v), qm = _mm512_loadu_ps(q_mean + 16 * v);
    for (index_t r = 0; r < cnt; ++r) {
      const __m512i acc = _mm512_sub_epi32(_mm512_loadu_si512(sums + r * kLanes + 16 * v), _mm512_set1_epi32(128 * k_sum[r]));
      _mm512_storeu_ps(s + r * kLanes + 16 * v, score_of(acc, qs, qm, k_scale[r]));
    }
  }
}

}  // namespace

bool scores_on_tiles(Bf16Kernel choice) { return choice != Bf16Kernel::on && tiles::int8_available(); }

void scores(const std::int8_t* k8, index_t ks, const std::int32_t* k_sum, const float* k_scale, index_t cnt,
            index_t d4, const std::uint32_t* qp, const float* q_scale, const float* q_mean, float* s, bool on_tiles) {
  constexpr index_t kKeys = 6;  // 6 keys x 4 query vectors: 24 accumulators, 4 queries, 1 key word
  const index_t quads = d4 / 4;
  if (quads == 0) {  // d == 0: every product 0, the scores q_mean
    for (index_t j = 0; j < cnt; ++j) std::memcpy(s + j * kLanes, q_mean, sizeof(float) * kLanes);
    return;
  }
  if (on_tiles) {
    thread_local std::vector<std::int32_t> sums;
    sums.resize(static_cast<std::size_t>(cnt * kLanes));
    tiles::product_int8(k8, ks, cnt, quads, qp, sums.data());
    scale_sums(sums.data(), k_sum, k_scale, cnt, q_scale, q_mean, s);
    return;
  }
  index_t j = 0;
  const auto rows = [&]<int K>() { score_rows<K>(k8 + j * ks, ks, k_sum + j, k_scale + j, quads, qp, q_scale, q_mean, s + j * kLanes); };
  for (; j + kKeys <= cnt; j += kKeys) rows.template operator()<kKeys>();
  switch (cnt - j) {
    case 5: rows.template operator()<5>(); break;
    case 4: rows.template operator()<4>(); break;
    case 3: rows.template operator()<3>(); break;
    case 2: rows.template operator()<2>(); break;
    case 1: rows.template operator()<1>(); break;
    default: break;
  }
}

}  // namespace attn::cpu::int8

namespace attn {

// attn/config.hpp's question about the kernel, answered here, where the CPU is known.
bool int8_kernel_available() { return cpu::int8::has_avx512_vnni(); }

}  // namespace attn
