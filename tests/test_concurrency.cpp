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
#include "attn/kv_cache.hpp"
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

// attn/kv_cache.hpp, "Threads": calls that only read a cache run side by side. Four threads attend
// one cache at once (decodes, prompt-sized chunks and a mixed batch, float32 and int8 caches, at 1
// and 2 threads each) and get the results of the same calls made one by one.
TEST(Concurrency, ReadersOfOneKvCacheGetTheResultsOfTheSameCallsMadeOneByOne) {
  for (const KvDtype type : {KvDtype::float32, KvDtype::int8}) {
    KvCache cache(3, 2, 32, {.dtype = type, .block_size = 16});
    const Tensor<float> kv = testing::random_tensor<float>({3, 2, 150, 32}, 81);
    cache.append(kv.cview(), kv.cview());
    const Tensor<float> q = testing::random_tensor<float>({4, 20, 32}, 82), packed = testing::random_tensor<float>({23, 4, 32}, 83);
    const std::int32_t cu[] = {0, 1, 3, 23};
    const TensorView<const std::int32_t> cu_view(cu, {4});
    // Call c of four: a decode, a chunk of 20 queries, a decode of every sequence, the mixed batch.
    auto call = [&](int c) {
      const ScopedThreads threads(1 + c % 2);
      Tensor<float> out;
      if (c == 0) {  // each head's first query
        out = Tensor<float>({4, 1, 32});
        cache.attend(out.view(), 1, TensorView<const float>(q.data(), {4, 1, 32}, {20 * 32, 32, 1}));
      }
      if (c == 1) out = Tensor<float>({4, 20, 32}), cache.attend(out.view(), 2, q.cview());
      if (c == 2) {
        Tensor<float> all({3, 4, 1, 32});
        for (index_t b = 0; b < 3; ++b)
          for (index_t h = 0; h < 4; ++h) std::copy_n(&q(h, b, 0), 32, &all(b, h, 0, 0));
        out = Tensor<float>({3, 4, 1, 32}), cache.attend(out.view(), all.cview());
      }
      if (c == 3) out = Tensor<float>({23, 4, 32}), cache.attend_batch(out.view(), packed.cview(), cu_view);
      return out;
    };
    std::vector<Tensor<float>> expected;
    for (int c = 0; c < 4; ++c) expected.push_back(call(c));
    std::vector<std::vector<Tensor<float>>> got(4);
    std::atomic<int> ready{0};
    std::vector<std::thread> readers;
    for (int t = 0; t < 4; ++t)
      readers.emplace_back([&, t] {
        ready.fetch_add(1);
        while (ready.load() < 4) std::this_thread::yield();
        for (int round = 0; round < 4; ++round) got[static_cast<std::size_t>(t)].push_back(call((t + round) % 4));
      });
    for (std::thread& r : readers) r.join();
    for (int t = 0; t < 4; ++t)
      for (int round = 0; round < 4; ++round)
        EXPECT_EQ(got[static_cast<std::size_t>(t)][static_cast<std::size_t>(round)].values(),
                  expected[static_cast<std::size_t>((t + round) % 4)].values())
            << "call " << (t + round) % 4 << " on reader " << t << ", cache type " << static_cast<int>(type);
  }
}

}  // namespace
}  // namespace attn
