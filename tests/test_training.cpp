// Training additive attention (attn/train.hpp): the loss and its gradient, the matching task's
// episodes (the right key is the one that shares the query's class), and the training loop: the
// loss falls at least 10x, the learned attention finds the right key, and a fixed seed gives
// bit-identical losses twice and at 1 and 2 threads.
#include "attn/train.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "attn/config.hpp"
#include "support/testing.hpp"

namespace attn {
namespace {

using testing::expect_error;

// ---- the loss -----------------------------------------------------------------------------------

TEST(MseLoss, ValueAndGradient) {
  const Tensor<double> out({2, 2}, {1, 2, 3, 4}), target({2, 2}, {1, 0, 4, 2});
  Tensor<double> dout({2, 2});
  EXPECT_DOUBLE_EQ(mse_loss<double>(out, target, dout), (0 + 4 + 1 + 4) / 4.0);
  EXPECT_EQ(std::vector<double>(dout.values().begin(), dout.values().end()), (std::vector<double>{0, 1, -0.5, 1}));  // 2 (out - target) / 4
  // A strided view: the second column of a (2, 3) tensor as a (2, 1) one.
  const Tensor<double> wide({2, 3}, {0, 5, 0, 0, 7, 0});
  const TensorView<const double> column(wide.data() + 1, {2, 1}, {3, 1});
  const Tensor<double> t({2, 1}, {4, 4});
  EXPECT_DOUBLE_EQ(mse_loss<double>(column, t.cview()), (1 + 9) / 2.0);
}

TEST(MseLoss, RefusesBadShapes) {
  const Tensor<float> a({2, 3}), b({3, 2}), none({0, 3});
  Tensor<float> d({2, 2});
  expect_error([&] { mse_loss<float>(a, b); }, {"mse_loss: target has shape (3,2) but out has shape (2,3)"});
  expect_error([&] { mse_loss<float>(a, a, d); }, {"mse_loss: dout has shape (2,2) but out has shape (2,3)"});
  expect_error([&] { mse_loss<float>(none, none); }, {"mse_loss: out has shape (0,3) with no elements"});
}

// ---- the task -----------------------------------------------------------------------------------

// The position of the largest of n values.
index_t argmax(const double* x, index_t n) { return std::max_element(x, x + n) - x; }

// Without noise every episode is exact: keys have distinct classes (their one-hot part), a query's
// code is its right key's class under one fixed permutation, and its target is that key's value.
TEST(MatchingTask, EpisodesHaveAKnowableRightKey) {
  MatchingTask task;
  task.noise = 0;
  task.seed = 3;
  const MatchingBatch<double> b = task.sample<double>(16, 7);
  ASSERT_EQ(b.queries.shape(), (std::vector<index_t>{16, 8, 12}));
  ASSERT_EQ(b.keys.shape(), (std::vector<index_t>{16, 8, 10}));
  std::vector<index_t> code_of(8, -1);  // query code of each class, the same in every episode
  for (index_t e = 0; e < 16; ++e) {
    std::vector<index_t> key_class;
    for (index_t j = 0; j < 8; ++j) key_class.push_back(argmax(&b.keys(e, j, 0), task.classes));
    std::vector<index_t> sorted = key_class;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(std::unique(sorted.begin(), sorted.end()), sorted.end()) << "episode " << e;
    for (index_t i = 0; i < 8; ++i) {
      const index_t right = b.right_key(e, i), code = argmax(&b.queries(e, i, 0), task.classes);
      const index_t cls = key_class[right];
      if (code_of[cls] < 0) code_of[cls] = code;
      EXPECT_EQ(code_of[cls], code) << "episode " << e << " query " << i;
      for (index_t x = 0; x < task.value_size; ++x) EXPECT_EQ(b.targets(e, i, x), b.values(e, right, x));
    }
  }
  // Same (seed, stream): the same batch; another stream: another one.
  EXPECT_EQ(task.sample<double>(16, 7).queries.values(), b.queries.values());
  EXPECT_NE(task.sample<double>(16, 8).queries.values(), b.queries.values());
}

TEST(MatchingTask, OrderedEpisodeMatchesQueryIToKeyI) {
  MatchingTask task;
  task.queries = 10;
  const MatchingBatch<float> b = task.ordered<float>();
  for (index_t i = 0; i < 10; ++i) EXPECT_EQ(b.right_key(0, i), i % 8);
}

TEST(MatchingTask, RefusesBadSizes) {
  MatchingTask task;
  task.keys = 9;
  expect_error([&] { task.sample<float>(4, 0); },
               {"MatchingTask::sample: keys is 9; it must be in [1, classes = 8] (keys have distinct classes)"});
  task.keys = 8;
  expect_error([&] { task.sample<float>(0, 0); }, {"batch is 0; it must be at least 1"});
  task.noise = -1;
  expect_error([&] { task.ordered<float>(); }, {"MatchingTask::ordered: noise is -1"});
}

// ---- training -----------------------------------------------------------------------------------

// A short run, on 1 thread unless told (the problem is far too small for a team of threads).
std::vector<TrainRecord> train(OptimizerKind optimizer, double lr, index_t steps, int threads = 1) {
  set_num_threads(threads);
  TrainOptions o;
  o.optimizer = optimizer, o.lr = lr, o.steps = steps, o.log_every = 50;
  std::vector<TrainRecord> records;
  train_additive<float>(MatchingTask{}, o, {}, &records);
  set_num_threads(0);
  return records;
}

// Every number of the log but the time (and step 0's training loss, NaN: nothing trained yet).
std::vector<double> losses(const std::vector<TrainRecord>& records) {
  std::vector<double> r;
  for (const TrainRecord& t : records) {
    if (t.step > 0) r.push_back(t.train_loss);
    r.insert(r.end(), {t.eval_loss, t.eval_accuracy});
  }
  return r;
}

// 300 Adam steps: the evaluation loss falls more than 10x from uniform-ish attention (about
// 1 - 1/m = 0.875), the training loss of each window is below the first window's, and the largest
// weight is on the right key for almost every query.
TEST(TrainAdditive, AdamLearnsTheRightKey) {
  const std::vector<TrainRecord> r = train(OptimizerKind::adam, 0.02, 300);
  ASSERT_EQ(r.size(), 7u);  // step 0, then every 50 steps
  EXPECT_TRUE(std::isnan(r[0].train_loss));
  EXPECT_GT(r[0].eval_loss, 0.8);
  EXPECT_LT(r.back().eval_loss, r[0].eval_loss / 10);
  for (std::size_t i = 2; i < r.size(); ++i) EXPECT_LT(r[i].train_loss, r[1].train_loss) << "step " << r[i].step;
  EXPECT_GT(r.back().eval_accuracy, 0.95);
}

TEST(TrainAdditive, SgdLearnsToo) {
  const std::vector<TrainRecord> r = train(OptimizerKind::sgd, 0.3, 300);
  EXPECT_LT(r.back().eval_loss, r[0].eval_loss / 10);
}

// The learned weights put the ordered episode's weight on its diagonal.
TEST(TrainAdditive, LearnedAttentionIsTheIdentityPattern) {
  set_num_threads(1);
  TrainOptions o;
  o.steps = 300;
  const AdditiveWeights<float> w = train_additive<float>(MatchingTask{}, o);
  set_num_threads(0);
  Tensor<float> attention;
  evaluate_matching(w, MatchingTask{}.ordered<float>(), &attention);
  for (index_t i = 0; i < 8; ++i) EXPECT_GT(attention(0, i, i), 0.8f) << "query " << i;
}

TEST(TrainAdditive, FixedSeedGivesBitIdenticalLosses) {
  const std::vector<TrainRecord> a = train(OptimizerKind::adam, 0.02, 100), b = train(OptimizerKind::adam, 0.02, 100);
  EXPECT_EQ(losses(a), losses(b));
  // And at 2 threads (a few steps: on a busy machine every parallel region is slow).
  const std::vector<TrainRecord> one = train(OptimizerKind::adam, 0.02, 10), two = train(OptimizerKind::adam, 0.02, 10, 2);
  EXPECT_EQ(losses(one), losses(two));
}

TEST(TrainAdditive, RefusesBadOptions) {
  const auto with = [](TrainOptions o) { return [o] { train_additive<float>(MatchingTask{}, o); }; };
  expect_error(with({.steps = -1}), {"train_additive: steps is -1; it must not be negative"});
  expect_error(with({.batch = 0}), {"train_additive: batch is 0"});
  expect_error(with({.log_every = 0}), {"train_additive: log_every is 0"});
  expect_error(with({.eval_episodes = 0}), {"train_additive: eval_episodes is 0"});
  expect_error(with({.hidden = 0}), {"AdditiveWeights::init: hidden_size is 0"});
  expect_error(with({.lr = -1}), {"Adam: lr is -1"});
}

}  // namespace
}  // namespace attn
