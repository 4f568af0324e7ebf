// `mpiexec -n P attn bench --distributed` (bench.hpp): ring and all-to-all attention across the P
// ranks against one process with all their threads, on the same machine. Every rank runs the
// distributed calls on its own shards; the single-process baseline runs on rank 0 alone while the
// other ranks sleep, with P times a rank's threads. Prints each case's median step time (the slowest
// rank's), GFLOP/s, the scaling efficiency (baseline time / distributed time, at equal cores), and
// how the ranks spent the step (their compute, communication and idle shares).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "attn/config.hpp"
#include "attn/error.hpp"
#include "attn/sdpa.hpp"
#include "bench.hpp"

#ifdef ATTN_HAVE_MPI
#include <sys/resource.h>

#include "attn/distributed.hpp"
#endif

namespace attn_cli {

#ifndef ATTN_HAVE_MPI

void run_distributed_bench(const DistributedBenchOptions&) {
  throw attn::Error("bench --distributed: this attn was built without MPI (install libopenmpi-dev and rebuild)");
}

#else

namespace {

using attn::index_t;
using attn::Tensor;
using clock_type = std::chrono::steady_clock;

int rank_of(MPI_Comm comm) {
  int r = 0;
  MPI_Comm_rank(comm, &r);
  return r;
}
int size_of(MPI_Comm comm) {
  int p = 1;
  MPI_Comm_size(comm, &p);
  return p;
}

// Waits for every rank without spinning (MPI_Barrier polls a core, which the baseline needs).
void quiet_barrier(MPI_Comm comm) {
  MPI_Request request;
  MPI_Ibarrier(comm, &request);
  int done = 0;
  while (MPI_Test(&request, &done, MPI_STATUS_IGNORE), !done) std::this_thread::sleep_for(std::chrono::milliseconds(2));
}

// The median over ranks' maxima: each run starts together and lasts until the slowest rank is done;
// at least 3 runs (1 when one run already takes the whole budget), within about `budget` seconds.
// Returns the median step and, per rank, its compute and communication seconds in that run.
struct Step {
  double seconds = 0, compute = 0, communicate = 0;
};
Step median_step(MPI_Comm comm, const std::function<attn::DistributedTimes()>& run, double budget) {
  std::vector<Step> steps;
  double spent = 0;
  while (steps.empty() || (spent < budget && steps.size() < 3) || (steps.size() < 3 && steps.front().seconds < budget)) {
    MPI_Barrier(comm);
    const auto t0 = clock_type::now();
    const attn::DistributedTimes t = run();
    const double mine = std::chrono::duration<double>(clock_type::now() - t0).count();
    Step s;
    MPI_Allreduce(&mine, &s.seconds, 1, MPI_DOUBLE, MPI_MAX, comm);
    s.compute = t.compute_seconds, s.communicate = t.communicate_seconds;
    steps.push_back(s);
    spent += s.seconds;
    if (steps.size() == 1 && s.seconds >= budget) break;
  }
  std::sort(steps.begin(), steps.end(), [](const Step& a, const Step& b) { return a.seconds < b.seconds; });
  return steps[steps.size() / 2];
}

double median_alone(const std::function<void()>& run, double budget) {
  std::vector<double> times;
  double spent = 0;
  while (times.empty() || (times.size() < 3 && (spent < budget || times.front() < budget))) {
    const auto t0 = clock_type::now();
    run();
    times.push_back(std::chrono::duration<double>(clock_type::now() - t0).count());
    spent += times.back();
    if (times.size() == 1 && times.front() >= budget) break;
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

struct Row {
  std::string name;
  double seconds = 0, flops = 0, baseline = 0;
  std::vector<Step> ranks;  // each rank's compute and communication in the median run
};

// One case: B = 1, H = Hk = kHeads, n = m, d = dv = 64; causal (zigzag) or not (contiguous).
constexpr index_t kHeads = 4, kD = 64;

struct Case {
  index_t n;
  bool causal;
};

// Element e of a tensor drawn from `seed`: uniform in [-1, 1), a function of (seed, e) alone, so that
// a rank draws its shard's rows without the whole tensor (splitmix64).
float uniform_at(std::uint64_t seed, index_t e) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(e) + 1;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  return static_cast<float>(static_cast<double>(x >> 11) / 9007199254740992.0 * 2 - 1);
}

// Rows `rows` (global [begin, end) ranges, in order) of the (1, kHeads, n, kD) tensor drawn from `seed`.
Tensor<float> rows_of(std::uint64_t seed, index_t n, const std::vector<std::pair<index_t, index_t>>& rows) {
  index_t count = 0;
  for (const auto& [begin, end] : rows) count += end - begin;
  Tensor<float> t({1, kHeads, count, kD});
  for (index_t h = 0; h < kHeads; ++h) {
    index_t local = 0;
    for (const auto& [begin, end] : rows)
      for (index_t i = begin; i < end; ++i, ++local)
        for (index_t c = 0; c < kD; ++c) t[(h * count + local) * kD + c] = uniform_at(seed, (h * n + i) * kD + c);
  }
  return t;
}

std::vector<Row> run_case(MPI_Comm comm, const Case& c, int threads, double budget) {
  const int P = size_of(comm), me = rank_of(comm);
  const attn::ShardLayout layout = c.causal ? attn::ShardLayout::zigzag : attn::ShardLayout::contiguous;
  const double pairs = c.causal ? static_cast<double>(c.n) * (c.n + 1) / 2 : static_cast<double>(c.n) * c.n;
  const double forward_flops = 4.0 * kD * kHeads * pairs, both_flops = 3 * forward_flops;
  attn::Mask<float> mask;
  if (c.causal) mask.causal = attn::Causal::top_left;
  const std::string shape = "(1," + std::to_string(kHeads) + "," + std::to_string(c.n) + "," + std::to_string(c.n) + "," +
                            std::to_string(kD) + ")" + (c.causal ? " causal" : "");

  // The baseline: rank 0 alone with every rank's threads.
  double base_forward = 0, base_both = 0;
  if (me == 0) {
    attn::set_num_threads(threads * P);
    const std::vector<std::pair<index_t, index_t>> all = {{0, c.n}};
    const Tensor<float> q = rows_of(1, c.n, all), k = rows_of(2, c.n, all), v = rows_of(3, c.n, all), g = rows_of(4, c.n, all);
    Tensor<float> out({1, kHeads, c.n, kD}), lse({1, kHeads, c.n}), dq(q.shape()), dk(k.shape()), dv(v.shape());
    const auto forward = [&] { attn::sdpa_forward<float>(out.view(), lse.view(), {}, q.view(), k.view(), v.view(), mask); };
    base_forward = median_alone(forward, budget);
    base_both = median_alone(
        [&] {
          forward();
          attn::sdpa_backward<float>(dq.view(), dk.view(), dv.view(), g.view(), q.view(), k.view(), v.view(), out.view(),
                                     lse.view(), mask);
        },
        budget);
    attn::set_num_threads(threads);
  }
  quiet_barrier(comm);

  // This rank's shards of the same tensors, drawn row by row (never the whole).
  const auto rows = attn::shard_rows(c.n, P, me, layout);
  const index_t n_r = attn::shard_length(c.n, P, me, layout);
  const Tensor<float> q = rows_of(1, c.n, rows), k = rows_of(2, c.n, rows), v = rows_of(3, c.n, rows),
                      g = rows_of(4, c.n, rows);
  Tensor<float> out({1, kHeads, n_r, kD}), lse({1, kHeads, n_r}), dq(q.shape()), dk(k.shape()), dv(v.shape());
  std::vector<Row> result;
  for (const bool ring : {true, false}) {
    const auto forward = ring ? attn::ring_sdpa_forward<float> : attn::ulysses_sdpa_forward<float>;
    const auto backward = ring ? attn::ring_sdpa_backward<float> : attn::ulysses_sdpa_backward<float>;
    const std::string algorithm = ring ? (c.causal ? "ring zigzag" : "ring") : (c.causal ? "ulysses zigzag" : "ulysses");
    for (const bool both : {false, true}) {
      const auto run = [&] {  // this rank's compute and communication over the calls of one run
        forward(comm, out.view(), lse.view(), q.view(), k.view(), v.view(), mask, {}, layout);
        attn::DistributedTimes times = attn::last_distributed_times();
        if (both) {
          backward(comm, dq.view(), dk.view(), dv.view(), g.view(), q.view(), k.view(), v.view(), out.view(), lse.view(),
                   mask, {}, layout);
          times.compute_seconds += attn::last_distributed_times().compute_seconds;
          times.communicate_seconds += attn::last_distributed_times().communicate_seconds;
        }
        return times;
      };
      const Step step = median_step(comm, run, budget);
      Row row;
      row.name = algorithm + (both ? " forward+backward " : " forward ") + shape;
      row.seconds = step.seconds;
      row.flops = both ? both_flops : forward_flops;
      row.baseline = both ? base_both : base_forward;
      row.ranks.resize(static_cast<std::size_t>(P));
      double mine[2] = {step.compute, step.communicate};
      std::vector<double> all(static_cast<std::size_t>(2 * P));
      MPI_Gather(mine, 2, MPI_DOUBLE, all.data(), 2, MPI_DOUBLE, 0, comm);
      for (int r = 0; r < P; ++r) row.ranks[static_cast<std::size_t>(r)] = {step.seconds, all[2 * r], all[2 * r + 1]};
      result.push_back(row);
    }
  }
  return result;
}

}  // namespace

void run_distributed_bench(const DistributedBenchOptions& o) {
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  const MPI_Comm comm = MPI_COMM_WORLD;
  const int P = size_of(comm), me = rank_of(comm);
  const int threads = o.threads > 0 ? o.threads : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / P);
  attn::set_num_threads(threads);
  if (me == 0)
    std::cerr << "bench --distributed: " << P << " ranks of " << threads << " threads against 1 process of " << threads * P
              << " threads, simd " << attn::simd_target() << "\n";
  // Resident memory before any case (MPI's and OpenMP's runtimes), so that the peak over it is the
  // cases' own.
  const auto resident_mib = [] {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return static_cast<double>(usage.ru_maxrss) / 1024;
  };
  const double floor_mib = resident_mib();
  std::vector<Case> cases = {{16384, false}, {16384, true}};
  if (o.large) cases.push_back({65536, false}), cases.push_back({65536, true});
  std::vector<Row> rows;
  for (const Case& c : cases) {
    if (me == 0) std::cerr << "  n = m = " << c.n << (c.causal ? " causal" : "") << "...\n";
    for (Row& r : run_case(comm, c, threads, o.seconds)) rows.push_back(r);
  }
  const double mine_mib = resident_mib() - floor_mib;
  std::vector<double> peak_mib(static_cast<std::size_t>(P));
  MPI_Gather(&mine_mib, 1, MPI_DOUBLE, peak_mib.data(), 1, MPI_DOUBLE, 0, comm);
  if (me == 0) {
    if (o.json) {
      std::cout << "{\"ranks\": " << P << ", \"threads_per_rank\": " << threads << ", \"simd_target\": \""
                << attn::simd_target() << "\", \"cases\": [\n";
      for (std::size_t i = 0; i < rows.size(); ++i) {
        const Row& r = rows[i];
        std::cout << "  {\"name\": \"" << r.name << "\", \"median_s\": " << r.seconds << ", \"gflops\": " << r.flops / r.seconds / 1e9
                  << ", \"single_process_s\": " << r.baseline << ", \"efficiency\": " << r.baseline / r.seconds
                  << ", \"rank_compute_s\": [";
        for (std::size_t k = 0; k < r.ranks.size(); ++k) std::cout << (k ? ", " : "") << r.ranks[k].compute;
        std::cout << "], \"rank_communicate_s\": [";
        for (std::size_t k = 0; k < r.ranks.size(); ++k) std::cout << (k ? ", " : "") << r.ranks[k].communicate;
        std::cout << "]}" << (i + 1 < rows.size() ? "," : "") << "\n";
      }
      std::cout << "], \"peak_rss_over_runtime_mib\": [";
      for (int r = 0; r < P; ++r) std::cout << (r ? ", " : "") << peak_mib[static_cast<std::size_t>(r)];
      std::cout << "]}\n";
    } else {
      std::printf("%d ranks of %d threads, simd %s; baseline: 1 process of %d threads\n", P, threads,
                  attn::simd_target().c_str(), threads * P);
      std::printf("%-52s %10s %9s %12s %10s %s\n", "case", "median ms", "GFLOP/s", "1 process ms", "efficiency",
                  "per rank: compute / communicate / idle, % of the step");
      for (const Row& r : rows) {
        std::printf("%-52s %10.1f %9.1f %12.1f %9.0f%% ", r.name.c_str(), r.seconds * 1e3, r.flops / r.seconds / 1e9,
                    r.baseline * 1e3, 100 * r.baseline / r.seconds);
        for (const Step& s : r.ranks)
          std::printf(" %.0f/%.0f/%.0f", 100 * s.compute / s.seconds, 100 * s.communicate / s.seconds,
                      100 * std::max(0.0, 1 - (s.compute + s.communicate) / s.seconds));
        std::printf("\n");
      }
      std::printf("GFLOP/s count 4 d H per attended (query, key) pair forward (n (n + 1) / 2 pairs causal), 3x that\n"
                  "forward+backward; efficiency = the single process's time / the ranks' step (equal cores). Peak\n"
                  "resident memory of the cases per rank, over the runtimes' (MiB; rank 0 also ran the baseline):");
      for (int r = 0; r < P; ++r) std::printf(" %.0f", peak_mib[static_cast<std::size_t>(r)]);
      std::printf("\n");
    }
  }
  MPI_Finalize();
}

#endif  // ATTN_HAVE_MPI

}  // namespace attn_cli
