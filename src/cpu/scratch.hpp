// Scratch memory of the cpu kernels: a stack of frames per thread.
//
// Every thread owns an arena. A ScratchFrame takes memory from the top of the calling thread's
// arena and gives it back when it ends, so frames nest like the calls that open them: a callee's
// frame always lies above its caller's, and no call can reuse memory a caller still holds (the
// SDPA backward, for one, runs the forward inside its own frame). The arena is a list of chunks
// that never move while frames use them; when the outermost frame of a thread ends after the arena
// had to grow, its chunks are merged into one, so a steady state of repeated calls allocates nothing
// (the first touch of fresh pages is slow in a virtual machine, and an allocation per call pays it
// every time). OpenMP's worker threads persist between parallel regions, and so do their arenas.
//
// What a frame holds is described once, by a layout: a struct whose constructor takes its arrays,
// in order, from a Carve. The same constructor measures the layout (layout_bytes) and lays it out
// over a frame's memory (Scratch<Layout>), so the size reserved and the arrays taken cannot disagree.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "attn/error.hpp"

namespace attn::cpu {

// Lays out 64-byte aligned arrays one after another: over a block of memory of a known capacity,
// or (default constructed) only counting the bytes they need, when every take() returns nullptr. A
// take() past the capacity throws attn::Error (inside a parallel region that ends the program): a
// layout that takes more than it was sized for is a bug, and memory past the block is someone else's.
class Carve {
 public:
  static constexpr std::size_t kAlign = 64;

  Carve() = default;
  Carve(void* base, std::size_t capacity) : base_(static_cast<std::byte*>(base)), capacity_(capacity), measuring_(false) {}
  // Over the calling thread's top scratch frame, from `base` (inside it) to the frame's end: the work
  // memory a kernel receives from run_tasks.
  explicit Carve(void* base) : Carve(base, top_frame_bytes_from(base)) {}

  // The next `count` elements of T.
  template <class T>
  T* take(std::size_t count) {
    std::size_t bytes = 0;
    if (__builtin_mul_overflow(count, sizeof(T), &bytes) || bytes > SIZE_MAX / 2 - used_)
      detail::fail("scratch memory: ", count, " elements of ", sizeof(T), " bytes overflow the address space");
    const std::size_t at = used_;
    used_ += round_up(bytes);
    if (measuring_) return nullptr;
    if (used_ > capacity_)
      detail::fail("scratch memory: ", count, " elements of ", sizeof(T), " bytes at byte ", at,
                   " overrun the block of ", capacity_, " bytes the layout was given");
    return reinterpret_cast<T*>(base_ + at);
  }

  // The bytes taken so far.
  std::size_t bytes() const { return used_; }
  // The bytes of the block (0 while measuring).
  std::size_t capacity() const { return capacity_; }

  static std::size_t round_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

 private:
  // scratch.cpp: the bytes from p to the end of the calling thread's top frame; fails when p is not
  // inside that frame.
  static std::size_t top_frame_bytes_from(void* p);

  std::byte* base_ = nullptr;
  std::size_t capacity_ = 0;
  bool measuring_ = true;
  std::size_t used_ = 0;
};

// The bytes a Layout (constructed as Layout(Carve&, args...)) takes.
template <class Layout, class... Args>
std::size_t layout_bytes(const Args&... args) {
  Carve measure;
  const Layout layout(measure, args...);
  (void)layout;
  return measure.bytes();
}

// `bytes` of 64-byte aligned memory on top of the calling thread's arena, for the frame's lifetime.
// Frames of one thread end in the reverse order of their start, on the thread that started them: a
// frame is a scoped object that cannot be copied or moved, and ending any other than the top frame
// of the calling thread ends the program (always checked, as memory a caller still uses would be
// handed out again otherwise).
class ScratchFrame {
 public:
  explicit ScratchFrame(std::size_t bytes);
  ~ScratchFrame();
  ScratchFrame(const ScratchFrame&) = delete;
  ScratchFrame& operator=(const ScratchFrame&) = delete;

  void* data() const { return data_; }
  // The bytes of the frame (its request rounded up to Carve::kAlign).
  std::size_t bytes() const { return bytes_; }

  // The bytes every thread's arena holds together (what `attn bench` reports as extra memory).
  static std::size_t held();
  // Frees the calling thread's arena, which must have no frame open: `attn bench` starts each case
  // from nothing, so that held() afterwards is what that case needed.
  static void release();
  // Testing: every frame's memory is filled with `byte` when the frame starts (-1: left as it is),
  // so a test can show that no result depends on what scratch memory held before.
  static void set_fill(int byte);

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  std::size_t saved_chunk_ = 0, saved_top_ = 0, saved_start_ = 0;
  int depth_ = 0;             // the arena's frame count with this frame open
  const void* arena_ = nullptr;  // the arena of the thread that opened it
};

// A Layout placed in a frame of its own: Scratch<Buffers<T>> buf(sizes...); buf->array[i].
template <class Layout>
class Scratch {
 public:
  template <class... Args>
  explicit Scratch(const Args&... args)
      : frame_(layout_bytes<Layout>(args...)), carve_(frame_.data(), frame_.bytes()), layout_(carve_, args...) {}
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  Layout* operator->() { return &layout_; }
  Layout& operator*() { return layout_; }

 private:
  ScratchFrame frame_;
  Carve carve_;
  Layout layout_;
};

// Memory limits in parallel regions (attn/memory.hpp): an exception cannot leave an OpenMP region,
// so a frame opened inside one (at any nesting level) counts its arena's growth without checking it.
// Before such a region, on the calling thread, check_thread_scratch checks that each of the region's
// threads could take `bytes_per_thread` of fresh scratch on top of what attn holds, and throws
// attn::MemoryError otherwise (conservative: an arena that already holds the bytes is counted again).
void check_thread_scratch(std::size_t bytes_per_thread);

// One loop of run_phases: task(t, work) for every t in [0, tasks), dynamically scheduled (tasks that
// differ in cost, as causal blocks do) or statically (cheap equal tasks, such as rows summed in order).
template <class Task>
struct Phase {
  std::int64_t tasks;
  bool dynamic;
  const Task& task;
};
template <class Task>
Phase<Task> dynamic_phase(std::int64_t tasks, const Task& task) {
  return {tasks, true, task};
}
template <class Task>
Phase<Task> static_phase(std::int64_t tasks, const Task& task) {
  return {tasks, false, task};
}

namespace detail_scratch {
// One phase on the threads of the enclosing parallel region (an orphaned loop; every thread takes
// the same branch), with the implicit barrier at its end: a phase starts after the one before ends.
template <class Task>
void run_phase(const Phase<Task>& p, void* work) {
  if (p.dynamic) {
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t t = 0; t < p.tasks; ++t) p.task(t, work);
  } else {
#pragma omp for schedule(static)
    for (std::int64_t t = 0; t < p.tasks; ++t) p.task(t, work);
  }
}
}  // namespace detail_scratch

// Runs the phases one after another in one parallel region (on the calling thread alone unless
// `threads`), each thread with `work_bytes` of its own scratch (`work`, 64-byte aligned, in a frame
// of that thread, the same frame for every phase), checked against the memory limit first
// (check_thread_scratch).
template <class... Tasks>
void run_phases(std::size_t work_bytes, bool threads, const Phase<Tasks>&... phases) {
  check_thread_scratch(work_bytes);
#pragma omp parallel if (threads)
  {
    const ScratchFrame frame(work_bytes);
    (detail_scratch::run_phase(phases, frame.data()), ...);
  }
}

// Runs task(t, work) for every t in [0, tasks) on OpenMP threads, dynamically scheduled, each thread
// with `work_bytes` of its own scratch: run_phases of one phase, on the calling thread alone unless
// `threads` and there is more than one task.
template <class Task>
void run_tasks(std::int64_t tasks, std::size_t work_bytes, bool threads, const Task& task) {
  run_phases(work_bytes, threads && tasks > 1, dynamic_phase(tasks, task));
}

}  // namespace attn::cpu
