// Google Benchmark targets for scaled dot-product attention (the shapes): the fused cpu
// path, and the unfused one that asking for the weights selects. FLOP rates are
// reported as counters (4 B n m d per forward, 12 B n m d per forward+backward). `attn bench`
// prints the same cases with the machine's measured limits.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>

#include "attn/attn.hpp"

namespace {

using attn::index_t;
using attn::Tensor;

Tensor<float> uniform(std::initializer_list<index_t> shape, std::uint64_t seed) {
  Tensor<float> t(shape);
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (index_t i = 0; i < t.numel(); ++i) t[i] = u(gen);
  return t;
}

// Args: B, n, m, d, and 1 to ask for the weights (the unfused path).
void BM_SdpaForward(benchmark::State& state) {
  const index_t B = state.range(0), n = state.range(1), m = state.range(2), d = state.range(3);
  const Tensor<float> q = uniform({B, n, d}, 1), k = uniform({B, m, d}, 2), v = uniform({B, m, d}, 3);
  Tensor<float> out({B, n, d}), lse({B, n});
  Tensor<float> weights = state.range(4) != 0 ? Tensor<float>({B, n, m}) : Tensor<float>();
  for (auto _ : state)
    attn::sdpa_forward<float>(out.view(), lse.view(), weights.view(), q.view(), k.view(), v.view());
  state.counters["GFLOP/s"] = benchmark::Counter(4.0 * B * n * m * d * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_SdpaForward)
    ->Args({8, 512, 512, 64, 0})
    ->Args({8, 512, 512, 64, 1})
    ->Args({4, 1024, 1024, 64, 0})
    ->Args({1, 4096, 4096, 64, 0})
    ->Args({1, 4096, 4096, 128, 0})
    ->Args({32, 1, 8192, 128, 0})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_SdpaForwardBackward(benchmark::State& state) {
  const index_t B = state.range(0), n = state.range(1), m = state.range(2), d = state.range(3);
  const Tensor<float> q = uniform({B, n, d}, 1), k = uniform({B, m, d}, 2), v = uniform({B, m, d}, 3);
  const Tensor<float> g = uniform({B, n, d}, 4);
  Tensor<float> out({B, n, d}), lse({B, n}), dq({B, n, d}), dk({B, m, d}), dv({B, m, d});
  for (auto _ : state) {
    attn::sdpa_forward<float>(out.view(), lse.view(), {}, q.view(), k.view(), v.view());
    attn::sdpa_backward<float>(dq.view(), dk.view(), dv.view(), g.view(), q.view(), k.view(), v.view(), out.view(),
                               lse.view());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(12.0 * B * n * m * d * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_SdpaForwardBackward)->Args({4, 1024, 1024, 64})->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
