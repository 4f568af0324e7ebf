// masked_softmax: the d2l chapter's examples, every mask kind against the float64 reference, empty rows,
// NaN in masked positions, the d2l chapter's -1e6 fill, gradients by finite differences, bad input.
#include <algorithm>
#include <cmath>
#include <limits>

#include "attn/softmax.hpp"
#include "support/testing.hpp"

namespace attn {
namespace {

using testing::convert;
using testing::random_tensor;

// Rows of the (B, n, m) weights w of scores x: each the softmax of x over its first len entries
// (the formula in float64, to float32's rounding), 0 beyond.
void expect_rows_follow_lengths(const Tensor<float>& w, const Tensor<float>& x, const std::vector<std::vector<int>>& lens) {
  for (index_t b = 0; b < w.dim(0); ++b)
    for (index_t i = 0; i < w.dim(1); ++i) {
      const index_t len = lens[b][i];
      double top = -INFINITY, sum = 0;
      for (index_t j = 0; j < len; ++j) top = std::max(top, static_cast<double>(x(b, i, j)));
      for (index_t j = 0; j < len; ++j) sum += std::exp(x(b, i, j) - top);
      for (index_t j = 0; j < w.dim(2); ++j) {
        const double want = j < len ? std::exp(x(b, i, j) - top) / sum : 0.0;
        if (j >= len) EXPECT_EQ(w(b, i, j), 0.0f) << "b=" << b << " i=" << i << " j=" << j;
        else EXPECT_NEAR(w(b, i, j), want, 1e-7) << "b=" << b << " i=" << i << " j=" << j;
      }
    }
}

TEST(MaskedSoftmax, D2lExampleValidLensPerBatch) {
  // masked_softmax(torch.rand(2, 2, 4), torch.tensor([2, 3]))
  const Tensor<float> x = random_tensor<float>({2, 2, 4}, 1, 0, 1);
  const Tensor<std::int64_t> lens({2}, {2, 3});
  Mask<float> mask;
  mask.valid_lens = lens.view();
  expect_rows_follow_lengths(masked_softmax<float>(x.view(), mask), x, {{2, 2}, {3, 3}});
}

TEST(MaskedSoftmax, D2lExampleValidLensPerQuery) {
  // masked_softmax(torch.rand(2, 2, 4), torch.tensor([[1, 3], [2, 4]]))
  const Tensor<float> x = random_tensor<float>({2, 2, 4}, 2, 0, 1);
  const Tensor<std::int64_t> lens({2, 2}, {1, 3, 2, 4});
  Mask<float> mask;
  mask.valid_lens = lens.view();
  const Tensor<float> w = masked_softmax<float>(x.view(), mask);
  expect_rows_follow_lengths(w, x, {{1, 3}, {2, 4}});
  // The first row has one key: weight exactly 1.
  EXPECT_EQ(w(0, 0, 0), 1.0f);
  // Unmasked rows are an ordinary softmax.
  const double e0 = std::exp(x(1, 1, 0)), e1 = std::exp(x(1, 1, 1)), e2 = std::exp(x(1, 1, 2)), e3 = std::exp(x(1, 1, 3));
  EXPECT_NEAR(w(1, 1, 2), e2 / (e0 + e1 + e2 + e3), 1e-7);
}

// Every mask kind on odd sizes, scores large enough to overflow exp without max-subtraction.
struct MaskCase {
  const char* name;
  bool lens_per_batch = false, lens_per_query = false, keep = false, additive = false;
  Causal causal = Causal::none;
  MaskedFill fill = MaskedFill::exclude;
};

// gtest (and CTest's test names) print a case by its name.
void PrintTo(const MaskCase& c, std::ostream* os) { *os << c.name; }

class MaskedSoftmaxCases : public ::testing::TestWithParam<MaskCase> {};

TEST_P(MaskedSoftmaxCases, MatchesFloat64ReferenceForwardAndBackward) {
  const MaskCase mc = GetParam();
  const index_t B = 2, H = 3, n = 113, m = 203;
  const Tensor<float> scores = random_tensor<float>({B, H, n, m}, 3, -300, 300);  // exp(300) overflows float
  const Tensor<float> dweights = random_tensor<float>({B, H, n, m}, 4);
  Tensor<std::int64_t> lens_b({B}, {0, m}), lens_q({B, n});
  for (index_t i = 0; i < B * n; ++i) lens_q[i] = (i * 37) % (m + 1);
  Tensor<bool> keep({B, 1, 1, m});
  for (index_t i = 0; i < keep.numel(); ++i) keep[i] = (i % 7) != 3;
  const Tensor<float> additive32 = random_tensor<float>({n, m}, 5, -2, 2);
  auto run = [&]<class T>() {
    const Tensor<T> additive = convert<T>(additive32);
    Mask<T> mask;
    if (mc.lens_per_batch) mask.valid_lens = lens_b.view();
    if (mc.lens_per_query) mask.valid_lens = lens_q.view();
    if (mc.keep) mask.keep = keep.view();
    if (mc.additive) mask.additive = additive.view();
    mask.causal = mc.causal;
    mask.fill = mc.fill;
    const Tensor<T> w = masked_softmax<T>(convert<T>(scores).view(), mask);
    Tensor<T> ds({B, H, n, m});
    masked_softmax_backward<T>(ds.view(), convert<T>(dweights).view(), w.view(), mask);
    return std::vector<Tensor<T>>{w, ds};
  };
  testing::expect_cpu_matches_reference(run);
  testing::expect_same_at_1_and_2_threads<float>([&] { return run.template operator()<float>(); });
}

INSTANTIATE_TEST_SUITE_P(
    AllMasks, MaskedSoftmaxCases,
    ::testing::Values(MaskCase{"none"}, MaskCase{"lens_per_batch", true}, MaskCase{"lens_per_query", false, true},
                      MaskCase{"keep", false, false, true}, MaskCase{"additive", false, false, false, true},
                      MaskCase{"causal", false, false, false, false, Causal::top_left},
                      MaskCase{"causal_bottom_right", false, false, false, false, Causal::bottom_right},
                      MaskCase{"everything", false, true, true, true, Causal::bottom_right},
                      MaskCase{"d2l_fill", false, true, false, false, Causal::none, MaskedFill::d2l_minus_1e6}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(MaskedSoftmax, EmptyRowsAreZeroWithZeroGradient) {
  const Tensor<double> x = random_tensor<double>({1, 3, 4}, 6);
  const Tensor<std::int64_t> lens({1, 3}, {0, 2, 0});
  Tensor<double> additive({3, 4});
  for (index_t j = 0; j < 4; ++j) additive(1, j) = -std::numeric_limits<double>::infinity();  // row 1: all -inf
  Mask<double> mask;
  mask.valid_lens = lens.view();
  mask.additive = additive.view();
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    ScopedBackend use(backend);
    const Tensor<double> w = masked_softmax<double>(x.view(), mask);
    Tensor<double> ds({1, 3, 4});
    masked_softmax_backward<double>(ds.view(), random_tensor<double>({1, 3, 4}, 7).view(), w.view(), mask);
    for (index_t i = 0; i < w.numel(); ++i) {
      EXPECT_EQ(w[i], 0.0);
      EXPECT_EQ(ds[i], 0.0);
    }
  }
}

TEST(MaskedSoftmax, NanAndInfInMaskedPositionsNeverReachTheOutput) {
  Tensor<float> x = random_tensor<float>({2, 2, 5}, 8);
  const Tensor<float> clean = x;
  const Tensor<std::int64_t> lens({2}, {3, 1});
  for (index_t i = 0; i < 2; ++i) {
    x(0, i, 3) = NAN, x(0, i, 4) = INFINITY;
    x(1, i, 1) = -INFINITY, x(1, i, 4) = NAN;
  }
  Mask<float> mask;
  mask.valid_lens = lens.view();
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    ScopedBackend use(backend);
    EXPECT_EQ(masked_softmax<float>(x.view(), mask).values(), masked_softmax<float>(clean.view(), mask).values());
  }
}

TEST(MaskedSoftmax, D2lFillMakesEmptyRowsUniform) {
  // The d2l chapter replaces masked scores by -1e6: a row with valid length 0 averages all keys.
  const Tensor<float> x = random_tensor<float>({1, 2, 4}, 9);
  const Tensor<std::int64_t> lens({1}, {0});
  Mask<float> mask;
  mask.valid_lens = lens.view();
  mask.fill = MaskedFill::d2l_minus_1e6;
  const Tensor<float> w = masked_softmax<float>(x.view(), mask);
  for (index_t i = 0; i < w.numel(); ++i) EXPECT_FLOAT_EQ(w[i], 0.25f);
}

TEST(MaskedSoftmax, InPlaceGivesTheSameWeights) {
  Tensor<float> x = random_tensor<float>({2, 3, 7}, 10);
  const Tensor<float> expected = masked_softmax<float>(x.view(), {});
  masked_softmax_forward<float>(x.view(), x.view(), {});
  EXPECT_EQ(x.values(), expected.values());
}

TEST(MaskedSoftmax, BackwardMatchesFiniteDifferences) {
  const index_t B = 2, H = 2, n = 3, m = 5;
  Tensor<double> x = random_tensor<double>({B, H, n, m}, 11, -3, 3);
  const Tensor<double> g = random_tensor<double>({B, H, n, m}, 12);
  const Tensor<std::int64_t> lens({B, n}, {1, 5, 0, 3, 4, 2});
  Tensor<bool> keep({1, 1, n, m});
  for (index_t i = 0; i < keep.numel(); ++i) keep[i] = i % 4 != 1;
  for (MaskedFill fill : {MaskedFill::exclude, MaskedFill::d2l_minus_1e6})
    for (Backend backend : {Backend::reference, Backend::cpu}) {
      ScopedBackend use(backend);
      Mask<double> mask;
      mask.valid_lens = lens.view();
      mask.keep = keep.view();
      mask.fill = fill;
      const Tensor<double> w = masked_softmax<double>(x.view(), mask);
      Tensor<double> ds({B, H, n, m});
      masked_softmax_backward<double>(ds.view(), g.view(), w.view(), mask);
      auto loss = [&] { return testing::dot(masked_softmax<double>(x.view(), mask), g); };
      std::string where;
      EXPECT_LT(testing::gradient_error(ds.values(), testing::numeric_gradient(loss, x.values()), &where), 1e-7)
          << where;
    }
}

TEST(MaskedSoftmax, BadInputNamesTheArgumentAndTheRule) {
  const Tensor<float> x({2, 3, 4});
  Tensor<float> w({2, 3, 4});
  const Tensor<std::int64_t> negative({2}, {1, -1}), too_long({2}, {5, 1}), wrong_shape({3}, {1, 1, 1});
  const Tensor<std::int64_t> per_query_too_long({2, 3}, {1, 1, 1, 1, 9, 1});
  Mask<float> mask;
  mask.valid_lens = negative.view();
  testing::expect_error([&] { masked_softmax<float>(x.view(), mask); }, {"masked_softmax_forward", "valid_lens[1] is -1", "[0, 4]"});
  mask.valid_lens = too_long.view();
  testing::expect_error([&] { masked_softmax<float>(x.view(), mask); }, {"valid_lens[0] is 5", "[0, m] = [0, 4]"});
  mask.valid_lens = per_query_too_long.view();
  testing::expect_error([&] { masked_softmax<float>(x.view(), mask); }, {"valid_lens[1,1] is 9"});
  mask.valid_lens = wrong_shape.view();
  testing::expect_error([&] { masked_softmax<float>(x.view(), mask); }, {"valid_lens has shape (3,)", "(B,) = (2,)", "(B, n) = (2,3)"});
  const Tensor<bool> keep({3, 5});
  Mask<float> bad_keep;
  bad_keep.keep = keep.view();
  testing::expect_error([&] { masked_softmax<float>(x.view(), bad_keep); }, {"mask has shape (3,5)", "does not broadcast", "(2,3,4)"});
  const Tensor<float> additive({2, 2, 3, 4});
  Mask<float> bad_additive;
  bad_additive.additive = additive.view();
  testing::expect_error([&] { masked_softmax<float>(x.view(), bad_additive); }, {"additive mask has shape (2,2,3,4)", "more dimensions"});
  Tensor<float> w_wrong({2, 3, 5});
  testing::expect_error([&] { masked_softmax_forward<float>(w_wrong.view(), x.view(), {}); }, {"weights has shape (2,3,5) but must be (2,3,4)"});
  const Tensor<float> x2({3, 4});
  testing::expect_error([&] { masked_softmax<float>(x2.view(), {}); }, {"scores has shape (3,4)", "3 to 4 dimensions"});
  const Tensor<float> strided({2, 3, 8});
  const TensorView<const float> every_other(strided.data(), {2, 3, 4}, {24, 8, 2});
  testing::expect_error([&] { masked_softmax<float>(every_other, {}); }, {"scores has stride 2 in its last dimension", "contiguous"});
  testing::expect_error([&] { masked_softmax_backward<float>(w.view(), x.view(), x2.view(), {}); }, {"weights has shape (3,4)"});
}

}  // namespace
}  // namespace attn
