// `attn bench`: measures the machine (FMA peak, memory read rate), then times each case of the fused
// kernels against the project's unfused path in the same run, and prints time, GFLOP/s or GB/s,
// the fraction of the measured limit, extra memory and the speed-up (--json for machines).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
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

// Every headline case; `large` adds the n = m = 16384 memory case.
std::vector<BenchCase> bench_cases(bool large);
// The cases of the attention variants (bench_variants.cpp), part of bench_cases.
std::vector<BenchCase> variant_cases();
// The 16-bit cases (bench_half.cpp), part of bench_cases.
std::vector<BenchCase> half_cases();
// The variable-length case (bench_varlen.cpp), part of bench_cases.
std::vector<BenchCase> varlen_cases();

}  // namespace attn_cli
