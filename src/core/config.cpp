#include "attn/config.hpp"

#include <omp.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "attn/error.hpp"
#include "attn/version.hpp"
#include "core/switch_plan.hpp"

namespace attn {
namespace {

Backend initial_backend() {
  const char* env = std::getenv("ATTN_BACKEND");
  if (env != nullptr && std::strcmp(env, "reference") == 0) return Backend::reference;
  if (env != nullptr && std::strcmp(env, "unfused") == 0) return Backend::unfused;
  return Backend::cpu;
}

std::atomic<Backend>& current_backend() {
  static std::atomic<Backend> b{initial_backend()};
  return b;
}

const int default_threads = omp_get_max_threads();

// The calling thread's ScopedBackend, -1 for none.
thread_local int backend_override = -1;

}  // namespace

void set_backend(Backend b) { current_backend().store(b); }
Backend backend() { return backend_override >= 0 ? static_cast<Backend>(backend_override) : current_backend().load(); }

ScopedBackend::ScopedBackend(Backend b) : saved_(backend_override) { backend_override = static_cast<int>(b); }
ScopedBackend::~ScopedBackend() { backend_override = saved_; }

void set_num_threads(int threads) {
  if (threads < 0) detail::fail("set_num_threads: threads is ", threads, "; it must be 0 (default) or positive");
  omp_set_num_threads(threads == 0 ? default_threads : threads);
}
int num_threads() { return omp_get_max_threads(); }

namespace {
std::atomic<Bf16Kernel> bf16_choice{Bf16Kernel::automatic};
}
// bf16_kernel_available, bf16_kernel_pays and bf16_kernel_chosen ask the CPU: cpu/bf16/dot_bf16.cpp.
void set_bf16_kernel(Bf16Kernel choice) { bf16_choice.store(choice); }
Bf16Kernel bf16_kernel() { return bf16_choice.load(); }

namespace detail {
namespace {
std::atomic<std::int64_t> process_simd_bit{0};
thread_local std::int64_t simd_override = 0;
thread_local const Switches* pinned = nullptr;
}  // namespace

void set_process_simd_bit(std::int64_t bit) { process_simd_bit.store(bit); }
std::int64_t thread_simd_override() { return simd_override; }
void set_thread_simd_override(std::int64_t bit) { simd_override = bit; }
std::int64_t simd_bit_now() {
  if (pinned != nullptr) return pinned->simd_bit;
  return simd_override != 0 ? simd_override : process_simd_bit.load(std::memory_order_relaxed);
}

Switches read_switches() {
  if (pinned != nullptr) return *pinned;
  return {backend(), simd_bit_now(), bf16_choice.load()};
}

PinSwitches::PinSwitches(const Switches& s) : saved_(pinned), own_(s) {
  if (pinned == nullptr) pinned = &own_;
}
PinSwitches::~PinSwitches() { pinned = saved_; }

}  // namespace detail

const char* version() { return ATTN_VERSION_STRING; }

}  // namespace attn
