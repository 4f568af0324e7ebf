// Run-time switches: which implementation runs, and how many threads it may use.
#pragma once

namespace attn {

// cpu: the production kernels (src/cpu). reference: the plain kernels written straight from the
// formulas (src/ref), single-threaded, the oracle of the tests. The environment variable
// ATTN_BACKEND=reference selects the reference at start-up, like ggml's switch that forces the
// reference path.
enum class Backend { cpu, reference };

void set_backend(Backend backend);
Backend backend();

// Threads used by the cpu backend (OpenMP). 0 restores the default (OMP_NUM_THREADS or all cores).
// Results never depend on it: dropout masks are keyed by position, reductions by row.
void set_num_threads(int threads);
int num_threads();

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
