// The units BlockState (cpu/simd/softmax-inl.h) is built from, each against a plain scalar
// evaluation of what it promises: the tile plan against a brute-force search for allowed keys, the
// keep-mask bits against the mask read key by key, soft-capping against cap tanh(x / cap) in double,
// ALiBi against x - slope |p - j|, the additive mask's tile against its entries, and the online
// softmax over several tiles against a two-pass softmax in double. The "-inl.h" units are compiled
// here for Highway's static target (the fused kernels' own suites run every compiled target).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include <hwy/highway.h>

#include "core/mask_plan.hpp"
#include "cpu/bias_classes.hpp"
#include "cpu/scratch.hpp"
#include "cpu/simd/fused.hpp"
#include "cpu/simd/mask_bits-inl.h"
#include "cpu/simd/online_softmax-inl.h"
#include "cpu/simd/score_mods-inl.h"
#include "cpu/simd/tile_plan.hpp"
#include "support/testing.hpp"

namespace attn {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
namespace units = cpu::fused::HWY_NAMESPACE;
using cpu::fused::BlockArrays;
using cpu::fused::kBlockK;
using cpu::fused::kBlockQ;
using cpu::fused::KeyRange;
using cpu::fused::TilePlan;

constexpr float kInf = std::numeric_limits<float>::infinity();

// A block's arrays (BlockArrays) over 64-byte aligned memory, as the kernels' scratch gives them.
struct Block {
  void* mem;
  BlockArrays<float> a;
  static void* alloc(index_t d, index_t v) {
    const std::size_t bytes = (cpu::layout_bytes<BlockArrays<float>>(d, v) + 63) / 64 * 64;
    return std::aligned_alloc(64, bytes);
  }
  static BlockArrays<float> carve(void* mem, index_t d, index_t v) {
    cpu::Carve c(mem, cpu::layout_bytes<BlockArrays<float>>(d, v));
    return BlockArrays<float>(c, d, v);
  }
  Block(index_t d, index_t v) : mem(alloc(d, v)), a(carve(mem, d, v)) {}
  ~Block() { std::free(mem); }
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;
};

// A mask of n queries over m keys (B = H = 1) with the structural parts the tile plan reads.
struct MaskCase {
  const char* name;
  index_t n, m;
  bool causal = false;
  index_t offset = 0;
  index_t left = -1, right = -1;  // window; -1: none on that side
  bool lens = false;              // valid lengths varying by row
  bool segments = false;          // packed sequences
};

struct BuiltMask {
  std::vector<std::int64_t> lens;
  std::vector<std::int32_t> seg_q, seg_k;
  MaskPlan<float> plan;
};

void build(const MaskCase& c, BuiltMask& out) {
  MaskPlan<float>& p = out.plan;
  p.B = 1, p.H = 1, p.n = c.n, p.m = c.m;
  p.causal = c.causal, p.offset = c.offset;
  if (c.left >= 0 || c.right >= 0) p.window = true, p.window_left = c.left, p.window_right = c.right;
  if (c.lens) {
    for (index_t i = 0; i < c.n; ++i) out.lens.push_back((i * 37) % (c.m + 1));
    p.lens = out.lens.data(), p.lens_sb = 0, p.lens_si = 1;
  }
  if (c.segments) {
    // Queries and keys in three packed sequences: queries [0, 40) [40, 100) [100, n), keys [0, 70)
    // [70, 160) [160, m).
    for (index_t i = 0; i < c.n; ++i) out.seg_q.push_back(i < 40 ? 0 : i < 100 ? 1 : 2);
    for (index_t j = 0; j < c.m; ++j) out.seg_k.push_back(j < 70 ? 0 : j < 160 ? 1 : 2);
    p.seg_q.i32 = out.seg_q.data(), p.seg_q.stride = 1;
    p.seg_k.i32 = out.seg_k.data(), p.seg_k.stride = 1;
  }
}

// Every tile that holds a key some row of the block attends lies inside the planned range and is
// not skipped for its segments; a tile the plan calls whole (or uncut) is attended key by key.
TEST(BlockUnits, TilePlanKeepsEveryTileWithAnAllowedKey) {
  const MaskCase cases[] = {
      {"none", 150, 200},
      {"causal", 150, 200, true},
      {"causal bottom-right", 150, 300, true, 150},
      {"window", 200, 300, false, 0, 70, 10},
      {"window left only", 200, 300, false, 0, 90, -1},
      {"valid lengths", 150, 200, false, 0, -1, -1, true},
      {"segments", 150, 250, false, 0, -1, -1, false, true},
      {"causal segments", 150, 250, true, 0, -1, -1, false, true},
  };
  for (const MaskCase& c : cases) {
    SCOPED_TRACE(c.name);
    BuiltMask built;
    build(c, built);
    const MaskPlan<float>& mask = built.plan;
    std::vector<RowMask<float>> rm(kBlockQ);
    index_t visited = 0, skipped = 0;
    for (index_t i0 = 0; i0 < c.n; i0 += kBlockQ) {
      const index_t rows = std::min(kBlockQ, c.n - i0);
      for (index_t i = 0; i < rows; ++i) rm[i] = mask.row(0, 0, i0 + i);
      TilePlan<float> tiles;
      const KeyRange range = tiles.plan(mask, 0, rm.data(), rows);
      EXPECT_EQ(range.begin % kBlockK, 0);
      for (index_t j0 = 0; j0 < c.m; j0 += kBlockK) {
        const index_t cnt = std::min(kBlockK, c.m - j0);
        bool any = false, all = true, in_ranges = true;
        for (index_t i = 0; i < rows; ++i)
          for (index_t j = j0; j < j0 + cnt; ++j) {
            const bool allowed = rm[i].allowed(j);
            any = any || allowed, all = all && allowed;
            in_ranges = in_ranges && j >= rm[i].begin && j < rm[i].end;
          }
        const bool visits = j0 < range.end && j0 + cnt > range.begin && tiles.segments_meet(j0, cnt);
        visits ? ++visited : ++skipped;
        if (any) {
          EXPECT_TRUE(visits) << "tile at " << j0 << " of block " << i0 << " holds an allowed key";
        }
        if (!tiles.cuts(j0, cnt)) {
          EXPECT_TRUE(in_ranges) << "tile at " << j0 << " of block " << i0;
        }
        if (tiles.whole(j0, cnt)) {
          EXPECT_EQ(rows, kBlockQ);
          EXPECT_TRUE(in_ranges);
          if (!c.segments) {
            EXPECT_TRUE(all) << "tile at " << j0 << " of block " << i0;
          }
        }
        if (c.segments && tiles.uniform_segments(j0, cnt)) {
          for (index_t i = 0; i < rows; ++i)
            for (index_t j = j0; j < j0 + cnt; ++j) EXPECT_EQ(built.seg_q[i0 + i], built.seg_k[j]);
        }
      }
    }
    EXPECT_GT(visited, 0);
    if (c.causal || c.left >= 0 || c.segments) {
      EXPECT_GT(skipped, 0) << "a mask that rules out tiles skips some";
    }
  }
}

// Under the d2l chapter's -1e6 fill every key takes part in every row: no tile is skipped.
TEST(BlockUnits, TilePlanUnderTheD2lFillVisitsEveryKey) {
  BuiltMask built;
  build({"causal segments", 100, 250, true, 0, -1, -1, false, true}, built);
  built.plan.d2l_fill = true;
  std::vector<RowMask<float>> rm(kBlockQ);
  for (index_t i = 0; i < kBlockQ; ++i) rm[i] = built.plan.row(0, 0, i);
  TilePlan<float> tiles;
  const KeyRange range = tiles.plan(built.plan, 0, rm.data(), kBlockQ);
  EXPECT_EQ(range.begin, 0);
  EXPECT_EQ(range.end, 250);
  for (index_t j0 = 0; j0 < 250; j0 += kBlockK) EXPECT_TRUE(tiles.segments_meet(j0, std::min<index_t>(kBlockK, 250 - j0)));
}

// A block whose rows attend no key plans no tile.
TEST(BlockUnits, TilePlanOfRowsWithNoKeyIsEmpty) {
  BuiltMask built;
  build({"valid lengths", 10, 200, false, 0, -1, -1, true}, built);
  std::vector<std::int64_t> zeros(10, 0);
  built.plan.lens = zeros.data();
  std::vector<RowMask<float>> rm(10);
  for (index_t i = 0; i < 10; ++i) rm[i] = built.plan.row(0, 0, i);
  TilePlan<float> tiles;
  const KeyRange range = tiles.plan(built.plan, 0, rm.data(), 10);
  EXPECT_GE(range.begin, range.end);
}

// Lane i of a mask as bools.
template <class D>
std::vector<bool> lanes_of(D d, hn::Mask<D> mask) {
  const index_t L = static_cast<index_t>(hn::Lanes(d));
  std::vector<float> v(static_cast<std::size_t>(L));
  hn::StoreU(hn::IfThenElseZero(mask, hn::Set(d, 1.0f)), d, v.data());
  std::vector<bool> out;
  for (float x : v) out.push_back(x != 0);
  return out;
}

// The keep-mask's bits of a tile, for rows of stride 1 and 3 over keys, shared rows, partial tiles
// and partial blocks, against the mask read key by key.
TEST(BlockUnits, KeepBitsMatchTheMaskKeyByKey) {
  std::mt19937 gen(7);
  const hn::ScalableTag<float> d;
  const index_t L = static_cast<index_t>(hn::Lanes(d));
  Block block(8, 8);
  for (const index_t stride : {index_t(1), index_t(3)})
    for (const bool shared : {false, true})
      for (const index_t rows : {kBlockQ, index_t(37)})
        for (const int density : {0, 1, 50, 99, 100}) {  // percent of keys kept
          SCOPED_TRACE(::testing::Message() << "stride " << stride << " shared " << shared << " rows " << rows
                                          << " density " << density);
          const index_t m = 150;
          std::vector<char> storage(static_cast<std::size_t>(kBlockQ * m * stride));
          std::uniform_int_distribution<int> pct(0, 99);
          for (char& x : storage) x = pct(gen) < density;
          const bool* keep = reinterpret_cast<const bool*>(storage.data());
          MaskPlan<float> mask;
          mask.B = mask.H = 1, mask.n = kBlockQ, mask.m = m;
          mask.keep = keep;
          mask.keep_s[2] = shared ? 0 : m * stride, mask.keep_s[3] = stride;
          std::vector<RowMask<float>> rm(kBlockQ);
          for (index_t i = 0; i < rows; ++i) rm[i] = mask.row(0, 0, i);
          const auto kept_at = [&](index_t i, index_t j) { return rm[i].keep[j * stride]; };
          units::KeepBits<float> bits(block.a.keep_words);
          bits.start(mask);
          EXPECT_TRUE(bits.has_keep);
          EXPECT_EQ(bits.keep_rows_shared, shared);
          for (index_t j0 = 0; j0 < m; j0 += kBlockK) {
            const index_t cnt = std::min(kBlockK, m - j0);
            bool any = false, all = true;
            for (index_t i = 0; i < rows; ++i) {
              std::uint64_t direct = 0;
              for (index_t jj = 0; jj < cnt; ++jj) {
                direct |= std::uint64_t(kept_at(i, j0 + jj)) << jj;
                any = any || kept_at(i, j0 + jj), all = all && kept_at(i, j0 + jj);
              }
              EXPECT_EQ(units::KeepBits<float>::RowKeepBits(rm[i].keep + j0 * stride, stride, cnt), direct);
            }
            EXPECT_EQ(bits.look_at_keep(rm.data(), rows, j0, cnt), any);
            EXPECT_EQ(bits.tile_keep, !all);
            if (!bits.tile_keep) continue;
            for (index_t jj = 0; jj < cnt; ++jj)
              for (index_t i = 0; i < kBlockQ; i += L) {
                const std::vector<bool> got = lanes_of(d, bits.kept(d, jj, i));
                for (index_t l = 0; l < L; ++l)
                  ASSERT_EQ(got[l], i + l < rows && kept_at(i + l, j0 + jj)) << "key " << j0 + jj << " lane " << i + l;
              }
          }
        }
}

// Soft-capping's cap tanh(x / cap), as the kernels form it, within 2 float ulps of cap (the accurate
// tanh is within 1.2 ulps of tanh; the products add half an ulp each) of the value in double.
TEST(BlockUnits, CapTanhIsCapTimesTanhOfScoreOverCap) {
  const hn::ScalableTag<float> d;
  const index_t L = static_cast<index_t>(hn::Lanes(d));
  std::mt19937 gen(11);
  std::uniform_real_distribution<float> score(-200.0f, 200.0f);
  std::vector<float> x(4096), t(4096);
  for (float& v : x) v = score(gen);
  x[0] = 0, x[1] = -0.0f, x[2] = 1e-30f, x[3] = 3e4f, x[4] = -kInf, x[5] = kInf;
  for (const float cap : {1.0f, 20.0f, 30.0f, 50.0f}) {
    const auto vcap = hn::Set(d, cap), vinv = hn::Set(d, 1.0f / cap);
    for (std::size_t e = 0; e < x.size(); e += static_cast<std::size_t>(L))
      hn::StoreU(hn::Mul(vcap, units::CapTanh(d, hn::LoadU(d, x.data() + e), vinv)), d, t.data() + e);
    for (std::size_t e = 0; e < x.size(); ++e) {
      const double want = cap * std::tanh(static_cast<double>(x[e]) / cap);
      ASSERT_NEAR(t[e], want, 2 * cap * 0x1p-24 + std::abs(want) * 0x1p-22) << "x " << x[e] << " cap " << cap;
      ASSERT_LE(std::abs(t[e]), cap);
    }
  }
}

// ALiBi: x - slope |p - j| for every lane, within one rounding of the value in double.
TEST(BlockUnits, AddAlibiSubtractsSlopeTimesDistance) {
  const hn::ScalableTag<float> d;
  const index_t L = static_cast<index_t>(hn::Lanes(d));
  std::mt19937 gen(3);
  std::uniform_real_distribution<float> score(-10.0f, 10.0f);
  std::vector<float> x(kBlockQ), p(kBlockQ), out(kBlockQ);
  for (index_t i = 0; i < kBlockQ; ++i) x[i] = score(gen), p[i] = static_cast<float>(100 + 3 * i);
  for (const float slope : {0.5f, 0.0625f, 0.00390625f, 0.3f})
    for (const index_t j : {index_t(0), index_t(100), index_t(250), index_t(4000)}) {
      for (index_t i = 0; i < kBlockQ; i += L)
        hn::StoreU(units::AddAlibi(d, hn::LoadU(d, x.data() + i), slope, hn::LoadU(d, p.data() + i),
                                  hn::Set(d, static_cast<float>(j))),
                   d, out.data() + i);
      for (index_t i = 0; i < kBlockQ; ++i) {
        const double want = static_cast<double>(x[i]) - static_cast<double>(slope) * std::abs(p[i] - static_cast<double>(j));
        ASSERT_NEAR(out[i], want, std::abs(want) * 0x1p-23 + std::abs(slope * (p[i] - j)) * 0x1p-24)
            << "slope " << slope << " lane " << i << " key " << j;
      }
    }
}

// The additive mask's tile: whether it masks every key, adds something, masks some key, and its
// entries as lanes, for rows of stride 1 and 2 over keys and shared rows, against the entries; and
// the same answers from the call's table of tile classes (the mask broadcast over two heads): the
// first head's blocks fill its cells, the second's read them (a whole block; a partial one, of 21
// rows, scans every time).
TEST(BlockUnits, BiasTileReadsTheAdditiveMaskEntries) {
  const hn::ScalableTag<float> d;
  const index_t L = static_cast<index_t>(hn::Lanes(d));
  std::mt19937 gen(5);
  Block block(8, 8);
  const index_t m = 140;
  enum Fill { zeros, all_masked, values, values_and_masked };
  for (const index_t stride : {index_t(1), index_t(2)})
    for (const bool shared : {false, true})
      for (const index_t rows : {kBlockQ, index_t(21)})
        for (const Fill fill : {zeros, all_masked, values, values_and_masked}) {
          SCOPED_TRACE(::testing::Message() << "stride " << stride << " shared " << shared << " rows " << rows
                                          << " fill " << fill);
          std::vector<float> bias(static_cast<std::size_t>(kBlockQ * m * stride));
          std::uniform_real_distribution<float> value(-3.0f, 3.0f);
          std::uniform_int_distribution<int> pct(0, 99);
          for (float& v : bias)
            v = fill == zeros ? 0.0f : fill == all_masked ? -kInf : fill == values_and_masked && pct(gen) < 30 ? -kInf : value(gen);
          MaskPlan<float> mask;
          mask.B = 1, mask.H = 2, mask.n = kBlockQ, mask.m = m;
          mask.bias = bias.data();
          mask.bias_s[2] = shared ? 0 : m * stride, mask.bias_s[3] = stride;
          const attn::cpu::BiasClassesFor<float> classes(mask, kBlockQ, kBlockK);
          ASSERT_NE(mask.bias_classes, nullptr);
          std::vector<RowMask<float>> rm(kBlockQ);
          for (index_t i = 0; i < rows; ++i) rm[i] = mask.row(0, 0, i);
          const auto entry = [&](index_t i, index_t j) { return rm[i].bias[j * stride]; };
          for (const index_t head : {0, 1}) {
            units::BiasTile<float> tile(block.a.bias_rows, block.a.bias_t);
            tile.start(mask, 0, head, 0, rows);
            for (index_t j0 = 0; j0 < m; j0 += kBlockK) {
              const index_t cnt = std::min(kBlockK, m - j0);
              bool finite = false, nonzero = false, masks = false;
              for (index_t i = 0; i < rows; ++i)
                for (index_t j = j0; j < j0 + cnt; ++j) {
                  finite = finite || entry(i, j) != -kInf;
                  nonzero = nonzero || entry(i, j) != 0;
                  masks = masks || entry(i, j) == -kInf;
                }
              const std::uint8_t cell = mask.bias_classes->row(0, head, 0)[j0 / kBlockK].load();
              EXPECT_EQ(cell != 0, head == 1 && rows == kBlockQ) << "the cell of keys " << j0 << " before the look";
              EXPECT_EQ(tile.look_at_bias(rm.data(), rows, j0, cnt), finite);
              EXPECT_EQ(tile.tile_bias, nonzero);
              EXPECT_EQ(tile.tile_bias_masks, masks);
              if (!tile.tile_bias || !finite) continue;
              std::vector<float> got(static_cast<std::size_t>(L));
              for (index_t jj = 0; jj < cnt; ++jj)
                for (index_t i = 0; i < kBlockQ; i += L) {
                  hn::StoreU(tile.lanes(d, jj, i), d, got.data());
                  for (index_t l = 0; l < L && i + l < rows; ++l)
                    ASSERT_EQ(got[l], entry(i + l, j0 + jj)) << "key " << j0 + jj << " lane " << i + l;
                }
            }
          }
        }
}

// The call's table of tile classes is made only where some tile is read by more than one block, with
// strides 0 over the axes the mask broadcasts over: cells of (b, h, row block, key tile).
TEST(BlockUnits, BiasTileClassesOnlyForMasksReadMoreThanOnce) {
  std::vector<float> bias(1);
  MaskPlan<float> mask;
  mask.B = 2, mask.H = 3, mask.n = 130, mask.m = 200;  // 3 row blocks, 4 key tiles
  mask.bias = bias.data();
  const auto table = [&](index_t sb, index_t sh, index_t sr) {
    mask.bias_classes = nullptr;
    mask.bias_s[0] = sb, mask.bias_s[1] = sh, mask.bias_s[2] = sr, mask.bias_s[3] = 1;
    return std::make_unique<attn::cpu::BiasClassesFor<float>>(mask, kBlockQ, kBlockK);
  };
  auto full = table(3 * 130 * 200, 130 * 200, 200);
  EXPECT_EQ(mask.bias_classes, nullptr) << "a mask of (B, H, n, m): every tile read once";
  auto per_head = table(0, 130 * 200, 200);  // (1, H, n, m) over a batch of 2
  ASSERT_NE(mask.bias_classes, nullptr);
  const BiasTileClasses& t = *mask.bias_classes;
  EXPECT_EQ(t.row(1, 2, 128) - t.row(0, 0, 0), 2 * 3 * 4 + 2 * 4) << "b ignored; head 2, row block 2";
  auto shared_rows = table(0, 0, 0);  // (1, 1, 1, m)
  ASSERT_NE(mask.bias_classes, nullptr);
  EXPECT_EQ(mask.bias_classes->row(1, 2, 128), mask.bias_classes->row(0, 0, 0));
}

// The online softmax over tiles of 64, 64 and 23 keys, with the partial output rescaled as each tile
// arrives (out^T += V^T W after rescale), against a two-pass softmax in double: the maximum exactly,
// the sum and the normalised output within float rounding. Rows cover scores that overflow exp
// without the maximum subtracted, masked (-inf) keys, a row with every key masked (max -inf, sum
// 0), and the scale applied inside the step (the plain tile's path) as well as before it.
TEST(BlockUnits, OnlineSoftmaxMatchesTwoPassSoftmax) {
  const hn::ScalableTag<float> d;
  const index_t v = 3, m = 151;
  std::mt19937 gen(13);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::vector<float> scores(static_cast<std::size_t>(kBlockQ * m)), values(static_cast<std::size_t>(m * v));
  for (index_t i = 0; i < kBlockQ; ++i)
    for (index_t j = 0; j < m; ++j) {
      float x = normal(gen);
      if (i % 5 == 1) x += 300.0f;                   // exp overflows without the maximum subtracted
      if (i % 7 == 2 && (j * 13 + i) % 3 == 0) x = -kInf;  // masked keys
      if (i == 10) x = -kInf;                        // every key masked
      if (i == 11 && j < 100) x = -kInf;             // the first tiles all masked, then keys
      scores[i * m + j] = x;
    }
  for (float& x : values) x = normal(gen);
  for (const float scale : {1.0f, 0.125f}) {
    for (const bool in_step : {false, true}) {
      if (scale == 1.0f && in_step) continue;
      SCOPED_TRACE(::testing::Message() << "scale " << scale << (in_step ? " in the step" : " before it"));
      Block block(8, v);
      units::OnlineSoftmax<float> online{block.a.s, block.a.max, block.a.alpha, block.a.sum, block.a.tsum};
      online.reset();
      float* ot = block.a.ot;
      std::fill(ot, ot + v * kBlockQ, 0.0f);
      for (index_t j0 = 0; j0 < m; j0 += kBlockK) {
        const index_t cnt = std::min(kBlockK, m - j0);
        for (index_t jj = 0; jj < cnt; ++jj)
          for (index_t i = 0; i < kBlockQ; ++i) {
            const float x = scores[i * m + j0 + jj];
            block.a.s[jj * kBlockQ + i] = in_step ? x : x * scale;
          }
        online.step(d, cnt, in_step ? scale : 1.0f);
        online.rescale(d, ot, v);
        for (index_t c = 0; c < v; ++c)
          for (index_t i = 0; i < kBlockQ; ++i)
            for (index_t jj = 0; jj < cnt; ++jj)
              ot[c * kBlockQ + i] += block.a.s[jj * kBlockQ + i] * values[(j0 + jj) * v + c];
      }
      for (index_t i = 0; i < kBlockQ; ++i) {
        double mx = -std::numeric_limits<double>::infinity();
        for (index_t j = 0; j < m; ++j) mx = std::max(mx, static_cast<double>(scores[i * m + j] * scale));
        EXPECT_EQ(block.a.max[i], static_cast<float>(mx)) << "row " << i;
        if (mx == -std::numeric_limits<double>::infinity()) {
          EXPECT_EQ(block.a.sum[i], 0.0) << "row " << i;
          for (index_t c = 0; c < v; ++c) EXPECT_EQ(ot[c * kBlockQ + i], 0.0f);
          continue;
        }
        double sum = 0, out[3] = {0, 0, 0};
        for (index_t j = 0; j < m; ++j) {
          const double w = std::exp(static_cast<double>(scores[i * m + j] * scale) - mx);
          sum += w;
          for (index_t c = 0; c < v; ++c) out[c] += w * values[j * v + c];
        }
        EXPECT_NEAR(block.a.sum[i], sum, sum * 1e-6) << "row " << i;
        double bound = 0;  // the weighted values' magnitude: the rounding of each weight scales it
        for (index_t j = 0; j < m; ++j)
          bound += std::exp(static_cast<double>(scores[i * m + j] * scale) - mx) * std::abs(values[j * v]);
        for (index_t c = 0; c < v; ++c)
          EXPECT_NEAR(ot[c * kBlockQ + i] / block.a.sum[i], out[c] / sum, 1e-5 * (1 + bound / sum))
              << "row " << i << " column " << c;
      }
    }
  }
}

}  // namespace
}  // namespace attn
