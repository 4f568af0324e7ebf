// Scaled dot-product attention as models use it today: grouped-query and multi-query attention,
// sliding windows (both alignments), ALiBi, soft-capping and packed sequences (segment ids), alone and
// combined with valid lengths, causal masks and dropout.
//
// The oracle is the float64 reference backend fed the same attention written the plain way: keys and
// values repeated for every query head (PyTorch's repeat_interleave), one dense boolean mask of the
// allowed (query, key) pairs and one dense additive bias, both built here straight from the
// definitions in attn/mask.hpp; its key and value gradients summed over each group. The cpu backend,
// given the structured options, must match it within the error budget of STYLE.md (float32) and to
// 1e-12 (float64); the reference backend given the structured options must match it too. Backward
// passes are checked against finite differences in float64; skipped tiles are counted.
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "attn/sdpa.hpp"
#include "cpu/simd/dispatch.hpp"
#include "cpu/simd/fused.hpp"
#include "support/testing.hpp"

namespace attn {
namespace {

using testing::convert;
using testing::expect_error;
using testing::random_tensor;

struct Variant {
  const char* name;
  index_t B, H, Hk, n, m, d, v;
  Causal causal = Causal::none;
  std::optional<Window> window = std::nullopt;
  bool alibi = false;
  double softcap = 0;
  bool segments = false;
  bool lens = false;
  double dropout = 0;
};

void PrintTo(const Variant& c, std::ostream* os) { *os << c.name; }

// Everything one variant is computed from, in float64; converted per precision by `run`.
struct Inputs {
  Tensor<double> q, k, v, g, slopes;
  Tensor<std::int64_t> seg_q, seg_k, lens;
  explicit Inputs(const Variant& c, double spread = 1)
      : q(random_tensor<double>({c.B, c.H, c.n, c.d}, 1, -spread, spread)),
        k(random_tensor<double>({c.B, c.Hk, c.m, c.d}, 2, -spread, spread)),
        v(random_tensor<double>({c.B, c.Hk, c.m, c.v}, 3)), g(random_tensor<double>({c.B, c.H, c.n, c.v}, 4)),
        slopes({c.B, c.H}), seg_q({c.B, c.n}), seg_k({c.B, c.m}), lens({c.B}) {
    // ALiBi slopes 2^(-8 (h + 1) / H) (Press et al.), different per batch element.
    for (index_t b = 0; b < c.B; ++b)
      for (index_t h = 0; h < c.H; ++h)
        slopes(b, h) = std::pow(2.0, -8.0 * static_cast<double>(h + 1) / static_cast<double>(c.H)) * (1 + 0.25 * b);
    // Documents of uneven lengths, in order (packed sequences), the queries' ids those of the keys
    // they line up with at the end (bottom-right, a packed decoder continuing each document).
    for (index_t b = 0; b < c.B; ++b) {
      for (index_t j = 0; j < c.m; ++j) seg_k(b, j) = (j * 7 + b) / (c.m + 2) + (j * j) / (3 * c.m + 1);
      for (index_t i = 0; i < c.n; ++i) seg_q(b, i) = seg_k(b, std::min(c.m - 1, i + std::max<index_t>(0, c.m - c.n)));
      lens[b] = b == 0 ? c.m : (c.m * 2) / 3 + 1;
    }
  }
};

// The structured call (GQA heads, window, ALiBi slopes, segment ids, softcap) in precision T, or
// (dense = true) the plain one the oracle takes: repeated keys and values, a dense keep-mask and
// bias. Returns out, lse, dq, dk, dv (dk, dv with the keys' Hk heads either way).
template <class T>
std::vector<Tensor<T>> run(const Variant& c, const Inputs& in, bool dense) {
  const Tensor<T> q = convert<T>(in.q), g = convert<T>(in.g);
  Tensor<T> k = convert<T>(in.k), v = convert<T>(in.v);
  const Tensor<T> slopes = convert<T>(in.slopes);
  const index_t G = c.H / c.Hk;
  Mask<T> mask;
  SdpaOptions options;
  if (c.softcap > 0) options.softcap = c.softcap;
  options.dropout = {c.dropout, 77};
  Tensor<bool> keep;
  Tensor<T> bias;
  if (!dense) {
    mask.causal = c.causal;
    mask.window = c.window;
    if (c.alibi) mask.alibi_slopes = slopes.view();
    if (c.segments) mask.segment_ids_q = in.seg_q.view(), mask.segment_ids_k = in.seg_k.view();
    if (c.lens) mask.valid_lens = in.lens.view();
  } else {
    // Keys and values of head h / G for every query head h.
    Tensor<T> kr({c.B, c.H, c.m, c.d}), vr({c.B, c.H, c.m, c.v});
    for (index_t b = 0; b < c.B; ++b)
      for (index_t h = 0; h < c.H; ++h)
        for (index_t j = 0; j < c.m; ++j) {
          for (index_t e = 0; e < c.d; ++e) kr(b, h, j, e) = k(b, h / G, j, e);
          for (index_t e = 0; e < c.v; ++e) vr(b, h, j, e) = v(b, h / G, j, e);
        }
    k = kr, v = vr;
    // The allowed pairs and the bias, from attn/mask.hpp's definitions.
    keep = Tensor<bool>({c.B, c.H, c.n, c.m});
    bias = Tensor<T>({c.B, c.H, c.n, c.m});
    const index_t offset = c.causal == Causal::bottom_right ? c.m - c.n : 0;
    for (index_t b = 0; b < c.B; ++b)
      for (index_t h = 0; h < c.H; ++h)
        for (index_t i = 0; i < c.n; ++i)
          for (index_t j = 0; j < c.m; ++j) {
            const index_t p = i + offset;
            bool ok = true;
            if (c.causal != Causal::none) ok = ok && j <= p;
            if (c.window && c.window->left >= 0) ok = ok && j >= p - c.window->left;
            if (c.window && c.window->right >= 0) ok = ok && j <= p + c.window->right;
            if (c.segments) ok = ok && in.seg_q(b, i) == in.seg_k(b, j);
            if (c.lens) ok = ok && j < in.lens[b];
            keep(b, h, i, j) = ok;
            bias(b, h, i, j) = c.alibi ? -slopes(b, h) * static_cast<T>(std::abs(p - j)) : T(0);
          }
    mask.keep = keep.view();
    if (c.alibi) mask.additive = bias.view();
  }
  Tensor<T> out({c.B, c.H, c.n, c.v}), lse({c.B, c.H, c.n});
  sdpa_forward<T>(out.view(), lse.view(), {}, q.view(), k.view(), v.view(), mask, options);
  Tensor<T> dq(q.shape()), dk(k.shape()), dv(v.shape());
  sdpa_backward<T>(dq.view(), dk.view(), dv.view(), g.view(), q.view(), k.view(), v.view(), out.view(), lse.view(),
                   mask, options);
  if (dense) {  // the repeated heads' gradients summed into their key head
    Tensor<T> dks({c.B, c.Hk, c.m, c.d}), dvs({c.B, c.Hk, c.m, c.v});
    for (index_t b = 0; b < c.B; ++b)
      for (index_t h = 0; h < c.H; ++h)
        for (index_t j = 0; j < c.m; ++j) {
          for (index_t e = 0; e < c.d; ++e) dks(b, h / G, j, e) += dk(b, h, j, e);
          for (index_t e = 0; e < c.v; ++e) dvs(b, h / G, j, e) += dv(b, h, j, e);
        }
    dk = dks, dv = dvs;
  }
  return {out, lse, dq, dk, dv};
}

class SdpaVariants : public ::testing::TestWithParam<Variant> {};

TEST_P(SdpaVariants, MatchTheDenseFormulaInFloat64) {
  const Variant& c = GetParam();
  const Inputs in(c);
  std::vector<Tensor<double>> oracle, ref_structured;
  std::vector<Tensor<float>> ref32;
  {
    ScopedBackend reference(Backend::reference);
    oracle = run<double>(c, in, true);
    ref32 = run<float>(c, in, true);
    ref_structured = run<double>(c, in, false);
  }
  std::vector<Tensor<double>> cpu64;
  std::vector<Tensor<float>> cpu32;
  {
    ScopedBackend cpu(Backend::cpu);
    cpu64 = run<double>(c, in, false);
    cpu32 = run<float>(c, in, false);
  }
  const char* names[] = {"out", "lse", "dq", "dk", "dv"};
  for (std::size_t t = 0; t < oracle.size(); ++t) {
    SCOPED_TRACE(names[t]);
    double largest = 1;
    for (index_t e = 0; e < oracle[t].numel(); ++e)
      if (std::isfinite(oracle[t][e])) largest = std::max(largest, std::abs(oracle[t][e]));
    EXPECT_LE(testing::max_abs_diff(ref_structured[t], oracle[t]), 1e-12 * largest) << "reference, structured";
    EXPECT_LE(testing::max_abs_diff(cpu64[t], oracle[t]), 1e-12 * largest) << "cpu, float64";
    EXPECT_TRUE(testing::within_error_budget(cpu32[t], ref32[t], oracle[t])) << "cpu, float32";
  }
  testing::expect_same_at_1_and_2_threads<float>([&] { return run<float>(c, in, false); });
}

// Finite differences in float64 of every input's gradient, with all of it at once.
TEST_P(SdpaVariants, BackwardMatchesFiniteDifferences) {
  Variant c = GetParam();
  c.n = std::min<index_t>(c.n, 6), c.m = std::min<index_t>(c.m, 9), c.d = 3, c.v = 2, c.B = 1;
  if (c.window) c.window = Window{std::min<index_t>(c.window->left, 3), std::min<index_t>(c.window->right, 2)};
  Inputs in(c);
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    SCOPED_TRACE(backend == Backend::cpu ? "cpu" : "reference");
    ScopedBackend use(backend);
    const std::vector<Tensor<double>> r = run<double>(c, in, false);
    auto loss = [&] { return testing::dot(run<double>(c, in, false)[0], in.g); };
    std::string where;
    EXPECT_LT(testing::gradient_error(r[2].values(), testing::numeric_gradient(loss, in.q.values()), &where), 1e-6)
        << "dq " << where;
    EXPECT_LT(testing::gradient_error(r[3].values(), testing::numeric_gradient(loss, in.k.values()), &where), 1e-6)
        << "dk " << where;
    EXPECT_LT(testing::gradient_error(r[4].values(), testing::numeric_gradient(loss, in.v.values()), &where), 1e-6)
        << "dv " << where;
  }
}

// Odd sizes (n = 113, m = 203 or 67 for n != m, d = 59), every feature alone and combined; a few
// queries (the decode path) with each; multi-query attention (one key head).
INSTANTIATE_TEST_SUITE_P(
    Features, SdpaVariants,
    ::testing::Values(
        Variant{"gqa", 2, 6, 2, 113, 203, 59, 23},
        Variant{"mqa", 1, 4, 1, 113, 203, 59, 23},
        Variant{"gqa_decode", 2, 8, 2, 3, 1300, 17, 9},
        Variant{"window_top_left", 2, 2, 2, 113, 203, 59, 23, Causal::none, Window{17, 9}},
        Variant{"window_causal_bottom_right", 2, 2, 1, 67, 203, 59, 23, Causal::bottom_right, Window{40, 0}},
        Variant{"window_left_only", 1, 2, 2, 130, 130, 16, 8, Causal::top_left, Window{70, -1}},
        Variant{"window_right_only", 1, 2, 2, 130, 130, 16, 8, Causal::none, Window{-1, 5}},
        Variant{"window_decode", 1, 4, 2, 2, 1300, 16, 8, Causal::bottom_right, Window{300, 0}},
        Variant{"alibi", 2, 4, 4, 113, 203, 59, 23, Causal::none, std::nullopt, true},
        Variant{"alibi_decode", 2, 4, 2, 1, 700, 16, 8, Causal::bottom_right, std::nullopt, true},
        Variant{"softcap", 2, 2, 2, 113, 203, 59, 23, Causal::none, std::nullopt, false, 5.0},
        Variant{"softcap_decode", 1, 2, 2, 4, 700, 16, 8, Causal::none, std::nullopt, false, 2.0},
        Variant{"segments", 2, 2, 2, 203, 203, 59, 23, Causal::top_left, std::nullopt, false, 0, true},
        Variant{"segments_n_ne_m", 2, 2, 1, 67, 203, 31, 23, Causal::bottom_right, std::nullopt, false, 0, true},
        Variant{"everything", 2, 6, 3, 113, 203, 59, 23, Causal::bottom_right, Window{60, 3}, true, 4.0, true, true,
                0.2},
        Variant{"everything_decode", 2, 6, 2, 3, 700, 33, 9, Causal::bottom_right, Window{400, 0}, true, 3.0, true,
                true, 0.2}),
    [](const auto& info) { return std::string(info.param.name); });

// Scores so large that a softmax without subtracting the maximum overflows, with soft-capping and
// ALiBi: the same oracle.
TEST(SdpaVariantsExtreme, LargeScoresWithSoftcapAndAlibi) {
  const Variant c{"large", 1, 4, 2, 70, 90, 16, 8, Causal::top_left, Window{50, -1}, true, 30.0};
  const Inputs in(c, 6.0);
  std::vector<Tensor<double>> oracle;
  std::vector<Tensor<float>> ref32, cpu32;
  {
    ScopedBackend reference(Backend::reference);
    oracle = run<double>(c, in, true);
    ref32 = run<float>(c, in, true);
  }
  cpu32 = run<float>(c, in, false);
  for (std::size_t t = 0; t < oracle.size(); ++t) EXPECT_TRUE(testing::within_error_budget(cpu32[t], ref32[t], oracle[t])) << t;
}

// ---- skipped tiles ------------------------------------------------------------------------------
// The fused kernels' tiles (query blocks x key tiles, counted by the kernels themselves) of a forward
// call, and of its backward.
std::int64_t tiles_of(const std::function<void()>& f) {
  cpu::simd::reset_ran();
  f();
  return cpu::simd::tiles();
}

TEST(SdpaTiles, AWindowVisitsOnlyTheTilesItCovers) {
  const index_t n = 4096, m = 4096, d = 16, left = 100;
  const Tensor<float> q = random_tensor<float>({1, 1, n, d}, 5), k = random_tensor<float>({1, 1, m, d}, 6);
  const Tensor<float> v = random_tensor<float>({1, 1, m, d}, 7);
  Tensor<float> out({1, 1, n, d});
  Mask<float> causal, windowed;
  causal.causal = windowed.causal = Causal::top_left;
  windowed.window = Window{left, 0};
  const index_t B = cpu::fused::kBlockQ, K = cpu::fused::kBlockK;
  // Block i0 covers keys [i0 - left, i0 + B - 1] (clamped to 0): the tiles of K keys (at multiples of
  // K) that hold them.
  std::int64_t expected = 0, full = 0;
  for (index_t i0 = 0; i0 < n; i0 += B) {
    const index_t first = std::max<index_t>(0, i0 - left) / K * K, last = i0 + B - 1;
    expected += (last - first + K) / K;
    full += (last + K) / K;
  }
  ScopedBackend cpu(Backend::cpu);
  EXPECT_EQ(tiles_of([&] { sdpa_forward<float>(out.view(), {}, {}, q.view(), k.view(), v.view(), windowed); }), expected);
  EXPECT_EQ(tiles_of([&] { sdpa_forward<float>(out.view(), {}, {}, q.view(), k.view(), v.view(), causal); }), full);
  EXPECT_LT(expected * 10, full);
}

TEST(SdpaTiles, SegmentsSkipTheTilesOfOtherDocuments) {
  // 8 documents of 128 tokens in 1024: a block of 64 queries lies in one document and meets 2 of
  // the 16 key tiles (its document's), under causal masking fewer.
  const index_t n = 1024, d = 16, doc = 128;
  const Tensor<float> q = random_tensor<float>({1, 1, n, d}, 8), k = random_tensor<float>({1, 1, n, d}, 9);
  const Tensor<float> v = random_tensor<float>({1, 1, n, d}, 10);
  Tensor<std::int32_t> ids({1, n});
  for (index_t i = 0; i < n; ++i) ids[i] = static_cast<std::int32_t>(i / doc);
  Mask<float> packed;
  packed.segment_ids_q = ids.view();
  Tensor<float> out({1, 1, n, d});
  ScopedBackend cpu(Backend::cpu);
  const index_t blocks = n / cpu::fused::kBlockQ, tiles_per_doc = doc / cpu::fused::kBlockK;
  EXPECT_EQ(tiles_of([&] { sdpa_forward<float>(out.view(), {}, {}, q.view(), k.view(), v.view(), packed); }),
            blocks * tiles_per_doc);
  // The backward skips them too: its statistics pass (without lse) and its key chunks.
  Tensor<float> g = random_tensor<float>({1, 1, n, d}, 11), dq({1, 1, n, d}), dk({1, 1, n, d}), dv({1, 1, n, d});
  EXPECT_EQ(tiles_of([&] {
              sdpa_backward<float>(dq.view(), dk.view(), dv.view(), g.view(), q.view(), k.view(), v.view(), out.view(),
                                   {}, packed);
            }),
            2 * blocks * tiles_per_doc);
}

// ---- bad input ----------------------------------------------------------------------------------

TEST(SdpaVariantsBadInput, EveryNewArgumentIsChecked) {
  const Tensor<float> q({2, 6, 5, 4}), k({2, 4, 7, 4}), v({2, 4, 7, 3}), k2({2, 2, 7, 4}), v2({2, 2, 7, 3});
  Tensor<float> out({2, 6, 5, 3});
  auto call = [&](const Tensor<float>& kk, const Tensor<float>& vv, const Mask<float>& mask, const SdpaOptions& o) {
    sdpa_forward<float>(out.view(), {}, {}, q.view(), kk.view(), vv.view(), mask, o);
  };
  expect_error([&] { call(k, v, {}, {}); }, {"keys has shape (2,4,7,4) with 4 heads but queries (2,6,5,4) has 6",
                                             "multiple of the key heads"});
  expect_error([&] { call(k2, v, {}, {}); }, {"values has shape (2,4,7,3) but must be (2,2,7,3)"});
  // Slopes: wrong shape, not finite.
  const Tensor<float> slopes_bad({4}), slopes_nan({6}, {0.5f, NAN, 0.1f, 0.1f, 0.1f, 0.1f});
  Mask<float> m1;
  m1.alibi_slopes = slopes_bad.view();
  expect_error([&] { call(k2, v2, m1, {}); }, {"alibi_slopes has shape (4,)", "(H,) = (6,) or (B, H) = (2,6)"});
  Mask<float> m2;
  m2.alibi_slopes = slopes_nan.view();
  expect_error([&] { call(k2, v2, m2, {}); }, {"alibi_slopes holds nan for batch 0, head 1", "finite"});
  // Softcap: zero, negative, NaN, infinite.
  for (double cap : {0.0, -1.0, double(NAN), double(INFINITY)}) {
    SdpaOptions o;
    o.softcap = cap;
    expect_error([&] { call(k2, v2, {}, o); }, {"softcap is", "positive and finite"});
  }
  // Segment ids of the wrong shape; the keys' missing when n != m.
  const Tensor<std::int64_t> seg_bad({2, 6}), seg_q({2, 5}), seg_k({2, 7});
  Mask<float> m3;
  m3.segment_ids_q = seg_bad.view();
  expect_error([&] { call(k2, v2, m3, {}); }, {"segment_ids (queries) has shape (2,6); it must be (B, n) = (2,5)"});
  Mask<float> m4;
  m4.segment_ids_q = seg_q.view();
  expect_error([&] { call(k2, v2, m4, {}); }, {"n = 5 != m = 7", "pass the keys' ids (B, m) too"});
  const Tensor<std::int32_t> seg_k32({2, 6});
  Mask<float> m5;
  m5.segment_ids_q = seg_q.view(), m5.segment_ids_k = seg_k32.view();
  expect_error([&] { call(k2, v2, m5, {}); }, {"segment_ids (keys) has shape (2,6); it must be (B, m) = (2,7)"});
  // A bool mask with the key heads instead of the query heads.
  const Tensor<bool> keep_kv_heads({2, 2, 5, 7});
  Mask<float> m6;
  m6.keep = keep_kv_heads.view();
  expect_error([&] { call(k2, v2, m6, {}); }, {"mask has shape (2,2,5,7)", "does not broadcast", "(2,6,5,7)"});
}

}  // namespace
}  // namespace attn
