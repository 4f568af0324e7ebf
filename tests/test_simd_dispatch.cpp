// The SIMD switch (attn/config.hpp, cpu/simd/dispatch.hpp): every fused kernel runs the target that
// was chosen, on every thread, as the kernels' own probe records it (not judged by timing), after
// any sequence of the switch's calls; a call keeps its target while another thread switches. The
// suites of `ctest -L simd` are checked to run the target they are named after by the environment
// in support/testing.cpp.
#include <atomic>
#include <thread>
#include <vector>

#include "attn/additive.hpp"
#include "attn/diagnostics.hpp"
#include "attn/nadaraya_watson.hpp"
#include "attn/machine.hpp"
#include "attn/sdpa.hpp"
#include "cpu/simd/additive.hpp"
#include "cpu/simd/dispatch.hpp"
#include "support/testing.hpp"

namespace attn {
namespace {

using testing::random_tensor;

// Runs every op with fused kernels once, big enough to use two threads: SDPA forward (tiled and
// decode) and backward, additive forward and backward, windowed Nadaraya-Watson (its v = 1 SIMD loop).
void run_every_fused_kernel() {
  const Tensor<float> q = random_tensor<float>({2, 4, 130, 32}, 1), k = random_tensor<float>({2, 4, 300, 32}, 2);
  const Tensor<float> v = random_tensor<float>({2, 4, 300, 16}, 3), g = random_tensor<float>({2, 4, 130, 16}, 4);
  Tensor<float> out({2, 4, 130, 16}), dq(q.shape()), dk(k.shape()), dv(v.shape());
  sdpa_forward<float>(out.view(), {}, {}, q.view(), k.view(), v.view());
  sdpa_backward<float>(dq.view(), dk.view(), dv.view(), g.view(), q.view(), k.view(), v.view(), out.view(), {});
  const Tensor<float> q1 = random_tensor<float>({2, 4, 1, 32}, 5);
  Tensor<float> out1({2, 4, 1, 16});
  sdpa_forward<float>(out1.view(), {}, {}, q1.view(), k.view(), v.view());
  const Tensor<float> w_q = random_tensor<float>({8, 32}, 6), w_k = random_tensor<float>({8, 32}, 7);
  const Tensor<float> w_v = random_tensor<float>({8}, 8);
  const AdditiveParams<float> params{w_q.view(), w_k.view(), w_v.view()};
  additive_attention_forward<float>(out.view(), {}, q.view(), k.view(), v.view(), params);
  Tensor<float> dwq(w_q.shape()), dwk(w_k.shape()), dwv(w_v.shape());
  additive_attention_backward<float>(dq.view(), dk.view(), dv.view(), {dwq.view(), dwk.view(), dwv.view()}, g.view(),
                                     q.view(), k.view(), v.view(), params);
  const Tensor<float> x = random_tensor<float>({4, 500, 1}, 9, 0, 4), y = random_tensor<float>({4, 600, 1}, 10, 0, 4);
  const Tensor<float> yv = random_tensor<float>({4, 600, 1}, 11);
  Tensor<float> nw_out({4, 500, 1});
  nadaraya_watson_forward<float>(nw_out.view(), {}, x.view(), y.view(), yv.view(), Kernel::gaussian, 0.2f);
}

class SimdSwitch : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const auto targets = simd_targets();
    if (std::find(targets.begin(), targets.end(), GetParam()) == targets.end())
      GTEST_SKIP() << "this build and CPU cannot run " << GetParam() << " (it runs " << ::testing::PrintToString(targets) << ")";
  }
  void TearDown() override {
    set_simd_target("");
    set_num_threads(0);
  }
};

// The target set is the one that runs, on both threads, whatever else was asked of the switch in
// between (simd_target() and simd_targets() once reset Highway's choice and sent every kernel to
// the best target).
TEST_P(SimdSwitch, EveryKernelRunsTheChosenTargetOnEveryThread) {
  set_num_threads(2);
  set_simd_target(GetParam());
  const std::int64_t bit = cpu::simd::current().bit;  // Highway's bit of the target
  EXPECT_EQ(cpu::simd::name(bit), GetParam());
  EXPECT_EQ(simd_target(), GetParam());
  (void)simd_targets();
  EXPECT_EQ(simd_target(), GetParam());
  cpu::simd::reset_ran();
  run_every_fused_kernel();
  EXPECT_EQ(cpu::simd::ran(0), bit) << "thread 0 ran " << ::testing::PrintToString(simd_targets_ran());
  EXPECT_EQ(cpu::simd::ran(1), bit) << "thread 1 ran " << ::testing::PrintToString(simd_targets_ran());
  EXPECT_EQ(simd_targets_ran(true), std::vector<std::string>{GetParam()});
  EXPECT_TRUE(simd_targets_ran().empty()) << "reset = true clears the record";
}

// attn bench's machine probes and the tanh the tests measure are dispatched the same way.
TEST_P(SimdSwitch, MachineProbesAndTanhRunTheChosenTarget) {
  set_simd_target(GetParam());
  set_num_threads(1);
  cpu::simd::reset_ran();
  std::vector<float> x(100, 0.5f), y(100);
  cpu::fused::simd_tanh(x.data(), y.data(), x.size());
  (void)attn::machine::read_bandwidth(std::size_t(1) << 16);
  EXPECT_EQ(simd_targets_ran(true), std::vector<std::string>{GetParam()});
}

INSTANTIATE_TEST_SUITE_P(Targets, SimdSwitch, ::testing::Values("avx3", "avx2", "sse4", "scalar"),
                         [](const auto& info) { return info.param; });

// One thread switches targets as fast as it can while another computes: every result is bit for bit
// the result of one target, never a mixture (each call reads the target once, when it starts).
TEST(SimdSwitchConcurrently, ACallKeepsTheTargetItStartedWith) {
  const auto targets = simd_targets();
  if (targets.size() < 2) GTEST_SKIP() << "this CPU runs a single SIMD target";
  const Tensor<float> q = random_tensor<float>({1, 2, 200, 24}, 12), k = random_tensor<float>({1, 2, 300, 24}, 13);
  const Tensor<float> v = random_tensor<float>({1, 2, 300, 8}, 14);
  std::vector<Tensor<float>::Storage> per_target;
  for (const std::string& t : targets) {
    set_simd_target(t);
    per_target.push_back(scaled_dot_product_attention<float>(q.view(), k.view(), v.view()).values());
  }
  std::atomic<bool> stop{false};
  std::thread switcher([&] {
    for (std::size_t i = 0; !stop.load(); ++i) set_simd_target(targets[i % targets.size()]);
  });
  int mixtures = 0;
  for (int call = 0; call < 60; ++call) {
    const Tensor<float>::Storage got = scaled_dot_product_attention<float>(q.view(), k.view(), v.view()).values();
    if (std::find(per_target.begin(), per_target.end(), got) == per_target.end()) ++mixtures;
  }
  stop = true;
  switcher.join();
  set_simd_target("");
  EXPECT_EQ(mixtures, 0) << "results that are no target's own";
}

TEST(SimdSwitch, UnknownTargetsAreRefusedWithTheKnownOnes) {
  testing::expect_error([] { set_simd_target("avx9"); },
                        {"set_simd_target: target \"avx9\" is not one this build and CPU can run", simd_targets().back().c_str()});
}

}  // namespace
}  // namespace attn
