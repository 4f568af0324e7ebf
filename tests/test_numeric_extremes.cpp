// Numeric extremes of scaled dot-product attention, on every path (decode: n <= 4 queries per head;
// the fused blocks; the unfused path that writes the weights; the reference), float32 and float64,
// and on every SIMD target (registered per target in tests/CMakeLists.txt). What attn promises
// (README, "Numeric extremes"):
//   - a NaN among a row's attended scores (a NaN query, or key) makes that row's output and lse NaN,
//     as PyTorch's softmax does, even when every attended score is NaN; other rows are untouched;
//   - NaN or Inf in a key or value that a row does not attend (masked) never reaches it (PyTorch's
//     0 * Inf gives NaN there: attn does not read masked keys and values);
//   - an Inf in an attended value reaches its column (Inf, or NaN where +Inf and -Inf meet);
//   - scores that overflow to +Inf make the row NaN (Inf - Inf), as in PyTorch;
//   - scores near the float limits (|s| ~ 1e38, finite) and denormal inputs compute as in float64;
//   - a -inf additive mask entry is an excluded key (weight exactly 0, gradient 0); a row whose
//     every entry is -inf is empty: output 0 and lse -inf (PyTorch gives NaN there).
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "attn/config.hpp"
#include "attn/sdpa.hpp"
#include "support/testing.hpp"

namespace attn {
namespace {

using testing::random_tensor;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// One path of the forward: the cpu backend (fused or decode by n), with the weights asked for (the
// unfused path), or the reference backend.
enum class Path { fused, weights, reference };
const char* path_name(Path p) { return p == Path::fused ? "fused" : p == Path::weights ? "weights" : "reference"; }

template <class T>
struct Result {
  Tensor<T> out, lse;
};

template <class T>
Result<T> forward(Path path, const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const Mask<T>& mask = {}) {
  const index_t B = q.dim(0), n = q.dim(1), m = k.dim(1);
  Result<T> r{Tensor<T>({B, n, v.dim(2)}), Tensor<T>({B, n})};
  const ScopedBackend backend(path == Path::reference ? Backend::reference : Backend::cpu);
  Tensor<T> weights(path == Path::weights ? std::vector<index_t>{B, n, m} : std::vector<index_t>{0});
  sdpa_forward<T>(r.out, r.lse, path == Path::weights ? weights.view() : TensorView<T>{}, q, k, v, mask);
  return r;
}

template <class T>
bool row_all_nan(const Tensor<T>& t, index_t b, index_t i) {
  for (index_t c = 0; c < t.dim(2); ++c)
    if (!std::isnan(t(b, i, c))) return false;
  return true;
}

template <class T>
bool row_finite(const Tensor<T>& t, index_t b, index_t i) {
  for (index_t c = 0; c < t.dim(2); ++c)
    if (!std::isfinite(t(b, i, c))) return false;
  return true;
}

template <class T>
class NumericExtremes : public ::testing::Test {};
using FloatTypes = ::testing::Types<float, double>;
TYPED_TEST_SUITE(NumericExtremes, FloatTypes);

// n: decode (1, 3) and fused (70); m: one tile with a tail (5), several tiles (100), the keys split
// across threads (700); the NaN key at the first and last lane of a vector, and in the tail.
constexpr index_t kQueries[] = {1, 3, 70};
constexpr index_t kKeys[] = {5, 100, 700};

TYPED_TEST(NumericExtremes, ANaNQueryMakesItsRowNaNAndNoOther) {
  using T = TypeParam;
  for (const index_t n : kQueries)
    for (const index_t m : kKeys)
      for (const Path path : {Path::fused, Path::weights, Path::reference}) {
        Tensor<T> q = random_tensor<T>({2, n, 16}, 1);
        const Tensor<T> k = random_tensor<T>({2, m, 16}, 2), v = random_tensor<T>({2, m, 3}, 3);
        const Result<T> clean = forward(path, q, k, v);
        q(1, n - 1, 5) = static_cast<T>(kNaN);  // every score of that row is NaN
        Result<T> r = forward(path, q, k, v);
        const std::string where = std::string(path_name(path)) + ", n = " + std::to_string(n) + ", m = " + std::to_string(m);
        EXPECT_TRUE(row_all_nan(r.out, 1, n - 1)) << where;
        EXPECT_TRUE(std::isnan(r.lse(1, n - 1))) << where;
        r.out(1, n - 1, 0) = clean.out(1, n - 1, 0), r.out(1, n - 1, 1) = clean.out(1, n - 1, 1);
        r.out(1, n - 1, 2) = clean.out(1, n - 1, 2), r.lse(1, n - 1) = clean.lse(1, n - 1);
        EXPECT_EQ(r.out.values(), clean.out.values()) << where << ": another row changed";
        EXPECT_EQ(r.lse.values(), clean.lse.values()) << where;
      }
}

TYPED_TEST(NumericExtremes, ANaNKeyReachesTheRowsThatAttendItOnly) {
  using T = TypeParam;
  for (const index_t n : kQueries)
    for (const index_t m : kKeys)
      for (const index_t j : {index_t{0}, std::min<index_t>(15, m - 1), std::min<index_t>(16, m - 1), m - 1}) {
        // Bottom-right causal: query i attends keys 0 .. i + m - n; key j is masked for rows i < j - (m - n).
        Mask<T> mask;
        mask.causal = Causal::bottom_right;
        for (const Path path : {Path::fused, Path::weights, Path::reference}) {
          const Tensor<T> q = random_tensor<T>({1, n, 8}, 4), v = random_tensor<T>({1, m, 2}, 6);
          Tensor<T> k = random_tensor<T>({1, m, 8}, 5);
          const Result<T> clean = forward(path, q, k, v, mask);
          k(0, j, 3) = static_cast<T>(kNaN);
          const Result<T> r = forward(path, q, k, v, mask);
          for (index_t i = 0; i < n; ++i) {
            const std::string where = std::string(path_name(path)) + ", n = " + std::to_string(n) + ", m = " +
                                      std::to_string(m) + ", key " + std::to_string(j) + ", row " + std::to_string(i);
            if (j <= i + m - n) {
              EXPECT_TRUE(row_all_nan(r.out, 0, i)) << where;
            } else {
              for (index_t c = 0; c < 2; ++c) EXPECT_EQ(r.out(0, i, c), clean.out(0, i, c)) << where << " (masked: never read)";
            }
          }
        }
      }
}

TYPED_TEST(NumericExtremes, AnInfiniteAttendedValueReachesItsColumnAndAMaskedOneNothing) {
  using T = TypeParam;
  for (const index_t n : kQueries)
    for (const index_t m : kKeys)
      for (const Path path : {Path::fused, Path::weights, Path::reference}) {
        const Tensor<T> q = random_tensor<T>({2, n, 8}, 7), k = random_tensor<T>({2, m, 8}, 8);
        Tensor<T> v = random_tensor<T>({2, m, 3}, 9);
        const Tensor<std::int64_t> lens({2}, {m, m - 1});  // batch 1 does not attend its last key
        Mask<T> mask;
        mask.valid_lens = lens.view();
        const Result<T> clean = forward(path, q, k, v, mask);
        v(0, m / 2, 1) = static_cast<T>(kInf), v(1, m - 1, 1) = static_cast<T>(kNaN), v(1, m - 1, 2) = static_cast<T>(kInf);
        const Result<T> r = forward(path, q, k, v, mask);
        const std::string where = std::string(path_name(path)) + ", n = " + std::to_string(n) + ", m = " + std::to_string(m);
        for (index_t i = 0; i < n; ++i) {
          EXPECT_EQ(r.out(0, i, 1), static_cast<T>(kInf)) << where << ", row " << i;
          EXPECT_EQ(r.out(0, i, 0), clean.out(0, i, 0)) << where;
          EXPECT_TRUE(row_finite(r.out, 1, i)) << where << ": a masked value reached row " << i;
        }
        EXPECT_EQ(r.lse.values(), clean.lse.values()) << where << ": values never change the weights";
      }
}

TYPED_TEST(NumericExtremes, ScoresThatOverflowMakeTheRowNaNAndScoresNearTheLimitsCompute) {
  using T = TypeParam;
  const T big = std::sqrt(std::numeric_limits<T>::max()) / T(2);  // q . k = 2 big^2 / sqrt(2): near the limit
  for (const index_t n : kQueries)
    for (const Path path : {Path::fused, Path::weights, Path::reference}) {
      const index_t m = 100;
      Tensor<T> q({1, n, 2}), k({1, m, 2});
      const Tensor<T> v = random_tensor<T>({1, m, 2}, 10);
      for (index_t i = 0; i < n; ++i) q(0, i, 0) = big, q(0, i, 1) = big;
      for (index_t j = 0; j < m; ++j) k(0, j, 0) = j == 37 ? big : -big, k(0, j, 1) = j == 37 ? big : big / T(2);
      // Scores: key 37 near +max / 1.4, the others far below: key 37 takes every weight.
      const Result<T> r = forward(path, q, k, v);
      for (index_t i = 0; i < n; ++i)
        for (index_t c = 0; c < 2; ++c) EXPECT_EQ(r.out(0, i, c), v(0, 37, c)) << path_name(path) << ", n = " << n;
      for (index_t i = 0; i < n; ++i) q(0, i, 0) = q(0, i, 1) = big * T(4);  // key 37's score overflows to +Inf
      const Result<T> over = forward(path, q, k, v);
      for (index_t i = 0; i < n; ++i) EXPECT_TRUE(row_all_nan(over.out, 0, i)) << path_name(path) << ", n = " << n;
    }
}

TYPED_TEST(NumericExtremes, DenormalInputsComputeAsInFloat64) {
  using T = TypeParam;
  const double tiny = static_cast<double>(std::numeric_limits<T>::denorm_min()) * 1000;
  for (const index_t n : kQueries)
    for (const index_t m : kKeys) {
      const Tensor<double> q64 = random_tensor<double>({1, n, 8}, 11, -tiny, tiny), k64 = random_tensor<double>({1, m, 8}, 12);
      const Tensor<double> v64 = random_tensor<double>({1, m, 3}, 13, -tiny, tiny);
      const Tensor<T> q = testing::convert<T>(q64), k = testing::convert<T>(k64), v = testing::convert<T>(v64);
      const Result<double> oracle = forward(Path::reference, testing::convert<double>(q), testing::convert<double>(k),
                                            testing::convert<double>(v));
      for (const Path path : {Path::fused, Path::weights}) {
        const Result<T> r = forward(path, q, k, v);
        // Scores are ~0: uniform weights; the output is a weighted mean of denormals, each product
        // w_j v_j rounded to the denormal grid (half a denormal ulp each): at most m ulps in all.
        // Not flushed to zero: the outputs keep the values' magnitude.
        const double ulp = static_cast<double>(std::numeric_limits<T>::denorm_min());
        EXPECT_LE(testing::max_abs_diff(r.out, oracle.out), tiny * 1e-3 + static_cast<double>(m) * ulp)
            << path_name(path) << ", n = " << n << ", m = " << m;
        double largest = 0;
        for (index_t e = 0; e < r.out.numel(); ++e) largest = std::max(largest, std::abs(static_cast<double>(r.out[e])));
        EXPECT_GT(largest, tiny / std::sqrt(static_cast<double>(m)) / 10) << path_name(path) << ": flushed to zero";
        EXPECT_LE(testing::max_abs_diff(r.lse, oracle.lse), 1e-5) << path_name(path);
      }
    }
}

TYPED_TEST(NumericExtremes, MinusInfinityInAnAdditiveMaskExcludesAKeyAndEmptiesAFullRow) {
  using T = TypeParam;
  for (const index_t n : kQueries)
    for (const index_t m : kKeys)
      for (const Path path : {Path::fused, Path::weights, Path::reference}) {
        const Tensor<T> q = random_tensor<T>({1, n, 8}, 14), k = random_tensor<T>({1, m, 8}, 15), v = random_tensor<T>({1, m, 2}, 16);
        Tensor<T> additive({1, n, m});
        Tensor<bool> keep({1, n, m});
        for (index_t i = 0; i < n; ++i)
          for (index_t j = 0; j < m; ++j) {
            const bool excluded = i == 0 || (i + j) % 3 == 0;  // row 0: every key excluded
            additive(0, i, j) = excluded ? -std::numeric_limits<T>::infinity() : T(0);
            keep(0, i, j) = !excluded;
          }
        Mask<T> by_inf, by_keep;
        by_inf.additive = additive.view(), by_keep.keep = keep.view();
        const Result<T> a = forward(path, q, k, v, by_inf), b = forward(path, q, k, v, by_keep);
        const std::string where = std::string(path_name(path)) + ", n = " + std::to_string(n) + ", m = " + std::to_string(m);
        EXPECT_EQ(a.out.values(), b.out.values()) << where << ": -inf is not the same as excluding the key";
        EXPECT_EQ(a.lse.values(), b.lse.values()) << where;
        EXPECT_EQ(a.out(0, 0, 0), T(0)) << where << ": a row of -inf is empty";
        EXPECT_EQ(a.lse(0, 0), -std::numeric_limits<T>::infinity()) << where;
      }
}

}  // namespace
}  // namespace attn
