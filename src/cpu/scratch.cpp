// The per-thread arenas behind ScratchFrame (cpu/scratch.hpp), and the public accounting of them (attn/machine.hpp).
#include "cpu/scratch.hpp"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "attn/machine.hpp"
#include "attn/diagnostics.hpp"
#include "attn/memory.hpp"

namespace attn::cpu {
namespace {

std::atomic<std::size_t> total_held{0};
std::atomic<int> fill_byte{-1};

// One thread's stack of frames over chunks that never move while a frame uses them. The top of
// the stack is at byte `top` of chunk `chunk`; the chunks after it are free.
class Arena {
 public:
  ~Arena() { free_from(0); }

  // `bytes` (a multiple of Carve::kAlign) on top of the stack; `saved_*` receive the old top.
  void* push(std::size_t bytes, std::size_t& saved_chunk, std::size_t& saved_top, std::size_t& saved_start) {
    saved_chunk = chunk_, saved_top = top_, saved_start = top_frame_start_;
    std::size_t c = chunk_, at = top_;
    if (c >= chunks_.size() || chunks_[c].size - at < bytes) {
      // The next chunk: chunk c itself if nothing of it is in use (only at the very bottom).
      if (!(c < chunks_.size() && at == 0)) c = chunks_.empty() ? 0 : c + 1;
      if (c < chunks_.size() && chunks_[c].size < bytes) free_from(c);
      if (c == chunks_.size()) allocate(bytes);
      at = 0;
    }
    ++depth_;
    chunk_ = c, top_ = at + bytes;
    top_frame_start_ = at;
    std::byte* p = chunks_[c].data.get() + at;
    const int fill = fill_byte.load(std::memory_order_relaxed);
    if (fill >= 0) std::memset(p, fill, bytes);
    return p;
  }

  // The frames open now; the frame a push opens is the one of this depth.
  int depth() const { return depth_; }

  // The bytes from p to the end of the top frame, which must hold p.
  std::size_t bytes_from(const void* p) const {
    const auto* at = static_cast<const std::byte*>(p);
    if (depth_ > 0 && chunk_ < chunks_.size()) {
      const std::byte* base = chunks_[chunk_].data.get();
      if (at >= base + top_frame_start_ && at <= base + top_) return static_cast<std::size_t>(base + top_ - at);
    }
    detail::fail("scratch memory: a Carve over work memory that is not in the calling thread's top scratch frame");
  }

  // Back to the top before the push that opened the frame of depth `depth`, which must be the top
  // frame: ending another frame would hand memory its callee still uses to the next frame.
  void pop(int depth, std::size_t saved_chunk, std::size_t saved_top, std::size_t saved_start) {
    if (depth != depth_) {
      std::fprintf(stderr, "attn: scratch frame %d of a thread ended while frame %d is its top one; frames end in "
                           "the reverse order of their start\n", depth, depth_);
      std::abort();
    }
    chunk_ = saved_chunk, top_ = saved_top, top_frame_start_ = saved_start;
    if (--depth_ > 0 || chunks_.size() <= 1) return;
    std::size_t total = 0;
    for (const Chunk& c : chunks_) total += c.size;
    free_from(0);
    allocate(total);
  }

  void release() {
    if (depth_ != 0) detail::fail("ScratchFrame::release: a frame of this thread is still open");
    free_from(0);
  }

 private:
  struct Free {  // memory of detail::allocate_aligned (attn/memory.hpp: huge pages for large chunks)
    std::size_t bytes;  // (no initializer: the enclosing class is not complete where Chunk needs Free())
    void operator()(std::byte* p) const { detail::free_aligned(p, bytes); }
  };
  struct Chunk {
    detail::MemoryReservation reservation;  // counted against attn's memory limit (attn/memory.hpp)
    std::unique_ptr<std::byte, Free> data;
    std::size_t size = 0;
  };

  void allocate(std::size_t bytes) {
    const std::size_t size = std::max<std::size_t>(Carve::round_up(bytes), Carve::kAlign);
    Chunk c;
    // Checked, except inside a parallel region: the region's caller checked (check_thread_scratch).
    c.reservation = omp_get_level() > 0 ? detail::MemoryReservation::unchecked(size)
                                        : detail::MemoryReservation(size, "the kernels' scratch memory");
    c.data = std::unique_ptr<std::byte, Free>(static_cast<std::byte*>(detail::allocate_aligned(size)), Free{size});
    c.size = size;
    total_held.fetch_add(size);
    chunks_.push_back(std::move(c));
  }
  void free_from(std::size_t first) {
    for (std::size_t c = first; c < chunks_.size(); ++c) total_held.fetch_sub(chunks_[c].size);
    chunks_.resize(first);
    if (chunk_ >= first) chunk_ = 0, top_ = 0;
  }

  std::vector<Chunk> chunks_;
  std::size_t chunk_ = 0, top_ = 0;
  // Where the top frame starts in chunk_ (for Carve's capacity over work memory).
  std::size_t top_frame_start_ = 0;
  int depth_ = 0;
};

Arena& arena() {
  thread_local Arena a;
  return a;
}

}  // namespace

ScratchFrame::ScratchFrame(std::size_t bytes) : bytes_(Carve::round_up(bytes)) {
  Arena& a = arena();
  data_ = a.push(bytes_, saved_chunk_, saved_top_, saved_start_);
  depth_ = a.depth(), arena_ = &a;
}

ScratchFrame::~ScratchFrame() {
  Arena& a = arena();
  if (arena_ != &a) {
    std::fputs("attn: a scratch frame ended on a thread other than the one that started it\n", stderr);
    std::abort();
  }
  a.pop(depth_, saved_chunk_, saved_top_, saved_start_);
}

std::size_t Carve::top_frame_bytes_from(void* p) { return arena().bytes_from(p); }

std::size_t ScratchFrame::held() { return total_held.load(); }
void ScratchFrame::release() { arena().release(); }
void ScratchFrame::set_fill(int byte) { fill_byte.store(byte < 0 ? -1 : byte & 0xFF); }

void check_thread_scratch(std::size_t bytes_per_thread) {
  if (omp_get_level() > 0) return;  // inside a region: its caller checked
  std::size_t bytes = 0;
  if (__builtin_mul_overflow(bytes_per_thread, static_cast<std::size_t>(omp_get_max_threads()), &bytes))
    bytes = SIZE_MAX;
  detail::release_memory(detail::reserve_memory(bytes, "the kernels' scratch memory of every thread"));
}

}  // namespace attn::cpu

namespace attn::machine {

std::size_t scratch_bytes() { return cpu::ScratchFrame::held(); }
void release_scratch() { cpu::ScratchFrame::release(); }

}  // namespace attn::machine
