// Concurrent callers (attn/config.hpp, "Threads"): 16 threads calling the mixed operations of
// support/calls.hpp at once, each with its own thread count, SIMD target and backend (the scoped,
// per-thread switches), get results bit-identical to the same calls made one by one, while another
// thread keeps changing the process's switches (set_simd_target, set_backend, set_bf16_kernel is
// left alone: it changes results) and its own thread count. Also run under ThreadSanitizer
// (tests/CMakeLists.txt, threaded_tests).
#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "attn/config.hpp"
#include "support/calls.hpp"
#include "support/testing.hpp"

namespace attn {
namespace {

using testing::mixed_calls;

constexpr std::size_t kThreads = 16;
constexpr std::size_t kRounds = 3;  // each thread's calls, one after another

// One thread's work: a call and the switches it runs under.
struct Job {
  std::size_t call;
  int threads;
  std::string target;
  Backend backend;
};

std::vector<double> run(const Job& job) {
  const ScopedThreads threads(job.threads);
  const ScopedSimdTarget target(job.target);
  const ScopedBackend backend(job.backend);
  return mixed_calls()[job.call].run();
}

bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

TEST(Concurrency, SixteenCallersGetTheResultsOfTheSameCallsMadeOneByOne) {
  // Caller t's round r: call (t + r kThreads) mod the calls, so that every call runs beside others.
  const std::vector<std::string> targets = simd_targets();
  std::vector<std::vector<Job>> jobs(kThreads);
  std::vector<std::vector<std::vector<double>>> expected(kThreads);
  for (std::size_t t = 0; t < kThreads; ++t)
    for (std::size_t round = 0; round < kRounds; ++round) {
      const Job job{(t + round * kThreads) % mixed_calls().size(), static_cast<int>(1 + t % 2),
                    targets[(t / 2 + round) % targets.size()], (t + round) % 5 == 4 ? Backend::unfused : Backend::cpu};
      jobs[t].push_back(job);
      expected[t].push_back(run(job));
    }

  std::vector<std::vector<std::vector<double>>> got(kThreads);
  std::atomic<int> ready{0};
  std::atomic<bool> done{false};
  std::vector<std::thread> callers;
  for (std::size_t t = 0; t < kThreads; ++t)
    callers.emplace_back([&, t] {
      ready.fetch_add(1);
      while (ready.load() < static_cast<int>(kThreads)) std::this_thread::yield();  // start together
      for (const Job& job : jobs[t]) got[t].push_back(run(job));
    });
  // Meanwhile the process's switches change under the callers (their scoped switches hold).
  std::thread switcher([&] {
    for (int i = 0; !done.load(); ++i) {
      set_simd_target(targets[static_cast<std::size_t>(i) % targets.size()]);
      set_backend(i % 3 == 0 ? Backend::reference : Backend::cpu);
      set_num_threads(1 + i % 2);
      std::this_thread::yield();
    }
  });
  for (std::thread& c : callers) c.join();
  done.store(true);
  switcher.join();
  set_simd_target("");
  set_backend(Backend::cpu);

  for (std::size_t t = 0; t < kThreads; ++t)
    for (std::size_t round = 0; round < kRounds; ++round) {
      const Job& job = jobs[t][round];
      EXPECT_TRUE(same_bits(got[t][round], expected[t][round]))
          << mixed_calls()[job.call].name << " (" << job.threads << " threads, " << job.target << ") on caller " << t
          << ", round " << round << ": not the result of the same call made alone";
    }
}

TEST(Concurrency, ScopedSwitchesAreTheCallingThreadsOnly) {
  const std::string process_target = simd_target();
  const std::vector<std::string> targets = simd_targets();
  const ScopedSimdTarget target(targets.back());
  const ScopedBackend reference(Backend::reference);
  EXPECT_EQ(simd_target(), targets.back());
  EXPECT_EQ(backend(), Backend::reference);
  std::thread other([&] {
    EXPECT_EQ(simd_target(), process_target) << "another thread sees the process's target";
    EXPECT_EQ(attn::backend(), Backend::cpu);
  });
  other.join();
  {
    const ScopedSimdTarget inner(targets.front());  // scopes nest
    EXPECT_EQ(simd_target(), targets.front());
  }
  EXPECT_EQ(simd_target(), targets.back());
  testing::expect_error([] { const ScopedSimdTarget bad("avx9000"); }, {"ScopedSimdTarget", "\"avx9000\"", "they are"});
}

}  // namespace
}  // namespace attn
