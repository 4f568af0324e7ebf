// bmm: the d2l chapter's example, every transpose against the float64 reference, gradients, bad input.
#include "attn/bmm.hpp"

#include <cmath>

#include "support/testing.hpp"

namespace attn {
namespace {

using testing::convert;
using testing::random_tensor;

// out = bmm(a, b) and its gradients da, db for dout = g, in precision T.
template <class T>
std::vector<Tensor<T>> forward_and_backward(const Tensor<float>& a, const Tensor<float>& b, const Tensor<float>& g,
                                            bool ta, bool tb) {
  const Tensor<T> at = convert<T>(a), bt = convert<T>(b);
  const Tensor<T> out = bmm<T>(at.view(), bt.view(), ta, tb);
  Tensor<T> da(std::span<const index_t>(a.shape())), db(std::span<const index_t>(b.shape()));
  bmm_backward<T>(da.view(), db.view(), convert<T>(g).view(), at.view(), bt.view(), ta, tb);
  return {out, da, db};
}

TEST(Bmm, D2lExampleOnes) {
  // torch.bmm(ones(2, 3, 4), ones(2, 4, 6)) is (2, 3, 6), every entry 4.
  Tensor<float> a({2, 3, 4}), b({2, 4, 6});
  for (index_t i = 0; i < a.numel(); ++i) a[i] = 1;
  for (index_t i = 0; i < b.numel(); ++i) b[i] = 1;
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    ScopedBackend use(backend);
    const Tensor<float> c = bmm<float>(a.view(), b.view());
    EXPECT_EQ(c.shape(), (std::vector<index_t>{2, 3, 6}));
    for (index_t i = 0; i < c.numel(); ++i) EXPECT_EQ(c[i], 4.0f);
  }
}

TEST(Bmm, EveryTransposeMatchesFloat64ReferenceForwardAndBackward) {
  const index_t B = 2, H = 3, r = 113, k = 59, c = 37;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "transpose_a=" << ta << " transpose_b=" << tb);
      const Tensor<float> a = random_tensor<float>(ta ? std::vector<index_t>{B, H, k, r} : std::vector<index_t>{B, H, r, k}, 1);
      const Tensor<float> b = random_tensor<float>(tb ? std::vector<index_t>{B, H, c, k} : std::vector<index_t>{B, H, k, c}, 2);
      const Tensor<float> g = random_tensor<float>({B, H, r, c}, 3);
      auto run = [&]<class T>() { return forward_and_backward<T>(a, b, g, ta, tb); };
      testing::expect_cpu_matches_reference(run);
    }
}

// Many small items (in parallel, one a thread), one large item (its rows over the threads) and two
// large items at 2 threads (fewer than two a thread: each spread): the same bits at 1 and 2 threads,
// each within float32's error budget of the float64 reference, forward and backward.
TEST(Bmm, ResultsDoNotDependOnThreadsOrHowItemsAreSplit) {
  struct Case { index_t items, r, k, c; };
  for (const Case z : {Case{6, 113, 59, 37}, Case{1, 301, 203, 150}, Case{2, 150, 131, 97}})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "items " << z.items << " transpose_a=" << ta << " transpose_b=" << tb);
        const Tensor<float> a = random_tensor<float>(ta ? std::vector<index_t>{z.items, z.k, z.r} : std::vector<index_t>{z.items, z.r, z.k}, 11);
        const Tensor<float> b = random_tensor<float>(tb ? std::vector<index_t>{z.items, z.c, z.k} : std::vector<index_t>{z.items, z.k, z.c}, 12);
        const Tensor<float> g = random_tensor<float>({z.items, z.r, z.c}, 13);
        auto run = [&]<class T>() { return forward_and_backward<T>(a, b, g, ta, tb); };
        testing::expect_same_at_1_and_2_threads<float>([&] { return forward_and_backward<float>(a, b, g, ta, tb); });
        testing::expect_cpu_matches_reference(run);
      }
}

// As torch.bmm: a NaN or an Inf of one operand reaches every output entry that sums over it, even
// through a zero of the other operand.
TEST(Bmm, NonFiniteEntriesReachTheirOutputs) {
  Tensor<float> a({1, 2, 3}), b({1, 3, 2});
  a(0, 0, 1) = NAN;         // row 0 of out: NaN in both columns (b is all zeros)
  a(0, 1, 2) = INFINITY;    // row 1: Inf x 0 = NaN
  const Tensor<float> out = bmm<float>(a.view(), b.view());
  for (index_t i = 0; i < 2; ++i)
    for (index_t j = 0; j < 2; ++j) EXPECT_TRUE(std::isnan(out(0, i, j))) << i << ", " << j;
}

TEST(Bmm, BackwardMatchesFiniteDifferences) {
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (Backend backend : {Backend::reference, Backend::cpu}) {
        ScopedBackend use(backend);
        Tensor<double> a = random_tensor<double>(ta ? std::vector<index_t>{2, 4, 3} : std::vector<index_t>{2, 3, 4}, 4);
        Tensor<double> b = random_tensor<double>(tb ? std::vector<index_t>{2, 5, 4} : std::vector<index_t>{2, 4, 5}, 5);
        const Tensor<double> g = random_tensor<double>({2, 3, 5}, 6);
        Tensor<double> da(std::span<const index_t>(a.shape())), db(std::span<const index_t>(b.shape()));
        bmm_backward<double>(da.view(), db.view(), g.view(), a.view(), b.view(), ta, tb);
        auto loss = [&] { return testing::dot(bmm<double>(a.view(), b.view(), ta, tb), g); };
        std::string where;
        EXPECT_LT(testing::gradient_error(da.values(), testing::numeric_gradient(loss, a.values()), &where), 1e-8) << where;
        EXPECT_LT(testing::gradient_error(db.values(), testing::numeric_gradient(loss, b.values()), &where), 1e-8) << where;
      }
}

TEST(Bmm, StridedBatchViewsNeedNoCopy) {
  // a (2, 3, 4) stored with a gap after every batch item: only the last dimension is contiguous.
  const Tensor<float> storage = random_tensor<float>({2 * 16}, 7);
  const TensorView<const float> a(storage.data(), {2, 3, 4}, {16, 4, 1});
  Tensor<float> dense({2, 3, 4});
  for (index_t bi = 0; bi < 2; ++bi)
    for (index_t i = 0; i < 3; ++i)
      for (index_t j = 0; j < 4; ++j) dense(bi, i, j) = a(bi, i, j);
  const Tensor<float> b = random_tensor<float>({2, 4, 5}, 8);
  EXPECT_EQ(bmm<float>(a, b.view()).values(), bmm<float>(dense.view(), b.view()).values());
}

TEST(Bmm, BadInputNamesTheArgumentAndTheRule) {
  const Tensor<float> a({2, 3, 4}), b({2, 5, 6}), b_batch({3, 4, 6}), b4({2, 1, 4, 6});
  testing::expect_error([&] { bmm<float>(a.view(), b.view()); }, {"bmm", "a has shape (2,3,4)", "b has shape (2,5,6)", "inner dimensions 4 and 5 must match"});
  testing::expect_error([&] { bmm<float>(a.view(), b_batch.view()); }, {"batch dimensions must match"});
  testing::expect_error([&] { bmm<float>(a.view(), b4.view()); }, {"b has shape (2,1,4,6)", "same rank"});
  Tensor<float> out({2, 3, 5});
  const Tensor<float> b_ok({2, 4, 6});
  testing::expect_error([&] { bmm_forward<float>(out.view(), a.view(), b_ok.view()); }, {"bmm_forward: out has shape (2,3,5) but must be (2,3,6)"});
  testing::expect_error([&] { bmm_forward<float>({}, a.view(), b_ok.view()); }, {"out is required"});
}

}  // namespace
}  // namespace attn
