// Run-time switches: which implementation runs, and how many threads it may use.
#pragma once

#include <string>
#include <vector>

namespace attn {

// cpu: the production kernels (src/cpu). reference: the plain kernels written straight from the
// formulas (src/ref), single-threaded, the oracle of the tests. unfused: the cpu backend with its
// fused kernels left out, so that scores, softmax and pooling run as separate threaded passes over
// an (n, m) buffer (the path calls asking for the weights take anyway): the baseline `attn bench`
// measures the fused kernels against. The environment variable ATTN_BACKEND=reference (or unfused)
// selects one at start-up, like ggml's switch that forces the reference path.
enum class Backend { cpu, reference, unfused };

void set_backend(Backend backend);
Backend backend();

// Threads used by the cpu backend (OpenMP). 0 restores the default (OMP_NUM_THREADS or all cores).
// Results never depend on it: dropout masks are keyed by position, reductions by row.
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
// runs on it to the end, on all of its threads.
void set_simd_target(const std::string& name);

// The targets the fused kernels actually ran on, on any thread, since the last call with
// reset = true (best first; empty if none ran): recorded by the kernels themselves, for the tests
// and benchmarks that must show which code ran, not only which was chosen.
std::vector<std::string> simd_targets_ran(bool reset = false);

// Sets the backend for the lifetime of a scope and restores the previous one after it.
class ScopedBackend {
 public:
  explicit ScopedBackend(Backend b) : saved_(backend()) { set_backend(b); }
  ~ScopedBackend() { set_backend(saved_); }
  ScopedBackend(const ScopedBackend&) = delete;
  ScopedBackend& operator=(const ScopedBackend&) = delete;

 private:
  Backend saved_;
};

}  // namespace attn
