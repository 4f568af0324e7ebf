// A catalogue of mixed calls, one per kernel family and path, for the tests of what attn promises
// under load: determinism (test_determinism.cpp) and concurrent callers (test_concurrency.cpp).
// Each call computes from fixed inputs (made once, shared read-only by every thread that runs it)
// and returns every output and gradient it computed, as float64 values (a float32, bfloat16 or
// float16 result converts exactly, so equal values mean equal bits, NaN aside).
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace attn::testing {

struct MixedCall {
  std::string name;
  // The largest difference |a - b| / (1 + |b|) two SIMD targets' results may show: the call's
  // precision (float64, float32, a 16-bit type, int8 keys and values).
  double target_tolerance;
  std::function<std::vector<double>()> run;
};

// The SDPA forward and backward (float32 and float64, fused and decode paths, every mask kind,
// GQA, dropout, the unfused path with weights), bfloat16 and float16 SDPA (the AVX512-BF16 kernel
// where the CPU has it), additive and bilinear attention, flex attention (score_mod and mask_mod),
// Nadaraya-Watson, masked softmax, bmm and KV cache attend (int8 and bfloat16 storage).
const std::vector<MixedCall>& mixed_calls();

}  // namespace attn::testing
