// The run-time switches one call runs under (attn/config.hpp: backend, SIMD target, bfloat16 kernel,
// threads), read once, on the calling thread, at the API boundary (src/api) into the call's plan
// (MaskPlan::switches, and SdpaPlan through its mask) and handed down, so a set_backend or
// set_simd_target on another thread cannot split one call between two settings. The attention,
// masked softmax and additive kernels take them from the plan; the Nadaraya-Watson kernels, the KV
// cache's decode dispatch and the SIMD helpers of the unfused passes (matmul_abt, simd_tanh,
// simd_exp_weight) still read the backend or the target themselves, each once per call.
#pragma once

#include <cstdint>

#include "attn/config.hpp"

namespace attn::detail {

struct Switches {
  Backend backend = Backend::cpu;
  // The SIMD target's Highway bit; 0 for the default target (ATTN_SIMD_TARGET's, else the best),
  // which cpu::simd::target_of resolves.
  std::int64_t simd_bit = 0;
  // The bfloat16 kernel's setting; whether it runs also depends on the CPU (cpu::bf16::dot_chosen).
  Bf16Kernel bf16 = Bf16Kernel::automatic;
  // OpenMP threads of the calling thread (set_num_threads).
  int threads = 1;
};

// The calling thread's switches now: its ScopedBackend and ScopedSimdTarget over the process's
// settings, or, inside a PinSwitches scope, the pinned ones.
Switches read_switches();

// For the lifetime of a scope, read_switches() on the calling thread returns `s`: an API call made
// of other API calls (a 16-bit call widening into a float32 one, a backward recomputing its forward
// through the public call) pins what it read, so its parts run on one setting. Scopes nest; an
// inner pin of an already pinned thread keeps the outer one.
class PinSwitches {
 public:
  explicit PinSwitches(const Switches& s);
  ~PinSwitches();
  PinSwitches(const PinSwitches&) = delete;
  PinSwitches& operator=(const PinSwitches&) = delete;

 private:
  const Switches* saved_;
  Switches own_;
};

// The storage of the SIMD target switch; cpu/simd/targets.cpp names, checks and resolves the bits.
void set_process_simd_bit(std::int64_t bit);  // set_simd_target
std::int64_t thread_simd_override();           // ScopedSimdTarget's bit, 0 for none
void set_thread_simd_override(std::int64_t bit);
// The calling thread's SIMD bit: its ScopedSimdTarget's, else the process's (0: the default).
std::int64_t simd_bit_now();

}  // namespace attn::detail
