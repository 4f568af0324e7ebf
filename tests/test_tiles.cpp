// The AMX tile products (cpu/tiles/tiles.hpp) against the same sums computed exactly, with rows and
// depths that fill whole tiles and that do not (padded copies), and the rows of c past `rows`
// untouched. bfloat16: c (rows, 64) (+)= A B with A's words in rows or gathered through strides,
// accumulating or not; each output a sum of 2 pairs products of bfloat16 values (exact in float)
// added in float, so within 2 pairs 2^-24 of the sum of the terms' magnitudes of the float64 value.
// int8: signed rows of bytes (at any byte offset) times unsigned quads, equal to the int64 sums.
// Skipped, saying so, on a CPU without AMX-BF16 / AMX-INT8 (or where the system does not grant the
// tiles).
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "attn/half.hpp"
#include "cpu/tiles/tiles.hpp"

namespace attn {
namespace {

namespace tiles = cpu::tiles;
constexpr index_t kLanes = 64;

// A word of two random bfloat16 values in [-2, 2), and its two halves as doubles.
struct Words {
  std::vector<std::uint32_t> words;
  explicit Words(std::size_t count, std::uint32_t seed) : words(count) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    for (std::uint32_t& w : words) w = to_bfloat16(u(rng)).bits | static_cast<std::uint32_t>(to_bfloat16(u(rng)).bits) << 16;
  }
};
double low(std::uint32_t w) { return to_float(bfloat16::from_bits(static_cast<std::uint16_t>(w & 0xFFFFu))); }
double high(std::uint32_t w) { return to_float(bfloat16::from_bits(static_cast<std::uint16_t>(w >> 16))); }

TEST(Tiles, Bfloat16ProductMatchesFloat64OnWholeAndPartialTiles) {
  if (!tiles::bf16_available()) GTEST_SKIP() << "this CPU has no AMX-BF16 tiles (or the system does not grant them): skipped";
  for (const index_t rows : {1, 15, 16, 17, 32, 48, 64, 130})
    for (const index_t pairs : {1, 15, 16, 17, 32, 64})
      for (const bool in_rows : {true, false})
        for (const bool accumulate : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "rows " << rows << " pairs " << pairs << (in_rows ? " in rows" : " gathered")
                                            << (accumulate ? " accumulating" : ""));
          // A in rows: word (r, p) at r a_r + p, a_r > pairs; gathered: at r + p a_k (a_r = 1, a_k = rows + 3).
          const index_t a_r = in_rows ? pairs + 5 : 1, a_k = in_rows ? 1 : rows + 3;
          const Words a(static_cast<std::size_t>((rows - 1) * a_r + (pairs - 1) * a_k + 1), 1);
          const Words b(static_cast<std::size_t>(pairs * kLanes), 2);
          std::vector<float> c(static_cast<std::size_t>((rows + 3) * kLanes));
          std::mt19937 rng(3);
          std::uniform_real_distribution<float> u(-4.0f, 4.0f);
          for (float& x : c) x = u(rng);
          const std::vector<float> before = c;
          {
            const tiles::Scope scope(true);
            tiles::product_bf16(a.words.data(), a_r, a_k, rows, pairs, b.words.data(), c.data(), accumulate);
          }
          for (index_t r = 0; r < rows; ++r)
            for (index_t i = 0; i < kLanes; ++i) {
              const double start = accumulate ? before[r * kLanes + i] : 0.0;
              double exact = start, magnitude = std::abs(start);
              for (index_t p = 0; p < pairs; ++p) {
                const std::uint32_t x = a.words[r * a_r + p * a_k], y = b.words[p * kLanes + i];
                exact += low(x) * low(y) + high(x) * high(y);
                magnitude += std::abs(low(x) * low(y)) + std::abs(high(x) * high(y));
              }
              ASSERT_NEAR(c[r * kLanes + i], exact, std::ldexp(magnitude, -24) * static_cast<double>(2 * pairs + 1))
                  << "row " << r << ", lane " << i;
            }
          for (std::size_t e = static_cast<std::size_t>(rows * kLanes); e < c.size(); ++e)
            ASSERT_EQ(c[e], before[e]) << "a row past `rows` was written";
        }
}

// No pair: c is zeros (or kept, accumulating).
TEST(Tiles, Bfloat16WithNoPairLeavesZerosOrTheAccumulator) {
  if (!tiles::bf16_available()) GTEST_SKIP() << "this CPU has no AMX-BF16 tiles (or the system does not grant them): skipped";
  std::vector<float> c(3 * kLanes, 7.0f);
  const tiles::Scope scope(true);
  tiles::product_bf16(nullptr, 0, 1, 3, 0, nullptr, c.data(), true);
  for (const float x : c) ASSERT_EQ(x, 7.0f);
  tiles::product_bf16(nullptr, 0, 1, 3, 0, nullptr, c.data(), false);
  for (const float x : c) ASSERT_EQ(x, 0.0f);
}

TEST(Tiles, Int8ProductIsTheExactSum) {
  if (!tiles::int8_available()) GTEST_SKIP() << "this CPU has no AMX-INT8 tiles (or the system does not grant them): skipped";
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> byte(-128, 127), ubyte(0, 255);
  for (const index_t rows : {1, 15, 16, 17, 33, 64})
    for (const index_t quads : {1, 15, 16, 17, 32, 40}) {
      SCOPED_TRACE(::testing::Message() << "rows " << rows << " quads " << quads);
      const index_t a_r = 4 * quads + 3;  // rows at odd byte offsets
      std::vector<std::int8_t> a(static_cast<std::size_t>(rows * a_r + 1));
      for (std::int8_t& x : a) x = static_cast<std::int8_t>(byte(rng));
      std::vector<std::uint32_t> b(static_cast<std::size_t>(quads * kLanes));
      for (std::uint32_t& w : b)
        w = static_cast<std::uint32_t>(ubyte(rng)) | static_cast<std::uint32_t>(ubyte(rng)) << 8 |
            static_cast<std::uint32_t>(ubyte(rng)) << 16 | static_cast<std::uint32_t>(ubyte(rng)) << 24;
      std::vector<std::int32_t> c(static_cast<std::size_t>((rows + 2) * kLanes), -7);
      {
        const tiles::Scope scope(true);
        tiles::product_int8(a.data() + 1, a_r, rows, quads, b.data(), c.data());
      }
      for (index_t r = 0; r < rows; ++r)
        for (index_t i = 0; i < kLanes; ++i) {
          std::int64_t exact = 0;
          for (index_t p = 0; p < quads; ++p)
            for (int e = 0; e < 4; ++e)
              exact += static_cast<std::int64_t>(a[1 + r * a_r + 4 * p + e]) * ((b[p * kLanes + i] >> (8 * e)) & 0xFFu);
          ASSERT_EQ(c[r * kLanes + i], exact) << "row " << r << ", lane " << i;
        }
      for (std::size_t e = static_cast<std::size_t>(rows * kLanes); e < c.size(); ++e) ASSERT_EQ(c[e], -7) << "past `rows`";
    }
}

}  // namespace
}  // namespace attn
