// The layers' dense products (cpu/simd/matmul.hpp): C (+)= A B with A and B read through strides
// (each either way round), against a float64 sum of products on every SIMD target, on sizes around
// the row tiles (96 rows), row groups (12 on AVX-512, 6 elsewhere, and the remainders), panels (64
// columns) and depth blocks (64); rows of B marked as zero kept out even when they hold NaN; the
// same bits at 1 and 2 threads. And the fused kernels' block product alone (block_product) against
// the same sums.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <hwy/aligned_allocator.h>

#include "attn/config.hpp"
#include "cpu/simd/matmul.hpp"
#include "support/testing.hpp"

namespace attn {
namespace {

struct Shape {
  index_t M, N, K;
};

template <class T>
void check_products(bool a_transposed, bool b_transposed, bool accumulate) {
  std::mt19937_64 gen(11);
  std::uniform_real_distribution<double> uniform(-1, 1);
  for (const Shape s : {Shape{1, 1, 1}, Shape{5, 3, 0}, Shape{7, 70, 5}, Shape{97, 65, 70}, Shape{200, 130, 129},
                        Shape{13, 64, 64}, Shape{31, 1, 200}}) {
    // a(r, k) = A[r a_r + k a_k]; b(k, c) = B[c b_n + k b_k]; padded leading dimensions.
    const index_t lda = (a_transposed ? s.M : s.K) + 3, ldb = (b_transposed ? s.K : s.N) + 2, ldc = s.N + 5;
    std::vector<T> A(static_cast<std::size_t>(lda * (a_transposed ? s.K : s.M) + 1));
    std::vector<T> B(static_cast<std::size_t>(ldb * (b_transposed ? s.N : s.K) + 1));
    std::vector<T> C(static_cast<std::size_t>(ldc * s.M + 1));
    for (T& x : A) x = static_cast<T>(uniform(gen));
    for (T& x : B) x = static_cast<T>(uniform(gen));
    for (T& x : C) x = static_cast<T>(uniform(gen));
    const index_t a_r = a_transposed ? 1 : lda, a_k = a_transposed ? lda : 1;
    const index_t b_n = b_transposed ? ldb : 1, b_k = b_transposed ? 1 : ldb;
    // Every third row of B marked as zero and filled with NaN: none may reach C.
    std::vector<std::uint8_t> zero(static_cast<std::size_t>(s.K));
    for (index_t k = 0; k < s.K; ++k) {
      zero[static_cast<std::size_t>(k)] = k % 3 == 1;
      if (k % 3 == 1)
        for (index_t c = 0; c < s.N; ++c) B[static_cast<std::size_t>(c * b_n + k * b_k)] = std::numeric_limits<T>::quiet_NaN();
    }
    const std::vector<T> before = C;
    auto run = [&] {
      std::vector<T> out = before;
      cpu::fused::matmul<T>(out.data(), ldc, A.data(), a_r, a_k, B.data(), b_n, b_k, s.M, s.N, s.K, accumulate, zero.data());
      return out;
    };
    set_num_threads(1);
    const std::vector<T> one = run();
    set_num_threads(2);
    const std::vector<T> two = run();
    set_num_threads(0);
    EXPECT_EQ(0, std::memcmp(one.data(), two.data(), sizeof(T) * one.size())) << "threads, M " << s.M << " N " << s.N << " K " << s.K;
    for (index_t r = 0; r < s.M; ++r)
      for (index_t c = 0; c < ldc; ++c) {
        const T got = one[static_cast<std::size_t>(r * ldc + c)], old = before[static_cast<std::size_t>(r * ldc + c)];
        if (c >= s.N) {  // past N: untouched
          ASSERT_EQ(got, old) << r << ", " << c;
          continue;
        }
        double sum = 0, magnitude = 0;
        for (index_t k = 0; k < s.K; ++k) {
          if (zero[static_cast<std::size_t>(k)] != 0) continue;
          const double p = static_cast<double>(A[static_cast<std::size_t>(r * a_r + k * a_k)]) *
                           static_cast<double>(B[static_cast<std::size_t>(c * b_n + k * b_k)]);
          sum += p, magnitude += std::abs(p);
        }
        const double want = accumulate ? sum + static_cast<double>(old) : sum;
        const double tol = 4 * (static_cast<double>(s.K) + 2) * std::numeric_limits<T>::epsilon() * (magnitude + std::abs(static_cast<double>(old)));
        ASSERT_NEAR(static_cast<double>(got), want, tol) << "M " << s.M << " N " << s.N << " K " << s.K << " at " << r << ", " << c;
      }
  }
}

TEST(Matmul, EveryLayoutAgainstFloat64Sums) {
  for (const bool a_t : {false, true})
    for (const bool b_t : {false, true})
      for (const bool acc : {false, true}) {
        SCOPED_TRACE(std::string("A ") + (a_t ? "transposed" : "rows") + ", B " + (b_t ? "transposed" : "rows") +
                     (acc ? ", accumulating" : ""));
        check_products<float>(a_t, b_t, acc);
        check_products<double>(a_t, b_t, acc);
      }
}

// block_product: C (rows, 64) (+)= A (rows, depth) Bm (depth, 64) for every row count of a tile
// (the micro-tiles of 8 rows on AVX-512, 6 elsewhere, and each remainder) and past it (the output's
// product has a row per value column), depths across its depth blocks of 64, A read as rows or
// transposed; the row past `rows` untouched.
template <class T>
void check_block_product(bool a_transposed, bool accumulate) {
  constexpr index_t cols = cpu::fused::kBlockQ;
  std::mt19937_64 gen(5);
  std::uniform_real_distribution<double> uniform(-1, 1);
  const auto at = [](index_t i) { return static_cast<std::size_t>(i); };
  std::vector<index_t> row_counts;
  for (index_t rows = 1; rows <= cols; ++rows) row_counts.push_back(rows);
  row_counts.insert(row_counts.end(), {128, 133});
  for (const index_t depth : {1, 7, 64, 65, 130})
    for (const index_t rows : row_counts) {
      const index_t lda = (a_transposed ? rows : depth) + 3;  // padded leading dimension
      std::vector<T> A(at(lda * (a_transposed ? depth : rows))), C(at((rows + 1) * cols));
      const auto Bm = hwy::AllocateAligned<T>(at(depth * cols));  // Bm and C aligned, as the kernels' blocks
      const auto out = hwy::AllocateAligned<T>(C.size());
      for (T& x : A) x = static_cast<T>(uniform(gen));
      for (index_t i = 0; i < depth * cols; ++i) Bm[at(i)] = static_cast<T>(uniform(gen));
      for (T& x : C) x = static_cast<T>(uniform(gen));
      std::copy(C.begin(), C.end(), out.get());
      const index_t a_r = a_transposed ? 1 : lda, a_k = a_transposed ? lda : 1;
      cpu::fused::block_product<T>(out.get(), A.data(), a_r, a_k, Bm.get(), rows, depth, accumulate,
                                   cpu::simd::current());
      for (index_t c = 0; c < cols; ++c)
        ASSERT_EQ(out[at(rows * cols + c)], C[at(rows * cols + c)]) << "row past the tile, depth " << depth;
      for (index_t r = 0; r < rows; ++r)
        for (index_t c = 0; c < cols; ++c) {
          double sum = 0, magnitude = 0;
          for (index_t k = 0; k < depth; ++k) {
            const double p = static_cast<double>(A[at(r * a_r + k * a_k)]) * static_cast<double>(Bm[at(k * cols + c)]);
            sum += p, magnitude += std::abs(p);
          }
          const double old = static_cast<double>(C[at(r * cols + c)]);
          const double want = accumulate ? sum + old : sum;
          const double tol = 4 * (static_cast<double>(depth) + 2) * std::numeric_limits<T>::epsilon() * (magnitude + std::abs(old));
          ASSERT_NEAR(static_cast<double>(out[at(r * cols + c)]), want, tol)
              << "rows " << rows << " depth " << depth << " at " << r << ", " << c;
        }
    }
}

TEST(BlockProduct, EveryRowCountAndDepthAgainstFloat64Sums) {
  for (const bool a_t : {false, true})
    for (const bool acc : {false, true}) {
      SCOPED_TRACE(std::string("A ") + (a_t ? "transposed" : "rows") + (acc ? ", accumulating" : ""));
      check_block_product<float>(a_t, acc);
      check_block_product<double>(a_t, acc);
    }
}

}  // namespace
}  // namespace attn
