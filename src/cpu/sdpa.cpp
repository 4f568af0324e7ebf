// cpu backend, scaled dot-product attention: the fused kernels (cpu/simd) unless the caller asks for
// the (n, m) weights, which only the unfused path (cpu/unfused.hpp) forms. The backward rebuilds the
// weights from lse where that is exact enough, else recomputes each row's maximum and sum (see
// simd/fused.hpp, pass 1).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "attn/memory.hpp"
#include "cpu/bf16/dot_bf16.hpp"
#include "cpu/bias_classes.hpp"
#include "cpu/cpu.hpp"
#include "cpu/int8/dot_int8.hpp"
#include "cpu/int8/dot_q4.hpp"
#include "cpu/key_padding.hpp"
#include "cpu/quant/int8_rows.hpp"
#include "cpu/quant/q8_0.hpp"
#include "cpu/scratch.hpp"
#include "cpu/simd/convert.hpp"
#include "cpu/simd/fused.hpp"
#include "cpu/unfused.hpp"

namespace attn::cpu {
namespace {

// The decode path's partial results of `parts` (row, chunk) pairs with value size v, and for int8
// keys each of `rounded_rows` query rows of d elements rounded (quant::round_query).
template <class T>
struct DecodeBuffers {
  T* part_out;       // (parts, v)
  T* part_max;       // (parts)
  double* part_sum;  // (parts)
  std::int16_t* rounded;  // (rounded_rows, d)
  float* sigma;           // (rounded_rows)
  DecodeBuffers(Carve& c, std::size_t parts, index_t v, std::size_t rounded_rows, index_t d)
      : part_out(c.take<T>(parts * static_cast<std::size_t>(v))), part_max(c.take<T>(parts)),
        part_sum(c.take<double>(parts)), rounded(c.take<std::int16_t>(rounded_rows * static_cast<std::size_t>(d))),
        sigma(c.take<float>(rounded_rows)) {}
};

// The decode path (simd/fused.hpp): keys split at fixed points, every fused::kDecodeChunkKeys keys
// (split-KV), partial results merged per row in chunk order: a row's result depends on its own keys
// alone, never on the batch it is called with or the thread count (a sequence decoded alone or in a
// server's mixed batch gives the same bits). A task takes one chunk of one key head, or, when the
// keys are stored token by token (a token's heads side by side, as in FlashAttention's caches and
// (B, S, H, D) tensors), of several adjacent ones, read in memory order: all of its batch element's,
// halved while that leaves fewer than 16 tasks (a short cache of few sequences still splits).
template <class T>
void decode(const fused::SdpaForward<T>& f, const fused::KvRows* keys = nullptr, const fused::KvRows* values = nullptr) {
  const SdpaPlan<T>& a = *f.plan;
  const index_t B = a.q.B, H = a.q.H, Hk = a.k.H, n = a.q.R, m = a.k.R, dv = a.v.C;
  const bool token_major = keys != nullptr ? keys->sR > keys->sH && values->sR > values->sH
                                           : a.k.sR > a.k.sH && a.v.sR > a.v.sH;
  index_t heads = token_major ? std::max<index_t>(1, Hk) : 1;
  const index_t chunk_keys = fused::kDecodeChunkKeys, chunks = std::max<index_t>(1, (m + chunk_keys - 1) / chunk_keys);
  auto tasks_with = [&](index_t h) { return B * (Hk / h) * chunks; };
  while (heads > 1 && heads % 2 == 0 && tasks_with(heads) < 16) heads /= 2;
  const index_t groups = Hk / heads;
  const bool int8 = keys != nullptr && keys->type == fused::KvType::i8;
  // 4-bit keys (an int4 cache's; not KIVI's, quantized per channel) where AVX512-VNNI runs: scored in
  // integers too (int8/dot_q4.hpp), each rounded row followed by its bytes in q4_scores' layout.
  const bool q4 = std::is_same_v<T, float> && keys != nullptr && keys->type == fused::KvType::i4 &&
                  f.simd.bit == HWY_AVX3 && int8::has_avx512_vnni();
  const index_t rounded_stride = a.q.C + (q4 ? int8::q4_query_bytes(a.q.C) / 2 : 0);
  const auto rows = static_cast<std::size_t>(B * H * n);
  Scratch<DecodeBuffers<T>> buf(rows * static_cast<std::size_t>(chunks), dv, int8 || q4 ? rows : 0, rounded_stride);
  fused::SdpaDecode<T> p{f, chunk_keys, chunks, buf->part_out, buf->part_max, buf->part_sum, keys, values};
  if constexpr (std::is_same_v<T, float>) {
    if (int8 || q4) {  // each query row rounded once, before the threads share it
      for (index_t r = 0; r < B * H * n; ++r) {
        std::int16_t* rounded = buf->rounded + r * rounded_stride;
        buf->sigma[r] = quant::round_query(f.simd, a.q.row(r / n / H, r / n % H, r % n), a.q.C, rounded);
        if (q4) int8::q4_pack_query(rounded, a.q.C, reinterpret_cast<std::uint8_t*>(rounded + a.q.C));
      }
      p.rounded = buf->rounded, p.sigma = buf->sigma, p.rounded_stride = rounded_stride;
    }
  }
#pragma omp parallel for schedule(dynamic, 1) if (B * groups * chunks > 1)
  for (index_t t = 0; t < B * groups * chunks; ++t)
    fused::sdpa_decode_chunk<T>(p, t / chunks / groups, t / chunks % groups * heads, heads, t % chunks);
  // out = sum_c e^(max_c - max) out_c / sum_c e^(max_c - max) sum_c; lse = max + log(sum), the
  // head's sink joining the sum (fused::row_end).
  for (index_t r = 0; r < B * H * n; ++r) {
    const index_t bh = r / n, i = r % n;
    const T* mx = p.part_max + r * chunks;
    const T top = *std::max_element(mx, mx + chunks);
    T* o = f.out.row(bh / H, bh % H, i);
    std::fill(o, o + dv, T(0));
    double sum = 0;
    if (top != -std::numeric_limits<T>::infinity())
      for (index_t c = 0; c < chunks; ++c) {
        const T e = std::exp(mx[c] - top);
        sum += static_cast<double>(e) * p.part_sum[r * chunks + c];
        const T* oc = p.part_out + (r * chunks + c) * dv;
        for (index_t k = 0; k < dv; ++k) o[k] += e * oc[k];
      }
    const fused::RowEnd<T> end = fused::row_end(top, sum, a.mask.sink_of(bh % H));
    for (index_t k = 0; k < dv; ++k) o[k] *= end.factor;
    if (!f.lse.empty()) f.lse.at(bh / H, bh % H, i, 0) = end.lse;
  }
}

// Keys and values whose rows are not adjacent, copied once per call into dense (B, Hk, m, d) rows:
// a (B, m, Hk, d) tensor seen as (B, Hk, m, d) (FlashAttention's layout, and the multi-head
// layer's) puts a head's rows a power-of-two stride apart, in a few of the caches' sets, so a head's
// keys and values did not stay in L2 from one query block to the next, though every block reads
// them all. Measured on a Xeon (avx3, (4, 8 heads, 512, 512, 64), medians of the two layouts
// alternated in one process): the forward of that layout at 0.82x-0.86x the dense layout's speed
// read in place, 0.91x-0.92x with the copy (one thread; 0.90x on two), the backward at 0.80x-0.83x
// and 0.89x (0.87x on two). Done where the keys are read more than once
// (more than one query block, or heads sharing a key head) and the copy takes at most
// kDenseCopyBytes within attn's memory limit; otherwise the rows are read in place. The copy holds
// the same floats, read in the same order: no result changes.
inline constexpr std::size_t kDenseCopyBytes = std::size_t(256) << 20;

template <class T>
struct DenseKeyRows {
  T* keys;    // (B, Hk, m, d), or none
  T* values;  // (B, Hk, m, dv), or none
  DenseKeyRows(Carve& c, std::size_t key_count, std::size_t value_count)
      : keys(c.take<T>(key_count)), values(c.take<T>(value_count)) {}
};

// The elements of x to copy: all of them where its rows are not adjacent, else none.
template <class T>
std::size_t scattered_rows_count(const View4<const T>& x) {
  return x.empty() || x.R < 2 || x.sR == x.C ? 0 : static_cast<std::size_t>(x.B * x.H * x.R * x.C);
}

// The copies of plan's keys and values where they are worth making (see above), for the scope of a
// call; plan.k and plan.v then view them.
template <class T>
class DenseKeys {
 public:
  explicit DenseKeys(SdpaPlan<T>& plan) : DenseKeys(plan, counts(plan)) {}

 private:
  DenseKeys(SdpaPlan<T>& plan, std::pair<std::size_t, std::size_t> count) : buf_(count.first, count.second) {
    if (count.first > 0) plan.k = copy(plan.k, buf_->keys);
    if (count.second > 0) plan.v = copy(plan.v, buf_->values);
  }
  static std::pair<std::size_t, std::size_t> counts(const SdpaPlan<T>& plan) {
    if (plan.q.R <= fused::kBlockQ && plan.group == 1) return {0, 0};  // each key read once
    std::size_t keys = scattered_rows_count(plan.k), values = scattered_rows_count(plan.v);
    const std::size_t bytes = (keys + values) * sizeof(T), limit = memory_limit(), held = memory_in_use();
    if (bytes > kDenseCopyBytes || held > limit || bytes > limit - held) keys = values = 0;
    return {keys, values};
  }
  static View4<const T> copy(const View4<const T>& x, T* to) {
    const View4<T> dense = dense_view4(to, x.B, x.H, x.R, x.C);
    run_tasks(x.B * x.H, 0, x.R * x.C >= (1 << 14), [&](index_t t, void*) {
      const index_t b = t / x.H, h = t % x.H;
      for (index_t r = 0; r < x.R; ++r) std::copy(x.row(b, h, r), x.row(b, h, r) + x.C, dense.row(b, h, r));
    });
    return dense;
  }
  Scratch<DenseKeyRows<T>> buf_;
};

// The backward's arrays shared by its threads: per row (B, H, n) the maximum, 1/sum and D, the
// chunks' partial dQ, and (when the caller gave no out) the forward's out (B, H, n, v) and lse.
template <class T>
struct BackwardBuffers {
  T* row_max;
  T* row_inv;
  double* row_dot;
  T* dq_partial;
  T* out;
  T* lse;
  // recompute: out and lse are recomputed (out_size elements, and one lse per row; with values
  // of width 0 the out has no elements but the lse still has its rows).
  BackwardBuffers(Carve& c, std::size_t rows, std::size_t partial, bool recompute, std::size_t out_size)
      : row_max(c.take<T>(rows)), row_inv(c.take<T>(rows)), row_dot(c.take<double>(rows)),
        dq_partial(c.take<T>(partial)), out(c.take<T>(recompute ? out_size : 0)), lse(c.take<T>(recompute ? rows : 0)) {}
};

// The 16-bit forward's inputs prepared once per call: the values packed as V pairs per key tile
// (bf16::pack_values, the bfloat16 kernel's path), or the keys and values widened to float (the other).
struct HalfInputs {
  std::uint32_t* packed;  // (B, Hk, tiles, kBlockK / 2, v) words
  float* keys;            // (B, Hk, m, d)
  float* values;          // (B, Hk, m, v)
  HalfInputs(Carve& c, std::size_t packed_words, std::size_t key_floats, std::size_t value_floats)
      : packed(c.take<std::uint32_t>(packed_words)), keys(c.take<float>(key_floats)), values(c.take<float>(value_floats)) {}
};

}  // namespace

// The decode path over keys and values read in place as 16-bit or int8 rows.
void sdpa_decode_rows(View4<float> out, View4<float> lse, const SdpaPlan<float>& given, const fused::KvRows& keys,
                      const fused::KvRows& values) {
  SdpaPlan<float> plan = given;
  const KeyPaddingAsLengths<float> lengths(plan.mask);
  decode(fused::SdpaForward<float>{out, lse, &plan, simd::target_of(plan.switches())}, &keys, &values);
}

// The forward over rows read in place: blocks as sdpa_forward's, each widening its tiles.
void sdpa_forward_rows(View4<float> out, View4<float> lse, const SdpaPlan<float>& given, const fused::KvRows& keys,
                       const fused::KvRows& values) {
  SdpaPlan<float> plan = given;
  const KeyPaddingAsLengths<float> lengths(plan.mask);
  const BiasClassesFor<float> bias_classes(plan.mask, fused::kBlockQ, fused::kBlockK);
  fused::SdpaForward<float> p{out, lse, &plan, simd::target_of(plan.switches())};
  p.keys = &keys, p.values = &values;
  const index_t B = plan.q.B, H = plan.q.H, n = plan.q.R;
  const index_t blocks = (n + fused::kBlockQ - 1) / fused::kBlockQ;
  run_tasks(B * H * blocks, fused::sdpa_forward_rows_work_bytes(plan.q.C, plan.v.C), true, [&](index_t t, void* w) {
    const index_t bh = t / blocks;
    fused::sdpa_forward_block_rows(p, bh / H, bh % H, (t % blocks) * fused::kBlockQ, w);
  });
}

// The 16-bit forward: blocks as sdpa_forward's, through the bfloat16 products (bfloat16, when
// the call's switches choose the kernel (bf16::dot_chosen) and the target is AVX-512), or the float kernel over keys and values widened
// once per call, queries and out converted by the blocks.
void sdpa_forward_half(View4<float> lse, const SdpaPlan<float>& given, const fused::HalfViews& inputs) {
  SdpaPlan<float> plan = given;
  const KeyPaddingAsLengths<float> lengths(plan.mask);
  const BiasClassesFor<float> bias_classes(plan.mask, fused::kBlockQ, fused::kBlockK);
  const simd::Target target = simd::target_of(plan.switches());
  const bf16::Unit unit = bf16::unit_chosen(plan.switches().bf16);
  const bool dot = inputs.type == fused::KvType::bf16 && unit != bf16::Unit::none && target.bit == HWY_AVX3;
  const bool on_tiles = unit == bf16::Unit::tiles;
  fused::HalfViews x = inputs;
  const View4<const std::uint16_t>& k = x.k;
  const View4<const std::uint16_t>& v = x.v;
  const index_t value_tiles = (v.R + fused::kBlockK - 1) / fused::kBlockK;
  const std::size_t tile_words = static_cast<std::size_t>(fused::kBlockK / 2 * v.C);
  const auto size = [](const View4<const std::uint16_t>& t) { return static_cast<std::size_t>(t.B * t.H * t.R * t.C); };
  Scratch<HalfInputs> in(dot ? static_cast<std::size_t>(v.B * v.H * value_tiles) * tile_words : 0, dot ? 0 : size(k),
                         dot ? 0 : size(v));
  if (dot) {
    // The values packed as V pairs once, for every block of queries (each block packed them anew
    // before: 3% of the forward at n = 4096).
    std::uint32_t* packed = in->packed;
    run_tasks(v.B * v.H * value_tiles, 0, v.R * v.C >= (1 << 16), [&](index_t t, void*) {
      const index_t bh = t / value_tiles, j0 = t % value_tiles * fused::kBlockK;
      bf16::pack_values(v.row(bh / v.H, bh % v.H, j0), v.sR, std::min(fused::kBlockK, v.R - j0), v.C,
                        packed + static_cast<std::size_t>(t) * tile_words, on_tiles);
    });
    x.value_pairs = {packed, v.H, value_tiles, v.C, on_tiles};
  } else {
    // The keys and values widened to float once, for every block of queries, into dense (B, Hk, m, *)
    // arrays the plan then reads; threaded over tiles of rows. (Widening each tile in every block
    // instead cost the (1,4096,4096,128) float16 forward 2% to 4%.)
    float *wk = in->keys, *wv = in->values;
    const auto widen = inputs.type == fused::KvType::bf16 ? simd::bfloat16_to_float : simd::float16_to_float;
    const index_t tiles = (k.R + fused::kBlockK - 1) / fused::kBlockK;
    run_tasks(k.B * k.H * tiles, 0, k.R * (k.C + v.C) >= (1 << 16), [&](index_t t, void*) {
      const index_t bh = t / tiles, j0 = t % tiles * fused::kBlockK, b = bh / k.H, hk = bh % k.H;
      for (index_t j = j0; j < std::min(k.R, j0 + fused::kBlockK); ++j) {
        widen(target, k.row(b, hk, j), wk + (bh * k.R + j) * k.C, static_cast<std::size_t>(k.C));
        widen(target, v.row(b, hk, j), wv + (bh * v.R + j) * v.C, static_cast<std::size_t>(v.C));
      }
    });
    plan.k = dense_view4<const float>(wk, k.B, k.H, k.R, k.C);
    plan.v = dense_view4<const float>(wv, v.B, v.H, v.R, v.C);
  }
  const fused::SdpaForward<float> p{{}, lse, &plan, target, &x};
  const index_t B = plan.q.B, H = plan.q.H, n = plan.q.R;
  const index_t blocks = (n + fused::kBlockQ - 1) / fused::kBlockQ;
  run_tasks(B * H * blocks, fused::sdpa_forward_half_work_bytes(plan.q.C, plan.v.C), true, [&](index_t t, void* w) {
    const index_t bh = t / blocks, i0 = (t % blocks) * fused::kBlockQ;
    if (dot) fused::sdpa_forward_block_bf16(p, bh / H, bh % H, i0, w);
    else fused::sdpa_forward_block_half(p, bh / H, bh % H, i0, w);
  });
}

namespace {

// The int8 forward's inputs, quantized once per call (fused::Int8Views), the keys' means and the
// values packed as bfloat16 V pairs (when P V runs through the bfloat16 products).
struct Int8Inputs {
  std::int8_t* q8;        // (B, H, n, row)
  float* q_scale;         // (B, H, n)
  float* q_mean;          // (B, H, n)
  std::int8_t* k8;        // (B, Hk, m, row)
  float* k_scale;         // (B, Hk, m)
  std::int32_t* k_sum;    // (B, Hk, m)
  float* k_mean;          // (B, Hk, d)
  double* lambda;         // (B, Hk, d): quant::balance_channels
  double* inverse;        // (B, Hk, d): 1 / lambda
  std::uint32_t* packed;  // (B, Hk, tiles, kBlockK / 2, v) words
  Int8Inputs(Carve& c, std::size_t query_rows, std::size_t key_rows, std::size_t heads, index_t d, index_t row,
             std::size_t packed_words)
      : q8(c.take<std::int8_t>(query_rows * static_cast<std::size_t>(row))), q_scale(c.take<float>(query_rows)),
        q_mean(c.take<float>(query_rows)), k8(c.take<std::int8_t>(key_rows * static_cast<std::size_t>(row))),
        k_scale(c.take<float>(key_rows)), k_sum(c.take<std::int32_t>(key_rows)),
        k_mean(c.take<float>(heads * static_cast<std::size_t>(d))), lambda(c.take<double>(heads * static_cast<std::size_t>(d))),
        inverse(c.take<double>(heads * static_cast<std::size_t>(d))), packed(c.take<std::uint32_t>(packed_words)) {}
};

// Notes the row (b, h, row) of queries (keys: false) or keys (true) that holds a value int8 cannot:
// the first one, queries before keys, then by position, for a message that does not depend on the
// threads.
void refuse(Int8Refusal& first, bool keys, index_t b, index_t h, index_t row) {
  const auto rank = [](const Int8Refusal& r) { return std::tuple(std::string_view(r.tensor) == "keys", r.b, r.h, r.row); };
  const Int8Refusal found{keys ? "keys" : "queries", b, h, row};
#pragma omp critical(attn_int8_refusal)
  if (first.tensor == nullptr || rank(found) < rank(first)) first = found;
}

}  // namespace

Int8Refusal sdpa_forward_int8(View4<float> out, View4<float> lse, const SdpaPlan<float>& given) {
  SdpaPlan<float> plan = given;
  const KeyPaddingAsLengths<float> lengths(plan.mask);
  const BiasClassesFor<float> bias_classes(plan.mask, fused::kBlockQ, fused::kBlockK);
  const simd::Target target = simd::target_of(plan.switches());
  const View4<const float>& q = plan.q;
  const View4<const float>& k = plan.k;
  const View4<const float>& v = plan.v;
  const index_t B = q.B, H = q.H, Hk = k.H, n = q.R, m = k.R, d = q.C, dv = v.C;
  const index_t row = quant::int8_row_bytes(d);
  const bool avx3 = target.bit == HWY_AVX3;
  const bf16::Unit unit = bf16::unit_chosen(plan.switches().bf16);
  const bool bf16_values = avx3 && unit != bf16::Unit::none, on_tiles = unit == bf16::Unit::tiles;
  const index_t value_tiles = (m + fused::kBlockK - 1) / fused::kBlockK;
  const std::size_t tile_words = static_cast<std::size_t>(fused::kBlockK / 2 * dv);
  Scratch<Int8Inputs> in(static_cast<std::size_t>(B * H * n), static_cast<std::size_t>(B * Hk * m),
                         static_cast<std::size_t>(B * Hk), d, row,
                         bf16_values ? static_cast<std::size_t>(B * Hk * value_tiles) * tile_words : 0);
  const bool big = (n + m) * d >= (1 << 16);
  // The keys from the first some query may attend to the last, per batch element: [reach_begin,
  // reach_end), the span of the rows' ranges (valid lengths, key padding, causal, window; every key
  // under the d2l chapter's fill). Only those keys feed the mean, the balance and the check for
  // values int8 cannot hold, and only they are quantized (the others as zeros, whose scores are
  // masked): what no query may read is not read here either, as in float32 (found by probing: large
  // values in the padding past valid_lens, or past every query's causal reach, changed the other
  // keys' scales and out; NaN there was refused). Every key inside the span is read, masked or not
  // (a gap between rows' ranges too).
  std::vector<index_t> reach_begin(static_cast<std::size_t>(B), 0), reach_end(static_cast<std::size_t>(B), m);
  if (!plan.mask.d2l_fill)
    for (index_t b = 0; b < B; ++b) {
      index_t lo = m, hi = 0;
      for (index_t i = 0; i < n; ++i)
        if (const index_t first = plan.mask.begin(i), end = plan.mask.end(b, i); first < end)
          lo = std::min(lo, first), hi = std::max(hi, end);
      reach_begin[static_cast<std::size_t>(b)] = lo < hi ? lo : 0, reach_end[static_cast<std::size_t>(b)] = lo < hi ? hi : 0;
    }
  // Per key head and channel (tasks of kChannels channels: one head still splits): the mean of the
  // keys in reach, then the largest |k - mean| and the largest |q| of the queries that read the head,
  // and the factors that balance them (quant::balance_channels).
  Int8Refusal refusal;
  constexpr index_t kChannels = 16;
  const index_t channel_groups = (d + kChannels - 1) / kChannels, group = plan.group;
  run_tasks(B * Hk * channel_groups, 0, big, [&](index_t t, void*) {
    const index_t bh = t / channel_groups, c0 = t % channel_groups * kChannels, w = std::min(kChannels, d - c0);
    const index_t b = bh / Hk, hk = bh % Hk;
    double sum[kChannels] = {}, key_top[kChannels] = {}, query_top[kChannels] = {};
    const index_t first = reach_begin[static_cast<std::size_t>(b)], count = reach_end[static_cast<std::size_t>(b)] - first;
    const float* keys0 = k.row(b, hk, first) + c0;  // (rows of a head are sR apart: View4)
    const index_t bad_key = quant::sum_rows(target, keys0, k.sR, count, w, sum);
    if (bad_key >= 0) refuse(refusal, true, b, hk, first + bad_key);
    float* mean = in->k_mean + bh * d + c0;
    for (index_t c = 0; c < w; ++c) mean[c] = count > 0 ? static_cast<float>(sum[c] / static_cast<double>(count)) : 0.0f;
    quant::top_of_rows(target, keys0, k.sR, count, w, mean, key_top);
    for (index_t h = hk * group; h < (hk + 1) * group; ++h) {
      const float* queries0 = q.row(b, h, 0) + c0;
      std::fill(sum, sum + w, 0.0);  // the queries' sums serve only to find a value not finite
      const index_t bad_query = quant::sum_rows(target, queries0, q.sR, n, w, sum);
      if (bad_query >= 0) refuse(refusal, false, b, h, bad_query);
      quant::top_of_rows(target, queries0, q.sR, n, w, nullptr, query_top);
    }
    double* lambda = in->lambda + bh * d + c0;
    quant::balance_channels(key_top, query_top, w, lambda);
    for (index_t c = 0; c < w; ++c) in->inverse[bh * d + c0 + c] = 1 / lambda[c];
  });
  if (refusal.tensor != nullptr) return refusal;
  // The keys in reach less their head's mean over the factors (the others zeros), the queries times
  // them, a row at a time; each query's q . mean.
  const index_t key_tiles = value_tiles;
  run_tasks(B * Hk * key_tiles, 0, big, [&](index_t t, void*) {
    const index_t bh = t / key_tiles, j0 = t % key_tiles * fused::kBlockK;
    const auto b = static_cast<std::size_t>(bh / Hk);
    for (index_t j = j0; j < std::min(m, j0 + fused::kBlockK); ++j) {
      const index_t r = bh * m + j;
      if (j < reach_begin[b] || j >= reach_end[b]) {
        std::fill_n(in->k8 + r * row, row, std::int8_t{0});
        in->k_scale[r] = 0, in->k_sum[r] = 0;
        continue;
      }
      in->k_scale[r] = quant::quantize_row(target, k.row(bh / Hk, bh % Hk, j), in->k_mean + bh * d, in->inverse + bh * d, d,
                                           in->k8 + r * row, in->k_sum + r);
      if (std::isnan(in->k_scale[r])) refuse(refusal, true, bh / Hk, bh % Hk, j);
    }
  });
  const index_t query_blocks = (n + fused::kBlockQ - 1) / fused::kBlockQ;
  run_tasks(B * H * query_blocks, 0, big, [&](index_t t, void*) {
    const index_t bh = t / query_blocks, i0 = t % query_blocks * fused::kBlockQ;
    const index_t b = bh / H, h = bh % H;
    const index_t kv = b * Hk + plan.kv_head(h);
    const float* mean = in->k_mean + kv * d;
    for (index_t i = i0; i < std::min(n, i0 + fused::kBlockQ); ++i) {
      const index_t r = bh * n + i;
      const float* qr = q.row(b, h, i);
      std::int32_t unused = 0;
      in->q_scale[r] = quant::quantize_row(target, qr, nullptr, in->lambda + kv * d, d, in->q8 + r * row, &unused);
      if (std::isnan(in->q_scale[r])) refuse(refusal, false, b, h, i);
      double dot = 0;
      for (index_t c = 0; c < d; ++c) dot += static_cast<double>(qr[c]) * mean[c];
      in->q_mean[r] = static_cast<float>(dot);
    }
  });
  if (refusal.tensor != nullptr) return refusal;
  fused::Int8Views x;
  x.q8 = in->q8, x.q_scale = in->q_scale, x.q_mean = in->q_mean;
  x.k8 = in->k8, x.k_scale = in->k_scale, x.k_sum = in->k_sum, x.row = row;
  x.vnni = avx3 && int8::has_avx512_vnni();
  x.scores_on_tiles = x.vnni && int8::scores_on_tiles(plan.switches().bf16);
  if (bf16_values) {  // the values rounded to bfloat16 and packed as V pairs, a tile a task
    const std::size_t tile_halves = static_cast<std::size_t>(fused::kBlockK * dv);
    run_tasks(B * Hk * value_tiles, tile_halves * sizeof(std::uint16_t), m * dv >= (1 << 16), [&](index_t t, void* work) {
      const index_t bh = t / value_tiles, j0 = t % value_tiles * fused::kBlockK, cnt = std::min(fused::kBlockK, m - j0);
      auto* rounded = static_cast<std::uint16_t*>(work);
      for (index_t j = 0; j < cnt; ++j)
        simd::float_to_bfloat16(target, v.row(bh / Hk, bh % Hk, j0 + j), rounded + j * dv, static_cast<std::size_t>(dv));
      bf16::pack_values(rounded, dv, cnt, dv, in->packed + static_cast<std::size_t>(t) * tile_words, on_tiles);
    });
    x.value_pairs = {in->packed, Hk, value_tiles, dv, on_tiles};
  }
  fused::SdpaForward<float> p{out, lse, &plan, target};
  p.int8 = &x;
  run_tasks(B * H * query_blocks, fused::sdpa_forward_int8_work_bytes(d, dv), true, [&](index_t t, void* w) {
    const index_t bh = t / query_blocks;
    fused::sdpa_forward_block_int8(p, bh / H, bh % H, t % query_blocks * fused::kBlockQ, w);
  });
  return {};
}

// Forward: blocks of kBlockQ queries of one (b, h), dynamically scheduled because causal blocks
// differ in cost. Every row is computed by one block in a fixed key order, so results do not depend
// on the thread count.
template <class T>
void sdpa_forward(View4<T> out, View4<T> lse, View4<T> weights, const SdpaPlan<T>& given) {
  if (given.hook == nullptr &&
      (!weights.empty() || given.k.R > fused::kMaxKeys || given.switches().backend == Backend::unfused))
    return unfused::sdpa_forward<T>(out, lse, weights, given);
  SdpaPlan<T> plan = given;
  const KeyPaddingAsLengths<T> lengths(plan.mask);
  const fused::SdpaForward<T> p{out, lse, &plan, simd::target_of(plan.switches())};
  if (plan.q.R <= fused::kDecodeRows) return decode(p);  // reads the mask row by row: no tile table
  const BiasClassesFor<T> bias_classes(plan.mask, fused::kBlockQ, fused::kBlockK);
  const index_t B = plan.q.B, H = plan.q.H, n = plan.q.R;
  const index_t blocks = (n + fused::kBlockQ - 1) / fused::kBlockQ;
  const index_t tasks = B * H * blocks;
  const DenseKeys<T> dense(plan);
  const std::size_t work = fused::sdpa_forward_work_bytes<T>(plan.q.C, plan.v.C);
  run_tasks(tasks, work, true, [&](index_t t, void* w) {
    const index_t bh = t / blocks;
    fused::sdpa_forward_block<T>(p, bh / H, bh % H, (t % blocks) * fused::kBlockQ, w);
  });
}

// Backward: the three passes of simd/fused.hpp. Key chunks are sized from the shape alone (about 16
// chunks over all key heads, for load balance), never from the thread count, and the partial dQ of
// the chunks are summed in chunk order, so results do not depend on the number of threads.
template <class T>
void sdpa_backward(View4<T> dqueries, View4<T> dkeys, View4<T> dvalues, View4<const T> dout, View4<const T> out,
                   View4<const T> lse, const SdpaPlan<T>& given) {
  if (given.hook == nullptr && (given.k.R > fused::kMaxKeys || given.switches().backend == Backend::unfused))
    return unfused::sdpa_backward<T>(dqueries, dkeys, dvalues, dout, out, lse, given);
  SdpaPlan<T> plan = given;
  const KeyPaddingAsLengths<T> lengths(plan.mask);
  const BiasClassesFor<T> bias_classes(plan.mask, fused::kBlockQ, fused::kBlockK);
  const index_t B = plan.q.B, H = plan.q.H, Hk = plan.k.H, n = plan.q.R, m = plan.k.R, d = plan.q.C, dv = plan.v.C;
  const index_t blocks = (n + fused::kBlockQ - 1) / fused::kBlockQ;
  const index_t tiles = std::max<index_t>(1, (m + fused::kBlockK - 1) / fused::kBlockK);
  const index_t want = fused::key_chunks(B * Hk, tiles);
  const index_t chunk_keys = (tiles + want - 1) / want * fused::kBlockK;
  const index_t chunks = std::max<index_t>(1, (m + chunk_keys - 1) / chunk_keys);
  const DenseKeys<T> dense(plan);
  Scratch<BackwardBuffers<T>> buf(static_cast<std::size_t>(B * H * n),
                                  static_cast<std::size_t>(B * H * chunks * blocks * d * fused::kBlockQ),
                                  out.empty(), static_cast<std::size_t>(B * H * n * dv));
  fused::SdpaBackward<T> p{dqueries,    dkeys,         dvalues,          dout,       out,   lse,
                           &plan,       buf->row_max,  buf->row_inv,     buf->row_dot, buf->dq_partial,
                           chunk_keys,  chunks,        simd::target_of(plan.switches())};
  // bfloat16 inputs (widened by the bfloat16 backward): the bfloat16 products where chosen.
  const bf16::Unit unit = bf16::unit_chosen(plan.switches().bf16);
  p.bf16_products = std::is_same_v<T, float> && plan.switches().bf16_values && p.simd.bit == HWY_AVX3 &&
                    unit != bf16::Unit::none;
  p.bf16_tiles = p.bf16_products && unit == bf16::Unit::tiles;
  if (plan.hook != nullptr && plan.hook->begin_parts != nullptr) plan.hook->begin_parts(plan.hook->ctx, B * Hk * chunks);
  if (out.empty()) {  // D_i = dout_i . out_i needs the forward's output: recompute it, and lse with it
    const View4<T> o = dense_view4(buf->out, B, H, n, dv);
    const View4<T> l = dense_view4(buf->lse, B, H, n, 1);
    sdpa_forward<T>(o, l, {}, plan);
    p.out = o, p.lse = l;
  }
  const std::size_t work = fused::sdpa_backward_work_bytes<T>(d, dv, chunk_keys, p.bf16_products, p.bf16_tiles);
  const auto stats = [&](index_t t, void* w) {
    fused::sdpa_backward_stats<T>(p, t / blocks / H, t / blocks % H, (t % blocks) * fused::kBlockQ, w);
  };
  const auto chunk = [&](index_t t, void* w) {
    fused::sdpa_backward_chunk<T>(p, t / chunks / Hk, t / chunks % Hk, t % chunks, w);
  };
  const auto sum_dq = [&](index_t t, void*) {
    const index_t bh = t / blocks, blk = t % blocks, i0 = blk * fused::kBlockQ;
    fused::sum_chunk_partials<T>(dqueries.row(bh / H, bh % H, i0), dqueries.sR, p.dq_partial, bh, blk,
                                 std::min(fused::kBlockQ, n - i0), chunks, blocks, d, plan.scale, p.simd);
  };
  run_phases(work, true, dynamic_phase(B * H * blocks, stats), dynamic_phase(B * Hk * chunks, chunk),
             static_phase(dqueries.empty() ? 0 : B * H * blocks, sum_dq));
}

// core/kernels.inc's sdpa kernels, for float and double.
ATTN_KERNELS_SDPA(ATTN_INSTANTIATE_KERNEL)

}  // namespace attn::cpu
