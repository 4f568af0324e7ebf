// The KV cache with rotary tables (attn/kv_cache.hpp, KvCacheOptions::rotary): its keys are stored
// rotated at their positions and its queries rotated at theirs, so attend equals float64 attention
// over keys and queries rotated explicitly (tests/support/rotary_reference.hpp), within twice the
// float32 computation's error: the decode path (n <= 4), a prompt (n > 4), every sequence's attend at
// once (decode, and the per-sequence path a window takes), both layouts, rotary_dim < head_dim, GQA;
// and the errors of tables too short or too wide, and of queries before position 0.
#include <cstdint>
#include <vector>

#include "attn/kv_cache.hpp"
#include "attn/sdpa.hpp"
#include "support/rotary_reference.hpp"
#include "support/testing.hpp"

namespace attn {
namespace {

using testing::expect_error;
using testing::random_tensor;

constexpr index_t kKvHeads = 2, kHeads = 4, kD = 16, kHalf = 6, kMaxPos = 40;

// x (A, L, d) rows rotated in precision F at positions first + i: the reference's tokens are (L, A, d).
template <class F>
Tensor<F> rotated(const Tensor<float>& x, index_t first, const Tensor<double>& cos, const Tensor<double>& sin,
                  bool interleaved) {
  const index_t A = x.dim(0), L = x.dim(1), d = x.dim(2);
  Tensor<double> tokens({L, A, d});
  std::vector<index_t> pos;
  for (index_t i = 0; i < L; ++i) {
    pos.push_back(first + i);
    for (index_t a = 0; a < A; ++a)
      for (index_t c = 0; c < d; ++c) tokens(i, a, c) = x(a, i, c);
  }
  const Tensor<F> r = testing::rotary_reference<F>(tokens, pos, testing::convert<F>(cos), testing::convert<F>(sin), interleaved);
  Tensor<F> out({A, L, d});
  for (index_t i = 0; i < L; ++i)
    for (index_t a = 0; a < A; ++a)
      for (index_t c = 0; c < d; ++c) out(a, i, c) = r(i, a, c);
  return out;
}

// Bottom-right causal attention, in precision F, of queries (H, n, d) over keys, values (kv_heads,
// L, d), with the heads of a group sharing their key head.
template <class F>
Tensor<F> attention(const Tensor<F>& q, const Tensor<F>& k, const Tensor<F>& v, const Window* window = nullptr) {
  const index_t H = q.dim(0), n = q.dim(1), L = k.dim(1), d = q.dim(2);
  Tensor<F> kk({1, H, L, d}), vv({1, H, L, d}), qq({1, H, n, d}), out({1, H, n, d});
  for (index_t h = 0; h < H; ++h) {
    const index_t g = h / (H / k.dim(0));
    for (index_t j = 0; j < L; ++j)
      for (index_t c = 0; c < d; ++c) kk(0, h, j, c) = k(g, j, c), vv(0, h, j, c) = v(g, j, c);
    for (index_t i = 0; i < n; ++i)
      for (index_t c = 0; c < d; ++c) qq(0, h, i, c) = q(h, i, c);
  }
  Mask<F> mask;
  mask.causal = Causal::bottom_right;
  if (window != nullptr) mask.window = *window;
  ScopedBackend reference(Backend::reference);
  sdpa_forward<F>(out.view(), {}, {}, qq.view(), kk.view(), vv.view(), mask);
  Tensor<F> r({H, n, d});
  std::copy(out.data(), out.data() + out.numel(), r.data());
  return r;
}

struct Sequence {
  Tensor<float> keys, values;  // (kv_heads, L, d), as appended (not rotated)
};

// Keys and values of several appends joined, as the cache holds them.
Tensor<float> joined(const std::vector<Tensor<float>>& parts) {
  index_t L = 0;
  for (const auto& p : parts) L += p.dim(1);
  Tensor<float> t({kKvHeads, L, kD});
  index_t at = 0;
  for (const auto& p : parts) {
    for (index_t a = 0; a < kKvHeads; ++a)
      for (index_t i = 0; i < p.dim(1); ++i)
        for (index_t c = 0; c < kD; ++c) t(a, at + i, c) = p(a, i, c);
    at += p.dim(1);
  }
  return t;
}

// The expected output of sequence s for queries q (H, n, d): float32 and float64 over explicitly
// rotated keys and queries; checks the cache's within the error budget.
void expect_attention(const Tensor<float>& got, const Tensor<float>& q, const Sequence& s, const Tensor<double>& cos,
                      const Tensor<double>& sin, bool interleaved, const Window* window = nullptr) {
  const index_t L = s.keys.dim(1), n = q.dim(1);
  const Tensor<double> oracle = attention<double>(rotated<double>(q, L - n, cos, sin, interleaved),
                                                  rotated<double>(s.keys, 0, cos, sin, interleaved),
                                                  testing::convert<double>(s.values), window);
  const Tensor<float> same = attention<float>(rotated<float>(q, L - n, cos, sin, interleaved),
                                              rotated<float>(s.keys, 0, cos, sin, interleaved), s.values, window);
  EXPECT_TRUE(testing::within_error_budget(got, same, oracle));
}

TEST(KvCacheRotary, EqualsAttentionOverRotatedKeysAndQueries) {
  const auto [cos64, sin64] = testing::rope_tables<double>(kMaxPos, kHalf);
  const Tensor<float> cos = testing::convert<float>(cos64), sin = testing::convert<float>(sin64);
  std::uint64_t seed = 100;
  for (const bool interleaved : {false, true}) {
    KvCacheOptions options;
    options.block_size = 4, options.rotary.cos = cos.view(), options.rotary.sin = sin.view();
    options.rotary.interleaved = interleaved;
    KvCache cache(2, kKvHeads, kD, options);
    // sequence 0: 5 tokens then 3 (positions 5..7, across a block); sequence 1: 11 tokens
    std::vector<std::vector<Tensor<float>>> parts(2);
    for (const auto& [seq, t] : {std::pair<index_t, index_t>{0, 5}, {0, 3}, {1, 11}}) {
      const Tensor<float> k = random_tensor<float>({kKvHeads, t, kD}, seed++), v = random_tensor<float>({kKvHeads, t, kD}, seed++);
      cache.append(seq, k.view(), v.view());
      parts[static_cast<std::size_t>(seq)].push_back(k);
      parts[static_cast<std::size_t>(seq)].push_back(v);
    }
    std::vector<Sequence> seqs;
    for (const auto& p : parts) {
      std::vector<Tensor<float>> ks, vs;
      for (std::size_t i = 0; i < p.size(); i += 2) ks.push_back(p[i]), vs.push_back(p[i + 1]);
      seqs.push_back({joined(ks), joined(vs)});
    }
    // The keys as stored: rotated at their positions.
    EXPECT_LE(testing::max_abs_diff(cache.keys(0), rotated<float>(seqs[0].keys, 0, cos64, sin64, interleaved)), 1e-6);
    // One sequence: decode (n = 1 and 4) and a prompt (n = 7, gathered path).
    for (const auto& [seq, n] : {std::pair<index_t, index_t>{0, 1}, {0, 4}, {1, 1}, {1, 7}}) {
      const Tensor<float> q = random_tensor<float>({kHeads, n, kD}, seed++);
      Tensor<float> out({kHeads, n, kD});
      cache.attend(out.view(), seq, q.view());
      expect_attention(out, q, seqs[static_cast<std::size_t>(seq)], cos64, sin64, interleaved);
    }
    // Every sequence at once: the batched decode path, and with a window the per-sequence one.
    for (const bool windowed : {false, true}) {
      const index_t n = 2;
      const Tensor<float> q = random_tensor<float>({2, kHeads, n, kD}, seed++);
      Tensor<float> out({2, kHeads, n, kD});
      KvAttendOptions o;
      const Window window{3, 0};
      if (windowed) o.window = window;
      cache.attend(out.view(), q.view(), o);
      for (index_t b = 0; b < 2; ++b) {
        Tensor<float> qb({kHeads, n, kD}), ob({kHeads, n, kD});
        std::copy(q.data() + b * qb.numel(), q.data() + (b + 1) * qb.numel(), qb.data());
        std::copy(out.data() + b * ob.numel(), out.data() + (b + 1) * ob.numel(), ob.data());
        expect_attention(ob, qb, seqs[static_cast<std::size_t>(b)], cos64, sin64, interleaved, windowed ? &window : nullptr);
      }
    }
  }
}

TEST(KvCacheRotary, BadTablesAndPositions) {
  const auto [cos, sin] = testing::rope_tables<float>(6, kHalf);
  KvCacheOptions options;
  options.rotary.cos = cos.view(), options.rotary.sin = sin.view();
  KvCache cache(2, kKvHeads, kD, options);
  const Tensor<float> five = random_tensor<float>({kKvHeads, 5, kD}, 1), two = random_tensor<float>({kKvHeads, 2, kD}, 2);
  cache.append(0, five.view(), five.view());
  // tables of 6 rows: positions 5 and 6 do not fit; nothing is stored
  expect_error([&] { cache.append(0, two.view(), two.view()); },
               {"KvCache::append: sequence 0 holds 5 tokens", "positions 5 to 6", "6 rows (max_pos)"});
  EXPECT_EQ(cache.length(0), 5);
  const Tensor<float> both = random_tensor<float>({2, kKvHeads, 2, kD}, 3);
  expect_error([&] { cache.append(both.view(), both.view()); }, {"sequence 0 holds 5 tokens", "positions 5 to 6"});
  EXPECT_EQ(cache.length(1), 0);
  // queries before position 0: 3 queries of a sequence of 2 tokens
  cache.append(1, two.view(), two.view());
  const Tensor<float> q = random_tensor<float>({kHeads, 3, kD}, 4);
  Tensor<float> out({kHeads, 3, kD});
  expect_error([&] { cache.attend(out.view(), 1, q.view()); },
               {"KvCache::attend: queries has 3 rows for sequence 1, which holds 2 tokens", "must not be negative"});
  const Tensor<float> qs = random_tensor<float>({2, kHeads, 3, kD}, 5);
  Tensor<float> outs({2, kHeads, 3, kD});
  expect_error([&] { cache.attend(outs.view(), qs.view()); }, {"sequence 1, which holds 2 tokens"});
  // tables wider than head_dim, of different shapes
  const auto [wide_cos, wide_sin] = testing::rope_tables<float>(6, kD);
  KvCacheOptions wide;
  wide.rotary.cos = wide_cos.view(), wide.rotary.sin = wide_sin.view();
  expect_error([&] { KvCache(1, kKvHeads, kD, wide); }, {"KvCache: cos and sin have shape (6,16)", "rotary_dim = 2 * 16 = 32",
                                                            "at most head_dim"});
  wide.rotary.sin = sin.view();
  expect_error([&] { KvCache(1, kKvHeads, kD, wide); }, {"cos has shape (6,16) but sin has shape (6,6)"});
}

}  // namespace
}  // namespace attn
