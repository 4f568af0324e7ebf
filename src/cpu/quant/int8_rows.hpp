// The int8 forward's quantization (SageAttention's scheme, per row: a block of one token): each
// query row, and each key row less the keys' mean, to signed bytes with one float32 scale a row.
// Compiled once per SIMD target; every target gives the same bits. Tested by
// tests/test_sdpa_int8.cpp against float64 formulas.
#pragma once

#include <cstdint>

#include "attn/tensor.hpp"

namespace attn::cpu::simd {
struct Target;
}

namespace attn::cpu::quant {

// Bytes of a quantized row of d elements: d rounded up to a multiple of 4 (the int8 products take
// four bytes a step), zeros past d.
constexpr index_t int8_row_bytes(index_t d) { return (d + 3) / 4 * 4; }

// q[0, int8_row_bytes(d)) = y in units of the returned scale, y[c] = (x[c] - center[c]) factor[c]
// computed in double (center nullptr: 0): s = max_c |y[c]| / 127 rounded to
// float32, q[c] = round(y[c] / s) to nearest even, |q| <= 127, zeros past d; dequantised, q[c] s is
// within s / 2 of y[c] up to float32's rounding of s. A row of zeros (or whose largest |y| is
// below 127 times float's smallest subnormal) gets s = 0 and q = 0. *byte_sum = sum_c q[c].
// Returns NaN, and leaves q unspecified, when some y[c] is not finite: the caller refuses the call.
float quantize_row(simd::Target target, const float* x, const float* center, const double* factor, index_t d,
                   std::int8_t* q, std::int32_t* byte_sum);

// The statistics the channel balance needs, over `rows` rows of w elements (row stride `stride`), in
// row order: sum[c] += x[c] in double, returning the first row that holds a value that is not
// finite (or -1); and top[c] = max(top[c], |x[c] - center[c]|) in double (center nullptr: 0).
index_t sum_rows(simd::Target target, const float* x, index_t stride, index_t rows, index_t w, double* sum);
void top_of_rows(simd::Target target, const float* x, index_t stride, index_t rows, index_t w, const float* center,
                 double* top);

// The channel factors that balance queries and keys before they are quantized (SmoothQuant's
// migration, alpha = 1/2): given per channel the largest |k - mean| over a key head's keys and the
// largest |q| over the queries that read them, lambda[c] = sqrt(key_top[c] / query_top[c]) (1 where
// either is 0); keys are quantized as (k - mean) / lambda and queries as q lambda, whose products are
// those of q and k - mean. A key channel 30 times the others' spread no longer sets every key row's
// scale alone: each side then spans sqrt(key_top query_top) in that channel.
void balance_channels(const double* key_top, const double* query_top, index_t d, double* lambda);

}  // namespace attn::cpu::quant
