// The int8 formats (cpu/quant/q8_0.hpp) against float64 formulas: q8_0 pack and unpack (each value
// within scale / 2 of its dequantised one, scale = max|x| / 127 per block of 32), with blocks of
// zeros, one huge value, float32's largest value, tiny and subnormal values, partial last blocks and
// non-finite values; the 16-bit query rounding (r = round(q / sigma) to nearest even, sigma = max|q|
// / 32767) and the rows it leaves as given. Registered for every SIMD target (round_query is
// compiled once per target). The 4-bit format (cpu/quant/q4.hpp): codes, scale and minimum of a group
// against float64 formulas, the nibble layout, and values at the group's ends, constant groups and
// the largest magnitude a cache stores. The 4-bit keys' integer scores (cpu/int8/dot_q4.hpp) against
// the float64 sums they stand for, where the CPU has AVX512-VNNI.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "cpu/int8/dot_int8.hpp"
#include "cpu/int8/dot_q4.hpp"
#include "cpu/quant/q4.hpp"
#include "cpu/quant/q8_0.hpp"
#include "cpu/simd/dispatch.hpp"
#include "support/testing.hpp"

namespace attn {
namespace {

using cpu::quant::kQ8Block;
using testing::random_tensor;

// x packed and unpacked.
struct Packed {
  std::vector<std::int8_t> q;
  std::vector<float> scales, back;
};
Packed pack(const std::vector<float>& x) {
  const auto count = static_cast<index_t>(x.size());
  Packed p{std::vector<std::int8_t>(x.size()), std::vector<float>(static_cast<std::size_t>(cpu::quant::q8_0_blocks(count))),
           std::vector<float>(x.size())};
  cpu::quant::q8_0_pack(x.data(), count, p.q.data(), p.scales.data());
  cpu::quant::q8_0_unpack(p.q.data(), p.scales.data(), count, p.back.data());
  return p;
}

// Checks block by block, in float64, for finite x: the scale is max|x| / 127 up to float32's
// rounding (or 0 for a block of zeros), |q| <= 127, q is x / scale to within 1/2 (plus float32's
// rounding of the quotient), and the dequantised value is within scale / 2 of x, up to float32's
// rounding of the scale, the quotient and the product (2^-15 scale) and, where the scale is
// subnormal, its rounding (2^-143).
void expect_within_half_a_scale(const std::vector<float>& x, const char* what) {
  const Packed p = pack(x);
  const auto count = static_cast<index_t>(x.size());
  ASSERT_EQ(static_cast<index_t>(p.scales.size()), (count + 31) / 32) << what;
  for (index_t g = 0; g < count; g += kQ8Block) {
    const index_t end = std::min(g + kQ8Block, count);
    double top = 0;
    for (index_t c = g; c < end; ++c) top = std::max(top, std::abs(static_cast<double>(x[static_cast<std::size_t>(c)])));
    const double scale = top / 127;  // the float64 formula
    const double stored = p.scales[static_cast<std::size_t>(g / kQ8Block)];
    if (top == 0) {
      EXPECT_EQ(stored, 0) << what << ", block " << g / kQ8Block;
    } else {
      EXPECT_LE(std::abs(stored - scale), scale * 0x1p-23 + 0x1p-149) << what << ", block " << g / kQ8Block;
    }
    for (index_t c = g; c < end; ++c) {
      const auto k = static_cast<std::size_t>(c);
      ASSERT_LE(std::abs(static_cast<int>(p.q[k])), 127) << what << ", element " << c;
      if (stored >= 0x1p-126) {  // the quotient x / s, with s a normal float
        ASSERT_LE(std::abs(p.q[k] - x[k] / stored), 0.5 + 0x1p-16) << what << ", element " << c;
      }
      ASSERT_TRUE(std::isfinite(p.back[k])) << what << ", element " << c;
      ASSERT_LE(std::abs(static_cast<double>(p.back[k]) - x[k]), scale * (0.5 + 0x1p-15) + 0x1p-143)
          << what << ", element " << c << " of " << x[k];
    }
  }
}

std::vector<float> values(index_t count, std::uint64_t seed, double lo, double hi) {
  const Tensor<float> t = random_tensor<float>({count}, seed, lo, hi);
  return std::vector<float>(t.data(), t.data() + count);
}

TEST(Q8_0, RoundTripWithinHalfAScale) {
  for (const index_t count : {32, 64, 1056})
    for (const double magnitude : {1.0, 1e-3, 1e6, 1e30, 1e-30})
      expect_within_half_a_scale(values(count, 1 + static_cast<std::uint64_t>(count), -magnitude, magnitude), "random");
}

// A last block of fewer than 32 values gets its own scale from its own values.
TEST(Q8_0, PartialLastBlock) {
  for (const index_t count : {1, 7, 31, 33, 47, 63, 65, 100}) {
    const std::vector<float> x = values(count, 20 + static_cast<std::uint64_t>(count), -3, 3);
    expect_within_half_a_scale(x, "partial");
    const Packed p = pack(x);
    // The largest magnitude of each block is stored as +-127.
    for (index_t g = 0; g < count; g += kQ8Block) {
      std::size_t top = static_cast<std::size_t>(g);
      for (index_t c = g; c < std::min(g + kQ8Block, count); ++c)
        if (std::abs(x[static_cast<std::size_t>(c)]) > std::abs(x[top])) top = static_cast<std::size_t>(c);
      EXPECT_EQ(std::abs(static_cast<int>(p.q[top])), 127) << count << ", block " << g / kQ8Block;
    }
  }
  const Packed none = pack({});
  EXPECT_TRUE(none.scales.empty());
}

// A block of zeros (of either sign) has scale 0 and stores 0; the blocks beside it are unaffected.
TEST(Q8_0, BlockOfZeros) {
  std::vector<float> x = values(96, 30, -2, 2);
  for (std::size_t c = 32; c < 64; ++c) x[c] = c % 2 == 0 ? 0.0f : -0.0f;
  const Packed p = pack(x);
  EXPECT_EQ(p.scales[1], 0.0f);
  for (std::size_t c = 32; c < 64; ++c) {
    EXPECT_EQ(p.q[c], 0) << c;
    EXPECT_EQ(p.back[c], 0.0f) << c;
  }
  EXPECT_GT(p.scales[0], 0.0f);
  EXPECT_GT(p.scales[2], 0.0f);
  expect_within_half_a_scale(x, "zeros");
}

// One huge value sets its block's scale: the others round to small integers or 0, within s / 2.
// At float32's largest value, max / 127 rounds up so far that 127 s would overflow: the scale is
// the next float below, and every value still dequantises to a finite one within the bound.
TEST(Q8_0, OneHugeValue) {
  for (const float huge : {1e20f, 3e38f, std::numeric_limits<float>::max(), -std::numeric_limits<float>::max()}) {
    std::vector<float> x = values(64, 40, -1, 1);
    x[5] = huge;
    x[40] = huge / 3;
    expect_within_half_a_scale(x, "huge");
    const Packed p = pack(x);
    EXPECT_EQ(p.q[5], huge > 0 ? 127 : -127) << huge;
    EXPECT_TRUE(std::isfinite(127.0f * p.scales[0])) << huge;
  }
}

// Tiny values down to float32's subnormals: subnormal scales, or a scale that rounds to 0 (then
// every value stores 0, within the bound's 2^-143).
TEST(Q8_0, TinyAndSubnormalValues) {
  for (const double tiny : {1e-30, 1.4e-36, 1e-38, 1e-40, 1e-43, 5e-44, 1e-45})
    expect_within_half_a_scale(values(64, 50, -tiny, tiny), "tiny");
}

// Non-finite values (the KV cache refuses them before packing): defined, never undefined
// behaviour. A NaN stores 0 and does not enter its block's scale; an infinity makes the scale
// infinite and every q of its block 0, so the block unpacks to NaN.
TEST(Q8_0, NonFiniteValues) {
  std::vector<float> x = values(96, 60, -2, 2);
  x[3] = std::numeric_limits<float>::quiet_NaN();
  x[40] = std::numeric_limits<float>::infinity();
  const Packed p = pack(x);
  EXPECT_EQ(p.q[3], 0);
  std::vector<float> finite(x.begin(), x.begin() + 32);
  finite[3] = 0;
  EXPECT_EQ(p.scales[0], pack(finite).scales[0]);
  EXPECT_TRUE(std::isinf(p.scales[1]));
  for (std::size_t c = 32; c < 64; ++c) EXPECT_EQ(p.q[c], 0) << c;
  for (std::size_t c = 32; c < 64; ++c) EXPECT_TRUE(std::isnan(p.back[c])) << c;
  expect_within_half_a_scale(std::vector<float>(x.begin() + 64, x.end()), "after the non-finite blocks");
  for (std::size_t c = 64; c < 96; ++c) EXPECT_EQ(p.q[c], pack(std::vector<float>(x.begin() + 64, x.end())).q[c - 64]);
}

// round_query against its float64 formula on the chosen target: sigma = max|q| / 32767 up to
// float32's rounding, |r| <= 32767 with the largest magnitude at +-32767, and r sigma within
// sigma / 2 of q up to float32's rounding of q / sigma (2^-7 sigma) and of r sigma (2^-24 max|q|).
TEST(QueryRounding, WithinHalfASigma) {
  const cpu::simd::Target target = cpu::simd::current();
  for (const index_t d : {32, 64, 1056})
    for (const double magnitude : {1.0, 1e-20, 1e20}) {
      const std::vector<float> q = values(d, 70 + static_cast<std::uint64_t>(d), -magnitude, magnitude);
      std::vector<std::int16_t> r(static_cast<std::size_t>(d));
      const float sigma = cpu::quant::round_query(target, q.data(), d, r.data());
      double top = 0;
      for (const float v : q) top = std::max(top, std::abs(static_cast<double>(v)));
      ASSERT_LE(std::abs(sigma - top / 32767), top / 32767 * 0x1p-23) << d << ", " << magnitude;
      int largest = 0;
      std::vector<float> out(static_cast<std::size_t>(d));
      cpu::quant::rounded_query(target, q.data(), d, r.data(), out.data());
      for (std::size_t c = 0; c < q.size(); ++c) {
        largest = std::max(largest, std::abs(static_cast<int>(r[c])));
        ASSERT_LE(std::abs(static_cast<double>(r[c]) * sigma - q[c]), top / 32767 * (0.5 + 0x1p-7) + top * 0x1p-24)
            << d << ", " << c;
        ASSERT_EQ(out[c], static_cast<float>(r[c]) * sigma) << c;
      }
      EXPECT_EQ(largest, 32767);
    }
}

// Ties round to nearest even: max|q| = 32767 makes sigma 1, so 2.5 rounds to 2, 3.5 to 4 and -2.5
// to -2 (away from zero: 3, 4 and -3).
TEST(QueryRounding, TiesToEven) {
  std::vector<float> q(32, 0.0f);
  q[0] = 32767, q[1] = 2.5f, q[2] = 3.5f, q[3] = -2.5f, q[4] = 0.5f, q[5] = 1.5f;
  std::vector<std::int16_t> r(32);
  EXPECT_EQ(cpu::quant::round_query(cpu::simd::current(), q.data(), 32, r.data()), 1.0f);
  EXPECT_EQ(r[0], 32767);
  EXPECT_EQ(r[1], 2);
  EXPECT_EQ(r[2], 4);
  EXPECT_EQ(r[3], -2);
  EXPECT_EQ(r[4], 0);
  EXPECT_EQ(r[5], 2);
}

// Rows used as given: sigma 0 and r untouched where max|q| is below 2^-100 (zeros among them) or
// some element is NaN or infinite; rounded_query then returns q itself.
TEST(QueryRounding, RowsUsedAsGiven) {
  const cpu::simd::Target target = cpu::simd::current();
  for (const index_t d : {32, 96}) {
    std::vector<std::vector<float>> rows(4, values(d, 80, -1, 1));
    for (float& v : rows[0]) v = 0;
    for (float& v : rows[1]) v *= 7e-31f;  // below 2^-100 ~ 7.9e-31
    rows[2][static_cast<std::size_t>(d - 1)] = std::numeric_limits<float>::quiet_NaN();
    rows[3][5] = -std::numeric_limits<float>::infinity();
    for (const auto& q : rows) {
      std::vector<std::int16_t> r(static_cast<std::size_t>(d), 12345);
      EXPECT_EQ(cpu::quant::round_query(target, q.data(), d, r.data()), 0.0f);
      for (const std::int16_t v : r) ASSERT_EQ(v, 12345);
      std::vector<float> out(q.size());
      cpu::quant::rounded_query(target, q.data(), d, r.data(), out.data());
      for (std::size_t c = 0; c < q.size(); ++c)
        ASSERT_TRUE(out[c] == q[c] || (std::isnan(out[c]) && std::isnan(q[c]))) << c;
    }
    // Just at 2^-100 the row is rounded.
    std::vector<float> q(static_cast<std::size_t>(d), 0x1p-101f);
    q[0] = 0x1p-100f;
    std::vector<std::int16_t> r(static_cast<std::size_t>(d));
    EXPECT_GT(cpu::quant::round_query(target, q.data(), d, r.data()), 0.0f);
    EXPECT_EQ(r[0], 32767);
  }
}

}  // namespace
}  // namespace attn

namespace attn {
namespace {

// A group quantized (q4_quantize, strided) against float64: lo the minimum exactly, the scale (max -
// lo) / 15 up to float32's rounding, each code within 1/2 (plus float32's rounding) of (x - lo) /
// scale and in [0, 15], the ends exact (the minimum's code 0, the maximum's 15), and each value
// q4_value within scale / 2 of x up to a few ulp of max|x|.
void check_group(const std::vector<float>& x, index_t stride) {
  std::vector<std::uint8_t> codes(32);
  float scale = 0, min = 0;
  cpu::quant::q4_quantize(x.data(), stride, codes.data(), scale, min);
  double lo = INFINITY, hi = -INFINITY, top = 0;
  for (index_t i = 0; i < 32; ++i) {
    const double e = x[static_cast<std::size_t>(i * stride)];
    lo = std::min(lo, e), hi = std::max(hi, e), top = std::max(top, std::abs(e));
  }
  ASSERT_EQ(min, lo);
  EXPECT_NEAR(scale, (hi - lo) / 15, (hi - lo) / 15 * 0x1p-23);
  for (index_t i = 0; i < 32; ++i) {
    const double e = x[static_cast<std::size_t>(i * stride)];
    const unsigned code = codes[static_cast<std::size_t>(i)];
    ASSERT_LE(code, 15u);
    if (scale == 0) {
      EXPECT_EQ(code, 0u);
      continue;
    }
    EXPECT_LE(std::abs((e - lo) / scale - code), 0.5 + 1e-5) << i;
    if (e == lo) EXPECT_EQ(code, 0u);
    if (e == hi) EXPECT_EQ(code, 15u);
    EXPECT_LE(std::abs(cpu::quant::q4_value(code, scale, min) - e), scale / 2.0 + top * 0x1p-21) << i;
  }
}

TEST(Q4, GroupsAgainstTheFormula) {
  const Tensor<float> x = random_tensor<float>({32 * 5}, 70, -3, 3);
  std::vector<float> v(x.data(), x.data() + 32 * 5);
  check_group(v, 1);
  check_group(v, 5);  // a channel of 32 tokens: every fifth value
  std::vector<float> same(32, 2.5f);  // a constant group: scale 0, every code 0, every value exact
  check_group(same, 1);
  std::vector<float> wide(32, 0.0f);
  wide[3] = -0x1p126f, wide[9] = 0x1p126f;  // the largest range a cache stores: finite
  check_group(wide, 1);
  std::vector<std::uint8_t> codes(32);
  float scale = 0, min = 0;
  cpu::quant::q4_quantize(wide.data(), 1, codes.data(), scale, min);
  EXPECT_TRUE(std::isfinite(scale));
  EXPECT_TRUE(std::isfinite(cpu::quant::q4_value(codes[9], scale, min)));  // the largest value reads back finite
}

// The layout: value c of a row at byte (c / 32) 16 + c % 16, low nibble for c % 32 < 16; pack and
// unpack agree with q4_quantize group by group.
TEST(Q4, RowLayoutAndRoundTrip) {
  const index_t d = 96;
  const Tensor<float> x = random_tensor<float>({d}, 71, -1, 1);
  std::vector<std::uint8_t> row(d / 2);
  std::vector<float> scales(d / 32), mins(d / 32), back(d);
  cpu::quant::q4_pack_row(x.data(), d, row.data(), scales.data(), mins.data());
  cpu::quant::q4_unpack_row(row.data(), scales.data(), mins.data(), d, back.data());
  for (index_t g = 0; g < d / 32; ++g) {
    std::vector<std::uint8_t> codes(32);
    float scale = 0, min = 0;
    cpu::quant::q4_quantize(x.data() + g * 32, 1, codes.data(), scale, min);
    EXPECT_EQ(scale, scales[static_cast<std::size_t>(g)]);
    EXPECT_EQ(min, mins[static_cast<std::size_t>(g)]);
    for (index_t i = 0; i < 32; ++i) {
      const std::uint8_t byte = row[static_cast<std::size_t>(g * 16 + i % 16)];
      EXPECT_EQ(i < 16 ? byte & 0xF : byte >> 4, codes[static_cast<std::size_t>(i)]) << g << ", " << i;
      EXPECT_EQ(back[static_cast<std::size_t>(g * 32 + i)], cpu::quant::q4_value(codes[static_cast<std::size_t>(i)], scale, min));
    }
  }
}

// q4_scores: for rows of every head size (whole chunks of 64 bytes, and a last chunk of 16, 32 or 48),
// 1 to 4 queries and tiles of any length, each score against its float64 formula sum_g scale_g
// sum r code + min_g sum r, within float32's rounding of the terms; and each query's scores the same
// bits whatever queries share the call.
TEST(Q4Scores, IntegerSumsMatchTheFormula) {
  if (!cpu::int8::has_avx512_vnni()) GTEST_SKIP() << "this CPU has no AVX512-VNNI: the 4-bit keys' scores take the float path";
  std::mt19937_64 gen(7);
  for (const index_t dim : {32, 64, 96, 128, 160, 256, 288}) {
    const index_t cnt = 19, groups = dim / 32, stride = dim / 2 + 16;  // rows apart by more than they hold
    std::vector<std::uint8_t> codes(static_cast<std::size_t>(cnt * stride));
    for (auto& b : codes) b = static_cast<std::uint8_t>(gen());
    std::vector<float> scales(static_cast<std::size_t>(cnt * groups)), mins(scales.size());
    for (std::size_t i = 0; i < scales.size(); ++i)
      scales[i] = std::ldexp(static_cast<float>(gen() % 1000 + 1), -static_cast<int>(gen() % 20)),
      mins[i] = static_cast<float>(static_cast<std::int64_t>(gen() % 2001) - 1000) / 7.0f;
    std::vector<std::vector<std::int16_t>> r(4, std::vector<std::int16_t>(static_cast<std::size_t>(dim)));
    std::vector<std::vector<std::uint8_t>> packed(4, std::vector<std::uint8_t>(static_cast<std::size_t>(cpu::int8::q4_query_bytes(dim))));
    for (int q = 0; q < 4; ++q) {
      for (auto& x : r[static_cast<std::size_t>(q)]) x = static_cast<std::int16_t>(static_cast<std::int64_t>(gen() % 65535) - 32767);
      r[static_cast<std::size_t>(q)][0] = q % 2 == 0 ? 32767 : -32767;  // the extremes round_query gives
      cpu::int8::q4_pack_query(r[static_cast<std::size_t>(q)].data(), dim, packed[static_cast<std::size_t>(q)].data());
    }
    const std::uint8_t* all[4] = {packed[0].data(), packed[1].data(), packed[2].data(), packed[3].data()};
    std::vector<std::vector<float>> alone(4, std::vector<float>(static_cast<std::size_t>(cnt)));
    for (int q = 0; q < 4; ++q) {
      float* out = alone[static_cast<std::size_t>(q)].data();
      cpu::int8::q4_scores(codes.data(), stride, scales.data(), mins.data(), groups, cnt, dim, 1, &all[q], &out);
      for (index_t j = 0; j < cnt; ++j) {
        double want = 0, size = 0;
        for (index_t g = 0; g < groups; ++g) {
          double dot = 0, sum = 0;
          for (index_t c = 32 * g; c < 32 * g + 32; ++c) {
            const double x = r[static_cast<std::size_t>(q)][static_cast<std::size_t>(c)];
            dot += x * cpu::quant::q4_code(codes.data() + j * stride, c), sum += x;
          }
          const double s = scales[static_cast<std::size_t>(j * groups + g)], m = mins[static_cast<std::size_t>(j * groups + g)];
          want += s * dot + m * sum, size += std::abs(s * dot) + std::abs(m * sum);
        }
        EXPECT_LE(std::abs(out[j] - want), 1e-6 * size) << "dim " << dim << ", query " << q << ", row " << j;
      }
    }
    for (const int rows : {2, 3, 4})
      for (const index_t length : {index_t{1}, index_t{4}, index_t{7}, cnt}) {
        std::vector<std::vector<float>> together(4, std::vector<float>(static_cast<std::size_t>(length)));
        float* outs[4] = {together[0].data(), together[1].data(), together[2].data(), together[3].data()};
        cpu::int8::q4_scores(codes.data(), stride, scales.data(), mins.data(), groups, length, dim, rows, all, outs);
        for (int q = 0; q < rows; ++q)
          for (index_t j = 0; j < length; ++j)
            ASSERT_EQ(together[static_cast<std::size_t>(q)][static_cast<std::size_t>(j)], alone[static_cast<std::size_t>(q)][static_cast<std::size_t>(j)])
                << "dim " << dim << ", " << rows << " queries, query " << q << ", row " << j;
      }
  }
}

}  // namespace
}  // namespace attn
