// vpdpbusd for the AVX512-VNNI kernels (dot_int8.cpp, dot_q4.cpp), in the target of ATTN_VNNI_TARGET.
#pragma once

#if defined(__GNUC__) && !defined(__clang__)  // GCC 12 on the intrinsics' undefined-value idiom
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include "cpu/int8/dot_int8.hpp"

namespace attn::cpu::int8 {

// acc + the products of a's unsigned and b's signed bytes, four into each int32 lane: what
// _mm512_dpbusd_epi32(acc, a, b) computes. GCC 12 put the intrinsic's accumulators mostly in the
// first 16 vector registers, so a kernel holding more than about a dozen of them (the int8 forward's
// 24) copied them to and from the upper registers and stored them on the stack at every step:
// 2.4x slower on a Zen 5 core (scores of 64 queries by 64 keys, d = 128, one thread: 170 and 440 G
// multiply-adds a second). The instruction written out takes any of the 32 registers.
#define ATTN_VNNI_INLINE ATTN_VNNI_TARGET __attribute__((always_inline)) inline
ATTN_VNNI_INLINE __m512i dpbusd(__m512i acc, __m512i a, __m512i b) {
  __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
  return acc;
}

}  // namespace attn::cpu::int8
