// Every op with a backward, on shapes that cross every boundary between the cpu kernels' paths:
// 1 to 5 queries (the SDPA decode path up to fused::kDecodeRows, query blocks above), no batch,
// heads, queries or keys at all, one query
// block less, exactly and more (kBlockQ), key tiles (kBlockK), the decode path's tiles and key
// chunks, the Nadaraya-Watson chunks, and value widths from 1 to 1024. Each result and gradient
// against the float64 reference under the error budget of STYLE.md, and bit-identical at 1 and 2
// threads. The SDPA backward runs with and without the forward's out and lse (without out it runs
// the forward itself, nested in its own call), and with each subset of the gradients.
//
// This suite runs on every SIMD target (tests/CMakeLists.txt) and under the sanitizers; its cases
// found the backward without out returning wrong gradients for n <= 4 and wide values.
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "attn/additive.hpp"
#include "attn/bilinear.hpp"
#include "attn/bmm.hpp"
#include "attn/nadaraya_watson.hpp"
#include "attn/sdpa.hpp"
#include "attn/softmax.hpp"
#include "cpu/simd/fused.hpp"
#include "support/testing.hpp"

namespace attn {
namespace {

using testing::convert;
using testing::random_tensor;

// B batch, H heads, n queries, m keys, d query (and key) size, v value size.
struct Shape {
  index_t B, H, n, m, d, v;
};

std::string shape_name(const Shape& s) {
  std::ostringstream os;
  os << "B" << s.B << "_H" << s.H << "_n" << s.n << "_m" << s.m << "_d" << s.d << "_v" << s.v;
  return os.str();
}
// gtest prints a case by its name.
void PrintTo(const Shape& s, std::ostream* os) { *os << shape_name(s); }

// The cpu backend's results against the float64 reference: in float32 within the error budget of
// the float32 reference, in float64 within 1e-12 of the largest element; then bit-identical at 1
// and 2 threads. `run` is a generic lambda `[&]<class T>() -> std::vector<Tensor<T>>`.
template <class Run>
void expect_matches_reference(const Run& run) {
  std::vector<Tensor<double>> oracle, cpu64;
  std::vector<Tensor<float>> ref32, cpu32;
  {
    ScopedBackend reference(Backend::reference);
    oracle = run.template operator()<double>();
    ref32 = run.template operator()<float>();
  }
  {
    ScopedBackend cpu(Backend::cpu);
    cpu64 = run.template operator()<double>();
    cpu32 = run.template operator()<float>();
  }
  ASSERT_EQ(oracle.size(), cpu32.size());
  for (std::size_t i = 0; i < oracle.size(); ++i) {
    double largest = 0;
    for (index_t e = 0; e < oracle[i].numel(); ++e)
      if (std::isfinite(oracle[i][e])) largest = std::max(largest, std::abs(oracle[i][e]));
    EXPECT_TRUE(testing::within_error_budget(cpu32[i], ref32[i], oracle[i])) << "result " << i << " in float32";
    EXPECT_LE(testing::max_abs_diff(cpu64[i], oracle[i]), 1e-12 * (1 + largest)) << "result " << i << " in float64";
  }
  testing::expect_same_at_1_and_2_threads<float>([&] { return run.template operator()<float>(); });
}

// ---- scaled dot-product attention ---------------------------------------------------------------

// Shapes with nothing to compute, on both sides of the decode/tiled boundary: B, H, n or m of 0.
std::vector<Shape> empty_shapes() {
  return {{0, 2, 3, 600, 17, 9}, {0, 1, 65, 130, 3, 2}, {2, 0, 3, 10, 2, 4}, {2, 0, 65, 70, 2, 4},
          {1, 2, 0, 70, 5, 3},   {1, 2, 3, 0, 5, 3},    {1, 2, 65, 0, 5, 3}};
}

// The shapes of the sweep. The d2l chapter's example (2 batches of 10 keys of size 2) with 1 to 5 queries
// and values of 1 to 1024; the decode path's chunks (at least 256 keys each) and tiles
// (kDecodeTile) on both sides of the decode/tiled boundary; query blocks and key tiles one short,
// exact and one over; wide values on the tiled and decode paths.
std::vector<Shape> sdpa_shapes() {
  static_assert(cpu::fused::kDecodeRows == 4 && cpu::fused::kBlockQ == 64 && cpu::fused::kBlockK == 64 &&
                    cpu::fused::kDecodeTile == 512,
                "the sweep's shapes sit on these boundaries");
  std::vector<Shape> s;
  for (index_t n = 1; n <= 5; ++n)
    for (index_t v : {1, 4, 256, 1024}) s.push_back({2, 1, n, 10, 2, v});
  for (index_t n : {4, 5})
    for (index_t m : {255, 256, 257, 513, 1300}) s.push_back({1, 2, n, m, 17, 9});
  for (index_t n : {63, 64, 65, 129})
    for (index_t m : {1, 63, 64, 65}) s.push_back({1, 2, n, m, 5, 3});
  s.push_back({2, 1, 65, 130, 3, 1});
  s.push_back({1, 1, 65, 70, 64, 1024});
  s.push_back({1, 2, 3, 600, 128, 1024});
  // Nothing to compute: a batch, heads, queries or keys of none, on the decode and tiled paths (a
  // batch of none once divided by zero when the key chunks were sized).
  for (const Shape& empty : empty_shapes()) s.push_back(empty);
  return s;
}

// Two masks: none, and per-batch valid lengths with a bottom-right causal mask (every path's
// key limits; the last rows of a decode step see all of their valid keys).
enum class SweepMask { none, lens_causal };

template <class T>
struct SdpaInputs {
  Tensor<T> q, k, v, g;
  Tensor<std::int64_t> lens;
  Mask<T> mask;
  SdpaInputs(const Shape& s, SweepMask which)
      : q(convert<T>(random_tensor<double>({s.B, s.H, s.n, s.d}, 11))),
        k(convert<T>(random_tensor<double>({s.B, s.H, s.m, s.d}, 12))),
        v(convert<T>(random_tensor<double>({s.B, s.H, s.m, s.v}, 13))),
        g(convert<T>(random_tensor<double>({s.B, s.H, s.n, s.v}, 14))), lens({s.B}) {
    for (index_t b = 0; b < s.B; ++b) lens[b] = b == 0 ? s.m : (s.m + 1) / 2;
    if (which == SweepMask::lens_causal) {
      mask.valid_lens = lens.view();
      mask.causal = Causal::bottom_right;
    }
  }
};

// out and lse, then (dq, dk, dv) with out and lse, with out only, with lse only, with neither;
// dq alone without out or lse (the nested forward, and no key gradients); dk and dv alone.
template <class T>
std::vector<Tensor<T>> run_sdpa(const Shape& s, SweepMask which) {
  const SdpaInputs<T> in(s, which);
  Tensor<T> out({s.B, s.H, s.n, s.v}), lse({s.B, s.H, s.n});
  sdpa_forward<T>(out.view(), lse.view(), {}, in.q.view(), in.k.view(), in.v.view(), in.mask);
  std::vector<Tensor<T>> r{out, lse};
  const TensorView<const T> none;
  for (const auto& [o, l] : {std::pair{out.cview(), lse.cview()}, std::pair{out.cview(), none},
                             std::pair{none, lse.cview()}, std::pair{none, none}}) {
    Tensor<T> dq(in.q.shape()), dk(in.k.shape()), dv(in.v.shape());
    sdpa_backward<T>(dq.view(), dk.view(), dv.view(), in.g.view(), in.q.view(), in.k.view(), in.v.view(), o, l,
                     in.mask);
    r.insert(r.end(), {dq, dk, dv});
  }
  Tensor<T> dq(in.q.shape()), dk(in.k.shape()), dv(in.v.shape());
  sdpa_backward<T>(dq.view(), {}, {}, in.g.view(), in.q.view(), in.k.view(), in.v.view(), {}, {}, in.mask);
  sdpa_backward<T>({}, dk.view(), dv.view(), in.g.view(), in.q.view(), in.k.view(), in.v.view(), out.view(),
                   lse.view(), in.mask);
  r.insert(r.end(), {dq, dk, dv});
  return r;
}

class SdpaSweep : public ::testing::TestWithParam<Shape> {};

TEST_P(SdpaSweep, EveryBackwardVariantMatchesTheReference) {
  for (SweepMask which : {SweepMask::none, SweepMask::lens_causal}) {
    SCOPED_TRACE(which == SweepMask::none ? "no mask" : "valid lengths and bottom-right causal");
    expect_matches_reference([&]<class T>() { return run_sdpa<T>(GetParam(), which); });
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, SdpaSweep, ::testing::ValuesIn(sdpa_shapes()),
                         [](const auto& info) { return shape_name(info.param); });

// ---- additive and bilinear attention ----------------------------------------------------------
// Queries of size d, keys of size d + 3, hidden size h = d + 2 (bilinear: W (d, d + 3)).
std::vector<Shape> qkv_shapes() {
  std::vector<Shape> s;
  for (index_t n = 1; n <= 5; ++n)
    for (index_t v : {1, 256, 1024}) s.push_back({2, 1, n, 10, 2, v});
  for (index_t n : {63, 64, 65})
    for (index_t m : {1, 64, 65, 130}) s.push_back({1, 2, n, m, 5, 3});
  s.push_back({1, 1, 65, 70, 9, 1024});
  for (const Shape& empty : empty_shapes()) s.push_back(empty);
  return s;
}

template <class T>
std::vector<Tensor<T>> run_additive(const Shape& s) {
  const index_t q = s.d, k = s.d + 3, h = s.d + 2;
  const Tensor<T> queries = convert<T>(random_tensor<double>({s.B, s.H, s.n, q}, 21));
  const Tensor<T> keys = convert<T>(random_tensor<double>({s.B, s.H, s.m, k}, 22));
  const Tensor<T> values = convert<T>(random_tensor<double>({s.B, s.H, s.m, s.v}, 23));
  const Tensor<T> g = convert<T>(random_tensor<double>({s.B, s.H, s.n, s.v}, 24));
  const Tensor<T> w_q = convert<T>(random_tensor<double>({h, q}, 25)), w_k = convert<T>(random_tensor<double>({h, k}, 26));
  const Tensor<T> w_v = convert<T>(random_tensor<double>({h}, 27));
  const AdditiveParams<T> params{w_q.view(), w_k.view(), w_v.view()};
  Tensor<T> out(g.shape());
  additive_attention_forward<T>(out.view(), {}, queries.view(), keys.view(), values.view(), params);
  Tensor<T> dq(queries.shape()), dk(keys.shape()), dv(values.shape()), dwq(w_q.shape()), dwk(w_k.shape()),
      dwv(w_v.shape());
  additive_attention_backward<T>(dq.view(), dk.view(), dv.view(), {dwq.view(), dwk.view(), dwv.view()}, g.view(),
                                 queries.view(), keys.view(), values.view(), params);
  // The parameters' gradients alone.
  Tensor<T> dwq2(w_q.shape()), dwk2(w_k.shape()), dwv2(w_v.shape());
  additive_attention_backward<T>({}, {}, {}, {dwq2.view(), dwk2.view(), dwv2.view()}, g.view(), queries.view(),
                                 keys.view(), values.view(), params);
  return {out, dq, dk, dv, dwq, dwk, dwv, dwq2, dwk2, dwv2};
}

template <class T>
std::vector<Tensor<T>> run_bilinear(const Shape& s) {
  const index_t q = s.d, k = s.d + 3;
  const Tensor<T> queries = convert<T>(random_tensor<double>({s.B, s.H, s.n, q}, 31));
  const Tensor<T> keys = convert<T>(random_tensor<double>({s.B, s.H, s.m, k}, 32));
  const Tensor<T> values = convert<T>(random_tensor<double>({s.B, s.H, s.m, s.v}, 33));
  const Tensor<T> g = convert<T>(random_tensor<double>({s.B, s.H, s.n, s.v}, 34));
  const Tensor<T> w = convert<T>(random_tensor<double>({q, k}, 35));
  Tensor<T> out(g.shape());
  bilinear_attention_forward<T>(out.view(), {}, queries.view(), keys.view(), values.view(), w.view());
  Tensor<T> dq(queries.shape()), dk(keys.shape()), dv(values.shape()), dw(w.shape());
  bilinear_attention_backward<T>(dq.view(), dk.view(), dv.view(), dw.view(), g.view(), queries.view(), keys.view(),
                                 values.view(), w.view());
  return {out, dq, dk, dv, dw};
}

class QkvSweep : public ::testing::TestWithParam<Shape> {};

TEST_P(QkvSweep, AdditiveMatchesTheReference) {
  expect_matches_reference([&]<class T>() { return run_additive<T>(GetParam()); });
}
TEST_P(QkvSweep, BilinearMatchesTheReference) {
  expect_matches_reference([&]<class T>() { return run_bilinear<T>(GetParam()); });
}

INSTANTIATE_TEST_SUITE_P(Shapes, QkvSweep, ::testing::ValuesIn(qkv_shapes()),
                         [](const auto& info) { return shape_name(info.param); });

// ---- Nadaraya-Watson, masked softmax, bmm -------------------------------------------------------
// Nadaraya-Watson with d = 1 (the windowed path, chunks of 256 queries and keys) and d = 2 (the
// dense path); queries and keys in [0, 4), width 0.3.
std::vector<Shape> nw_shapes() {
  std::vector<Shape> s;
  for (index_t n = 1; n <= 5; ++n)
    for (index_t v : {1, 1024}) s.push_back({2, 1, n, 10, 1, v});
  for (index_t n : {255, 256, 257})
    for (index_t m : {1, 256, 257}) s.push_back({1, 2, n, m, 1, 2});
  s.push_back({1, 2, 65, 70, 2, 1024});
  s.push_back({2, 1, 5, 300, 2, 3});
  for (const Shape& empty : empty_shapes())
    for (index_t d : {1, 2}) s.push_back({empty.B, empty.H, empty.n, empty.m, d, empty.v});
  return s;
}

template <class T>
std::vector<Tensor<T>> run_nw(const Shape& s, Kernel kernel) {
  const Tensor<T> q = convert<T>(random_tensor<double>({s.B, s.H, s.n, s.d}, 41, 0, 4));
  const Tensor<T> k = convert<T>(random_tensor<double>({s.B, s.H, s.m, s.d}, 42, 0, 4));
  const Tensor<T> v = convert<T>(random_tensor<double>({s.B, s.H, s.m, s.v}, 43));
  const Tensor<T> g = convert<T>(random_tensor<double>({s.B, s.H, s.n, s.v}, 44));
  const T sigma = T(0.3);
  Tensor<T> out(g.shape());
  nadaraya_watson_forward<T>(out.view(), {}, q.view(), k.view(), v.view(), kernel, sigma);
  Tensor<T> dq(q.shape()), dk(k.shape()), dv(v.shape());
  nadaraya_watson_backward<T>(dq.view(), dk.view(), dv.view(), nullptr, g.view(), q.view(), k.view(), v.view(),
                              kernel, sigma);
  return {out, dq, dk, dv};
}

class NwSweep : public ::testing::TestWithParam<Shape> {};

TEST_P(NwSweep, EveryKernelMatchesTheReference) {
  for (Kernel kernel : {Kernel::gaussian, Kernel::boxcar, Kernel::epanechnikov, Kernel::constant}) {
    SCOPED_TRACE(kernel_name(kernel));
    expect_matches_reference([&]<class T>() { return run_nw<T>(GetParam(), kernel); });
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, NwSweep, ::testing::ValuesIn(nw_shapes()),
                         [](const auto& info) { return shape_name(info.param); });

// Softmax over scores (B, H, n, m) with per-query valid lengths, and bmm out = a b^T with a
// (B, H, n, d), b (B, H, v, d) and their gradients, on the SDPA sweep's small shapes.
template <class T>
std::vector<Tensor<T>> run_softmax_bmm(const Shape& s) {
  const Tensor<T> scores = convert<T>(random_tensor<double>({s.B, s.H, s.n, s.m}, 51, -3, 3));
  const Tensor<T> dw = convert<T>(random_tensor<double>({s.B, s.H, s.n, s.m}, 52));
  Tensor<std::int64_t> lens({s.B, s.n});
  for (index_t i = 0; i < lens.numel(); ++i) lens[i] = (i * 7) % (s.m + 1);
  Mask<T> mask;
  mask.valid_lens = lens.view();
  Tensor<T> w(scores.shape()), ds(scores.shape());
  masked_softmax_forward<T>(w.view(), scores.view(), mask);
  masked_softmax_backward<T>(ds.view(), dw.view(), w.view(), mask);
  const Tensor<T> a = convert<T>(random_tensor<double>({s.B, s.H, s.n, s.d}, 53));
  const Tensor<T> b = convert<T>(random_tensor<double>({s.B, s.H, s.v, s.d}, 54));
  const Tensor<T> g = convert<T>(random_tensor<double>({s.B, s.H, s.n, s.v}, 55));
  Tensor<T> out(g.shape()), da(a.shape()), db(b.shape());
  bmm_forward<T>(out.view(), a.view(), b.view(), false, true);
  bmm_backward<T>(da.view(), db.view(), g.view(), a.view(), b.view(), false, true);
  return {w, ds, out, da, db};
}

class SoftmaxBmmSweep : public ::testing::TestWithParam<Shape> {};

TEST_P(SoftmaxBmmSweep, MatchesTheReference) {
  expect_matches_reference([&]<class T>() { return run_softmax_bmm<T>(GetParam()); });
}

INSTANTIATE_TEST_SUITE_P(Shapes, SoftmaxBmmSweep, ::testing::ValuesIn(qkv_shapes()),
                         [](const auto& info) { return shape_name(info.param); });

}  // namespace
}  // namespace attn
