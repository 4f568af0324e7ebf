// flash_attn_with_kvcache and the paged varlen forward (attn/flash.hpp) against a float64 reference
// written here from the header's rules: the new tokens (rotated) written into the caller's caches,
// contiguous (cache_batch_idx, leftpad) and paged (shuffled block tables, pages of 1, 16 and 256),
// the decode path and a prompt chunk, causal or not, windows, ALiBi, soft-capping, sinks, GQA,
// float32, bfloat16 and float16, each within twice the error of the same-precision reference
// (FlashAttention's rule); and every bad input named, with nothing written.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attn/flash.hpp"
#include "attn/half.hpp"
#include "support/testing.hpp"

namespace attn {
namespace {

// testing::expect_error with the line of the expectation in its failure.
template <class F>
void expect_error_at(int line, const F& f, std::initializer_list<const char*> parts) {
  SCOPED_TRACE(::testing::Message() << "expected error at line " << line);
  testing::expect_error(f, parts);
}
#define EXPECT_NAMED_ERROR(...) expect_error_at(__LINE__, __VA_ARGS__)

template <class T>
double wide(T x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else return to_float(x);
}
template <class T>
T round_to(double x) {
  if constexpr (std::is_same_v<T, bfloat16>) return to_bfloat16(static_cast<float>(x));
  else if constexpr (std::is_same_v<T, float16>) return to_float16(static_cast<float>(x));
  else return static_cast<float>(x);
}

struct Case {
  index_t B = 3, n = 1, H = 4, Hk = 2, d = 32, S = 40, s = 1;
  index_t page = 0;  // 0: a contiguous cache
  index_t rotary_dim = 0;
  bool interleaved = true, causal = false, batch_idx = false, leftpad = false, alibi = false, sinks = false;
  Window window{-1, -1};
  double softcap = 0;
};

// x's first rd elements rotated by angle rows (the header's rule), in precision A.
template <class A>
void rotate(std::vector<A>& x, const std::vector<A>& cos, const std::vector<A>& sin, index_t rd, bool interleaved) {
  const index_t half = rd / 2;
  for (index_t c = 0; c < half; ++c) {
    const index_t i1 = interleaved ? 2 * c : c, i2 = interleaved ? 2 * c + 1 : c + half;
    const A x1 = x[i1], x2 = x[i2];
    x[i1] = x1 * cos[c] - x2 * sin[c], x[i2] = x2 * cos[c] + x1 * sin[c];
  }
}

// Attention from the formula in precision A: q (B, n, H, d), keys/values per sequence (m_b, Hk, d).
template <class A>
void attention(std::vector<A>& out, std::vector<A>& lse, const std::vector<A>& q, const std::vector<std::vector<A>>& keys,
               const std::vector<std::vector<A>>& values, const std::vector<index_t>& m, const Case& c,
               const std::vector<double>& slopes, const std::vector<double>& sinks) {
  const index_t B = c.B, n = c.n, H = c.H, Hk = c.Hk, d = c.d;
  out.assign(static_cast<std::size_t>(B * n * H * d), A(0)), lse.assign(static_cast<std::size_t>(B * H * n), A(0));
  const A scale = A(1) / std::sqrt(A(d));
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h)
      for (index_t i = 0; i < n; ++i) {
        const index_t mb = m[b], p = mb - n + i, hk = h / (H / Hk);
        std::vector<A> s(static_cast<std::size_t>(mb));
        std::vector<char> keep(static_cast<std::size_t>(mb));
        A top = c.sinks ? A(sinks[h]) : -std::numeric_limits<A>::infinity();
        for (index_t j = 0; j < mb; ++j) {
          keep[j] = (!c.causal || j <= p) && (c.window.left < 0 || j >= p - c.window.left) && (c.window.right < 0 || j <= p + c.window.right);
          if (!keep[j]) continue;
          A dot = 0;
          for (index_t e = 0; e < d; ++e) dot += q[((b * n + i) * H + h) * d + e] * keys[b][(j * Hk + hk) * d + e];
          A sc = dot * scale;
          if (c.softcap > 0) sc = A(c.softcap) * std::tanh(sc / A(c.softcap));
          if (c.alibi) sc -= A(slopes[b * H + h]) * std::abs(A(p - j));
          s[j] = sc, top = std::max(top, sc);
        }
        A sum = c.sinks ? std::exp(A(sinks[h]) - top) : A(0);
        bool any = false;
        for (index_t j = 0; j < mb; ++j)
          if (keep[j]) sum += std::exp(s[j] - top), any = true;
        // A row with no key: out 0, lse the sink's logit alone (log e^sink), or -inf without one.
        lse[(b * H + h) * n + i] = any ? top + std::log(sum) : c.sinks ? A(sinks[h]) : -std::numeric_limits<A>::infinity();
        if (!any) continue;
        for (index_t j = 0; j < mb; ++j)
          if (keep[j]) {
            const A w = std::exp(s[j] - top) / sum;
            for (index_t e = 0; e < d; ++e) out[((b * n + i) * H + h) * d + e] += w * values[b][(j * Hk + hk) * d + e];
          }
      }
}

template <class A, class B2>
double max_diff(const std::vector<A>& a, const std::vector<B2>& b) {
  double r = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::isfinite(double(b[i])) || std::isfinite(double(a[i]))) r = std::max(r, std::abs(double(a[i]) - double(b[i])));
  return r;
}

// One call of flash_attn_with_kvcache in type T with random inputs, checked as the file says.
template <class T>
void run(const Case& c, std::uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "B " << c.B << " n " << c.n << " s " << c.s << " page " << c.page << " rotary " << c.rotary_dim
                                    << (c.interleaved ? "i" : "n") << " causal " << c.causal << " window " << c.window.left << ","
                                    << c.window.right << " idx " << c.batch_idx << " pad " << c.leftpad << " alibi " << c.alibi
                                    << " softcap " << c.softcap << " sinks " << c.sinks << " T " << sizeof(T));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uni(-1, 1);
  const index_t B = c.B, n = c.n, H = c.H, Hk = c.Hk, d = c.d, S = c.S, s = c.s;
  const bool paged = c.page > 0;
  const index_t per_seq = paged ? (S + c.page - 1) / c.page : 1, Bc = c.batch_idx ? B + 2 : B;
  const index_t blocks = paged ? B * per_seq + 3 : Bc, rows = paged ? c.page : S;
  Tensor<T> kc({blocks, rows, Hk, d}), vc({blocks, rows, Hk, d});
  for (index_t i = 0; i < kc.numel(); ++i) kc[i] = round_to<T>(uni(rng)), vc[i] = round_to<T>(uni(rng));
  const Tensor<T> kc0 = kc, vc0 = vc;
  Tensor<T> q({B, n, H, d}), kn({B, s, Hk, d}), vn({B, s, Hk, d});
  for (index_t i = 0; i < q.numel(); ++i) q[i] = round_to<T>(uni(rng));
  for (index_t i = 0; i < kn.numel(); ++i) kn[i] = round_to<T>(uni(rng)), vn[i] = round_to<T>(uni(rng));
  std::vector<index_t> ids(static_cast<std::size_t>(blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  Tensor<std::int32_t> table({B, per_seq}), seqlens({B}), idx({B}), pad({B});
  for (index_t b = 0; b < B; ++b) {
    for (index_t i = 0; i < per_seq; ++i) table(b, i) = static_cast<std::int32_t>(ids[b * per_seq + i]);
    seqlens(b) = static_cast<std::int32_t>(std::uniform_int_distribution<index_t>(0, S - s - (c.rotary_dim ? n : 0))(rng));
    idx(b) = static_cast<std::int32_t>(ids[b] % Bc);
    pad(b) = static_cast<std::int32_t>(seqlens(b) > 0 ? std::uniform_int_distribution<index_t>(0, seqlens(b) - 1)(rng) : 0);
  }
  if (c.batch_idx) {  // distinct rows
    std::vector<index_t> rowsv(static_cast<std::size_t>(Bc));
    std::iota(rowsv.begin(), rowsv.end(), 0);
    std::shuffle(rowsv.begin(), rowsv.end(), rng);
    for (index_t b = 0; b < B; ++b) idx(b) = static_cast<std::int32_t>(rowsv[b]);
  }
  const index_t half = c.rotary_dim / 2, ro = S + n;
  Tensor<T> cosT({ro, std::max<index_t>(half, 1)}), sinT({ro, std::max<index_t>(half, 1)});
  std::vector<double> angle(static_cast<std::size_t>(ro * half));
  for (index_t r = 0; r < ro; ++r)
    for (index_t e = 0; e < half; ++e) {
      const double a = (uni(rng) + 1) * M_PI;
      cosT(r, e) = round_to<T>(std::cos(a)), sinT(r, e) = round_to<T>(std::sin(a));
    }
  std::vector<double> slopes(static_cast<std::size_t>(B * H)), sinks(static_cast<std::size_t>(H));
  Tensor<float> slopesT({B, H}), sinksT({H});
  for (index_t i = 0; i < B * H; ++i) slopesT[i] = static_cast<float>((uni(rng) + 1) * 0.15), slopes[i] = slopesT[i];
  for (index_t h = 0; h < H; ++h) sinksT[h] = static_cast<float>(uni(rng) * 2), sinks[h] = sinksT[h];

  FlashKvCacheParams<T> p;
  p.k_cache = kc.view(), p.v_cache = vc.view();
  p.k_new = kn.view(), p.v_new = vn.view(), p.cache_seqlens = seqlens.view();
  if (paged) p.block_table = table.view();
  if (c.batch_idx) p.cache_batch_idx = idx.view();
  if (c.leftpad) p.cache_leftpad = pad.view();
  if (half > 0) p.rotary_cos = TensorView<const T>(cosT.view()), p.rotary_sin = TensorView<const T>(sinT.view());
  p.rotary_interleaved = c.interleaved;
  p.attend.causal = c.causal, p.attend.window = c.window, p.attend.softcap = c.softcap;
  if (c.alibi) p.attend.alibi_slopes = slopesT.view();
  if (c.sinks) p.attend.sinks = sinksT.view();
  Tensor<T> out({B, n, H, d});
  Tensor<float> lse({B, H, n});
  flash_attn_with_kvcache<T>(out.view(), lse.view(), TensorView<const T>(q.view()), p);

  // Where token pos of sequence b lives in a cache.
  auto at = [&](index_t b, index_t pos, index_t hk) {
    const index_t blk = paged ? table(b, pos / rows) : c.batch_idx ? idx(b) : b;
    return ((blk * rows + (paged ? pos % rows : pos)) * Hk + hk) * d;
  };
  // The caches after the call: the new tokens (rotated, rounded to T) at their places, the rest untouched.
  const double ulp = std::is_same_v<T, float> ? 1e-6 : std::is_same_v<T, bfloat16> ? 1.0 / 128 : 1.0 / 1024;
  Tensor<T> kexp = kc0, vexp = vc0;
  const bool q_steps = c.causal || c.window.left >= 0 || c.window.right >= 0;
  auto rot_row = [&](index_t pos, std::vector<double>& x) {
    std::vector<double> co(static_cast<std::size_t>(half)), si(co.size());
    for (index_t e = 0; e < half; ++e) co[e] = wide(cosT(pos, e)), si[e] = wide(sinT(pos, e));
    rotate(x, co, si, c.rotary_dim, c.interleaved);
  };
  for (index_t b = 0; b < B; ++b)
    for (index_t t = 0; t < s; ++t)
      for (index_t hk = 0; hk < Hk; ++hk) {
        std::vector<double> x(static_cast<std::size_t>(d));
        for (index_t e = 0; e < d; ++e) x[e] = wide(kn(b, t, hk, e));
        rot_row(seqlens(b) + t, x);
        const index_t o = at(b, seqlens(b) + t, hk);
        for (index_t e = 0; e < d; ++e) kexp[o + e] = round_to<T>(x[e]), vexp[o + e] = vn(b, t, hk, e);
      }
  for (index_t i = 0; i < kc.numel(); ++i) {
    ASSERT_LE(std::abs(wide(kc[i]) - wide(kexp[i])), ulp * std::max(1.0, std::abs(wide(kexp[i])))) << "k_cache element " << i;
    ASSERT_EQ(wide(vc[i]), wide(vexp[i])) << "v_cache element " << i;
  }
  // The attention, from the caches as written: the float64 oracle (queries rotated in float64) and
  // the same-precision reference (float32 arithmetic, queries rotated in float32 and rounded to T,
  // out rounded to T).
  std::vector<index_t> m(static_cast<std::size_t>(B));
  std::vector<std::vector<double>> keys(B), values(B);
  std::vector<std::vector<float>> keysf(B), valuesf(B);
  for (index_t b = 0; b < B; ++b) {
    const index_t lp = c.leftpad ? pad(b) : 0;
    m[b] = seqlens(b) + s - lp;
    for (index_t j = 0; j < m[b]; ++j)
      for (index_t hk = 0; hk < Hk; ++hk)
        for (index_t e = 0; e < d; ++e) {
          const index_t o = at(b, lp + j, hk) + e;
          keys[b].push_back(wide(kc[o])), values[b].push_back(wide(vc[o]));
          keysf[b].push_back(static_cast<float>(wide(kc[o]))), valuesf[b].push_back(static_cast<float>(wide(vc[o])));
        }
  }
  std::vector<double> qd(static_cast<std::size_t>(q.numel()));
  std::vector<float> qf(qd.size());
  for (index_t b = 0; b < B; ++b)
    for (index_t i = 0; i < n; ++i)
      for (index_t h = 0; h < H; ++h) {
        std::vector<double> x(static_cast<std::size_t>(d));
        for (index_t e = 0; e < d; ++e) x[e] = wide(q(b, i, h, e));
        std::vector<float> xf(x.begin(), x.end());
        const index_t pos = seqlens(b) + (q_steps ? i : 0);
        rot_row(pos, x);
        std::vector<float> co(static_cast<std::size_t>(half)), si(co.size());
        for (index_t e = 0; e < half; ++e) co[e] = static_cast<float>(wide(cosT(pos, e))), si[e] = static_cast<float>(wide(sinT(pos, e)));
        if (half > 0) rotate(xf, co, si, c.rotary_dim, c.interleaved);
        for (index_t e = 0; e < d; ++e) {
          qd[((b * n + i) * H + h) * d + e] = x[e];
          qf[((b * n + i) * H + h) * d + e] = static_cast<float>(wide(round_to<T>(xf[e])));
        }
      }
  std::vector<double> o64, l64;
  std::vector<float> o32, l32;
  attention(o64, l64, qd, keys, values, m, c, slopes, sinks);
  attention(o32, l32, qf, keysf, valuesf, m, c, slopes, sinks);
  std::vector<double> got(o64.size()), same(o64.size());
  for (std::size_t i = 0; i < got.size(); ++i) got[i] = wide(out[static_cast<index_t>(i)]), same[i] = wide(round_to<T>(o32[i]));
  const double err = max_diff(got, o64), budget = 2 * max_diff(same, o64) + 1e-6;
  EXPECT_LE(err, budget) << "out error against float64";
  std::vector<double> lgot(l64.size());
  for (std::size_t i = 0; i < lgot.size(); ++i) lgot[i] = lse[static_cast<index_t>(i)];
  EXPECT_LE(max_diff(lgot, l64), 2 * max_diff(l32, l64) + 1e-5) << "lse error against float64";
}

std::vector<Case> cases() {
  std::vector<Case> r;
  for (const index_t page : {index_t(0), index_t(1), index_t(16), index_t(256)})
    for (const index_t n : {index_t(1), index_t(3), index_t(7)})
      for (const int variant : {0, 1, 2, 3, 4, 5}) {
        Case c;
        c.page = page, c.n = n, c.s = variant % 2 == 0 ? n : 2;
        c.S = page == 256 ? 300 : 45;
        c.causal = variant % 3 != 0;
        c.rotary_dim = variant == 1 ? 16 : variant == 3 ? 32 : 0;
        c.interleaved = variant != 3;
        if (variant == 2) c.window = {5, 0};
        if (variant == 4) c.alibi = true, c.softcap = 2.0;
        if (variant == 5) c.sinks = true, c.window = {3, 2};
        if (page == 0) c.batch_idx = variant % 2 == 1, c.leftpad = variant >= 2;
        r.push_back(c);
      }
  return r;
}

TEST(FlashKvCache, Float32MatchesTheReference) {
  std::uint64_t seed = 1;
  for (const Case& c : cases()) run<float>(c, seed++);
}
TEST(FlashKvCache, BFloat16MatchesTheReference) {
  std::uint64_t seed = 100;
  for (const Case& c : cases()) run<bfloat16>(c, seed++);
}
TEST(FlashKvCache, Float16MatchesTheReference) {
  std::uint64_t seed = 200;
  for (Case c : cases()) {
    c.H = 6, c.Hk = 3, c.d = 24;
    if (c.rotary_dim > 24) c.rotary_dim = 24;
    run<float16>(c, seed++);
  }
}
TEST(FlashKvCache, NoNewTokensAndMultiQuery) {
  Case c;
  c.s = 0, c.Hk = 1, c.causal = true, c.n = 2;
  run<float>(c, 7);
  c.page = 16;
  run<float>(c, 8);
}

// The brief's example: 100 cached tokens, one query, causal off, window (4, 0): the last 5 keys.
TEST(FlashKvCache, WindowOfFourAttendsTheLastFiveKeys) {
  const index_t S = 128, d = 8;
  Tensor<float> kc({1, S, 1, d}), vc({1, S, 1, d}), q({1, 1, 1, d}), out({1, 1, 1, d});
  for (index_t j = 0; j < S; ++j) vc(0, j, 0, 0) = static_cast<float>(j);  // keys all 0: uniform weights
  Tensor<std::int32_t> seqlens({1});
  seqlens(0) = 100;
  FlashKvCacheParams<float> p;
  p.k_cache = kc.view(), p.v_cache = vc.view(), p.cache_seqlens = seqlens.view();
  p.attend.window = {4, 0};
  flash_attn_with_kvcache<float>(out.view(), {}, TensorView<const float>(q.view()), p);
  EXPECT_NEAR(out(0, 0, 0, 0), (95 + 96 + 97 + 98 + 99) / 5.0, 1e-5);
}

TEST(FlashKvCacheBadInput, EachIsNamedAndNothingIsWritten) {
  const index_t B = 2, S = 8, Hk = 1, d = 16;
  Tensor<float> kc({4, S, Hk, d}), vc({4, S, Hk, d}), q({B, 1, 2, d}), out({B, 1, 2, d}), kn({B, 1, Hk, d}), vn({B, 1, Hk, d});
  for (index_t i = 0; i < kn.numel(); ++i) kn[i] = 1, vn[i] = 1;
  Tensor<std::int32_t> seqlens({B}), idx({B}), pad({B}), table({B, 2});
  seqlens(0) = 3, seqlens(1) = 7;
  auto base = [&] {
    FlashKvCacheParams<float> p;
    p.k_cache = kc.view(), p.v_cache = vc.view(), p.k_new = kn.view(), p.v_new = vn.view(), p.cache_seqlens = seqlens.view();
    return p;
  };
  auto call = [&](const FlashKvCacheParams<float>& p) { flash_attn_with_kvcache<float>(out.view(), {}, TensorView<const float>(q.view()), p); };
  auto untouched = [&] {
    for (index_t i = 0; i < kc.numel(); ++i) ASSERT_EQ(kc[i], 0.0f) << "k_cache was written by a call that failed";
  };
  seqlens(1) = 8;
  EXPECT_NAMED_ERROR([&] { call(base()); }, {"cache_seqlens[1] is 8", "1 new tokens", "holds 8 per sequence"});
  untouched();
  seqlens(1) = 7;
  seqlens(0) = -1;
  EXPECT_NAMED_ERROR([&] { call(base()); }, {"cache_seqlens[0] is -1"});
  seqlens(0) = 3;
  {
    auto p = base();
    idx(0) = 1, idx(1) = 1;
    p.cache_batch_idx = idx.view();
    EXPECT_NAMED_ERROR([&] { call(p); }, {"cache_batch_idx[1] is 1", "distinct"});
    idx(1) = 4;
    EXPECT_NAMED_ERROR([&] { call(p); }, {"cache_batch_idx[1] is 4", "[0, 4)"});
    untouched();
  }
  {
    auto p = base();
    pad(0) = 4, pad(1) = 0;
    p.cache_leftpad = pad.view();
    EXPECT_NAMED_ERROR([&] { call(p); }, {"cache_leftpad[0] is 4", "holds 3 tokens"});
  }
  {
    auto p = base();  // paged: 4 blocks of 8; sequence 1 holds 8 tokens after the append
    table(0, 0) = 0, table(0, 1) = 1, table(1, 0) = 2, table(1, 1) = 5;
    p.block_table = table.view();
    seqlens(1) = 8;
    EXPECT_NAMED_ERROR([&] { call(p); }, {"block_table[1, 1] is 5", "[0, 4)"});
    table(1, 1) = 0;  // block 0: sequence 0's tokens 0..7, which it writes at 3
    EXPECT_NAMED_ERROR([&] { call(p); }, {"block_table[0, 0] is block 0", "belong to one sequence"});
    table(1, 1) = 3;
    p.cache_leftpad = pad.view();
    EXPECT_NAMED_ERROR([&] { call(p); }, {"cache_leftpad is given with a block_table"});
    untouched();
    seqlens(1) = 7;
  }
  {
    auto p = base();
    Tensor<float> cosT({7, 4}), sinT({7, 4}), long_cos({16, 10}), sinks({3}), sinks_bad({2});
    p.rotary_cos = cosT.view(), p.rotary_sin = sinT.view();
    EXPECT_NAMED_ERROR([&] { call(p); }, {"rotary_cos has shape (7,4)", "reach 7", "at least 8 rows"});
    p.rotary_cos = long_cos.view(), p.rotary_sin = long_cos.view();
    EXPECT_NAMED_ERROR([&] { call(p); }, {"rotary_dim 20", "at most headdim 16"});
    p.rotary_cos = {}, p.rotary_sin = {};
    p.attend.sinks = sinks.view();
    EXPECT_NAMED_ERROR([&] { call(p); }, {"sinks has shape (3,)", "(nheads,) = (2,)"});
    sinks_bad[1] = NAN;
    p.attend.sinks = sinks_bad.view();
    EXPECT_NAMED_ERROR([&] { call(p); }, {"sinks[1] is nan", "finite"});
    untouched();
  }
  {
    auto p = base();
    p.v_new = {};
    EXPECT_NAMED_ERROR([&] { call(p); }, {"k and v must be given together"});
    Tensor<float> out3({B, 1, 3, d});
    EXPECT_NAMED_ERROR([&] { flash_attn_with_kvcache<float>(out3.view(), {}, TensorView<const float>(q.view()), base()); },
                       {"out has shape (2,1,3,16); it must be the shape of q (2,1,2,16)"});
    Tensor<float> kc2({4, S, 2, d}), q3({B, 1, 3, d}), out2({B, 1, 3, d});
    auto p2 = base();
    p2.k_cache = kc2.view(), p2.v_cache = kc2.view(), p2.k_new = {}, p2.v_new = {};
    EXPECT_NAMED_ERROR([&] { flash_attn_with_kvcache<float>(out2.view(), {}, TensorView<const float>(q3.view()), p2); },
                       {"3 heads", "nheads must be a multiple of nheads_k"});
  }
}

// The paged varlen forward against the same formula: sequences of 1 to 9 queries packed, keys
// given by cu_seqlens_k or seqused_k.
template <class T>
void run_varlen(bool causal, Window window, bool alibi, bool use_seqused, index_t page, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uni(-1, 1);
  const index_t B = 5, H = 4, Hk = 2, d = 32, per_seq = (40 + page - 1) / page, blocks = B * per_seq + 1;
  const std::vector<index_t> nq = {1, 9, 3, 0, 2}, mk = {17, 40, 5, 3, 0};
  Case c;
  c.H = H, c.Hk = Hk, c.d = d, c.causal = causal, c.window = window, c.alibi = alibi, c.B = 1;
  Tensor<T> kc({blocks, page, Hk, d}), vc({blocks, page, Hk, d});
  for (index_t i = 0; i < kc.numel(); ++i) kc[i] = round_to<T>(uni(rng)), vc[i] = round_to<T>(uni(rng));
  std::vector<index_t> ids(static_cast<std::size_t>(blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  Tensor<std::int32_t> table({B, per_seq}), cq({B + 1}), ck({B + 1}), used({B});
  cq(0) = ck(0) = 0;
  for (index_t b = 0; b < B; ++b) {
    for (index_t i = 0; i < per_seq; ++i) table(b, i) = static_cast<std::int32_t>(ids[b * per_seq + i]);
    cq(b + 1) = static_cast<std::int32_t>(cq(b) + nq[b]);
    ck(b + 1) = static_cast<std::int32_t>(ck(b) + (use_seqused ? 50 : mk[b]));  // seqused_k overrides
    used(b) = static_cast<std::int32_t>(mk[b]);
  }
  const index_t total = cq(B);
  Tensor<T> q({total, H, d}), out({total, H, d});
  for (index_t i = 0; i < q.numel(); ++i) q[i] = round_to<T>(uni(rng));
  Tensor<float> lse({H, total}), slopesT({B, H});
  std::vector<double> slopes_all(static_cast<std::size_t>(B * H));
  for (index_t i = 0; i < B * H; ++i) slopesT[i] = static_cast<float>((uni(rng) + 1) * 0.2), slopes_all[i] = slopesT[i];
  FlashPagedVarlenParams<T> p;
  p.k_cache = TensorView<const T>(kc.view()), p.v_cache = TensorView<const T>(vc.view()), p.block_table = table.view();
  p.cu_seqlens_q = cq.view(), p.cu_seqlens_k = ck.view();
  if (use_seqused) p.seqused_k = used.view();
  p.attend.causal = causal, p.attend.window = window;
  if (alibi) p.attend.alibi_slopes = slopesT.view();
  flash_attn_varlen_paged<T>(out.view(), lse.view(), TensorView<const T>(q.view()), p);
  for (index_t b = 0; b < B; ++b) {
    SCOPED_TRACE(::testing::Message() << "sequence " << b << " causal " << causal << " window " << window.left << "," << window.right
                                      << " alibi " << alibi << " page " << page);
    c.n = nq[b];
    std::vector<std::vector<double>> keys(1), values(1);
    std::vector<std::vector<float>> keysf(1), valuesf(1);
    for (index_t j = 0; j < mk[b]; ++j)
      for (index_t hk = 0; hk < Hk; ++hk)
        for (index_t e = 0; e < d; ++e) {
          const T kx = kc(table(b, j / page), j % page, hk, e), vx = vc(table(b, j / page), j % page, hk, e);
          keys[0].push_back(wide(kx)), values[0].push_back(wide(vx));
          keysf[0].push_back(static_cast<float>(wide(kx))), valuesf[0].push_back(static_cast<float>(wide(vx)));
        }
    std::vector<double> qd;
    std::vector<float> qf;
    for (index_t i = 0; i < nq[b]; ++i)
      for (index_t h = 0; h < H; ++h)
        for (index_t e = 0; e < d; ++e) qd.push_back(wide(q(cq(b) + i, h, e))), qf.push_back(static_cast<float>(wide(q(cq(b) + i, h, e))));
    const std::vector<double> slopes(slopes_all.begin() + b * H, slopes_all.begin() + (b + 1) * H);
    std::vector<double> o64, l64;
    std::vector<float> o32, l32;
    attention(o64, l64, qd, keys, values, {mk[b]}, c, slopes, {});
    attention(o32, l32, qf, keysf, valuesf, {mk[b]}, c, slopes, {});
    std::vector<double> got, same;
    for (index_t i = 0; i < nq[b] * H * d; ++i) got.push_back(wide(out[cq(b) * H * d + i])), same.push_back(wide(round_to<T>(o32[i])));
    EXPECT_LE(max_diff(got, o64), 2 * max_diff(same, o64) + 1e-6);
    std::vector<double> lgot;
    for (index_t h = 0; h < H; ++h)
      for (index_t i = 0; i < nq[b]; ++i) lgot.push_back(lse(h, cq(b) + i));
    EXPECT_LE(max_diff(lgot, l64), 2 * max_diff(l32, l64) + 1e-5);
  }
}

TEST(FlashVarlenPaged, MatchesTheReference) {
  std::uint64_t seed = 300;
  for (const index_t page : {index_t(1), index_t(16), index_t(256)}) {
    run_varlen<float>(false, {-1, -1}, false, false, page, seed++);
    run_varlen<float>(true, {-1, -1}, false, true, page, seed++);
    run_varlen<float>(true, {4, 0}, true, false, page, seed++);
    run_varlen<bfloat16>(true, {-1, -1}, false, false, page, seed++);
    run_varlen<bfloat16>(false, {2, 3}, true, true, page, seed++);
    run_varlen<float16>(true, {-1, -1}, false, true, page, seed++);
  }
}

TEST(FlashVarlenPaged, BadInputIsNamed) {
  Tensor<float> kc({4, 16, 1, 8}), q({5, 2, 8}), out({5, 2, 8});
  Tensor<std::int32_t> table({2, 2}), cq({3}), ck({3});
  cq(1) = 2, cq(2) = 5, ck(1) = 16, ck(2) = 49;
  FlashPagedVarlenParams<float> p;
  p.k_cache = TensorView<const float>(kc.view()), p.v_cache = TensorView<const float>(kc.view()), p.block_table = table.view();
  p.cu_seqlens_q = cq.view(), p.cu_seqlens_k = ck.view();
  auto call = [&] { flash_attn_varlen_paged<float>(out.view(), {}, TensorView<const float>(q.view()), p); };
  EXPECT_NAMED_ERROR(call, {"sequence 1 has 33 keys", "hold 32"});
  ck(2) = 36, table(1, 1) = 4;
  EXPECT_NAMED_ERROR(call, {"block_table[1, 1] is 4", "[0, 4)"});
  table(1, 1) = 3, cq(2) = 6;
  EXPECT_NAMED_ERROR(call, {"cu_seqlens_q[2] is 6", "total_q = 5"});
}

}  // namespace
}  // namespace attn
