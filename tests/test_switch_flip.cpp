// The run-time switches are read once per call (core/switch_plan.hpp): while another thread flips
// set_backend (cpu, reference) and set_simd_target (two supported targets) as fast as it can, every
// call made on the main thread (SDPA forward and backward, additive attention forward and backward,
// Nadaraya-Watson, masked softmax) returns, bit for bit, the result of the same call made beforehand
// under one fixed setting: no call runs part of its work on one setting and part on another. Also
// run under ThreadSanitizer (tests/CMakeLists.txt, threaded_tests).
#include <atomic>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "attn/additive.hpp"
#include "attn/config.hpp"
#include "attn/nadaraya_watson.hpp"
#include "attn/sdpa.hpp"
#include "attn/softmax.hpp"
#include "support/testing.hpp"

namespace attn {
namespace {

using testing::random_tensor;

// One call: its name and what it computes, every output as float32 bits.
struct Call {
  std::string name;
  std::function<std::vector<float>()> run;
};

template <class T>
std::vector<float> values_of(std::initializer_list<const Tensor<T>*> tensors) {
  std::vector<float> all;
  for (const Tensor<T>* t : tensors) all.insert(all.end(), t->data(), t->data() + t->numel());
  return all;
}

// Inputs made once, read by every call. Shapes: SDPA (B, H, n, d) = (2, 2, 70, 32) over m = 90 keys
// (two query blocks, two key tiles, so several tasks and both of the backward's passes); additive
// (B, n, q) = (2, 20, 8), keys (2, 30, 6), hidden 7; Nadaraya-Watson 1-D queries (2, 40, 1) over keys
// (2, 50, 1) (the windowed path); masked softmax scores (2, 3, 20, 25).
std::vector<Call> calls() {
  auto q = std::make_shared<Tensor<float>>(random_tensor<float>({2, 2, 70, 32}, 1));
  auto k = std::make_shared<Tensor<float>>(random_tensor<float>({2, 2, 90, 32}, 2));
  auto v = std::make_shared<Tensor<float>>(random_tensor<float>({2, 2, 90, 16}, 3));
  auto g = std::make_shared<Tensor<float>>(random_tensor<float>({2, 2, 70, 16}, 4));
  auto aq = std::make_shared<Tensor<float>>(random_tensor<float>({2, 20, 8}, 5));
  auto ak = std::make_shared<Tensor<float>>(random_tensor<float>({2, 30, 6}, 6));
  auto av = std::make_shared<Tensor<float>>(random_tensor<float>({2, 30, 5}, 7));
  auto w = std::make_shared<AdditiveWeights<float>>(AdditiveWeights<float>::init(8, 6, 7, 8));
  auto nq = std::make_shared<Tensor<float>>(random_tensor<float>({2, 40, 1}, 9, -3, 3));
  auto nk = std::make_shared<Tensor<float>>(random_tensor<float>({2, 50, 1}, 10, -3, 3));
  auto nv = std::make_shared<Tensor<float>>(random_tensor<float>({2, 50, 3}, 11));
  auto s = std::make_shared<Tensor<float>>(random_tensor<float>({2, 3, 20, 25}, 12, -4, 4));
  Mask<float> causal;
  causal.causal = Causal::top_left;
  std::vector<Call> c;
  c.push_back({"sdpa_forward", [=] {
                 Tensor<float> out({2, 2, 70, 16}), lse({2, 2, 70});
                 sdpa_forward<float>(out.view(), lse.view(), {}, q->view(), k->view(), v->view(), causal);
                 return values_of<float>({&out, &lse});
               }});
  c.push_back({"sdpa_backward", [=] {  // no out or lse given: the backward runs the forward itself
                 Tensor<float> dq({2, 2, 70, 32}), dk({2, 2, 90, 32}), dv({2, 2, 90, 16});
                 sdpa_backward<float>(dq.view(), dk.view(), dv.view(), g->view(), q->view(), k->view(), v->view(), {},
                                      {}, causal);
                 return values_of<float>({&dq, &dk, &dv});
               }});
  c.push_back({"additive_attention_forward", [=] {
                 Tensor<float> out({2, 20, 5});
                 additive_attention_forward<float>(out.view(), {}, aq->view(), ak->view(), av->view(), w->params());
                 return values_of<float>({&out});
               }});
  c.push_back({"additive_attention_backward", [=] {  // its projections' products as well as its chunks
                 Tensor<float> dq({2, 20, 8}), dk({2, 30, 6}), dv({2, 30, 5}), gq({7, 8}), gk({7, 6}), gv({7});
                 const Tensor<float> dout = random_tensor<float>({2, 20, 5}, 13);
                 additive_attention_backward<float>(dq.view(), dk.view(), dv.view(), {gq.view(), gk.view(), gv.view()},
                                                    dout.view(), aq->view(), ak->view(), av->view(), w->params());
                 return values_of<float>({&dq, &dk, &dv, &gq, &gk, &gv});
               }});
  c.push_back({"nadaraya_watson_forward", [=] {
                 Tensor<float> out({2, 40, 3});
                 nadaraya_watson_forward<float>(out.view(), {}, nq->view(), nk->view(), nv->view(), Kernel::gaussian,
                                                0.5f);
                 return values_of<float>({&out});
               }});
  c.push_back({"masked_softmax_forward", [=] {
                 Tensor<float> out({2, 3, 20, 25});
                 masked_softmax_forward<float>(out.view(), s->view(), causal);
                 return values_of<float>({&out});
               }});
  return c;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(SwitchFlip, EveryCallRunsOnOneSettingWhileAnotherThreadFlipsThem) {
  const std::vector<std::string> targets = simd_targets();
  if (targets.size() < 2) GTEST_SKIP() << "one SIMD target only: nothing to flip between";
  const std::string a = targets[0], b = targets[1];
  const std::vector<Call> all = calls();

  // Each call's results under every fixed setting: cpu on either target, and the reference.
  struct Setting {
    Backend backend;
    std::string target;
  };
  const std::vector<Setting> settings = {{Backend::cpu, a}, {Backend::cpu, b}, {Backend::reference, a}};
  std::vector<std::vector<std::vector<float>>> expected(all.size());
  for (const Setting& setting : settings) {
    set_backend(setting.backend);
    set_simd_target(setting.target);
    for (std::size_t i = 0; i < all.size(); ++i) expected[i].push_back(all[i].run());
  }

  std::atomic<bool> done{false};
  std::atomic<long> flips{0};
  std::thread flipper([&] {
    for (int i = 0; !done.load(); ++i) {
      set_backend(i % 2 == 0 ? Backend::reference : Backend::cpu);
      set_simd_target((i / 2) % 2 == 0 ? b : a);
      flips.fetch_add(1);
      std::this_thread::yield();
    }
  });
  constexpr int kRounds = 12;
  std::vector<int> mismatches(all.size(), 0);
  for (int round = 0; round < kRounds; ++round)
    for (std::size_t i = 0; i < all.size(); ++i) {
      const std::vector<float> got = all[i].run();
      bool matched = false;
      for (const std::vector<float>& e : expected[i]) matched = matched || same_bits(got, e);
      if (!matched) ++mismatches[i];
    }
  done.store(true);
  flipper.join();
  set_backend(Backend::cpu);
  set_simd_target("");

  EXPECT_GT(flips.load(), 0);
  for (std::size_t i = 0; i < all.size(); ++i)
    EXPECT_EQ(mismatches[i], 0) << all[i].name << ": " << mismatches[i] << " of " << kRounds
                                << " calls matched no fixed setting's result (" << a << ", " << b << ", reference)";
}

// The switches a call reads are the calling thread's: ScopedBackend and ScopedSimdTarget hold for
// the calls in their scope while the process's settings flip.
TEST(SwitchFlip, ScopedSwitchesHoldWhileTheProcessSettingsFlip) {
  const std::vector<std::string> targets = simd_targets();
  if (targets.size() < 2) GTEST_SKIP() << "one SIMD target only: nothing to flip between";
  const std::vector<Call> all = calls();
  const ScopedBackend backend(Backend::cpu);
  const ScopedSimdTarget target(targets[1]);
  std::vector<std::vector<float>> expected;
  for (const Call& c : all) expected.push_back(c.run());
  std::atomic<bool> done{false};
  std::thread flipper([&] {
    for (int i = 0; !done.load(); ++i) {
      set_backend(i % 2 == 0 ? Backend::reference : Backend::cpu);
      set_simd_target(targets[static_cast<std::size_t>(i) % 2]);
      std::this_thread::yield();
    }
  });
  for (int round = 0; round < 4; ++round)
    for (std::size_t i = 0; i < all.size(); ++i) EXPECT_TRUE(same_bits(all[i].run(), expected[i])) << all[i].name;
  done.store(true);
  flipper.join();
  set_backend(Backend::cpu);
  set_simd_target("");
}

}  // namespace
}  // namespace attn
