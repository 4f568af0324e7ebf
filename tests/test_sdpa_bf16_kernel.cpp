// The bfloat16 kernel of bfloat16 attention (cpu/bf16/dot_bf16.hpp), on each of its units the CPU
// has: AVX512-BF16's vectors (Bf16Kernel::on) and AMX's tiles (Bf16Kernel::tiles, tiles/tiles.hpp);
// its out and lse against the float64 reference on the rounded inputs within twice the error of a
// float32 computation with P rounded to bfloat16 (FlashAttention's rule, P rounded as the kernel
// does), and against the portable bfloat16 path within the stated bound: the two differ only in
// P's rounding and the order of additions, so |kernel - portable| <= 2^-7 max|v| (P's relative
// rounding 2^-9 summed over a row's weights, plus each output's own rounding, 2^-9 of |out| <= max|v|).
// Masks, variants, dropout, grouped heads, odd sizes (tiles filled in part: rows, pairs and value
// columns not multiples of 16). Skipped, saying so, on a CPU without the unit.
#include <array>
#include <cmath>
#include <tuple>
#include <optional>
#include <string>
#include <vector>

#include "attn/config.hpp"
#include "attn/half.hpp"
#include "attn/sdpa.hpp"
#include "support/testing.hpp"

namespace attn {
namespace {

using testing::convert;
using testing::random_tensor;

using testing::to_single;
Tensor<bfloat16> to_bf16(const Tensor<float>& t) { return testing::to_half<bfloat16>(t); }

struct Case {
  const char* name;
  index_t B, H, Hk, n, m, d, dv;
  Causal causal = Causal::none;
  bool lens = false, keep = false, additive = false, alibi = false, segments = false;
  std::optional<Window> window{};
  double softcap = 0, dropout = 0;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// A case's queries, keys and values (bfloat16 values, held in float), the tensors its masks view, and
// its options; mask_of builds the mask in float or double (the bias and slopes given in that type).
struct CaseInputs {
  Case c;
  Tensor<float> q, k, v, bias, slopes;
  Tensor<std::int64_t> lens;
  Tensor<bool> keep;
  Tensor<std::int32_t> ids;
  SdpaOptions options;
  explicit CaseInputs(const Case& c_)
      : c(c_), q(to_single(to_bf16(random_tensor<float>({c.B, c.H, c.n, c.d}, 1, -2, 2)))),
        k(to_single(to_bf16(random_tensor<float>({c.B, c.Hk, c.m, c.d}, 2, -2, 2)))),
        v(to_single(to_bf16(random_tensor<float>({c.B, c.Hk, c.m, c.dv}, 3, -1, 1)))),
        bias(random_tensor<float>({c.n, c.m}, 4, -2, 0)), slopes(random_tensor<float>({c.H}, 5, 0.05, 0.4)),
        lens({c.B}), keep({c.n, c.m}), ids({c.B, c.n}) {
    for (index_t b = 0; b < c.B; ++b) lens[b] = (b * 41 + c.m * 2 / 3) % (c.m + 1);
    for (index_t e = 0; e < keep.numel(); ++e) keep[e] = (e / 64 + e % 7) % 4 != 0;
    for (index_t e = 0; e < ids.numel(); ++e) ids[e] = static_cast<std::int32_t>(e % c.n / 50);
    if (c.softcap > 0) options.softcap = c.softcap;
    options.dropout = {c.dropout, 7};
  }
  template <class T>
  Mask<T> mask_of(const Tensor<T>& b, const Tensor<T>& s) const {
    Mask<T> mask;
    mask.causal = c.causal, mask.window = c.window;
    if (c.lens) mask.valid_lens = lens.view();
    if (c.keep) mask.keep = keep.view();
    if (c.additive) mask.additive = b.view();
    if (c.alibi) mask.alibi_slopes = s.view();
    if (c.segments) mask.segment_ids_q = ids.view();
    return mask;
  }
};

struct Result {
  Tensor<float> out, lse;
};

// Skips, saying why, where the kernel cannot run `unit` (Bf16Kernel::on or tiles); else nothing.
std::string unit_missing(Bf16Kernel unit) {
  if (!bf16_kernel_available()) return "this CPU has no AVX512-BF16: the bfloat16 kernel's tests are skipped";
  if (simd_target() != "avx3") return "the bfloat16 kernel runs on the avx3 target only; this run uses " + simd_target();
  if (unit == Bf16Kernel::tiles && !bf16_tiles_available())
    return "this CPU has no AMX-BF16 tiles (or the system does not grant them): the tiles' runs are skipped";
  return {};
}
const char* unit_name(Bf16Kernel unit) { return unit == Bf16Kernel::tiles ? "tiles" : "vectors"; }

class AvxBf16Kernel : public ::testing::TestWithParam<std::tuple<Case, Bf16Kernel>> {
 protected:
  void SetUp() override {
    if (const std::string why = unit_missing(std::get<1>(GetParam())); !why.empty()) GTEST_SKIP() << why;
  }
};

TEST_P(AvxBf16Kernel, WithinTheSixteenBitRuleAndTheBoundOfThePortablePath) {
  const auto& [c, unit] = GetParam();
  const CaseInputs in(c);
  const Tensor<float> &q = in.q, &k = in.k, &v = in.v, &bias = in.bias, &slopes = in.slopes;
  const SdpaOptions& options = in.options;
  auto mask_of = [&]<class T>(const Tensor<T>& b, const Tensor<T>& s) { return in.mask_of(b, s); };
  const Mask<float> mask = mask_of(bias, slopes);
  auto bf16_call = [&](bool kernel) {
    set_bf16_kernel(kernel ? unit : Bf16Kernel::off);
    const Tensor<bfloat16> qb = to_bf16(q), kb = to_bf16(k), vb = to_bf16(v);
    Tensor<bfloat16> out({c.B, c.H, c.n, c.dv});
    Tensor<float> lse({c.B, c.H, c.n});
    sdpa_forward<bfloat16>(out.view(), lse.view(), qb.view(), kb.view(), vb.view(), mask, options);
    set_bf16_kernel(Bf16Kernel::automatic);
    return Result{to_single(out), lse};
  };
  ScopedBackend cpu(Backend::cpu);
  const Result kernel = bf16_call(true), portable = bf16_call(false);
  // The kernel ran: P's rounding moves some output.
  EXPECT_NE(kernel.out.values(), portable.out.values());
  double bound = 0, worst = 0;
  for (index_t e = 0; e < v.numel(); ++e) bound = std::max(bound, std::ldexp(std::abs(static_cast<double>(v[e])), -7));
  for (index_t e = 0; e < kernel.out.numel(); ++e) worst = std::max(worst, std::abs(static_cast<double>(kernel.out[e]) - portable.out[e]));
  EXPECT_LE(worst, bound) << "kernel against the portable path";

  // The rule: float64 on the rounded inputs; float32 weights rounded to bfloat16, times V, rounded.
  if (c.dropout > 0) return;  // the reference's weights are before dropout: the bound above covers it
  Tensor<double> oracle_out({c.B, c.H, c.n, c.dv}), oracle_lse({c.B, c.H, c.n});
  Tensor<float> weights({c.B, c.H, c.n, c.m}), ref_lse({c.B, c.H, c.n}), ref_out({c.B, c.H, c.n, c.dv});
  {
    ScopedBackend reference(Backend::reference);
    const Tensor<double> bias64 = convert<double>(bias), slopes64 = convert<double>(slopes);
    sdpa_forward<double>(oracle_out.view(), oracle_lse.view(), {}, convert<double>(q).view(), convert<double>(k).view(),
                         convert<double>(v).view(), mask_of(bias64, slopes64), options);
    sdpa_forward<float>(ref_out.view(), ref_lse.view(), weights.view(), q.view(), k.view(), v.view(), mask, options);
  }
  Tensor<float> low({c.B, c.H, c.n, c.dv});
  const index_t group = c.H / c.Hk;
  for (index_t b = 0; b < c.B; ++b)
    for (index_t h = 0; h < c.H; ++h)
      for (index_t i = 0; i < c.n; ++i)
        for (index_t col = 0; col < c.dv; ++col) {
          float acc = 0;
          for (index_t j = 0; j < c.m; ++j) acc += to_float(to_bfloat16(weights(b, h, i, j))) * v(b, h / group, j, col);
          low(b, h, i, col) = to_float(to_bfloat16(acc));
        }
  EXPECT_TRUE(testing::within_error_budget(convert<double>(kernel.out), convert<double>(low), oracle_out)) << "out";
  EXPECT_TRUE(testing::within_error_budget(convert<double>(kernel.lse), convert<double>(portable.lse), oracle_lse)) << "lse";
}

// The backward's products through the kernel (P and dS rounded to bfloat16 for theirs, as
// FlashAttention's 16-bit backward and PyTorch's bfloat16 matmuls): each gradient within three times
// the error of that computation written out here in float64 (P from the float64 forward's weights,
// dP = dout V^T, dS = P (dP - D), P and dS rounded to bfloat16, then dV = P^T dout, dK = scale dS^T Q,
// dQ = scale dS K, rounded to bfloat16) against the float64 gradients on the rounded inputs
// (FlashAttention's rule for its bfloat16 backward). Under soft-capping and dropout, whose chains
// that computation leaves out, within four times the portable path's error plus 2^-7 of the
// largest gradient.
TEST_P(AvxBf16Kernel, BackwardWithinFlashAttentionsSixteenBitRule) {
  const auto& [c, unit] = GetParam();
  const CaseInputs in(c);
  const Tensor<float> &q = in.q, &k = in.k, &v = in.v, &bias = in.bias, &slopes = in.slopes;
  const SdpaOptions& options = in.options;
  auto mask_of = [&]<class T>(const Tensor<T>& b, const Tensor<T>& s) { return in.mask_of(b, s); };
  const Mask<float> mask = mask_of(bias, slopes);
  const Tensor<float> g = to_single(to_bf16(random_tensor<float>({c.B, c.H, c.n, c.dv}, 8, -1, 1)));
  ScopedBackend cpu(Backend::cpu);
  // The forward once (portable), then the backward both ways on its out and lse.
  const Tensor<bfloat16> qb = to_bf16(q), kb = to_bf16(k), vb = to_bf16(v), gb = to_bf16(g);
  Tensor<bfloat16> out({c.B, c.H, c.n, c.dv});
  Tensor<float> lse({c.B, c.H, c.n});
  set_bf16_kernel(Bf16Kernel::off);
  sdpa_forward<bfloat16>(out.view(), lse.view(), qb.view(), kb.view(), vb.view(), mask, options);
  auto backward = [&](bool kernel) {
    set_bf16_kernel(kernel ? unit : Bf16Kernel::off);
    Tensor<bfloat16> dq({c.B, c.H, c.n, c.d}), dk({c.B, c.Hk, c.m, c.d}), dv({c.B, c.Hk, c.m, c.dv});
    sdpa_backward<bfloat16>(dq.view(), dk.view(), dv.view(), gb.view(), qb.view(), kb.view(), vb.view(), out.view(),
                            lse.view(), mask, options);
    set_bf16_kernel(Bf16Kernel::automatic);
    return std::vector<Tensor<double>>{convert<double>(to_single(dq)), convert<double>(to_single(dk)),
                                       convert<double>(to_single(dv))};
  };
  const std::vector<Tensor<double>> kernel = backward(true), portable = backward(false);
  EXPECT_NE(kernel[0].values(), portable[0].values()) << "the kernel ran: its roundings move dQ";

  // The float64 gradients on the rounded inputs, and the forward's weights.
  const Tensor<double> q64 = convert<double>(q), k64 = convert<double>(k), v64 = convert<double>(v), g64 = convert<double>(g);
  const Tensor<double> bias64 = convert<double>(bias), slopes64 = convert<double>(slopes);
  const Mask<double> mask64 = mask_of(bias64, slopes64);
  Tensor<double> dq64({c.B, c.H, c.n, c.d}), dk64({c.B, c.Hk, c.m, c.d}), dv64({c.B, c.Hk, c.m, c.dv});
  Tensor<double> o64({c.B, c.H, c.n, c.dv}), w64({c.B, c.H, c.n, c.m});
  {
    ScopedBackend reference(Backend::reference);
    sdpa_forward<double>(o64.view(), {}, w64.view(), q64.view(), k64.view(), v64.view(), mask64, options);
    sdpa_backward<double>(dq64.view(), dk64.view(), dv64.view(), g64.view(), q64.view(), k64.view(), v64.view(), {}, {},
                          mask64, options);
  }
  const std::vector<const Tensor<double>*> oracle = {&dq64, &dk64, &dv64};
  const char* names[] = {"dQ", "dK", "dV"};
  auto worst = [](const Tensor<double>& a, const Tensor<double>& b) { return testing::max_abs_diff(a, b); };
  auto top = [](const Tensor<double>& a) {
    double t = 0;
    for (index_t e = 0; e < a.numel(); ++e) t = std::max(t, std::abs(a[e]));
    return t;
  };
  if (c.softcap > 0 || c.dropout > 0) {
    for (int i = 0; i < 3; ++i)
      EXPECT_LE(worst(kernel[i], *oracle[i]), 4 * worst(portable[i], *oracle[i]) + std::ldexp(top(*oracle[i]), -7)) << names[i];
    return;
  }
  // The rounded computation, in float64 but for P and dS.
  const double scale = 1 / std::sqrt(static_cast<double>(c.d));
  const index_t group = c.H / c.Hk;
  auto bf = [](double x) { return static_cast<double>(to_float(to_bfloat16(static_cast<float>(x)))); };
  Tensor<double> rq({c.B, c.H, c.n, c.d}), rk({c.B, c.Hk, c.m, c.d}), rv({c.B, c.Hk, c.m, c.dv});
  for (index_t b = 0; b < c.B; ++b)
    for (index_t h = 0; h < c.H; ++h)
      for (index_t i = 0; i < c.n; ++i) {
        double dot = 0;  // D = dout . out
        for (index_t col = 0; col < c.dv; ++col) dot += g64(b, h, i, col) * o64(b, h, i, col);
        for (index_t j = 0; j < c.m; ++j) {
          const double p = w64(b, h, i, j);
          if (p == 0) continue;
          double dp = 0;
          for (index_t col = 0; col < c.dv; ++col) dp += g64(b, h, i, col) * v64(b, h / group, j, col);
          const double pr = bf(p), ds = bf(p * (dp - dot));
          for (index_t col = 0; col < c.dv; ++col) rv(b, h / group, j, col) += pr * g64(b, h, i, col);
          for (index_t e = 0; e < c.d; ++e) {
            rq(b, h, i, e) += scale * ds * k64(b, h / group, j, e);
            rk(b, h / group, j, e) += scale * ds * q64(b, h, i, e);
          }
        }
      }
  const std::vector<Tensor<double>*> rounded = {&rq, &rk, &rv};
  for (Tensor<double>* t : rounded)
    for (index_t e = 0; e < t->numel(); ++e) (*t)[e] = bf((*t)[e]);
  for (int i = 0; i < 3; ++i)
    EXPECT_LE(worst(kernel[i], *oracle[i]), 3 * worst(*rounded[i], *oracle[i]) + 1e-6)
        << names[i] << ": the kernel's error against the rounded computation's";
}

INSTANTIATE_TEST_SUITE_P(
    Cases, AvxBf16Kernel,
    ::testing::Combine(::testing::Values(Case{"plain", 2, 2, 2, 130, 150, 64, 64}, Case{"odd_sizes", 1, 3, 3, 67, 93, 17, 9},
                      // the products' register blocks of 6 keys and 6 value columns, and every remainder
                      // of them (last tiles of 1 and 8 keys, 7, 8 and 11 value columns)
                      Case{"block_remainders_1", 1, 2, 1, 70, 129, 13, 7}, Case{"block_remainders_2", 1, 1, 1, 65, 136, 6, 8},
                      Case{"block_remainders_5", 1, 1, 1, 9, 136, 128, 11},
                      // a head of one element (no whole pair of it) and of three (one pair, one alone)
                      Case{"head_dim_1", 1, 2, 1, 70, 75, 1, 5}, Case{"head_dim_3", 1, 1, 1, 66, 71, 3, 1},
                      Case{"causal_lengths_keep_additive", 2, 2, 2, 100, 140, 32, 16, Causal::bottom_right, true, true, true},
                      Case{"gqa_window_alibi_softcap_segments", 1, 4, 2, 150, 150, 48, 24, Causal::top_left, false, false,
                           false, true, true, Window{40, 3}, 4.0},
                      Case{"dropout", 1, 2, 1, 90, 110, 32, 32, Causal::none, false, false, false, false, false,
                           std::nullopt, 0, 0.25},
                      // four query heads on one key head over 700 keys (a last tile of 60), d 128
                      Case{"gqa_long_keys", 1, 4, 1, 70, 700, 128, 32, Causal::bottom_right},
                      // sizes of whole panels of 64: the vectors' backward keeps dK and dV key-major;
                      // odd last blocks (35 and 3 rows), masks element by element, dropout
                      Case{"key_major_masks", 2, 2, 2, 99, 140, 64, 64, Causal::bottom_right, true, true, true},
                      Case{"key_major_gqa_window_alibi_softcap_dropout", 1, 4, 2, 131, 131, 64, 128, Causal::top_left,
                           false, false, false, true, true, Window{40, 3}, 4.0, 0.2}),
                       ::testing::Values(Bf16Kernel::on, Bf16Kernel::tiles)),
    [](const auto& info) { return std::string(std::get<0>(info.param).name) + "_" + unit_name(std::get<1>(info.param)); });

// NaN and Inf in values no row attends (past the valid lengths, before a window) never reach an
// output: the kernel packs each tile's values once per call, beyond a block's keys too, and a pair
// product reads one value row past an odd count. Odd lengths, windows that start mid-tile.
class AvxBf16KernelExtremes : public ::testing::TestWithParam<Bf16Kernel> {
 protected:
  void SetUp() override {
    if (const std::string why = unit_missing(GetParam()); !why.empty()) GTEST_SKIP() << why;
  }
};

TEST_P(AvxBf16KernelExtremes, NonFiniteValuesOfMaskedKeysNeverReachTheOutput) {
  const Bf16Kernel unit = GetParam();
  const index_t B = 2, H = 2, n = 80, m = 200, d = 32, dv = 16;
  const Tensor<bfloat16> q = to_bf16(random_tensor<float>({B, H, n, d}, 11)), k = to_bf16(random_tensor<float>({B, H, m, d}, 12));
  const Tensor<std::int64_t> lens({B}, {131, 77});  // odd: the last pair's second row is a masked key
  for (const bool window : {false, true}) {
    Mask<float> mask;
    if (window) mask.window = Window{37, 0}, mask.causal = Causal::bottom_right;  // keys before i + m - n - 37 masked
    else mask.valid_lens = lens.view();
    Tensor<bfloat16> v = to_bf16(random_tensor<float>({B, H, m, dv}, 13));
    auto run = [&] {
      set_bf16_kernel(unit);
      Tensor<bfloat16> out({B, H, n, dv});
      sdpa_forward<bfloat16>(out.view(), {}, q.view(), k.view(), v.view(), mask);
      set_bf16_kernel(Bf16Kernel::automatic);
      return to_single(out);
    };
    const Tensor<float> clean = run();
    for (index_t b = 0; b < B; ++b)
      for (index_t h = 0; h < H; ++h)
        for (index_t c = 0; c < dv; ++c) {
          if (window) {
            v(b, h, 0, c) = to_bfloat16(NAN), v(b, h, 63, c) = to_bfloat16(INFINITY), v(b, h, 64, c) = to_bfloat16(-INFINITY);
          } else {
            for (index_t j = lens[b]; j < m; ++j) v(b, h, j, c) = to_bfloat16(j % 2 ? NAN : INFINITY);
          }
        }
    // A tile holding a non-finite value takes the float path (P not rounded): finite, within the
    // kernel's bound of the portable path (2^-7 max |v|, |v| <= 1 here).
    const Tensor<float> dirty = run();
    double worst = 0;
    for (index_t e = 0; e < clean.numel(); ++e) {
      ASSERT_TRUE(std::isfinite(dirty[e])) << (window ? "window" : "valid lengths") << ": output " << e << " is " << dirty[e];
      worst = std::max(worst, std::abs(static_cast<double>(dirty[e]) - clean[e]));
    }
    EXPECT_LE(worst, std::ldexp(1.0, -7)) << (window ? "window" : "valid lengths");
  }
}

// Heads of no element (d = 0, with a scale): every score 0, so each row the mean of the values (out
// in float32, as compute_dtype="bfloat16" returns it). The kernel once left such scores unwritten,
// holding what an earlier call had left in its scratch (found by the generated Python tests): a
// call with d = 64 runs before each, so that the scratch is not fresh zeros.
TEST_P(AvxBf16KernelExtremes, HeadsOfNoElementScoreZero) {
  ScopedBackend cpu(Backend::cpu);
  set_bf16_kernel(GetParam());
  const index_t B = 1, H = 2;
  for (const auto& [n, m, dv] : {std::array<index_t, 3>{70, 75, 5}, {9, 9, 3}, {10, 8, 4}, {5, 7, 1}}) {
    for (const index_t d : {64, 0}) {
      const Tensor<bfloat16> q = to_bf16(random_tensor<float>({B, H, n, d}, 21, -40, 40));
      const Tensor<bfloat16> k = to_bf16(random_tensor<float>({B, H, m, d}, 22, -40, 40));
      const Tensor<bfloat16> v = to_bf16(random_tensor<float>({B, H, m, dv}, 23));
      Tensor<float> out({B, H, n, dv});
      SdpaOptions options;
      options.scale = 0.3;
      sdpa_forward<bfloat16>(out.view(), {}, q.view(), k.view(), v.view(), {}, options);
      if (d > 0) continue;
      for (index_t h = 0; h < H; ++h)
        for (index_t c = 0; c < dv; ++c) {
          double mean = 0;
          for (index_t j = 0; j < m; ++j) mean += to_float(v(0, h, j, c)) / static_cast<double>(m);
          EXPECT_NEAR(out(0, h, 0, c), mean, std::ldexp(1.0, -7)) << "head " << h << ", column " << c;
          for (index_t i = 1; i < n; ++i) ASSERT_EQ(out(0, h, i, c), out(0, h, 0, c)) << i;
        }
    }
  }
  set_bf16_kernel(Bf16Kernel::automatic);
}

INSTANTIATE_TEST_SUITE_P(Units, AvxBf16KernelExtremes, ::testing::Values(Bf16Kernel::on, Bf16Kernel::tiles),
                         [](const auto& info) { return std::string(unit_name(info.param)); });

}  // namespace
}  // namespace attn
