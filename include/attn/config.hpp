// Run-time switches: which implementation runs, and how many threads it may use.
//
// Threads. Every switch may be read and set from any thread while other threads compute: each call
// of an op reads the switches once, on the calling thread, when it starts, and runs on what it read
// to the end, on all of its OpenMP threads. A call's result depends only on its arguments and the
// switches it read (tests/test_concurrency.cpp: 16 threads calling at once give bit-identical results
// to the same calls made one by one). Three levels:
//   - set_backend, set_simd_target, set_bf16_kernel: the process's setting;
//   - ScopedBackend and ScopedSimdTarget: the calling thread's own setting for a scope, over the
//     process's (other threads do not see it): a caller that needs one setting for its calls does
//     not race with threads that need another;
//   - set_num_threads is the calling thread's (OpenMP's nthreads-var is per thread): a thread that
//     never set it uses the default; ScopedThreads sets it for a scope.
#pragma once

#include <string>
#include <vector>

namespace attn {

// cpu: the production kernels (src/cpu). reference: the plain kernels written straight from the
// formulas (src/ref), single-threaded, the oracle of the tests. unfused: a diagnostic, not for
// production and not stable (attn/diagnostics.hpp): the cpu backend without its fused kernels, the
// baseline `attn bench` measures them against. The environment variable ATTN_BACKEND=reference (or
// unfused) selects one at start-up, like ggml's switch that forces the reference path.
enum class Backend { cpu, reference, unfused };

/// The process's backend (a ScopedBackend overrides it on one thread); backend() is the calling thread's.
void set_backend(Backend backend);
Backend backend();

// Threads the cpu backend uses for the calling thread's calls (OpenMP). 0 restores the default
// (OMP_NUM_THREADS or all cores). Results never depend on it: dropout masks are keyed by position,
// reductions by row.
void set_num_threads(int threads);
int num_threads();

// The instruction sets the cpu backend's fused kernels were compiled for and this CPU runs, best
// first, by lower-case name: "avx3" (AVX-512), "avx2", "sse4", "scalar" (portable, no SIMD
// instructions needed). The best is used unless set_simd_target (or, at start-up, the environment
// variable ATTN_SIMD_TARGET) picks another, for testing every target and comparing them.
std::vector<std::string> simd_targets();
std::string simd_target();
// name: one of simd_targets(), or "" for the best. Throws attn::Error for any other name. Safe to
// call while other threads compute: each call of an op reads the target once, when it starts, and
// runs on it to the end, on all of its threads. simd_target() is the calling thread's: its
// ScopedSimdTarget's, else the process's.
void set_simd_target(const std::string& name);

// Which targets actually ran: simd_targets_ran, in attn/diagnostics.hpp.

// The bfloat16 kernel of bfloat16 attention (Q K^T and P V, and the backward's products, in
// bfloat16 pairs summed in float, P and dS rounded to bfloat16 as FlashAttention does in 16-bit), on
// one of two units: AVX512-BF16's vdpbf16ps on vectors, or Intel AMX's tdpbf16ps on tiles (AMX-BF16:
// Sapphire Rapids and later Xeons). Available when the CPU has AVX512-BF16, and run only on the
// "avx3" SIMD target. automatic (the default) takes the tiles where the CPU has them, else the
// vectors where they pay: on AMD's AVX512-BF16 cores (Zen 4 and 5), where vdpbf16ps runs at about
// twice float32 FMA's rate (on Intel's, without the tiles, the portable path, widened to float32, was
// measured faster: cpu/bf16/dot_bf16.hpp). on (the vectors), tiles and off force the choice, for
// testing and comparing; on or tiles where the CPU lacks the unit run the portable path.
enum class Bf16Kernel { automatic, on, off, tiles };
bool bf16_kernel_available();
// Whether the CPU has AMX-BF16 and the operating system lets the process use its tiles.
bool bf16_tiles_available();
bool bf16_kernel_pays();
void set_bf16_kernel(Bf16Kernel choice);
Bf16Kernel bf16_kernel();
// Whether a bfloat16 forward on this thread's settings now would run the kernel (not the target).
bool bf16_kernel_chosen();
// Whether the int8 forward (sdpa_forward_int8, attn/sdpa.hpp) computes Q K^T by vpdpbusd: the CPU has
// AVX512-VNNI, used on the "avx3" target; elsewhere its portable 16-bit products give the same sums.
// Its P V goes through the AVX512-BF16 kernel where bf16_kernel_chosen().
bool int8_kernel_available();

// The calling thread's backend for the lifetime of a scope (other threads keep theirs); the previous
// one after it. Scopes nest.
class ScopedBackend {
 public:
  /// Sets the calling thread's backend to b until the scope ends.
  explicit ScopedBackend(Backend b);
  ~ScopedBackend();
  ScopedBackend(const ScopedBackend&) = delete;
  ScopedBackend& operator=(const ScopedBackend&) = delete;

 private:
  int saved_;  // the thread's previous override, -1 for none
};

// The calling thread's SIMD target for the lifetime of a scope (name as set_simd_target takes it;
// attn::Error for an unknown one); the previous one after it. Scopes nest.
class ScopedSimdTarget {
 public:
  /// Sets the calling thread's SIMD target to `name` until the scope ends.
  explicit ScopedSimdTarget(const std::string& name);
  ~ScopedSimdTarget();
  ScopedSimdTarget(const ScopedSimdTarget&) = delete;
  ScopedSimdTarget& operator=(const ScopedSimdTarget&) = delete;

 private:
  long long saved_;  // the thread's previous override, 0 for none
};

// The calling thread's number of threads (set_num_threads) for the lifetime of a scope.
class ScopedThreads {
 public:
  /// Sets the calling thread's number of threads until the scope ends.
  explicit ScopedThreads(int threads) : saved_(num_threads()) { set_num_threads(threads); }
  ~ScopedThreads() { set_num_threads(saved_); }
  ScopedThreads(const ScopedThreads&) = delete;
  ScopedThreads& operator=(const ScopedThreads&) = delete;

 private:
  int saved_;
};

}  // namespace attn
