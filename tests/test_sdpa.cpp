// Scaled dot-product attention: the d2l chapter's example, every mask and dropout against the float64
// reference, gradients by finite differences, dropout statistics and determinism, empty rows,
// NaN in masked positions, bad input.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "attn/sdpa.hpp"
#include "cpu/simd/fused.hpp"
#include "support/testing.hpp"

namespace attn {
namespace {

using testing::convert;
using testing::random_tensor;

// The d2l chapter's (2, 10, *) keys and values: keys all ones, values arange(40) as (1, 10, 4) repeated.
Tensor<float> d2l_keys() {
  Tensor<float> k({2, 10, 2});
  for (index_t i = 0; i < k.numel(); ++i) k[i] = 1;
  return k;
}
Tensor<float> d2l_values() {
  Tensor<float> v({2, 10, 4});
  for (index_t i = 0; i < v.numel(); ++i) v[i] = static_cast<float>(i % 40);
  return v;
}
Tensor<float> normal_tensor(std::initializer_list<index_t> shape, std::uint64_t seed) {
  Tensor<float> t(shape);
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal(0, 1);
  for (index_t i = 0; i < t.numel(); ++i) t[i] = normal(gen);
  return t;
}

TEST(Sdpa, D2lExample) {
  // queries = normal(0, 1, (2, 1, 2)); attention = DotProductAttention(dropout=0.5); attention.eval()
  const Tensor<float> q = normal_tensor({2, 1, 2}, 1), k = d2l_keys(), v = d2l_values();
  const Tensor<std::int64_t> lens({2}, {2, 6});
  Mask<float> mask;
  mask.valid_lens = lens.view();
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    ScopedBackend use(backend);
    Tensor<float> weights;
    const Tensor<float> out = scaled_dot_product_attention<float>(q.view(), k.view(), v.view(), mask, {}, &weights);
    EXPECT_EQ(out.shape(), (std::vector<index_t>{2, 1, 4}));
    // Equal keys give equal weights: the mean of the first 2 and of the first 6 value rows.
    for (index_t c = 0; c < 4; ++c) {
      EXPECT_NEAR(out(0, 0, c), 2.0f + c, 1e-5);
      EXPECT_NEAR(out(1, 0, c), 10.0f + c, 1e-5);
    }
    for (index_t j = 0; j < 10; ++j) {
      EXPECT_EQ(weights(0, 0, j), j < 2 ? 0.5f : 0.0f);
      if (j >= 6) EXPECT_EQ(weights(1, 0, j), 0.0f);
      else EXPECT_NEAR(weights(1, 0, j), 1.0f / 6, 1e-7);
    }
  }
}

struct SdpaCase {
  const char* name;
  bool lens = false, keep = false, additive = false;
  Causal causal = Causal::none;
  double dropout = 0;
  MaskedFill fill = MaskedFill::exclude;
  double scale_inputs = 1;  // large values overflow an exp without max-subtraction
};

// The whole op in precision T: out and lse (fused), weights, out and lse with them (unfused), and
// every gradient, with and without lse.
template <class T>
std::vector<Tensor<T>> run_sdpa(const SdpaCase& sc, const Tensor<float>& q32, const Tensor<float>& k32,
                                const Tensor<float>& v32, const Tensor<float>& g32) {
  const index_t B = q32.dim(0), H = q32.dim(1), n = q32.dim(2), m = k32.dim(2);
  const Tensor<T> q = convert<T>(q32), k = convert<T>(k32), v = convert<T>(v32), g = convert<T>(g32);
  Tensor<std::int64_t> lens({B, n});
  for (index_t i = 0; i < lens.numel(); ++i) lens[i] = (i * 53 + 7) % (m + 1);
  Tensor<bool> keep({B, 1, n, m});
  for (index_t i = 0; i < keep.numel(); ++i) keep[i] = (i * 31) % 11 != 0;
  Tensor<T> bias = convert<T>(random_tensor<float>({m}, 77, -1, 1));
  Mask<T> mask;
  if (sc.lens) mask.valid_lens = lens.view();
  if (sc.keep) mask.keep = keep.view();
  if (sc.additive) mask.additive = bias.view();
  mask.causal = sc.causal;
  mask.fill = sc.fill;
  SdpaOptions options;
  options.dropout = {sc.dropout, 1234};
  // Without weights the cpu backend takes the fused path; asking for them takes the unfused one.
  Tensor<T> out({B, H, n, v32.dim(3)}), lse({B, H, n}), weights({B, H, n, m});
  Tensor<T> out_w({B, H, n, v32.dim(3)}), lse_w({B, H, n});
  sdpa_forward<T>(out.view(), lse.view(), {}, q.view(), k.view(), v.view(), mask, options);
  sdpa_forward<T>(out_w.view(), lse_w.view(), weights.view(), q.view(), k.view(), v.view(), mask, options);
  Tensor<T> dq({B, H, n, q32.dim(3)}), dk({B, H, m, q32.dim(3)}), dv({B, H, m, v32.dim(3)});
  sdpa_backward<T>(dq.view(), dk.view(), dv.view(), g.view(), q.view(), k.view(), v.view(), out.view(), lse.view(),
                   mask, options);
  // Without lse the fused backward recomputes every row's maximum and sum (with lse it rebuilds the
  // rows whose |lse| <= 16 from it): both paths are held to the same budget.
  Tensor<T> dq_r(dq.shape()), dk_r(dk.shape()), dv_r(dv.shape());
  sdpa_backward<T>(dq_r.view(), dk_r.view(), dv_r.view(), g.view(), q.view(), k.view(), v.view(), out.view(), {},
                   mask, options);
  return {out, lse, weights, out_w, lse_w, dq, dk, dv, dq_r, dk_r, dv_r};
}

// gtest (and CTest's test names) print a case by its name.
void PrintTo(const SdpaCase& c, std::ostream* os) { *os << c.name; }

class SdpaCases : public ::testing::TestWithParam<SdpaCase> {};

// Random inputs of sizes (B, H, n, m, d, v) from seeds seed .. seed + 3; the cpu backend against the
// float64 reference (error budget), and bit-identical at 1 and 2 threads.
void expect_matches_reference(const SdpaCase& sc, index_t B, index_t H, index_t n, index_t m, index_t d, index_t v,
                              std::uint64_t seed) {
  const Tensor<float> q = random_tensor<float>({B, H, n, d}, seed, -sc.scale_inputs, sc.scale_inputs);
  const Tensor<float> k = random_tensor<float>({B, H, m, d}, seed + 1, -sc.scale_inputs, sc.scale_inputs);
  const Tensor<float> vals = random_tensor<float>({B, H, m, v}, seed + 2);
  const Tensor<float> g = random_tensor<float>({B, H, n, v}, seed + 3);
  auto run = [&]<class T>() { return run_sdpa<T>(sc, q, k, vals, g); };
  testing::expect_cpu_matches_reference(run, 1e-8);
  testing::expect_same_at_1_and_2_threads<float>([&] { return run_sdpa<float>(sc, q, k, vals, g); });
}

TEST_P(SdpaCases, MatchesFloat64ReferenceOnOddSizes) { expect_matches_reference(GetParam(), 2, 2, 113, 203, 59, 23, 1); }

// Head sizes of whole 64-column panels: the fused backward keeps dK and dV key-major there (odd sizes
// take the transposed layout above; simd/fused.hpp, backward_grads_key_major).
TEST_P(SdpaCases, MatchesFloat64ReferenceOnPanelHeadSizes) {
  expect_matches_reference(GetParam(), 1, 2, 113, 203, 64, 128, 11);
}

// A few queries over many keys: the cpu backend's decode path, keys split into chunks merged
// through their maxima (m = 1500 gives 5 chunks per head).
TEST_P(SdpaCases, DecodeMatchesFloat64Reference) { expect_matches_reference(GetParam(), 1, 2, 3, 1500, 59, 23, 31); }

// Sixteen heads make one chunk per head: 1300 keys are three decode tiles (fused.hpp, kDecodeTile),
// so the online softmax rescales the partial output between tiles.
TEST_P(SdpaCases, DecodeOverSeveralTilesMatchesFloat64Reference) {
  static_assert(1300 > 2 * attn::cpu::fused::kDecodeTile);
  expect_matches_reference(GetParam(), 2, 8, 2, 1300, 17, 9, 41);
}

// Grouped-query decode: the query heads of a key head take each key and value row together, in
// packs (simd/sdpa_decode.cpp). Each head's output and lse are those it gets alone, with its key
// head, bit for bit: 5 heads a key head make packs of 4 and 1 on AVX-512, of 2, 2 and 1 elsewhere;
// lengths, ALiBi, sinks and soft-capping differ per row or head.
TEST(SdpaDecode, QueryHeadsSharingAKeyHeadGetTheirOwnResultsBitForBit) {
  const index_t B = 2, Hk = 2, group = 5, H = Hk * group, m = 1300, d = 32, dv = 48;
  const Tensor<float> q = random_tensor<float>({B, H, 1, d}, 61, -2, 2), k = random_tensor<float>({B, Hk, m, d}, 62, -2, 2);
  const Tensor<float> v = random_tensor<float>({B, Hk, m, dv}, 63);
  const Tensor<float> slopes = random_tensor<float>({H}, 64, 0, 0.01), sinks = random_tensor<float>({H}, 65);
  const Tensor<std::int64_t> lens({B}, {m, 777});
  SdpaOptions options;
  options.softcap = 20.0;
  ScopedBackend cpu(Backend::cpu);
  for (const bool masked : {false, true}) {
    SCOPED_TRACE(masked ? "lengths, ALiBi and sinks" : "no mask");
    Mask<float> mask;
    if (masked) mask.valid_lens = lens.view(), mask.alibi_slopes = slopes.view(), mask.sinks = sinks.view();
    Tensor<float> out({B, H, 1, dv}), lse({B, H, 1});
    sdpa_forward<float>(out.view(), lse.view(), {}, q.view(), k.view(), v.view(), mask, options);
    for (index_t h = 0; h < H; ++h) {
      Tensor<float> qh({B, 1, 1, d}), kh({B, 1, m, d}), vh({B, 1, m, dv}), out_h({B, 1, 1, dv}), lse_h({B, 1, 1});
      for (index_t b = 0; b < B; ++b) {
        for (index_t c = 0; c < d; ++c) qh(b, 0, 0, c) = q(b, h, 0, c);
        for (index_t j = 0; j < m; ++j) {
          for (index_t c = 0; c < d; ++c) kh(b, 0, j, c) = k(b, h / group, j, c);
          for (index_t c = 0; c < dv; ++c) vh(b, 0, j, c) = v(b, h / group, j, c);
        }
      }
      const Tensor<float> slope_h({1}, {slopes[h]}), sink_h({1}, {sinks[h]});
      Mask<float> one;
      if (masked) one.valid_lens = lens.view(), one.alibi_slopes = slope_h.view(), one.sinks = sink_h.view();
      sdpa_forward<float>(out_h.view(), lse_h.view(), {}, qh.view(), kh.view(), vh.view(), one, options);
      for (index_t b = 0; b < B; ++b) {
        for (index_t c = 0; c < dv; ++c) ASSERT_EQ(out(b, h, 0, c), out_h(b, 0, 0, c)) << "b " << b << ", head " << h << ", column " << c;
        ASSERT_EQ(lse(b, h, 0), lse_h(b, 0, 0)) << "b " << b << ", head " << h;
      }
    }
  }
}

TEST_P(SdpaCases, BackwardMatchesFiniteDifferences) {
  const SdpaCase sc = GetParam();
  const index_t B = 2, H = 2, n = 3, m = 5, d = 4, dv = 3;
  Tensor<double> q = random_tensor<double>({B, H, n, d}, 5), k = random_tensor<double>({B, H, m, d}, 6);
  Tensor<double> v = random_tensor<double>({B, H, m, dv}, 7);
  const Tensor<double> g = random_tensor<double>({B, H, n, dv}, 8);
  Tensor<std::int64_t> lens({B, n}, {1, 5, 0, 3, 4, 2});
  Tensor<bool> keep({1, 1, n, m});
  for (index_t i = 0; i < keep.numel(); ++i) keep[i] = i % 4 != 2;
  Tensor<double> bias = random_tensor<double>({n, m}, 9);
  Mask<double> mask;
  if (sc.lens) mask.valid_lens = lens.view();
  if (sc.keep) mask.keep = keep.view();
  if (sc.additive) mask.additive = bias.view();
  mask.causal = sc.causal;
  mask.fill = sc.fill;
  SdpaOptions options;
  options.scale = 0.7;
  options.dropout = {sc.dropout, 99};
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    ScopedBackend use(backend);
    Tensor<double> out({B, H, n, dv}), lse({B, H, n});
    sdpa_forward<double>(out.view(), lse.view(), {}, q.view(), k.view(), v.view(), mask, options);
    Tensor<double> dq({B, H, n, d}), dk({B, H, m, d}), dvv({B, H, m, dv});
    sdpa_backward<double>(dq.view(), dk.view(), dvv.view(), g.view(), q.view(), k.view(), v.view(), out.view(),
                          lse.view(), mask, options);
    auto loss = [&] {
      return testing::dot(scaled_dot_product_attention<double>(q.view(), k.view(), v.view(), mask, options), g);
    };
    std::string where;
    EXPECT_LT(testing::gradient_error(dq.values(), testing::numeric_gradient(loss, q.values()), &where), 1e-7) << "dq " << where;
    EXPECT_LT(testing::gradient_error(dk.values(), testing::numeric_gradient(loss, k.values()), &where), 1e-7) << "dk " << where;
    EXPECT_LT(testing::gradient_error(dvv.values(), testing::numeric_gradient(loss, v.values()), &where), 1e-7) << "dv " << where;
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllMasksAndDropout, SdpaCases,
    ::testing::Values(SdpaCase{"plain"}, SdpaCase{"valid_lens", true}, SdpaCase{"keep", false, true},
                      SdpaCase{"additive", false, false, true}, SdpaCase{"causal", false, false, false, Causal::top_left},
                      SdpaCase{"causal_bottom_right", false, false, false, Causal::bottom_right},
                      SdpaCase{"dropout", false, false, false, Causal::none, 0.3},
                      SdpaCase{"everything", true, true, true, Causal::bottom_right, 0.2},
                      SdpaCase{"d2l_fill", true, false, false, Causal::none, 0.0, MaskedFill::d2l_minus_1e6},
                      SdpaCase{"overflowing_scores", true, false, false, Causal::none, 0.0, MaskedFill::exclude, 6.0}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(SdpaDropout, KeptFractionIsOneMinusP) {
  for (double p : {0.1, 0.5, 0.9}) {
    Tensor<bool> keep({4, 2, 256, 1024});
    dropout_keep_mask(keep.view(), {p, 42});
    double kept = 0;
    for (index_t i = 0; i < keep.numel(); ++i) kept += keep[i];
    EXPECT_NEAR(kept / static_cast<double>(keep.numel()), 1 - p, 0.01) << "p = " << p;
  }
}

TEST(SdpaDropout, ForwardAppliesExactlyTheKeepMask) {
  // out = (keep * weights / (1 - p)) @ values, with the mask dropout_keep_mask gives for the seed.
  const index_t B = 2, n = 7, m = 9, d = 5, dv = 3;
  const Tensor<double> q = random_tensor<double>({B, n, d}, 10), k = random_tensor<double>({B, m, d}, 11);
  const Tensor<double> v = random_tensor<double>({B, m, dv}, 12);
  SdpaOptions options;
  options.dropout = {0.4, 2024};
  Tensor<bool> keep({B, n, m});
  dropout_keep_mask(keep.view(), options.dropout);
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    ScopedBackend use(backend);
    Tensor<double> w;
    const Tensor<double> out = scaled_dot_product_attention<double>(q.view(), k.view(), v.view(), {}, options, &w);
    for (index_t b = 0; b < B; ++b)
      for (index_t i = 0; i < n; ++i)
        for (index_t c = 0; c < dv; ++c) {
          double expected = 0;
          for (index_t j = 0; j < m; ++j) expected += keep(b, i, j) ? w(b, i, j) / 0.6 * v(b, j, c) : 0.0;
          EXPECT_NEAR(out(b, i, c), expected, 1e-12);
        }
  }
}

TEST(SdpaDropout, SameSeedSameResultDifferentSeedDifferentResult) {
  const Tensor<float> q = random_tensor<float>({2, 16, 8}, 13), k = random_tensor<float>({2, 32, 8}, 14);
  const Tensor<float> v = random_tensor<float>({2, 32, 4}, 15);
  SdpaOptions a, b;
  a.dropout = {0.5, 1}, b.dropout = {0.5, 2};
  const auto out_a = scaled_dot_product_attention<float>(q.view(), k.view(), v.view(), {}, a);
  EXPECT_EQ(out_a.values(), scaled_dot_product_attention<float>(q.view(), k.view(), v.view(), {}, a).values());
  EXPECT_NE(out_a.values(), scaled_dot_product_attention<float>(q.view(), k.view(), v.view(), {}, b).values());
}

// A scale finite as a double but not in float32 (found by fuzzing: it made every score inf).
TEST(Sdpa, AScaleThatOverflowsTheComputationsTypeIsRefused) {
  const Tensor<float> q = random_tensor<float>({1, 2, 3}, 40);
  Tensor<float> out({1, 2, 3});
  SdpaOptions options;
  options.scale = 1e300;
  testing::expect_error([&] { sdpa_forward<float>(out.view(), {}, {}, q.view(), q.view(), q.view(), {}, options); },
                        {"sdpa_forward: scale is 1e+300", "finite in the computation's type (32-bit float)"});
  Tensor<double> out64({1, 2, 3});
  const Tensor<double> q64 = random_tensor<double>({1, 2, 3}, 40);
  sdpa_forward<double>(out64.view(), {}, {}, q64.view(), q64.view(), q64.view(), {}, options);  // fine in float64
  // A soft-cap positive as a double but 0 in float32 (it read as none: the scores uncapped).
  SdpaOptions tiny;
  tiny.softcap = 1e-50;
  testing::expect_error([&] { sdpa_forward<float>(out.view(), {}, {}, q.view(), q.view(), q.view(), {}, tiny); },
                        {"sdpa_forward: softcap is 1e-50", "positive and finite in the computation's type (32-bit float)"});
  sdpa_forward<double>(out64.view(), {}, {}, q64.view(), q64.view(), q64.view(), {}, tiny);  // fine in float64
  // One whose inverse overflows float32 (1 / 1e-40): a score of 0 became 0 inf = NaN.
  tiny.softcap = 1e-40;
  testing::expect_error([&] { sdpa_forward<float>(out.view(), {}, {}, q.view(), q.view(), q.view(), {}, tiny); },
                        {"sdpa_forward: softcap is 1e-40", "and so must its inverse"});
  sdpa_forward<double>(out64.view(), {}, {}, q64.view(), q64.view(), q64.view(), {}, tiny);
  for (const double x : out64.values()) EXPECT_TRUE(std::isfinite(x));
}

// Window bounds near 2^63 mean "unbounded" (found by fuzzing: p(i) + right + 1 overflowed).
TEST(Sdpa, WindowBoundsNearTheIndexLimitAreUnbounded) {
  for (const index_t n : {index_t{2}, index_t{70}}) {  // decode and fused blocks
    const Tensor<float> q = random_tensor<float>({1, n, 8}, 50), k = random_tensor<float>({1, 90, 8}, 51);
    Tensor<float> plain({1, n, 8}), windowed({1, n, 8});
    sdpa_forward<float>(plain.view(), {}, {}, q.view(), k.view(), k.view());
    Mask<float> mask;
    mask.window = Window{std::numeric_limits<index_t>::max(), std::numeric_limits<index_t>::max()};
    sdpa_forward<float>(windowed.view(), {}, {}, q.view(), k.view(), k.view(), mask);
    EXPECT_EQ(windowed.values(), plain.values()) << "n = " << n;
  }
}

// Values of width 0 (found by the generated tests): the backward that recomputes the forward's out
// and lse took no lse buffer when out had no elements, and wrote the lse past its scratch frame.
TEST(Sdpa, BackwardOfValuesOfWidthZeroRecomputesIntoItsOwnBuffers) {
  for (const index_t n : {index_t{1}, index_t{70}}) {  // decode and fused blocks
    const Tensor<float> q = random_tensor<float>({4, n, 3}, 30), k = random_tensor<float>({4, 9, 3}, 31);
    const Tensor<float> v({4, 9, 0}), dout({4, n, 0});
    Tensor<float> dq = random_tensor<float>({4, n, 3}, 32), dk = random_tensor<float>({4, 9, 3}, 33), dv({4, 9, 0});
    sdpa_backward<float>(dq.view(), dk.view(), dv.view(), dout.view(), q.view(), k.view(), v.view(), {}, {});
    for (index_t e = 0; e < dq.numel(); ++e) ASSERT_EQ(dq[e], 0.0f) << "n = " << n;  // the output is empty
    for (index_t e = 0; e < dk.numel(); ++e) ASSERT_EQ(dk[e], 0.0f) << "n = " << n;
  }
}

TEST(Sdpa, EmptyRowsOutputZeroWithFiniteZeroGradients) {
  const Tensor<double> q = random_tensor<double>({2, 3, 4}, 16), k = random_tensor<double>({2, 5, 4}, 17);
  const Tensor<double> v = random_tensor<double>({2, 5, 2}, 18), g = random_tensor<double>({2, 3, 2}, 19);
  const Tensor<std::int64_t> lens({2}, {0, 5});
  Mask<double> mask;
  mask.valid_lens = lens.view();
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    ScopedBackend use(backend);
    Tensor<double> out({2, 3, 2}), lse({2, 3}), w({2, 3, 5});
    sdpa_forward<double>(out.view(), lse.view(), w.view(), q.view(), k.view(), v.view(), mask);
    Tensor<double> dq({2, 3, 4}), dk({2, 5, 4}), dv({2, 5, 2});
    sdpa_backward<double>(dq.view(), dk.view(), dv.view(), g.view(), q.view(), k.view(), v.view(), out.view(),
                          lse.view(), mask);
    for (index_t i = 0; i < 3; ++i) {
      EXPECT_EQ(lse(0, i), -INFINITY);
      for (index_t c = 0; c < 2; ++c) EXPECT_EQ(out(0, i, c), 0.0);
      for (index_t j = 0; j < 5; ++j) EXPECT_EQ(w(0, i, j), 0.0);
      for (index_t c = 0; c < 4; ++c) EXPECT_EQ(dq(0, i, c), 0.0);
    }
    for (index_t j = 0; j < 5; ++j) {
      for (index_t c = 0; c < 4; ++c) EXPECT_EQ(dk(0, j, c), 0.0);
      for (index_t c = 0; c < 2; ++c) EXPECT_EQ(dv(0, j, c), 0.0);
    }
    for (const Tensor<double>* t : {&dq, &dk, &dv})
      for (index_t i = 0; i < t->numel(); ++i) EXPECT_TRUE(std::isfinite((*t)[i]));
  }
}

TEST(Sdpa, GarbageInMaskedKeysAndValuesNeverReachesOutputsOrGradients) {
  Tensor<float> q = random_tensor<float>({2, 3, 4}, 20), k = random_tensor<float>({2, 6, 4}, 21);
  Tensor<float> v = random_tensor<float>({2, 6, 2}, 22);
  const Tensor<float> g = random_tensor<float>({2, 3, 2}, 23);
  const Tensor<std::int64_t> lens({2}, {4, 2});
  Mask<float> mask;
  mask.valid_lens = lens.view();
  auto run = [&] {
    Tensor<float> out({2, 3, 2}), lse({2, 3}), dq({2, 3, 4}), dk({2, 6, 4}), dv({2, 6, 2});
    sdpa_forward<float>(out.view(), lse.view(), {}, q.view(), k.view(), v.view(), mask);
    sdpa_backward<float>(dq.view(), dk.view(), dv.view(), g.view(), q.view(), k.view(), v.view(), out.view(), lse.view(), mask);
    return std::vector<Tensor<float>>{out, lse, dq, dk, dv};
  };
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    ScopedBackend use(backend);
    const auto clean = run();
    for (index_t c = 0; c < 4; ++c) k(0, 5, c) = NAN, k(1, 3, c) = INFINITY;
    for (index_t c = 0; c < 2; ++c) v(0, 4, c) = NAN, v(1, 2, c) = -INFINITY;
    const auto dirty = run();
    for (std::size_t t = 0; t < clean.size(); ++t) EXPECT_EQ(clean[t].values(), dirty[t].values()) << "tensor " << t;
    k = random_tensor<float>({2, 6, 4}, 21), v = random_tensor<float>({2, 6, 2}, 22);
  }
}

TEST(Sdpa, HeadsInterleavedLayoutIsReadThroughStridesWithoutACopy) {
  // Projections laid out (B, n, H, d), as a linear layer writes them, viewed as (B, H, n, d).
  const index_t B = 2, H = 3, n = 5, m = 7, d = 4;
  const Tensor<float> q_bnhd = random_tensor<float>({B, n, H, d}, 27), k_bmhd = random_tensor<float>({B, m, H, d}, 28);
  const Tensor<float> v_bmhd = random_tensor<float>({B, m, H, d}, 29);
  auto as_bhnd = [&](const Tensor<float>& t, index_t rows) {
    return TensorView<const float>(t.data(), {B, H, rows, d}, {rows * H * d, d, H * d, 1});
  };
  auto dense = [&](const Tensor<float>& t, index_t rows) {
    Tensor<float> out({B, H, rows, d});
    const TensorView<const float> view = as_bhnd(t, rows);
    for (index_t b = 0; b < B; ++b)
      for (index_t h = 0; h < H; ++h)
        for (index_t i = 0; i < rows; ++i)
          for (index_t c = 0; c < d; ++c) out(b, h, i, c) = view(b, h, i, c);
    return out;
  };
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    ScopedBackend use(backend);
    const Tensor<float> strided =
        scaled_dot_product_attention<float>(as_bhnd(q_bnhd, n), as_bhnd(k_bmhd, m), as_bhnd(v_bmhd, m));
    const Tensor<float> copied = scaled_dot_product_attention<float>(dense(q_bnhd, n).view(), dense(k_bmhd, m).view(),
                                                                     dense(v_bmhd, m).view());
    EXPECT_EQ(strided.values(), copied.values());
  }
}

// The same layout with keys read by more than one query block (n > 64) and by two query heads each
// (grouped heads): the call copies the keys and values into dense rows first (cpu/sdpa.cpp,
// DenseKeys); the copy changes no bit of the forward or the backward, causal or not.
TEST(Sdpa, HeadsInterleavedKeysCopiedIntoDenseRowsGiveTheSameBits) {
  const index_t B = 2, H = 4, Hk = 2, n = 130, m = 150, d = 16;
  auto interleaved = [&](index_t heads, index_t rows, std::uint64_t seed) {
    return random_tensor<float>({B, rows, heads, d}, seed);
  };
  auto as_bhnd = [&](const Tensor<float>& t, index_t heads, index_t rows) {
    return TensorView<const float>(t.data(), {B, heads, rows, d}, {rows * heads * d, d, heads * d, 1});
  };
  auto dense = [&](const Tensor<float>& t, index_t heads, index_t rows) {
    Tensor<float> out({B, heads, rows, d});
    const TensorView<const float> view = as_bhnd(t, heads, rows);
    for (index_t b = 0; b < B; ++b)
      for (index_t h = 0; h < heads; ++h)
        for (index_t i = 0; i < rows; ++i)
          for (index_t c = 0; c < d; ++c) out(b, h, i, c) = view(b, h, i, c);
    return out;
  };
  const Tensor<float> q = interleaved(H, n, 71), k = interleaved(Hk, m, 72), v = interleaved(Hk, m, 73);
  const Tensor<float> g = interleaved(H, n, 74);
  const Tensor<float> qd = dense(q, H, n), kd = dense(k, Hk, m), vd = dense(v, Hk, m), gd = dense(g, H, n);
  for (Causal causal : {Causal::none, Causal::bottom_right}) {
    Mask<float> mask;
    mask.causal = causal;
    // results[0]: the interleaved views; results[1]: dense copies made here.
    std::vector<Tensor<float>> results[2];
    for (int which = 0; which < 2; ++which) {
      const bool in_place = which == 0;
      const TensorView<const float> qv = in_place ? as_bhnd(q, H, n) : qd.cview(), kv = in_place ? as_bhnd(k, Hk, m) : kd.cview();
      const TensorView<const float> vv = in_place ? as_bhnd(v, Hk, m) : vd.cview(), gv = in_place ? as_bhnd(g, H, n) : gd.cview();
      Tensor<float> out({B, H, n, d}), lse({B, H, n}), dq({B, H, n, d}), dk({B, Hk, m, d}), dv({B, Hk, m, d});
      sdpa_forward<float>(out.view(), lse.view(), {}, qv, kv, vv, mask);
      sdpa_backward<float>(dq.view(), dk.view(), dv.view(), gv, qv, kv, vv, out.cview(), lse.cview(), mask);
      results[which] = {out, lse, dq, dk, dv};
    }
    for (std::size_t t = 0; t < results[0].size(); ++t)
      EXPECT_EQ(results[0][t].values(), results[1][t].values()) << "tensor " << t << ", causal " << static_cast<int>(causal);
  }
}

TEST(Sdpa, ScaleDefaultsToOneOverSqrtD) {
  const Tensor<double> q = random_tensor<double>({1, 2, 9}, 24), k = random_tensor<double>({1, 3, 9}, 25);
  const Tensor<double> v = random_tensor<double>({1, 3, 2}, 26);
  SdpaOptions third;
  third.scale = 1.0 / 3.0;
  EXPECT_LT(testing::max_abs_diff(scaled_dot_product_attention<double>(q.view(), k.view(), v.view()),
                                  scaled_dot_product_attention<double>(q.view(), k.view(), v.view(), {}, third)),
            1e-15);
}

// Scales of either sign, and 0, on whole blocks of 64 queries, where the fused kernels apply the
// scale inside the softmax step on an unmasked tile (weigh_tile): the largest scaled score is the
// scale times the largest score only for a positive scale. The scores spread over more than exp's
// range (88 in float, 709 in double), so a wrong maximum overflows to NaN. Forward and backward
// against the reference backend in the same type.
template <class T>
void expect_scales_of_every_sign(double spread) {
  const index_t B = 1, H = 2, n = 130, m = 140, d = 8;
  const Tensor<T> q = random_tensor<T>({B, H, n, d}, 31, -spread, spread), k = random_tensor<T>({B, H, m, d}, 32);
  const Tensor<T> v = random_tensor<T>({B, H, m, d}, 33), g = random_tensor<T>({B, H, n, d}, 34);
  const double tol = sizeof(T) == 4 ? 2e-4 : 1e-10;
  for (double scale : {-1.0, -0.05, 0.0, 0.05, 1.0}) {
    SdpaOptions options;
    options.scale = scale;
    std::vector<Tensor<T>> results[2];
    for (int which = 0; which < 2; ++which) {
      ScopedBackend use(which == 0 ? Backend::reference : Backend::cpu);
      Tensor<T> out({B, H, n, d}), lse({B, H, n}), dq({B, H, n, d}), dk({B, H, m, d}), dv({B, H, m, d});
      sdpa_forward<T>(out.view(), lse.view(), {}, q.view(), k.view(), v.view(), {}, options);
      sdpa_backward<T>(dq.view(), dk.view(), dv.view(), g.view(), q.view(), k.view(), v.view(), out.view(), lse.view(),
                       {}, options);
      for (Tensor<T>* t : {&out, &lse, &dq, &dk, &dv}) results[which].push_back(std::move(*t));
    }
    const char* names[] = {"out", "lse", "dq", "dk", "dv"};
    for (int i = 0; i < 5; ++i) {
      double top = 1;
      for (index_t e = 0; e < results[0][i].numel(); ++e) top = std::max(top, std::abs(double(results[0][i][e])));
      EXPECT_LE(testing::max_abs_diff(results[1][i], results[0][i]), tol * top)
          << names[i] << ", scale " << scale << ", " << sizeof(T) * 8 << "-bit";
    }
  }
}

TEST(Sdpa, ScalesOfEverySignOnWholeBlocks) {
  // q in [-spread, spread], k in [-1, 1], d = 8: scores of standard deviation spread sqrt(8) / 3,
  // so a row of 140 keys spans about 190 (float) and 1900 (double).
  expect_scales_of_every_sign<float>(40.0);
  expect_scales_of_every_sign<double>(400.0);
}

TEST(Sdpa, BadInputNamesTheArgumentAndTheRule) {
  const Tensor<float> q({2, 1, 2}), k({2, 10, 2}), k3({2, 10, 3}), v({2, 10, 4}), v9({2, 9, 4}), k4({2, 1, 10, 2});
  Tensor<float> out({2, 1, 4}), bad_out({2, 1, 5});
  auto call = [&](const Tensor<float>& kk, const Tensor<float>& vv, Tensor<float>& o, const Mask<float>& mask,
                  const SdpaOptions& opt) {
    sdpa_forward<float>(o.view(), {}, {}, q.view(), kk.view(), vv.view(), mask, opt);
  };
  testing::expect_error([&] { call(k3, v, out, {}, {}); }, {"sdpa_forward: keys has shape (2,10,3) but must be (2,10,2)", "last dimension d of queries (2,1,2)"});
  testing::expect_error([&] { call(k, v9, out, {}, {}); }, {"values has shape (2,9,4) but must be (2,10,4)"});
  testing::expect_error([&] { call(k4, v, out, {}, {}); }, {"keys has shape (2,1,10,2)", "same rank"});
  testing::expect_error([&] { call(k, v, bad_out, {}, {}); }, {"out has shape (2,1,5) but must be (2,1,4)"});
  for (double p : {-0.1, 1.0, double(NAN)}) {
    SdpaOptions opt;
    opt.dropout.p = p;
    testing::expect_error([&] { call(k, v, out, {}, opt); }, {"dropout p is", "[0, 1)"});
  }
  SdpaOptions inf_scale;
  inf_scale.scale = INFINITY;
  testing::expect_error([&] { call(k, v, out, {}, inf_scale); }, {"scale is inf"});
  const Tensor<std::int64_t> lens({2}, {2, 11});
  Mask<float> mask;
  mask.valid_lens = lens.view();
  testing::expect_error([&] { call(k, v, out, mask, {}); }, {"valid_lens[1] is 11", "[0, m] = [0, 10]"});
  const Tensor<bool> keep({2, 2, 10});
  Mask<float> bad_keep;
  bad_keep.keep = keep.view();
  testing::expect_error([&] { call(k, v, out, bad_keep, {}); }, {"mask has shape (2,2,10)", "does not broadcast", "(2,1,10)"});
  testing::expect_error([&] { sdpa_forward<float>(out.view(), {}, {}, q.view(), k.view(), {}, {}, {}); }, {"values is required"});
  Tensor<float> lse_bad({2, 2});
  testing::expect_error([&] { sdpa_forward<float>(out.view(), lse_bad.view(), {}, q.view(), k.view(), v.view()); }, {"lse has shape (2,2) but must be (2,1)"});
  Tensor<float> dq({2, 1, 2});
  testing::expect_error([&] { sdpa_backward<float>(dq.view(), {}, {}, out.view(), q.view(), k.view(), v.view(), out.view(), lse_bad.view()); }, {"sdpa_backward: lse has shape (2,2) but must be (2,1)"});
  Tensor<float> dk_bad({2, 10, 3});
  testing::expect_error([&] { sdpa_backward<float>(dq.view(), dk_bad.view(), {}, out.view(), q.view(), k.view(), v.view(), {}, {}); }, {"dkeys has shape (2,10,3) but must be (2,10,2)"});
  testing::expect_error([&] { sdpa_backward<float>(dq.view(), {}, {}, {}, q.view(), k.view(), v.view(), {}, {}); }, {"dout is required"});
  // out written over the start of values' buffer.
  Tensor<float> shared({2, 10, 4});
  const TensorView<float> out_in_values(shared.data(), {2, 1, 4}, {40, 4, 1});
  testing::expect_error([&] { sdpa_forward<float>(out_in_values, {}, {}, q.view(), k.view(), shared.cview()); }, {"out and values share memory"});
}

TEST(Sdpa, SizesWhoseProductOverflowsAreRefused) {
  float x = 0;
  testing::expect_error([&] { TensorView<const float> huge(&x, {1 << 30, 1 << 30, 1 << 30}); }, {"overflows"});
  // A view whose strides reach past 2^63 elements.
  const TensorView<const float> far(&x, {2, 2, 2}, {std::int64_t(1) << 62, std::int64_t(1) << 62, 1});
  Tensor<float> out({2, 2, 2});
  testing::expect_error([&] { sdpa_forward<float>(out.view(), {}, {}, far, far, far); }, {"queries with shape (2,2,2) spans more elements than a 64-bit index holds"});
}

// The softmax weights' exponential (ExpWeight, simd/gemm-inl.h) on the current SIMD target: every
// 997th float of [-87, 0] against std::exp in double, within 2^-23 relative (1 ulp at the bottom of
// a binade, 2 at its top; hn::Exp states 1 ulp); below -87 flushed to 0, -inf to 0, NaN kept.
// Vectors whose lanes are all <= 0 take hn::Exp's arithmetic written out; the same values in
// vectors holding a lane > 0 (which take hn::Exp itself) must give the same bits.
TEST(ExpWeightAccuracy, FloatWithinTwoToTheMinus23AndTheSameBitsAsHighwaysExp) {
  std::vector<float> x;
  for (std::uint32_t bits = 0x80000000u; bits <= 0xC2AE0000u; bits += 997) {  // -0 to -87
    float v;
    std::memcpy(&v, &bits, sizeof v);
    x.push_back(v);
  }
  for (float v : {0.0f, -0.0f, -1e-45f, -1e-30f, -0.34657359f, -0.34657362f, -0.69314718f, -1.0f, -86.999f, -87.0f})
    x.push_back(v);
  std::vector<float> y(x.size());
  cpu::fused::simd_exp_weight(x.data(), y.data(), x.size());
  double worst = 0, where = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double e = std::exp(static_cast<double>(x[i]));
    const double err = std::abs(static_cast<double>(y[i]) - e) / e;
    if (err > worst) worst = err, where = x[i];
  }
  EXPECT_LE(worst, 0x1p-23) << "at x = " << where;
  // Interleaved with 1.0: every vector of two lanes or more then holds a lane > 0.
  std::vector<float> mixed, out(2 * x.size());
  for (float v : x) mixed.push_back(v), mixed.push_back(1.0f);
  cpu::fused::simd_exp_weight(mixed.data(), out.data(), mixed.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(std::memcmp(&out[2 * i], &y[i], sizeof(float)), 0) << "x = " << x[i] << ": " << out[2 * i] << " and " << y[i];
    ASSERT_NEAR(out[2 * i + 1], std::exp(1.0), 3e-7);
  }
  const float special[] = {-87.001f, -88.0f, -1e30f, -INFINITY, NAN};
  float got[5];
  cpu::fused::simd_exp_weight(special, got, 5);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(got[i], 0.0f) << "x = " << special[i];
  EXPECT_TRUE(std::isnan(got[4]));
}

}  // namespace
}  // namespace attn
