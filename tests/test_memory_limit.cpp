// The memory attn may use (attn/memory.hpp): a call whose buffers would exceed it throws
// attn::MemoryError naming the bytes before it allocates, whichever buffer it is (a Tensor, the
// unfused and reference paths' (n, m) buffers, the kernels' scratch), never an out-of-memory kill;
// what attn holds is counted and given back.
//   - The weights of n = m = 2^20 (4 TiB in float32) are refused on the machine's available memory,
//     by the convenience API and by every backend that would form them.
//   - Under set_memory_limit, tensors and scratch count against it until they are freed; the
//     refusal names the bytes, the limit and what attn holds.
#include <string>

#include "attn/config.hpp"
#include "attn/memory.hpp"
#include "attn/nadaraya_watson.hpp"
#include "attn/sdpa.hpp"
#include "attn/softmax.hpp"
#include "cpu/scratch.hpp"
#include "support/testing.hpp"

namespace attn {
namespace {

constexpr index_t kMillion = index_t{1} << 20;  // n = m = 2^20: (n, m) float32 weights are 4 TiB

using testing::expect_memory_error;
using testing::ScopedLimit;

TEST(MemoryLimit, WeightsOfTwoToTheTwentyAreRefusedBeforeAllocating) {
  const std::size_t before = memory_in_use();
  const Tensor<float> q = testing::random_tensor<float>({1, kMillion, 1}, 1);  // 4 MiB
  expect_memory_error([&] { Tensor<float> w({1, kMillion, kMillion}); },
                      {"a tensor of shape (1,1048576,1048576)", "4398046511104 bytes (4.0 TiB)", "available"});
  Tensor<float> weights;
  expect_memory_error([&] { scaled_dot_product_attention<float>(q, q, q, {}, {}, &weights); }, {"4398046511104 bytes"});
  EXPECT_EQ(weights.numel(), 0);
  EXPECT_EQ(memory_in_use(), before + 4 * static_cast<std::size_t>(kMillion)) << "only q is held";
}

TEST(MemoryLimit, PathsThatFormTheScoresRefuseThem) {
  const Tensor<float> q = testing::random_tensor<float>({1, kMillion, 1}, 2);
  Tensor<float> out({1, kMillion, 1});
  for (const Backend b : {Backend::unfused, Backend::reference}) {
    const ScopedBackend scoped(b);
    expect_memory_error([&] { sdpa_forward<float>(out, {}, {}, q, q, q); }, {"4398046511104 bytes", "working buffer"});
    Tensor<float> dq({1, kMillion, 1});
    expect_memory_error([&] { sdpa_backward<float>(dq, {}, {}, out, q, q, q, out, {}); }, {"bytes"});
  }
  // The fused kernels never form them: the same call computes (no weights asked for) in O(n d) memory
  // on the cpu backend. Not run here: 2^40 scores take minutes; test_sdpa covers the fused path.
}

// The dense Nadaraya-Watson backward (keys of 2 features) holds (n, m) weights and coefficients: at
// n = m = 2^20 they are refused before anything is allocated, as the scores are.
TEST(MemoryLimit, DenseNadarayaWatsonBackwardRefusesItsBuffers) {
  const std::size_t before = memory_in_use();
  {
    const Tensor<float> x = testing::random_tensor<float>({1, kMillion, 2}, 3), y = testing::random_tensor<float>({1, kMillion, 1}, 4);
    Tensor<float> dq({1, kMillion, 2});
    expect_memory_error(
        [&] { nadaraya_watson_backward<float>(dq, {}, {}, nullptr, y, x, x, y, Kernel::gaussian, 1.0f); },
        {"working buffer", "bytes"});
  }
  EXPECT_EQ(memory_in_use(), before) << "nothing is held after the refused call";
}

TEST(MemoryLimit, TensorsCountAgainstASetLimitUntilFreed) {
  EXPECT_EQ(memory_limit_set(), 0u) << "none set (ATTN_MAX_BYTES is not set_memory_limit's)";
  const std::size_t held = memory_in_use();
  const ScopedLimit limit(held + (1 << 20));  // 1 MiB more than attn holds now
  EXPECT_EQ(memory_limit(), held + (1 << 20));
  EXPECT_EQ(memory_limit_set(), held + (1 << 20));
  {
    Tensor<float> a({600 * 256});  // 600 KiB
    EXPECT_EQ(memory_in_use(), held + 600 * 1024);
    expect_memory_error([] { Tensor<float> b({600 * 256}); },
                        {"a tensor of shape (153600,)", "614400 bytes (600.0 KiB)", "set_memory_limit", "of which it holds"});
    const Tensor<float> small({100});  // 400 bytes more fit
    EXPECT_EQ(memory_in_use(), held + 600 * 1024 + 400);
    expect_memory_error([&] { const Tensor<float> twice = a; }, {"a copy of a tensor"});
    Tensor<float> moved = std::move(a);  // a move hands the count over
    EXPECT_EQ(memory_in_use(), held + 600 * 1024 + 400);
  }
  EXPECT_EQ(memory_in_use(), held) << "freed tensors give their bytes back";
  const Tensor<float> c({600 * 256});  // fits again
  EXPECT_EQ(c.numel(), 600 * 256);
}

TEST(MemoryLimit, KernelScratchCountsAndIsRefusedOnTheCallingThread) {
  const Tensor<float> q = testing::random_tensor<float>({2, 300, 64}, 3), k = testing::random_tensor<float>({2, 300, 64}, 4);
  Tensor<float> out({2, 300, 64});
  Tensor<double> oracle({2, 300, 64});
  Tensor<float> ref32({2, 300, 64});
  {
    const ScopedBackend reference(Backend::reference);
    const Tensor<double> q64 = testing::convert<double>(q), k64 = testing::convert<double>(k);
    sdpa_forward<double>(oracle, {}, {}, q64, k64, k64);
    sdpa_forward<float>(ref32, {}, {}, q, k, k);
  }
  const ScopedBackend cpu(Backend::cpu);
  for (const int threads : {1, 2}) {
    set_num_threads(threads);
    cpu::ScratchFrame::release();  // this thread's arena; OpenMP's workers keep theirs
    Tensor<float> dq({2, 300, 64});
    {
      const ScopedLimit limit(memory_in_use() + 1024);  // less than any kernel's scratch
      expect_memory_error([&] { sdpa_forward<float>(out, {}, {}, q, k, k); }, {"scratch memory", "set_memory_limit"});
      expect_memory_error([&] { sdpa_backward<float>(dq, {}, {}, out, q, k, k, out, {}); }, {"scratch memory"});
    }
    sdpa_forward<float>(out, {}, {}, q, k, k);  // without the limit it computes, as the reference does
    EXPECT_TRUE(testing::within_error_budget(out, ref32, oracle)) << threads << " threads";
  }
  set_num_threads(0);
}

TEST(MemoryLimit, ALimitBelowWhatIsHeldRefusesEveryAllocation) {
  // ATTN_MAX_BYTES is read once per process: its parsing is tested through the command line
  // (cli.memory_limit, tests/cli_memory_limit.py) and Python (python.test_memory_limit).
  const ScopedLimit limit(1);
  expect_memory_error([] { Tensor<double> t({1}); }, {"8 bytes", "1 bytes"});
  const Tensor<float> none({0, 5});  // no bytes, no refusal
  EXPECT_EQ(none.numel(), 0);
}

}  // namespace
}  // namespace attn
