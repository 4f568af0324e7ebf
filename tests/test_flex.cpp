// Scoring functions of the caller's (attn/flex.hpp): ALiBi and soft-capping written as score_mod
// functors against the built-in options, document masking as a mask_mod against segment ids (its
// empty tiles skipped), and T5's relative-position buckets with a learnable bias table against the
// float64 reference given the same bias as a dense additive mask; every gradient, the table's
// included, against finite differences; a score_mod whose parameter gradient is wrong is caught by
// the same check; a NaN a score_mod makes stays in its row.
#include <cmath>
#include <cstdint>
#include <functional>
#include <utility>
#include <string>
#include <vector>

#include "attn/flex.hpp"
#include "cpu/simd/dispatch.hpp"
#include "support/testing.hpp"

namespace attn {
namespace {

using testing::convert;
using testing::random_tensor;

// ALiBi as FlashAttention-2 and attn's option define it: score - slope_h |i - j| (n == m).
template <class T>
struct AlibiMod {
  const T* slopes;
  template <class S>
  S operator()(S score, index_t, index_t h, index_t i, index_t j) const {
    return score - slopes[h] * static_cast<T>(std::abs(i - j));
  }
};

template <class T>
struct SoftcapMod {
  T cap;
  template <class S>
  S operator()(S score, index_t, index_t, index_t, index_t) const {
    using std::tanh;
    return cap * tanh(score / cap);
  }
};

// Documents by segment id, as mask_mod.
struct DocumentMask {
  const std::int32_t* ids;  // (B, n), n == m
  index_t n;
  bool operator()(index_t b, index_t, index_t i, index_t j) const { return ids[b * n + i] == ids[b * n + j]; }
};

// T5's bidirectional relative-position buckets (num_buckets 32, max_distance 128), and the
// learnable bias table (H, buckets) a score_mod adds: score + table[h][bucket(j - i)].
inline index_t t5_bucket(index_t relative, index_t buckets = 32, index_t max_distance = 128) {
  buckets /= 2;
  index_t bucket = relative > 0 ? buckets : 0;
  const index_t r = std::abs(relative), exact = buckets / 2;
  if (r < exact) return bucket + r;
  const double large = exact + std::log(static_cast<double>(r) / exact) / std::log(static_cast<double>(max_distance) / exact) *
                                   (buckets - exact);
  return bucket + std::min<index_t>(buckets - 1, static_cast<index_t>(large));
}

template <class T>
struct T5Bias {
  const T* table;  // (H, 32)
  index_t H;
  template <class S>
  S operator()(S score, index_t, index_t h, index_t i, index_t j) const {
    return score + table[h * 32 + t5_bucket(j - i)];
  }
  using Grad = std::vector<T>;  // (H, 32)
  void accumulate(Grad& g, T dmod, index_t, index_t h, index_t i, index_t j) const {
    if (g.empty()) g.assign(static_cast<std::size_t>(H * 32), T(0));
    g[static_cast<std::size_t>(h * 32 + t5_bucket(j - i))] += dmod;
  }
  void combine(Grad& total, const Grad& part) const {
    if (part.empty()) return;
    if (total.empty()) total.assign(part.size(), T(0));
    for (std::size_t e = 0; e < part.size(); ++e) total[e] += part[e];
  }
};

// The same table with a wrong parameter gradient (twice the right one): the checks must see it.
template <class T>
struct T5BiasWrongGrad : T5Bias<T> {
  void accumulate(typename T5Bias<T>::Grad& g, T dmod, index_t b, index_t h, index_t i, index_t j) const {
    T5Bias<T>::accumulate(g, 2 * dmod, b, h, i, j);
  }
};

constexpr index_t B = 2, H = 3, n = 70, m = 70, d = 9, dv = 5;

struct Inputs {
  Tensor<double> q, k, v, g, slopes, table;
  Tensor<std::int32_t> ids{B, n};
  // kv_heads < H: grouped-query attention.
  explicit Inputs(index_t kv_heads = H)
      : q(random_tensor<double>({B, H, n, d}, 1, -2, 2)), k(random_tensor<double>({B, kv_heads, m, d}, 2, -2, 2)),
        v(random_tensor<double>({B, kv_heads, m, dv}, 3)), g(random_tensor<double>({B, H, n, dv}, 4)),
        slopes(random_tensor<double>({H}, 5, 0.05, 0.5)), table(random_tensor<double>({H, 32}, 6, -1, 1)) {
    for (index_t i = 0; i < B * n; ++i) ids[i] = static_cast<std::int32_t>((i % n) / 23 + (i % n) / 61);
  }
};

// out, lse, dq, dk, dv of flex attention with score_mod and mask_mod, in precision T.
template <class T, class ScoreMod, class MaskMod = KeepAll>
std::vector<Tensor<T>> run_flex(const Inputs& in, const ScoreMod& mod, const MaskMod& mask_mod = {}, Mask<T> mask = {},
                                std::vector<T>* table_grad = nullptr) {
  const Tensor<T> q = convert<T>(in.q), k = convert<T>(in.k), v = convert<T>(in.v), g = convert<T>(in.g);
  Tensor<T> out({B, H, n, dv}), lse({B, H, n}), dq(q.shape()), dk(k.shape()), dvv(v.shape());
  flex_attention_forward<T>(out.view(), lse.view(), q.view(), k.view(), v.view(), mod, mask_mod, mask);
  const auto grads = flex_attention_backward<T>(dq.view(), dk.view(), dvv.view(), g.view(), q.view(), k.view(), v.view(),
                                                out.view(), lse.view(), mod, mask_mod, mask);
  if constexpr (detail::HasGrad<ScoreMod, T>)
    if (table_grad != nullptr) *table_grad = grads;
  return {out, lse, dq, dk, dvv};
}

// The same through sdpa with a built-in mask, in precision T (the backend chooses).
template <class T>
std::vector<Tensor<T>> run_sdpa(const Inputs& in, const Mask<T>& mask, const SdpaOptions& options = {}) {
  const Tensor<T> q = convert<T>(in.q), k = convert<T>(in.k), v = convert<T>(in.v), g = convert<T>(in.g);
  Tensor<T> out({B, H, n, dv}), lse({B, H, n}), dq(q.shape()), dk(k.shape()), dvv(v.shape());
  sdpa_forward<T>(out.view(), lse.view(), {}, q.view(), k.view(), v.view(), mask, options);
  sdpa_backward<T>(dq.view(), dk.view(), dvv.view(), g.view(), q.view(), k.view(), v.view(), out.view(), lse.view(), mask,
                   options);
  return {out, lse, dq, dk, dvv};
}

// The functor's results against the float64 reference of the built-in equivalent: float64 within
// 1e-12, float32 within the error budget.
template <class Oracle, class Flex>
void expect_matches(const Oracle& oracle_of, const Flex& flex_of) {
  std::vector<Tensor<double>> oracle;
  std::vector<Tensor<float>> ref32;
  {
    ScopedBackend reference(Backend::reference);
    oracle = oracle_of.template operator()<double>();
    ref32 = oracle_of.template operator()<float>();
  }
  const std::vector<Tensor<double>> got64 = flex_of.template operator()<double>();
  const std::vector<Tensor<float>> got32 = flex_of.template operator()<float>();
  const char* names[] = {"out", "lse", "dq", "dk", "dv"};
  for (std::size_t t = 0; t < oracle.size(); ++t) {
    SCOPED_TRACE(names[t]);
    EXPECT_LE(testing::max_abs_diff(got64[t], oracle[t]), 1e-12 * 100);
    EXPECT_TRUE(testing::within_error_budget(got32[t], ref32[t], oracle[t]));
  }
  testing::expect_same_at_1_and_2_threads<float>([&] { return flex_of.template operator()<float>(); });
}

TEST(Flex, AlibiAsAScoreModMatchesTheBuiltInAlibi) {
  const Inputs in;
  expect_matches(
      [&]<class T>() {
        const Tensor<T> slopes = convert<T>(in.slopes);
        Mask<T> mask;
        mask.alibi_slopes = slopes.view();
        return run_sdpa<T>(in, mask);
      },
      [&]<class T>() {
        const Tensor<T> slopes = convert<T>(in.slopes);
        return run_flex<T>(in, AlibiMod<T>{slopes.data()});
      });
}

TEST(Flex, SoftcapAsAScoreModMatchesTheBuiltInSoftcap) {
  const Inputs in;
  SdpaOptions options;
  options.softcap = 2.0;
  expect_matches([&]<class T>() { return run_sdpa<T>(in, {}, options); },
                 [&]<class T>() { return run_flex<T>(in, SoftcapMod<T>{T(2.0)}); });
}

TEST(Flex, DocumentMaskingMatchesSegmentIdsAndSkipsEmptyTiles) {
  Inputs in;
  expect_matches(
      [&]<class T>() {
        Mask<T> mask;
        mask.segment_ids_q = in.ids.view();
        mask.causal = Causal::top_left;
        return run_sdpa<T>(in, mask);
      },
      [&]<class T>() {
        Mask<T> causal;
        causal.causal = Causal::top_left;
        return run_flex<T>(in, IdentityScore{}, DocumentMask{in.ids.data(), n}, causal);
      });
  // Two documents of 256 in 512: the block mask leaves 2 x 2 of the 8 x 8 (query block, key tile) pairs
  // of each head dead... and the forward computes only the live ones.
  const index_t N = 512;
  Tensor<std::int32_t> ids({1, N});
  for (index_t i = 0; i < N; ++i) ids[i] = static_cast<std::int32_t>(i / 256);
  const Tensor<float> q = random_tensor<float>({1, 1, N, 8}, 7), k = random_tensor<float>({1, 1, N, 8}, 8);
  const Tensor<float> v = random_tensor<float>({1, 1, N, 8}, 9);
  Tensor<float> out({1, 1, N, 8});
  cpu::simd::reset_ran();
  flex_attention_forward<float>(out.view(), {}, q.view(), k.view(), v.view(), IdentityScore{}, DocumentMask{ids.data(), N});
  EXPECT_EQ(cpu::simd::tiles(), 2 * 4 * 4);  // each document: 4 query blocks x its 4 key tiles
}

// T5's bias table: against the reference given the bias as a dense additive mask; the table's
// gradient against the reference's dscores summed per bucket, and against finite differences.
TEST(Flex, T5BucketsWithALearnableTableMatchTheDenseBiasAndTheirGradient) {
  Inputs in;
  expect_matches(
      [&]<class T>() {
        Tensor<T> bias({1, H, n, m});
        for (index_t h = 0; h < H; ++h)
          for (index_t i = 0; i < n; ++i)
            for (index_t j = 0; j < m; ++j) bias(0, h, i, j) = static_cast<T>(in.table(h, t5_bucket(j - i)));
        Mask<T> mask;
        mask.additive = bias.view();
        return run_sdpa<T>(in, mask);
      },
      [&]<class T>() {
        const Tensor<T> table = convert<T>(in.table);
        return run_flex<T>(in, T5Bias<T>{table.data(), H});
      });
  // d loss / d table by finite differences in float64.
  std::vector<double> grad;
  (void)run_flex<double>(in, T5Bias<double>{in.table.data(), H}, KeepAll{}, {}, &grad);
  auto loss = [&] { return testing::dot(run_flex<double>(in, T5Bias<double>{in.table.data(), H})[0], in.g); };
  std::string where;
  EXPECT_LT(testing::gradient_error(grad, testing::numeric_gradient(loss, in.table.values()), &where), 1e-6) << where;
}

// Central differences of the forward alone, on 40 entries of x drawn at random (the whole of q and k
// would take 15,000 runs).
std::vector<std::pair<double, double>> sampled_gradient(const std::function<double()>& loss, Tensor<double>& x,
                                                        const Tensor<double>& analytic, std::uint64_t seed) {
  std::vector<std::pair<double, double>> pairs;  // (analytic, numeric)
  std::uint64_t state = seed;
  for (int t = 0; t < 40; ++t) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    const index_t e = static_cast<index_t>((state >> 33) % static_cast<std::uint64_t>(x.numel()));
    const double keep = x[e], eps = 1e-6;
    x[e] = keep + eps;
    const double up = loss();
    x[e] = keep - eps;
    const double down = loss();
    x[e] = keep;
    pairs.emplace_back(analytic[e], (up - down) / (2 * eps));
  }
  return pairs;
}

TEST(Flex, EveryGradientMatchesFiniteDifferencesWithMasksAndGroupedHeads) {
  Inputs in(/*kv_heads=*/1);  // three query heads share one key head
  Mask<double> mask;
  mask.causal = Causal::top_left;
  mask.window = Window{20, -1};
  const auto mod = AlibiMod<double>{in.slopes.data()};
  const auto doc = DocumentMask{in.ids.data(), n};
  const std::vector<Tensor<double>> r = run_flex<double>(in, mod, doc, mask);
  auto loss = [&] {
    Tensor<double> out({B, H, n, dv});
    flex_attention_forward<double>(out.view(), {}, in.q.view(), in.k.view(), in.v.view(), mod, doc, mask);
    return testing::dot(out, in.g);
  };
  const std::pair<Tensor<double>*, const char*> inputs[] = {{&in.q, "dq"}, {&in.k, "dk"}, {&in.v, "dv"}};
  for (std::size_t t = 0; t < 3; ++t)
    for (const auto& [analytic, numeric] : sampled_gradient(loss, *inputs[t].first, r[2 + t], 11 + t))
      EXPECT_NEAR(analytic, numeric, 1e-6 * std::max(1.0, std::abs(numeric))) << inputs[t].second;
}

// The finite-difference check is what catches a score_mod whose derivative is wrong: the table's
// gradient of T5BiasWrongGrad (twice the true one) fails it by far.
TEST(Flex, AWrongParameterGradientFailsTheCheck) {
  Inputs in;
  std::vector<double> wrong;
  T5BiasWrongGrad<double> mod;
  mod.table = in.table.data(), mod.H = H;
  (void)run_flex<double>(in, mod, KeepAll{}, {}, &wrong);
  auto loss = [&] { return testing::dot(run_flex<double>(in, T5Bias<double>{in.table.data(), H})[0], in.g); };
  std::string where;
  EXPECT_GT(testing::gradient_error(wrong, testing::numeric_gradient(loss, in.table.values()), &where), 1e-2);
}

// A score_mod that returns NaN for a finite score: that row's output and lse are NaN (as PyTorch's
// flex_attention), the other rows are untouched.
struct NaNAt {
  template <class S>
  S operator()(S score, index_t b, index_t h, index_t i, index_t j) const {
    return b == 1 && h == 2 && i == 5 && j == 7 ? S(NAN) : score;
  }
};

TEST(Flex, ANaNFromScoreModStaysInItsRow) {
  const Inputs in;
  const std::vector<Tensor<double>> clean = run_flex<double>(in, IdentityScore{});
  const std::vector<Tensor<double>> got = run_flex<double>(in, NaNAt{});
  for (index_t bb = 0; bb < B; ++bb)
    for (index_t hh = 0; hh < H; ++hh)
      for (index_t i = 0; i < n; ++i) {
        const bool poisoned = bb == 1 && hh == 2 && i == 5;
        EXPECT_EQ(std::isnan(got[1](bb, hh, i)), poisoned) << bb << "," << hh << "," << i;
        if (!poisoned) {
          EXPECT_EQ(got[0](bb, hh, i, 0), clean[0](bb, hh, i, 0));
        }
      }
}

}  // namespace
}  // namespace attn
