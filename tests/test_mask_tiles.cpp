// Keep-masks and additive masks on the SIMD path (softmax-inl.h): every broadcast pattern, strided
// masks, tiles a mask leaves whole, empties or cuts, each against the float64 reference, forward and
// backward, with NaN and Inf in the masked positions of Q, K and V (which must never be read into a
// result); the tiles a mask empties proved skipped and the tiles it leaves whole proved unmasked by
// the kernels' own counters; a bool key-padding mask of prefixes run as valid lengths; additive
// attention under the same masks. Registered for every SIMD target (ATTN_SIMD_TESTS).
#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "attn/additive.hpp"
#include "attn/sdpa.hpp"
#include "cpu/simd/dispatch.hpp"
#include "cpu/simd/fused.hpp"
#include "support/testing.hpp"

namespace attn {
namespace {

using testing::convert;
using testing::random_tensor;

constexpr index_t kTile = cpu::fused::kBlockK;
static_assert(cpu::fused::kBlockQ == kTile);
constexpr double kInf = std::numeric_limits<double>::infinity();

// How a mask's value at (b, h, i, j) is made. Tiles are the kernels' (kTile x kTile).
enum class Keep {
  none,
  prefix,        // key padding: keys [0, 130) of batch 0, [0, 64) of batch 1 (a prefix per row)
  holes,         // key padding with holes: every 7th key and the whole second tile masked
  tiles,         // tiles all kept, all masked or mixed by (tile row, tile column, b, h); a dead query
                 // row and a dead key column through every tile
  checkerboard,  // block-sparse: tiles alternately all kept and all masked
  causal,        // j <= i, as a tensor
  all,           // every key kept
};
enum class Bias {
  none,
  tiles,    // tiles of 0, of -inf and of values in [-2, 1) with scattered -inf
  zero,     // zeros everywhere: changes nothing
  keys,     // one value per key (rows broadcast): the second tile -inf
  queries,  // one value per query (keys broadcast): one query row -inf
  checkerboard,  // tiles alternately 0 and -inf
};

int tile_class(index_t b, index_t h, index_t i, index_t j) { return static_cast<int>((i / kTile + 2 * (j / kTile) + b + h) % 3); }

bool keep_at(Keep kind, index_t b, index_t h, index_t i, index_t j) {
  switch (kind) {
    case Keep::none:
    case Keep::all: return true;
    case Keep::prefix: return j < (b == 0 ? 130 : 64);
    case Keep::holes: return j % 7 != 3 && (j < kTile || j >= 2 * kTile);
    case Keep::tiles:
      if (i % 37 == 5 || j % 41 == 7) return false;
      return tile_class(b, h, i, j) == 0 || (tile_class(b, h, i, j) == 2 && (i * 31 + j * 17) % 5 != 0);
    case Keep::checkerboard: return (i / kTile + j / kTile) % 2 == 0;
    case Keep::causal: return j <= i;
  }
  return true;
}

double bias_at(Bias kind, index_t b, index_t h, index_t i, index_t j) {
  const double wave = std::sin(0.37 * static_cast<double>(i) + 0.71 * static_cast<double>(j) + 1.3 * static_cast<double>(b + 2 * h));
  switch (kind) {
    case Bias::none:
    case Bias::zero: return 0;
    case Bias::tiles: {
      const int c = tile_class(b, h, i, j);
      if (c == 0) return 0;
      if (c == 1) return -kInf;
      return (i + j) % 13 == 0 ? -kInf : 1.5 * wave - 0.5;
    }
    case Bias::keys: return j >= kTile && j < 2 * kTile ? -kInf : wave;
    case Bias::queries: return i == 9 ? -kInf : wave;
    case Bias::checkerboard: return (i / kTile + j / kTile) % 2 == 0 ? 0 : -kInf;
  }
  return 0;
}

// Mask shapes are written with kN and kM for the call's n and m.
constexpr index_t kN = -1, kM = -2;
std::vector<index_t> resolve(std::vector<index_t> shape, index_t n, index_t m) {
  for (index_t& s : shape) s = s == kN ? n : s == kM ? m : s;
  return shape;
}

// A mask pattern: the keep-mask's and additive mask's shapes (broadcast by NumPy rules to
// (B, H, n, m); empty for none), whether they are stored transposed and read through strides,
// valid lengths per batch and the causal mask on top.
struct Pattern {
  const char* name;
  Keep keep = Keep::none;
  std::vector<index_t> keep_shape{};
  Bias bias = Bias::none;
  std::vector<index_t> bias_shape{};
  bool transposed = false;  // (.., m, n) storage read as (.., n, m)
  std::vector<std::int64_t> lens{};  // (B,) valid lengths, or none
  Causal causal = Causal::none;
  std::vector<index_t> expanded{};  // the masks viewed with this shape, stride 0 where theirs is 1 (torch's expand)
};

void PrintTo(const Pattern& p, std::ostream* os) { *os << p.name; }

// (b, h, i, j) of the broadcast (B, H, n, m) for flat index e of a mask of `shape` (right-aligned).
std::array<index_t, 4> coords(const std::vector<index_t>& shape, index_t e) {
  std::array<index_t, 4> c{0, 0, 0, 0};
  for (std::size_t a = shape.size(); a-- > 0;) {
    c[4 - shape.size() + a] = e % shape[a];
    e /= shape[a];
  }
  return c;
}

// Owns a pattern's masks in precision T for an (n, m) call and gives Mask<T> views of them.
template <class T>
struct MaskTensors {
  const Pattern& p;
  std::vector<index_t> keep_shape, bias_shape, expanded;  // the pattern's, resolved
  Tensor<bool> keep;
  Tensor<T> bias;
  Tensor<std::int64_t> lens;
  std::vector<index_t> keep_strides, bias_strides;
  // The views' shapes and strides (views point at them).
  mutable std::vector<index_t> keep_view_shape, keep_view_strides, bias_view_shape, bias_view_strides;

  MaskTensors(const Pattern& pattern, index_t n, index_t m)
      : p(pattern), keep_shape(resolve(p.keep_shape, n, m)), bias_shape(resolve(p.bias_shape, n, m)),
        expanded(resolve(p.expanded, n, m)) {
    if (!keep_shape.empty())
      keep = fill<bool>(keep_shape, keep_strides, [&](auto c) { return keep_at(p.keep, c[0], c[1], c[2], c[3]); });
    if (!bias_shape.empty())
      bias = fill<T>(bias_shape, bias_strides, [&](auto c) { return static_cast<T>(bias_at(p.bias, c[0], c[1], c[2], c[3])); });
    if (!p.lens.empty()) lens = Tensor<std::int64_t>({static_cast<index_t>(p.lens.size())}, p.lens);
  }

  // The mask's values, value((b, h, i, j)); transposed patterns store the last two axes swapped and
  // read them through strides (the view's strides go to `strides`).
  template <class U, class F>
  Tensor<U> fill(const std::vector<index_t>& shape, std::vector<index_t>& strides, F value) const {
    Tensor<U> t(std::span<const index_t>(shape.data(), shape.size()));
    const std::size_t r = shape.size();
    strides.assign(r, 1);
    for (std::size_t a = r - 1; a-- > 0;) strides[a] = strides[a + 1] * shape[a + 1];
    if (p.transposed) strides[r - 1] = shape[r - 2], strides[r - 2] = 1;  // (.., n, m) read from (.., m, n)
    for (index_t e = 0; e < t.numel(); ++e) {
      const auto c = coords(shape, e);
      index_t at = 0;
      for (std::size_t a = 0; a < r; ++a) at += c[4 - r + a] * strides[a];
      t.data()[at] = value(c);
    }
    return t;
  }

  // A view of data of `shape` with `strides`, or of the shape `expanded` with stride 0 where the
  // data has size 1.
  template <class U>
  TensorView<const U> view_of(const U* data, const std::vector<index_t>& shape, const std::vector<index_t>& strides,
                              std::vector<index_t>& view_shape, std::vector<index_t>& view_strides) const {
    view_shape = shape, view_strides = strides;
    if (!expanded.empty())
      for (std::size_t a = 0; a < shape.size(); ++a)
        if (shape[a] == 1 && expanded[a] != 1) view_shape[a] = expanded[a], view_strides[a] = 0;
    return TensorView<const U>(data, std::span<const index_t>(view_shape), std::span<const index_t>(view_strides));
  }

  Mask<T> mask() const {
    Mask<T> mask;
    if (keep.numel() > 0) mask.keep = view_of(keep.data(), keep_shape, keep_strides, keep_view_shape, keep_view_strides);
    if (bias.numel() > 0) mask.additive = view_of(bias.data(), bias_shape, bias_strides, bias_view_shape, bias_view_strides);
    if (lens.numel() > 0) mask.valid_lens = lens.view();
    mask.causal = p.causal;
    return mask;
  }
};

// Whether query i of (b, h) may attend key j under the whole pattern.
bool attends(const Pattern& p, index_t n, index_t m, index_t b, index_t h, index_t i, index_t j) {
  // The mask's coordinates of (b, h, i, j): 0 on its size-1 (broadcast) axes.
  auto at = [&](const std::vector<index_t>& unresolved) {
    const std::vector<index_t> shape = resolve(unresolved, n, m);
    std::array<index_t, 4> c{b, h, i, j};
    for (std::size_t a = 0; a < 4; ++a)
      if (a < 4 - shape.size() || shape[a - (4 - shape.size())] == 1) c[a] = 0;
    return c;
  };
  if (!p.keep_shape.empty()) {
    const auto c = at(p.keep_shape);
    if (!keep_at(p.keep, c[0], c[1], c[2], c[3])) return false;
  }
  if (!p.bias_shape.empty()) {
    const auto c = at(p.bias_shape);
    if (bias_at(p.bias, c[0], c[1], c[2], c[3]) == -kInf) return false;
  }
  if (!p.lens.empty() && j >= p.lens[static_cast<std::size_t>(b)]) return false;
  if (p.causal == Causal::top_left && j > i) return false;
  if (p.causal == Causal::bottom_right && j > i + m - n) return false;
  return true;
}

struct Inputs {
  Tensor<float> q, k, v, g;
};

// NaN and Inf written into the rows of Q no key is attended by (dead queries) and the rows of K and
// V no query attends (dead keys); returns how many rows it spoiled.
index_t spoil_masked_rows(const Pattern& p, Inputs& in) {
  const index_t B = in.q.dim(0), H = in.q.dim(1), n = in.q.dim(2), m = in.k.dim(2);
  index_t spoiled = 0;
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h) {
      for (index_t i = 0; i < n; ++i) {
        bool dead = true;
        for (index_t j = 0; j < m && dead; ++j) dead = !attends(p, n, m, b, h, i, j);
        if (!dead) continue;
        ++spoiled;
        for (index_t c = 0; c < in.q.dim(3); ++c) in.q(b, h, i, c) = c % 2 ? NAN : INFINITY;
      }
      for (index_t j = 0; j < m; ++j) {
        bool dead = true;
        for (index_t i = 0; i < n && dead; ++i) dead = !attends(p, n, m, b, h, i, j);
        if (!dead) continue;
        ++spoiled;
        for (index_t c = 0; c < in.k.dim(3); ++c) in.k(b, h, j, c) = c % 2 ? -INFINITY : NAN;
        for (index_t c = 0; c < in.v.dim(3); ++c) in.v(b, h, j, c) = c % 2 ? NAN : INFINITY;
      }
    }
  return spoiled;
}

// out, lse, dq, dk, dv in precision T.
template <class T>
std::vector<Tensor<T>> run_sdpa(const Pattern& p, const Inputs& in) {
  const index_t B = in.q.dim(0), H = in.q.dim(1), n = in.q.dim(2), m = in.k.dim(2), d = in.q.dim(3), dv = in.v.dim(3);
  const Tensor<T> q = convert<T>(in.q), k = convert<T>(in.k), v = convert<T>(in.v), g = convert<T>(in.g);
  const MaskTensors<T> masks(p, n, m);
  const Mask<T> mask = masks.mask();
  Tensor<T> out({B, H, n, dv}), lse({B, H, n}), dq({B, H, n, d}), dk({B, H, m, d}), dvals({B, H, m, dv});
  sdpa_forward<T>(out.view(), lse.view(), {}, q.view(), k.view(), v.view(), mask);
  sdpa_backward<T>(dq.view(), dk.view(), dvals.view(), g.view(), q.view(), k.view(), v.view(), out.view(), lse.view(),
                   mask);
  return {out, lse, dq, dk, dvals};
}

const std::vector<std::int64_t> kLens{150, 97};

class MaskPatterns : public ::testing::TestWithParam<Pattern> {};

// The cpu backend against the float64 reference on `clean`, then the same results, bit for bit, in
// float32 and float64, with every key and value row that no query attends spoiled by NaN and Inf.
void expect_matches_reference_with_garbage_in_masked_rows(const Pattern& p, const Inputs& clean) {
  testing::expect_cpu_matches_reference([&]<class T>() { return run_sdpa<T>(p, clean); }, 1e-9);
  Inputs dirty = clean;
  const index_t spoiled = spoil_masked_rows(p, dirty);
  ScopedBackend cpu(Backend::cpu);
  for (const bool in_float64 : {false, true}) {
    std::vector<std::vector<double>> a, b;
    if (in_float64) {
      for (const auto& t : run_sdpa<double>(p, clean)) a.emplace_back(t.values().begin(), t.values().end());
      for (const auto& t : run_sdpa<double>(p, dirty)) b.emplace_back(t.values().begin(), t.values().end());
    } else {
      for (const auto& t : run_sdpa<float>(p, clean)) a.emplace_back(t.values().begin(), t.values().end());
      for (const auto& t : run_sdpa<float>(p, dirty)) b.emplace_back(t.values().begin(), t.values().end());
    }
    for (std::size_t t = 0; t < a.size(); ++t)
      EXPECT_EQ(a[t], b[t]) << "result " << t << (in_float64 ? " in float64" : " in float32") << " with " << spoiled
                            << " rows of NaN and Inf";
  }
}

// 3 query blocks (the last partial) x 4 key tiles (the last partial), 2 batches, 2 heads.
TEST_P(MaskPatterns, MatchFloat64ReferenceWithGarbageInMaskedPositions) {
  const index_t B = 2, H = 2, n = 150, m = 203, d = 24, dv = 16;
  expect_matches_reference_with_garbage_in_masked_rows(
      GetParam(), Inputs{random_tensor<float>({B, H, n, d}, 1, -2, 2), random_tensor<float>({B, H, m, d}, 2, -2, 2),
                         random_tensor<float>({B, H, m, dv}, 3), random_tensor<float>({B, H, n, dv}, 4)});
}

// A few queries over many keys: the decode path under the same masks, its rows one at a time (v = 8
// is not a multiple of AVX-512's 16 lanes) and its rows in packs that share each key and value row
// (d, v multiples of every target's lanes; simd/sdpa_decode.cpp), also with garbage in masked rows.
TEST_P(MaskPatterns, DecodeMatchesFloat64Reference) {
  const Pattern& p = GetParam();
  const index_t B = 2, H = 2, n = 3, m = 1500;
  for (const auto& [d, dv] : {std::pair<index_t, index_t>{16, 8}, {32, 16}}) {
    SCOPED_TRACE("d = " + std::to_string(d) + ", v = " + std::to_string(dv));
    const Inputs in{random_tensor<float>({B, H, n, d}, 5, -2, 2), random_tensor<float>({B, H, m, d}, 6, -2, 2),
                    random_tensor<float>({B, H, m, dv}, 7), random_tensor<float>({B, H, n, dv}, 8)};
    if (d == 16) testing::expect_cpu_matches_reference([&]<class T>() { return run_sdpa<T>(p, in); }, 1e-9);
    else expect_matches_reference_with_garbage_in_masked_rows(p, in);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Sdpa, MaskPatterns,
    ::testing::Values(
        Pattern{"key_padding_prefix", Keep::prefix, {2, 1, 1, kM}},
        Pattern{"key_padding_prefix_2d", Keep::prefix, {kM}},
        Pattern{"key_padding_holes", Keep::holes, {2, 1, 1, kM}},
        Pattern{"keep_full", Keep::tiles, {2, 2, kN, kM}},
        Pattern{"keep_per_head", Keep::tiles, {1, 2, kN, kM}},
        Pattern{"keep_per_batch", Keep::tiles, {2, 1, kN, kM}},
        Pattern{"keep_2d", Keep::tiles, {kN, kM}},
        Pattern{"keep_strided", Keep::tiles, {2, 1, kN, kM}, Bias::none, {}, true},
        Pattern{"keep_all", Keep::all, {kN, kM}},
        Pattern{"keep_expanded", Keep::holes, {2, 1, 1, kM}, Bias::none, {}, false, {}, Causal::none, {2, 2, kN, kM}},
        Pattern{"keep_expanded_queries", Keep::tiles, {1, 1, kN, 1}, Bias::none, {}, false, {}, Causal::none,
                {2, 2, kN, kM}},
        Pattern{"block_sparse", Keep::checkerboard, {1, 1, kN, kM}},
        Pattern{"causal_tensor", Keep::causal, {kN, kM}},
        Pattern{"additive_full", Keep::none, {}, Bias::tiles, {2, 2, kN, kM}},
        Pattern{"additive_2d", Keep::none, {}, Bias::tiles, {kN, kM}},
        Pattern{"additive_per_batch", Keep::none, {}, Bias::tiles, {2, 1, kN, kM}},
        Pattern{"additive_strided", Keep::none, {}, Bias::tiles, {1, 2, kN, kM}, true},
        Pattern{"additive_keys", Keep::none, {}, Bias::keys, {2, 1, 1, kM}},
        Pattern{"additive_queries", Keep::none, {}, Bias::queries, {2, 1, kN, 1}},
        Pattern{"additive_expanded", Keep::none, {}, Bias::keys, {1, 1, 1, kM}, false, {}, Causal::none,
                {2, 2, kN, kM}},
        Pattern{"additive_zero", Keep::none, {}, Bias::zero, {1, 1, kN, kM}},
        Pattern{"additive_checkerboard", Keep::none, {}, Bias::checkerboard, {kN, kM}},
        Pattern{"key_padding_and_lengths", Keep::prefix, {2, 1, 1, kM}, Bias::none, {}, false, kLens},
        Pattern{"everything", Keep::tiles, {2, 1, kN, kM}, Bias::tiles, {1, 2, kN, kM}, false, kLens,
                Causal::bottom_right}),
    [](const auto& info) { return std::string(info.param.name); });

// An additive mask every head reads (stride 0 over heads): the same results, bit for bit, as the
// same mask copied for each head, for one mask plane and one per batch element, with tiles of 0, of
// -inf and mixed, the last query block and key tile partial.
TEST(MaskTiles, AMaskSharedByTheHeadsGivesThePerHeadResults) {
  const index_t B = 2, H = 3, n = 150, m = 203, d = 24, dv = 16;
  const Tensor<double> q = random_tensor<double>({B, H, n, d}, 21, -2, 2), k = random_tensor<double>({B, H, m, d}, 22, -2, 2);
  const Tensor<double> v = random_tensor<double>({B, H, m, dv}, 23);
  ScopedBackend cpu(Backend::cpu);
  for (const index_t planes : {index_t(1), B}) {
    Tensor<double> shared({planes, 1, n, m}), per_head({B, H, n, m});
    for (index_t b = 0; b < B; ++b)
      for (index_t h = 0; h < H; ++h)
        for (index_t i = 0; i < n; ++i)
          for (index_t j = 0; j < m; ++j) {
            const double x = bias_at(Bias::tiles, planes == 1 ? 0 : b, 0, i, j);
            per_head(b, h, i, j) = x;
            if (h == 0 && (planes > 1 || b == 0)) shared(planes == 1 ? 0 : b, 0, i, j) = x;
          }
    const auto check = [&]<class T>() {
      const Tensor<T> qt = convert<T>(q), kt = convert<T>(k), vt = convert<T>(v);
      const Tensor<T> a = convert<T>(shared), c = convert<T>(per_head);
      std::vector<Tensor<T>> results;
      for (const Tensor<T>* bias : {&a, &c}) {
        Mask<T> mask;
        mask.additive = bias->view();
        Tensor<T> out({B, H, n, dv}), lse({B, H, n});
        sdpa_forward<T>(out.view(), lse.view(), {}, qt.view(), kt.view(), vt.view(), mask);
        results.push_back(out), results.push_back(lse);
      }
      EXPECT_EQ(results[0].values(), results[2].values()) << "out, planes " << planes;
      EXPECT_EQ(results[1].values(), results[3].values()) << "lse, planes " << planes;
    };
    check.template operator()<float>();
    check.template operator()<double>();
  }
}

// ---- tiles skipped and tiles left whole -----------------------------------------------------------

struct Counts {
  std::int64_t tiles, masked;
};

// The forward's (query block, key tile) pairs computed and masked under `mask`, (1, 1, 512, 512).
Counts forward_counts(const Mask<float>& mask) {
  const index_t n = 512, d = 16;
  const Tensor<float> q = random_tensor<float>({1, 1, n, d}, 11), k = random_tensor<float>({1, 1, n, d}, 12);
  const Tensor<float> v = random_tensor<float>({1, 1, n, d}, 13);
  Tensor<float> out({1, 1, n, d});
  ScopedBackend cpu(Backend::cpu);
  cpu::simd::reset_ran();
  sdpa_forward<float>(out.view(), {}, {}, q.view(), k.view(), v.view(), mask);
  return {cpu::simd::tiles(), cpu::simd::masked_tiles()};
}

Counts counts_of(const Pattern& p) {
  const MaskTensors<float> masks(p, 512, 512);
  return forward_counts(masks.mask());
}

constexpr std::int64_t kTilesPerSide = 512 / kTile, kAllTiles = kTilesPerSide * kTilesPerSide;

TEST(MaskTiles, EmptyTilesAreSkippedAndWholeTilesUnmasked) {
  // Block-sparse: half the tiles empty, the other half all kept.
  for (const Pattern& p : {Pattern{"bool", Keep::checkerboard, {1, 1, 512, 512}},
                           Pattern{"additive", Keep::none, {}, Bias::checkerboard, {512, 512}}}) {
    const Counts c = counts_of(p);
    EXPECT_EQ(c.tiles, kAllTiles / 2) << p.name;
    EXPECT_EQ(c.masked, 0) << p.name;
  }
  // Masks that change nothing: every tile computed, none masked.
  for (const Pattern& p : {Pattern{"all kept", Keep::all, {1, 1, 512, 512}},
                           Pattern{"zero bias", Keep::none, {}, Bias::zero, {512, 512}},
                           Pattern{"zero bias per key", Keep::none, {}, Bias::zero, {1, 1, 1, 512}}}) {
    const Counts c = counts_of(p);
    EXPECT_EQ(c.tiles, kAllTiles) << p.name;
    EXPECT_EQ(c.masked, 0) << p.name;
  }
  // A bias (not 0) is added on every tile.
  EXPECT_EQ(counts_of({"bias", Keep::none, {}, Bias::keys, {1, 1, 1, 512}}).masked, kAllTiles - kTilesPerSide);
}

TEST(MaskTiles, BoolCausalTensorRunsAsCausal) {
  Mask<float> causal;
  causal.causal = Causal::top_left;
  const Counts flag = forward_counts(causal), tensor = counts_of({"causal", Keep::causal, {512, 512}});
  EXPECT_EQ(flag.tiles, kTilesPerSide * (kTilesPerSide + 1) / 2);
  EXPECT_EQ(tensor.tiles, flag.tiles);
  EXPECT_EQ(tensor.masked, flag.masked);  // the diagonal tiles alone
  EXPECT_EQ(flag.masked, kTilesPerSide);
}

// A bool key-padding mask of prefixes is run as valid lengths: the same tiles and the same bits.
TEST(MaskTiles, KeyPaddingPrefixesRunAsValidLengths) {
  const index_t B = 2, H = 2, n = 300, m = 300, d = 16;
  const Tensor<float> q = random_tensor<float>({B, H, n, d}, 21), k = random_tensor<float>({B, H, m, d}, 22);
  const Tensor<float> v = random_tensor<float>({B, H, m, d}, 23), g = random_tensor<float>({B, H, n, d}, 24);
  const Tensor<std::int64_t> lens({B}, {130, 64});
  Tensor<bool> keep({B, 1, 1, m});
  for (index_t b = 0; b < B; ++b)
    for (index_t j = 0; j < m; ++j) keep[b * m + j] = j < lens[b];
  ScopedBackend cpu(Backend::cpu);
  auto run = [&](const Mask<float>& mask) {
    Tensor<float> out({B, H, n, d}), lse({B, H, n}), dq({B, H, n, d}), dk({B, H, m, d}), dv({B, H, m, d});
    cpu::simd::reset_ran();
    sdpa_forward<float>(out.view(), lse.view(), {}, q.view(), k.view(), v.view(), mask);
    const std::int64_t tiles = cpu::simd::tiles();
    sdpa_backward<float>(dq.view(), dk.view(), dv.view(), g.view(), q.view(), k.view(), v.view(), out.view(),
                         lse.view(), mask);
    return std::pair{tiles, std::vector<Tensor<float>>{out, lse, dq, dk, dv}};
  };
  Mask<float> as_lens, as_keep;
  as_lens.valid_lens = lens.view();
  as_keep.keep = keep.view();
  const auto [lens_tiles, by_lens] = run(as_lens);
  const auto [keep_tiles, by_keep] = run(as_keep);
  EXPECT_EQ(keep_tiles, lens_tiles);
  EXPECT_EQ(lens_tiles, H * 5 * (3 + 1));  // 5 query blocks; 130 keys are 3 tiles, 64 keys 1
  for (std::size_t t = 0; t < by_lens.size(); ++t) EXPECT_EQ(by_lens[t].values(), by_keep[t].values()) << t;
}

// ---- additive attention under the same masks ----------------------------------------------------

template <class T>
std::vector<Tensor<T>> run_additive(const Pattern& p, const Inputs& in) {
  const index_t B = in.q.dim(0), n = in.q.dim(1), m = in.k.dim(1), hidden = 8;
  const Tensor<T> q = convert<T>(in.q), k = convert<T>(in.k), v = convert<T>(in.v), g = convert<T>(in.g);
  const Tensor<T> w_q = convert<T>(random_tensor<float>({hidden, q.dim(2)}, 31, -0.5, 0.5));
  const Tensor<T> w_k = convert<T>(random_tensor<float>({hidden, k.dim(2)}, 32, -0.5, 0.5));
  const Tensor<T> w_v = convert<T>(random_tensor<float>({hidden}, 33, -1, 1));
  const AdditiveParams<T> params{w_q.view(), w_k.view(), w_v.view()};
  const MaskTensors<T> masks(p, n, m);
  const Mask<T> mask = masks.mask();
  Tensor<T> out({B, n, v.dim(2)}), dq(q.shape()), dk(k.shape()), dv(v.shape());
  Tensor<T> dw_q(w_q.shape()), dw_k(w_k.shape()), dw_v(w_v.shape());
  additive_attention_forward<T>(out.view(), {}, q.view(), k.view(), v.view(), params, mask);
  additive_attention_backward<T>(dq.view(), dk.view(), dv.view(), {dw_q.view(), dw_k.view(), dw_v.view()}, g.view(),
                                 q.view(), k.view(), v.view(), params, mask);
  return {out, dq, dk, dv, dw_q, dw_k, dw_v};
}

TEST(MaskTiles, AdditiveAttentionUnderEachMask) {
  const index_t B = 2, n = 150, m = 203;
  const Inputs in{random_tensor<float>({B, n, 12}, 41), random_tensor<float>({B, m, 7}, 42),
                  random_tensor<float>({B, m, 5}, 43), random_tensor<float>({B, n, 5}, 44)};
  for (const Pattern& p : {Pattern{"key_padding_prefix", Keep::prefix, {2, 1, kM}},
                           Pattern{"key_padding_holes", Keep::holes, {2, 1, kM}},
                           Pattern{"keep_tiles", Keep::tiles, {2, kN, kM}},
                           Pattern{"block_sparse", Keep::checkerboard, {kN, kM}},
                           Pattern{"additive_tiles", Keep::none, {}, Bias::tiles, {2, kN, kM}},
                           Pattern{"additive_keys", Keep::none, {}, Bias::keys, {2, 1, kM}},
                           Pattern{"everything", Keep::tiles, {kN, kM}, Bias::tiles, {2, kN, kM}, true, kLens}}) {
    SCOPED_TRACE(p.name);
    testing::expect_cpu_matches_reference([&]<class T>() { return run_additive<T>(p, in); }, 1e-9);
  }
}

}  // namespace
}  // namespace attn
