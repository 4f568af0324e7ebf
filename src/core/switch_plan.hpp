// The run-time switches one call runs under (attn/config.hpp: backend, SIMD target, bfloat16 kernel),
// read once, on the calling thread, at the API boundary (src/api): into the call's plan where it has
// one (MaskPlan::switches, and SdpaPlan through its mask), and pinned on the calling thread while its
// kernels run (ATTN_DISPATCH_ON in api/checks.hpp), so that every later read of a switch in the call
// (read_switches, cpu::simd::current) gives the same reading and a set_backend or set_simd_target on
// another thread cannot split one call between two settings. The thread count is not among them: it
// is the calling thread's own OpenMP setting (set_num_threads), which no other thread changes.
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
  // Not a user's switch: set by the bfloat16 backward for the float32 call it makes on its tensors
  // widened (exactly), so that the fused backward may take the bfloat16 kernel's products.
  bool bf16_values = false;
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
// The calling thread's SIMD bit: the pinned one inside a PinSwitches scope, else its
// ScopedSimdTarget's, else the process's (0: the default).
std::int64_t simd_bit_now();

}  // namespace attn::detail
