#include "attn/config.hpp"

#include <omp.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "attn/error.hpp"
#include "attn/version.hpp"
#include "cpu/bf16/dot_bf16.hpp"

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
bool bf16_kernel_available() { return cpu::bf16::has_avx512_bf16(); }
bool bf16_kernel_pays() { return cpu::bf16::dot_pays(); }
void set_bf16_kernel(Bf16Kernel choice) { bf16_choice.store(choice); }
Bf16Kernel bf16_kernel() { return bf16_choice.load(); }
bool bf16_kernel_chosen() {
  const Bf16Kernel choice = bf16_choice.load();
  return choice != Bf16Kernel::off && bf16_kernel_available() && (choice == Bf16Kernel::on || bf16_kernel_pays());
}

const char* version() { return ATTN_VERSION_STRING; }

}  // namespace attn
