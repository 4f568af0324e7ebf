// Training additive attention on the matching task (attn/train.hpp): the loss, the task's episodes
// and the loop forward -> loss -> backward -> optimizer step.
#include "attn/train.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <random>

#include "attn/optim.hpp"

namespace attn {
namespace {

// A generator for (seed, stream): the same pair always gives the same numbers (with this standard
// library; std::normal_distribution is not specified bit for bit across implementations).
std::mt19937_64 generator(std::uint64_t seed, std::uint64_t stream) {
  std::seed_seq seq{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32),
                    static_cast<std::uint32_t>(stream), static_cast<std::uint32_t>(stream >> 32)};
  return std::mt19937_64(seq);
}

constexpr std::uint64_t kPermutationStream = ~std::uint64_t(0) - 1;  // the query code's permutation
constexpr std::uint64_t kOrderedStream = ~std::uint64_t(0) - 2;      // ordered()'s values and noise

void check_task(const char* op, const MatchingTask& t, index_t batch) {
  if (t.classes < 1) detail::fail(op, ": classes is ", t.classes, "; it must be at least 1");
  if (t.keys < 1 || t.keys > t.classes)
    detail::fail(op, ": keys is ", t.keys, "; it must be in [1, classes = ", t.classes, "] (keys have distinct classes)");
  if (t.queries < 1) detail::fail(op, ": queries is ", t.queries, "; it must be at least 1");
  if (t.key_noise < 0 || t.query_noise < 0)
    detail::fail(op, ": key_noise is ", t.key_noise, " and query_noise is ", t.query_noise, "; they must not be negative");
  if (t.value_size < 1) detail::fail(op, ": value_size is ", t.value_size, "; it must be at least 1");
  if (!(t.noise >= 0) || !std::isfinite(t.noise))
    detail::fail(op, ": noise is ", t.noise, "; it must be non-negative and finite");
  if (batch < 1) detail::fail(op, ": batch is ", batch, "; it must be at least 1");
}

// Fills episode b of `out` from the classes of its keys and the right key of each query, drawing
// the noise and the values from `rng`.
template <class T>
void fill_episode(MatchingBatch<T>& out, index_t b, const MatchingTask& task, const std::vector<index_t>& key_class,
                  const std::vector<index_t>& right, const std::vector<index_t>& perm, std::mt19937_64& rng) {
  std::normal_distribution<double> noise(0.0, task.noise), value(0.0, 1.0);
  const auto draw = [&] { return task.noise > 0 ? noise(rng) : 0.0; };
  for (index_t j = 0; j < task.keys; ++j) {
    for (index_t c = 0; c < task.key_size(); ++c) out.keys(b, j, c) = static_cast<T>((c == key_class[j]) + draw());
    for (index_t x = 0; x < task.value_size; ++x) out.values(b, j, x) = static_cast<T>(value(rng));
  }
  for (index_t i = 0; i < task.queries; ++i) {
    const index_t code = perm[static_cast<std::size_t>(key_class[right[i]])];
    for (index_t c = 0; c < task.query_size(); ++c) out.queries(b, i, c) = static_cast<T>((c == code) + draw());
    for (index_t x = 0; x < task.value_size; ++x) out.targets(b, i, x) = out.values(b, right[i], x);
    out.right_key(b, i) = right[i];
  }
}

template <class T>
MatchingBatch<T> empty_batch(const MatchingTask& t, index_t B) {
  return {Tensor<T>{B, t.queries, t.query_size()}, Tensor<T>{B, t.keys, t.key_size()},
          Tensor<T>{B, t.keys, t.value_size}, Tensor<T>{B, t.queries, t.value_size},
          Tensor<std::int64_t>{B, t.queries}};
}

// The fixed permutation of the classes that codes the queries.
std::vector<index_t> query_code(const MatchingTask& t) {
  std::vector<index_t> perm(static_cast<std::size_t>(t.classes));
  std::iota(perm.begin(), perm.end(), index_t(0));
  std::mt19937_64 rng = generator(t.seed, kPermutationStream);
  std::shuffle(perm.begin(), perm.end(), rng);
  return perm;
}

}  // namespace

template <class T>
double mse_loss(TensorView<const T> out, TensorView<const T> target, TensorView<T> dout) {
  const char* op = "mse_loss";
  const auto same = [](const auto& a, const auto& b) {
    return std::equal(a.shape().begin(), a.shape().end(), b.shape().begin(), b.shape().end());
  };
  if (!same(out, target))
    detail::fail(op, ": target has shape ", target.shape_string(), " but out has shape ", out.shape_string(),
                 "; they must match");
  if (!dout.empty() && !same(out, dout))
    detail::fail(op, ": dout has shape ", dout.shape_string(), " but out has shape ", out.shape_string(),
                 "; they must match");
  const index_t n = out.numel();
  if (n == 0 || out.data() == nullptr) detail::fail(op, ": out has shape ", out.shape_string(), " with no elements");
  // Element e of a view of any rank up to 4, through its strides.
  const auto at = [](const auto& view, index_t e) -> auto& {
    index_t off = 0;
    for (int d = view.rank() - 1; d >= 0; --d) off += (e % view.dim(d)) * view.stride(d), e /= view.dim(d);
    return view.data()[off];
  };
  double sum = 0;
  for (index_t e = 0; e < n; ++e) {
    const double diff = static_cast<double>(at(out, e)) - static_cast<double>(at(target, e));
    sum += diff * diff;
    if (!dout.empty()) at(dout, e) = static_cast<T>(2 * diff / static_cast<double>(n));
  }
  return sum / static_cast<double>(n);
}

template <class T>
MatchingBatch<T> MatchingTask::sample(index_t batch, std::uint64_t stream) const {
  check_task("MatchingTask::sample", *this, batch);
  const std::vector<index_t> perm = query_code(*this);
  MatchingBatch<T> out = empty_batch<T>(*this, batch);
  std::mt19937_64 rng = generator(seed, stream);
  std::vector<index_t> order(static_cast<std::size_t>(classes)), right(static_cast<std::size_t>(queries));
  std::uniform_int_distribution<index_t> pick(0, keys - 1);
  for (index_t b = 0; b < batch; ++b) {
    std::iota(order.begin(), order.end(), index_t(0));
    std::shuffle(order.begin(), order.end(), rng);  // the first m: the keys' distinct classes
    for (index_t& r : right) r = pick(rng);
    fill_episode(out, b, *this, order, right, perm, rng);
  }
  return out;
}

template <class T>
MatchingBatch<T> MatchingTask::ordered() const {
  check_task("MatchingTask::ordered", *this, 1);
  MatchingBatch<T> out = empty_batch<T>(*this, 1);
  std::vector<index_t> classes(static_cast<std::size_t>(keys)), right(static_cast<std::size_t>(queries));
  std::iota(classes.begin(), classes.end(), index_t(0));
  for (index_t i = 0; i < queries; ++i) right[i] = i % keys;
  std::mt19937_64 rng = generator(seed, kOrderedStream);
  fill_episode(out, 0, *this, classes, right, query_code(*this), rng);
  return out;
}

template <class T>
TrainRecord evaluate_matching(const AdditiveWeights<T>& weights, const MatchingBatch<T>& batch, Tensor<T>* attention) {
  const index_t B = batch.queries.dim(0), n = batch.queries.dim(1), m = batch.keys.dim(1);
  Tensor<T> out{B, n, batch.values.dim(2)}, w{B, n, m};
  additive_attention_forward<T>(out, w, batch.queries, batch.keys, batch.values, weights.params());
  TrainRecord r;
  r.eval_loss = mse_loss<T>(out, batch.targets);
  index_t right = 0;
  for (index_t b = 0; b < B; ++b)
    for (index_t i = 0; i < n; ++i) {
      const T* row = &w(b, i, 0);
      right += std::max_element(row, row + m) - row == batch.right_key(b, i);
    }
  r.eval_accuracy = static_cast<double>(right) / static_cast<double>(B * n);
  if (attention != nullptr) *attention = std::move(w);
  return r;
}

template <class T>
AdditiveWeights<T> train_additive(const MatchingTask& task, const TrainOptions& o,
                                  const std::function<void(const TrainRecord&)>& log,
                                  std::vector<TrainRecord>* records) {
  const char* op = "train_additive";
  if (o.steps < 0) detail::fail(op, ": steps is ", o.steps, "; it must not be negative");
  if (o.log_every < 1) detail::fail(op, ": log_every is ", o.log_every, "; it must be at least 1");
  if (o.eval_episodes < 1) detail::fail(op, ": eval_episodes is ", o.eval_episodes, "; it must be at least 1");
  check_task(op, task, o.batch);
  AdditiveWeights<T> w = AdditiveWeights<T>::init(task.query_size(), task.key_size(), o.hidden, o.init_seed);
  AdditiveWeights<T> g{Tensor<T>(std::span<const index_t>(w.w_q.shape())),
                       Tensor<T>(std::span<const index_t>(w.w_k.shape())),
                       Tensor<T>(std::span<const index_t>(w.w_v.shape()))};
  const std::vector<ParamGrad<T>> params{{w.w_q, g.w_q}, {w.w_k, g.w_k}, {w.w_v, g.w_v}};
  std::unique_ptr<Optimizer<T>> opt;
  if (o.optimizer == OptimizerKind::sgd)
    opt = std::make_unique<Sgd<T>>(params, SgdOptions{.lr = o.lr, .momentum = o.momentum});
  else
    opt = std::make_unique<Adam<T>>(params, AdamOptions{.lr = o.lr});

  const MatchingBatch<T> eval = task.sample<T>(o.eval_episodes, kEvalStream);
  const auto start = std::chrono::steady_clock::now();
  double window = 0;
  const auto record = [&](index_t step) {
    TrainRecord r = evaluate_matching(w, eval);
    r.step = step;
    r.train_loss = step == 0 ? std::numeric_limits<double>::quiet_NaN()
                             : window / static_cast<double>((step - 1) % o.log_every + 1);
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    window = 0;
    if (log) log(r);
    if (records != nullptr) records->push_back(r);
  };
  record(0);
  Tensor<T> out{o.batch, task.queries, task.value_size}, dout{o.batch, task.queries, task.value_size};
  for (index_t step = 0; step < o.steps; ++step) {
    const MatchingBatch<T> batch = task.sample<T>(o.batch, static_cast<std::uint64_t>(step));
    additive_attention_forward<T>(out, {}, batch.queries, batch.keys, batch.values, w.params());
    window += mse_loss<T>(out, batch.targets, dout);
    additive_attention_backward<T>({}, {}, {}, {g.w_q, g.w_k, g.w_v}, dout, batch.queries, batch.keys,
                                   batch.values, w.params());
    opt->step();
    if ((step + 1) % o.log_every == 0 || step + 1 == o.steps) record(step + 1);
  }
  return w;
}

#define ATTN_INSTANTIATE(T)                                                                                    \
  template double mse_loss<T>(TensorView<const T>, TensorView<const T>, TensorView<T>);                        \
  template MatchingBatch<T> MatchingTask::sample<T>(index_t, std::uint64_t) const;                             \
  template MatchingBatch<T> MatchingTask::ordered<T>() const;                                                  \
  template TrainRecord evaluate_matching<T>(const AdditiveWeights<T>&, const MatchingBatch<T>&, Tensor<T>*);   \
  template AdditiveWeights<T> train_additive<T>(const MatchingTask&, const TrainOptions&,                       \
                                                const std::function<void(const TrainRecord&)>&,                \
                                                std::vector<TrainRecord>*);
ATTN_INSTANTIATE(float)
ATTN_INSTANTIATE(double)
#undef ATTN_INSTANTIATE

}  // namespace attn
