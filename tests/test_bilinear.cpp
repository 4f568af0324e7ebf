// bilinear attention: the d2l chapter's example with a bilinear score, every mask and dropout against the
// float64 reference on odd sizes, scores that overflow a softmax without max-subtraction,
// thread-count independence, gradients of every input and of W by finite differences, bad input.
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "attn/bilinear.hpp"
#include "support/qkv_cases.hpp"
#include "support/testing.hpp"

namespace attn {
namespace {

using testing::convert;
using testing::QkvSizes;
using testing::random_tensor;

const std::vector<std::string> kNames = {"queries", "keys", "values", "w"};

// queries (B, [H,] n, q), keys, values, then W (q, k) in U(+-w_scale / sqrt(k)).
std::vector<Tensor<double>> make_inputs(const QkvSizes& s, std::uint64_t seed, double w_scale = 1) {
  const double bound = w_scale / std::sqrt(double(s.k));
  return {random_tensor<double>(s.dims(s.n, s.q), seed), random_tensor<double>(s.dims(s.m, s.k), seed + 1),
          random_tensor<double>(s.dims(s.m, s.v), seed + 2), random_tensor<double>({s.q, s.k}, seed + 3, -bound, bound)};
}

// The op as qkv_cases.hpp drives it.
struct Bilinear {
  template <class T>
  static Tensor<T> forward(const std::vector<Tensor<T>>& in, const QkvSizes& s, const Mask<T>& mask,
                           const Dropout& dropout, Tensor<T>* weights) {
    Tensor<T> out(s.dims(s.n, s.v));
    bilinear_attention_forward<T>(out.view(), weights ? weights->view() : TensorView<T>{}, in[0].view(), in[1].view(),
                                  in[2].view(), in[3].view(), mask, dropout);
    return out;
  }
  // The gradients of queries, keys, values and W.
  template <class T>
  static std::vector<Tensor<T>> backward(const std::vector<Tensor<T>>& in, const Tensor<T>& dout, const Mask<T>& mask,
                                         const Dropout& dropout) {
    std::vector<Tensor<T>> g;
    for (const Tensor<T>& t : in) g.emplace_back(std::span<const index_t>(t.shape()));
    bilinear_attention_backward<T>(g[0].view(), g[1].view(), g[2].view(), g[3].view(), dout.view(), in[0].view(),
                                   in[1].view(), in[2].view(), in[3].view(), mask, dropout);
    return g;
  }
};

TEST(BilinearAttention, D2lExampleAveragesTheValidValues) {
  // The d2l chapter's additive-attention example with a bilinear score: queries normal(0, 1, (2, 1, 20)),
  // keys all ones (2, 10, 2), values arange(40) as (1, 10, 4) repeated twice, valid_lens [2, 6].
  // Equal keys give equal scores: the weights are uniform over the valid keys.
  Tensor<double> queries({2, 1, 20}), keys({2, 10, 2}), values({2, 10, 4});
  std::mt19937_64 gen(0);
  std::normal_distribution<double> normal(0, 1);
  for (index_t e = 0; e < queries.numel(); ++e) queries[e] = normal(gen);
  for (index_t e = 0; e < keys.numel(); ++e) keys[e] = 1;
  for (index_t e = 0; e < values.numel(); ++e) values[e] = double(e % 40);
  const Tensor<std::int64_t> lens({2}, {2, 6});
  const std::vector<Tensor<double>> in64 = {queries, keys, values, random_tensor<double>({20, 2}, 8)};
  const double expected[2][4] = {{2, 3, 4, 5}, {10, 11, 12, 13}};
  auto check = [&]<class T>(double tol) {
    std::vector<Tensor<T>> in;
    for (const auto& t : in64) in.push_back(convert<T>(t));
    Mask<T> mask;
    mask.valid_lens = lens.view();
    Tensor<T> weights({2, 1, 10});
    const Tensor<T> out = Bilinear::forward(in, {2, 0, 1, 10, 20, 2, 4}, mask, {}, &weights);
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
class BilinearAttentionCases : public ::testing::TestWithParam<testing::MaskCase> {};

TEST_P(BilinearAttentionCases, MatchesFloat64ReferenceOn3DTensors) {
  testing::expect_op_matches_reference<Bilinear>(testing::kOdd3, GetParam(), make_inputs(testing::kOdd3, 100));
}
TEST_P(BilinearAttentionCases, MatchesFloat64ReferenceWithHeads) {
  testing::expect_op_matches_reference<Bilinear>(testing::kOdd4, GetParam(), make_inputs(testing::kOdd4, 100));
}

INSTANTIATE_TEST_SUITE_P(AllMasks, BilinearAttentionCases, ::testing::ValuesIn(testing::all_mask_cases()),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(BilinearAttention, OverflowingScoresMatchFloat64Reference) {
  // W scaled so that |scores| reaches ~1e3: exp(score) overflows without max-subtraction.
  const QkvSizes s = testing::kOdd3;
  const std::vector<Tensor<double>> in = make_inputs(s, 100, 700);
  double max_score = 0;
  for (index_t b = 0; b < s.B; ++b)
    for (index_t i = 0; i < s.n; ++i)
      for (index_t j = 0; j < s.m; ++j) {
        double score = 0;
        for (index_t a = 0; a < s.q; ++a)
          for (index_t c = 0; c < s.k; ++c) score += in[0](b, i, a) * in[3](a, c) * in[1](b, j, c);
        max_score = std::max(max_score, std::abs(score));
      }
  ASSERT_GT(max_score, 500.0);
  testing::expect_op_matches_reference<Bilinear>(s, {"lens_per_query", false, true}, in);
}

// The analytic gradients of every input and parameter, with a per-query valid-lens mask (lengths 0
// to m) and with dropout, 3-D and 4-D, by both backends.
TEST(BilinearAttention, BackwardMatchesFiniteDifferences) {
  for (const QkvSizes& s : {testing::kSmall3, testing::kSmall4})
    for (const testing::MaskCase& mc : {testing::MaskCase{"lens", false, true},
                                        testing::MaskCase{"lens_and_dropout", false, true, false, Causal::none,
                                                          MaskedFill::exclude, 0.3}}) {
      SCOPED_TRACE(std::string(mc.name) + (s.H == 0 ? ", 3-D" : ", 4-D"));
      testing::expect_op_gradients_match<Bilinear>(s, mc, make_inputs(s, 300, 2), kNames);
    }
}

// attn/mask.hpp: a query with nothing to attend to outputs 0, has weights 0 and gradients 0; a key
// no query sees gets gradient 0.
TEST(BilinearAttention, EmptyRowsOutputZeroWithZeroGradients) {
  const QkvSizes s = testing::kSmall3;
  const std::vector<Tensor<double>> in = make_inputs(s, 500);
  const Tensor<std::int64_t> lens({2}, {3, 0});  // batch element 1 attends to nothing
  Mask<double> mask;
  mask.valid_lens = lens.view();
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    ScopedBackend use(backend);
    Tensor<double> weights(s.dims(s.n, s.m));
    const Tensor<double> out = Bilinear::forward(in, s, mask, {}, &weights);
    const std::vector<Tensor<double>> g = Bilinear::backward(in, random_tensor<double>(s.dims(s.n, s.v), 501), mask, {});
    for (index_t i = 0; i < s.n; ++i) {
      for (index_t j = 0; j < s.m; ++j) EXPECT_EQ(weights(1, i, j), 0.0);
      for (index_t c = 0; c < s.v; ++c) EXPECT_EQ(out(1, i, c), 0.0);
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
TEST(BilinearAttention, NoKeysOutputsZero) {
  const QkvSizes s{2, 0, 3, 0, 4, 3, 2};
  const std::vector<Tensor<double>> in = make_inputs(s, 600);
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    ScopedBackend use(backend);
    const Tensor<double> out = Bilinear::forward<double>(in, s, {}, {}, nullptr);
    for (index_t e = 0; e < out.numel(); ++e) EXPECT_EQ(out[e], 0.0);
    for (const Tensor<double>& t : Bilinear::backward<double>(in, random_tensor<double>(s.dims(s.n, s.v), 601), {}, {}))
      for (index_t e = 0; e < t.numel(); ++e) EXPECT_EQ(t[e], 0.0);
  }
}

// ---- bad input: each check names the argument, its shape or value, and the rule -----------------

// A valid 3-D call (B = 2, n = 3, m = 5, q = 4, k = 3, v = 2) whose parts the tests break one at a time.
struct Call {
  std::vector<Tensor<float>> in;
  Tensor<float> out{2, 3, 2}, weights{2, 3, 5}, dout{2, 3, 2};
  std::vector<Tensor<float>> grads;
  Mask<float> mask;
  Dropout dropout;
  Call() {
    for (const auto& t : make_inputs(testing::kSmall3, 700)) in.push_back(convert<float>(t));
    for (const auto& t : in) grads.emplace_back(std::span<const index_t>(t.shape()));
  }
  void fwd() { bilinear_attention_forward<float>(out, weights, in[0], in[1], in[2], in[3], mask, dropout); }
  void bwd() {
    bilinear_attention_backward<float>(grads[0], grads[1], grads[2], grads[3], dout, in[0], in[1], in[2], in[3], mask,
                                       dropout);
  }
};

// The unbroken call passes, so each failure below comes from the one part a test breaks; and it
// computes out, the weights and every gradient as the float64 reference does.
TEST(BilinearAttentionBadInput, ValidCallPasses) {
  ScopedBackend cpu(Backend::cpu);
  Call c;
  c.dout = convert<float>(random_tensor<double>({2, 3, 2}, 701));
  c.fwd();
  c.bwd();
  std::vector<Tensor<float>> tested{c.out, c.weights};
  tested.insert(tested.end(), c.grads.begin(), c.grads.end());
  testing::expect_call_matches_reference<Bilinear>(testing::kSmall3, c.in, c.dout, tested, kNames);
}

TEST(BilinearAttentionBadInput, RanksMustBe3Or4AndEqual) {
  Call c;
  c.in[0] = Tensor<float>{2, 12};
  testing::expect_error([&] { c.fwd(); }, {"bilinear_attention_forward", "queries has shape (2,12)", "3 to 4 dimensions"});
  Call d;
  d.in[2] = Tensor<float>{2, 1, 5, 2};
  testing::expect_error([&] { d.fwd(); }, {"values has shape (2,1,5,2) with 4 dimensions but queries has 3", "same rank"});
}

TEST(BilinearAttentionBadInput, BatchAndHeadsMustMatch) {
  Call c;
  c.in[1] = Tensor<float>{1, 5, 3};
  testing::expect_error([&] { c.fwd(); }, {"keys has shape (1,5,3) but must be (2,5,3)", "batch must match queries (2,3,4)"});
  Call d;
  d.in[0] = Tensor<float>{2, 3, 3, 4};
  d.in[1] = Tensor<float>{2, 2, 5, 3};
  d.in[2] = Tensor<float>{2, 3, 5, 2};
  testing::expect_error([&] { d.fwd(); }, {"keys has shape (2,2,5,3) but must be (2,3,5,3)", "batch and heads must match queries (2,3,3,4)"});
}

TEST(BilinearAttentionBadInput, KeysAndValuesMustShareM) {
  Call c;
  c.in[2] = Tensor<float>{2, 6, 2};
  testing::expect_error([&] { c.bwd(); }, {"bilinear_attention_backward", "values has shape (2,6,2) but must be (2,5,2)", "m = 5 rows"});
}

// W maps keys (k) into query space (q): (q, k), not (k, q), and a matrix.
TEST(BilinearAttentionBadInput, WMustBeQByK) {
  Call c;
  c.in[3] = Tensor<float>{3, 4};
  testing::expect_error([&] { c.fwd(); }, {"w has shape (3,4) but must be (4,3)", "W is (q, k) with q = 4", "k = 3"});
  c.in[3] = Tensor<float>{4, 3, 1};
  testing::expect_error([&] { c.fwd(); }, {"w has shape (4,3,1); it must have 2 dimensions"});
}

TEST(BilinearAttentionBadInput, ValidLengthsMustLieIn0ToM) {
  Call c;
  const Tensor<std::int64_t> negative({2, 3}, {1, 1, 1, 1, -1, 1}), too_long({2}, {1, 6});
  c.mask.valid_lens = negative.view();
  testing::expect_error([&] { c.fwd(); }, {"valid_lens[1,1] is -1", "[0, m] = [0, 5]"});
  c.mask.valid_lens = too_long.view();
  testing::expect_error([&] { c.fwd(); }, {"valid_lens[1] is 6", "[0, m] = [0, 5]"});
}

TEST(BilinearAttentionBadInput, MaskMustBroadcast) {
  Call c;
  const Tensor<bool> keep({2, 1, 1, 5});  // 4-D mask for 3-D scores
  c.mask.keep = keep.view();
  testing::expect_error([&] { c.fwd(); }, {"mask has shape (2,1,1,5)", "does not broadcast", "more dimensions"});
}

TEST(BilinearAttentionBadInput, DropoutMustLieIn0To1) {
  Call c;
  c.dropout.p = -0.1;
  testing::expect_error([&] { c.bwd(); }, {"dropout p is -0.1", "[0, 1)"});
  c.dropout.p = 1.0;
  testing::expect_error([&] { c.fwd(); }, {"dropout p is 1", "[0, 1)"});
}

TEST(BilinearAttentionBadInput, RequiredTensorsMustBeGiven) {
  Call c;
  testing::expect_error([&] { bilinear_attention_forward<float>(c.out, {}, c.in[0], c.in[1], c.in[2], {}, {}, {}); },
                        {"w is required but was not given"});
  testing::expect_error([&] { bilinear_attention_forward<float>(c.out, {}, c.in[0], {}, c.in[2], c.in[3], {}, {}); },
                        {"keys is required but was not given"});
  testing::expect_error([&] {
    bilinear_attention_backward<float>(c.grads[0], c.grads[1], c.grads[2], {}, c.dout, c.in[0], c.in[1], c.in[2],
                                       c.in[3], {}, {});
  }, {"dw is required but was not given"});
}

TEST(BilinearAttentionBadInput, OutputAndGradientShapes) {
  Call c;
  c.out = Tensor<float>{2, 4, 2};
  testing::expect_error([&] { c.fwd(); }, {"out has shape (2,4,2) but must be (2,3,2)"});
  Call d;
  d.grads[0] = Tensor<float>{2, 3, 3};
  testing::expect_error([&] { d.bwd(); }, {"dqueries has shape (2,3,3) but must be (2,3,4)", "shape of what it differentiates"});
  Call e;
  e.grads[3] = Tensor<float>{3, 4};
  testing::expect_error([&] { e.bwd(); }, {"dw has shape (3,4) but must be (4,3)"});
}

// An output sharing memory with an input would be read after being overwritten.
TEST(BilinearAttentionBadInput, OutputsMustNotAliasInputs) {
  Call c;
  const TensorView<float> values_as_dvalues(c.in[2].data(), {2, 5, 2});
  testing::expect_error([&] {
    bilinear_attention_backward<float>(c.grads[0], c.grads[1], values_as_dvalues, c.grads[3], c.dout, c.in[0], c.in[1],
                                       c.in[2], c.in[3], {}, {});
  }, {"dvalues and values share memory"});
}

}  // namespace
}  // namespace attn
