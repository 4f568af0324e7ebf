// Working buffers of the kernels whose size grows with n * m (the scores and weights of the unfused
// and reference paths) and an int4_kivi cache's bfloat16 tails: std::vectors of cache-line aligned
// memory whose allocations count against the memory attn may use (attn/memory.hpp), so that a call
// too large for it throws attn::MemoryError naming the bytes before anything is allocated.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "attn/memory.hpp"

namespace attn::detail {

template <class T>
struct CountedAllocator {
  using value_type = T;
  CountedAllocator() = default;
  template <class U>
  CountedAllocator(const CountedAllocator<U>&) {}  // NOLINT(google-explicit-constructor)

  T* allocate(std::size_t count) {
    std::size_t bytes = 0;
    if (__builtin_mul_overflow(count, sizeof(T), &bytes))
      throw MemoryError(cat("a working buffer of ", count, " elements of ", sizeof(T), " bytes overflows a 64-bit size"));
    reserve_memory(bytes, "a working buffer of the kernels");
    try {
      return CacheLineAllocator<T>().allocate(count);
    } catch (...) {
      release_memory(bytes);
      throw;
    }
  }
  void deallocate(T* p, std::size_t count) {
    // Released before the delete: the size, computed by std::vector from the pointers, is then not
    // used after it (GCC 12 warned -Wuse-after-free on every Buffer's destructor).
    release_memory(count * sizeof(T));
    CacheLineAllocator<T>().deallocate(p, count);
  }
  template <class U>
  bool operator==(const CountedAllocator<U>&) const {
    return true;
  }
};

template <class T>
using Buffer = std::vector<T, CountedAllocator<T>>;

}  // namespace attn::detail
