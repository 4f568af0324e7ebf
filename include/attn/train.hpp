// Training a learnable scoring function end to end: a mean squared error loss, a toy task whose
// right key is known, and a loop that fits additive attention's W_q, W_k, w_v to it with the
// optimizers of attn/optim.hpp. What examples/train_additive.cpp runs and the tests check.
//
// The matching task: every episode has m keys with distinct hidden classes (a random subset of
// `classes`, in random order) and n queries, each with the class of one of the keys. The class is
// the hidden feature a query shares with its right key; what the model sees is
//   key   (classes + key_noise)    one-hot of its class, then key_noise features of pure noise
//   query (classes + query_noise)  one-hot of its class under a fixed permutation of the classes,
//                                  then query_noise features of pure noise
// with normal(0, noise) added to every feature, so queries and keys have different sizes and
// codes. Values are fresh normal(0, 1) vectors per episode, and a query's target is the value of
// its right key: only attention on that key predicts it. Uniform attention has a loss of about
// 1 - 1/m; attention that puts all weight on the right key, 0.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "attn/additive.hpp"
#include "attn/tensor.hpp"

namespace attn {

// mean((out - target)^2) over all elements; dout (optional, same shape) receives its gradient
// 2 (out - target) / numel. attn::Error when the shapes differ or out has no elements.
template <class T>
double mse_loss(TensorView<const T> out, TensorView<const T> target, TensorView<T> dout = {});

// A batch of episodes: queries (B, n, q), keys (B, m, k), values (B, m, v), targets (B, n, v) and
// the index of each query's right key, right_key (B, n).
template <class T>
struct MatchingBatch {
  Tensor<T> queries, keys, values, targets;
  Tensor<std::int64_t> right_key;
};

struct MatchingTask {
  index_t classes = 8;
  index_t keys = 8;      // m, at most classes
  index_t queries = 8;   // n
  index_t key_noise = 2, query_noise = 4, value_size = 4;
  double noise = 0.1;
  std::uint64_t seed = 0;  // draws the permutation of the query code and every episode

  /// The sizes of a query and of a key: the classes' one-hot part and the noise dimensions.
  index_t query_size() const { return classes + query_noise; }
  index_t key_size() const { return classes + key_noise; }

  // `batch` episodes of stream `stream` (a training step, or a stream reserved for evaluation); the
  // same (seed, stream) always gives the same batch. attn::Error for sizes out of range.
  template <class T>
  MatchingBatch<T> sample(index_t batch, std::uint64_t stream) const;

  // One episode whose key j has class j and query i class i mod m (n queries, m keys): with the
  // right key learned, its weights are the identity pattern, a bright diagonal on a heatmap.
  template <class T>
  MatchingBatch<T> ordered() const;
};

enum class OptimizerKind { sgd, adam };

struct TrainOptions {
  OptimizerKind optimizer = OptimizerKind::adam;
  double lr = 0.01;
  double momentum = 0.9;  // SGD only
  index_t steps = 1000, batch = 32, hidden = 16;
  index_t log_every = 100;       // a record every log_every steps, and one before the first step
  index_t eval_episodes = 256;   // the fixed evaluation batch (stream kEvalStream of the task)
  std::uint64_t init_seed = 0;   // AdditiveWeights::init's seed
};

// One line of the training log.
struct TrainRecord {
  index_t step = 0;         // updates taken so far
  double train_loss = 0;    // mean loss of the batches since the previous record (step 0: none, NaN)
  double eval_loss = 0;     // loss on the fixed evaluation batch
  double eval_accuracy = 0; // fraction of its queries whose largest weight is on the right key
  double seconds = 0;       // since training started
};

inline constexpr std::uint64_t kEvalStream = ~std::uint64_t(0);

// Initialises additive attention with AdditiveWeights<T>::init(q, k, hidden, init_seed), trains it
// on batches task.sample(batch, step) for `steps` steps, and returns the trained weights; `log`
// receives every record (print it, plot it) and `records`, when given, all of them. Deterministic:
// the same task, options and precision give bit-identical records (but for seconds) at any thread
// count. attn::Error for options out of range (steps < 0, batch, hidden, log_every or eval_episodes
// < 1, and the optimizer's own checks).
template <class T>
AdditiveWeights<T> train_additive(const MatchingTask& task, const TrainOptions& options,
                                  const std::function<void(const TrainRecord&)>& log = {},
                                  std::vector<TrainRecord>* records = nullptr);

// The loss and accuracy of the parameters `weights` on `batch` (step and seconds left 0);
// `attention`, when given, receives the attention weights (B, n, m).
template <class T>
TrainRecord evaluate_matching(const AdditiveWeights<T>& weights, const MatchingBatch<T>& batch,
                              Tensor<T>* attention = nullptr);

}  // namespace attn
