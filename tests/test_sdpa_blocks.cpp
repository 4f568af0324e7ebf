// Attention over queries and keys split into blocks (attn/sdpa.hpp): each block a call of its own with
// the positions of its first query and key (Mask::query_start, key_start), the key blocks' results
// merged through their lse (sdpa_merge) and their gradients taken block by block
// (sdpa_backward_block), as ring attention computes on each machine. Merged outputs, lse and summed
// gradients against the whole attention computed in one call by the float64 reference, on every
// backend (reference, unfused, cpu) in float32 (within the error budget of the whole float32
// reference) and float64; for the masks that follow positions (causal of both alignments, windows,
// ALiBi) and those given per block (valid lengths, keep masks), with GQA, soft-capping and blocks that
// see no key at all. Bad arguments get named errors.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "attn/sdpa.hpp"
#include "support/testing.hpp"

namespace attn {
namespace {

using testing::convert;
using testing::random_tensor;

// The whole problem: queries (B, H, N, d), keys and values (B, Hk, M, *), split into the blocks
// [starts[i], starts[i + 1]) of queries and of keys. Key blocks cross the fused kernels' 64-key tiles.
constexpr index_t B = 2, H = 4, Hk = 2, N = 37, M = 150, D = 8, V = 5;
const std::vector<index_t> kQueryStarts = {0, 13, 37};
const std::vector<index_t> kKeyStarts = {0, 29, 100, 150};

// large_scores: scale 6, so that |lse| passes 16 and the blocks' backward rebuilds its weights from
// an lse whose float rounding is no longer negligible.
enum class Variant { none, causal, causal_bottom_right, window, alibi_softcap, keep, valid_lens, dropout, large_scores, all };

std::string variant_name(Variant v) {
  switch (v) {
    case Variant::none: return "none";
    case Variant::causal: return "causal";
    case Variant::causal_bottom_right: return "causal_bottom_right";
    case Variant::window: return "window";
    case Variant::alibi_softcap: return "alibi_softcap";
    case Variant::keep: return "keep";
    case Variant::valid_lens: return "valid_lens";
    case Variant::dropout: return "dropout";
    case Variant::large_scores: return "large_scores";
    case Variant::all: return "all";
  }
  return "?";
}

template <class T>
struct Problem {
  Tensor<T> q, k, v, g, slopes;
  Tensor<bool> keep;
  Tensor<std::int64_t> lens;
  Variant variant;

  explicit Problem(Variant which)
      : q(convert<T>(random_tensor<double>({B, H, N, D}, 1, -2, 2))),
        k(convert<T>(random_tensor<double>({B, Hk, M, D}, 2, -2, 2))),
        v(convert<T>(random_tensor<double>({B, Hk, M, V}, 3))),
        g(convert<T>(random_tensor<double>({B, H, N, V}, 4))),
        slopes(convert<T>(random_tensor<double>({H}, 5, 0.05, 0.5))),
        keep({B, H, N, M}),
        lens({B}),
        variant(which) {
    const Tensor<double> coin = random_tensor<double>({B, H, N, M}, 6);
    for (index_t e = 0; e < keep.numel(); ++e) keep[e] = coin[e] > -0.6;
    lens[0] = 120, lens[1] = 20;  // the second batch element's keys end inside the first block
  }

  bool uses(Variant v) const { return variant == v || variant == Variant::all; }

  // The mask of queries [qs, qe) against keys [ks, ke), in whole-attention terms; lens_block holds
  // the block's valid lengths when they are used.
  Mask<T> mask(index_t qs, index_t qe, index_t ks, index_t ke, Tensor<std::int64_t>& lens_block) const {
    Mask<T> m;
    m.query_start = qs, m.key_start = ks;
    if (uses(Variant::causal)) m.causal = Causal::top_left;
    // A block of a bottom-right aligned attention: top-left with the queries moved by M - N.
    if (uses(Variant::causal_bottom_right) || variant == Variant::window) m.causal = Causal::top_left, m.query_start += M - N;
    if (uses(Variant::window)) m.window = Window{20, variant == Variant::all ? 0 : 7};
    if (uses(Variant::alibi_softcap)) m.alibi_slopes = slopes.view();
    if (uses(Variant::keep))
      m.keep = TensorView<const bool>(keep.data() + qs * M + ks, {B, H, qe - qs, ke - ks}, {H * N * M, N * M, M, 1});
    if (uses(Variant::valid_lens)) {
      lens_block = Tensor<std::int64_t>({B});
      for (index_t b = 0; b < B; ++b) lens_block[b] = std::clamp<std::int64_t>(lens[b] - ks, 0, ke - ks);
      m.valid_lens = lens_block.view();
    }
    return m;
  }
  // The options of the block whose queries and keys start at qs and ks: dropout keyed by the whole
  // attention's rows and keys (Dropout's offsets).
  SdpaOptions options(index_t qs = 0, index_t ks = 0) const {
    SdpaOptions o;
    if (uses(Variant::alibi_softcap)) o.softcap = 3.0;
    if (uses(Variant::dropout)) o.dropout = Dropout{0.3, 99, qs, ks};
    if (variant == Variant::large_scores) o.scale = 6.0;
    return o;
  }
};

// [out, lse, dq, dk, dv] of the whole attention in one call each.
template <class T>
std::vector<Tensor<T>> whole(Variant which) {
  const Problem<T> p(which);
  Tensor<std::int64_t> lens;
  const Mask<T> mask = p.mask(0, N, 0, M, lens);
  Tensor<T> out({B, H, N, V}), lse({B, H, N}), dq(p.q.shape()), dk(p.k.shape()), dv(p.v.shape());
  sdpa_forward<T>(out.view(), lse.view(), {}, p.q.view(), p.k.view(), p.v.view(), mask, p.options());
  sdpa_backward<T>(dq.view(), dk.view(), dv.view(), p.g.view(), p.q.view(), p.k.view(), p.v.view(), out.view(),
                   lse.view(), mask, p.options());
  return {out, lse, dq, dk, dv};
}

// A view of rows [r0, r1) of a (B, H, R, C) tensor, or of a (B, H, R) one (C = 0).
template <class T>
TensorView<T> rows(Tensor<T>& t, index_t r0, index_t r1) {
  const index_t R = t.dim(2), C = t.rank() == 4 ? t.dim(3) : 1;
  if (t.rank() == 3) return TensorView<T>(t.data() + r0, {t.dim(0), t.dim(1), r1 - r0}, {t.dim(1) * R, R, 1});
  return TensorView<T>(t.data() + r0 * C, {t.dim(0), t.dim(1), r1 - r0, C}, {t.dim(1) * R * C, R * C, C, 1});
}

// The same results block by block: each query block's key blocks merged, then each (query, key)
// block's gradients, dq summed over key blocks, dk and dv over query blocks.
template <class T>
std::vector<Tensor<T>> blocks(Variant which) {
  Problem<T> p(which);
  Tensor<T> out({B, H, N, V}), lse({B, H, N}), dq(p.q.shape()), dk(p.k.shape()), dv(p.v.shape());
  for (index_t e = 0; e < lse.numel(); ++e) lse[e] = -std::numeric_limits<T>::infinity();
  const index_t nq = static_cast<index_t>(kQueryStarts.size()) - 1, nk = static_cast<index_t>(kKeyStarts.size()) - 1;
  for (index_t a = 0; a < nq; ++a)
    for (index_t c = 0; c < nk; ++c) {
      const index_t qs = kQueryStarts[a], qe = kQueryStarts[a + 1], ks = kKeyStarts[c], ke = kKeyStarts[c + 1];
      Tensor<std::int64_t> lens;
      const Mask<T> mask = p.mask(qs, qe, ks, ke, lens);
      Tensor<T> part({B, H, qe - qs, V}), part_lse({B, H, qe - qs});
      sdpa_forward<T>(part.view(), part_lse.view(), {}, rows(p.q, qs, qe), rows(p.k, ks, ke), rows(p.v, ks, ke), mask,
                      p.options(qs, ks));
      sdpa_merge<T>(rows(out, qs, qe), rows(lse, qs, qe), part.view(), part_lse.view());
    }
  for (index_t a = 0; a < nq; ++a)
    for (index_t c = 0; c < nk; ++c) {
      const index_t qs = kQueryStarts[a], qe = kQueryStarts[a + 1], ks = kKeyStarts[c], ke = kKeyStarts[c + 1];
      Tensor<std::int64_t> lens;
      const Mask<T> mask = p.mask(qs, qe, ks, ke, lens);
      Tensor<T> dq_part({B, H, qe - qs, D}), dk_part({B, Hk, ke - ks, D}), dv_part({B, Hk, ke - ks, V});
      sdpa_backward_block<T>(dq_part.view(), dk_part.view(), dv_part.view(), rows(p.g, qs, qe), rows(p.q, qs, qe),
                             rows(p.k, ks, ke), rows(p.v, ks, ke), rows(out, qs, qe), rows(lse, qs, qe), mask,
                             p.options(qs, ks));
      auto add = [](TensorView<T> to, const Tensor<T>& from) {
        for (index_t b = 0; b < from.dim(0); ++b)
          for (index_t h = 0; h < from.dim(1); ++h)
            for (index_t r = 0; r < from.dim(2); ++r)
              for (index_t e = 0; e < from.dim(3); ++e) to(b, h, r, e) += from(b, h, r, e);
      };
      add(rows(dq, qs, qe), dq_part);
      add(rows(dk, ks, ke), dk_part);
      add(rows(dv, ks, ke), dv_part);
    }
  return {out, lse, dq, dk, dv};
}

class SdpaBlocks : public ::testing::TestWithParam<Variant> {};

TEST_P(SdpaBlocks, MergedBlocksEqualTheWholeAttentionOnEveryBackend) {
  const Variant which = GetParam();
  std::vector<Tensor<double>> oracle;
  std::vector<Tensor<float>> whole32;
  {
    const ScopedBackend reference(Backend::reference);
    oracle = whole<double>(which);
    whole32 = whole<float>(which);
  }
  const char* names[] = {"out", "lse", "dq", "dk", "dv"};
  for (const Backend backend : {Backend::reference, Backend::unfused, Backend::cpu}) {
    const ScopedBackend chosen(backend);
    const std::vector<Tensor<float>> got32 = blocks<float>(which);
    const std::vector<Tensor<double>> got64 = blocks<double>(which);
    for (std::size_t i = 0; i < oracle.size(); ++i) {
      // lse is -inf in rows with no key at all: equal there, compared as numbers elsewhere.
      Tensor<double> expected = oracle[i], g64 = got64[i];
      Tensor<float> g32 = got32[i], w32 = whole32[i];
      for (index_t e = 0; e < expected.numel(); ++e)
        if (std::isinf(expected[e])) {
          EXPECT_EQ(g64[e], expected[e]) << names[i] << " element " << e;
          EXPECT_EQ(g32[e], static_cast<float>(expected[e])) << names[i] << " element " << e;
          expected[e] = g64[e] = 0, g32[e] = w32[e] = 0;
        }
      EXPECT_TRUE(testing::within_error_budget(g32, w32, expected))
          << names[i] << " in float32, backend " << static_cast<int>(backend);
      EXPECT_LE(testing::max_abs_diff(g64, expected), 1e-10) << names[i] << " in float64, backend "
                                                             << static_cast<int>(backend);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Masks, SdpaBlocks,
                         ::testing::Values(Variant::none, Variant::causal, Variant::causal_bottom_right,
                                           Variant::window, Variant::alibi_softcap, Variant::keep,
                                           Variant::valid_lens, Variant::dropout, Variant::large_scores, Variant::all),
                         [](const auto& info) { return variant_name(info.param); });

TEST(SdpaBlocks, BadArgumentsAreNamed) {
  Tensor<float> out({1, 2, 3, 4}), lse({1, 2, 3}), part({1, 2, 3, 4}), part_lse({1, 2, 3}), short_lse({1, 2, 2});
  testing::expect_error([&] { sdpa_merge<float>(out.view(), lse.view(), Tensor<float>({1, 2, 3, 5}).cview(), part_lse.view()); },
                        {"sdpa_merge", "out_part", "(1,2,3,5)"});
  testing::expect_error([&] { sdpa_merge<float>(out.view(), short_lse.view(), part.view(), part_lse.view()); },
                        {"sdpa_merge", "lse", "(1,2,2)"});
  testing::expect_error([&] { sdpa_merge<float>(out.view(), {}, part.view(), part_lse.view()); },
                        {"sdpa_merge", "lse is required"});
  testing::expect_error([&] { sdpa_merge<float>(out.view(), lse.view(), out.view(), part_lse.view()); },
                        {"sdpa_merge", "out"});
  const Tensor<float> q = random_tensor<float>({1, 2, 3, 4}, 1), k = random_tensor<float>({1, 2, 5, 4}, 2);
  testing::expect_error(
      [&] {
        sdpa_backward_block<float>({}, {}, {}, out.view(), q.view(), k.view(), k.view(), out.view(), {});
      },
      {"sdpa_backward_block", "out and lse", "required", "lse ()"});
  Mask<float> negative;
  negative.key_start = -1;
  testing::expect_error([&] { sdpa_forward<float>(out.view(), {}, {}, q.view(), k.view(), k.view(), negative); },
                        {"sdpa_forward", "key_start -1", "[0, 2^48)"});
}

// Merging is exact arithmetic on the rows: a part with no key leaves a row as it was, a row with no key
// takes the part, and NaN in either lse reaches the row.
TEST(SdpaBlocks, MergeKeepsEmptyPartsAndPropagatesNaN) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  Tensor<float> out({1, 4, 2}), lse({1, 4}), part({1, 4, 2}), part_lse({1, 4});
  const float o[] = {1, 2, 0, 0, 5, 6, 7, 8}, l[] = {0.5f, -inf, 1, nan}, p[] = {9, 9, 3, 4, 1, 2, 0, 0},
              pl[] = {-inf, 2, 1, 0};
  std::copy(o, o + 8, out.data()), std::copy(l, l + 4, lse.data()), std::copy(p, p + 8, part.data()),
      std::copy(pl, pl + 4, part_lse.data());
  sdpa_merge<float>(out.view(), lse.view(), part.view(), part_lse.view());
  // the part had no key: the row stays
  EXPECT_EQ(out[0], 1);
  EXPECT_EQ(out[1], 2);
  EXPECT_EQ(lse[0], 0.5f);
  // the row had none: it takes the part
  EXPECT_EQ(out[2], 3);
  EXPECT_EQ(out[3], 4);
  EXPECT_EQ(lse[1], 2.0f);
  // equal lse: the mean
  EXPECT_FLOAT_EQ(out[4], 3);
  EXPECT_FLOAT_EQ(out[5], 4);
  EXPECT_FLOAT_EQ(lse[2], 1 + std::log(2.0f));
  EXPECT_TRUE(std::isnan(out[6]) && std::isnan(lse[3]));
}

}  // namespace
}  // namespace attn
