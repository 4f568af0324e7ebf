// The memory attn may use, checked before it allocates.
//
// Every buffer attn allocates (a Tensor's elements, the kernels' scratch, the Python module's result
// arrays) is checked before it is allocated: a call that would need more than attn may use raises
// attn::MemoryError naming the bytes, never an out-of-memory kill halfway through. What attn may use:
//   - set_memory_limit(bytes), or else the environment variable ATTN_MAX_BYTES (bytes, or with a
//     binary suffix K, M, G or T: "8G"), read when first needed: then the bytes attn holds at once
//     (memory_in_use) may not exceed it;
//   - otherwise the memory the machine has available when the buffer is asked for (MemAvailable of
//     /proc/meminfo, and the cgroup's memory.max less memory.current where a container sets one):
//     then no one buffer may exceed it. Buffers under 16 MiB are not checked against the machine.
// The weights (1, 2^20, 2^20) of n = m = 2^20 in float32, 4 TiB, raise it on any machine today.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

#include "attn/error.hpp"

namespace attn {

// bytes: the most attn may hold at once; 0 goes back to ATTN_MAX_BYTES or the machine's memory.
void set_memory_limit(std::size_t bytes);
// The limit now: set_memory_limit's or ATTN_MAX_BYTES's bytes, or the machine's available memory.
std::size_t memory_limit();
// The bytes attn holds now: the Tensors it owns and every thread's kernel scratch.
std::size_t memory_in_use();

namespace detail {

// Counts `bytes` as held by attn, or throws MemoryError naming `what` (of `shape`, if given) and the
// bytes, before anything is allocated. Returns bytes, for release_memory.
std::size_t reserve_memory(std::size_t bytes, const char* what, std::span<const std::int64_t> shape = {});
void release_memory(std::size_t bytes);
// Counts `bytes` as held without checking them against the limit.
void count_memory(std::size_t bytes);

// `bytes` counted as held by attn for this object's lifetime (a member beside the storage it
// accounts for). Copies reserve again; moves hand the count over.
class MemoryReservation {
 public:
  MemoryReservation() = default;
  MemoryReservation(std::size_t bytes, const char* what, std::span<const std::int64_t> shape = {})
      : bytes_(reserve_memory(bytes, what, shape)) {}
  MemoryReservation(const MemoryReservation& other) : bytes_(reserve_memory(other.bytes_, "a copy of a tensor")) {}
  // Counted without a check, where an exception must not be thrown (cpu/scratch.hpp).
  static MemoryReservation unchecked(std::size_t bytes) {
    MemoryReservation r;
    r.bytes_ = bytes;
    count_memory(bytes);
    return r;
  }
  MemoryReservation(MemoryReservation&& other) noexcept : bytes_(other.bytes_) { other.bytes_ = 0; }
  MemoryReservation& operator=(MemoryReservation other) noexcept {
    std::swap(bytes_, other.bytes_);
    return *this;
  }
  ~MemoryReservation() { release_memory(bytes_); }

 private:
  std::size_t bytes_ = 0;
};

}  // namespace detail
}  // namespace attn
