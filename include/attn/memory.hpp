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
#include <new>
#include <span>
#include <utility>

#include "attn/error.hpp"

namespace attn {

// bytes: the most attn may hold at once; 0 goes back to ATTN_MAX_BYTES or the machine's memory.
void set_memory_limit(std::size_t bytes);
// set_memory_limit's bytes; 0 when none is set (the limit is then ATTN_MAX_BYTES's or the machine's).
std::size_t memory_limit_set();
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

// The allocator of a Tensor's elements and of the kernels' buffers: memory aligned to a cache line
// (64 bytes), so that a row that starts on one is read by whole-line loads. (With operator new's 16
// bytes, every 512-bit load of a row straddled two lines: on a 2-core Zen 5 a plain read of such a
// buffer took 1.4x the time of an aligned one, and the float32 decode (32,1,8192,128) 6.8-7.0 ms
// against 6.2-6.4 ms aligned.)
inline constexpr std::size_t kCacheLineBytes = 64;
// `bytes` aligned to a cache line; from kHugePagesFrom bytes on, aligned to 2 MiB and asked to be
// backed by 2 MiB pages (Linux's transparent huge pages, madvise(MADV_HUGEPAGE), where the system
// allows them): its first touch then faults once every 2 MiB instead of every 4 KiB. Only buffers
// that glibc usually maps afresh for every allocation, 32 MiB and more (its largest mmap
// threshold), whose pages are then all faulted in on every call: a smaller one is usually memory
// freed by an earlier call and reused without a fault, which huge pages, faulted and zeroed again,
// made slower (the bfloat16 forward+backward (4,1024,1024,64) took 1.15x its time with them from
// 4 MiB on). On a 2-core Zen 5 virtual machine a page fault took about 10 us: a fresh 64 MiB
// buffer cost 220-230 ms to fill with zeros, 6.3 ms in huge pages. Only whole 2 MiB pages inside the
// buffer are asked for, so it never holds more memory than its own. Freed by free_aligned with the
// same bytes.
inline constexpr std::size_t kHugePagesFrom = std::size_t{32} << 20;
void* allocate_aligned(std::size_t bytes);
void free_aligned(void* p, std::size_t bytes) noexcept;
template <class T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <class U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}  // NOLINT(google-explicit-constructor)
  T* allocate(std::size_t count) {
    if (count > SIZE_MAX / sizeof(T)) throw std::bad_array_new_length();
    return static_cast<T*>(allocate_aligned(count * sizeof(T)));
  }
  void deallocate(T* p, std::size_t count) { free_aligned(p, count * sizeof(T)); }
  template <class U>
  bool operator==(const CacheLineAllocator<U>&) const {
    return true;
  }
};

}  // namespace detail

// Checks that an array of `shape` with elements of `element_bytes` fits in what attn may use now,
// as every Tensor's elements are checked: attn::MemoryError naming `what`, the shape and the bytes
// where it does not; attn::Error for a negative size or bytes that overflow 64 bits. Counts nothing
// as held. For a front end that allocates on attn's behalf (the Python module's result arrays, which
// NumPy owns).
inline void check_allocation(std::span<const std::int64_t> shape, std::size_t element_bytes, const char* what) {
  std::uint64_t bytes = element_bytes;
  for (const std::int64_t s : shape) {
    if (s < 0) detail::fail(what, ": a size of ", s, " is negative");
    if (__builtin_mul_overflow(bytes, static_cast<std::uint64_t>(s), &bytes))
      detail::fail(what, ": the product of the sizes and ", element_bytes, " bytes per element overflows 64 bits");
  }
  detail::release_memory(detail::reserve_memory(static_cast<std::size_t>(bytes), what, shape));
}

}  // namespace attn
