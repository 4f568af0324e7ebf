// The int8 forward (attn/sdpa.hpp, sdpa_forward_int8): its out and lse against the float64
// attention of its own quantized queries and keys, rebuilt here from the formulas the header and
// cpu/quant/int8_rows.hpp state (the keys' mean, the channel balance, one scale a row, rounding to
// nearest even), within twice the error of a float32 computation on the same values (FlashAttention's
// rule); with P V in bfloat16 (the AVX512-BF16 products, where the CPU has them) within 2^-7 max |v|
// of P V in float. Every mask and variant, dropout, grouped heads, 3-D tensors and odd sizes, on
// every SIMD target (vpdpbusd on avx3 where the CPU has AVX512-VNNI, the portable 16-bit products
// on the others). Then the approximation itself: on keys with outlier channels, as trained models
// have, out keeps a cosine similarity of at least 0.999 with float64 attention on the true inputs.
// Bad input named; results identical at 1 and 2 threads.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "attn/config.hpp"
#include "attn/sdpa.hpp"
#include "support/testing.hpp"

namespace attn {
namespace {

using testing::convert;
using testing::random_tensor;

struct Case {
  const char* name;
  index_t B, H, Hk, n, m, d, dv;
  bool three_d = false;
  Causal causal = Causal::none;
  bool lens = false, keep = false, additive = false, alibi = false, segments = false, sinks = false;
  std::optional<Window> window{};
  double softcap = 0, dropout = 0;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// A row quantized as int8_rows.hpp states: y = (x - center) factor in double, s = max |y| / 127 in
// float32, q = round(y / s) to nearest even; returns the dequantized q s (0 for s = 0).
std::vector<double> dequantized_row(const float* x, const float* center, const std::vector<double>& factor, index_t d) {
  std::vector<double> y(static_cast<std::size_t>(d));
  double top = 0;
  for (index_t c = 0; c < d; ++c) {
    y[c] = (static_cast<double>(x[c]) - (center != nullptr ? static_cast<double>(center[c]) : 0.0)) * factor[c];
    top = std::max(top, std::abs(y[c]));
  }
  const auto s = static_cast<float>(top / 127);
  for (double& v : y) v = s > 0 ? std::clamp(std::nearbyint(v / s), -127.0, 127.0) * static_cast<double>(s) : 0.0;
  return y;
}

// The keys the int8 forward reads in batch element b, [first, end): from the first some query may
// attend to the last under the valid lengths (B,), the causal rule and the window (the span of the
// rows' ranges; the masks element by element do not narrow it).
std::pair<index_t, index_t> keys_in_reach(const Mask<float>& mask, index_t n, index_t m, index_t b) {
  const index_t offset = mask.alignment() == Align::bottom_right ? m - n : 0;
  index_t lo = m, hi = 0;
  for (index_t i = 0; i < n; ++i) {
    const index_t p = i + offset;
    index_t first = 0, end = mask.valid_lens.empty() ? m : mask.valid_lens.data()[b];
    if (mask.causal != Causal::none) end = std::min(end, p + 1);
    if (mask.window && mask.window->left >= 0) first = std::max<index_t>(0, p - mask.window->left);
    if (mask.window && mask.window->right >= 0) end = std::min(end, p + mask.window->right + 1);
    end = std::clamp<index_t>(end, 0, m);
    if (first < end) lo = std::min(lo, first), hi = std::max(hi, end);
  }
  return lo < hi ? std::pair{lo, hi} : std::pair<index_t, index_t>{0, 0};
}

// The int8 forward's scores as a float64 attention of d + 1 columns: queries [q̂, q . mean] and keys
// [k̂, 1], q̂ and k̂ the dequantized rows (so q̂ . k̂ + q . mean is each score before the scale). The
// mean, the balance and the quantized rows are those of the keys in reach (the others zeros).
struct Augmented {
  Tensor<double> q, k;  // (B, H, n, d + 1), (B, Hk, m, d + 1)
};
Augmented augmented(const Tensor<float>& q, const Tensor<float>& k, const Mask<float>& mask, index_t B, index_t H,
                    index_t Hk, index_t n, index_t m, index_t d) {
  Augmented a{Tensor<double>({B, H, n, d + 1}), Tensor<double>({B, Hk, m, d + 1})};
  const index_t group = H / Hk;
  for (index_t b = 0; b < B; ++b)
    for (index_t hk = 0; hk < Hk; ++hk) {
      const auto [first, end] = keys_in_reach(mask, n, m, b);
      std::vector<float> mean(static_cast<std::size_t>(d));
      std::vector<double> key_top(static_cast<std::size_t>(d)), query_top(static_cast<std::size_t>(d));
      std::vector<double> lambda(static_cast<std::size_t>(d)), inverse(static_cast<std::size_t>(d));
      for (index_t c = 0; c < d; ++c) {
        double sum = 0;
        for (index_t j = first; j < end; ++j) sum += k(b, hk, j, c);
        mean[c] = end > first ? static_cast<float>(sum / static_cast<double>(end - first)) : 0.0f;
        for (index_t j = first; j < end; ++j)
          key_top[c] = std::max(key_top[c], std::abs(static_cast<double>(k(b, hk, j, c)) - mean[c]));
        for (index_t h = hk * group; h < (hk + 1) * group; ++h)
          for (index_t i = 0; i < n; ++i) query_top[c] = std::max(query_top[c], std::abs(static_cast<double>(q(b, h, i, c))));
        lambda[c] = key_top[c] > 0 && query_top[c] > 0 ? std::sqrt(key_top[c] / query_top[c]) : 1.0;
        inverse[c] = 1 / lambda[c];
      }
      for (index_t j = 0; j < m; ++j) {
        const bool reached = j >= first && j < end;
        const std::vector<double> row = dequantized_row(k.data() + ((b * Hk + hk) * m + j) * d, mean.data(), inverse, d);
        for (index_t c = 0; c < d; ++c) a.k(b, hk, j, c) = reached ? row[c] : 0.0;
        a.k(b, hk, j, d) = 1;
      }
      for (index_t h = hk * group; h < (hk + 1) * group; ++h)
        for (index_t i = 0; i < n; ++i) {
          const std::vector<double> row = dequantized_row(q.data() + ((b * H + h) * n + i) * d, nullptr, lambda, d);
          double dot = 0;
          for (index_t c = 0; c < d; ++c) a.q(b, h, i, c) = row[c], dot += static_cast<double>(q(b, h, i, c)) * mean[c];
          a.q(b, h, i, d) = static_cast<float>(dot);  // the kernel holds q . mean in float32
        }
    }
  return a;
}

// A 4-D (B, H, rows, cols) tensor as the (B, rows, cols) one of a 3-D call (H = 1).
template <class T>
TensorView<T> as_3d(Tensor<T>& t) {
  return TensorView<T>(t.data(), {t.shape()[0], t.shape()[2], t.shape()[3]});
}
template <class T>
TensorView<const T> as_3d(const Tensor<T>& t) {
  return TensorView<const T>(t.data(), {t.shape()[0], t.shape()[2], t.shape()[3]});
}

class Int8Forward : public ::testing::TestWithParam<Case> {};

TEST_P(Int8Forward, MatchesTheFloat64AttentionOfItsQuantizedInputs) {
  const Case& c = GetParam();
  const Tensor<float> q = random_tensor<float>({c.B, c.H, c.n, c.d}, 1, -2, 2);
  Tensor<float> k = random_tensor<float>({c.B, c.Hk, c.m, c.d}, 2, -2, 2);
  for (index_t e = 0; e < k.numel(); ++e)
    if (e % c.d == 0) k[e] = 8 + 3 * k[e];  // (no element when d = 0)  // a channel offset and wider: the mean and balance matter
  const Tensor<float> v = random_tensor<float>({c.B, c.Hk, c.m, c.dv}, 3, -1, 1);
  Tensor<std::int64_t> lens({c.B});
  for (index_t b = 0; b < c.B; ++b) lens[b] = (b * 41 + c.m * 2 / 3) % (c.m + 1);
  Tensor<bool> keep({c.n, c.m});
  for (index_t e = 0; e < keep.numel(); ++e) keep[e] = (e / 64 + e % 7) % 4 != 0;
  const Tensor<float> bias = random_tensor<float>({c.n, c.m}, 4, -2, 0), slopes = random_tensor<float>({c.H}, 5, 0.05, 0.4);
  const Tensor<float> sinks = random_tensor<float>({c.H}, 6, -1, 2);
  Tensor<std::int32_t> ids({c.B, c.n});
  for (index_t e = 0; e < ids.numel(); ++e) ids[e] = static_cast<std::int32_t>(e % c.n / 50);
  auto mask_of = [&]<class T>(const Tensor<T>& b, const Tensor<T>& s, const Tensor<T>& sk) {
    Mask<T> mask;
    mask.causal = c.causal, mask.window = c.window;
    if (c.lens) mask.valid_lens = lens.view();
    if (c.keep) mask.keep = keep.view();
    if (c.additive) mask.additive = b.view();
    if (c.alibi) mask.alibi_slopes = s.view();
    if (c.segments) mask.segment_ids_q = ids.view();
    if (c.sinks) mask.sinks = sk.view();
    return mask;
  };
  SdpaOptions options;
  options.scale = c.d > 0 ? 1 / std::sqrt(static_cast<double>(c.d)) : 0.5;  // the augmented call's d is one more
  if (c.softcap > 0) options.softcap = c.softcap;
  options.dropout = {c.dropout, 7};
  const Mask<float> mask = mask_of(bias, slopes, sinks);

  auto int8_call = [&](Bf16Kernel values) {
    set_bf16_kernel(values);
    Tensor<float> out({c.B, c.H, c.n, c.dv}), lse({c.B, c.H, c.n});
    if (c.three_d) {
      sdpa_forward_int8(as_3d(out), TensorView<float>(lse.data(), {c.B, c.n}), as_3d(q), as_3d(k), as_3d(v), mask, options);
    } else {
      sdpa_forward_int8(out.view(), lse.view(), q.view(), k.view(), v.view(), mask, options);
    }
    set_bf16_kernel(Bf16Kernel::automatic);
    return std::vector<Tensor<float>>{out, lse};
  };
  const std::vector<Tensor<float>> kernel = int8_call(Bf16Kernel::off);

  const Augmented a = augmented(q, k, mask, c.B, c.H, c.Hk, c.n, c.m, c.d);
  Tensor<double> oracle_out({c.B, c.H, c.n, c.dv}), oracle_lse({c.B, c.H, c.n});
  Tensor<float> ref_out({c.B, c.H, c.n, c.dv}), ref_lse({c.B, c.H, c.n});
  {
    ScopedBackend reference(Backend::reference);
    const Tensor<double> bias64 = convert<double>(bias), slopes64 = convert<double>(slopes), sinks64 = convert<double>(sinks);
    sdpa_forward<double>(oracle_out.view(), oracle_lse.view(), {}, a.q.view(), a.k.view(), convert<double>(v).view(),
                         mask_of(bias64, slopes64, sinks64), options);
    sdpa_forward<float>(ref_out.view(), ref_lse.view(), {}, convert<float>(a.q).view(), convert<float>(a.k).view(), v.view(),
                        mask, options);
  }
  EXPECT_TRUE(testing::within_error_budget(kernel[0], ref_out, oracle_out)) << "out (" << simd_target() << ")";
  EXPECT_TRUE(testing::within_error_budget(kernel[1], ref_lse, oracle_lse)) << "lse (" << simd_target() << ")";

  // P V by the bfloat16 products, on each unit here. The call above (off) formed Q K^T's integer sums on
  // AMX-INT8 tiles where the CPU has them, `on` by vpdpbusd: the same integers, so the same lse.
  if (bf16_kernel_available() && simd_target() == "avx3") {
    std::vector<Bf16Kernel> units{Bf16Kernel::on};
    if (bf16_tiles_available()) units.push_back(Bf16Kernel::tiles);
    for (const Bf16Kernel unit : units) {
      const std::vector<Tensor<float>> low = int8_call(unit);
      double bound = 0;
      for (index_t e = 0; e < v.numel(); ++e) bound = std::max(bound, std::ldexp(std::abs(static_cast<double>(v[e])), -7));
      const char* name = unit == Bf16Kernel::on ? "vectors" : "tiles";
      EXPECT_LE(testing::max_abs_diff(low[0], kernel[0]), bound) << "P V in bfloat16 (" << name << ") against P V in float";
      EXPECT_EQ(low[1].values(), kernel[1].values()) << "lse depends on neither P V nor the unit of Q K^T (" << name << ")";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, Int8Forward,
    ::testing::Values(Case{"plain", 2, 2, 2, 130, 150, 64, 64}, Case{"odd_sizes", 1, 3, 3, 67, 93, 17, 9},
                      // register blocks of 6 (vpdpbusd) and 4 (portable) keys with every remainder, a
                      // head of 1, 2, 3 and 5 elements (rows padded to 4 bytes), queries of one block and less
                      Case{"remainders", 1, 2, 1, 70, 129, 13, 7}, Case{"head_dim_1", 1, 2, 1, 70, 75, 1, 5},
                      Case{"head_dim_2", 1, 1, 1, 9, 71, 2, 3}, Case{"head_dim_3_decode", 1, 1, 1, 1, 136, 3, 1},
                      Case{"head_dim_5", 1, 1, 1, 64, 65, 5, 6}, Case{"three_d", 2, 1, 1, 40, 70, 24, 8, true},
                      Case{"causal_lengths_keep_additive", 2, 2, 2, 100, 140, 32, 16, false, Causal::bottom_right, true,
                           true, true},
                      Case{"gqa_window_alibi_softcap_segments_sinks", 1, 4, 2, 150, 150, 48, 24, false, Causal::top_left,
                           false, false, false, true, true, true, Window{40, 3}, 4.0},
                      Case{"dropout", 1, 2, 1, 90, 110, 32, 32, false, Causal::none, false, false, false, false, false,
                           false, std::nullopt, 0, 0.25},
                      Case{"no_keys_and_no_elements", 1, 2, 2, 20, 0, 0, 4}),
    [](const auto& info) { return std::string(info.param.name); });

// The approximation on inputs like a trained model's: queries and keys of unit spread, four of 128
// key channels with a common offset and a spread 10 to 50 times the rest (the outliers SageAttention
// smooths by the keys' mean). out against float64 attention on the true inputs: cosine similarity at
// least 0.999 in every case; the worst relative error |out - exact| / max |exact| is printed.
TEST(Int8ForwardAccuracy, OutlierKeyChannelsKeepCosineSimilarityAbove0999) {
  const index_t B = 1, H = 2, n = 192, m = 320, d = 128, dv = 64;
  std::mt19937_64 gen(17);
  std::normal_distribution<float> normal;
  for (const float spread : {1.0f, 10.0f, 30.0f, 50.0f}) {
    Tensor<float> q({B, H, n, d}), k({B, H, m, d}), v({B, H, m, dv});
    for (index_t e = 0; e < q.numel(); ++e) q[e] = normal(gen);
    for (index_t e = 0; e < k.numel(); ++e) {
      const bool outlier = e % d == 3 || e % d == 40 || e % d == 77 || e % d == 101;
      k[e] = outlier ? spread * (2 + normal(gen)) : normal(gen);
    }
    for (index_t e = 0; e < v.numel(); ++e) v[e] = normal(gen);
    for (const Causal causal : {Causal::none, Causal::bottom_right}) {
      Mask<float> mask;
      mask.causal = causal;
      Tensor<float> out({B, H, n, dv});
      sdpa_forward_int8(out.view(), {}, q.view(), k.view(), v.view(), mask);
      Tensor<double> exact({B, H, n, dv});
      {
        ScopedBackend reference(Backend::reference);
        Mask<double> mask64;
        mask64.causal = causal;
        sdpa_forward<double>(exact.view(), {}, {}, convert<double>(q).view(), convert<double>(k).view(),
                             convert<double>(v).view(), mask64);
      }
      double dot = 0, a2 = 0, b2 = 0, worst = 0, top = 0;
      for (index_t e = 0; e < out.numel(); ++e) {
        dot += out[e] * exact[e], a2 += static_cast<double>(out[e]) * out[e], b2 += exact[e] * exact[e];
        worst = std::max(worst, std::abs(out[e] - exact[e])), top = std::max(top, std::abs(exact[e]));
      }
      const double cosine = dot / std::sqrt(a2 * b2);
      std::cout << "outlier spread " << spread << (causal == Causal::none ? "" : ", causal") << ": cosine " << cosine
                << ", worst |out - exact| / max |exact| " << worst / top << " (" << simd_target() << ")\n";
      EXPECT_GE(cosine, 0.999) << "spread " << spread;
    }
  }
}

TEST(Int8ForwardThreads, SameResultsAtOneAndTwoThreads) {
  const Tensor<float> q = random_tensor<float>({2, 4, 150, 40}, 31), k = random_tensor<float>({2, 2, 170, 40}, 32);
  const Tensor<float> v = random_tensor<float>({2, 2, 170, 24}, 33);
  testing::expect_same_at_1_and_2_threads<float>([&] {
    Tensor<float> out({2, 4, 150, 24}), lse({2, 4, 150});
    Mask<float> mask;
    mask.causal = Causal::bottom_right;
    sdpa_forward_int8(out.view(), lse.view(), q.view(), k.view(), v.view(), mask);
    return std::vector<Tensor<float>>{out, lse};
  });
}

// Keys no query may attend (past valid_lens, past every query's causal reach, outside every
// window, a key-padding mask's) are not read, as in float32: whatever they hold, huge or not finite,
// out and lse are the same bits as with zeros there (found by probing: 1e4 in the padding past
// valid_lens took out 1.5 from the answer, and NaN there was refused).
TEST(Int8ForwardMaskedKeys, KeysNoQueryAttendsAreNotRead) {
  const index_t B = 2, H = 2, n = 40, m = 150, d = 64, dv = 24;
  const Tensor<float> q = random_tensor<float>({B, H, n, d}, 51), v = random_tensor<float>({B, H, m, dv}, 52);
  const Tensor<float> k = random_tensor<float>({B, H, m, d}, 53);
  const Tensor<std::int64_t> lens({B}, std::vector<std::int64_t>{70, 133});
  Tensor<std::int64_t> row_lens({B, n});
  for (index_t b = 0; b < B; ++b)
    for (index_t i = 0; i < n; ++i) row_lens(b, i) = 20 + (7 * i + 11 * b) % 60;  // at most 79
  Tensor<bool> padding({B, 1, 1, m});
  for (index_t b = 0; b < B; ++b)
    for (index_t j = 0; j < m; ++j) padding(b, 0, 0, j) = j < 90 - 30 * b;
  std::vector<std::pair<const char*, Mask<float>>> masks(5);
  masks[0] = {"valid_lens (B,)", {}}, masks[0].second.valid_lens = lens.view();
  masks[1] = {"valid_lens (B, n)", {}}, masks[1].second.valid_lens = row_lens.view();
  masks[2] = {"causal top-left", {}}, masks[2].second.causal = Causal::top_left;  // keys from n on: no query's
  masks[3] = {"window (5, 10)", {}}, masks[3].second.window = Window{5, 10};   // keys from n + 10 on
  masks[4] = {"key padding", {}}, masks[4].second.keep = padding.view();
  // Keys from `from` on are reached by no query in either batch element: valid_lens (B,) stops at
  // 133, (B, n) at 79, causal top-left at n = 40, the window at n + 10 = 50, the padding at 90.
  for (const auto& [name, mask] : masks) {
    SCOPED_TRACE(name);
    Tensor<float> out0({B, H, n, dv}), lse0({B, H, n});
    const index_t from = std::string_view(name) == "valid_lens (B,)" ? 133 : 90;
    Tensor<float> zeros = k;
    for (index_t b = 0; b < B; ++b)
      for (index_t h = 0; h < H; ++h)
        for (index_t j = from; j < m; ++j)
          for (index_t c = 0; c < d; ++c) zeros(b, h, j, c) = 0;
    sdpa_forward_int8(out0.view(), lse0.view(), q.view(), zeros.view(), v.view(), mask);
    for (const float fill : {1e4f, -3e38f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      Tensor<float> filled = zeros, out({B, H, n, dv}), lse({B, H, n});
      for (index_t b = 0; b < B; ++b)
        for (index_t h = 0; h < H; ++h)
          for (index_t j = from; j < m; ++j)
            for (index_t c = 0; c < d; ++c) filled(b, h, j, c) = fill * static_cast<float>(1 + (c % 3));
      sdpa_forward_int8(out.view(), lse.view(), q.view(), filled.view(), v.view(), mask);
      EXPECT_EQ(out.values(), out0.values()) << fill;
      EXPECT_EQ(lse.values(), lse0.values()) << fill;
    }
  }
}

TEST(Int8ForwardErrors, BadInputIsNamed) {
  using testing::expect_error;
  Tensor<float> q = random_tensor<float>({1, 2, 9, 8}, 41), k = random_tensor<float>({1, 2, 11, 8}, 42);
  const Tensor<float> v = random_tensor<float>({1, 2, 11, 4}, 43);
  Tensor<float> out({1, 2, 9, 4});
  // Values int8 cannot hold: the first row by position is named.
  q(0, 1, 5, 3) = std::numeric_limits<float>::quiet_NaN();
  q(0, 1, 7, 0) = std::numeric_limits<float>::infinity();
  expect_error([&] { sdpa_forward_int8(out.view(), {}, q.view(), k.view(), v.view()); },
               {"sdpa_forward_int8", "queries holds a value that is not finite in row 5 of batch 0, head 1"});
  q(0, 1, 5, 3) = 0, q(0, 1, 7, 0) = 0;
  k(0, 0, 10, 7) = -std::numeric_limits<float>::infinity();
  expect_error([&] { sdpa_forward_int8(out.view(), {}, q.view(), k.view(), v.view()); },
               {"keys holds a value that is not finite in row 10 of batch 0, head 0"});
  k(0, 0, 10, 7) = 1;
  // Differences beyond float's range are fine: they are taken in double.
  k(0, 0, 2, 1) = 3e38f, k(0, 0, 3, 1) = -3e38f;
  sdpa_forward_int8(out.view(), {}, q.view(), k.view(), v.view());
  for (index_t e = 0; e < out.numel(); ++e) ASSERT_TRUE(std::isfinite(out[e])) << e;
  // Shapes are checked as sdpa_forward's, under this call's name.
  Tensor<float> wrong({1, 2, 9, 5});
  expect_error([&] { sdpa_forward_int8(wrong.view(), {}, q.view(), k.view(), v.view()); }, {"sdpa_forward_int8", "out"});
  const Tensor<float> short_keys = random_tensor<float>({1, 2, 11, 7}, 44);
  expect_error([&] { sdpa_forward_int8(out.view(), {}, q.view(), short_keys.view(), v.view()); },
               {"sdpa_forward_int8", "keys has shape (1,2,11,7)"});
  // Heads too deep for an int32 sum, and more keys than the kernel indexes (tensors of no element).
  const Tensor<float> deep_q({1, 1, 1, 65537}), deep_k({1, 1, 1, 65537}), deep_v({1, 1, 1, 1});
  Tensor<float> deep_out({1, 1, 1, 1});
  expect_error([&] { sdpa_forward_int8(deep_out.view(), {}, deep_q.view(), deep_k.view(), deep_v.view()); },
               {"d = 65537", "d <= 65536"});
  const index_t many = (index_t(1) << 24) + 1;
  const Tensor<float> none_q({1, 1, 2, 0}), none_k({1, 1, many, 0}), none_v({1, 1, many, 0});
  Tensor<float> none_out({1, 1, 2, 0});
  SdpaOptions options;
  options.scale = 1;
  expect_error([&] { sdpa_forward_int8(none_out.view(), {}, none_q.view(), none_k.view(), none_v.view(), {}, options); },
               {"16777217 rows", "at most 16777216"});
}

}  // namespace
}  // namespace attn
