// The alignment rule (Mask::align: where the queries sit for the causal mask, windows and ALiBi
// together, causal or not) and attention sinks (Mask::sinks, gpt-oss), against a float64 oracle
// written here straight from the definitions in attn/mask.hpp, independent of attn's mask plan:
//   p(i) = i (top_left) or i + m - n (bottom_right); key j allowed when (not causal or j <= p(i)) and
//   p(i) - left <= j <= p(i) + right; score = softcap(scale q.k) - slope |p(i) - j|; the sink's logit
//   appended as one more column with no value (gpt-oss's reference: concatenate, softmax, drop it).
// Every combination of n < m, n = m, n > m with causal on and off, both alignments, windows, ALiBi
// and sinks, on the cpu, unfused and reference backends, float64 and float32 (within the error budget of
// STYLE.md), and 16-bit; gradients (dsinks included) against finite differences in float64; the KV
// cache's decode window; and the bad inputs.
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "attn/additive.hpp"
#include "attn/config.hpp"
#include "attn/kv_cache.hpp"
#include "attn/sdpa.hpp"
#include "attn/softmax.hpp"
#include "support/testing.hpp"

namespace attn {
namespace {

using testing::convert;
using testing::expect_error;
using testing::random_tensor;

struct Case {
  index_t n, m;
  bool causal;
  Align align;
  std::optional<Window> window;
  bool alibi, sinks;
  double softcap = 0;
};

std::string name_of(const Case& c) {
  std::string s = "n" + std::to_string(c.n) + "_m" + std::to_string(c.m) + (c.causal ? "_causal" : "") +
                  (c.align == Align::bottom_right ? "_bottom_right" : "_top_left");
  auto bound = [](index_t w) { return w < 0 ? std::string("inf") : std::to_string(w); };
  if (c.window) s += "_window" + bound(c.window->left) + "_" + bound(c.window->right);
  if (c.alibi) s += "_alibi";
  if (c.sinks) s += "_sinks";
  return s;
}

constexpr index_t kB = 2, kH = 3, kD = 5, kV = 4;

struct Inputs {
  Tensor<double> q, k, v, g, slopes, sinks;
  Inputs(const Case& c)
      : q(random_tensor<double>({kB, kH, c.n, kD}, 11, -1.5, 1.5)),
        k(random_tensor<double>({kB, kH, c.m, kD}, 12, -1.5, 1.5)),
        v(random_tensor<double>({kB, kH, c.m, kV}, 13)),
        g(random_tensor<double>({kB, kH, c.n, kV}, 14)),
        slopes(random_tensor<double>({kH}, 15, 0.1, 0.6)),
        sinks(random_tensor<double>({kH}, 16, -1.0, 2.0)) {}
};

// out (B, H, n, v) and lse (B, H, n) from the definitions; an empty row (no key, no sink) is 0, -inf.
std::pair<Tensor<double>, Tensor<double>> oracle(const Case& c, const Inputs& x) {
  Tensor<double> out({kB, kH, c.n, kV}), lse({kB, kH, c.n});
  const double scale = 1 / std::sqrt(static_cast<double>(kD));
  for (index_t b = 0; b < kB; ++b)
    for (index_t h = 0; h < kH; ++h)
      for (index_t i = 0; i < c.n; ++i) {
        const index_t p = i + (c.align == Align::bottom_right ? c.m - c.n : 0);
        std::vector<double> score;
        std::vector<index_t> key;
        for (index_t j = 0; j < c.m; ++j) {
          if (c.causal && j > p) continue;
          if (c.window && c.window->left >= 0 && j < p - c.window->left) continue;
          if (c.window && c.window->right >= 0 && j > p + c.window->right) continue;
          double s = 0;
          for (index_t e = 0; e < kD; ++e) s += x.q(b, h, i, e) * x.k(b, h, j, e);
          s *= scale;
          if (c.softcap > 0) s = c.softcap * std::tanh(s / c.softcap);
          if (c.alibi) s -= x.slopes(h) * std::abs(static_cast<double>(p - j));
          score.push_back(s), key.push_back(j);
        }
        if (c.sinks) score.push_back(x.sinks(h));  // the sink's column, no value
        double top = -std::numeric_limits<double>::infinity(), sum = 0;
        for (const double s : score) top = std::max(top, s);
        for (const double s : score) sum += std::exp(s - top);
        lse(b, h, i) = score.empty() ? -std::numeric_limits<double>::infinity() : top + std::log(sum);
        for (index_t e = 0; e < kV; ++e) {
          double acc = 0;
          for (std::size_t t = 0; t < key.size(); ++t) acc += std::exp(score[t] - top) / sum * x.v(b, h, key[t], e);
          out(b, h, i, e) = acc;
        }
      }
  return {out, lse};
}

template <class T>
Mask<T> mask_of(const Case& c, const Tensor<T>& slopes, const Tensor<T>& sinks) {
  Mask<T> mask;
  mask.causal = !c.causal ? Causal::none : c.align == Align::bottom_right ? Causal::bottom_right : Causal::top_left;
  mask.align = c.align;
  mask.window = c.window;
  if (c.alibi) mask.alibi_slopes = slopes.cview();
  if (c.sinks) mask.sinks = sinks.cview();
  return mask;
}

// attn's out and lse in precision T on the current backend.
template <class T>
std::pair<Tensor<T>, Tensor<T>> attn_forward(const Case& c, const Inputs& x) {
  const Tensor<T> q = convert<T>(x.q), k = convert<T>(x.k), v = convert<T>(x.v);
  const Tensor<T> slopes = convert<T>(x.slopes), sinks = convert<T>(x.sinks);
  Tensor<T> out({kB, kH, c.n, kV}), lse({kB, kH, c.n});
  SdpaOptions options;
  if (c.softcap > 0) options.softcap = c.softcap;
  sdpa_forward<T>(out.view(), lse.view(), {}, q.cview(), k.cview(), v.cview(), mask_of(c, slopes, sinks), options);
  return {out, lse};
}

// attn's float32 out on the cpu backend within the error budget of the float32 reference backend.
void expect_float32_within_budget(const Case& c, const Inputs& x, const Tensor<double>& want) {
  Tensor<float> ref32, cpu32;
  {
    ScopedBackend scoped(Backend::reference);
    ref32 = attn_forward<float>(c, x).first;
  }
  ScopedBackend scoped(Backend::cpu);
  cpu32 = attn_forward<float>(c, x).first;
  EXPECT_TRUE(testing::within_error_budget(cpu32, ref32, want));
}

std::vector<Case> cases() {
  std::vector<Case> all;
  const std::pair<index_t, index_t> sizes[] = {{3, 9}, {7, 7}, {9, 4}, {1, 12}};
  const std::optional<Window> windows[] = {std::nullopt, Window{2, 1}, Window{4, 0}, Window{-1, 2}};
  for (const auto& [n, m] : sizes)
    for (const bool causal : {false, true})
      for (const Align align : {Align::top_left, Align::bottom_right})
        for (const auto& window : windows)
          for (const bool alibi : {false, true})
            for (const bool sinks : {false, true}) all.push_back({n, m, causal, align, window, alibi, sinks});
  return all;
}

class AlignSinks : public ::testing::TestWithParam<Case> {};

TEST_P(AlignSinks, ForwardMatchesTheDefinitions) {
  const Case& c = GetParam();
  const Inputs x(c);
  const auto [want_out, want_lse] = oracle(c, x);
  for (const Backend backend : {Backend::cpu, Backend::unfused, Backend::reference}) {
    ScopedBackend scoped(backend);
    const auto [out64, lse64] = attn_forward<double>(c, x);
    EXPECT_LE(testing::max_abs_diff(out64, want_out), 1e-12) << "float64 out, backend " << static_cast<int>(backend);
    for (index_t e = 0; e < lse64.numel(); ++e) {
      const double got = lse64.data()[e], want = want_lse.data()[e];
      if (std::isinf(want)) {
        EXPECT_EQ(got, want) << "lse " << e;
      } else {
        EXPECT_NEAR(got, want, 1e-12) << "lse " << e;
      }
    }
  }
  expect_float32_within_budget(c, x, want_out);
}

INSTANTIATE_TEST_SUITE_P(EveryCombination, AlignSinks, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return name_of(info.param); });

// Gradients of sum(out * g) with respect to q, k, v and the sinks, against finite differences: the
// cases with sinks, and those with ALiBi and a window (both placed by the alignment).
class AlignSinksBackward : public ::testing::TestWithParam<Case> {};

std::vector<Case> backward_cases() {
  std::vector<Case> some;
  for (const Case& c : cases())
    if (c.sinks || (c.alibi && c.window)) some.push_back(c);
  return some;
}

TEST_P(AlignSinksBackward, MatchesFiniteDifferences) {
  const Case& c = GetParam();
  Inputs x(c);
  ScopedBackend scoped(Backend::cpu);
  const Tensor<double> g = x.g;
  auto loss = [&] { return testing::dot(attn_forward<double>(c, x).first, g); };
  const auto [out, lse] = attn_forward<double>(c, x);
  Tensor<double> dq(x.q.shape()), dk(x.k.shape()), dv(x.v.shape()), ds({kH});
  sdpa_backward<double>(dq.view(), dk.view(), dv.view(), g.cview(), x.q.cview(), x.k.cview(), x.v.cview(), out.cview(),
                        lse.cview(), mask_of(c, x.slopes, x.sinks), {}, c.sinks ? ds.view() : TensorView<double>{});
  const std::pair<Tensor<double>*, Tensor<double>*> pairs[] = {{&x.q, &dq}, {&x.k, &dk}, {&x.v, &dv}, {&x.sinks, &ds}};
  for (const auto& [input, grad] : pairs) {
    if (input == &x.sinks && !c.sinks) continue;
    const std::vector<double> numeric = testing::numeric_gradient(loss, {input->data(), static_cast<std::size_t>(input->numel())});
    std::string where;
    EXPECT_LE(testing::gradient_error({grad->data(), static_cast<std::size_t>(grad->numel())}, numeric, &where), 1e-7)
        << where;
  }
  // Without out and lse the backward runs the forward itself: the same gradients.
  Tensor<double> dq2(x.q.shape()), ds2({kH});
  sdpa_backward<double>(dq2.view(), {}, {}, g.cview(), x.q.cview(), x.k.cview(), x.v.cview(), {}, {},
                        mask_of(c, x.slopes, x.sinks), {}, c.sinks ? ds2.view() : TensorView<double>{});
  EXPECT_LE(testing::max_abs_diff(dq2, dq), 1e-13);
  if (c.sinks) {
    EXPECT_LE(testing::max_abs_diff(ds2, ds), 1e-13);
  }
}

INSTANTIATE_TEST_SUITE_P(SinksOrPositionBias, AlignSinksBackward, ::testing::ValuesIn(backward_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return name_of(info.param); });

// Fused-kernel sizes (several 64-key tiles, n != m) with soft-capping, GQA and float32 against the
// oracle's float64 within the float32 reference's error budget; bit-identical at 1 and 2 threads.
TEST(AlignSinksLarge, FusedTilesAndThreads) {
  const Case c{70, 203, false, Align::bottom_right, Window{90, 3}, true, true, 20.0};
  const Inputs x(c);
  expect_float32_within_budget(c, x, oracle(c, x).first);
  testing::expect_same_at_1_and_2_threads<float>([&] {
    auto [o, l] = attn_forward<float>(c, x);
    return std::vector<Tensor<float>>{o, l};
  });
}

// 16-bit queries, keys and values with sinks: the float32 result before rounding (bfloat16 and
// float16), and the decode path (one query), within the 16-bit inputs' error of the oracle.
TEST(AlignSinksHalf, SixteenBitForwardAndDecode) {
  for (const index_t n : {1, 37}) {
    const Case c{n, 150, true, Align::bottom_right, std::nullopt, false, true};
    Inputs x(c);
    // The oracle over the 16-bit values, so only accumulation and the final rounding differ.
    x.q = convert<double>(testing::rounded<bfloat16>(convert<float>(x.q)));
    x.k = convert<double>(testing::rounded<bfloat16>(convert<float>(x.k)));
    x.v = convert<double>(testing::rounded<bfloat16>(convert<float>(x.v)));
    const auto [want, want_lse] = oracle(c, x);
    const Tensor<bfloat16> q = testing::to_half<bfloat16>(convert<float>(x.q)), k = testing::to_half<bfloat16>(convert<float>(x.k)),
                           v = testing::to_half<bfloat16>(convert<float>(x.v));
    const Tensor<float> sinks = convert<float>(x.sinks);
    Mask<float> mask;
    mask.causal = Causal::bottom_right, mask.sinks = sinks.cview();
    Tensor<float> out({kB, kH, n, kV}), lse({kB, kH, n});
    sdpa_forward<bfloat16>(out.view(), lse.view(), q.cview(), k.cview(), v.cview(), mask);
    EXPECT_LE(testing::max_abs_diff(out, want), 2e-2) << "n = " << n;  // P rounded to bfloat16 for P V
    EXPECT_LE(testing::max_abs_diff(lse, want_lse), 1e-5) << "n = " << n;
    Tensor<bfloat16> out16({kB, kH, n, kV});
    sdpa_forward<bfloat16>(out16.view(), {}, q.cview(), k.cview(), v.cview(), mask);
    EXPECT_LE(testing::max_abs_diff(testing::to_single(out16), want), 3e-2) << "n = " << n;
  }
}

// sdpa_apply_sinks and sdpa_sinks_backward on attention computed without sinks give what
// sdpa_forward and sdpa_backward give with them.
TEST(AlignSinksParts, ApplyAndBackwardOnMergedRows) {
  const Case c{6, 11, true, Align::bottom_right, std::nullopt, false, true};
  const Inputs x(c);
  Case plain = c;
  plain.sinks = false;
  auto [out, lse] = attn_forward<double>(plain, x);
  sdpa_apply_sinks<double>(out.view(), lse.view(), x.sinks.cview());
  const auto [want, want_lse] = attn_forward<double>(c, x);
  EXPECT_LE(testing::max_abs_diff(out, want), 1e-15);
  EXPECT_LE(testing::max_abs_diff(lse, want_lse), 1e-14);
  Tensor<double> ds({kH}), want_ds({kH});
  sdpa_sinks_backward<double>(ds.view(), x.g.cview(), out.cview(), lse.cview(), x.sinks.cview());
  sdpa_backward<double>({}, {}, {}, x.g.cview(), x.q.cview(), x.k.cview(), x.v.cview(), want.cview(), want_lse.cview(),
                        mask_of(c, x.slopes, x.sinks), {}, want_ds.view());
  EXPECT_LE(testing::max_abs_diff(ds, want_ds), 1e-14);
}

// The decode call a new user writes: 100 cached tokens, one query, no causal mask, a window of the
// last 5 keys. The query is the newest token (position 99), so keys 95..99 are attended.
TEST(AlignKvCache, DecodeWindowWithoutCausalAttendsTheLastKeys) {
  const index_t L = 100, d = 64;
  for (const KvDtype dtype : {KvDtype::float32, KvDtype::bfloat16}) {
    KvCache cache(1, 1, d, {.dtype = dtype, .block_size = 16});
    const Tensor<float> k = random_tensor<float>({1, L, d}, 21), v = random_tensor<float>({1, L, d}, 22);
    cache.append(0, k.cview(), v.cview());
    const Tensor<float> q = random_tensor<float>({1, 1, d}, 23);
    // As stored: float32 as given, bfloat16 rounded to nearest even (kv_cache.hpp).
    const Tensor<float> keys = dtype == KvDtype::bfloat16 ? testing::rounded<bfloat16>(k) : k;
    const Tensor<float> values = dtype == KvDtype::bfloat16 ? testing::rounded<bfloat16>(v) : v;
    for (const Causal causal : {Causal::none, Causal::bottom_right}) {
      KvAttendOptions options;
      options.causal = causal, options.window = Window{4, 0};
      Tensor<float> out({1, 1, d});
      cache.attend(out.view(), 0, q.cview(), options);
      // The oracle: softmax over keys 95..99.
      std::vector<double> w;
      double top = -1e300, sum = 0;
      for (index_t j = L - 5; j < L; ++j) {
        double s = 0;
        for (index_t e = 0; e < d; ++e) s += static_cast<double>(q(0, 0, e)) * keys(0, j, e);
        w.push_back(s / 8), top = std::max(top, s / 8);
      }
      for (double& s : w) sum += (s = std::exp(s - top));
      for (index_t e = 0; e < d; ++e) {
        double want = 0;
        for (index_t t = 0; t < 5; ++t) want += w[t] / sum * values(0, L - 5 + t, e);
        EXPECT_NEAR(out(0, 0, e), want, 1e-5) << "feature " << e;
      }
    }
    // Every sequence at once (the batched attend) places each sequence's query at its own end.
    KvAttendOptions options;
    options.causal = Causal::none, options.window = Window{4, 0};
    Tensor<float> one({1, 1, d}), all({1, 1, 1, d});
    cache.attend(one.view(), 0, q.cview(), options);
    cache.attend(all.view(), TensorView<const float>(q.data(), {1, 1, 1, d}), options);
    for (index_t e = 0; e < d; ++e) EXPECT_EQ(one(0, 0, e), all(0, 0, 0, e));
  }
}

// Sinks through the KV cache: the decode path and the prompt path against the oracle over the
// cache's keys as stored.
TEST(AlignKvCache, SinksInDecodeAndPrompt) {
  const index_t L = 40, d = 32, H = 2;
  KvCache cache(1, 1, d, {.block_size = 8});
  const Tensor<float> k = random_tensor<float>({1, L, d}, 31), v = random_tensor<float>({1, L, d}, 32);
  cache.append(0, k.cview(), v.cview());
  const Tensor<float> sinks = random_tensor<float>({H}, 33, 0.0, 3.0);
  for (const index_t n : {1, 9}) {
    const Tensor<float> q = random_tensor<float>({H, n, d}, 34 + n);
    KvAttendOptions options;
    options.sinks = sinks.cview();
    Tensor<float> out({H, n, d});
    cache.attend(out.view(), 0, q.cview(), options);
    for (index_t h = 0; h < H; ++h)
      for (index_t i = 0; i < n; ++i) {
        const index_t p = L - n + i;
        std::vector<double> s;
        for (index_t j = 0; j <= p; ++j) {
          double dotp = 0;
          for (index_t e = 0; e < d; ++e) dotp += static_cast<double>(q(h, i, e)) * k(0, j, e);
          s.push_back(dotp / std::sqrt(static_cast<double>(d)));
        }
        double top = sinks(h), sum = 0;
        for (const double x : s) top = std::max(top, x);
        for (const double x : s) sum += std::exp(x - top);
        sum += std::exp(sinks(h) - top);
        for (index_t e = 0; e < d; e += 7) {
          double want = 0;
          for (index_t j = 0; j <= p; ++j) want += std::exp(s[j] - top) / sum * v(0, j, e);
          EXPECT_NEAR(out(h, i, e), want, 1e-5) << "n " << n << " head " << h << " query " << i;
        }
      }
  }
}

TEST(AlignSinksErrors, NamedArguments) {
  const Tensor<float> q = random_tensor<float>({1, 2, 3, 4}, 1), k = random_tensor<float>({1, 2, 5, 4}, 2);
  Tensor<float> out({1, 2, 3, 4});
  auto run = [&](const Mask<float>& mask) { sdpa_forward<float>(out.view(), {}, {}, q.cview(), k.cview(), k.cview(), mask); };
  Mask<float> contradiction;
  contradiction.causal = Causal::top_left, contradiction.align = Align::bottom_right;
  expect_error([&] { run(contradiction); }, {"sdpa_forward", "causal is top_left", "align is bottom_right"});
  const Tensor<float> three({3}), bad({2}, {0.5f, std::numeric_limits<float>::infinity()}), two({2});
  Mask<float> wrong_shape;
  wrong_shape.sinks = three.cview();
  expect_error([&] { run(wrong_shape); }, {"sinks has shape (3,)", "(H,) = (2,)"});
  Mask<float> not_finite;
  not_finite.sinks = bad.cview();
  expect_error([&] { run(not_finite); }, {"sinks holds inf for head 1", "finite"});
  // dsinks without sinks, and of the wrong shape.
  Tensor<float> ds({2}), ds3({3});
  expect_error([&] { sdpa_backward<float>({}, {}, {}, out.cview(), q.cview(), k.cview(), k.cview(), {}, {}, {}, {}, ds.view()); },
               {"sdpa_backward", "dsinks is given but the mask has no sinks"});
  Mask<float> with_sinks;
  with_sinks.sinks = two.cview();
  expect_error([&] { sdpa_backward<float>({}, {}, {}, out.cview(), q.cview(), k.cview(), k.cview(), {}, {}, with_sinks, {}, ds3.view()); },
               {"sdpa_backward", "dsinks"});
  // Operations without sinks refuse them rather than drop them.
  Tensor<float> weights({1, 2, 3, 5});
  expect_error([&] { masked_softmax_forward<float>(weights.view(), weights.cview(), with_sinks); }, {"sinks", "not by this operation"});
  // A block of a longer attention: sinks belong to the whole.
  Tensor<float> lse({1, 2, 3});
  expect_error([&] {
    sdpa_backward_block<float>({}, {}, {}, out.cview(), q.cview(), k.cview(), k.cview(), out.cview(), lse.cview(), with_sinks);
  }, {"sdpa_backward_block", "sinks belong to the whole attention"});
  // The KV cache's queries are its newest tokens: a top-left causal mask is refused.
  KvCache cache(1, 1, 4);
  const Tensor<float> kk = random_tensor<float>({1, 3, 4}, 5);
  cache.append(0, kk.cview(), kk.cview());
  KvAttendOptions top_left;
  top_left.causal = Causal::top_left;
  Tensor<float> o({1, 1, 4});
  const Tensor<float> qq = random_tensor<float>({1, 1, 4}, 6);
  expect_error([&] { cache.attend(o.view(), 0, qq.cview(), top_left); }, {"KvCache::attend", "causal is top_left"});
}

}  // namespace
}  // namespace attn
