#include "attn/config.hpp"

#include <omp.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "attn/error.hpp"

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

}  // namespace

void set_backend(Backend b) { current_backend().store(b); }
Backend backend() { return current_backend().load(); }

void set_num_threads(int threads) {
  if (threads < 0) detail::fail("set_num_threads: threads is ", threads, "; it must be 0 (default) or positive");
  omp_set_num_threads(threads == 0 ? default_threads : threads);
}
int num_threads() { return omp_get_max_threads(); }

}  // namespace attn
