// `attn bench` (bench.hpp): the machine's limits first, then every case: validated (fused against
// unfused), then timed, median of repeated runs (the fused and unfused runs of a case interleaved).
#include "bench.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <iostream>
#include <string>
#include <tuple>
#include <vector>

#include "attn/config.hpp"
#include "attn/diagnostics.hpp"
#include "attn/error.hpp"
#include "attn/machine.hpp"
#include "attn/memory.hpp"
#include "attn/tensor.hpp"
#include "exit_codes.hpp"

namespace attn_cli {
namespace {

struct Options {
  bool json = false, large = false, distributed = false, serve = false;
  int threads = 0;
  double seconds = 1.0;  // time budget per measurement
  std::string filter, target;
  ServeBenchOptions trace;  // --serve's trace (its json, seconds and filter copied from above)
};

double median(std::vector<double> times) {
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

double median_seconds(const std::function<void()>& f, double budget) {
  using clock = std::chrono::steady_clock;
  std::vector<double> times;
  const auto start = clock::now();
  while (times.size() < 3 || (times.size() < 50 && std::chrono::duration<double>(clock::now() - start).count() < budget)) {
    const auto t0 = clock::now();
    f();
    times.push_back(std::chrono::duration<double>(clock::now() - t0).count());
  }
  return median(times);
}

namespace {

// Median seconds of `fused` and of `baseline` (both warmed already), their runs interleaved so that
// a shared machine's slow and fast minutes fall on both alike: each round one baseline run, then
// fused runs for as long (at least one). At least 3 runs each and about 2 `budget` seconds in all;
// at most 50 rounds.
std::pair<double, double> interleaved_medians(const std::function<void()>& fused, const std::function<void()>& baseline,
                                              double budget) {
  using clock = std::chrono::steady_clock;
  auto seconds_of = [](const std::function<void()>& f) {
    const auto t0 = clock::now();
    f();
    return std::chrono::duration<double>(clock::now() - t0).count();
  };
  std::vector<double> fused_times, baseline_times;
  const auto start = clock::now();
  while (baseline_times.size() < 3 || fused_times.size() < 3 ||
         (baseline_times.size() < 50 && std::chrono::duration<double>(clock::now() - start).count() < 2 * budget)) {
    baseline_times.push_back(seconds_of(baseline));
    double spent = 0;
    do spent += fused_times.emplace_back(seconds_of(fused));
    while (spent < baseline_times.back() && fused_times.size() < 1000);
  }
  return {median(fused_times), median(baseline_times)};
}

}  // namespace

std::pair<double, double> medians_against_a_read(const std::function<void()>& kernel, double bytes, double budget) {
  const std::size_t count = static_cast<std::size_t>(bytes / sizeof(float));
  // A Tensor's memory, as the cases' (aligned to a cache line; in huge pages from 32 MiB on:
  // attn/memory.hpp), counted against attn's memory limit as theirs is.
  attn::Tensor<float> storage({static_cast<attn::index_t>(count)});
  float* x = storage.data();
#pragma omp parallel for schedule(static)
  for (std::size_t i = 0; i < count; ++i) x[i] = 1.0f;  // each part written by the thread that will read it
  volatile float sink = 0;
  auto read = [&] { sink = sink + attn::machine::read_once(x, count); };
  read();
  return interleaved_medians(kernel, read, budget);
}

namespace {

std::string fixed(double x, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, x);
  return buf;
}

// What a case's rate counts: FLOPs (against the FMA peak), bytes read (against the read bandwidth),
// tanh evaluations or (query, key) pairs visited (no measured limit to compare those with).
enum class Unit { flops, bytes, tanhs, pairs };

struct Result {
  std::string name, formula;
  double seconds = 0, rate = 0, fraction = 0, extra_mib = 0, unfused_seconds = 0, baseline_mib = 0, error = 0;
  double tolerance = 0;  // the largest error the case allows (BenchCase::tolerance)
  // Memory-bound cases: the median of a plain read of as many bytes and the case's own median, the
  // two timed in turn (the case's fraction of the limit is their ratio), and the case's fraction of
  // the machine's best read bandwidth (read_bandwidth).
  double read_seconds = 0, seconds_beside_read = 0, fraction_of_best_read = 0;
  Unit unit = Unit::flops;
  bool scaled_baseline = false;  // the unfused time was measured on part of the work and scaled
};

const char* json_key(Unit u) {
  return u == Unit::bytes ? "gbs" : u == Unit::tanhs ? "gtanhs" : u == Unit::pairs ? "gpairs" : "gflops";
}
const char* short_unit(Unit u) {
  return u == Unit::bytes ? "GB" : u == Unit::tanhs ? "GT" : u == Unit::pairs ? "GP" : "GF";
}

}  // namespace

std::string ran_string(const std::vector<std::string>& ran) {
  std::string s;
  for (const std::string& t : ran) s += (s.empty() ? "" : ",") + t;
  return s.empty() ? "none" : s;
}

namespace {

void print_json(const std::vector<Result>& results, double peak, double bandwidth, int threads, const std::string& ran) {
  std::cout << "{\"threads\": " << threads << ", \"simd_target\": \"" << attn::simd_target()
            << "\", \"simd_ran\": \"" << ran << "\", \"fma_peak_gflops\": " << peak / 1e9 << ", \"read_bandwidth_gbs\": " << bandwidth / 1e9
            << ", \"cases\": [\n";
  for (std::size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    std::cout << "  {\"name\": \"" << r.name << "\", \"median_s\": " << r.seconds << ", \""
              << json_key(r.unit) << "\": " << r.rate / 1e9 << ", \"fraction_of_limit\": "
              << r.fraction << ", \"extra_mib\": " << r.extra_mib << ", \"unfused_median_s\": " << r.unfused_seconds
              << ", \"unfused_extra_mib\": " << r.baseline_mib;
    if (r.unit == Unit::bytes)
      std::cout << ", \"read_same_bytes_median_s\": " << r.read_seconds << ", \"fraction_of_read_bandwidth\": " << r.fraction_of_best_read;
    std::cout << ", \"speedup\": "
              << (r.unfused_seconds > 0 ? r.unfused_seconds / r.seconds : 0) << ", \"max_rel_diff\": " << r.error
              << ", \"tolerance\": " << r.tolerance << ", \"counted\": \"" << r.formula << "\"}" << (i + 1 < results.size() ? "," : "") << "\n";
  }
  std::cout << "]}\n";
}

void run_bench(const Options& o) {
  if (o.distributed) return run_distributed_bench({o.json, o.large, o.threads, o.seconds});
  if (o.threads > 0) attn::set_num_threads(o.threads);
  if (!o.target.empty()) as_usage([&] { attn::set_simd_target(o.target); });  // an unknown name: exit 2
  if (o.serve) {
    ServeBenchOptions serve = o.trace;
    serve.json = o.json, serve.seconds = o.seconds, serve.filter = o.filter;
    return run_serve_bench(serve);
  }
  const int threads = attn::num_threads();
  attn::simd_targets_ran(true);
  std::cerr << "measuring the machine (" << threads << " threads, " << attn::simd_target() << ")...\n";
  // Measured before the cases and again after them, keeping the better figure: on a shared machine
  // one measurement may land in a busy moment and understate the limit (overstating every %).
  double peak = attn::machine::fma_peak_flops();
  double bandwidth = attn::machine::read_bandwidth(std::size_t(1) << 29);
  std::cerr << "FMA peak " << fixed(peak / 1e9, 1) << " GFLOP/s, read bandwidth " << fixed(bandwidth / 1e9, 1)
            << " GB/s\n";
  std::vector<Result> results;
  std::string mismatches;  // the cases whose fused and unfused results differ beyond their tolerance
  for (BenchCase& c : bench_cases(o.large)) {
    if (!o.filter.empty() && c.name.find(o.filter) == std::string::npos) continue;
    std::cerr << "  " << c.name << "..." << std::flush;
    c.prepare();
    // Every thread's scratch (the calling thread's too: it is the team's first) freed, so that what
    // the threads hold after the run is this case's.
#pragma omp parallel
    attn::machine::release_scratch();
    Result r;
    r.name = c.name, r.formula = c.formula;
    r.unit = c.pairs ? Unit::pairs : c.tanhs > 0 ? Unit::tanhs : c.bytes > 0 ? Unit::bytes : Unit::flops;
    c.run_fused();  // warms caches and per-thread scratch: what the threads hold now is the case's
    r.extra_mib = static_cast<double>(attn::machine::scratch_bytes()) / (1 << 20);
    if (c.run_unfused) {
      c.run_unfused();
      const auto [fused, unfused] = interleaved_medians(c.run_fused, c.run_unfused, o.seconds);
      r.seconds = fused;
      r.unfused_seconds = unfused * c.baseline_scale;
      r.scaled_baseline = c.baseline_scale != 1;
      r.baseline_mib = c.baseline_bytes / (1 << 20);
      r.error = c.check(), r.tolerance = c.tolerance;
      if (!(r.error <= c.tolerance))
        mismatches += (mismatches.empty() ? "" : "; ") + c.name + " by " + fixed(r.error, 6) + " (allowed " + fixed(c.tolerance, 6) + ")";
    } else {
      r.seconds = median_seconds(c.run_fused, o.seconds);
    }
    if (r.unit == Unit::bytes)
      std::tie(r.seconds_beside_read, r.read_seconds) = medians_against_a_read(c.run_fused, c.bytes, o.seconds);
    r.rate = (r.unit == Unit::pairs ? c.pairs() : r.unit == Unit::tanhs ? c.tanhs : r.unit == Unit::bytes ? c.bytes : c.flops) /
             r.seconds;
    c.release();
    std::cerr << " " << fixed(r.seconds * 1e3, 2) << " ms\n";
    results.push_back(r);
  }
  peak = std::max(peak, attn::machine::fma_peak_flops());
  bandwidth = std::max(bandwidth, attn::machine::read_bandwidth(std::size_t(1) << 29));
  for (Result& r : results) {
    r.fraction = r.unit == Unit::flops ? r.rate / peak : r.unit == Unit::bytes ? r.read_seconds / r.seconds_beside_read : 0;
    if (r.unit == Unit::bytes) r.fraction_of_best_read = r.rate / bandwidth;
  }
  // What ran, as the kernels recorded it: the chosen target alone, or the figures are not its.
  const std::vector<std::string> ran = attn::simd_targets_ran(true);
  if (ran != std::vector<std::string>{attn::simd_target()})
    throw attn::Error("bench: the kernels ran " + ran_string(ran) + ", not the chosen target " + attn::simd_target());
  if (o.json) {
    print_json(results, peak, bandwidth, threads, ran_string(ran));
  } else {
    std::printf("threads %d, simd %s (the kernels ran %s), FMA peak %.1f GFLOP/s, read bandwidth %.1f GB/s\n",
                threads, attn::simd_target().c_str(), ran_string(ran).c_str(), peak / 1e9, bandwidth / 1e9);
    std::printf("%-44s %10s %12s %8s %9s %11s %8s %9s\n", "case", "median ms", "G(FLOP|B|tanh)/s", "% limit",
                "extra MiB", "unfused ms", "speedup", "rel diff");
    for (const Result& r : results)
      std::printf("%-44s %10.2f %9.1f %-2s %8s %9.2f %11s %8s %9.1e\n", r.name.c_str(), r.seconds * 1e3,
                  r.rate / 1e9, short_unit(r.unit),
                  r.unit == Unit::flops || r.unit == Unit::bytes ? (fixed(100 * r.fraction, 1) + "%").c_str() : "-",
                  r.extra_mib, r.unfused_seconds > 0 ? fixed(r.unfused_seconds * 1e3, 2).c_str() : "-",
                  r.unfused_seconds > 0 ? (fixed(r.unfused_seconds / r.seconds, 2) + "x").c_str() : "-", r.error);
    std::printf("GFLOP/s count 4 d per computed (query, key) pair forward, 12 B n m d forward+backward; decode\n"
                "counts bytes of keys, values, queries and out; additive counts tanh evaluations (GT), B n m h per\n"
                "forward, 2 B n m h more per backward. extra MiB: per-thread and per-call scratch of the fused\n"
                "kernels (all threads); the unfused path holds n x m buffers. %% limit: of the FMA peak; for\n"
                "decode (GB/s), of a plain read of as many bytes timed in turn with it (%% of the best read\n"
                "bandwidth above in the JSON). unfused ms: the unfused path's time in the same run, or the\n"
                "baseline the case's \"counted\" names in the JSON (float32 beside the 16-bit and int8 cases, the\n"
                "mask's built-in form beside the additive masks).\n");
    if (std::any_of(results.begin(), results.end(), [](const Result& r) { return r.name.rfind("nw ", 0) == 0; }))
      std::printf("nw: GP = 1e9 (query, key) pairs visited per second (no FLOP count: an exp per pair); its\n"
                  "baseline is the dense path%s.\n",
                  std::any_of(results.begin(), results.end(), [](const Result& r) { return r.scaled_baseline; })
                      ? ", timed on a subset of the queries spread over their range and scaled to all of them"
                      : "");
    if (std::any_of(results.begin(), results.end(), [](const Result& r) { return r.name.rfind("kreg ", 0) == 0; }))
      std::printf("kreg: GP = 1e9 (point, point) pairs a second, counted as the points inside each point's window\n"
                  "along the first column (approximately those visited); no baseline (the reference is dense).\n");
  }
  if (!mismatches.empty())
    throw attn::Error("bench: the fused and unfused results differ by more than the case allows (relative): " + mismatches);
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("bench", "time the fused kernels against the unfused path and the machine's limits");
  cmd->add_flag("--json", o->json, "print the results as JSON");
  cmd->add_flag("--large", o->large, "add the n = m = 16384 forward (extra memory at scale); with --distributed, n = m = 65536");
  cmd->add_flag("--distributed", o->distributed,
                "under mpiexec -n P: ring and all-to-all attention across the ranks against one process of all their "
                "threads (--threads: per rank), n = m = 16384, d = 64");
  CLI::Option* serve = cmd->add_flag(
      "--serve", o->serve,
      "replay a continuous-batching trace through the paged KV cache, for every cache dtype: one attend_batch a step "
      "against one attend per sequence, decode against a plain read, prefill against the dense forward (docs/cli.md)");
  serve->excludes(cmd->get_option("--distributed"))->excludes(cmd->get_option("--large"));
  // The trace of --serve (bench.hpp's ServeBenchOptions holds the defaults; run_serve_bench checks the values).
  ServeBenchOptions& t = o->trace;
  cmd->add_option("--requests", t.requests, "--serve: requests in the trace (default 64)")->needs(serve);
  cmd->add_option("--prompt-min", t.prompt_min, "--serve: shortest prompt (default 128)")->needs(serve);
  cmd->add_option("--prompt-max", t.prompt_max, "--serve: longest prompt (default 4096; lengths uniform between, fixed seed)")
      ->needs(serve);
  cmd->add_option("--generate", t.generate, "--serve: tokens each request decodes after its prompt (default 128)")->needs(serve);
  cmd->add_option("--budget", t.budget, "--serve: prompt tokens a step takes, chunked prefill (default 512)")->needs(serve);
  cmd->add_option("--heads", t.heads, "--serve: query heads (default 32)")->needs(serve);
  cmd->add_option("--kv-heads", t.kv_heads, "--serve: key and value heads (default 8)")->needs(serve);
  cmd->add_option("--head-dim", t.head_dim, "--serve: head size (default 128)")->needs(serve);
  cmd->add_option("--threads", o->threads, "OpenMP threads (default: all)")->check(CLI::Range(0, 4096));
  cmd->add_option("--seconds", o->seconds, "time budget of each measurement (default 1)");
  cmd->add_option("--filter", o->filter, "only the cases whose name contains this (--serve: the cache dtypes, several "
                                         "separated by commas)");
  cmd->add_option("--simd", o->target, "SIMD target (avx3, avx2, sse4, scalar; default: the best)");
  cmd->callback([o] { run_bench(*o); });
}

}  // namespace attn_cli
