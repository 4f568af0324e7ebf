// Sequence-parallel attention over MPI (attn/distributed.hpp), run on every rank by mpiexec with 1 to
// 4 ranks (tests/distributed.cmake). Every rank builds the same whole problem, takes its shard of the
// queries, keys and values (contiguous or zigzag, lengths that do not divide by the ranks), runs the
// ring and the all-to-all forward and backward, and checks its rows of out, lse, dQ, dK and dV against
// the single-process attn result on the whole sequences under the error budget of STYLE.md (2x the
// float32 result's error against the float64 reference), for each mask. Bad arguments on some ranks
// raise the same attn::Error on every rank, never a hang (CTest's timeout would catch one).
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <functional>
#include <type_traits>
#include <string>
#include <vector>

#include "attn/config.hpp"
#include "attn/distributed.hpp"
#include "attn/memory.hpp"
#include "attn/sdpa.hpp"
#include "support/testing.hpp"

namespace attn {
namespace {

using testing::convert;
using testing::random_tensor;

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int p = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  return p;
}

enum class Variant { none, causal, causal_bottom_right, window, valid_lens, query_lens, alibi_softcap, dropout, sinks_aligned, all };
enum class Algorithm { ring, ulysses };

std::string variant_name(Variant v) {
  switch (v) {
    case Variant::none: return "none";
    case Variant::causal: return "causal";
    case Variant::causal_bottom_right: return "causal_bottom_right";
    case Variant::window: return "window";
    case Variant::valid_lens: return "valid_lens";
    case Variant::query_lens: return "query_lens";
    case Variant::alibi_softcap: return "alibi_softcap";
    case Variant::dropout: return "dropout";
    case Variant::sinks_aligned: return "sinks_aligned";
    case Variant::all: return "all";
  }
  return "?";
}

// The whole problem: queries (B, H, N, D), keys and values (B, Hk, M, *) (grouped heads), dout.
constexpr index_t B = 2, H = 4, Hk = 2, N = 45, M = 70, D = 8, V = 5;

struct Problem {
  Variant variant;
  Tensor<std::int64_t> lens{B};
  Tensor<std::int64_t> query_lens{B, N};  // per query, 0 to M: empty rows, whole rows and between
  Tensor<double> slopes, sinks;

  explicit Problem(Variant v)
      : variant(v), slopes(random_tensor<double>({H}, 5, 0.05, 0.5)), sinks(random_tensor<double>({H}, 6, -0.5, 2.0)) {
    lens[0] = 61, lens[1] = 17;
    for (index_t b = 0; b < B; ++b)
      for (index_t i = 0; i < N; ++i) query_lens[b * N + i] = (i * 7 + b * 13) % (M + 1);
  }
  bool uses(Variant v) const { return variant == v || variant == Variant::all; }
  template <class T>
  Mask<T> mask(const Tensor<T>& slopes_t, const Tensor<T>& sinks_t) const {
    Mask<T> m;
    if (uses(Variant::causal)) m.causal = Causal::top_left;
    if (uses(Variant::causal_bottom_right) || uses(Variant::window) || variant == Variant::dropout)
      m.causal = Causal::bottom_right;
    if (uses(Variant::window)) m.window = Window{12, variant == Variant::all ? 0 : 5};
    if (uses(Variant::valid_lens)) m.valid_lens = lens.view();
    if (variant == Variant::query_lens) m.causal = Causal::top_left, m.valid_lens = query_lens.view();
    if (uses(Variant::alibi_softcap)) m.alibi_slopes = slopes_t.view();
    // A window and ALiBi placed bottom-right without a causal mask, and sinks.
    if (variant == Variant::sinks_aligned) m.window = Window{9, 2}, m.alibi_slopes = slopes_t.view();
    if (uses(Variant::sinks_aligned)) m.align = Align::bottom_right, m.sinks = sinks_t.view();
    return m;
  }
  SdpaOptions options() const {
    SdpaOptions o;
    if (uses(Variant::alibi_softcap)) o.softcap = 2.5;
    if (uses(Variant::dropout)) o.dropout = Dropout{0.25, 1234};
    return o;
  }
};

// This rank's rows of a (B, X, L, C) tensor (or (B, X, L) when 3-D) in the layout.
template <class T>
Tensor<T> shard(const Tensor<T>& whole, ShardLayout layout) {
  const index_t L = whole.dim(2), C = whole.rank() == 4 ? whole.dim(3) : 1;
  const auto rows = shard_rows(L, world_size(), world_rank(), layout);
  index_t count = 0;
  for (const auto& [b, e] : rows) count += e - b;
  std::vector<index_t> shape = whole.shape();
  shape[2] = count;
  Tensor<T> out(shape);
  for (index_t b = 0; b < whole.dim(0); ++b)
    for (index_t h = 0; h < whole.dim(1); ++h) {
      index_t local = 0;
      for (const auto& [begin, end] : rows)
        for (index_t g = begin; g < end; ++g, ++local)
          for (index_t c = 0; c < C; ++c)
            out.data()[((b * whole.dim(1) + h) * count + local) * C + c] = whole.data()[((b * whole.dim(1) + h) * L + g) * C + c];
    }
  return out;
}

// This rank's rows of per-query lengths (B, N), in its shard's order: (B, n_r).
Tensor<std::int64_t> shard_lengths(const Tensor<std::int64_t>& lens, ShardLayout layout) {
  Tensor<std::int64_t> as_rows({B, 1, N});
  std::copy(lens.data(), lens.data() + lens.numel(), as_rows.data());
  const Tensor<std::int64_t> rows = shard(as_rows, layout);
  Tensor<std::int64_t> out({B, rows.dim(2)});
  std::copy(rows.data(), rows.data() + rows.numel(), out.data());
  return out;
}

// out, lse, dq, dk, dv of the whole attention in one process: on the cpu backend in T, or the float64
// reference.
template <class T>
std::vector<Tensor<T>> whole(const Problem& s, Backend backend) {
  ScopedBackend scoped(backend);
  const Tensor<T> q = convert<T>(random_tensor<double>({B, H, N, D}, 1, -2, 2)),
                  k = convert<T>(random_tensor<double>({B, Hk, M, D}, 2, -2, 2)),
                  v = convert<T>(random_tensor<double>({B, Hk, M, V}, 3)), g = convert<T>(random_tensor<double>({B, H, N, V}, 4));
  const Tensor<T> slopes = convert<T>(s.slopes), sinks = convert<T>(s.sinks);
  Tensor<T> out({B, H, N, V}), lse({B, H, N}), dq(q.shape()), dk(k.shape()), dv(v.shape()), ds({H});
  sdpa_forward<T>(out.view(), lse.view(), {}, q.view(), k.view(), v.view(), s.mask(slopes, sinks), s.options());
  sdpa_backward<T>(dq.view(), dk.view(), dv.view(), g.view(), q.view(), k.view(), v.view(), out.view(), lse.view(),
                   s.mask(slopes, sinks), s.options(), s.uses(Variant::sinks_aligned) ? ds.view() : TensorView<T>{});
  return {q, k, v, g, out, lse, dq, dk, dv, ds};
}

// out, lse, dq, dk, dv of this rank's shards, computed across the ranks.
template <class T>
std::vector<Tensor<T>> across_ranks(const Problem& s, const std::vector<Tensor<T>>& inputs, ShardLayout layout,
                                    Algorithm algorithm) {
  const Tensor<T> q = shard(inputs[0], layout), k = shard(inputs[1], layout), v = shard(inputs[2], layout),
                  g = shard(inputs[3], layout);
  const Tensor<T> slopes = convert<T>(s.slopes), sinks = convert<T>(s.sinks);
  Mask<T> mask = s.mask(slopes, sinks);
  const index_t n_r = q.dim(2);
  // Per-query lengths: this rank's rows of the whole (B, N), in its shard's order.
  const Tensor<std::int64_t> lens_rows = shard_lengths(s.query_lens, layout);
  if (s.variant == Variant::query_lens) mask.valid_lens = lens_rows.view();
  Tensor<T> out({B, H, n_r, V}), lse({B, H, n_r}), dq(q.shape()), dk(k.shape()), dv(v.shape());
  const auto forward = algorithm == Algorithm::ring ? ring_sdpa_forward<T> : ulysses_sdpa_forward<T>;
  const auto backward = algorithm == Algorithm::ring ? ring_sdpa_backward<T> : ulysses_sdpa_backward<T>;
  forward(MPI_COMM_WORLD, out.view(), lse.view(), q.view(), k.view(), v.view(), mask, s.options(), layout);
  backward(MPI_COMM_WORLD, dq.view(), dk.view(), dv.view(), g.view(), q.view(), k.view(), v.view(), out.view(),
           lse.view(), mask, s.options(), layout);
  // The sinks' gradient: each rank's rows (sdpa_sinks_backward), summed over the ranks.
  Tensor<T> ds({H});
  if (s.uses(Variant::sinks_aligned)) {
    sdpa_sinks_backward<T>(ds.view(), g.view(), out.view(), lse.view(), sinks.view());
    MPI_Allreduce(MPI_IN_PLACE, ds.data(), static_cast<int>(H), std::is_same_v<T, float> ? MPI_FLOAT : MPI_DOUBLE, MPI_SUM,
                  MPI_COMM_WORLD);
  }
  return {out, lse, dq, dk, dv, ds};
}

struct Case {
  Variant variant;
  ShardLayout layout;
  Algorithm algorithm;
};

class AcrossRanks : public ::testing::TestWithParam<Case> {};

TEST_P(AcrossRanks, EqualsTheSingleProcessResultWithinTheErrorBudget) {
  const Case c = GetParam();
  const Problem s(c.variant);
  const std::vector<Tensor<float>> single = whole<float>(s, Backend::cpu);
  const std::vector<Tensor<double>> oracle = whole<double>(s, Backend::reference);
  const std::vector<Tensor<float>> got = across_ranks<float>(s, single, c.layout, c.algorithm);
  const char* names[] = {"out", "lse", "dq", "dk", "dv"};
  for (int i = 0; i < 5; ++i) {
    const Tensor<float> mine = shard(single[4 + i], c.layout);
    const Tensor<double> truth = shard(oracle[4 + i], c.layout);
    EXPECT_TRUE(testing::within_error_budget(got[i], mine, truth)) << names[i] << " on rank " << world_rank();
  }
  if (s.uses(Variant::sinks_aligned))  // d(sinks) summed over the ranks: the whole sequence's
    EXPECT_TRUE(testing::within_error_budget(got[5], single[9], oracle[9])) << "dsinks on rank " << world_rank();
  // float64 across ranks against the float64 reference: the same sums in another order.
  const std::vector<Tensor<double>> got64 = across_ranks<double>(s, oracle, c.layout, c.algorithm);
  for (int i = 0; i < 5; ++i)
    EXPECT_LT(testing::max_abs_diff(got64[i], shard(oracle[4 + i], c.layout)), 1e-12)
        << names[i] << " in float64 on rank " << world_rank();
  if (s.uses(Variant::sinks_aligned))
    EXPECT_LT(testing::max_abs_diff(got64[5], oracle[9]), 1e-12) << "dsinks in float64 on rank " << world_rank();
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (Variant v : {Variant::none, Variant::causal, Variant::causal_bottom_right, Variant::window, Variant::valid_lens,
                    Variant::query_lens, Variant::alibi_softcap, Variant::dropout, Variant::sinks_aligned, Variant::all})
    for (ShardLayout layout : {ShardLayout::contiguous, ShardLayout::zigzag})
      for (Algorithm a : {Algorithm::ring, Algorithm::ulysses}) out.push_back({v, layout, a});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Masks, AcrossRanks, ::testing::ValuesIn(cases()), [](const auto& info) {
  const Case& c = info.param;
  return variant_name(c.variant) + (c.layout == ShardLayout::zigzag ? "_zigzag" : "_contiguous") +
         (c.algorithm == Algorithm::ring ? "_ring" : "_ulysses");
});

TEST(ShardRows, SplitTheSequenceAsDocumented) {
  // contiguous: floor(r L / P); zigzag: chunks r and 2P - 1 - r of 2P.
  EXPECT_EQ(shard_rows(10, 3, 1, ShardLayout::contiguous), (std::vector<std::pair<index_t, index_t>>{{3, 6}}));
  EXPECT_EQ(shard_rows(10, 3, 2, ShardLayout::contiguous), (std::vector<std::pair<index_t, index_t>>{{6, 10}}));
  EXPECT_EQ(shard_rows(16, 2, 0, ShardLayout::zigzag), (std::vector<std::pair<index_t, index_t>>{{0, 4}, {12, 16}}));
  EXPECT_EQ(shard_rows(16, 2, 1, ShardLayout::zigzag), (std::vector<std::pair<index_t, index_t>>{{4, 8}, {8, 12}}));
  index_t total = 0;
  for (int r = 0; r < 7; ++r) total += shard_length(1001, 7, r, ShardLayout::zigzag);
  EXPECT_EQ(total, 1001);
  EXPECT_THROW(shard_rows(10, 0, 0, ShardLayout::contiguous), Error);
  EXPECT_THROW(shard_rows(10, 2, 2, ShardLayout::contiguous), Error);
}

// Runs `call` on every rank and expects every rank to raise attn::Error, the same message on all of
// them, containing `expected`.
void expect_same_error_everywhere(const std::function<void()>& call, const std::string& expected) {
  std::string message;
  try {
    call();
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find(expected), std::string::npos) << "rank " << world_rank() << " got: \"" << message << "\"";
  // Every rank's message is rank 0's.
  std::vector<char> mine(512, 0), first(512, 0);
  std::copy_n(message.begin(), std::min<std::size_t>(message.size(), 511), mine.begin());
  first = mine;
  MPI_Bcast(first.data(), 512, MPI_CHAR, 0, MPI_COMM_WORLD);
  EXPECT_EQ(std::string(mine.data()), std::string(first.data())) << "rank " << world_rank();
}

struct Shards {
  Tensor<float> q, k, v, out, lse;
  explicit Shards(index_t d_extra = 0, index_t extra_rows = 0) {
    const int P = world_size(), r = world_rank();
    const index_t n_r = shard_length(N, P, r, ShardLayout::contiguous) + extra_rows, m_r = shard_length(M, P, r, ShardLayout::contiguous);
    q = random_tensor<float>({B, H, n_r, D + d_extra}, 1);
    k = random_tensor<float>({B, Hk, m_r, D + d_extra}, 2);
    v = random_tensor<float>({B, Hk, m_r, V}, 3);
    out = Tensor<float>({B, H, n_r, V});
    lse = Tensor<float>({B, H, n_r});
  }
  void forward(const Mask<float>& mask = {}, const SdpaOptions& options = {}) {
    ring_sdpa_forward<float>(MPI_COMM_WORLD, out.view(), lse.view(), q.view(), k.view(), v.view(), mask, options);
  }
};

TEST(AcrossRanksErrors, RanksThatDisagreeAllRaiseTheSameError) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  // The last rank's queries and keys have another size.
  expect_same_error_everywhere(
      [] { Shards(world_rank() == world_size() - 1 ? 1 : 0).forward(); }, "passes d (query size) = 9 but rank 0 passes 8");
  // One rank holds 5 rows too many (no split of the 50 rows gives the ranks these counts).
  expect_same_error_everywhere([] { Shards(0, world_rank() == 1 ? 5 : 0).forward(); },
                               "rows of queries but the contiguous layout gives rank");
  // One rank asks for a causal mask, the others do not.
  expect_same_error_everywhere(
      [] {
        Mask<float> mask;
        if (world_rank() == 0) mask.causal = Causal::top_left;
        Shards().forward(mask);
      },
      "the causal mask");
  // The last rank passes per-query lengths, the others one per batch element.
  expect_same_error_everywhere(
      [] {
        Shards s;
        const bool per_query = world_rank() == world_size() - 1;
        Tensor<std::int64_t> lens(per_query ? std::vector<index_t>{B, s.q.dim(2)} : std::vector<index_t>{B});
        for (index_t e = 0; e < lens.numel(); ++e) lens[e] = M / 2;
        Mask<float> mask;
        mask.valid_lens = lens.view();
        s.forward(mask);
      },
      "passes per-query valid lengths (B, n_r) but rank 0 passes valid lengths (B,); every rank must pass the same kind");
}

TEST(AcrossRanksErrors, NoCommunicatorIsAnError) {
  Shards s;
  try {
    ring_sdpa_forward<float>(MPI_COMM_NULL, s.out.view(), s.lse.view(), s.q.view(), s.k.view(), s.v.view());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "ring_sdpa_forward: comm is MPI_COMM_NULL");
  }
}

TEST(AcrossRanksErrors, OneRanksBadArgumentReachesEveryRank) {
  const int last = world_size() - 1;
  expect_same_error_everywhere(
      [last] {
        Shards s;
        Tensor<float> wrong({B, H, 1, V});
        ring_sdpa_forward<float>(MPI_COMM_WORLD, world_rank() == last ? wrong.view() : s.out.view(), s.lse.view(),
                                 s.q.view(), s.k.view(), s.v.view());
      },
      "ring_sdpa_forward: out has shape (2,4,1,5)");
  expect_same_error_everywhere(
      [] {
        SdpaOptions options;
        options.dropout = {1.5, 3};
        Shards().forward({}, options);
      },
      "dropout p is 1.5; it must lie in [0, 1)");
  expect_same_error_everywhere(
      [] {
        Tensor<std::int64_t> lens({B});
        lens[0] = M + 1;
        Mask<float> mask;
        mask.valid_lens = lens.view();
        Shards().forward(mask);
      },
      "valid_lens[0] is 71; it must lie in [0, 70]");
  // Per-query lengths (B, n_r): the last rank's hold one out of range, or the wrong number of rows.
  for (const bool wrong_shape : {false, true})
    expect_same_error_everywhere(
        [last, wrong_shape] {
          Shards s;
          const index_t rows = s.q.dim(2) + (wrong_shape && world_rank() == last ? 1 : 0);
          Tensor<std::int64_t> lens({B, rows});
          for (index_t e = 0; e < lens.numel(); ++e) lens[e] = M / 2;
          if (!wrong_shape && world_rank() == last && rows > 0) lens[rows - 1] = M + 1;
          Mask<float> mask;
          mask.valid_lens = lens.view();
          s.forward(mask);
        },
        wrong_shape ? "valid_lens has shape (2," + std::to_string(shard_length(N, world_size(), last, ShardLayout::contiguous) + 1) +
                          ") but must be (2,), one key length"
                    : "ring_sdpa_forward: rank " + std::to_string(last) + " passes a valid length of 71; each must lie in [0, 70]");
  expect_same_error_everywhere(
      [] {
        Shards s;
        ring_sdpa_backward<float>(MPI_COMM_WORLD, {}, {}, {}, s.out.view(), s.q.view(), s.k.view(), s.v.view(),
                                  s.out.view(), {});
      },
      "lse is required");
}

// What no shape shows may differ between ranks too: the algorithm, the layout, the ALiBi slopes'
// values; and slopes wrong on every rank are refused before any message between the ranks (the
// block kernels found them only after the ring's first exchange was posted: a crash, or a hang
// where a rank held no rows).
TEST(AcrossRanksErrors, AlgorithmLayoutAndSlopesAreComparedBeforeTheRing) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const int last = world_size() - 1;
  if (H % world_size() == 0)
    expect_same_error_everywhere(
        [last] {
          Shards s;
          if (world_rank() == last) {
            ulysses_sdpa_forward<float>(MPI_COMM_WORLD, s.out.view(), s.lse.view(), s.q.view(), s.k.view(), s.v.view());
          } else {
            s.forward();
          }
        },
        "calls ulysses_sdpa_forward but rank 0 calls ring_sdpa_forward; every rank must make the same call");
  expect_same_error_everywhere(
      [last] {
        Shards s;
        ring_sdpa_forward<float>(MPI_COMM_WORLD, s.out.view(), s.lse.view(), s.q.view(), s.k.view(), s.v.view(), {}, {},
                                 world_rank() == last ? ShardLayout::zigzag : ShardLayout::contiguous);
      },
      "rank " + std::to_string(last) + " passes the zigzag layout but rank 0 passes contiguous");
  const auto with_slopes = [last](index_t count, float last_ranks_third) {
    Tensor<float> slopes({count});
    for (index_t h = 0; h < count; ++h) slopes[h] = std::ldexp(1.0f, -static_cast<int>(h + 1));
    if (world_rank() == last && count > 2) slopes[2] = last_ranks_third;
    Mask<float> mask;
    mask.alibi_slopes = slopes.view();
    Shards().forward(mask);
  };
  expect_same_error_everywhere([&] { with_slopes(3, 0.125f); },
                               "ring_sdpa_forward: alibi_slopes has shape (3,); it must be (H,) = (4,) or (B, H) = (2,4)");
  expect_same_error_everywhere([&] { with_slopes(H, NAN); }, "alibi_slopes holds nan for batch 0, head 2; every slope must be finite");
  expect_same_error_everywhere([&] { with_slopes(H, 0.3f); },
                               "rank " + std::to_string(last) + " passes the ALiBi slopes and sinks other than rank 0's");
}

// An error one rank meets after the collective check (here attn's memory limit, reached by the first
// buffer it asks for) reaches every rank at the end of the call, never a hang: that rank raises its
// MemoryError, every other rank a MemoryError with its message and naming it; the exchanges of the
// ring and of the all-to-all all took place, so the next call, unlimited, gives the same results as
// the call before the failure.
TEST(AcrossRanksErrors, OneRanksFailureMidCallReachesEveryRank) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const int last = world_size() - 1;
  Shards s;
  s.forward();  // out and lse, for the backward
  const Tensor<float> out = s.out, lse = s.lse;
  Tensor<float> dq(s.q.shape()), dk(s.k.shape()), dv(s.v.shape());
  const auto ring_backward = [&] {
    ring_sdpa_backward<float>(MPI_COMM_WORLD, dq.view(), dk.view(), dv.view(), out.view(), s.q.view(), s.k.view(),
                              s.v.view(), out.view(), lse.view());
  };
  const auto ulysses_backward = [&] {
    ulysses_sdpa_backward<float>(MPI_COMM_WORLD, dq.view(), dk.view(), dv.view(), out.view(), s.q.view(), s.k.view(),
                                 s.v.view(), out.view(), lse.view());
  };
  const std::vector<std::pair<std::string, std::function<void()>>> calls = {
      {"ulysses_sdpa_forward",
       [&] { ulysses_sdpa_forward<float>(MPI_COMM_WORLD, s.out.view(), s.lse.view(), s.q.view(), s.k.view(), s.v.view()); }},
      {"ulysses_sdpa_backward", ulysses_backward},
      {"ring_sdpa_backward", ring_backward},
      // lse given: the ring's own buffers are not attn's, so the first block's partial output fails
      {"ring_sdpa_forward", [&] { s.forward(); }},
      // no lse: the rank's own lse fails, before the ring starts
      {"ring_sdpa_forward without lse",
       [&] { ring_sdpa_forward<float>(MPI_COMM_WORLD, s.out.view(), {}, s.q.view(), s.k.view(), s.v.view()); }}};
  // Everything the calls write, as a good call leaves it.
  const auto outputs = [&] { return std::vector<Tensor<float>>{s.out, s.lse, dq, dk, dv}; };
  for (const auto& [name, call] : calls) {
    call();
    const std::vector<Tensor<float>> good = outputs();
    std::string message;
    bool memory_error = false;
    if (world_rank() == last) set_memory_limit(memory_in_use() + 1);
    try {
      call();
    } catch (const MemoryError& e) {
      message = e.what(), memory_error = true;
    } catch (const Error& e) {
      message = e.what();
    }
    if (world_rank() == last) set_memory_limit(0);
    EXPECT_TRUE(memory_error) << name << ", rank " << world_rank() << ": \"" << message << "\"";
    if (world_rank() != last)
      EXPECT_NE(message.find("(on rank " + std::to_string(last) + " of " + std::to_string(world_size()) + ")"),
                std::string::npos)
          << name << ", rank " << world_rank() << ": \"" << message << "\"";
    EXPECT_NO_THROW(call()) << name << ", rank " << world_rank();
    const std::vector<Tensor<float>> again = outputs();
    for (std::size_t t = 0; t < good.size(); ++t)
      EXPECT_EQ(testing::max_abs_diff(again[t], good[t]), 0.0) << name << ", rank " << world_rank() << ", output " << t;
  }
}

// On ranks other than 0, in place of GoogleTest's printer: each failed assertion, with its rank.
class FailurePrinter : public ::testing::EmptyTestEventListener {
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (result.failed())
      std::fprintf(stderr, "rank %d: %s:%d: %s\n", world_rank(), result.file_name() ? result.file_name() : "?",
                   result.line_number(), result.message());
  }
};

}  // namespace
}  // namespace attn

// Every rank runs every test; the program fails on every rank when a test failed on any.
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  if (attn::world_rank() != 0) {  // one rank prints the progress; every rank prints its failures
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new attn::FailurePrinter);
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0, any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any && attn::world_rank() == 0) std::fprintf(stderr, "a test failed on some rank\n");
  MPI_Finalize();
  return any;
}
