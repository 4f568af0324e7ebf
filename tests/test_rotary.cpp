// Rotary position embeddings (attn/rotary.hpp) against a float64 reference written from
// FlashAttention's torch formula (x cos + rotate_half(x) sin, the tables repeated over the rotated
// features), not from the kernel's pairs: both layouts, rotary_dim < head_dim, an offset, per-sequence
// offsets (int32 and int64), the varlen form (an empty sequence among them), strided x, in place,
// bfloat16 and float16, the inverse undoing the forward, the backward by finite differences, threads,
// and every bad argument.
#include <cmath>
#include <cstdint>
#include <vector>

#include "attn/half.hpp"
#include "attn/rotary.hpp"
#include "support/rotary_reference.hpp"
#include "support/testing.hpp"

namespace attn {
namespace {

using testing::expect_error;
using testing::random_tensor;
using testing::rotary_reference;
using testing::rope_tables;

// Positions and options spelt out (designated initializers would leave members unnamed).
RotaryPositions at_offset(index_t offset) {
  RotaryPositions p;
  p.offset = offset;
  return p;
}
RotaryPositions at_offsets(IndexVector offsets) {
  RotaryPositions p;
  p.offsets = offsets;
  return p;
}
RotaryPositions varlen_at(IndexVector cu_seqlens, index_t offset) {
  RotaryPositions p;
  p.cu_seqlens = cu_seqlens, p.offset = offset;
  return p;
}
RotaryPositions both(index_t offset, IndexVector offsets) {
  RotaryPositions p = at_offsets(offsets);
  p.offset = offset;
  return p;
}
RotaryOptions options(bool interleaved, bool inverse = false) {
  RotaryOptions o;
  o.interleaved = interleaved, o.inverse = inverse;
  return o;
}

// A (B, S, H, d) tensor as the tokens (B * S, H, d) the reference takes (the same memory order).
template <class T>
Tensor<T> as_tokens(const Tensor<T>& x) {
  Tensor<T> t({x.dim(0) * x.dim(1), x.dim(2), x.dim(3)});
  std::copy(x.data(), x.data() + x.numel(), t.data());
  return t;
}

template <class T>
Tensor<T> reshaped(const Tensor<T>& x, std::vector<index_t> shape) {
  Tensor<T> t(shape);
  std::copy(x.data(), x.data() + x.numel(), t.data());
  return t;
}

// The positions of the batched form: token i of sequence b at first[b] + i.
std::vector<index_t> batched_positions(const std::vector<index_t>& first, index_t S) {
  std::vector<index_t> pos;
  for (const index_t f : first)
    for (index_t i = 0; i < S; ++i) pos.push_back(f + i);
  return pos;
}

template <class T>
class RotaryFloat : public ::testing::Test {};
using FloatTypes = ::testing::Types<float, double>;
TYPED_TEST_SUITE(RotaryFloat, FloatTypes);

// Both layouts, rotary_dim = 6 of head_dim 10 (features 6..9 pass through), an offset of 3.
TYPED_TEST(RotaryFloat, BothLayoutsPartialRotaryDimAndOffset) {
  using T = TypeParam;
  const index_t B = 2, S = 7, H = 3, d = 10, half = 3, P = 12;
  const auto cos_sin = rope_tables<T>(P, half);  // a pair, not a structured binding: clang 14's lambdas cannot capture one
  const auto& cos = cos_sin.first;
  const auto& sin = cos_sin.second;
  const Tensor<T> x = random_tensor<T>({B, S, H, d}, 11);
  for (const bool interleaved : {false, true}) {
    Tensor<T> out({B, S, H, d});
    RotaryPositions pos;
    pos.offset = 3;
    apply_rotary<T>(out.view(), x.view(), cos.view(), sin.view(), pos, options(interleaved));
    const auto positions = batched_positions({3, 3}, S);
    const Tensor<double> oracle = rotary_reference<double>(as_tokens(x), positions, cos, sin, interleaved);
    const Tensor<T> same = rotary_reference<T>(as_tokens(x), positions, cos, sin, interleaved);
    EXPECT_TRUE(testing::within_error_budget(as_tokens(out), same, oracle)) << "interleaved " << interleaved;
    for (index_t t = 0; t < B * S; ++t)  // the features past rotary_dim are copied bit for bit
      for (index_t j = 2 * half; j < d; ++j) EXPECT_EQ(as_tokens(out)(t, 1, j), as_tokens(x)(t, 1, j));
  }
}

// Per-sequence offsets (int32 and int64), as a KV cache's lengths; the last position is P - 1.
TYPED_TEST(RotaryFloat, PerSequenceOffsets) {
  using T = TypeParam;
  const index_t B = 3, S = 5, H = 2, d = 8, half = 4, P = 16;
  const auto cos_sin = rope_tables<T>(P, half);
  const auto& cos = cos_sin.first;
  const auto& sin = cos_sin.second;
  const Tensor<T> x = random_tensor<T>({B, S, H, d}, 12);
  const std::vector<index_t> first = {0, 11, 4};
  const Tensor<std::int32_t> off32({B}, {0, 11, 4});
  const Tensor<std::int64_t> off64({B}, {0, 11, 4});
  for (const bool interleaved : {false, true})
    for (const IndexVector& offsets : {IndexVector(off32.view()), IndexVector(off64.view())}) {
      Tensor<T> out({B, S, H, d});
      apply_rotary<T>(out.view(), x.view(), cos.view(), sin.view(), at_offsets(offsets), options(interleaved));
      const auto positions = batched_positions(first, S);
      EXPECT_TRUE(testing::within_error_budget(as_tokens(out), rotary_reference<T>(as_tokens(x), positions, cos, sin, interleaved),
                                               rotary_reference<double>(as_tokens(x), positions, cos, sin, interleaved)));
    }
}

// The varlen form: sequences of 3, 0 and 5 tokens packed, positions restarting at each (+ offsets).
TYPED_TEST(RotaryFloat, Varlen) {
  using T = TypeParam;
  const index_t H = 3, d = 12, half = 5, P = 9, total = 8;
  const auto cos_sin = rope_tables<T>(P, half);
  const auto& cos = cos_sin.first;
  const auto& sin = cos_sin.second;
  const Tensor<T> x = random_tensor<T>({total, H, d}, 13);
  const Tensor<std::int32_t> cu({4}, {0, 3, 3, 8});
  const Tensor<std::int64_t> offsets({3}, {6, 100, 4});  // the empty sequence has no position to check
  for (const bool interleaved : {false, true}) {
    Tensor<T> out({total, H, d});
    RotaryPositions pos;
    pos.cu_seqlens = cu.view();
    apply_rotary<T>(out.view(), x.view(), cos.view(), sin.view(), pos, options(interleaved));
    const std::vector<index_t> restart = {0, 1, 2, 0, 1, 2, 3, 4};
    EXPECT_TRUE(testing::within_error_budget(out, rotary_reference<T>(x, restart, cos, sin, interleaved),
                                             rotary_reference<double>(x, restart, cos, sin, interleaved)));
    pos.offsets = offsets.view();
    apply_rotary<T>(out.view(), x.view(), cos.view(), sin.view(), pos, options(interleaved));
    const std::vector<index_t> shifted = {6, 7, 8, 4, 5, 6, 7, 8};
    EXPECT_TRUE(testing::within_error_budget(out, rotary_reference<T>(x, shifted, cos, sin, interleaved),
                                             rotary_reference<double>(x, shifted, cos, sin, interleaved)));
  }
}

// In place (out is x) gives what a separate out gives, bit for bit; a strided x (every other head of
// a wider tensor) reads through its strides.
TYPED_TEST(RotaryFloat, InPlaceAndStrided) {
  using T = TypeParam;
  const index_t B = 2, S = 4, H = 3, d = 10, half = 4, P = 8;
  const auto cos_sin = rope_tables<T>(P, half);
  const auto& cos = cos_sin.first;
  const auto& sin = cos_sin.second;
  Tensor<T> wide = random_tensor<T>({B, S, 2 * H, d}, 14);
  const TensorView<T> x(wide.data(), {B, S, H, d}, {S * 2 * H * d, 2 * H * d, 2 * d, 1});
  for (const bool interleaved : {false, true}) {
    Tensor<T> apart({B, S, H, d});
    const RotaryPositions pos = at_offset(2);
    apply_rotary<T>(apart.view(), x, cos.view(), sin.view(), pos, options(interleaved));
    Tensor<T> dense({B, S, H, d});
    for (index_t b = 0; b < B; ++b)
      for (index_t s = 0; s < S; ++s)
        for (index_t h = 0; h < H; ++h)
          for (index_t j = 0; j < d; ++j) dense(b, s, h, j) = x(b, s, h, j);
    const auto positions = batched_positions({2, 2}, S);
    EXPECT_TRUE(testing::within_error_budget(as_tokens(apart), rotary_reference<T>(as_tokens(dense), positions, cos, sin, interleaved),
                                             rotary_reference<double>(as_tokens(dense), positions, cos, sin, interleaved)));
    const Tensor<T> before = wide;
    apply_rotary<T>(x, x, cos.view(), sin.view(), pos, options(interleaved));
    for (index_t b = 0; b < B; ++b)
      for (index_t s = 0; s < S; ++s)
        for (index_t h = 0; h < 2 * H; ++h)
          for (index_t j = 0; j < d; ++j)  // the rotated heads as out had them; the others untouched
            EXPECT_EQ(wide(b, s, h, j), h % 2 == 0 ? apart(b, s, h / 2, j) : before(b, s, h, j));
    wide = before;
  }
}

// The rotation is orthogonal: the inverse undoes the forward (to rounding), in both layouts.
TYPED_TEST(RotaryFloat, InverseUndoesForward) {
  using T = TypeParam;
  const index_t B = 2, S = 6, H = 2, d = 16, half = 8, P = 10;
  const auto cos_sin = rope_tables<T>(P, half);
  const auto& cos = cos_sin.first;
  const auto& sin = cos_sin.second;
  const Tensor<T> x = random_tensor<T>({B, S, H, d}, 15);
  const Tensor<std::int64_t> offsets({B}, {1, 4});
  for (const bool interleaved : {false, true}) {
    Tensor<T> y({B, S, H, d}), back({B, S, H, d});
    apply_rotary<T>(y.view(), x.view(), cos.view(), sin.view(), at_offsets(offsets.view()), options(interleaved));
    apply_rotary<T>(back.view(), y.view(), cos.view(), sin.view(), at_offsets(offsets.view()),
                    options(interleaved, true));
    const double tol = std::is_same_v<T, float> ? 1e-6 : 1e-14;
    EXPECT_LE(testing::max_abs_diff(back, x), tol);
  }
}

// The backward: grad_x = apply_rotary(grad_out, inverse) is the gradient of sum(grad_out * out) by
// central finite differences in float64.
TEST(Rotary, BackwardIsTheInverseByFiniteDifferences) {
  const index_t B = 2, S = 3, H = 2, d = 6, half = 2, P = 7;
  const auto cos_sin = rope_tables<double>(P, half);
  const auto& cos = cos_sin.first;
  const auto& sin = cos_sin.second;
  Tensor<double> x = random_tensor<double>({B, S, H, d}, 16);
  const Tensor<double> w = random_tensor<double>({B, S, H, d}, 17);
  const Tensor<std::int32_t> offsets({B}, {0, 4});
  for (const bool interleaved : {false, true}) {
    const RotaryPositions pos = at_offsets(offsets.view());
    Tensor<double> grad({B, S, H, d});
    apply_rotary<double>(grad.view(), w.view(), cos.view(), sin.view(), pos, options(interleaved, true));
    Tensor<double> out({B, S, H, d});
    const auto loss = [&] {
      apply_rotary<double>(out.view(), x.view(), cos.view(), sin.view(), pos, options(interleaved));
      double l = 0;
      for (index_t i = 0; i < out.numel(); ++i) l += out[i] * w[i];
      return l;
    };
    const std::vector<double> fd = testing::numeric_gradient(loss, std::span<double>(x.data(), static_cast<std::size_t>(x.numel())));
    for (index_t i = 0; i < x.numel(); ++i) EXPECT_NEAR(grad[i], fd[static_cast<std::size_t>(i)], 1e-8) << "element " << i;
  }
}

// bfloat16 and float16: each row computed in float32 and rounded once; within twice the error of the
// float32 formula rounded to the 16-bit type, against float64 over the same 16-bit inputs.
template <class H>
void expect_sixteen_bits() {
  const index_t B = 2, S = 9, Hd = 3, d = 20, half = 8, P = 12;
  const auto cos_sin = rope_tables<float>(P, half);
  const auto& cos = cos_sin.first;
  const auto& sin = cos_sin.second;
  const Tensor<float> x32 = random_tensor<float>({B, S, Hd, d}, 18);
  const Tensor<H> x = testing::to_half<H>(x32);
  const Tensor<float> widened = testing::to_single(x);
  for (const bool interleaved : {false, true}) {
    Tensor<H> out({B, S, Hd, d});
    apply_rotary<H>(out.view(), x.view(), cos.view(), sin.view(), at_offset(3), options(interleaved));
    const auto positions = batched_positions({3, 3}, S);
    const Tensor<float> same = testing::rounded<H>(rotary_reference<float>(as_tokens(widened), positions, cos, sin, interleaved));
    const Tensor<double> oracle = rotary_reference<double>(as_tokens(widened), positions, cos, sin, interleaved);
    EXPECT_TRUE(testing::within_error_budget(testing::to_single(as_tokens(out)), same, oracle));
    Tensor<H> in_place = x;  // in place too, bit for bit
    apply_rotary<H>(in_place.view(), in_place.view(), cos.view(), sin.view(), at_offset(3), options(interleaved));
    for (index_t i = 0; i < x.numel(); ++i) EXPECT_EQ(in_place[i].bits, out[i].bits);
  }
}
TEST(Rotary, Bfloat16) { expect_sixteen_bits<bfloat16>(); }
TEST(Rotary, Float16) { expect_sixteen_bits<float16>(); }

// Past 64K elements the tokens are split across threads: the same bits at 1 and 4 threads.
TEST(Rotary, ThreadsGiveTheSameBits) {
  const index_t B = 2, S = 300, H = 4, d = 64, half = 32, P = 400;
  const auto cos_sin = rope_tables<float>(P, half);
  const auto& cos = cos_sin.first;
  const auto& sin = cos_sin.second;
  const Tensor<float> x = random_tensor<float>({B, S, H, d}, 19);
  Tensor<float> one({B, S, H, d}), four({B, S, H, d});
  set_num_threads(1);
  apply_rotary<float>(one.view(), x.view(), cos.view(), sin.view(), at_offset(7));
  set_num_threads(4);
  apply_rotary<float>(four.view(), x.view(), cos.view(), sin.view(), at_offset(7));
  set_num_threads(0);
  EXPECT_EQ(one.values(), four.values());
}

TEST(Rotary, BadArguments) {
  const auto cos_sin = rope_tables<float>(8, 3);
  const auto& cos = cos_sin.first;
  const auto& sin = cos_sin.second;
  const Tensor<float> x = random_tensor<float>({2, 4, 2, 8}, 20);
  Tensor<float> out({2, 4, 2, 8});
  const auto call = [&](const RotaryPositions& pos, TensorView<const float> c, TensorView<const float> s) {
    apply_rotary<float>(out.view(), x.view(), c, s, pos);
  };
  // tables: shapes differ, rotary_dim past head_dim
  const auto cos5_sin5 = rope_tables<float>(8, 5);
  const auto& cos5 = cos5_sin5.first;
  const auto& sin5 = cos5_sin5.second;
  expect_error([&] { call({}, cos.view(), sin5.view()); }, {"apply_rotary: cos has shape (8,3) but sin has shape (8,5)", "the same"});
  expect_error([&] { call({}, cos5.view(), sin5.view()); }, {"rotary_dim = 2 * 5 = 10", "head_dim 8", "at most head_dim"});
  expect_error([&] { call({}, TensorView<const float>(), sin.view()); }, {"cos is required"});
  expect_error([&] { call({}, TensorView<const float>(cos.data(), {24}), sin.view()); }, {"cos has shape (24,)", "2 dimensions"});
  // positions past seqlen_ro: offset 5 + 4 tokens > 8 rows; per sequence, naming its index
  expect_error([&] { call(at_offset(5), cos.view(), sin.view()); },
               {"sequence 0 (batch index 0) starts at offset 5", "holds 4 tokens", "last position is 8", "8 rows (seqlen_ro)"});
  const Tensor<std::int64_t> late({2}, {0, 6});
  expect_error([&] { call(at_offsets(late.view()), cos.view(), sin.view()); }, {"batch index 1", "offset 6", "seqlen_ro"});
  // offsets: shape, negative, both forms
  const Tensor<std::int32_t> three({3}, {0, 0, 0});
  expect_error([&] { call(at_offsets(three.view()), cos.view(), sin.view()); }, {"offsets has shape (3,)", "(batch,) = (2,)"});
  const Tensor<std::int32_t> negative({2}, {0, -1});
  expect_error([&] { call(at_offsets(negative.view()), cos.view(), sin.view()); }, {"offsets[1] is -1", "must not be negative"});
  expect_error([&] { call(at_offset(-2), cos.view(), sin.view()); }, {"offset is -2", "must not be negative"});
  const Tensor<std::int32_t> zeros({2}, {0, 0});
  expect_error([&] { call(both(1, zeros.view()), cos.view(), sin.view()); }, {"offset is 1 and offsets is given"});
  // x and out shapes
  Tensor<float> small({2, 4, 2, 7});
  expect_error([&] { apply_rotary<float>(small.view(), x.view(), cos.view(), sin.view()); },
               {"out has shape (2,4,2,7) but x has shape (2,4,2,8)"});
  const Tensor<float> three_d = random_tensor<float>({8, 2, 8}, 21);
  Tensor<float> out3({8, 2, 8});
  expect_error([&] { apply_rotary<float>(out3.view(), three_d.view(), cos.view(), sin.view()); },
               {"x has shape (8,2,8)", "(batch, seqlen, heads, head_dim)", "cu_seqlens"});
  // cu_seqlens malformed: not from 0, decreasing, not ending at total
  const auto varlen = [&](std::vector<std::int32_t> cu) {
    const Tensor<std::int32_t> c({static_cast<index_t>(cu.size())}, cu);
    apply_rotary<float>(out3.view(), three_d.view(), cos.view(), sin.view(), varlen_at(c.view(), 0));
  };
  expect_error([&] { varlen({1, 4, 8}); }, {"cu_seqlens[0] is 1", "must be 0"});
  expect_error([&] { varlen({0, 5, 3, 8}); }, {"cu_seqlens[2] is 3 but cu_seqlens[1] is 5", "must not decrease"});
  expect_error([&] { varlen({0, 3, 7}); }, {"cu_seqlens ends at 7", "total = 8"});
  const Tensor<std::int32_t> whole({2}, {0, 8});
  expect_error([&] { apply_rotary<float>(out3.view(), three_d.view(), cos.view(), sin.view(), varlen_at(whole.view(), 1)); },
               {"sequence 0 (batch index 0) starts at offset 1", "last position is 8"});
  // memory: a partial overlap of out and x, out over a table
  Tensor<float> buf({2 * 4 * 2 * 8 + 8});
  const TensorView<float> a(buf.data(), {2, 4, 2, 8}), b(buf.data() + 8, {2, 4, 2, 8});
  expect_error([&] { apply_rotary<float>(b, TensorView<const float>(a), cos.view(), sin.view()); },
               {"out and x share memory", "x itself (in place"});
  Tensor<float> table_out({2, 4, 2, 8});
  const TensorView<const float> cos_in_out(table_out.data(), {8, 3});
  expect_error([&] { apply_rotary<float>(table_out.view(), x.view(), cos_in_out, sin.view()); }, {"out and cos share memory"});
}

}  // namespace
}  // namespace attn
