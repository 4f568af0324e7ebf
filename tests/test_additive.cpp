// additive attention: the d2l chapter's example, every mask and dropout against the float64 reference on
// odd sizes (the cpu backend's fused path and, with the weights asked for, its unfused one), hidden
// sizes 37 and 128, scores that overflow a softmax without max-subtraction, thread-count
// independence, garbage in masked keys, gradients of every input and parameter by finite
// differences, the SIMD tanh's accuracy, the nn.Linear-style init, bad input.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attn/additive.hpp"
#include "cpu/simd/additive.hpp"
#include "support/qkv_cases.hpp"
#include "support/testing.hpp"

namespace attn {
namespace {

using testing::convert;
using testing::QkvSizes;
using testing::random_tensor;

const std::vector<std::string> kNames = {"queries", "keys", "values", "w_q", "w_k", "w_v"};

// queries (B, [H,] n, q), keys, values, then W_q (h, q), W_k (h, k), w_v (h,) drawn like
// AdditiveWeights::init (U(+-1/sqrt(fan_in))), w_v further scaled by wv_scale.
std::vector<Tensor<double>> make_inputs(const QkvSizes& s, index_t h, std::uint64_t seed, double wv_scale = 1) {
  const double bq = 1 / std::sqrt(double(s.q)), bk = 1 / std::sqrt(double(s.k)), bh = wv_scale / std::sqrt(double(h));
  return {random_tensor<double>(s.dims(s.n, s.q), seed),      random_tensor<double>(s.dims(s.m, s.k), seed + 1),
          random_tensor<double>(s.dims(s.m, s.v), seed + 2),  random_tensor<double>({h, s.q}, seed + 3, -bq, bq),
          random_tensor<double>({h, s.k}, seed + 4, -bk, bk), random_tensor<double>({h}, seed + 5, -bh, bh)};
}

template <class T>
AdditiveParams<T> params(const std::vector<Tensor<T>>& in) {
  return {in[3].view(), in[4].view(), in[5].view()};
}

// The op as qkv_cases.hpp drives it.
struct Additive {
  template <class T>
  static Tensor<T> forward(const std::vector<Tensor<T>>& in, const QkvSizes& s, const Mask<T>& mask,
                           const Dropout& dropout, Tensor<T>* weights) {
    Tensor<T> out(s.dims(s.n, s.v));
    additive_attention_forward<T>(out.view(), weights ? weights->view() : TensorView<T>{}, in[0].view(), in[1].view(),
                                  in[2].view(), params(in), mask, dropout);
    return out;
  }
  // The gradients of every input and parameter, in the order of make_inputs.
  template <class T>
  static std::vector<Tensor<T>> backward(const std::vector<Tensor<T>>& in, const Tensor<T>& dout, const Mask<T>& mask,
                                         const Dropout& dropout) {
    std::vector<Tensor<T>> g;
    for (const Tensor<T>& t : in) g.emplace_back(std::span<const index_t>(t.shape()));
    additive_attention_backward<T>(g[0].view(), g[1].view(), g[2].view(), {g[3].view(), g[4].view(), g[5].view()},
                                   dout.view(), in[0].view(), in[1].view(), in[2].view(), params(in), mask, dropout);
    return g;
  }
};

TEST(AdditiveAttention, D2lExampleAveragesTheValidValues) {
  // queries = normal(0, 1, (2, 1, 20)); keys = ones((2, 10, 2));
  // values = arange(40).reshape(1, 10, 4).repeat(2, 1, 1); valid_lens = [2, 6];
  // AdditiveAttention(key_size=2, query_size=20, num_hiddens=8, dropout=0.1).eval()
  // Equal keys give equal scores: the weights are uniform over the valid keys.
  Tensor<double> queries({2, 1, 20}), keys({2, 10, 2}), values({2, 10, 4});
  std::mt19937_64 gen(0);
  std::normal_distribution<double> normal(0, 1);
  for (index_t e = 0; e < queries.numel(); ++e) queries[e] = normal(gen);
  for (index_t e = 0; e < keys.numel(); ++e) keys[e] = 1;
  for (index_t e = 0; e < values.numel(); ++e) values[e] = double(e % 40);
  const Tensor<std::int64_t> lens({2}, {2, 6});
  const auto w64 = AdditiveWeights<double>::init(20, 2, 8, 7);
  const std::vector<Tensor<double>> in64 = {queries, keys, values, w64.w_q, w64.w_k, w64.w_v};
  const double expected[2][4] = {{2, 3, 4, 5}, {10, 11, 12, 13}};
  auto check = [&]<class T>(double tol) {
    std::vector<Tensor<T>> in;
    for (const auto& t : in64) in.push_back(convert<T>(t));
    Mask<T> mask;
    mask.valid_lens = lens.view();
    Tensor<T> weights({2, 1, 10});
    const Tensor<T> out = Additive::forward(in, {2, 0, 1, 10, 20, 2, 4}, mask, {}, &weights);
    for (index_t b = 0; b < 2; ++b) {
      for (index_t c = 0; c < 4; ++c) EXPECT_NEAR(out(b, 0, c), expected[b][c], tol) << "b=" << b << " c=" << c;
      double sum = 0;
      for (index_t j = 0; j < 10; ++j) {
        if (j >= lens[b]) {
          EXPECT_EQ(weights(b, 0, j), T(0)) << "b=" << b << " j=" << j;
        }
        sum += weights(b, 0, j);
      }
      EXPECT_NEAR(sum, 1.0, tol);
    }
  };
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    ScopedBackend use(backend);
    check.template operator()<float>(1e-5);
    check.template operator()<double>(1e-12);
  }
}

// Out, weights and every gradient of the cpu backend against the float64 reference, for every mask
// case of qkv_cases.hpp (dropout included: its mask is keyed by position, so both backends drop the
// same weights), at 1 and 2 threads.
class AdditiveAttentionCases : public ::testing::TestWithParam<testing::MaskCase> {};

TEST_P(AdditiveAttentionCases, MatchesFloat64ReferenceOn3DTensors) {
  testing::expect_op_matches_reference<Additive>(testing::kOdd3, GetParam(), make_inputs(testing::kOdd3, 37, 100));
}
TEST_P(AdditiveAttentionCases, MatchesFloat64ReferenceWithHeads) {
  testing::expect_op_matches_reference<Additive>(testing::kOdd4, GetParam(), make_inputs(testing::kOdd4, 37, 100));
}

INSTANTIATE_TEST_SUITE_P(AllMasks, AdditiveAttentionCases, ::testing::ValuesIn(testing::all_mask_cases()),
                         [](const auto& info) { return std::string(info.param.name); });

// h = 128 (the benchmark's hidden size: several vectors of tanh per score, more than one chunk of
// keys per head in the backward) with the masks that exercise different code paths.
TEST(AdditiveAttention, HiddenSize128MatchesFloat64Reference) {
  for (const testing::MaskCase& mc : testing::all_mask_cases()) {
    const std::string name = mc.name;
    if (name != "none" && name != "causal" && name != "everything" && name != "d2l_fill") continue;
    SCOPED_TRACE(name);
    testing::expect_op_matches_reference<Additive>(testing::kOdd3, mc, make_inputs(testing::kOdd3, 128, 110));
  }
}

TEST(AdditiveAttention, OverflowingScoresMatchFloat64Reference) {
  // w_v scaled so that |scores| reaches ~1e3: exp(score) overflows without max-subtraction.
  const QkvSizes s = testing::kOdd3;
  const double wv_scale = 2500;
  const std::vector<Tensor<double>> in = make_inputs(s, 37, 100, wv_scale);
  double max_score = 0;
  for (index_t b = 0; b < s.B; ++b)
    for (index_t i = 0; i < s.n; ++i)
      for (index_t j = 0; j < s.m; ++j) {
        double score = 0;
        for (index_t p = 0; p < 37; ++p) {
          double qp = 0, kp = 0;
          for (index_t c = 0; c < s.q; ++c) qp += in[3](p, c) * in[0](b, i, c);
          for (index_t c = 0; c < s.k; ++c) kp += in[4](p, c) * in[1](b, j, c);
          score += in[5](p) * std::tanh(qp + kp);
        }
        max_score = std::max(max_score, std::abs(score));
      }
  ASSERT_GT(max_score, 500.0);
  // With w_v ~ 400 any error of the tanh is magnified in the scores and in w_v (1 - tanh^2): the
  // forward's fast rational tanh (5.6 ulps) kept the outputs within 2x but put dkeys at 2.3x the
  // float32 reference's error; the backward computes its scores with TanhAccurate (1.2 x 2^-23).
  testing::expect_op_matches_reference<Additive>(s, {"lens_per_query", false, true}, in);
}

// The analytic gradients of every input and parameter, with a per-query valid-lens mask (lengths 0
// to m) and with dropout, 3-D and 4-D, by both backends.
TEST(AdditiveAttention, BackwardMatchesFiniteDifferences) {
  for (const QkvSizes& s : {testing::kSmall3, testing::kSmall4})
    for (const testing::MaskCase& mc : {testing::MaskCase{"lens", false, true},
                                        testing::MaskCase{"lens_and_dropout", false, true, false, Causal::none,
                                                          MaskedFill::exclude, 0.3}}) {
      SCOPED_TRACE(std::string(mc.name) + (s.H == 0 ? ", 3-D" : ", 4-D"));
      testing::expect_op_gradients_match<Additive>(s, mc, make_inputs(s, 6, 300, 3), kNames);
    }
}

// attn/mask.hpp: a query with nothing to attend to outputs 0, has weights 0 and gradients 0; a key
// no query sees gets gradient 0.
TEST(AdditiveAttention, EmptyRowsOutputZeroWithZeroGradients) {
  const QkvSizes s = testing::kSmall3;
  const std::vector<Tensor<double>> in = make_inputs(s, 6, 500);
  const Tensor<std::int64_t> lens({2, 3}, {0, 5, 2, 0, 0, 0});  // batch element 1 attends to nothing
  Mask<double> mask;
  mask.valid_lens = lens.view();
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    ScopedBackend use(backend);
    Tensor<double> weights(s.dims(s.n, s.m));
    const Tensor<double> out = Additive::forward(in, s, mask, {}, &weights);
    const Tensor<double> fused = Additive::forward<double>(in, s, mask, {}, nullptr);  // the fused path
    const std::vector<Tensor<double>> g = Additive::backward(in, random_tensor<double>(s.dims(s.n, s.v), 501), mask, {});
    for (index_t j = 0; j < s.m; ++j) EXPECT_EQ(weights(0, 0, j), 0.0);
    for (index_t c = 0; c < s.v; ++c) {
      EXPECT_EQ(out(0, 0, c), 0.0);
      EXPECT_EQ(fused(0, 0, c), 0.0);
    }
    for (index_t c = 0; c < s.q; ++c) EXPECT_EQ(g[0](0, 0, c), 0.0);  // dqueries
    for (index_t i = 0; i < s.n; ++i) {
      for (index_t j = 0; j < s.m; ++j) EXPECT_EQ(weights(1, i, j), 0.0);
      for (index_t c = 0; c < s.v; ++c) {
        EXPECT_EQ(out(1, i, c), 0.0);
        EXPECT_EQ(fused(1, i, c), 0.0);
      }
      for (index_t c = 0; c < s.q; ++c) EXPECT_EQ(g[0](1, i, c), 0.0);  // dqueries
    }
    for (index_t j = 0; j < s.m; ++j) {
      for (index_t c = 0; c < s.k; ++c) EXPECT_EQ(g[1](1, j, c), 0.0);  // dkeys
      for (index_t c = 0; c < s.v; ++c) EXPECT_EQ(g[2](1, j, c), 0.0);  // dvalues
    }
    for (const Tensor<double>& t : g)
      for (index_t e = 0; e < t.numel(); ++e) EXPECT_TRUE(std::isfinite(t[e]));
  }
}

// m = 0: every row is empty; nothing is read from the (null) keys and values.
TEST(AdditiveAttention, NoKeysOutputsZero) {
  const QkvSizes s{2, 0, 3, 0, 4, 3, 2};
  const std::vector<Tensor<double>> in = make_inputs(s, 6, 600);
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    ScopedBackend use(backend);
    const Tensor<double> out = Additive::forward<double>(in, s, {}, {}, nullptr);
    for (index_t e = 0; e < out.numel(); ++e) EXPECT_EQ(out[e], 0.0);
    for (const Tensor<double>& t : Additive::backward<double>(in, random_tensor<double>(s.dims(s.n, s.v), 601), {}, {}))
      for (index_t e = 0; e < t.numel(); ++e) EXPECT_EQ(t[e], 0.0);
  }
}

// NaN and Inf stored in keys and values a query may not see (valid lengths (B,) and a keep mask,
// spread over several key tiles and query blocks) change no output and no gradient: masked keys are
// never read, or only through a weight or a gradient factor of exactly 0 that is skipped.
TEST(AdditiveAttention, GarbageInMaskedKeysAndValuesNeverReachesOutputsOrGradients) {
  const QkvSizes s{2, 0, 70, 150, 5, 4, 3};
  const std::vector<Tensor<double>> in64 = make_inputs(s, 9, 800);
  const Tensor<double> dout64 = random_tensor<double>(s.dims(s.n, s.v), 801);
  const Tensor<std::int64_t> lens({2}, {100, 47});
  Tensor<bool> keep({2, 1, 150});
  for (index_t e = 0; e < keep.numel(); ++e) keep[e] = e % 9 != 4;
  auto run = [&]<class T>(bool dirty, bool with_keep) {
    std::vector<Tensor<T>> in;
    for (const auto& t : in64) in.push_back(convert<T>(t));
    if (dirty) {
      for (index_t j = 0; j < s.m; ++j) {
        const bool hidden0 = j >= 100 || (with_keep && !keep(0, 0, j)), hidden1 = j >= 47 || (with_keep && !keep(1, 0, j));
        const T bad = j % 3 == 0 ? T(NAN) : j % 3 == 1 ? T(INFINITY) : -T(INFINITY);
        for (index_t c = 0; c < s.k; ++c) {
          if (hidden0) in[1](0, j, c) = bad;
          if (hidden1) in[1](1, j, c) = bad;
        }
        for (index_t c = 0; c < s.v; ++c) {
          if (hidden0) in[2](0, j, c) = bad;
          if (hidden1) in[2](1, j, c) = bad;
        }
      }
    }
    Mask<T> mask;
    mask.valid_lens = lens.view();
    if (with_keep) mask.keep = keep.view();
    std::vector<Tensor<T>> r{Additive::forward<T>(in, s, mask, {0.25, 3}, nullptr)};
    for (Tensor<T>& g : Additive::backward<T>(in, convert<T>(dout64), mask, {0.25, 3})) r.push_back(std::move(g));
    return r;
  };
  ScopedBackend cpu(Backend::cpu);
  for (bool with_keep : {false, true}) {
    SCOPED_TRACE(with_keep ? "valid lengths and keep mask" : "valid lengths");
    const auto clean = run.template operator()<float>(false, with_keep);
    const auto dirty = run.template operator()<float>(true, with_keep);
    // out, then the gradients of queries, keys, values (0 for the masked rows either way) and parameters.
    for (std::size_t t = 0; t < clean.size(); ++t) EXPECT_EQ(clean[t].values(), dirty[t].values()) << "tensor " << t;
  }
}

// The kernels' SIMD tanh (simd/tanh-inl.h) against std::tanh in double (float) and long double
// (double), on the current SIMD target, within the bounds stated there: float on every 61st float in
// [0, 10] and their negations, subnormals and the extremes; double on a dense grid and tiny values.
// Odd symmetry is exact, 0 keeps its sign, +-inf gives +-1 and NaN propagates.
TEST(TanhAccuracy, FloatWithinStatedBound) {
  const double bound = 3.4e-7;
  std::vector<float> x;
  for (std::uint32_t bits = 0; bits <= 0x41200000u; bits += 61) {
    float v;
    std::memcpy(&v, &bits, sizeof v);
    x.push_back(v), x.push_back(-v);
  }
  for (float v : {1e-45f, 1e-40f, 1.17549435e-38f, 3e-4f, 4e-4f, 0.0322536826f, 0.625f, 7.9f, 8.9999f, 9.0f, 9.5f, 10.0f,
                  20.0f, 1e10f, 3.4e38f})
    x.push_back(v), x.push_back(-v);
  std::vector<float> y(x.size());
  cpu::fused::simd_tanh(x.data(), y.data(), x.size());
  double worst = 0, where = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double t = std::tanh(static_cast<double>(x[i]));
    const double e = t == 0 ? std::abs(static_cast<double>(y[i])) : std::abs(y[i] - t) / std::abs(t);
    if (e > worst) worst = e, where = x[i];
    if (i % 2 == 1) {
      ASSERT_EQ(y[i], -y[i - 1]) << "x = " << x[i];
    }
  }
  EXPECT_LE(worst, bound) << "at x = " << where;
  const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN};
  float out[5];
  cpu::fused::simd_tanh(special, out, 5);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_FALSE(std::signbit(out[0]));
  EXPECT_TRUE(std::signbit(out[1]));
  EXPECT_LE(std::abs(out[2] - 1.0), bound);
  EXPECT_LE(std::abs(out[3] + 1.0), bound);
  EXPECT_TRUE(std::isnan(out[4]));
}

// The backward's tanh (TanhAccurate), float: every 61st float of [0, 10] (and its negative, which
// must give the exact opposite) within the stated bound; +-0, +-inf and NaN.
TEST(TanhAccuracy, AccurateFloatWithinStatedBound) {
  const double bound = 1.5e-7;
  std::vector<float> x;
  for (std::uint32_t bits = 0; bits <= 0x41200000u; bits += 61) {
    float v;
    std::memcpy(&v, &bits, sizeof v);
    x.push_back(v);
  }
  for (float v : {0.625f, std::nextafter(0.625f, 0.0f), 9.1f, 20.0f, 40.0f, 1e10f, 3.4e38f}) x.push_back(v);
  const std::size_t half = x.size();
  for (std::size_t i = 0; i < half; ++i) x.push_back(-x[i]);
  std::vector<float> y(x.size());
  cpu::fused::simd_tanh(x.data(), y.data(), x.size(), true);
  double worst = 0, where = 0;
  for (std::size_t i = 0; i < half; ++i) {
    const double t = std::tanh(static_cast<double>(x[i]));
    const double e = t == 0 ? std::abs(static_cast<double>(y[i])) : std::abs(y[i] - t) / std::abs(t);
    if (e > worst) worst = e, where = x[i];
    ASSERT_EQ(y[half + i], -y[i]) << "x = " << x[i];
  }
  EXPECT_LE(worst, bound) << "at x = " << where;
  const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN};
  float out[5];
  cpu::fused::simd_tanh(special, out, 5, true);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_FALSE(std::signbit(out[0]));
  EXPECT_TRUE(std::signbit(out[1]));
  EXPECT_EQ(out[2], 1.0f);
  EXPECT_EQ(out[3], -1.0f);
  EXPECT_TRUE(std::isnan(out[4]));
}

TEST(TanhAccuracy, DoubleWithinStatedBound) {
  const double bound = 2.7e-16;
  std::vector<double> x;
  for (int i = -2000000; i <= 2000000; ++i) x.push_back(25.0 * i / 2000000.0 + 1e-9 * (i % 7));
  for (int e = 10; e < 1020; e += 3) x.push_back(std::ldexp(1.3, -e)), x.push_back(-std::ldexp(1.7, -e));
  for (double v : {0.625, std::nextafter(0.625, 0.0), 19.0, 19.1, 22.0, 700.0, 1e300, 4.9e-324}) x.push_back(v), x.push_back(-v);
  std::vector<double> y(x.size());
  cpu::fused::simd_tanh(x.data(), y.data(), x.size());
  double worst = 0, where = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const long double t = std::tanh(static_cast<long double>(x[i]));
    const double e = t == 0 ? std::abs(y[i]) : static_cast<double>(std::abs((y[i] - t) / t));
    if (e > worst) worst = e, where = x[i];
  }
  EXPECT_LE(worst, bound) << "at x = " << where;
  const double special[] = {0.0, -0.0, INFINITY, -INFINITY, NAN};
  double out[5];
  cpu::fused::simd_tanh(special, out, 5);
  EXPECT_EQ(out[0], 0.0);
  EXPECT_FALSE(std::signbit(out[0]));
  EXPECT_TRUE(std::signbit(out[1]));
  EXPECT_EQ(out[2], 1.0);
  EXPECT_EQ(out[3], -1.0);
  EXPECT_TRUE(std::isnan(out[4]));
}

TEST(AdditiveWeights, InitDrawsLinearBoundsFromTheSeed) {
  const auto w = AdditiveWeights<double>::init(20, 5, 8, 42);
  ASSERT_EQ(w.w_q.shape(), (std::vector<index_t>{8, 20}));
  ASSERT_EQ(w.w_k.shape(), (std::vector<index_t>{8, 5}));
  ASSERT_EQ(w.w_v.shape(), (std::vector<index_t>{8}));
  // nn.Linear(fan_in, ...): U(-1/sqrt(fan_in), 1/sqrt(fan_in)); the draws fill most of the interval.
  for (const auto& [t, fan_in] : {std::pair{&w.w_q, 20.0}, std::pair{&w.w_k, 5.0}, std::pair{&w.w_v, 8.0}}) {
    const double bound = 1 / std::sqrt(fan_in);
    double lo = bound, hi = -bound;
    for (index_t e = 0; e < t->numel(); ++e) {
      EXPECT_LE(std::abs((*t)[e]), bound);
      lo = std::min(lo, (*t)[e]), hi = std::max(hi, (*t)[e]);
    }
    EXPECT_LT(lo, -0.5 * bound);
    EXPECT_GT(hi, 0.5 * bound);
  }
  // The same seed gives the same values, in either precision; another seed other values; each
  // parameter its own stream (W_q and W_k of equal shapes differ).
  const auto again = AdditiveWeights<double>::init(20, 5, 8, 42);
  EXPECT_EQ(again.w_q.values(), w.w_q.values());
  EXPECT_EQ(again.w_v.values(), w.w_v.values());
  const auto f = AdditiveWeights<float>::init(20, 5, 8, 42);
  EXPECT_LT(testing::max_abs_diff(f.w_q, w.w_q), 1e-7);
  EXPECT_NE(AdditiveWeights<double>::init(20, 5, 8, 43).w_q.values(), w.w_q.values());
  const auto square = AdditiveWeights<double>::init(6, 6, 4, 42);
  EXPECT_NE(square.w_q.values(), square.w_k.values());
}

// Sizes must be positive: nn.Linear with no inputs or outputs has no bound 1/sqrt(fan_in).
TEST(AdditiveWeights, InitRejectsNonPositiveSizes) {
  testing::expect_error([] { AdditiveWeights<float>::init(0, 2, 8, 1); }, {"AdditiveWeights::init", "query_size is 0", "at least 1"});
  testing::expect_error([] { AdditiveWeights<float>::init(20, -1, 8, 1); }, {"key_size is -1"});
  testing::expect_error([] { AdditiveWeights<float>::init(20, 2, 0, 1); }, {"hidden_size is 0"});
}

// ---- bad input: each check names the argument, its shape or value, and the rule -----------------

// A valid 3-D call (B = 2, n = 3, m = 5, q = 4, k = 3, h = 6, v = 2) whose parts the tests break one at a time.
struct Call {
  QkvSizes s = testing::kSmall3;
  std::vector<Tensor<float>> in;
  Tensor<float> out{2, 3, 2}, weights{2, 3, 5}, dout{2, 3, 2};
  std::vector<Tensor<float>> grads;
  Mask<float> mask;
  Dropout dropout;
  Call() {
    for (const auto& t : make_inputs(s, 6, 700)) in.push_back(convert<float>(t));
    for (const auto& t : in) grads.emplace_back(std::span<const index_t>(t.shape()));
  }
  AdditiveParams<float> p() const { return params(in); }
  AdditiveGrads<float> dp() { return {grads[3].view(), grads[4].view(), grads[5].view()}; }
  void fwd() { additive_attention_forward<float>(out, weights, in[0], in[1], in[2], p(), mask, dropout); }
  void bwd() {
    additive_attention_backward<float>(grads[0], grads[1], grads[2], dp(), dout, in[0], in[1], in[2], p(), mask, dropout);
  }
};

// The unbroken call passes, so each failure below comes from the one part a test breaks; and it
// computes out, the weights and every gradient as the float64 reference does.
TEST(AdditiveAttentionBadInput, ValidCallPasses) {
  ScopedBackend cpu(Backend::cpu);
  Call c;
  c.dout = convert<float>(random_tensor<double>({2, 3, 2}, 701));
  c.fwd();
  c.bwd();
  std::vector<Tensor<float>> tested{c.out, c.weights};
  tested.insert(tested.end(), c.grads.begin(), c.grads.end());
  testing::expect_call_matches_reference<Additive>(c.s, c.in, c.dout, tested, kNames);
}

TEST(AdditiveAttentionBadInput, RanksMustBe3Or4AndEqual) {
  Call c;
  c.in[0] = Tensor<float>{3, 4};
  testing::expect_error([&] { c.fwd(); }, {"additive_attention_forward", "queries has shape (3,4)", "3 to 4 dimensions"});
  Call d;
  d.in[1] = Tensor<float>{2, 1, 5, 3};
  testing::expect_error([&] { d.fwd(); }, {"keys has shape (2,1,5,3) with 4 dimensions but queries has 3", "same rank"});
}

TEST(AdditiveAttentionBadInput, BatchMustMatch) {
  Call c;
  c.in[1] = Tensor<float>{3, 5, 3};
  testing::expect_error([&] { c.fwd(); }, {"keys has shape (3,5,3) but must be (2,5,3)", "batch must match queries (2,3,4)"});
}

TEST(AdditiveAttentionBadInput, KeysAndValuesMustShareM) {
  Call c;
  c.in[2] = Tensor<float>{2, 4, 2};
  testing::expect_error([&] { c.fwd(); }, {"values has shape (2,4,2) but must be (2,5,2)", "m = 5 rows the keys (2,5,3)"});
}

TEST(AdditiveAttentionBadInput, ParameterShapes) {
  Call c;
  c.in[3] = Tensor<float>{6, 5};
  testing::expect_error([&] { c.fwd(); }, {"w_q has shape (6,5) but must be (6,4)", "W_q is (h, q) with q = 4"});
  Call d;
  d.in[4] = Tensor<float>{6, 4};
  testing::expect_error([&] { d.fwd(); }, {"w_k has shape (6,4) but must be (6,3)", "k = 3, the last dimension of keys"});
  Call e;
  e.in[5] = Tensor<float>{6, 1};
  testing::expect_error([&] { e.fwd(); }, {"w_v has shape (6,1); it must have 1 dimensions"});
  Call f;
  f.in[3] = Tensor<float>{0, 4};
  testing::expect_error([&] { f.fwd(); }, {"w_q has shape (0,4)", "hidden size h", "at least 1"});
}

// W_q fixes h; W_k and w_v must agree with it.
TEST(AdditiveAttentionBadInput, HiddenSizeMustAgree) {
  Call c;
  c.in[4] = Tensor<float>{7, 3};
  testing::expect_error([&] { c.fwd(); }, {"w_k has shape (7,3) but must be (6,3)", "h = 6 from w_q"});
  Call d;
  d.in[5] = Tensor<float>{5};
  testing::expect_error([&] { d.fwd(); }, {"w_v has shape (5,) but must be (6,)", "h = 6 from w_q"});
}

TEST(AdditiveAttentionBadInput, ValidLengthsMustLieIn0ToM) {
  Call c;
  const Tensor<std::int64_t> negative({2}, {1, -1}), too_long({2}, {6, 1});
  c.mask.valid_lens = negative.view();
  testing::expect_error([&] { c.fwd(); }, {"additive_attention_forward", "valid_lens[1] is -1", "[0, m] = [0, 5]"});
  c.mask.valid_lens = too_long.view();
  testing::expect_error([&] { c.bwd(); }, {"additive_attention_backward", "valid_lens[0] is 6", "[0, m] = [0, 5]"});
}

TEST(AdditiveAttentionBadInput, MaskMustBroadcast) {
  Call c;
  const Tensor<bool> keep({2, 3, 4});
  c.mask.keep = keep.view();
  testing::expect_error([&] { c.fwd(); }, {"mask has shape (2,3,4)", "does not broadcast", "(2,3,5)"});
}

TEST(AdditiveAttentionBadInput, DropoutMustLieIn0To1) {
  Call c;
  c.dropout.p = -0.1;
  testing::expect_error([&] { c.fwd(); }, {"dropout p is -0.1", "[0, 1)"});
  c.dropout.p = 1.0;
  testing::expect_error([&] { c.bwd(); }, {"dropout p is 1", "[0, 1)"});
}

TEST(AdditiveAttentionBadInput, RequiredTensorsMustBeGiven) {
  Call c;
  testing::expect_error([&] { additive_attention_forward<float>(c.out, c.weights, {}, c.in[1], c.in[2], c.p(), {}, {}); },
                        {"queries is required but was not given"});
  testing::expect_error([&] { additive_attention_forward<float>({}, c.weights, c.in[0], c.in[1], c.in[2], c.p(), {}, {}); },
                        {"out is required but was not given"});
  testing::expect_error(
      [&] { additive_attention_forward<float>(c.out, {}, c.in[0], c.in[1], c.in[2], {c.in[3], {}, c.in[5]}, {}, {}); },
      {"w_k is required but was not given"});
  testing::expect_error([&] {
    additive_attention_backward<float>(c.grads[0], c.grads[1], c.grads[2], {c.grads[3], c.grads[4], {}}, c.dout,
                                       c.in[0], c.in[1], c.in[2], c.p(), {}, {});
  }, {"grads.w_v is required but was not given"});
  testing::expect_error([&] {
    additive_attention_backward<float>(c.grads[0], c.grads[1], c.grads[2], c.dp(), {}, c.in[0], c.in[1], c.in[2],
                                       c.p(), {}, {});
  }, {"dout is required but was not given"});
}

TEST(AdditiveAttentionBadInput, OutputShapes) {
  Call c;
  c.out = Tensor<float>{2, 3, 3};
  testing::expect_error([&] { c.fwd(); }, {"out has shape (2,3,3) but must be (2,3,2)"});
  Call d;
  d.weights = Tensor<float>{2, 5, 3};
  testing::expect_error([&] { d.fwd(); }, {"weights has shape (2,5,3) but must be (2,3,5)"});
}

TEST(AdditiveAttentionBadInput, GradientShapes) {
  Call c;
  c.grads[1] = Tensor<float>{2, 5, 4};
  testing::expect_error([&] { c.bwd(); }, {"dkeys has shape (2,5,4) but must be (2,5,3)", "shape of what it differentiates"});
  Call d;
  d.grads[3] = Tensor<float>{6, 3};
  testing::expect_error([&] { d.bwd(); }, {"grads.w_q has shape (6,3) but must be (6,4)"});
  Call e;
  e.dout = Tensor<float>{2, 3, 5};
  testing::expect_error([&] { e.bwd(); }, {"dout has shape (2,3,5) but must be (2,3,2)"});
}

// An output sharing memory with an input or another output would be read after being overwritten.
TEST(AdditiveAttentionBadInput, OutputsMustNotAliasInputs) {
  Call c;
  const TensorView<float> weights_as_out(c.weights.data(), {2, 3, 2});
  testing::expect_error([&] { additive_attention_forward<float>(weights_as_out, c.weights, c.in[0], c.in[1], c.in[2], c.p(), {}, {}); },
                        {"out and weights share memory"});
  const TensorView<float> keys_as_dkeys(const_cast<float*>(c.in[1].data()), {2, 5, 3});
  testing::expect_error([&] {
    additive_attention_backward<float>(c.grads[0], keys_as_dkeys, c.grads[2], c.dp(), c.dout, c.in[0], c.in[1],
                                       c.in[2], c.p(), {}, {});
  }, {"dkeys and keys share memory"});
}

}  // namespace
}  // namespace attn
