// `attn bench`: measures the machine (FMA peak, memory read rate), then times each case of the fused
// kernels against the project's unfused path in the same run, and prints time, GFLOP/s or GB/s,
// the fraction of the measured limit, extra memory and the speed-up (--json for machines).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "attn/tensor.hpp"

namespace CLI {
class App;
}

namespace attn_cli {

// Registers the `bench` subcommand on `app`.
void add_bench_command(CLI::App& app);

// `attn bench --distributed` (bench_distributed.cpp), run under mpiexec: ring and all-to-all
// attention across the ranks against one process with all their threads. threads: per rank (0: the
// cores over the ranks); large: n = m = 65536 too.
struct DistributedBenchOptions {
  bool json = false, large = false;
  int threads = 0;
  double seconds = 1.0;
};
void run_distributed_bench(const DistributedBenchOptions& options);

// `attn bench --serve` (bench_serve.cpp): a continuous-batching trace replayed through attn::KvCache
// for each cache dtype whose name contains one of filter's comma-separated parts (empty: all): each
// step's attend_batch timed against one attend per entry, decode-only steps against a plain read of
// their bytes, prompt chunks against the dense causal forward. Requests all arrive at the start;
// prompt lengths uniform in [prompt_min, prompt_max] from a fixed seed; each step every request whose
// prompt is done decodes one token (generate in all), then prompt chunks fill `budget` tokens in
// request order. The model: heads query heads, kv_heads key heads, head_dim.
struct ServeBenchOptions {
  bool json = false;
  double seconds = 1.0;  // time budget of each repeated measurement
  std::string filter;
  attn::index_t requests = 64, prompt_min = 128, prompt_max = 4096, generate = 128, budget = 512;
  attn::index_t heads = 32, kv_heads = 8, head_dim = 128;
};
void run_serve_bench(const ServeBenchOptions& options);

// Timing helpers of bench.cpp, shared by the modes.
// Median seconds of `f` (warmed already) over at least 3 runs and about `budget` seconds (at most
// 50 runs).
double median_seconds(const std::function<void()>& f, double budget);
// The median seconds of `kernel` and of a plain read of `bytes` (attn::machine::read_once over a
// 64-byte aligned buffer of that size, touched first), timed in turn: each round one read, then
// kernel runs for as long (at least 3 runs each, about 2 `budget` seconds in all).
std::pair<double, double> medians_against_a_read(const std::function<void()>& kernel, double bytes, double budget);
// The targets the kernels recorded as they ran (attn::simd_targets_ran), e.g. "avx3": "a,b", or
// "none".
std::string ran_string(const std::vector<std::string>& ran);

// One benchmark case (bench_cases.cpp). run_fused and run_unfused each execute the operation once
// on inputs made by prepare(); check() compares their last results and returns the largest
// difference relative to the largest unfused output (after both ran). A case reports one rate:
// (query, key) pairs visited per second when `pairs` is set, tanh evaluations per second when
// `tanhs` is set (bound by the tanh, not by FMAs or memory), else bytes per second when `bytes` is
// set, else FLOP/s.
struct BenchCase {
  std::string name;
  double flops = 0;          // FLOPs of one run, from the formula in `formula`
  double bytes = 0;          // bytes one run must read (memory-bound cases), else 0
  double tanhs = 0;          // tanh evaluations of one run (additive attention), else 0
  std::string formula;       // how flops, bytes or tanhs are counted
  double baseline_bytes = 0; // extra memory of the unfused path, from its buffers' sizes
  double baseline_scale = 1; // the unfused run does 1 / baseline_scale of the work; its time is scaled up
  std::function<void()> prepare, run_fused, run_unfused, release;
  // When set: the (query, key) pairs one fused run visits (called after prepare()); the case then
  // reports pairs per second instead of FLOP/s.
  std::function<double()> pairs;
  std::function<double()> check;
  // The largest relative difference check() may return. 1e-4 where both runs compute in float32; the
  // 16-bit and int8 cases compare the rounded inputs' result with float32 on the unrounded values,
  // so the storage type's rounding shows (about 4 units of its roundoff are allowed).
  double tolerance = 1e-4;
};

// Values uniform in [-1, 1) from a fixed seed: every case's inputs.
attn::Tensor<float> uniform(std::vector<attn::index_t> shape, std::uint64_t seed);

// The largest |a - b| over the largest |b| (infinite where a difference is NaN): check()'s measure.
double max_rel_diff(const attn::Tensor<float>& a, const attn::Tensor<float>& b);

// Every headline case; `large` adds the n = m = 16384 memory case.
std::vector<BenchCase> bench_cases(bool large);
// The cases of the attention variants (bench_variants.cpp), part of bench_cases.
std::vector<BenchCase> variant_cases();
// The 16-bit cases (bench_half.cpp), part of bench_cases.
std::vector<BenchCase> half_cases();
// The variable-length case (bench_varlen.cpp), part of bench_cases.
std::vector<BenchCase> varlen_cases();
// The kernel regression cases (bench_kreg.cpp), part of bench_cases.
std::vector<BenchCase> kreg_cases();

}  // namespace attn_cli
