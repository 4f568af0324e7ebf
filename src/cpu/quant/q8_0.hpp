// The int8 formats of the KV cache (attn/kv_cache.hpp states the rules users see): ggml's q8_0 for
// stored keys and values, and the 16-bit rounding of a query that meets int8 keys. Pack, unpack and
// the query's rounding live here; the int8 dot products that consume them are the decode path's
// (cpu/simd/sdpa_decode.cpp: DotScaledLanes, DotRoundedLanes). Tested by tests/test_quant.cpp
// against float64 formulas.
#pragma once

#include <cstdint>

#include "attn/tensor.hpp"

namespace attn::cpu::simd {
struct Target;
}

namespace attn::cpu::quant {

// q8_0: each block of kQ8Block consecutive values shares one float32 scale.
inline constexpr index_t kQ8Block = 32;

// The number of scales for `count` values: one per block, the last one possibly partial.
constexpr index_t q8_0_blocks(index_t count) { return (count + kQ8Block - 1) / kQ8Block; }

// Packs x[0, count) (count >= 0) into q[0, count) and scales[0, q8_0_blocks(count)). Block g covers
// x[32 g, min(32 g + 32, count)): scale s = max|x| / 127 in float32, q = round(x / s) to nearest even
// (|q| <= 127), or s = 0 and q = 0 for a block of zeros; where 127 s would overflow (max|x| within
// about 2^-24 of float32's largest value), s is the next float below, so that every value
// dequantises to a finite one. Dequantised, each value is within s / 2 of x, up to float32's
// rounding of s and of x / s (kv_cache.hpp gives the bound). The values are
// meant to be finite (the KV cache refuses others when they are appended); were one not, a NaN is
// stored as 0 and leaves the scale alone, and an infinity makes the scale infinite and every q of
// its block 0 (so the block dequantises to NaN), never undefined behaviour.
void q8_0_pack(const float* x, index_t count, std::int8_t* q, float* scales);

// x[c] = q[c] * scales[c / 32] for c in [0, count): the values q8_0_pack stored.
void q8_0_unpack(const std::int8_t* q, const float* scales, index_t count, float* x);

// A float query row of d elements (a multiple of 32) rounded for int8 keys: r = round(q / sigma) to
// nearest even with sigma = max|q| / 32767, returning sigma (so |r| <= 32767). Returns 0, leaving r
// untouched, where the row is used as given: its largest magnitude is below 2^-100, or some element
// is not finite. The decode path and the prompt path of the KV cache both round through it; every
// SIMD target rounds alike (round_query.cpp, compiled once per target).
float round_query(simd::Target target, const float* q, index_t d, std::int16_t* r);

// The query row as int8 keys meet it: out = r sigma from round_query, or q where it returns 0.
// r is scratch of d elements.
void rounded_query(simd::Target target, const float* q, index_t d, std::int16_t* r, float* out);

}  // namespace attn::cpu::quant
