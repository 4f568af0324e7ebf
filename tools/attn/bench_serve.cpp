// `attn bench --serve` (bench.hpp): a server's continuous batching replayed through the paged KV
// cache (attn/kv_cache.hpp), once per cache dtype. The trace is built first, the same for every
// dtype: requests arrive together, each a prompt (lengths uniform in [prompt_min, prompt_max], fixed
// seed) and then `generate` decoded tokens. Each step, every request whose prompt is done decodes
// one token, then prompt chunks are taken in request order until `budget` prompt tokens are spent
// (chunked prefill; the last chunk taken may be part of a prompt). A step appends its new tokens'
// keys and values (random, not timed), then times
//   - one attend_batch over the step (the measured path; its sum over the steps is the trace's time),
//   - the same step as one attend per entry (the per-sequence baseline), whose outputs must agree;
//   - on steps with prompt chunks, attend_batch over the chunks alone (the prefill rate), in turn
//     with the same chunks through the dense float32 forward (sdpa_forward<float>, bottom-right
//     causal) over contiguous copies of their sequences' keys and values (the rate prefill is
//     compared with: the same pairs, timed beside it, so a shared machine's load moves both);
// and the first decode-only step is also timed repeatedly in turn with a plain read of the bytes it
// reads from the cache (the decode's fraction of what memory delivers).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <iostream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "attn/config.hpp"
#include "attn/diagnostics.hpp"
#include "attn/error.hpp"
#include "attn/kv_cache.hpp"
#include "attn/sdpa.hpp"
#include "bench.hpp"
#include "exit_codes.hpp"

namespace attn_cli {
namespace {

using attn::index_t;
using attn::KvDtype;
using attn::TensorView;
using clock_type = std::chrono::steady_clock;

constexpr index_t kBlockSize = 256;             // tokens per cache block, every dtype (int4_kivi needs a multiple of 32)
constexpr std::uint64_t kPromptSeed = 20240601;  // the prompt lengths' seed

struct NamedDtype {
  const char* name;
  KvDtype dtype;
};
// Every storage type of attn/kv_cache.hpp, in its order.
constexpr NamedDtype kDtypes[] = {{"float32", KvDtype::float32},         {"bfloat16", KvDtype::bfloat16},
                                  {"float16", KvDtype::float16},         {"int8", KvDtype::int8},
                                  {"float8_e4m3", KvDtype::float8_e4m3}, {"float8_e5m2", KvDtype::float8_e5m2},
                                  {"int4", KvDtype::int4},               {"int4_kivi", KvDtype::int4_kivi}};

// The types stored in groups of 32 values along a row, or of 32 tokens: head_dim a multiple of 32.
bool grouped_by_32(KvDtype t) { return t == KvDtype::int8 || t == KvDtype::int4 || t == KvDtype::int4_kivi; }

// Bytes a cache of `dtype` stores per token once its group is full: the keys and values of every key
// head, with the int8 and int4 groups' float32 scale (and int4's minimum) per 32 values
// (kv_cache.hpp's layouts; what KvCache::bytes() counts per token of a full block). float8's scales
// are per head, not per token.
double stored_bytes_per_token(KvDtype dtype, index_t kv_heads, index_t head_dim) {
  double per_value = 4;
  switch (dtype) {
    case KvDtype::float32: per_value = 4; break;
    case KvDtype::bfloat16:
    case KvDtype::float16: per_value = 2; break;
    case KvDtype::int8: per_value = 1 + 4.0 / 32; break;  // a byte, and a float32 scale per 32
    case KvDtype::float8_e4m3:
    case KvDtype::float8_e5m2: per_value = 1; break;
    case KvDtype::int4:
    case KvDtype::int4_kivi: per_value = 0.5 + 8.0 / 32; break;  // half a byte, a scale and a minimum per 32
  }
  return 2.0 * static_cast<double>(kv_heads * head_dim) * per_value;
}

// The bytes an attend over a sequence of `length` tokens reads from the cache: every token at the
// stored rate, except an int4_kivi sequence's newest length % 32 tokens, held in bfloat16 until their
// group fills.
double stored_bytes(KvDtype dtype, index_t kv_heads, index_t head_dim, index_t length) {
  const index_t tail = dtype == KvDtype::int4_kivi ? length % 32 : 0;
  return static_cast<double>(length - tail) * stored_bytes_per_token(dtype, kv_heads, head_dim) +
         static_cast<double>(tail) * 2.0 * static_cast<double>(kv_heads * head_dim) * 2;
}

// (query, key) pairs of n queries aligned bottom-right over m keys, causal, per head: query i sees
// m - n + i + 1 keys.
double causal_pairs(index_t n, index_t m) {
  return static_cast<double>(n) * static_cast<double>(m - n) + static_cast<double>(n) * static_cast<double>(n + 1) / 2;
}

// ---- The trace ------------------------------------------------------------------------------------

// One entry of a step: the newest `queries` tokens of sequence (request) `seq`.
struct Entry {
  index_t seq, queries;
};
// A step's entries: its `decodes` decoding requests first (one query each, in request order), then
// its prompt chunks. Decode-only: no prompt chunk.
struct Step {
  std::vector<Entry> entries;
  std::size_t decodes = 0;
  bool decode_only() const { return decodes == entries.size(); }
};
struct Trace {
  std::vector<index_t> prompts;  // (requests,) prompt lengths
  std::vector<Step> steps;
  index_t prompt_tokens = 0, generated_tokens = 0, decode_only_steps = 0;
  index_t longest_chunk = 0, widest_step = 0;  // the most tokens of one entry, and the most queries of a step
};

Trace make_trace(const ServeBenchOptions& o) {
  Trace trace;
  std::mt19937_64 gen(kPromptSeed);
  std::uniform_int_distribution<index_t> length(o.prompt_min, o.prompt_max);
  for (index_t r = 0; r < o.requests; ++r) trace.prompts.push_back(length(gen));
  std::vector<index_t> prefilled(static_cast<std::size_t>(o.requests), 0), decoded(static_cast<std::size_t>(o.requests), 0);
  for (index_t done = 0; done < o.requests;) {
    Step step;
    // Requests whose prompt finished in an earlier step decode one token each.
    for (index_t r = 0; r < o.requests; ++r) {
      const auto i = static_cast<std::size_t>(r);
      if (prefilled[i] == trace.prompts[i] && decoded[i] < o.generate) {
        step.entries.push_back({r, 1});
        if (++decoded[i] == o.generate) ++done;
      }
    }
    step.decodes = step.entries.size();
    // Then prompt chunks, in request order, until the budget is spent.
    index_t budget = o.budget;
    for (index_t r = 0; r < o.requests && budget > 0; ++r) {
      const auto i = static_cast<std::size_t>(r);
      const index_t chunk = std::min(trace.prompts[i] - prefilled[i], budget);
      if (chunk == 0) continue;
      step.entries.push_back({r, chunk});
      prefilled[i] += chunk, budget -= chunk;
      trace.longest_chunk = std::max(trace.longest_chunk, chunk);
    }
    trace.widest_step = std::max(trace.widest_step, static_cast<index_t>(step.decodes) + o.budget - budget);
    trace.decode_only_steps += step.decode_only();
    trace.steps.push_back(std::move(step));
  }
  for (index_t p : trace.prompts) trace.prompt_tokens += p;
  trace.generated_tokens = o.requests * o.generate;
  trace.longest_chunk = std::max<index_t>(trace.longest_chunk, 1);
  return trace;
}

// Fills x[0, count) with values uniform in [-1, 1) from draw number `draw` (splitmix64 over a
// counter, 24 bits a value): every dtype's run makes the same draws, so each cache is given the same
// keys, values and queries.
void fill_uniform(float* x, std::size_t count, std::uint64_t draw) {
  std::uint64_t state = draw * 0xD1B54A32D192ED03ull;
  for (std::size_t i = 0; i < count; ++i) {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    x[i] = static_cast<float>(z >> 40) * 0x1p-23f - 1.0f;
  }
}

double seconds_of(const std::function<void()>& f) {
  const auto t0 = clock_type::now();
  f();
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// ---- One dtype's replay ---------------------------------------------------------------------------

// The largest |attend_batch - attend per entry| allowed. Both compute in float32 over the same
// stored values and the same (rounded, for int8) queries, and the decode path splits a sequence's
// keys at the same fixed points in both (kv_cache.hpp), so they agree bit for bit (max_abs_diff 0
// in every run so far). 2^-14 (6.1e-5) leaves room for a change of summation order; a kernel
// reading a wrong block or row moves outputs by ~0.01 and more.
constexpr double kTolerance = 0x1p-14;

struct ServeResult {
  std::string dtype;
  double seconds = 0, per_sequence_seconds = 0;  // attend_batch, and one attend per entry, over every step
  double decode_seconds = 0, decode_bytes = 0;   // the decode-only steps' attend_batch and the cache bytes they read
  // The first decode-only step timed repeatedly, in turn with a plain read of its bytes: medians.
  double decode_step_seconds = 0, decode_step_read_seconds = 0, decode_step_bytes = 0;
  index_t decode_step_sequences = 0;
  double prefill_seconds = 0, prefill_pairs = 0;  // attend_batch over the prompt chunks alone; their (query, key) pairs, all heads
  double dense_seconds = 0;  // the same chunks through the dense forward, timed in turn with the prefill
  double max_abs_diff = 0;
  double bytes_per_token = 0, cache_bytes = 0;  // stored_bytes_per_token; KvCache::bytes() at the end
};

ServeResult replay(const NamedDtype& named, const Trace& trace, const ServeBenchOptions& o) {
  const index_t H = o.heads, Hk = o.kv_heads, d = o.head_dim;
  ServeResult r;
  r.dtype = named.name;
  r.bytes_per_token = stored_bytes_per_token(named.dtype, Hk, d);
  attn::KvCache cache(o.requests, Hk, d, {.dtype = named.dtype, .block_size = kBlockSize});
  // keys, values (Hk, t, d) of one entry; queries, out (total_q, H, d) packed; `each` the baseline's out.
  std::vector<float> keys(static_cast<std::size_t>(Hk * trace.longest_chunk * d)), values(keys.size());
  std::vector<float> queries(static_cast<std::size_t>(trace.widest_step * H * d)), out(queries.size()), each(queries.size());
  std::vector<std::int32_t> cu, seqs, prompt_cu;
  std::uint64_t draw = 0;
  bool timed_a_decode_step = false;
  for (std::size_t i = 0; i < trace.steps.size(); ++i) {
    const Step& step = trace.steps[i];
    const auto B = static_cast<index_t>(step.entries.size());
    cu.assign(1, 0), seqs.clear();
    for (const Entry& e : step.entries) {
      const auto count = static_cast<std::size_t>(Hk * e.queries * d);
      fill_uniform(keys.data(), count, ++draw), fill_uniform(values.data(), count, ++draw);
      cache.append(e.seq, TensorView<const float>(keys.data(), {Hk, e.queries, d}),
                   TensorView<const float>(values.data(), {Hk, e.queries, d}));
      cu.push_back(cu.back() + static_cast<std::int32_t>(e.queries)), seqs.push_back(static_cast<std::int32_t>(e.seq));
    }
    const index_t total_q = cu.back();
    fill_uniform(queries.data(), static_cast<std::size_t>(total_q * H * d), ++draw);
    const TensorView<const float> q(queries.data(), {total_q, H, d});
    const TensorView<const std::int32_t> cu_view(cu.data(), {B + 1}), seqs_view(seqs.data(), {B});
    auto batch = [&] { cache.attend_batch(TensorView<float>(out.data(), {total_q, H, d}), q, cu_view, seqs_view); };
    // Entry b's rows of the packed tensors as (H, n, d) views: what attend takes, without a copy.
    auto per_sequence = [&] {
      for (index_t b = 0; b < B; ++b) {
        const index_t first = cu[static_cast<std::size_t>(b)] * H * d, n = step.entries[static_cast<std::size_t>(b)].queries;
        cache.attend(TensorView<float>(each.data() + first, {H, n, d}, {d, H * d, 1}), step.entries[static_cast<std::size_t>(b)].seq,
                     TensorView<const float>(queries.data() + first, {H, n, d}, {d, H * d, 1}));
      }
    };
    // Which goes first alternates, so that neither always finds the step's new rows in the caches.
    double batch_s = 0, each_s = 0;
    if (i % 2 == 0) {
      batch_s = seconds_of(batch), each_s = seconds_of(per_sequence);
    } else {
      each_s = seconds_of(per_sequence), batch_s = seconds_of(batch);
    }
    r.seconds += batch_s, r.per_sequence_seconds += each_s;
    double diff = 0;
    for (std::size_t e = 0; e < static_cast<std::size_t>(total_q * H * d); ++e)
      diff = std::max(diff, std::abs(static_cast<double>(out[e]) - static_cast<double>(each[e])));
    if (!(diff <= kTolerance))  // NaN included
      throw attn::Error("bench --serve: " + r.dtype + " cache, step " + std::to_string(i) + " (" + std::to_string(B) +
                        " entries, " + std::to_string(total_q) + " queries): attend_batch and one attend per sequence differ by " +
                        std::to_string(diff) + " (largest |difference|; allowed " + std::to_string(kTolerance) + ")");
    r.max_abs_diff = std::max(r.max_abs_diff, diff);

    if (step.decode_only()) {
      double bytes = 0;
      for (const Entry& e : step.entries) bytes += stored_bytes(named.dtype, Hk, d, cache.length(e.seq));
      r.decode_seconds += batch_s, r.decode_bytes += bytes;
      if (!timed_a_decode_step) {  // the first, with the most sequences decoding: timed in turn with a read
        timed_a_decode_step = true;
        std::tie(r.decode_step_seconds, r.decode_step_read_seconds) = medians_against_a_read(batch, bytes, o.seconds);
        r.decode_step_bytes = bytes, r.decode_step_sequences = B;
      }
      continue;
    }
    // The prompt chunks alone (the last entries, so the last rows of the packed tensors), into `each`
    // (compared already): the prefill's rate without the decodes that share its steps.
    const std::size_t first = step.decodes;
    const index_t row0 = cu[first];
    prompt_cu.assign(1, 0);
    for (std::size_t b = first; b < step.entries.size(); ++b) {
      prompt_cu.push_back(cu[b + 1] - static_cast<std::int32_t>(row0));
      const Entry& e = step.entries[b];
      r.prefill_pairs += static_cast<double>(H) * causal_pairs(e.queries, cache.length(e.seq));
    }
    const index_t rows = total_q - row0, chunks = B - static_cast<index_t>(first);
    auto prefill = [&] {
      cache.attend_batch(TensorView<float>(each.data() + row0 * H * d, {rows, H, d}),
                         TensorView<const float>(queries.data() + row0 * H * d, {rows, H, d}),
                         TensorView<const std::int32_t>(prompt_cu.data(), {chunks + 1}),
                         TensorView<const std::int32_t>(seqs.data() + first, {chunks}));
    };
    // The dense forward of each chunk: its rows of the packed queries as (1, H, n, d) over its
    // sequence's keys and values (1, Hk, L, d), copied out of the cache as float32 (not timed).
    std::vector<attn::Tensor<float>> dense_keys, dense_values;
    for (std::size_t b = first; b < step.entries.size(); ++b)
      dense_keys.push_back(cache.keys(step.entries[b].seq)), dense_values.push_back(cache.values(step.entries[b].seq));
    auto dense = [&] {
      attn::Mask<float> mask;
      mask.causal = attn::Causal::bottom_right;
      for (std::size_t b = first; b < step.entries.size(); ++b) {
        const index_t at = cu[b] * H * d, n = step.entries[b].queries, L = cache.length(step.entries[b].seq);
        attn::sdpa_forward<float>(TensorView<float>(out.data() + at, {1, H, n, d}, {n * H * d, d, H * d, 1}), {}, {},
                                  TensorView<const float>(queries.data() + at, {1, H, n, d}, {n * H * d, d, H * d, 1}),
                                  TensorView<const float>(dense_keys[b - first].data(), {1, Hk, L, d}),
                                  TensorView<const float>(dense_values[b - first].data(), {1, Hk, L, d}), mask);
      }
    };
    if (i % 2 == 0) {
      r.prefill_seconds += seconds_of(prefill), r.dense_seconds += seconds_of(dense);
    } else {
      r.dense_seconds += seconds_of(dense), r.prefill_seconds += seconds_of(prefill);
    }
  }
  r.cache_bytes = static_cast<double>(cache.bytes());
  return r;
}

// ---- Options ------------------------------------------------------------------------------------------

// The dtypes `filter` chooses: those whose name contains one of its comma-separated parts (all when
// it is empty).
std::vector<NamedDtype> chosen_dtypes(const std::string& filter) {
  std::vector<std::string> parts;
  for (std::size_t at = 0; at <= filter.size();) {
    const std::size_t comma = std::min(filter.find(',', at), filter.size());
    if (comma > at) parts.push_back(filter.substr(at, comma - at));
    at = comma + 1;
  }
  std::vector<NamedDtype> chosen;
  for (const NamedDtype& t : kDtypes)
    if (parts.empty() || std::any_of(parts.begin(), parts.end(), [&](const std::string& p) { return std::string(t.name).find(p) != std::string::npos; }))
      chosen.push_back(t);
  if (chosen.empty()) {
    std::string names;
    for (const NamedDtype& t : kDtypes) names += (names.empty() ? "" : ", ") + std::string(t.name);
    throw UsageError("--filter \"" + filter + "\" matches no cache dtype; with --serve it chooses among " + names);
  }
  return chosen;
}

// Every value against its rule, naming the option (exit 2).
void check_options(const ServeBenchOptions& o, const std::vector<NamedDtype>& chosen) {
  auto at_least_1 = [](const char* option, index_t value) {
    if (value < 1) throw UsageError(std::string(option) + " is " + std::to_string(value) + "; it must be at least 1");
  };
  at_least_1("--requests", o.requests), at_least_1("--prompt-min", o.prompt_min), at_least_1("--generate", o.generate);
  at_least_1("--budget", o.budget), at_least_1("--heads", o.heads), at_least_1("--kv-heads", o.kv_heads);
  at_least_1("--head-dim", o.head_dim);
  if (o.prompt_max < o.prompt_min)
    throw UsageError("--prompt-max is " + std::to_string(o.prompt_max) + " but --prompt-min is " + std::to_string(o.prompt_min) +
                     "; the longest prompt must be at least the shortest");
  // The batch's cu_seqlens_q and seqs are int32: a step's queries and a sequence's tokens must fit.
  constexpr index_t kInt32 = std::numeric_limits<std::int32_t>::max();
  if (o.prompt_max > kInt32 - o.generate)
    throw UsageError("--prompt-max " + std::to_string(o.prompt_max) + " plus --generate " + std::to_string(o.generate) +
                     " tokens exceed 2^31 - 1, the most an int32 position holds");
  if (o.requests > kInt32 - std::min(o.budget, kInt32))
    throw UsageError("--requests " + std::to_string(o.requests) + " plus --budget " + std::to_string(o.budget) +
                     " (the most queries of a step) exceed 2^31 - 1, the most an int32 cu_seqlens_q holds");
  if (o.heads % o.kv_heads != 0)
    throw UsageError("--kv-heads is " + std::to_string(o.kv_heads) + " but --heads is " + std::to_string(o.heads) +
                     "; the query heads must be a multiple of the key heads (grouped-query attention)");
  for (const NamedDtype& t : chosen)
    if (grouped_by_32(t.dtype) && o.head_dim % 32 != 0)
      throw UsageError("--head-dim is " + std::to_string(o.head_dim) + "; the " + t.name +
                       " cache stores groups of 32 values, so it must be a multiple of 32 (or leave " + t.name +
                       " out with --filter)");
  if (!(o.seconds > 0 && std::isfinite(o.seconds))) {
    std::ostringstream seconds;
    seconds << o.seconds;
    throw UsageError("--seconds is " + seconds.str() + "; it must be positive and finite");
  }
}

// ---- Reporting ------------------------------------------------------------------------------------

struct Figures {  // what a result gives
  double tokens_per_s, decode_fraction, prefill_rate, dense_rate, prefill_fraction, speedup;
};
Figures figures_of(const ServeResult& r, const Trace& trace) {
  Figures f;
  f.tokens_per_s = static_cast<double>(trace.prompt_tokens + trace.generated_tokens) / r.seconds;
  f.decode_fraction = r.decode_step_read_seconds / r.decode_step_seconds;
  f.prefill_rate = r.prefill_seconds > 0 ? r.prefill_pairs / r.prefill_seconds : 0;
  f.dense_rate = r.dense_seconds > 0 ? r.prefill_pairs / r.dense_seconds : 0;
  f.prefill_fraction = r.prefill_seconds > 0 ? r.dense_seconds / r.prefill_seconds : 0;  // the same pairs
  f.speedup = r.per_sequence_seconds / r.seconds;
  return f;
}

void print_json(const std::vector<ServeResult>& results, const Trace& trace, const ServeBenchOptions& o, const std::string& ran) {
  std::cout << "{\"threads\": " << attn::num_threads() << ", \"simd\": \"" << attn::simd_target() << "\", \"simd_ran\": \"" << ran
            << "\", \"requests\": " << o.requests << ", \"prompt_min\": " << o.prompt_min << ", \"prompt_max\": " << o.prompt_max
            << ", \"generate\": " << o.generate << ", \"budget\": " << o.budget << ", \"heads\": " << o.heads
            << ", \"kv_heads\": " << o.kv_heads << ", \"head_dim\": " << o.head_dim << ", \"block_size\": " << kBlockSize
            << ", \"prompt_seed\": " << kPromptSeed << ", \"prompt_tokens\": " << trace.prompt_tokens
            << ", \"generated_tokens\": " << trace.generated_tokens << ", \"steps\": " << trace.steps.size()
            << ", \"decode_only_steps\": " << trace.decode_only_steps << ", \"tolerance\": " << kTolerance
            << ", \"serve\": [\n";
  for (std::size_t i = 0; i < results.size(); ++i) {
    const ServeResult& r = results[i];
    const Figures f = figures_of(r, trace);
    std::cout << "  {\"dtype\": \"" << r.dtype << "\", \"tokens_per_s\": " << f.tokens_per_s
              << ", \"decode_fraction_of_read\": " << f.decode_fraction << ", \"prefill_fraction_of_dense\": " << f.prefill_fraction
              << ", \"speedup_vs_per_sequence\": " << f.speedup << ", \"seconds\": " << r.seconds
              << ", \"per_sequence_seconds\": " << r.per_sequence_seconds << ", \"decode_seconds\": " << r.decode_seconds
              << ", \"decode_gbs\": " << r.decode_bytes / r.decode_seconds / 1e9 << ", \"decode_step_sequences\": " << r.decode_step_sequences
              << ", \"decode_step_bytes\": " << r.decode_step_bytes << ", \"decode_step_median_s\": " << r.decode_step_seconds
              << ", \"decode_step_read_median_s\": " << r.decode_step_read_seconds << ", \"prefill_seconds\": " << r.prefill_seconds
              << ", \"prefill_gpairs\": " << f.prefill_rate / 1e9 << ", \"bytes_per_token\": " << r.bytes_per_token
              << ", \"cache_bytes\": " << r.cache_bytes << ", \"dense_seconds\": " << r.dense_seconds
              << ", \"dense_gpairs\": " << f.dense_rate / 1e9
              << ", \"max_abs_diff\": " << r.max_abs_diff << "}"
              << (i + 1 < results.size() ? "," : "") << "\n";
  }
  std::cout << "]}\n";
}

void print_table(const std::vector<ServeResult>& results, const Trace& trace, const ServeBenchOptions& o, const std::string& ran) {
  std::printf("threads %d, simd %s (the kernels ran %s)\n", attn::num_threads(), attn::simd_target().c_str(), ran.c_str());
  std::printf("trace: %lld requests, prompts %lld..%lld (%lld tokens), %lld generated each, budget %lld; H %lld, Hk %lld, d %lld, "
              "blocks of %lld; %zu steps, %lld decode-only\n",
              static_cast<long long>(o.requests), static_cast<long long>(o.prompt_min), static_cast<long long>(o.prompt_max),
              static_cast<long long>(trace.prompt_tokens), static_cast<long long>(o.generate), static_cast<long long>(o.budget),
              static_cast<long long>(o.heads), static_cast<long long>(o.kv_heads), static_cast<long long>(o.head_dim),
              static_cast<long long>(kBlockSize), trace.steps.size(), static_cast<long long>(trace.decode_only_steps));
  std::printf("%-12s %9s %11s %8s %10s %11s %8s %10s %8s %8s %9s\n", "dtype", "batch s", "per-seq s", "speedup", "tokens/s",
              "decode GB/s", "% read", "prefill GP", "dense GP", "% dense", "max diff");
  for (const ServeResult& r : results) {
    const Figures f = figures_of(r, trace);
    std::printf("%-12s %9.3f %11.3f %7.2fx %10.0f %11.1f %7.1f%% %10.2f %8.2f %7.1f%% %9.1e\n", r.dtype.c_str(), r.seconds,
                r.per_sequence_seconds, f.speedup, f.tokens_per_s, r.decode_bytes / r.decode_seconds / 1e9,
                100 * f.decode_fraction, f.prefill_rate / 1e9, f.dense_rate / 1e9, 100 * f.prefill_fraction, r.max_abs_diff);
  }
  std::printf("batch s: one attend_batch a step, summed; per-seq s: one attend per entry instead; tokens/s: the trace's prompt\n"
              "and generated tokens over batch s. decode GB/s: cache bytes over the decode-only steps' time; %% read: the first\n"
              "decode-only step timed in turn with a plain read of its bytes. prefill GP: 1e9 (query, key) pairs a second of\n"
              "the prompt chunks (attend_batch over them alone); dense GP: the same chunks through the dense causal\n"
              "forward over float32 copies of their sequences, timed in turn with them; %% dense: prefill GP of it.\n");
}

}  // namespace

void run_serve_bench(const ServeBenchOptions& o) {
  const std::vector<NamedDtype> chosen = chosen_dtypes(o.filter);
  check_options(o, chosen);
  const Trace trace = make_trace(o);
  attn::simd_targets_ran(true);
  std::cerr << "bench --serve: " << trace.steps.size() << " steps (" << trace.decode_only_steps << " decode-only), "
            << attn::num_threads() << " threads, " << attn::simd_target() << "\n";
  std::vector<ServeResult> results;
  for (const NamedDtype& t : chosen) {
    std::cerr << "  " << t.name << "..." << std::flush;
    results.push_back(replay(t, trace, o));
    const ServeResult& r = results.back();
    std::cerr << " " << r.seconds << " s (per sequence " << r.per_sequence_seconds << " s); prefill " << r.prefill_seconds
              << " s, the same chunks dense " << r.dense_seconds << " s\n";
  }
  // What ran, as the kernels recorded it: the chosen target alone, or the figures are not its.
  const std::vector<std::string> ran = attn::simd_targets_ran(true);
  if (ran != std::vector<std::string>{attn::simd_target()})
    throw attn::Error("bench --serve: the kernels ran " + ran_string(ran) + ", not the chosen target " + attn::simd_target());
  if (o.json)
    print_json(results, trace, o, ran_string(ran));
  else
    print_table(results, trace, o, ran_string(ran));
}

}  // namespace attn_cli
