// Determinism: every kernel family's forward and backward (dQ included), on the calls of
// support/calls.hpp, gives bit-identical results over 100 repeated runs, at 1 and at 2 threads, on
// every SIMD target this CPU runs; and the targets agree with each other within the call's precision
// (their sums are ordered differently: bit identity across targets is not promised).
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "attn/config.hpp"
#include "support/calls.hpp"
#include "support/testing.hpp"

namespace attn {
namespace {

using testing::MixedCall;
using testing::mixed_calls;

constexpr int kRuns = 100;

// Bit equality of two results (NaN equal to the same NaN).
bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

class Determinism : public ::testing::TestWithParam<std::size_t> {};

TEST_P(Determinism, BitIdenticalOverRepeatedRunsOnEveryTargetAtOneAndTwoThreads) {
  const MixedCall& call = mixed_calls()[GetParam()];
  std::vector<double> best;  // the best target's result, at 1 thread
  for (const std::string& target : simd_targets()) {
    const ScopedSimdTarget scoped(target);
    std::vector<double> one_thread;
    for (const int threads : {1, 2}) {
      const ScopedThreads scoped_threads(threads);
      const std::vector<double> first = call.run();
      ASSERT_FALSE(first.empty());
      for (int run = 1; run < kRuns; ++run)
        ASSERT_TRUE(same_bits(call.run(), first)) << call.name << " on " << target << " at " << threads
                                                  << " threads: run " << run << " differs from run 0";
      if (threads == 1) one_thread = first;
      // Results never depend on the thread count (attn/config.hpp).
      EXPECT_TRUE(same_bits(first, one_thread)) << call.name << " on " << target << ": 2 threads differ from 1";
    }
    if (best.empty()) {
      best = one_thread;
      continue;
    }
    ASSERT_EQ(one_thread.size(), best.size());
    double worst = 0;
    for (std::size_t i = 0; i < best.size(); ++i)
      if (std::isfinite(best[i])) worst = std::max(worst, std::abs(one_thread[i] - best[i]) / (1 + std::abs(best[i])));
      else EXPECT_EQ(std::isnan(best[i]), std::isnan(one_thread[i])) << call.name << " on " << target << ", value " << i;
    EXPECT_LE(worst, call.target_tolerance) << call.name << ": " << target << " against " << simd_targets().front();
  }
}

INSTANTIATE_TEST_SUITE_P(Calls, Determinism, ::testing::Range<std::size_t>(0, mixed_calls().size()),
                         [](const ::testing::TestParamInfo<std::size_t>& info) {
                           std::string name = mixed_calls()[info.param].name;
                           for (char& c : name)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return name;
                         });

}  // namespace
}  // namespace attn
