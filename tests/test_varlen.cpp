// Variable-length attention (attn/varlen.hpp) against a reference written here from the formula, per
// sequence of the packed tensors, in float64 (and in float32, the same-precision reference of the
// error budget): sequences of random lengths including 0 and 1 and lengths off the kernels' 64-row
// tiles, n != m per sequence; causal of both alignments, windows, ALiBi (H,) and (B, H), soft-capping,
// sinks, GQA and dropout (the decisions of one (1, H, total_q, total_k) attention). Backward by
// central finite differences of the reference in float64 (dq, dk, dv, dsinks); float32 and 16-bit
// backward against float64 and float32 attn. Every bad input gets a named error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "attn/dropout.hpp"
#include "attn/varlen.hpp"
#include "support/testing.hpp"

namespace attn {
namespace {

using testing::convert;
using testing::random_tensor;

struct Case {
  std::string name;
  std::vector<index_t> nq, nk;  // per sequence
  index_t H = 4, Hk = 4, d = 16, dv = 12;
  Causal causal = Causal::none;
  std::optional<Align> align;
  std::optional<Window> window;
  int alibi = 0;  // 0: none, 1: (H,), 2: (B, H)
  bool sinks = false;
  std::optional<double> softcap;
  double p = 0.0;
  std::optional<double> scale;

  index_t B() const { return static_cast<index_t>(nq.size()); }
  index_t total(const std::vector<index_t>& lens) const {
    index_t t = 0;
    for (index_t l : lens) t += l;
    return t;
  }
  index_t max(const std::vector<index_t>& lens) const {
    index_t t = 0;
    for (index_t l : lens) t = std::max(t, l);
    return t;
  }
  bool bottom_right() const {
    return align ? *align == Align::bottom_right : causal == Causal::bottom_right;
  }
};

// Lengths with 0, 1, tile-crossing sizes and n != m.
const std::vector<index_t> kNq = {0, 1, 37, 130, 1, 200, 64, 5};
const std::vector<index_t> kNk = {3, 1, 70, 0, 129, 150, 64, 5};

// A case's packed tensors in float64, and the int32 offsets.
struct Inputs {
  Tensor<double> q, k, v, g, slopes, sinks;
  Tensor<std::int32_t> cq, ck;
  Tensor<bool> keep;  // (1, H, total_q, total_k): dropout's decisions, when p > 0
};

Tensor<std::int32_t> cumulative(const std::vector<index_t>& lens) {
  Tensor<std::int32_t> cu({static_cast<index_t>(lens.size()) + 1});
  for (std::size_t b = 0; b < lens.size(); ++b) cu[static_cast<index_t>(b) + 1] = cu[static_cast<index_t>(b)] + static_cast<std::int32_t>(lens[b]);
  return cu;
}

constexpr std::uint64_t kSeed = 1234;

Inputs make_inputs(const Case& c, std::uint64_t seed = 1) {
  Inputs in;
  const index_t tq = c.total(c.nq), tk = c.total(c.nk);
  in.q = random_tensor<double>({tq, c.H, c.d}, seed, -2, 2);
  in.k = random_tensor<double>({tk, c.Hk, c.d}, seed + 1, -2, 2);
  in.v = random_tensor<double>({tk, c.Hk, c.dv}, seed + 2);
  in.g = random_tensor<double>({tq, c.H, c.dv}, seed + 3);
  if (c.alibi == 1) in.slopes = random_tensor<double>({c.H}, seed + 4, 0.05, 0.5);
  if (c.alibi == 2) in.slopes = random_tensor<double>({c.B(), c.H}, seed + 4, 0.05, 0.5);
  if (c.sinks) in.sinks = random_tensor<double>({c.H}, seed + 5, -1, 2);
  in.cq = cumulative(c.nq), in.ck = cumulative(c.nk);
  if (c.p > 0) {
    in.keep = Tensor<bool>({1, c.H, tq, tk});
    dropout_keep_mask(in.keep.view(), Dropout{c.p, kSeed});
  }
  return in;
}

// out (total_q, H, dv) and lse (H, total_q) straight from the formula, in T.
template <class T>
std::pair<Tensor<T>, Tensor<T>> reference(const Case& c, const Inputs& in) {
  const Tensor<T> q = convert<T>(in.q), k = convert<T>(in.k), v = convert<T>(in.v);
  const index_t tq = c.total(c.nq), group = c.H / c.Hk;
  Tensor<T> out({tq, c.H, c.dv}), lse({c.H, tq});
  const T scale = static_cast<T>(c.scale ? *c.scale : 1.0 / std::sqrt(static_cast<double>(c.d)));
  const T neg_inf = -std::numeric_limits<T>::infinity();
  for (index_t b = 0; b < c.B(); ++b) {
    const index_t n = c.nq[b], m = c.nk[b], q0 = in.cq[b], k0 = in.ck[b];
    for (index_t h = 0; h < c.H; ++h) {
      const index_t kh = h / group;
      for (index_t i = 0; i < n; ++i) {
        const index_t pos = c.bottom_right() ? i + m - n : i;
        std::vector<T> s(static_cast<std::size_t>(m), neg_inf);
        T top = c.sinks ? static_cast<T>(in.sinks[h]) : neg_inf;
        bool any = false;
        for (index_t j = 0; j < m; ++j) {
          if (c.causal != Causal::none && j > pos) continue;
          if (c.window && c.window->left >= 0 && j < pos - c.window->left) continue;
          if (c.window && c.window->right >= 0 && j > pos + c.window->right) continue;
          T dot = 0;
          for (index_t e = 0; e < c.d; ++e) dot += q(q0 + i, h, e) * k(k0 + j, kh, e);
          T x = dot * scale;
          if (c.softcap) x = static_cast<T>(*c.softcap) * std::tanh(x / static_cast<T>(*c.softcap));
          if (c.alibi == 1) x -= static_cast<T>(in.slopes[h]) * static_cast<T>(std::abs(pos - j));
          if (c.alibi == 2) x -= static_cast<T>(in.slopes(b, h)) * static_cast<T>(std::abs(pos - j));
          s[j] = x, any = true;
          top = std::max(top, x);
        }
        if (!any) {  // no key: out 0, lse -inf or the sink
          lse(h, q0 + i) = c.sinks ? static_cast<T>(in.sinks[h]) : neg_inf;
          continue;
        }
        T sum = c.sinks ? std::exp(static_cast<T>(in.sinks[h]) - top) : T(0);
        for (index_t j = 0; j < m; ++j) sum += s[j] == neg_inf ? T(0) : std::exp(s[j] - top);
        const T l = top + std::log(sum);
        lse(h, q0 + i) = l;
        for (index_t j = 0; j < m; ++j) {
          if (s[j] == neg_inf) continue;
          T w = std::exp(s[j] - l);
          if (c.p > 0) w = in.keep(0, h, q0 + i, k0 + j) ? w / static_cast<T>(1 - c.p) : T(0);
          for (index_t e = 0; e < c.dv; ++e) out(q0 + i, h, e) += w * v(k0 + j, kh, e);
        }
      }
    }
  }
  return {std::move(out), std::move(lse)};
}

template <class W>
struct Call {
  Tensor<W> slopes, sinks;
  Mask<W> mask;
  SdpaOptions options;
  VarlenSeqs seqs;
};

template <class W>
Call<W> call_of(const Case& c, const Inputs& in) {
  Call<W> r;
  if (c.alibi) r.slopes = convert<W>(in.slopes), r.mask.alibi_slopes = r.slopes.view();
  if (c.sinks) r.sinks = convert<W>(in.sinks), r.mask.sinks = r.sinks.view();
  r.mask.causal = c.causal, r.mask.align = c.align, r.mask.window = c.window;
  r.options.scale = c.scale, r.options.softcap = c.softcap, r.options.dropout = Dropout{c.p, kSeed};
  r.seqs = VarlenSeqs{in.cq.view(), in.ck.view(), c.max(c.nq), c.max(c.nk)};
  return r;
}

std::vector<Case> cases() {
  std::vector<Case> r;
  auto add = [&](const std::string& name, auto&& edit) {
    Case c;
    c.name = name, c.nq = kNq, c.nk = kNk;
    edit(c);
    r.push_back(c);
  };
  add("plain", [](Case&) {});
  add("causal_gqa", [](Case& c) { c.causal = Causal::bottom_right, c.Hk = 2; });
  add("causal_top_left", [](Case& c) { c.causal = Causal::top_left; });
  add("window", [](Case& c) { c.window = Window{7, 3}, c.align = Align::bottom_right; });
  add("window_top_left", [](Case& c) { c.window = Window{-1, 5}; });
  add("causal_window", [](Case& c) { c.causal = Causal::bottom_right, c.window = Window{16, -1}; });
  add("alibi_rows_softcap", [](Case& c) { c.alibi = 2, c.softcap = 2.5, c.align = Align::bottom_right; });
  add("alibi_sinks_causal_mqa", [](Case& c) { c.alibi = 1, c.sinks = true, c.causal = Causal::bottom_right, c.Hk = 1; });
  add("dropout_causal_gqa", [](Case& c) { c.p = 0.3, c.causal = Causal::bottom_right, c.Hk = 2; });
  add("all", [](Case& c) {
    c.p = 0.2, c.causal = Causal::bottom_right, c.Hk = 2, c.window = Window{40, 0}, c.alibi = 2, c.sinks = true;
    c.softcap = 4.0, c.scale = 0.3, c.dv = 7;
  });
  return r;
}

class VarlenCase : public ::testing::TestWithParam<Case> {};

// float64: attn matches the reference to rounding; float32: within the error budget of the float32
// reference against float64 (twice its error, FlashAttention's rule).
TEST_P(VarlenCase, ForwardMatchesReference) {
  const Case& c = GetParam();
  const Inputs in = make_inputs(c);
  const auto [ref_out, ref_lse] = reference<double>(c, in);
  const auto [ref32_out, ref32_lse] = reference<float>(c, in);
  const index_t tq = c.total(c.nq);
  {
    const Call<double> call = call_of<double>(c, in);
    Tensor<double> out({tq, c.H, c.dv}), lse({c.H, tq}), weights({c.B(), c.H, c.max(c.nq), c.max(c.nk)});
    varlen_forward<double>(out.view(), lse.view(), weights.view(), in.q.cview(), in.k.cview(), in.v.cview(), call.seqs,
                           call.mask, call.options);
    EXPECT_LT(testing::max_abs_diff(out, ref_out), 1e-12);
    for (index_t e = 0; e < lse.numel(); ++e) {
      if (std::isinf(ref_lse[e])) {
        EXPECT_EQ(lse[e], ref_lse[e]) << e;
      } else {
        EXPECT_NEAR(lse[e], ref_lse[e], 1e-12) << e;
      }
    }
    // Each sequence's weights in its corner (rows sum to at most 1), zeros elsewhere.
    for (index_t b = 0; b < c.B(); ++b)
      for (index_t h = 0; h < c.H; ++h)
        for (index_t i = 0; i < c.max(c.nq); ++i) {
          double row = 0;
          for (index_t j = 0; j < c.max(c.nk); ++j) {
            if (i >= c.nq[b] || j >= c.nk[b]) {
              EXPECT_EQ(weights(b, h, i, j), 0.0);
            }
            row += weights(b, h, i, j);
          }
          EXPECT_LE(row, 1.0 + 1e-12);
        }
  }
  const Call<float> call = call_of<float>(c, in);
  const Tensor<float> q = convert<float>(in.q), k = convert<float>(in.k), v = convert<float>(in.v);
  Tensor<float> out({tq, c.H, c.dv}), lse({c.H, tq});
  varlen_forward<float>(out.view(), lse.view(), {}, q.cview(), k.cview(), v.cview(), call.seqs, call.mask, call.options);
  EXPECT_TRUE(testing::within_error_budget(out, ref32_out, ref_out));
  Tensor<double> finite_lse({c.H, tq});
  Tensor<float> finite32({c.H, tq}), finite_attn({c.H, tq});
  for (index_t e = 0; e < lse.numel(); ++e) {
    ASSERT_EQ(std::isinf(lse[e]), std::isinf(ref_lse[e])) << e;
    if (!std::isinf(lse[e])) finite_lse[e] = ref_lse[e], finite32[e] = ref32_lse[e], finite_attn[e] = lse[e];
  }
  EXPECT_TRUE(testing::within_error_budget(finite_attn, finite32, finite_lse));
}

// 16-bit (bfloat16 and float16): the forward against the float64 reference of the rounded inputs,
// within the 16-bit rounding of the results; the backward against float32 attn on the same values.
template <class Half>
void half_forward_and_backward(const Case& c, double tolerance) {
  Inputs in = make_inputs(c);
  for (Tensor<double>* t : {&in.q, &in.k, &in.v, &in.g})
    *t = convert<double>(testing::rounded<Half>(convert<float>(*t)));
  const auto [ref_out, ref_lse] = reference<double>(c, in);
  const index_t tq = c.total(c.nq);
  const Call<float> call = call_of<float>(c, in);
  const auto q = testing::to_half<Half>(convert<float>(in.q)), k = testing::to_half<Half>(convert<float>(in.k));
  const auto v = testing::to_half<Half>(convert<float>(in.v)), g = testing::to_half<Half>(convert<float>(in.g));
  Tensor<Half> out({tq, c.H, c.dv});
  Tensor<float> lse({c.H, tq});
  varlen_forward<Half>(out.view(), lse.view(), q.cview(), k.cview(), v.cview(), call.seqs, call.mask, call.options);
  EXPECT_LT(testing::max_abs_diff(testing::to_single(out), ref_out), tolerance);
  const Tensor<float> q32 = convert<float>(in.q), k32 = convert<float>(in.k), v32 = convert<float>(in.v),
                      g32 = convert<float>(in.g);
  Tensor<float> out32({tq, c.H, c.dv}), lse32({c.H, tq});
  varlen_forward<float>(out32.view(), lse32.view(), {}, q32.cview(), k32.cview(), v32.cview(), call.seqs, call.mask,
                        call.options);
  Tensor<float> dq32(q32.shape()), dk32(k32.shape()), dv32(v32.shape()), ds32({c.H}), ds16({c.H});
  varlen_backward<float>(dq32.view(), dk32.view(), dv32.view(), g32.cview(), q32.cview(), k32.cview(), v32.cview(),
                         out32.cview(), lse32.cview(), call.seqs, call.mask, call.options,
                         c.sinks ? ds32.view() : TensorView<float>{});
  Tensor<Half> dq(q.shape()), dk(k.shape()), dv(v.shape());
  varlen_backward<Half>(dq.view(), dk.view(), dv.view(), g.cview(), q.cview(), k.cview(), v.cview(), out.cview(),
                        lse.cview(), call.seqs, call.mask, call.options, c.sinks ? ds16.view() : TensorView<float>{});
  auto scale_of = [](const Tensor<float>& t) {
    double s = 0;
    for (index_t e = 0; e < t.numel(); ++e) s = std::max(s, std::abs(static_cast<double>(t[e])));
    return s;
  };
  EXPECT_LT(testing::max_abs_diff(testing::to_single(dq), dq32), tolerance * (1 + scale_of(dq32)));
  EXPECT_LT(testing::max_abs_diff(testing::to_single(dk), dk32), tolerance * (1 + scale_of(dk32)));
  EXPECT_LT(testing::max_abs_diff(testing::to_single(dv), dv32), tolerance * (1 + scale_of(dv32)));
  if (c.sinks) {
    EXPECT_LT(testing::max_abs_diff(ds16, ds32), tolerance * (1 + scale_of(ds32)));
  }
}

TEST_P(VarlenCase, Bfloat16ForwardAndBackward) { half_forward_and_backward<bfloat16>(GetParam(), 3e-2); }
TEST_P(VarlenCase, Float16ForwardAndBackward) { half_forward_and_backward<float16>(GetParam(), 4e-3); }

// float32 gradients within twice the distance of float32 from float64 attn plus rounding (the
// float64 backward is checked by finite differences below).
TEST_P(VarlenCase, FloatBackwardMatchesDouble) {
  const Case& c = GetParam();
  const Inputs in = make_inputs(c);
  const index_t tq = c.total(c.nq);
  auto run = [&](auto tag) {
    using T = decltype(tag);
    const Call<T> call = call_of<T>(c, in);
    const Tensor<T> q = convert<T>(in.q), k = convert<T>(in.k), v = convert<T>(in.v), g = convert<T>(in.g);
    Tensor<T> out({tq, c.H, c.dv}), lse({c.H, tq}), dq(q.shape()), dk(k.shape()), dv(v.shape()), ds({c.H});
    varlen_forward<T>(out.view(), lse.view(), {}, q.cview(), k.cview(), v.cview(), call.seqs, call.mask, call.options);
    varlen_backward<T>(dq.view(), dk.view(), dv.view(), g.cview(), q.cview(), k.cview(), v.cview(), out.cview(),
                       lse.cview(), call.seqs, call.mask, call.options, c.sinks ? ds.view() : TensorView<T>{});
    // Without out and lse: recomputed per sequence, the same gradients.
    Tensor<T> dq2(q.shape());
    varlen_backward<T>(dq2.view(), {}, {}, g.cview(), q.cview(), k.cview(), v.cview(), {}, {}, call.seqs, call.mask,
                       call.options);
    EXPECT_LT(testing::max_abs_diff(dq2, dq), (std::is_same_v<T, float> ? 1e-4 : 1e-12));
    return std::vector<Tensor<double>>{convert<double>(dq), convert<double>(dk), convert<double>(dv), convert<double>(ds)};
  };
  const auto d64 = run(double{}), d32 = run(float{});
  for (std::size_t t = 0; t < d64.size(); ++t) {
    double scale = 0;
    for (index_t e = 0; e < d64[t].numel(); ++e) scale = std::max(scale, std::abs(d64[t][e]));
    EXPECT_LT(testing::max_abs_diff(d32[t], d64[t]), 2e-5 * (1 + scale)) << "gradient " << t;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, VarlenCase, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// float64 gradients (dq, dk, dv, dsinks) against central finite differences of the reference's
// loss sum(out * g), on small sequences (0, 1, 3, 6 queries; 2, 0, 5, 4 keys).
class VarlenGradient : public ::testing::TestWithParam<Case> {};

TEST_P(VarlenGradient, MatchesFiniteDifferences) {
  Case c = GetParam();
  c.nq = {0, 1, 3, 6, 2}, c.nk = {2, 0, 5, 4, 3};
  c.d = 5, c.dv = 3;
  Inputs in = make_inputs(c, 7);
  const index_t tq = c.total(c.nq);
  const Call<double> call = call_of<double>(c, in);
  Tensor<double> out({tq, c.H, c.dv}), lse({c.H, tq}), dq(in.q.shape()), dk(in.k.shape()), dv(in.v.shape()), ds({c.H});
  varlen_forward<double>(out.view(), lse.view(), {}, in.q.cview(), in.k.cview(), in.v.cview(), call.seqs, call.mask,
                         call.options);
  varlen_backward<double>(dq.view(), dk.view(), dv.view(), in.g.cview(), in.q.cview(), in.k.cview(), in.v.cview(),
                          out.cview(), lse.cview(), call.seqs, call.mask, call.options,
                          c.sinks ? ds.view() : TensorView<double>{});
  auto loss = [&] {
    const auto [o, l] = reference<double>(c, in);
    double s = 0;
    for (index_t e = 0; e < o.numel(); ++e) s += o[e] * in.g[e];
    return s;
  };
  std::vector<std::pair<Tensor<double>*, Tensor<double>*>> pairs = {{&in.q, &dq}, {&in.k, &dk}, {&in.v, &dv}};
  if (c.sinks) pairs.push_back({&in.sinks, &ds});
  for (auto [x, grad] : pairs) {
    const std::vector<double> numeric =
        testing::numeric_gradient(loss, std::span<double>(x->data(), static_cast<std::size_t>(x->numel())));
    for (index_t e = 0; e < x->numel(); ++e) EXPECT_NEAR((*grad)[e], numeric[e], 1e-7) << e;
  }
}

std::vector<Case> gradient_cases() {
  std::vector<Case> r;
  for (Case c : cases()) {
    c.H = c.Hk == 1 ? 2 : 4;
    r.push_back(c);
  }
  return r;
}

INSTANTIATE_TEST_SUITE_P(Cases, VarlenGradient, ::testing::ValuesIn(gradient_cases()),
                         [](const auto& info) { return info.param.name; });

// Dropout: sequence b is the dense call on its rows with Dropout's offsets at (cu_q[b], cu_k[b]),
// bit for bit (the reference above reads the decisions of the (1, H, total_q, total_k) pattern).
TEST(Varlen, DropoutIsTheDenseCallAtTheSequencesOffsets) {
  Case c;
  c.nq = kNq, c.nk = kNk, c.p = 0.4, c.causal = Causal::bottom_right;
  const Inputs in = make_inputs(c);
  const Call<float> call = call_of<float>(c, in);
  const Tensor<float> q = convert<float>(in.q), k = convert<float>(in.k), v = convert<float>(in.v);
  const index_t tq = c.total(c.nq);
  Tensor<float> out({tq, c.H, c.dv});
  varlen_forward<float>(out.view(), {}, {}, q.cview(), k.cview(), v.cview(), call.seqs, call.mask, call.options);
  for (index_t b = 0; b < c.B(); ++b) {
    const index_t n = c.nq[b], m = c.nk[b], q0 = in.cq[b], k0 = in.ck[b];
    if (n == 0 || m == 0) continue;
    Tensor<float> qb({1, c.H, n, c.d}), kb({1, c.Hk, m, c.d}), vb({1, c.Hk, m, c.dv}), ob({1, c.H, n, c.dv});
    for (index_t h = 0; h < c.H; ++h)
      for (index_t i = 0; i < n; ++i)
        for (index_t e = 0; e < c.d; ++e) qb(0, h, i, e) = q(q0 + i, h, e);
    for (index_t h = 0; h < c.Hk; ++h)
      for (index_t j = 0; j < m; ++j) {
        for (index_t e = 0; e < c.d; ++e) kb(0, h, j, e) = k(k0 + j, h, e);
        for (index_t e = 0; e < c.dv; ++e) vb(0, h, j, e) = v(k0 + j, h, e);
      }
    SdpaOptions o = call.options;
    o.dropout.row_start = q0, o.dropout.key_start = k0;
    sdpa_forward<float>(ob.view(), {}, {}, qb.cview(), kb.cview(), vb.cview(), call.mask, o);
    for (index_t h = 0; h < c.H; ++h)
      for (index_t i = 0; i < n; ++i)
        for (index_t e = 0; e < c.dv; ++e) ASSERT_EQ(ob(0, h, i, e), out(q0 + i, h, e)) << b << " " << h << " " << i;
  }
}

// Every sequence empty, and no sequence at all.
TEST(Varlen, EmptySequences) {
  Case c;
  c.nq = {0, 0}, c.nk = {4, 0};
  const Inputs in = make_inputs(c);
  const Call<double> call = call_of<double>(c, in);
  Tensor<double> out({0, c.H, c.dv}), dk(in.k.shape()), dv(in.v.shape());
  for (index_t e = 0; e < dk.numel(); ++e) dk[e] = 5;
  varlen_forward<double>(out.view(), {}, {}, in.q.cview(), in.k.cview(), in.v.cview(), call.seqs, call.mask);
  varlen_backward<double>({}, dk.view(), dv.view(), in.g.cview(), in.q.cview(), in.k.cview(), in.v.cview(), {}, {},
                          call.seqs, call.mask);
  for (index_t e = 0; e < dk.numel(); ++e) EXPECT_EQ(dk[e], 0.0);
  Tensor<std::int32_t> zero({1});
  const VarlenSeqs none{zero.view(), zero.view(), 0, 0};
  Tensor<double> q0({0, 2, 3}), k0({0, 2, 3}), v0({0, 2, 3}), o0({0, 2, 3});
  varlen_forward<double>(o0.view(), {}, {}, q0.cview(), k0.cview(), v0.cview(), none);
  // Values no sequence's call would read are checked all the same: a non-finite sink, a slope.
  const Tensor<double> bad({2}, {0.0, std::nan("")});
  Mask<double> sinks;
  sinks.sinks = bad.cview();
  testing::expect_error([&] { varlen_forward<double>(o0.view(), {}, {}, q0.cview(), k0.cview(), v0.cview(), none, sinks); },
                        {"varlen_forward", "sinks holds nan for head 1"});
  Mask<double> slopes;
  slopes.alibi_slopes = bad.cview();
  testing::expect_error([&] { varlen_forward<double>(o0.view(), {}, {}, q0.cview(), k0.cview(), v0.cview(), none, slopes); },
                        {"varlen_forward", "alibi_slopes holds nan"});
}

// Each bad argument, named.
TEST(Varlen, BadInputsAreNamed) {
  Case c;
  c.nq = {2, 3}, c.nk = {4, 1};
  const Inputs in = make_inputs(c);
  const index_t tq = 5, H = c.H;
  Tensor<double> out({tq, H, c.dv}), lse({H, tq});
  auto expect_error = [&](const VarlenSeqs& s, const Mask<double>& mask, const SdpaOptions& o, const std::string& words,
                          TensorView<const double> q = {}, TensorView<double> lse_arg = {}) {
    try {
      varlen_forward<double>(out.view(), lse_arg, {}, q.empty() ? in.q.cview() : q, in.k.cview(), in.v.cview(), s, mask, o);
      ADD_FAILURE() << "no error for " << words;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  auto cu = [](std::vector<std::int32_t> v) {
    Tensor<std::int32_t> t({static_cast<index_t>(v.size())});
    for (std::size_t i = 0; i < v.size(); ++i) t[static_cast<index_t>(i)] = v[i];
    return t;
  };
  const Tensor<std::int32_t> good_q = cu({0, 2, 5}), good_k = cu({0, 4, 5});
  const Tensor<std::int32_t> from1 = cu({1, 2, 5}), down = cu({0, 3, 2, 5}), short_end = cu({0, 2, 4}),
                             three = cu({0, 1, 2, 5}), down_k = cu({0, 6, 5});
  const Tensor<std::int32_t> matrix({1, 3});
  const SdpaOptions none;
  const Mask<double> plain;
  expect_error({from1.view(), good_k.view(), 3, 4}, plain, none, "cu_seqlens_q[0] is 1");
  expect_error({down.view(), cu({0, 1, 2, 5}).view(), 3, 4}, plain, none, "cu_seqlens_q[2] is 2");
  expect_error({good_q.view(), down_k.view(), 3, 6}, plain, none, "cu_seqlens_k[2] is 5");
  expect_error({short_end.view(), good_k.view(), 3, 4}, plain, none, "cu_seqlens_q ends at 4");
  expect_error({good_q.view(), cu({0, 4, 4}).view(), 3, 4}, plain, none, "cu_seqlens_k ends at 4");
  expect_error({three.view(), good_k.view(), 3, 4}, plain, none, "both must be (B+1,)");
  expect_error({matrix.view(), good_k.view(), 3, 4}, plain, none, "cu_seqlens_q has shape (1,3)");
  expect_error({{}, good_k.view(), 3, 4}, plain, none, "cu_seqlens_q is required");
  expect_error({good_q.view(), good_k.view(), 2, 4}, plain, none, "max_seqlen_q is 2 but sequence 1 has 3 queries");
  expect_error({good_q.view(), good_k.view(), 3, 3}, plain, none, "max_seqlen_k is 3 but sequence 0 has 4 keys");
  expect_error({good_q.view(), good_k.view(), -1, 4}, plain, none, "max_seqlen_q is -1");
  const VarlenSeqs ok{good_q.view(), good_k.view(), 3, 4};
  const Tensor<std::int64_t> lens({2});
  const Tensor<bool> keep({1, 1, 5, 5});
  const Tensor<double> additive({1, 1, 5, 5}), slopes({3, H}), sinks({H + 1});
  const Tensor<std::int32_t> ids({1, 5});
  Mask<double> m;
  m.valid_lens = lens.view();
  expect_error(ok, m, none, "valid_lens");
  m = {}, m.keep = keep.view();
  expect_error(ok, m, none, "mask (keep)");
  m = {}, m.additive = additive.view();
  expect_error(ok, m, none, "additive mask");
  m = {}, m.segment_ids_q = ids.view();
  expect_error(ok, m, none, "segment_ids");
  m = {}, m.alibi_slopes = slopes.view();
  expect_error(ok, m, none, "alibi_slopes has shape (3,4)");
  m = {}, m.sinks = sinks.view();
  expect_error(ok, m, none, "sinks has shape (5,)");
  m = {}, m.causal = Causal::top_left, m.align = Align::bottom_right;
  expect_error(ok, m, none, "sequence 0");
  SdpaOptions o;
  o.softcap = -1.0;
  expect_error(ok, plain, o, "softcap is -1");
  o = {}, o.dropout.p = 1.0;
  expect_error(ok, plain, o, "dropout p is 1");
  const Tensor<double> q2d({5, 16}), q_wrong_d({5, H, 3}), q_rows({6, H, 16}), q_heads({5, 3, 16});
  expect_error(ok, plain, none, "queries has shape (5,16)", q2d.cview());
  expect_error(ok, plain, none, "keys has shape", q_wrong_d.cview());
  expect_error(ok, plain, none, "cu_seqlens_q ends at 5 but queries has 6 rows", q_rows.cview());
  expect_error(ok, plain, none, "multiple of the key heads", q_heads.cview());
  Tensor<double> bad_lse({tq, H});
  expect_error(ok, plain, none, "lse has shape (5,4)", {}, bad_lse.view());
  // out over queries; the backward's arguments.
  try {
    varlen_forward<double>(TensorView<double>(const_cast<double*>(in.q.data()), {tq, H, c.dv}), {}, {}, in.q.cview(),
                           in.k.cview(), in.v.cview(), ok);
    ADD_FAILURE() << "out over queries";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("share memory"), std::string::npos) << e.what();
  }
  Tensor<double> ds({H}), dq(in.q.shape()), bad_dk({4, H, 16});
  EXPECT_THROW(varlen_backward<double>({}, {}, {}, in.g.cview(), in.q.cview(), in.k.cview(), in.v.cview(), {}, {}, ok,
                                       plain, none, ds.view()),
               Error);  // dsinks without sinks
  try {
    varlen_backward<double>(dq.view(), bad_dk.view(), {}, in.g.cview(), in.q.cview(), in.k.cview(), in.v.cview(), {}, {},
                            ok);
    ADD_FAILURE() << "dkeys of a wrong shape";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("varlen_backward: dkeys has shape (4,4,16)"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace attn
