// The decode's scores over 4-bit keys (cpu/quant/q4.hpp's layout, the "int4" cache) in integers, by
// AVX512-VNNI's vpdpbusd: the query rounded to 16 bits (quant::round_query: q ~ r sigma), each r
// split into bytes, r = 256 h + l (h signed, l in [0, 255]), so that each code c in [0, 15] meets
// them in two byte products, both exact:
//   sum_c r_c code_c = 256 sum_c h_c code_c + sum_c l_c code_c,
// vpdpbusd adding four products of unsigned and signed bytes into each of 16 int32 lanes (the codes
// enter as the unsigned operand against h, as the signed one against l). A group of 32 codes sums
// to at most 32 x 32767 x 15 < 2^24, exact in float. A key row's score without sigma is
//   sum_g scale_g sum_{c in g} r_c code_c + min_g sum_{c in g} r_c
// (q . k = sigma times it, k_c = code_c scale_g + min_g as the cache reads it). Against the float
// path's dequantizing FMAs (the codes picking their values from a table of the group's 16), a row
// of 128 codes takes 14 vector instructions instead of 36. Highway 1.0.3 does not emit vpdpbusd:
// these functions carry their own target attribute and run only where has_avx512_vnni() and the
// chosen SIMD target is AVX-512 (the caller, simd/sdpa_decode.cpp, decides); elsewhere the decode
// computes the same scores with float products over the rounded query.
#pragma once

#include <cstdint>

#include "attn/tensor.hpp"

namespace attn::cpu::int8 {

// Bytes of a query packed for q4_scores, for rows of dim codes (a multiple of 32): per 64 bytes of a
// row's codes (four groups; the last chunk may hold fewer), the bytes h and l of the query elements
// that meet the low and the high nibbles (64 each, zero past the row), and 16 floats, lane 4 g + i
// holding a quarter of group g's sum of r.
index_t q4_query_bytes(index_t dim);

// packed = the query r (dim int16, rounded as quant::round_query) in q4_scores' layout.
void q4_pack_query(const std::int16_t* r, index_t dim, std::uint8_t* packed);

// s[r][j] = sum_g scales_j[g] sum_{c in g} r_c code_jc + mins_j[g] sum_{c in g} r_c for `rows` (1 to 4)
// queries, packed[r] each, over the cnt rows of codes (row j at codes + j * stride bytes, dim / 2
// bytes), scales_j = scales + j * scale_stride (dim / 32 floats, and mins alike): each key row read
// once for all of them, and each query's scores the same bits for any `rows`. Only where
// has_avx512_vnni().
void q4_scores(const std::uint8_t* codes, index_t stride, const float* scales, const float* mins, index_t scale_stride,
               index_t cnt, index_t dim, int rows, const std::uint8_t* const* packed, float* const* s);

}  // namespace attn::cpu::int8
