// The AVX512-VNNI products of the int8 SDPA forward (simd/sdpa_forward.cpp, ForwardBlockInt8):
// vpdpbusd multiplies 64 pairs of unsigned and signed bytes and adds each four into 16 int32 lanes
// (acc[i] += a[4i] b[4i] + ... + a[4i+3] b[4i+3]), four times float32 FMA's multiplies per
// instruction. Highway 1.0.3 does not emit it: these functions carry their own target attribute and
// are called only when the CPU has AVX512-VNNI (has_avx512_vnni, a CPUID check) and the chosen SIMD
// target is AVX-512. The portable path (simd/int8_scores-inl.h) computes the same int32 sums with
// 16-bit products on every target, so both give the same scores, bit for bit.
//
// The quantized rows (cpu/quant/int8_rows.hpp): signed bytes q8, k8 with |x| <= 127, d4 = d rounded
// up to a multiple of 4 bytes a row (zeros past d). vpdpbusd takes one operand unsigned, so the
// queries enter as q8 + 128 and each key row's sum of bytes corrects it:
//   sum_c (q8[c] + 128) k8[c] - 128 sum_c k8[c] = sum_c q8[c] k8[c]    (exact in int32 for d <= 65536).
// Layout of a block of kBlockQ = 64 queries, as 32-bit words of four bytes:
//   q quads (d4 / 4, 64):  word [c][i] = bytes q8[i][4c .. 4c + 3] + 128, zeros past the block's rows
#pragma once

#include <cstdint>

#include "attn/config.hpp"
#include "attn/tensor.hpp"

// The target attribute of the functions that use AVX512-VNNI (here and in dot_q4.cpp): none runs
// unless has_avx512_vnni().
#define ATTN_VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

namespace attn::cpu::int8 {

// Whether this CPU runs AVX512-VNNI (and the AVX-512 it builds on).
bool has_avx512_vnni();

// qp = the q quads of `rows` quantized query rows (row stride qs bytes) of d4 bytes.
void pack_queries(const std::int8_t* q8, index_t qs, index_t rows, index_t d4, std::uint32_t* qp);

// s (cnt, 64): s[j][i] = (sum_c q8[i][c] k8[j][c]) q_scale[i] k_scale[j] + q_mean[i], for cnt key rows
// (stride ks bytes) of d4 bytes whose byte sums are k_sum[0, cnt). tiles: the sums by AMX-INT8's
// tdpbsud (tiles/tiles.hpp; inside a tiles::Scope), the same integers as vpdpbusd's, so the same
// scores bit for bit.
void scores(const std::int8_t* k8, index_t ks, const std::int32_t* k_sum, const float* k_scale, index_t cnt,
            index_t d4, const std::uint32_t* qp, const float* q_scale, const float* q_mean, float* s, bool tiles);

// Whether the int8 forward's Q K^T runs on AMX-INT8 tiles under the bfloat16 kernel's setting
// `choice`: where the CPU has them, unless the setting asks for the vectors (Bf16Kernel::on, for
// testing and comparing).
bool scores_on_tiles(Bf16Kernel choice);

}  // namespace attn::cpu::int8
