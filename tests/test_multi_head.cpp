// Multi-head attention (attn/multi_head.hpp): the cpu backend against the float64 reference (the
// error budget), every input's and parameter's gradient against finite differences in float64, with
// and without biases, grouped key heads, masks and dropout; the parameters' initialisation; bad
// input. Against the textbook's PyTorch MultiHeadAttention: python/tests/test_multi_head.py.
#include <cmath>
#include <string>
#include <vector>

#include "attn/multi_head.hpp"
#include "support/testing.hpp"

namespace attn {
namespace {

using testing::convert;
using testing::random_tensor;

struct MhaCase {
  const char* name;
  index_t B, n, m, q, k, vin, D, H, Hk;
  bool bias = false, lens = false;
  Causal causal = Causal::none;
  double dropout = 0;
};
void PrintTo(const MhaCase& c, std::ostream* os) { *os << c.name; }

// The inputs and parameters, in float64: queries, keys, values, then W_q, W_k, W_v, W_o (and the biases).
std::vector<Tensor<double>> inputs_of(const MhaCase& c) {
  const MultiHeadWeights<double> w = MultiHeadWeights<double>::init(c.q, c.k, c.vin, c.D, {c.H, c.Hk}, c.bias, 5);
  std::vector<Tensor<double>> in{random_tensor<double>({c.B, c.n, c.q}, 1), random_tensor<double>({c.B, c.m, c.k}, 2),
                                 random_tensor<double>({c.B, c.m, c.vin}, 3), w.w_q, w.w_k, w.w_v, w.w_o};
  if (c.bias) in.insert(in.end(), {w.b_q, w.b_k, w.b_v, w.b_o});
  return in;
}

// A case's inputs and parameters in precision T (inputs_of's order), its valid lengths, mask and options.
template <class T>
struct Prepared {
  std::vector<Tensor<T>> in;
  MultiHeadParams<T> p;
  Tensor<std::int64_t> lens;
  Mask<T> mask;
  SdpaOptions options;
  Prepared(const MhaCase& c, const std::vector<Tensor<double>>& in64) : lens({c.B}) {
    for (const auto& t : in64) in.push_back(convert<T>(t));
    p = {in[3].view(), in[4].view(), in[5].view(), in[6].view(), {}, {}, {}, {}};
    if (c.bias) p.b_q = in[7].view(), p.b_k = in[8].view(), p.b_v = in[9].view(), p.b_o = in[10].view();
    for (index_t b = 0; b < c.B; ++b) lens[b] = b == 0 ? c.m : c.m / 2 + 1;
    if (c.lens) mask.valid_lens = lens.view();
    mask.causal = c.causal;
    options.dropout = {c.dropout, 13};
  }
};

// out, then the gradient of every input and parameter (in inputs_of's order), in precision T.
template <class T>
std::vector<Tensor<T>> run(const MhaCase& c, const std::vector<Tensor<double>>& in64, const Tensor<double>& dout64) {
  const Prepared<T> call(c, in64);
  const std::vector<Tensor<T>>& in = call.in;
  const MultiHeadParams<T>& p = call.p;
  const Mask<T>& mask = call.mask;
  const SdpaOptions& options = call.options;
  const MultiHeadConfig config{c.H, c.Hk};
  Tensor<T> out({c.B, c.n, c.D});
  MultiHeadState<T> state;
  multi_head_attention_forward<T>(out.view(), &state, in[0].view(), in[1].view(), in[2].view(), p, config, mask, options);
  std::vector<Tensor<T>> g;
  for (const auto& t : in) g.emplace_back(std::span<const index_t>(t.shape()));
  MultiHeadGrads<T> grads{g[3].view(), g[4].view(), g[5].view(), g[6].view(), {}, {}, {}, {}};
  if (c.bias) grads.b_q = g[7].view(), grads.b_k = g[8].view(), grads.b_v = g[9].view(), grads.b_o = g[10].view();
  const Tensor<T> dout = convert<T>(dout64);
  multi_head_attention_backward<T>(g[0].view(), g[1].view(), g[2].view(), grads, dout.view(), in[0].view(), in[1].view(),
                                   in[2].view(), p, config, state, mask, options);
  g.insert(g.begin(), out);
  return g;
}

class MultiHead : public ::testing::TestWithParam<MhaCase> {};

TEST_P(MultiHead, MatchesTheFloat64Reference) {
  const MhaCase& c = GetParam();
  const std::vector<Tensor<double>> in = inputs_of(c);
  const Tensor<double> dout = random_tensor<double>({c.B, c.n, c.D}, 9);
  testing::expect_cpu_matches_reference([&]<class T>() { return run<T>(c, in, dout); }, 1e-10);
  testing::expect_same_at_1_and_2_threads<float>([&] { return run<float>(c, in, dout); });
}

TEST_P(MultiHead, BackwardMatchesFiniteDifferences) {
  MhaCase c = GetParam();
  c.B = std::min<index_t>(c.B, 2), c.n = std::min<index_t>(c.n, 4), c.m = std::min<index_t>(c.m, 5);
  c.q = 3, c.k = 2, c.vin = 3, c.D = 2 * c.H;
  std::vector<Tensor<double>> in = inputs_of(c);
  const Tensor<double> dout = random_tensor<double>({c.B, c.n, c.D}, 10);
  const char* names[] = {"queries", "keys", "values", "W_q", "W_k", "W_v", "W_o", "b_q", "b_k", "b_v", "b_o"};
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    SCOPED_TRACE(backend == Backend::cpu ? "cpu" : "reference");
    ScopedBackend use(backend);
    const std::vector<Tensor<double>> r = run<double>(c, in, dout);
    auto loss = [&] { return testing::dot(run<double>(c, in, dout)[0], dout); };
    for (std::size_t t = 0; t < in.size(); ++t) {
      std::string where;
      EXPECT_LT(testing::gradient_error(r[t + 1].values(), testing::numeric_gradient(loss, in[t].values()), &where), 1e-6)
          << names[t] << " " << where;
    }
  }
}

// The heads' weights (B, H, n, m) after a forward, then the state's V (B, m, Hk dh) and heads (B, n, H dh).
template <class T>
std::vector<Tensor<T>> weights_of(const MhaCase& c, const std::vector<Tensor<double>>& in64) {
  const Prepared<T> call(c, in64);
  Tensor<T> out({c.B, c.n, c.D}), weights({c.B, c.H, c.n, c.m});
  MultiHeadState<T> state;
  multi_head_attention_forward<T>(out.view(), &state, call.in[0].view(), call.in[1].view(), call.in[2].view(), call.p,
                                  {c.H, c.Hk}, call.mask, call.options);
  multi_head_attention_weights<T>(weights.view(), state, {c.H, c.Hk}, call.mask, call.options);
  return {weights, state.v, state.heads};
}

TEST_P(MultiHead, AttentionWeightsAreThoseOfTheHeads) {
  const MhaCase& c = GetParam();
  const std::vector<Tensor<double>> in = inputs_of(c);
  testing::expect_cpu_matches_reference([&]<class T>() { return weights_of<T>(c, in); }, 1e-10);
  // Without dropout each head's output is its weights times its key head's values.
  const std::vector<Tensor<double>> r = weights_of<double>(c, in);
  const Tensor<double>& w = r[0];
  const Tensor<double>& v = r[1];
  const Tensor<double>& heads = r[2];
  const index_t dh = c.D / c.H;
  double worst = 0;
  for (index_t b = 0; b < c.B; ++b)
    for (index_t h = 0; h < c.H; ++h)
      for (index_t i = 0; i < c.n; ++i) {
        double row = 0;
        for (index_t j = 0; j < c.m; ++j) row += w[((b * c.H + h) * c.n + i) * c.m + j];
        EXPECT_TRUE(std::abs(row - 1) < 1e-12 || row == 0) << "row sum " << row;
        if (c.dropout > 0) continue;
        for (index_t x = 0; x < dh; ++x) {
          double o = 0;
          for (index_t j = 0; j < c.m; ++j) o += w[((b * c.H + h) * c.n + i) * c.m + j] * v[(b * c.m + j) * c.Hk * dh + h / (c.H / c.Hk) * dh + x];
          worst = std::max(worst, std::abs(o - heads[(b * c.n + i) * c.D + h * dh + x]));
        }
      }
  EXPECT_LT(worst, 1e-12);
}

INSTANTIATE_TEST_SUITE_P(
    Layers, MultiHead,
    ::testing::Values(MhaCase{"textbook", 2, 7, 9, 5, 6, 4, 12, 3, 3},
                      MhaCase{"bias_lens", 2, 7, 9, 5, 6, 4, 12, 3, 3, true, true},
                      MhaCase{"gqa_causal", 2, 70, 70, 8, 8, 8, 16, 4, 2, false, false, Causal::top_left},
                      MhaCase{"mqa_bias_dropout", 2, 9, 13, 4, 5, 6, 18, 6, 1, true, true, Causal::none, 0.3},
                      MhaCase{"decode", 3, 2, 300, 7, 7, 7, 16, 4, 2, true, true, Causal::bottom_right}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(MultiHeadWeights, InitialisedAsNnLinearFromTheSeed) {
  const auto w = MultiHeadWeights<double>::init(5, 6, 7, 12, {4, 2}, true, 3);
  EXPECT_EQ(w.w_q.shape(), (std::vector<index_t>{12, 5}));
  EXPECT_EQ(w.w_k.shape(), (std::vector<index_t>{6, 6}));  // 2 key heads of 12 / 4 = 3 columns
  EXPECT_EQ(w.w_v.shape(), (std::vector<index_t>{6, 7}));
  EXPECT_EQ(w.w_o.shape(), (std::vector<index_t>{12, 12}));
  EXPECT_EQ(w.b_k.shape(), (std::vector<index_t>{6}));
  // Within +-1/sqrt(fan_in), and spread over it.
  const std::pair<const Tensor<double>*, double> checks[] = {{&w.w_q, 5}, {&w.w_k, 6}, {&w.w_v, 7}, {&w.w_o, 12},
                                                             {&w.b_q, 5}, {&w.b_o, 12}};
  for (const auto& [t, fan_in] : checks) {
    double lo = 1, hi = -1;
    for (index_t i = 0; i < t->numel(); ++i) lo = std::min(lo, (*t)[i]), hi = std::max(hi, (*t)[i]);
    EXPECT_GE(lo, -1 / std::sqrt(fan_in));
    EXPECT_LE(hi, 1 / std::sqrt(fan_in));
    if (t->numel() >= 36) {
      EXPECT_GT(hi - lo, 1 / std::sqrt(fan_in));
    }
  }
  EXPECT_EQ(w.w_q.values(), (MultiHeadWeights<double>::init(5, 6, 7, 12, {4, 2}, true, 3).w_q.values()));
  EXPECT_NE(w.w_q.values(), (MultiHeadWeights<double>::init(5, 6, 7, 12, {4, 2}, true, 4).w_q.values()));
  EXPECT_EQ(MultiHeadWeights<double>::init(5, 6, 7, 12, {4, 2}, false, 3).b_q.numel(), 0);
}

TEST(MultiHeadBadInput, EveryArgumentIsChecked) {
  const Tensor<float> q({2, 3, 5}), k({2, 4, 6}), v({2, 4, 7}), k_bad({2, 5, 6});
  const auto w = MultiHeadWeights<float>::init(5, 6, 7, 12, {3, 3}, false, 1);
  Tensor<float> out({2, 3, 12});
  auto fwd = [&](const Tensor<float>& kk, const MultiHeadParams<float>& p, MultiHeadConfig cfg) {
    multi_head_attention_forward<float>(out.view(), nullptr, q.view(), kk.view(), v.view(), p, cfg);
  };
  testing::expect_error([&] { fwd(k_bad, w.params(), {3, 3}); }, {"values has shape (2,4,7) but must be (2,5,7)"});
  testing::expect_error([&] { fwd(k, w.params(), {5, 5}); }, {"num_hiddens = 12 is not a multiple of num_heads = 5"});
  testing::expect_error([&] { fwd(k, w.params(), {3, 2}); }, {"num_kv_heads is 2; it must divide num_heads = 3"});
  testing::expect_error([&] { fwd(k, w.params(), {4, 2}); }, {"w_k has shape (12,6) but must be (6,6)"});
  MultiHeadParams<float> half = w.params();
  const Tensor<float> b({12});
  half.b_q = b.view();
  testing::expect_error([&] { fwd(k, half, {3, 3}); }, {"1 of the 4 biases", "all of them or none"});
  Tensor<float> bad_out({2, 3, 11});
  testing::expect_error([&] { multi_head_attention_forward<float>(bad_out.view(), nullptr, q.view(), k.view(), v.view(),
                                                                  w.params(), {3, 3}); },
                        {"out has shape (2,3,11) but must be (2,3,12)"});
  testing::expect_error([] { (void)MultiHeadWeights<float>::init(5, 6, 7, 12, {5, 5}, false, 1); },
                        {"num_heads is 5; it must be at least 1 and divide num_hiddens = 12"});
  // A state from another shape.
  MultiHeadState<float> state;
  fwd(k, w.params(), {3, 3});
  MultiHeadGrads<float> grads;
  Tensor<float> dwq({12, 5}), dwk({12, 6}), dwv({12, 7}), dwo({12, 12});
  grads.w_q = dwq.view(), grads.w_k = dwk.view(), grads.w_v = dwv.view(), grads.w_o = dwo.view();
  testing::expect_error([&] { multi_head_attention_backward<float>({}, {}, {}, grads, out.view(), q.view(), k.view(), v.view(),
                                                                   w.params(), {3, 3}, state); },
                        {"state.q has shape", "the state of the forward"});
  Tensor<float> weights({2, 3, 3, 4}), bad_weights({2, 3, 3, 5});
  testing::expect_error([&] { multi_head_attention_weights<float>(weights.view(), state, {3, 3}); },
                        {"state.q has shape", "(B, n, num_hiddens)"});
  multi_head_attention_forward<float>(out.view(), &state, q.view(), k.view(), v.view(), w.params(), {3, 3});
  multi_head_attention_weights<float>(weights.view(), state, {3, 3});
  testing::expect_error([&] { multi_head_attention_weights<float>(bad_weights.view(), state, {3, 3}); },
                        {"weights has shape (2,3,3,5) but must be (2,3,3,4)"});
  testing::expect_error([&] { multi_head_attention_weights<float>(weights.view(), state, {3, 1}); },
                        {"state.k has shape (2,4,12) but must be (2,4,4)"});
}

}  // namespace
}  // namespace attn
