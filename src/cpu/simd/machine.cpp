// The machine's FMA peak and memory read rate (attn/machine.hpp), measured with the same SIMD
// target and threads as the kernels.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/simd/machine.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "cpu/simd/dispatch.hpp"
#include "attn/machine.hpp"
#include "attn/diagnostics.hpp"
#include "attn/memory.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::machine::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// 12 independent FMA chains for `iters` rounds; returns the FLOPs done. 12 chains cover the FMA
// latency times the FMA ports of current x86 cores (4 cycles x 2 ports), and fit 16 registers.
double FmaChains(std::int64_t iters, float seed) {
  cpu::simd::note_ran(HWY_TARGET);
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const V a = hn::Set(d, 0.999999f), b = hn::Set(d, 1e-7f);
  V acc[12];
  for (int k = 0; k < 12; ++k) acc[k] = hn::Set(d, seed + static_cast<float>(k));
  for (std::int64_t it = 0; it < iters; ++it)
    for (int k = 0; k < 12; ++k) acc[k] = hn::MulAdd(acc[k], a, b);
  V sum = acc[0];
  for (int k = 1; k < 12; ++k) sum = hn::Add(sum, acc[k]);
  // Keep the result observable so that the loop is not removed.
  volatile float sink = hn::GetLane(sum);
  (void)sink;
  return 2.0 * 12.0 * static_cast<double>(iters) * static_cast<double>(hn::Lanes(d));
}

// Sum of x[0, count) in four vector accumulators (a read stream; the sum is returned so that it is kept).
float ReadSum(const float* x, std::size_t count) {
  cpu::simd::note_ran(HWY_TARGET);
  const hn::ScalableTag<float> d;
  const std::size_t L = hn::Lanes(d);
  auto s0 = hn::Zero(d), s1 = hn::Zero(d), s2 = hn::Zero(d), s3 = hn::Zero(d);
  std::size_t i = 0;
  for (; i + 4 * L <= count; i += 4 * L) {
    s0 = hn::Add(s0, hn::LoadU(d, x + i));
    s1 = hn::Add(s1, hn::LoadU(d, x + i + L));
    s2 = hn::Add(s2, hn::LoadU(d, x + i + 2 * L));
    s3 = hn::Add(s3, hn::LoadU(d, x + i + 3 * L));
  }
  float rest = 0;
  for (; i < count; ++i) rest += x[i];
  return hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3)))) + rest;
}

}  // namespace attn::machine::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::machine {

HWY_EXPORT(FmaChains);
HWY_EXPORT(ReadSum);

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

double fma_peak_flops() {
  const cpu::simd::Target target = cpu::simd::current();
  const std::int64_t iters = 20'000'000;
  double best = 0;
  for (int run = 0; run < 5; ++run) {
    double flops = 0;
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel reduction(+ : flops)
    flops += ATTN_SIMD_CALL(target, FmaChains)(iters, static_cast<float>(omp_get_thread_num()));
    best = std::max(best, flops / seconds_since(t0));
  }
  return best;
}

float read_once(const float* x, std::size_t count) {
  const cpu::simd::Target target = cpu::simd::current();
  float total = 0;
#pragma omp parallel reduction(+ : total)
  {
    const std::size_t t = static_cast<std::size_t>(omp_get_thread_num());
    const std::size_t nt = static_cast<std::size_t>(omp_get_num_threads());
    const std::size_t lo = count * t / nt, hi = count * (t + 1) / nt;
    total += ATTN_SIMD_CALL(target, ReadSum)(x + lo, hi - lo);
  }
  return total;
}

double read_bandwidth(std::size_t bytes) {
  const std::size_t count = bytes / sizeof(float);
  // Memory as a Tensor's (attn/memory.hpp: huge pages at this size, so that filling it does not
  // take seconds of page faults on a machine where a fault is slow; a read is as fast either way).
  const std::size_t bytes_held = count * sizeof(float);
  const auto release = [bytes_held](float* p) { detail::free_aligned(p, bytes_held); };
  const std::unique_ptr<float, decltype(release)> buf(static_cast<float*>(detail::allocate_aligned(bytes_held)), release);
  float* x = buf.get();
#pragma omp parallel for schedule(static)
  for (std::size_t i = 0; i < count; ++i) x[i] = 1.0f;  // first touch, by the thread that will read
  double best = 0;
  volatile float sink = 0;
  for (int run = 0; run < 7; ++run) {
    const auto t0 = std::chrono::steady_clock::now();
    const float total = read_once(x, count);
    best = std::max(best, static_cast<double>(count * sizeof(float)) / seconds_since(t0));
    sink = sink + total;
  }
  return best;
}

}  // namespace attn::machine
#endif  // HWY_ONCE
