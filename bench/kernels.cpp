// Google Benchmark programs of attn's compute kernels, each against the machine's FMA peak measured
// in the same process (attn/machine.hpp), for looking inside `attn bench`'s figures:
//   BM_BlockProduct   the fused kernels' block product alone on the shapes of a head of 64 or 128,
//                     one thread, its operands in the L1 or L2 cache: the ceiling of the fused forward
//                     and backward, which are built from it
//   BM_SdpaForward    sdpa_forward (B, n, n, d), every thread: 4 d FLOPs a (query, key) pair
//   BM_SdpaBackward   sdpa_backward alone, every thread: counted as 8 d a pair (what `attn bench`
//                     counts), while it computes five products of 2 d (the scores again, dP, dV, dK,
//                     dQ): `products_of_peak` is the share of the peak those 10 d are
//   BM_Matmul         the layers' matrix product (M, K) x (K, N), every thread: the multi-head
//                     layer's projections
// Counters: GFLOP/s, of_peak (GFLOP/s over the FMA peak of the threads that ran). Run:
//   build/release/attn_kernels_bench [--benchmark_filter=REGEX] [--benchmark_repetitions=5]
#include <benchmark/benchmark.h>
#include <hwy/aligned_allocator.h>

#include <chrono>
#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "attn/attn.hpp"
#include "attn/machine.hpp"
#include "cpu/simd/matmul.hpp"

namespace {

using attn::index_t;

// The FMA peak (FLOP/s) of `threads` threads (0: all), measured once per count.
double peak_flops(int threads) {
  static std::map<int, double> peaks;
  auto it = peaks.find(threads);
  if (it == peaks.end()) {
    const attn::ScopedThreads scope(threads);
    it = peaks.emplace(threads, attn::machine::fma_peak_flops()).first;
  }
  return it->second;
}

// Runs body once an iteration and returns FLOP/s of `flops` an iteration, by the loop's own clock,
// after setting the GFLOP/s and of_peak counters against the peak of `threads` threads.
template <class Body>
double timed(benchmark::State& state, double flops, int threads, const Body& body) {
  const double peak = peak_flops(threads);  // measured before the clock starts
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) body();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double rate = flops * static_cast<double>(state.iterations()) / seconds;
  state.counters["GFLOP/s"] = rate / 1e9;
  state.counters["of_peak"] = rate / peak;
  return rate;
}

template <class T>
void fill_uniform(T* x, std::size_t count, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> uniform(-1, 1);
  for (std::size_t i = 0; i < count; ++i) x[i] = uniform(gen);
}

bool all_finite(const float* x, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i)
    if (!std::isfinite(x[i])) return false;
  return true;
}

// Args: A transposed, head size d. 0: the scores' product, C (64 keys, 64 queries) = keys (64, d)
// Q^T (d, 64), A's rows along the depth; 1: the output's, C (d, 64 queries) = V^T (d, 64 keys) W^T
// (64, 64), A read transposed (a_r = 1) from the values' rows. Their operands (48 KiB at d = 64, 80
// at d = 128) fill or pass the L1 cache of 48 KiB: the L1 and L2 rates.
void BM_BlockProduct(benchmark::State& state) {
  constexpr index_t tile = attn::cpu::fused::kBlockQ;
  const bool a_transposed = state.range(0) != 0;
  const index_t d = state.range(1);
  const index_t rows = a_transposed ? d : tile, depth = a_transposed ? tile : d;
  const std::size_t a_count = static_cast<std::size_t>(rows * depth), b_count = static_cast<std::size_t>(depth * tile),
                    c_count = static_cast<std::size_t>(rows * tile);
  const auto A = hwy::AllocateAligned<float>(a_count), Bm = hwy::AllocateAligned<float>(b_count),
             C = hwy::AllocateAligned<float>(c_count);  // Bm and C aligned, as the kernels' blocks
  fill_uniform(A.get(), a_count, 1);
  fill_uniform(Bm.get(), b_count, 2);
  const index_t a_r = a_transposed ? 1 : depth, a_k = a_transposed ? rows : 1;
  const attn::cpu::simd::Target target = attn::cpu::simd::current();
  timed(state, 2.0 * static_cast<double>(rows) * tile * static_cast<double>(depth), 1, [&] {
    attn::cpu::fused::block_product<float>(C.get(), A.get(), a_r, a_k, Bm.get(), rows, depth, false, target);
    benchmark::DoNotOptimize(C.get());
    benchmark::ClobberMemory();
  });
  if (!all_finite(C.get(), c_count)) state.SkipWithError("block_product: non-finite result");
}
BENCHMARK(BM_BlockProduct)->ArgNames({"a_transposed", "d"})->ArgsProduct({{0, 1}, {64, 128}});

// (B, n, n, d) attention operands: queries, keys, values, an output gradient.
struct Attention {
  attn::Tensor<float> q, k, v, dout, out, lse, dq, dk, dv;
  Attention(index_t B, index_t n, index_t d)
      : q({B, n, d}), k({B, n, d}), v({B, n, d}), dout({B, n, d}), out({B, n, d}), lse({B, n}), dq({B, n, d}),
        dk({B, n, d}), dv({B, n, d}) {
    unsigned seed = 3;
    for (auto* t : {&q, &k, &v, &dout}) fill_uniform(t->data(), static_cast<std::size_t>(t->numel()), seed++);
    forward();
  }
  void forward() { attn::sdpa_forward<float>(out.view(), lse.view(), {}, q.cview(), k.cview(), v.cview()); }
  void backward() {
    attn::sdpa_backward<float>(dq.view(), dk.view(), dv.view(), dout.cview(), q.cview(), k.cview(), v.cview(),
                               out.cview(), lse.cview());
  }
};

// Args: B, n (= m), d.
void BM_SdpaForward(benchmark::State& state) {
  const index_t B = state.range(0), n = state.range(1), d = state.range(2);
  Attention a(B, n, d);
  timed(state, 4.0 * B * n * n * d, 0, [&] { a.forward(); });
  if (!all_finite(a.out.data(), static_cast<std::size_t>(a.out.numel()))) state.SkipWithError("sdpa_forward: non-finite");
}
BENCHMARK(BM_SdpaForward)->ArgNames({"B", "n", "d"})->Args({4, 1024, 64})->Args({1, 4096, 128})->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_SdpaBackward(benchmark::State& state) {
  const index_t B = state.range(0), n = state.range(1), d = state.range(2);
  Attention a(B, n, d);
  const double pairs = static_cast<double>(B) * n * n;
  const double rate = timed(state, 8.0 * pairs * d, 0, [&] { a.backward(); });
  state.counters["products_of_peak"] = rate * 10.0 / 8.0 / peak_flops(0);
  if (!all_finite(a.dq.data(), static_cast<std::size_t>(a.dq.numel()))) state.SkipWithError("sdpa_backward: non-finite");
}
BENCHMARK(BM_SdpaBackward)->ArgNames({"B", "n", "d"})->Args({4, 1024, 64})->Args({1, 4096, 128})->UseRealTime()->Unit(benchmark::kMillisecond);

// Args: M, N, K: C (M, N) = A (M, K) W^T, W (N, K) as nn.Linear's weight, all row-major: the
// layers' forward projections (their backward's products read W and the inputs the other way round).
void BM_Matmul(benchmark::State& state) {
  const index_t M = state.range(0), N = state.range(1), K = state.range(2);
  std::vector<float> A(static_cast<std::size_t>(M * K)), W(static_cast<std::size_t>(N * K)), C(static_cast<std::size_t>(M * N));
  fill_uniform(A.data(), A.size(), 4);
  fill_uniform(W.data(), W.size(), 5);
  timed(state, 2.0 * M * N * static_cast<double>(K), 0, [&] {
    attn::cpu::fused::matmul<float>(C.data(), N, A.data(), K, 1, W.data(), K, 1, M, N, K, false);
    benchmark::DoNotOptimize(C.data());
    benchmark::ClobberMemory();
  });
  if (!all_finite(C.data(), C.size())) state.SkipWithError("matmul: non-finite result");
}
BENCHMARK(BM_Matmul)->ArgNames({"M", "N", "K"})->Args({2048, 512, 512})->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
