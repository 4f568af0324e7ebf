// The memory attn may use (attn/memory.hpp): a count of the bytes it holds, and the limit it is
// checked against, set by the caller, by ATTN_MAX_BYTES, or read from the machine.
#include "attn/memory.hpp"

#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <new>
#include <string>

#include <sys/mman.h>

#include "attn/tensor.hpp"

namespace attn {
namespace {

std::atomic<std::size_t> held{0};
std::atomic<std::size_t> set_limit{0};  // set_memory_limit's bytes; 0: none

// Buffers smaller than this are not checked against the machine's available memory (reading it
// costs a file read; a buffer this small cannot be what exhausts a machine).
constexpr std::size_t kMachineCheckFrom = std::size_t{16} << 20;

// "4398046511104 bytes (4.0 TiB)"
std::string bytes_string(std::size_t bytes) {
  static const char* const units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double x = static_cast<double>(bytes);
  int u = 0;
  while (x >= 1024 && u < 6) x /= 1024, ++u;
  char human[32];
  std::snprintf(human, sizeof human, "%.1f %s", x, units[u]);
  return detail::cat(bytes, " bytes", u == 0 ? std::string() : detail::cat(" (", human, ")"));
}

// ATTN_MAX_BYTES: digits, then optionally K, M, G or T (powers of 1024). 0 when unset.
std::size_t parse_max_bytes(const char* text) {
  const std::string s = text;
  std::size_t i = 0, value = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
    if (__builtin_mul_overflow(value, std::size_t{10}, &value) ||
        __builtin_add_overflow(value, static_cast<std::size_t>(s[i] - '0'), &value))
      detail::fail("ATTN_MAX_BYTES is \"", s, "\", more bytes than a 64-bit size holds");
    ++i;
  }
  int shift = 0;
  if (i + 1 == s.size()) {
    switch (std::toupper(static_cast<unsigned char>(s[i]))) {
      case 'K': shift = 10, ++i; break;
      case 'M': shift = 20, ++i; break;
      case 'G': shift = 30, ++i; break;
      case 'T': shift = 40, ++i; break;
      default: break;
    }
  }
  if (i == 0 || i != s.size() || value == 0)
    detail::fail("ATTN_MAX_BYTES is \"", s, "\"; it must be a positive number of bytes, optionally followed by K, M, G or T "
                 "(binary: 8G is 8 GiB)");
  if (shift > 0 && value > (std::numeric_limits<std::size_t>::max() >> shift))
    detail::fail("ATTN_MAX_BYTES is \"", s, "\", more bytes than a 64-bit size holds");
  return value << shift;
}

// ATTN_MAX_BYTES's bytes (0 when unset), read once; a malformed value is an error at every check.
std::size_t env_limit() {
  static const char* const text = std::getenv("ATTN_MAX_BYTES");
  if (text == nullptr || *text == '\0') return 0;
  static const std::size_t bytes = parse_max_bytes(text);
  return bytes;
}

// The caller's limit: set_memory_limit's, else ATTN_MAX_BYTES's; 0 when neither is set.
std::size_t chosen_limit() {
  const std::size_t set = set_limit.load(std::memory_order_relaxed);
  return set != 0 ? set : env_limit();
}

// A number from the first line of `path` ("max" and unreadable files give `otherwise`).
std::size_t read_number(const char* path, std::size_t otherwise) {
  std::ifstream f(path);
  std::string word;
  if (!(f >> word) || word.empty() || !std::isdigit(static_cast<unsigned char>(word[0]))) return otherwise;
  return static_cast<std::size_t>(std::strtoull(word.c_str(), nullptr, 10));
}

// The memory this machine (and its cgroup, in a container) can give now.
std::size_t machine_available() {
  constexpr std::size_t none = std::numeric_limits<std::size_t>::max();
  std::size_t available = none;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  std::size_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit)
    if (key == "MemAvailable:") {
      available = kib * 1024;
      break;
    }
  const std::size_t cgroup_max = read_number("/sys/fs/cgroup/memory.max", none);
  if (cgroup_max != none) {
    const std::size_t current = read_number("/sys/fs/cgroup/memory.current", 0);
    available = std::min(available, cgroup_max > current ? cgroup_max - current : 0);
  }
  return available;
}

}  // namespace

void set_memory_limit(std::size_t bytes) { set_limit.store(bytes, std::memory_order_relaxed); }
std::size_t memory_limit_set() { return set_limit.load(std::memory_order_relaxed); }

std::size_t memory_limit() {
  const std::size_t chosen = chosen_limit();
  return chosen != 0 ? chosen : machine_available();
}

std::size_t memory_in_use() { return held.load(std::memory_order_relaxed); }

namespace detail {

void* allocate_aligned(std::size_t bytes) {
  if (bytes < kHugePagesFrom) return ::operator new(bytes, std::align_val_t(kCacheLineBytes));
  constexpr std::size_t kHugePage = std::size_t{2} << 20;
  void* p = nullptr;
  if (posix_memalign(&p, kHugePage, bytes) != 0) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  (void)madvise(p, bytes / kHugePage * kHugePage, MADV_HUGEPAGE);  // advice: refused, the buffer is as good
#endif
  return p;
}

void free_aligned(void* p, std::size_t bytes) noexcept {
  if (bytes < kHugePagesFrom) {
    ::operator delete(p, std::align_val_t(kCacheLineBytes));
  } else {
    std::free(p);
  }
}

std::size_t reserve_memory(std::size_t bytes, const char* what, std::span<const std::int64_t> shape) {
  if (bytes == 0) return 0;
  const auto refuse = [&](const std::string& limit) {
    throw MemoryError(cat(what, shape.empty() ? std::string() : cat(" of shape ", dims_string(shape)), " needs ",
                          bytes_string(bytes), ", more than ", limit));
  };
  const std::size_t limit = chosen_limit();
  if (limit != 0) {
    const std::size_t before = held.fetch_add(bytes, std::memory_order_relaxed);
    if (bytes > limit || before > limit - bytes) {
      held.fetch_sub(bytes, std::memory_order_relaxed);
      refuse(cat("attn may use: ", bytes_string(limit), " (", set_limit.load() != 0 ? "set_memory_limit" : "ATTN_MAX_BYTES",
                 "), of which it holds ", bytes_string(before)));
    }
    return bytes;
  }
  if (bytes >= kMachineCheckFrom) {
    const std::size_t available = machine_available();
    if (bytes > available)
      refuse(cat("this machine has available: ", bytes_string(available),
                 " (ATTN_MAX_BYTES or set_memory_limit sets a limit of attn's own)"));
  }
  held.fetch_add(bytes, std::memory_order_relaxed);
  return bytes;
}

void count_memory(std::size_t bytes) { held.fetch_add(bytes, std::memory_order_relaxed); }

void release_memory(std::size_t bytes) {
  if (bytes != 0) held.fetch_sub(bytes, std::memory_order_relaxed);
}

}  // namespace detail
}  // namespace attn
