// The 16-bit storage types (attn/half.hpp): every one of the 65,536 bit patterns of each type
// decoded against the formula in float64, converted back unchanged, and every rounding boundary
// (each midpoint between neighbours, and the floats either side of it) rounded to nearest even;
// the SIMD array conversions of the chosen target bit for bit as the scalar ones, on those inputs
// and on random float bit patterns (NaN payloads, subnormals). Registered for every SIMD target.
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "attn/half.hpp"
#include "attn/tensor.hpp"
#include "support/testing.hpp"

namespace attn {
namespace {

// A type's layout: exponent and mantissa bits.
template <class H>
struct Layout;
template <>
struct Layout<bfloat16> {
  static constexpr int kExponent = 8, kMantissa = 7;
  static bfloat16 round(float f) { return to_bfloat16(f); }
};
template <>
struct Layout<float16> {
  static constexpr int kExponent = 5, kMantissa = 10;
  static float16 round(float f) { return to_float16(f); }
};

// The value of bit pattern `bits`, from the definition (NaN for NaN patterns).
template <class H>
double reference_value(std::uint16_t bits) {
  constexpr int E = Layout<H>::kExponent, M = Layout<H>::kMantissa, bias = (1 << (E - 1)) - 1;
  const int sign = bits >> 15, exponent = (bits >> M) & ((1 << E) - 1), mantissa = bits & ((1 << M) - 1);
  double magnitude = 0;
  if (exponent == (1 << E) - 1) {
    magnitude = mantissa == 0 ? INFINITY : NAN;
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<double>(mantissa), 1 - bias - M);
  } else {
    magnitude = std::ldexp(static_cast<double>(mantissa + (1 << M)), exponent - bias - M);
  }
  return sign != 0 ? -magnitude : magnitude;
}

template <class H>
bool is_nan_pattern(std::uint16_t bits) {
  constexpr int M = Layout<H>::kMantissa;
  return (bits & 0x7FFF) > (0x7FFF >> M << M);  // exponent all ones, mantissa not 0
}

template <class H>
class HalfTypes : public ::testing::Test {};
using Types = ::testing::Types<bfloat16, float16>;
TYPED_TEST_SUITE(HalfTypes, Types);

TYPED_TEST(HalfTypes, EveryBitPatternDecodesExactlyAndConvertsBack) {
  using H = TypeParam;
  constexpr std::uint16_t quiet = 1u << (Layout<H>::kMantissa - 1);
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float f = to_float(H::from_bits(bits));
    const std::uint16_t back = Layout<H>::round(f).bits;
    if (is_nan_pattern<H>(bits)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << b;
      ASSERT_EQ(std::signbit(f), (bits >> 15) != 0) << std::hex << b;
      ASSERT_EQ(back, bits | quiet) << std::hex << b;  // the same NaN, quieted
    } else {
      ASSERT_EQ(static_cast<double>(f), reference_value<H>(bits)) << std::hex << b;
      ASSERT_EQ(back, bits) << std::hex << b;
      if (f == 0) {
        ASSERT_EQ(std::signbit(f), (bits >> 15) != 0) << std::hex << b;
      }
    }
  }
}

// The floats at which rounding changes: for each pattern h below the largest finite (either sign),
// the midpoint between h and the next magnitude up (for the largest finite, the next power of two,
// where infinity starts), and the floats just below and above it.
template <class H>
struct Boundary {
  std::uint16_t low;  // rounds here below the midpoint; low + 1 above it
  float below, mid, above;
};

template <class H>
std::vector<Boundary<H>> boundaries() {
  std::vector<Boundary<H>> out;
  constexpr std::uint16_t inf = static_cast<std::uint16_t>(0x7FFF >> Layout<H>::kMantissa << Layout<H>::kMantissa);
  for (std::uint16_t magnitude = 0; magnitude < inf; ++magnitude)
    for (const std::uint16_t sign : {std::uint16_t(0), std::uint16_t(0x8000)}) {
      const double lo = std::abs(reference_value<H>(magnitude));
      // The step above `magnitude` is the spacing of its binade (exact for the largest finite too).
      const double step = magnitude + 1 == inf ? lo - std::abs(reference_value<H>(magnitude - 1))
                                               : std::abs(reference_value<H>(magnitude + 1)) - lo;
      const double mid = lo + step / 2;  // exact in float: one more bit than the type has
      const float m = static_cast<float>(sign != 0 ? -mid : mid);
      EXPECT_EQ(static_cast<double>(m), sign != 0 ? -mid : mid);
      const float toward_zero = std::nextafter(m, 0.0f), away = std::nextafter(m, sign != 0 ? -INFINITY : INFINITY);
      out.push_back({static_cast<std::uint16_t>(sign | magnitude), toward_zero, m, away});
    }
  return out;
}

TYPED_TEST(HalfTypes, EveryRoundingBoundaryRoundsToNearestEven) {
  using H = TypeParam;
  for (const Boundary<H>& c : boundaries<H>()) {
    const std::uint16_t high = c.low + 1, even = (c.low & 1) == 0 ? c.low : high;
    ASSERT_EQ(Layout<H>::round(c.below).bits, c.low) << std::hex << c.low;
    ASSERT_EQ(Layout<H>::round(c.mid).bits, even) << std::hex << c.low;
    ASSERT_EQ(Layout<H>::round(c.above).bits, high) << std::hex << c.low;
  }
  // Past the largest finite: infinity; float's infinities and NaN kept.
  EXPECT_EQ(Layout<H>::round(INFINITY).bits, H::from_bits(0x7FFF >> Layout<H>::kMantissa << Layout<H>::kMantissa).bits);
  EXPECT_EQ(Layout<H>::round(-INFINITY).bits & 0x7FFF, 0x7FFF >> Layout<H>::kMantissa << Layout<H>::kMantissa);
  EXPECT_TRUE(std::isnan(to_float(Layout<H>::round(NAN))));
  EXPECT_TRUE(std::isnan(to_float(Layout<H>::round(std::bit_cast<float>(0x7F800001u)))));  // signalling, tiny payload
}

// Every float to convert: each pattern's value, each boundary's three floats, float's subnormals
// and extremes, and random bit patterns; an odd count so that the vector loops leave a tail.
template <class H>
std::vector<float> probe_floats() {
  std::vector<float> f;
  for (std::uint32_t b = 0; b < 65536; ++b) f.push_back(to_float(H::from_bits(static_cast<std::uint16_t>(b))));
  for (const Boundary<H>& c : boundaries<H>()) f.insert(f.end(), {c.below, c.mid, c.above});
  std::mt19937 gen(7);
  for (int i = 0; i < 200001; ++i) f.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(gen())));
  for (const std::uint32_t b : {0x00000001u, 0x807FFFFFu, 0x7F7FFFFFu, 0xFF800000u, 0x7FC00000u, 0xFFBFFFFFu})
    f.push_back(std::bit_cast<float>(b));
  return f;
}

TYPED_TEST(HalfTypes, ArrayConversionsMatchTheScalarOnesBitForBit) {
  using H = TypeParam;
  const std::vector<float> floats = probe_floats<H>();
  std::vector<H> halves(floats.size());
  convert(std::span<const float>(floats), std::span<H>(halves));
  for (std::size_t i = 0; i < floats.size(); ++i)
    ASSERT_EQ(halves[i].bits, Layout<H>::round(floats[i]).bits) << i << ": float bits " << std::hex << std::bit_cast<std::uint32_t>(floats[i]);
  std::vector<H> patterns(65536 + 13);
  for (std::size_t b = 0; b < patterns.size(); ++b) patterns[b] = H::from_bits(static_cast<std::uint16_t>(b * 40503u));
  std::vector<float> back(patterns.size());
  convert(std::span<const H>(patterns), std::span<float>(back));
  for (std::size_t b = 0; b < patterns.size(); ++b)
    ASSERT_EQ(std::bit_cast<std::uint32_t>(back[b]), std::bit_cast<std::uint32_t>(to_float(patterns[b])))
        << std::hex << patterns[b].bits;
}

TYPED_TEST(HalfTypes, LargeArraysConvertAcrossThreads) {
  using H = TypeParam;
  // Values from the shared helpers (support/testing.cpp), which also links that file's checks: the
  // SIMD target a run is named for (exit 77 where the CPU lacks it) and ThreadSanitizer's options.
  const Tensor<float> values = testing::random_tensor<float>({3'000'001}, 5, -7e4, 7e4);
  const std::vector<float> floats(values.data(), values.data() + values.numel());
  std::vector<H> halves(floats.size());
  convert(std::span<const float>(floats), std::span<H>(halves));
  std::vector<float> back(floats.size());
  convert(std::span<const H>(halves), std::span<float>(back));
  for (std::size_t i = 0; i < floats.size(); i += 997) {
    ASSERT_EQ(halves[i].bits, Layout<H>::round(floats[i]).bits) << i;
    ASSERT_EQ(back[i], to_float(halves[i])) << i;
  }
}

TYPED_TEST(HalfTypes, TensorsHoldThem) {
  using H = TypeParam;
  Tensor<H> t({2, 3});
  t(1, 2) = Layout<H>::round(1.5f);
  const TensorView<const H> view = t.view();
  EXPECT_EQ(to_float(view(1, 2)), 1.5f);
  EXPECT_EQ(view(0, 0).bits, 0);
}

TEST(HalfConvert, SizesThatDifferAreRefused) {
  const std::vector<float> floats(5);
  std::vector<bfloat16> b(4);
  std::vector<float16> h(6);
  std::vector<float> five(5);
  testing::expect_error([&] { convert(std::span<const float>(floats), std::span<bfloat16>(b)); },
                        {"convert (float to bfloat16)", "source has 5 elements but the destination 4"});
  testing::expect_error([&] { convert(std::span<const float16>(h), std::span<float>(five)); },
                        {"convert (float16 to float)", "source has 6 elements but the destination 5"});
}

}  // namespace
}  // namespace attn
