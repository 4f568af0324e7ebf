// How src/ forms addresses from strides (src/core/view4.hpp): detail::step, the one way a TensorView
// is stepped by an index, and detail::to_view4's canonical views. No address is formed from a stride
// that was not checked, and a tensor of no element (whose strides nothing bounds) is never stepped.
// Each fault the fuzzers found here has its input in fuzz/corpus/api (finding7_*, finding8_*) and a
// test below; under clang's UBSan (CI's sanitizer build) an overflowing address is a failure.
#include <cmath>
#include <cstdint>
#include <limits>

#include "attn/additive.hpp"
#include "attn/config.hpp"
#include "attn/kv_cache.hpp"
#include "core/view4.hpp"
#include "support/testing.hpp"

namespace attn {
namespace {

using testing::expect_error;
using testing::random_tensor;

constexpr index_t kHuge = index_t{1} << 60;  // a stride whose step leaves any address space

TEST(Step, GivesTheSubViewAtAnIndexOfTheFirstDimension) {
  Tensor<float> t = random_tensor<float>({3, 4, 5}, 1);
  const TensorView<float> s = detail::step(t.view(), 2, "op", "t");
  ASSERT_EQ(s.rank(), 2);
  EXPECT_EQ(s.dim(0), 4);
  EXPECT_EQ(s.dim(1), 5);
  EXPECT_EQ(s.data(), t.data() + 2 * 20);
  EXPECT_EQ(s.stride(0), 5);
  EXPECT_EQ(s(3, 4), t(2, 3, 4));
}

TEST(Step, RefusesAnIndexOutsideTheFirstDimension) {
  Tensor<float> t({2, 3});
  expect_error([&] { detail::step(t.view(), 2, "op", "t"); }, {"op: t has shape (2,3)", "index 2"});
  expect_error([&] { detail::step(t.view(), -1, "op", "t"); }, {"index -1"});
}

TEST(Step, RefusesAStrideNobodyChecked) {
  float data[8] = {};
  // A negative batch stride: its step would leave the tensor's memory.
  const TensorView<const float> negative(data + 4, {2, 4}, {-4, 1});
  expect_error([&] { detail::step(negative, 1, "op", "slopes"); }, {"op: slopes has stride -4 in dimension 0", "must not be negative"});
  // An extent past what a 64-bit index holds.
  const TensorView<const float> overflowing(data, {3, 4}, {std::numeric_limits<index_t>::max() / 2 + 1, 1});
  expect_error([&] { detail::step(overflowing, 1, "op", "t"); }, {"spans more elements than a 64-bit index holds"});
}

TEST(Step, KeepsTheDataOfATensorOfNoElement) {
  float data[1] = {};
  // (3, 0): no element, so any stride is valid and none may be used.
  const TensorView<const float> t(data, {3, 0}, {kHuge, 1});
  const TensorView<const float> s = detail::step(t, 2, "op", "t");
  EXPECT_EQ(s.data(), data);
  EXPECT_EQ(s.dim(0), 0);
}

TEST(ToView4, GivesATensorOfNoElementStridesZero) {
  float data[1] = {};
  // (2, 3, 4, 0): rows of no column, with strides that overflow any address they are added to.
  const TensorView<const float> t(data, {2, 3, 4, 0}, {kHuge, kHuge / 4, kHuge / 16, 1});
  const View4<const float> v = detail::to_view4(t, "op", "t");
  EXPECT_EQ(v.B, 2);
  EXPECT_EQ(v.R, 4);
  EXPECT_EQ(v.C, 0);
  EXPECT_EQ(v.sB, 0);
  EXPECT_EQ(v.sH, 0);
  EXPECT_EQ(v.sR, 0);
  EXPECT_EQ(v.row(1, 2, 3), data);
}

TEST(ToView4, KeepsTheStridesOfATensorWithElements) {
  Tensor<float> t = random_tensor<float>({2, 3, 4}, 2);
  const View4<const float> v = detail::to_view4(TensorView<const float>(t.view()), "op", "t");
  EXPECT_EQ(v.sB, 12);
  EXPECT_EQ(v.sH, 0);
  EXPECT_EQ(v.sR, 4);
  EXPECT_EQ(v.row(1, 0, 2), t.data() + 12 + 8);
}

// The fault clang's UBSan reported (fuzz/corpus/api/finding8_*): additive attention's backward
// with values of width 0 formed the address of each row of dout, a tensor of no element whose row
// stride overflowed the address space. Now computes: every gradient 0 (the output is empty).
TEST(EmptyTensorStrides, AdditiveBackwardWithValuesOfWidthZeroComputes) {
  const index_t B = 2, n = 3, m = 4, q = 2, k = 3, h = 5;
  const Tensor<double> queries = random_tensor<double>({B, n, q}, 3), keys = random_tensor<double>({B, m, k}, 4);
  const AdditiveWeights<double> w = AdditiveWeights<double>::init(q, k, h, 5);
  double none[1] = {};
  const TensorView<const double> values(none, {B, m, 0}, {kHuge, kHuge / 8, 1});
  const TensorView<const double> dout(none, {B, n, 0}, {kHuge, kHuge / 8, 1});
  Tensor<double> dq({B, n, q}), dk({B, m, k}), gq({h, q}), gk({h, k}), gv({h});
  additive_attention_backward<double>(dq.view(), dk.view(), {}, {gq.view(), gk.view(), gv.view()}, dout,
                                      queries.view(), keys.view(), values, w.params());
  for (index_t i = 0; i < dq.numel(); ++i) EXPECT_EQ(dq.data()[i], 0.0);
  for (index_t i = 0; i < gv.numel(); ++i) EXPECT_EQ(gv.data()[i], 0.0);
}

// An owning Tensor of no element has no storage (a null data pointer); given as out, it is an output
// of no element, not an output left out: additive attention with values of width 0 computes its
// weights (those of the reference) and writes nothing to out.
TEST(EmptyTensorStrides, AnOwningOutputOfNoElementIsGiven) {
  const index_t B = 2, n = 3, m = 4, q = 2, k = 3, h = 5;
  const Tensor<double> queries = random_tensor<double>({B, n, q}, 6), keys = random_tensor<double>({B, m, k}, 7);
  const Tensor<double> values({B, m, 0});
  const AdditiveWeights<double> w = AdditiveWeights<double>::init(q, k, h, 8);
  Tensor<double> out({B, n, 0}), weights({B, n, m}), want({B, n, m}), want_out({B, n, 0});
  EXPECT_EQ(out.data(), nullptr);
  additive_attention_forward<double>(out.view(), weights.view(), queries.view(), keys.view(), values.view(),
                                     w.params());
  {
    const ScopedBackend reference(Backend::reference);
    additive_attention_forward<double>(want_out.view(), want.view(), queries.view(), keys.view(), values.view(),
                                       w.params());
  }
  for (index_t i = 0; i < want.numel(); ++i) EXPECT_NEAR(weights.data()[i], want.data()[i], 1e-14);
  EXPECT_NEAR(weights.data()[0] + weights.data()[1] + weights.data()[2] + weights.data()[3], 1.0, 1e-14);
}

// The fault api_fuzz found (fuzz/corpus/api/finding10_*): KvCache::attend of one sequence over an
// int8 cache read its queries element by element, to round them as the decode does, before anything
// had checked their strides; a negative one formed an address below the data. Now refused first,
// naming the argument; the same queries with valid strides attend.
TEST(KvCacheAttend, RefusesQueriesOfOneSequenceWithANegativeStride) {
  const index_t heads = 2, n = 6, d = 32;  // n > kDecodeRows: the prompt path, which rounds a copy
  KvCache cache(1, heads, d, {.dtype = KvDtype::int8, .block_size = 4});
  const Tensor<float> kv = random_tensor<float>({1, heads, 5, d}, 8);
  cache.append(kv.view(), kv.view());
  const Tensor<float> queries = random_tensor<float>({heads, n, d}, 9);
  Tensor<float> out({heads, n, d});
  const TensorView<const float> backwards(queries.data() + heads * n * d - d, {heads, n, d}, {n * d, -d, 1});
  expect_error([&] { cache.attend(out.view(), 0, backwards); },
               {"KvCache::attend: queries has stride -32 in dimension 1", "must not be negative"});
  const TensorView<float> out_backwards(out.data() + heads * n * d - d, {heads, n, d}, {n * d, -d, 1});
  expect_error([&] { cache.attend(out_backwards, 0, queries.view()); },
               {"KvCache::attend: out has stride -32 in dimension 1", "must not be negative"});
  cache.attend(out.view(), 0, queries.view());
  for (index_t e = 0; e < out.numel(); ++e) ASSERT_TRUE(std::isfinite(out[e])) << e;
}

// The fault api_fuzz found (fuzz/corpus/api/finding7_*): KvCache::attend over every sequence formed
// the row of (batch, heads) ALiBi slopes through their batch stride, unchecked; a negative one
// overflowed. Now refused, naming the argument; slopes with a valid stride still attend.
TEST(KvCacheAttend, RefusesSlopesOfEverySequenceWithANegativeBatchStride) {
  const index_t batch = 2, heads = 2, d = 4;
  KvCache cache(batch, heads, d, {.block_size = 4});
  const Tensor<float> kv = random_tensor<float>({batch, heads, 5, d}, 6);
  cache.append(kv.view(), kv.view());
  const Tensor<float> queries = random_tensor<float>({batch, heads, 6, d}, 7);  // n > kDecodeRows: per sequence
  Tensor<float> out({batch, heads, 6, d});
  float slopes[4] = {0.5f, 0.25f, 0.5f, 0.25f};
  KvAttendOptions options;
  options.alibi_slopes = TensorView<const float>(slopes + 2, {batch, heads}, {-2, 1});
  expect_error([&] { cache.attend(out.view(), queries.view(), options); },
               {"KvCache::attend: alibi_slopes has stride -2 in dimension 0", "must not be negative"});
  options.alibi_slopes = TensorView<const float>(slopes, {batch, heads}, {2, 1});
  cache.attend(out.view(), queries.view(), options);
  Tensor<float> one({heads, 6, d});
  KvAttendOptions first;
  first.alibi_slopes = TensorView<const float>(slopes, {heads});
  cache.attend(one.view(), 1, TensorView<const float>(queries.data() + heads * 6 * d, {heads, 6, d}), first);
  for (index_t i = 0; i < one.numel(); ++i) EXPECT_EQ(out.data()[heads * 6 * d + i], one.data()[i]);
}

}  // namespace
}  // namespace attn
