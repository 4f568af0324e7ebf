// The checks of scratch memory (cpu/scratch.hpp), always on, not only in debug builds:
//   - a frame that ends while it is not its thread's top frame, or on another thread than the one
//     that opened it, ends the program (a death test): memory a callee still uses would otherwise be
//     handed to the next frame;
//   - a Carve refuses a take() past its block's capacity, whether the capacity was given or is the
//     rest of the calling thread's top frame (the work memory run_tasks gives a task);
//   - run_phases runs its phases one after another, each task once, with the same work frame.
#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

#include "cpu/scratch.hpp"
#include "support/testing.hpp"

namespace attn {
namespace {

using cpu::Carve;
using cpu::ScratchFrame;
using testing::expect_error;

TEST(ScratchFrameDeathTest, EndingAFrameBelowTheTopEndsTheProgram) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        auto* outer = new ScratchFrame(64);
        auto* inner = new ScratchFrame(64);
        delete outer;  // inner is still open above it
        delete inner;
      },
      "frame 1 of a thread ended while frame 2 is its top one");
}

TEST(ScratchFrameDeathTest, EndingAFrameOnAnotherThreadEndsTheProgram) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        auto* frame = new ScratchFrame(64);
        std::thread([frame] { delete frame; }).join();
      },
      "ended on a thread other than the one that started it");
}

TEST(ScratchFrame, FramesEndingInReverseOrderAreAccepted) {
  ScratchFrame::release();
  {
    ScratchFrame a(100);
    {
      ScratchFrame b(200);
      EXPECT_EQ(b.bytes(), 256u);
    }
    ScratchFrame c(300);
    EXPECT_EQ(a.bytes(), 128u);
  }
  ScratchFrame::release();  // nothing open
}

TEST(Carve, RefusesToOverrunItsBlock) {
  alignas(64) std::byte block[192];
  Carve carve(block, sizeof block);
  EXPECT_EQ(carve.capacity(), 192u);
  EXPECT_EQ(carve.take<float>(16), reinterpret_cast<float*>(block));        // bytes [0, 64)
  EXPECT_EQ(carve.take<double>(9), reinterpret_cast<double*>(block + 64));  // 72 bytes: [64, 192)
  expect_error([&] { carve.take<char>(1); }, {"overrun the block of 192 bytes"});
  Carve empty(block, 0);
  EXPECT_NE(empty.take<float>(0), nullptr);  // no elements fit in no bytes
  expect_error([&] { empty.take<float>(1); }, {"overrun the block of 0 bytes"});
}

TEST(Carve, OverTheTopFrameItsCapacityIsTheFramesRest) {
  ScratchFrame frame(100);  // 128 bytes
  Carve whole(frame.data());
  EXPECT_EQ(whole.capacity(), 128u);
  whole.take<char>(128);
  expect_error([&] { whole.take<char>(1); }, {"overrun the block of 128 bytes"});
  Carve rest(static_cast<char*>(frame.data()) + 64);
  EXPECT_EQ(rest.capacity(), 64u);
  int outside = 0;
  expect_error([&] { Carve c(&outside); }, {"not in the calling thread's top scratch frame"});
  {
    ScratchFrame above(64);  // frame is no longer the top one
    expect_error([&] { Carve c(frame.data()); }, {"not in the calling thread's top scratch frame"});
  }
  EXPECT_EQ(Carve(frame.data()).capacity(), 128u);  // the top one again
}

TEST(Carve, ALayoutPlacedInItsFrameFitsExactly) {
  struct Layout {
    float* a;
    double* b;
    Layout(Carve& c, std::size_t n) : a(c.take<float>(n)), b(c.take<double>(n)) {}
  };
  cpu::Scratch<Layout> s(std::size_t(33));  // 132 and 264 bytes: 192 + 320
  EXPECT_EQ(reinterpret_cast<char*>(s->b) - reinterpret_cast<char*>(s->a), 192);
  EXPECT_EQ(cpu::layout_bytes<Layout>(std::size_t(33)), 512u);
}

TEST(RunPhases, PhasesRunInOrderEachTaskOnceOverOneWorkFrame) {
  constexpr std::int64_t kTasks = 64;
  std::vector<int> first(kTasks, 0), second(kTasks, 0), seen(kTasks, 0);
  const auto one = [&](std::int64_t t, void* work) {
    ++first[static_cast<std::size_t>(t)];
    Carve c(work);  // the work frame of this thread, of the asked size
    EXPECT_GE(c.capacity(), 256u);
  };
  // Phase 2 reads what phase 1 wrote for another task: the barrier between phases must hold.
  const auto two = [&](std::int64_t t, void*) {
    ++second[static_cast<std::size_t>(t)];
    seen[static_cast<std::size_t>(t)] = first[static_cast<std::size_t>(kTasks - 1 - t)];
  };
  cpu::run_phases(256, true, cpu::dynamic_phase(kTasks, one), cpu::static_phase(kTasks, two),
                  cpu::dynamic_phase(0, one));
  for (std::int64_t t = 0; t < kTasks; ++t) {
    EXPECT_EQ(first[static_cast<std::size_t>(t)], 1) << t;
    EXPECT_EQ(second[static_cast<std::size_t>(t)], 1) << t;
    EXPECT_EQ(seen[static_cast<std::size_t>(t)], 1) << t;
  }
}

}  // namespace
}  // namespace attn
