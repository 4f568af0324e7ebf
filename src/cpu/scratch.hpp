// Per-thread scratch memory for the fused kernels: one 64-byte aligned block per thread, grown on
// demand and kept for the thread's lifetime, so that steady-state calls allocate nothing (the first
// touch of fresh pages is slow in a virtual machine, and an allocation per call pays it every time).
// OpenMP's worker threads persist between parallel regions, so each keeps its block.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <new>

namespace attn::cpu {

// Carves aligned arrays out of the calling thread's block. All arrays of one use must be taken from
// one Scratch object after reserve(), which grows the block once to the total they need.
class Scratch {
 public:
  // Which of the thread's two blocks: the kernels' work space, or the buffers a call shares between
  // its threads (held by the calling thread, which also works as one of the OpenMP threads).
  enum Slot { work = 0, call = 1 };

  // The calling thread's block `slot`, at least `bytes` long (the old contents are not kept).
  explicit Scratch(std::size_t bytes, Slot slot = work) {
    Block& b = block(slot);
    if (b.size < bytes) {
      b.data.reset(static_cast<std::byte*>(std::aligned_alloc(kAlign, round_up(bytes))));
      if (!b.data) throw std::bad_alloc();
      total().fetch_add(round_up(bytes) - b.size);
      b.size = round_up(bytes);
    }
    base_ = b.data.get();
    end_ = base_ + b.size;
  }

  // The next `count` elements of T, 64-byte aligned.
  template <class T>
  T* take(std::size_t count) {
    T* p = reinterpret_cast<T*>(base_ + used_);
    used_ += round_up(count * sizeof(T));
    if (base_ + used_ > end_) throw std::bad_alloc();  // a caller under-reserved: a bug, not a state
    return p;
  }

  // The bytes `count` elements of T take in a block, for computing what to reserve.
  template <class T>
  static std::size_t bytes_for(std::size_t count) { return round_up(count * sizeof(T)); }

  // The bytes all threads' blocks hold together (what `attn bench` reports as extra memory).
  static std::size_t held() { return total().load(); }

  // Frees the calling thread's blocks (the next use allocates again): `attn bench` starts each case
  // from nothing, so that held() afterwards is what that case needed.
  static void release() {
    for (Block& b : {std::ref(block(work)), std::ref(block(call))}) {
      total().fetch_sub(b.size);
      b.data.reset();
      b.size = 0;
    }
  }

 private:
  static constexpr std::size_t kAlign = 64;
  static std::size_t round_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  struct Block {
    std::unique_ptr<std::byte, Free> data;
    std::size_t size = 0;
    ~Block() { total().fetch_sub(size); }
  };
  static std::atomic<std::size_t>& total() {
    static std::atomic<std::size_t> t{0};
    return t;
  }
  static Block& block(Slot slot) {
    thread_local Block b[2];
    return b[slot];
  }

  std::byte* base_ = nullptr;
  std::byte* end_ = nullptr;
  std::size_t used_ = 0;
};

// Runs task(t, work) for every t in [0, tasks) on OpenMP threads, dynamically scheduled (tasks may
// differ in cost, as causal blocks do), each thread with `work_bytes` of its own scratch (`work`,
// 64-byte aligned). On the calling thread alone unless `threads` and there is more than one task.
template <class Task>
void run_tasks(std::int64_t tasks, std::size_t work_bytes, bool threads, const Task& task) {
#pragma omp parallel if (threads && tasks > 1)
  {
    Scratch scratch(work_bytes);
    void* work = scratch.take<unsigned char>(work_bytes);
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t t = 0; t < tasks; ++t) task(t, work);
  }
}

}  // namespace attn::cpu
