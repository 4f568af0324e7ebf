// The fused SIMD kernels of the cpu backend, written once with Google Highway and compiled for
// several targets (AVX-512, AVX2, SSE4 and a portable 128-bit emulation); the best one the CPU
// supports is picked at run time (simd_target in attn/config.hpp overrides it). The kernels work
// on one block of the problem per call; the callers in src/cpu split the problem into blocks and
// run them on OpenMP threads, each with its own scratch (cpu/scratch.hpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "core/dropout_plan.hpp"
#include "core/mask_plan.hpp"
#include "core/sdpa_plan.hpp"
#include "core/view4.hpp"

#include "cpu/scratch.hpp"
#include "cpu/simd/dispatch.hpp"

namespace attn::cpu::fused {

// Queries per block: each block keeps its queries transposed, (d, kBlockQ), so that the scores of a
// key are one row of kBlockQ lanes and the online softmax runs down columns without shuffles.
inline constexpr index_t kBlockQ = 64;
// Keys per tile: scores and weights of a block for one tile are (kBlockK, kBlockQ).
inline constexpr index_t kBlockK = 64;
static_assert(kBlockK == kBlockQ, "the backward transposes square (kBlockK, kBlockQ) tiles");
// How many chunks the keys of each of `heads` heads are split into so that the calls' tasks number
// about 16 (both threads kept busy under dynamic scheduling): at least 1, at most `most`. `heads` may
// be 0 (a batch of none), which leaves no task to run.
inline index_t key_chunks(index_t heads, index_t most) {
  return std::clamp<index_t>((16 + heads - 1) / std::max<index_t>(1, heads), 1, std::max<index_t>(1, most));
}
// The fused kernels compare key indices in T lanes; beyond 2^24 keys a float no longer holds them.
inline constexpr index_t kMaxKeys = index_t(1) << 24;

// A finished row's 1/sum and lse from its maximum and sum of weights: an empty row (sum 0) gets 0
// and -inf; a row whose sum is NaN (a score_mod returned NaN, or NaN in an attended key) gets NaN in
// both, as PyTorch's math gives.
template <class T>
inline T row_inv_sum(double sum) {
  return sum > 0 ? static_cast<T>(1.0 / sum) : sum == 0 ? T(0) : std::numeric_limits<T>::quiet_NaN();
}
template <class T>
inline T row_lse(T max, double sum) {
  return sum > 0    ? max + static_cast<T>(std::log(sum))
         : sum == 0 ? -std::numeric_limits<T>::infinity()
                    : std::numeric_limits<T>::quiet_NaN();
}

// A finished row from its running maximum and sum of weights over the keys (the accumulated output
// being sum_j e^(s_j - max) v_j): the factor that turns that output into the row's out, and its lse.
// With an attention sink (attn/mask.hpp: one more score with no value), the sink's term joins the
// sum: e^(sink - max), or, where the sink exceeds the maximum, the sum rescaled to the sink's
// (overflow-free either way); a row with no key then outputs 0 with lse = sink.
template <class T>
struct RowEnd {
  T factor, lse;
};
template <class T>
inline RowEnd<T> row_end(T max, double sum, const T* sink) {
  if (sink == nullptr || !(sum >= 0)) return {row_inv_sum<T>(sum), row_lse(max, sum)};  // NaN stays NaN
  if (sum == 0) return {T(0), *sink};
  if (*sink <= max) {
    const double total = sum + std::exp(static_cast<double>(*sink) - static_cast<double>(max));
    return {static_cast<T>(1.0 / total), max + static_cast<T>(std::log(total))};
  }
  const double shrink = std::exp(static_cast<double>(max) - static_cast<double>(*sink));
  const double total = sum * shrink + 1.0;
  return {static_cast<T>(shrink / total), *sink + static_cast<T>(std::log(total))};
}

// The arrays of one block of queries while its key tiles stream past (BlockState in
// simd/softmax-inl.h works on them): queries transposed (d, kBlockQ), scores or weights of a key
// tile (kBlockK, kBlockQ), the partial output transposed (v, kBlockQ), and per query the running
// maximum, rescale factor, key range, position, sums and row mask.
template <class T>
struct BlockArrays {
  T* qt;          // (d, kBlockQ)
  T* s;           // (kBlockK, kBlockQ)
  T* ot;          // (v, kBlockQ)
  T* max;         // (kBlockQ)
  T* alpha;       // (kBlockQ)
  T* begin;       // (kBlockQ)
  T* end;         // (kBlockQ)
  T* pos;         // (kBlockQ)
  double* sum;    // (kBlockQ)
  double* tsum;   // (kBlockQ)
  RowMask<T>* rm; // (kBlockQ)
  // The keep-mask of the current tile as bits, one word of T's size per query lane per kWordKeys keys:
  // bit jj % kWordKeys of keep_words[(jj / kWordKeys) kBlockQ + i] is key jj of query lane i.
  using Word = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  static constexpr index_t kWordKeys = 8 * sizeof(Word);
  Word* keep_words;  // (kBlockK / kWordKeys, kBlockQ)
  // The additive mask's offsets of the block's rows (row i0 + min(i, rows - 1)), for gathers.
  std::make_signed_t<Word>* bias_rows;  // (kBlockQ)
  T* bias_t;                            // (kBlockK, kBlockQ): the current tile's additive mask transposed

  BlockArrays(Carve& c, index_t d, index_t v)
      : qt(c.take<T>(tile(d))), s(c.take<T>(tile(kBlockK))), ot(c.take<T>(tile(v))), max(c.take<T>(kBlockQ)),
        alpha(c.take<T>(kBlockQ)), begin(c.take<T>(kBlockQ)), end(c.take<T>(kBlockQ)), pos(c.take<T>(kBlockQ)),
        sum(c.take<double>(kBlockQ)), tsum(c.take<double>(kBlockQ)), rm(c.take<RowMask<T>>(kBlockQ)),
        keep_words(c.take<Word>(kBlockK / kWordKeys * kBlockQ)),
        bias_rows(c.take<std::make_signed_t<Word>>(kBlockQ)), bias_t(c.take<T>(tile(kBlockK))) {}

  // Elements of a (rows, kBlockQ) array.
  static std::size_t tile(index_t rows) { return static_cast<std::size_t>(rows) * kBlockQ; }
};

// The element types the kernels read in place of the plan's float tensors: float, bfloat16,
// float16, int8, 8-bit floats (the decode path's KvRows, below; the 16-bit forward's HalfViews), or
// 4-bit codes in groups of 32 along a row (i4) or along 32 tokens of a channel (i4_channels), each
// group with a float scale and minimum (cpu/quant/q4.hpp; the decode path only).
enum class KvType : int { f32, bf16, f16, i8, f8e4m3, f8e5m2, i4, i4_channels };

// Values as bfloat16 V pairs (bf16/dot_bf16.hpp), packed once per call for every block of queries
// of the bfloat16 products: tile t (keys t kBlockK ..) of key head (b, hk) of `heads` at
// data + ((b heads + hk) tiles + t) kBlockK / 2 cols.
struct ValuePairs {
  const std::uint32_t* data = nullptr;
  index_t heads = 0, tiles = 0, cols = 0;
  bool on_tiles = false;  // V^T pairs, for the products on AMX tiles (bf16::Unit::tiles)
  const std::uint32_t* of(index_t b, index_t hk, index_t j0) const {
    return data + ((b * heads + hk) * tiles + j0 / kBlockK) * (kBlockK / 2 * cols);
  }
};

// 16-bit queries, keys, values and out of the 16-bit forward (sdpa_forward_block_half and the
// bfloat16 kernel's sdpa_forward_block_bf16): the plan's float views give their shapes, these their
// elements (same strides), all of one type.
struct HalfViews {
  KvType type = KvType::bf16;  // bf16 or f16
  View4<const std::uint16_t> q, k, v;
  View4<std::uint16_t> out;
  // Or, when float_out: the float32 result, not rounded to 16 bits (NumPy's compute_dtype).
  View4<float> out_float;
  bool float_out = false;
  ValuePairs value_pairs;  // for the bfloat16 kernel
};

// The int8 forward's inputs (sdpa_forward_block_int8), quantized once per call by
// cpu/quant/int8_rows.hpp (SageAttention's scheme, one scale a row): the queries, and the keys less
// the mean of their head's keys (which moves every score of a query row by one constant, q . mean,
// added back in float so that scores, soft-capping and lse are the true ones). Rows of
// `row` = int8_row_bytes(d) bytes.
struct Int8Views {
  const std::int8_t* q8 = nullptr;      // (B, H, n, row)
  const float* q_scale = nullptr;       // (B, H, n)
  const float* q_mean = nullptr;        // (B, H, n): q . the mean of the keys its head reads
  const std::int8_t* k8 = nullptr;      // (B, Hk, m, row)
  const float* k_scale = nullptr;       // (B, Hk, m)
  const std::int32_t* k_sum = nullptr;  // (B, Hk, m): each key row's byte sum
  index_t row = 0;
  bool vnni = false;        // Q K^T by the AVX512-VNNI products (int8/dot_int8.hpp), else the portable ones
  bool scores_on_tiles = false;  // those products' sums by AMX-INT8 (int8::scores_on_tiles): the same
  ValuePairs value_pairs;   // P V by the bfloat16 products when set, else in float over the plan's values
};

// One scaled dot-product attention forward call, checked by src/api: out (B, H, n, v) and, when not
// empty, lse (B, H, n, 1) from the plan's queries, keys and values (or from `half`'s), on the SIMD
// target `simd` (read once for the call, simd/dispatch.hpp).
struct KvRows;  // below: the decode path's rows

template <class T>
struct SdpaForward {
  View4<T> out, lse;
  const SdpaPlan<T>* plan;
  simd::Target simd;
  const HalfViews* half = nullptr;  // the 16-bit forward's inputs and output
  const Int8Views* int8 = nullptr;  // the int8 forward's quantized inputs
  // The forward over rows read in place (sdpa_forward_block_rows): keys and values (float only).
  const KvRows* keys = nullptr;
  const KvRows* values = nullptr;
};

// Bytes of per-thread work space sdpa_forward_block needs for query size d and value size v.
template <class T>
std::size_t sdpa_forward_work_bytes(index_t d, index_t v) {
  return layout_bytes<BlockArrays<T>>(d, v);
}

// Rows [i0, i0 + kBlockQ) of batch b, head h (fewer at the end): out and lse of those rows, by an
// online softmax over tiles of kBlockK keys. `work` is sdpa_forward_work_bytes of 64-byte aligned
// memory.
template <class T>
void sdpa_forward_block(const SdpaForward<T>& p, index_t b, index_t h, index_t i0, void* work);

// The same with 16-bit queries and out (p.half), widened and narrowed in the block's work space,
// over the plan's float keys and values (the caller widened them): the float kernel's arithmetic,
// bit for bit, on every SIMD target.
void sdpa_forward_block_half(const SdpaForward<float>& p, index_t b, index_t h, index_t i0, void* work);
// The same with bfloat16 inputs and out (p.half) through the bfloat16 kernel's products
// (bf16/dot_bf16.hpp): scores and P V by vdpbf16ps or AMX's tiles (p.half->value_pairs.on_tiles), P
// rounded to bfloat16, masks and the online softmax in float as above. Only on the AVX-512 target of
// a CPU with AVX512-BF16.
void sdpa_forward_block_bf16(const SdpaForward<float>& p, index_t b, index_t h, index_t i0, void* work);
// The work space of both: a block's arrays and kBlockQ rows of floats: the block's queries widened
// (sdpa_forward_block_half), a tile of values widened (sdpa_forward_block_bf16), a row of out.
struct HalfArrays {
  BlockArrays<float> block;
  float* tile;  // (kBlockK, max(d, v)); kBlockK == kBlockQ, so a block's queries fit
  HalfArrays(Carve& c, index_t d, index_t v)
      : block(c, d, v), tile(c.take<float>(static_cast<std::size_t>(kBlockK * std::max(d, v)))) {}
};
inline std::size_t sdpa_forward_half_work_bytes(index_t d, index_t v) { return layout_bytes<HalfArrays>(d, v); }

// The same over keys and values read from p.keys and p.values (KvRows, below: a KV cache's blocks of
// any stored type, or a tensor's rows), each tile of kBlockK rows widened to float in the block's
// work space as it is used (kv_rows-inl.h): the float kernel's arithmetic over the widened values.
void sdpa_forward_block_rows(const SdpaForward<float>& p, index_t b, index_t h, index_t i0, void* work);
// Its work space: a block's arrays and a tile of keys and of values.
struct RowsArrays {
  BlockArrays<float> block;
  float* key_rows;    // (kBlockK, d)
  float* value_rows;  // (kBlockK, v)
  RowsArrays(Carve& c, index_t d, index_t v)
      : block(c, d, v), key_rows(c.take<float>(static_cast<std::size_t>(kBlockK * d))),
        value_rows(c.take<float>(static_cast<std::size_t>(kBlockK * v))) {}
};
inline std::size_t sdpa_forward_rows_work_bytes(index_t d, index_t v) { return layout_bytes<RowsArrays>(d, v); }

// The same with int8 products (p.int8): Q K^T over the quantized rows in int32, exact, by
// vpdpbusd (AVX512-VNNI, on the AVX-512 target) or 16-bit products (every target), the same sums
// either way; scaled to float, then masks and the online softmax in float as above, and P V in
// float or, with p.int8->value_pairs, by vdpbf16ps with P rounded to bfloat16. out and lse float.
void sdpa_forward_block_int8(const SdpaForward<float>& p, index_t b, index_t h, index_t i0, void* work);
// Its work space: a block's arrays (without queries), its quantized queries packed for the
// products (quads or int16 pairs: at most row / 2 words a lane), and each lane's scale and q . mean.
struct Int8Arrays {
  BlockArrays<float> block;
  std::uint32_t* queries;  // (row / 2, kBlockQ)
  float* q_scale;          // (kBlockQ)
  float* q_mean;           // (kBlockQ)
  Int8Arrays(Carve& c, index_t d, index_t v)
      : block(c, 0, v), queries(c.take<std::uint32_t>(static_cast<std::size_t>((d + 3) / 4 * 2 * kBlockQ))),
        q_scale(c.take<float>(kBlockQ)), q_mean(c.take<float>(kBlockQ)) {}
};
inline std::size_t sdpa_forward_int8_work_bytes(index_t d, index_t v) { return layout_bytes<Int8Arrays>(d, v); }

// y[i] = the softmax weights' exponential (ExpWeight, simd/gemm-inl.h) of x[i] <= 0, float, on the
// chosen target: for testing its accuracy.
void simd_exp_weight(const float* x, float* y, std::size_t count);

// ---- decode: one or a few queries over many keys ----------------------------------------------
// Keys split into chunks that threads take independently, one task per chunk of a key head: for each
// tile of the chunk, every query row of the head's group (dot products along d) while the tile is in
// the cache, so that K and V are read from memory once for all the query heads that share them
// (grouped-query attention), and in packs of rows that take each key and value row from one load
// (simd/sdpa_decode.cpp). Each chunk leaves a partial result per row (unnormalised output,
// maximum, sum) and a merge combines the chunks of a row through their maxima, in chunk order.
// Bound by reading K and V.
inline constexpr index_t kDecodeRows = 4;  // queries per head up to which the decode path is used
// Keys per tile of the decode path: a tile's key rows are read, then its value rows. Long tiles
// switch between the two streams less often: (32,1,8192,128) at 2 threads read at 78% of the
// measured bandwidth with 64-key tiles, 87% with 256, 89-90% with 512 to 4096.
inline constexpr index_t kDecodeTile = 512;
// Keys per chunk of the decode path (cpu/sdpa.cpp: decode): fixed, so that where the keys are split
// does not depend on the call's batch or threads; two tiles.
inline constexpr index_t kDecodeChunkKeys = 2 * kDecodeTile;

// Key or value rows the decode path reads in place of the plan's float tensors (whose shapes it
// still uses): float, bfloat16, float16 or int8 elements, in a tensor (strides sB, sH, sR) or in the
// blocks of a KV cache (sequence b's j-th key in block blocks[b * table_stride + j / block_size], at
// row j % block_size of head hk: hk * sH + (j % block_size) * sR elements in). int8 rows carry one
// float scale per 32 elements, at the same place divided by 32 in `scales` (or scale_blocks).
// 4-bit rows (cache blocks only; sH and sR count values, a row's codes start at byte (hk sH + r sR)
// / 2): i4 rows' scales and minima as int8's, in scale_blocks and min_blocks; i4_channels groups
// (32 tokens of a channel, from row 32 t of a block) at hk sH / 32 + t sR + c. With `tails`, the
// rows from tail_from[b] on of batch entry b are bfloat16 words at tails[b] + (hk 32 + j -
// tail_from[b]) sR (a KIVI cache's newest tokens, fewer than 32).
struct KvRows {
  KvType type = KvType::f32;
  const void* data = nullptr;
  const float* scales = nullptr;
  index_t sB = 0, sH = 0, sR = 0;
  const void* const* blocks = nullptr;
  const float* const* scale_blocks = nullptr;
  const float* const* min_blocks = nullptr;
  index_t table_stride = 0, block_size = 0;
  const std::uint16_t* const* tails = nullptr;
  const index_t* tail_from = nullptr;

  // Elements of row j of (b, hk), and its scales (int8).
  template <class E>
  const E* row(index_t b, index_t hk, index_t j) const {
    if (blocks == nullptr) return static_cast<const E*>(data) + b * sB + hk * sH + j * sR;
    return static_cast<const E*>(blocks[b * table_stride + j / block_size]) + hk * sH + j % block_size * sR;
  }
  const float* scale_row(index_t b, index_t hk, index_t j) const {
    if (blocks == nullptr) return scales + (b * sB + hk * sH + j * sR) / 32;
    return scale_blocks[b * table_stride + j / block_size] + (hk * sH + j % block_size * sR) / 32;
  }
  // Rows from j on of batch entry b that lie one after another (sR apart): to the end of j's block,
  // or of the rows before the tail.
  index_t run(index_t b, index_t j) const {
    if (blocks == nullptr) return std::numeric_limits<index_t>::max();
    if (tails != nullptr && j < tail_from[b]) return std::min(block_size - j % block_size, tail_from[b] - j);
    return tails != nullptr ? std::numeric_limits<index_t>::max() : block_size - j % block_size;
  }
};

template <class T>
struct SdpaDecode {
  SdpaForward<T> f;
  index_t chunk_keys, chunks;
  T* part_out;         // (B, H, n, chunks, v)
  T* part_max;         // (B, H, n, chunks)
  double* part_sum;    // (B, H, n, chunks)
  const KvRows* keys = nullptr;    // when given (float only), read instead of the plan's k and v data
  const KvRows* values = nullptr;
  // int8 keys, and 4-bit keys scored in integers (cpu/int8/dot_q4.hpp): each query row rounded, at
  // rounded + row rounded_stride (d values, then for 4-bit keys the row's bytes in q4_scores' layout),
  // and its sigma (B, H, n), 0 for a row used as given (cpu/quant/q8_0.hpp: round_query).
  const std::int16_t* rounded = nullptr;
  const float* sigma = nullptr;
  index_t rounded_stride = 0;
};

// Keys of chunk `chunk` of key heads [hk, hk + heads) of batch b for every query row of the heads
// that read them: the partial results of that chunk. Each tile of keys is read for all those heads
// before the next tile: keys laid out token by token (a token's heads side by side, FlashAttention's
// caches) are then read in memory order.
template <class T>
void sdpa_decode_chunk(const SdpaDecode<T>& p, index_t b, index_t hk, index_t heads, index_t chunk);

// ---- backward ------------------------------------------------------------------------------
// Three passes, each split into blocks that do not depend on the thread count, so results are
// bit-identical at any number of threads:
//   1. stats, per block of kBlockQ queries: each row's maximum and 1/sum of the masked scaled scores
//      and D_i = dout_i . out_i. When the forward's lse is given and every row of the block has
//      |lse| <= kLseTrusted (or is empty, lse = -inf), the weights are rebuilt as exp(s - lse): lse
//      is within half an ulp of the exact value, so each row's weights are off by one common factor
//      within (1 +- kLseTrusted 2^-24) in float. Otherwise (large scores, the d2l chapter's -1e6 fill on an
//      empty row) the maximum and sum are recomputed exactly as the forward does. The block of a
//      longer attention (SdpaPlan::keys_are_a_block) always takes exp(s - lse), lse the whole's:
//      these keys' own maximum and sum would need e^(lse_block - lse), no more exact than lse;
//   2. chunks of keys of one key head: for each query head of its group and each query block (its
//      queries and output gradients transposed once) and each key tile of the chunk, weights P, dP = dout V^T, dS = P (dP - D) (0 where masked), then
//      dV += P^T dout and dK += dS^T Q for the chunk's keys (owned) and dS K into the chunk's own
//      partial dQ;
//   3. dQ = scale x the chunks' partials summed in chunk order.
// D_i comes from out (dout_i . out_i, in float64), as in FlashAttention, not from sum_j P_ij dP_ij
// over the same rounded dP as the unfused computation. The rounding of out and of dP (a dot product
// over v) then leaves sum_j dS_ij slightly off 0, and dQ_i carries that sum times the P-weighted
// mean of the keys: measured at up to 6x the dQ error of torch's unfused float32 in some rows (still
// about 1e-6 of |dQ|). Restoring the zero sum exactly (a second partial per chunk, sum_j P_ij k_j)
// cost 17% of forward+backward time at d = v = 64 and was not kept.
inline constexpr double kLseTrusted = 16;

template <class T>
struct SdpaBackward {
  View4<T> dq, dk, dv;   // dk, dv: (B, Hk, m, *)
  View4<const T> dout, out;
  View4<const T> lse;  // (B, H, n, 1), or empty
  const SdpaPlan<T>* plan;
  T* row_max;         // (B, H, n)
  T* row_inv;         // (B, H, n): 1 / sum, 0 for an empty row
  double* row_dot;    // (B, H, n): dout_i . out_i
  T* dq_partial;      // (B, H, chunks, blocks, d, kBlockQ): per chunk, dQ^T of each query block
  index_t chunk_keys;  // keys per chunk, a multiple of kBlockK
  index_t chunks;      // ceil(m / chunk_keys)
  simd::Target simd;
  // Pass 2's five products by the bfloat16 kernel (bf16/dot_bf16.hpp), P and dS rounded to
  // bfloat16 for theirs, as FlashAttention's 16-bit backward: for float inputs that hold bfloat16
  // values (the bfloat16 backward), on the AVX-512 target of a CPU with AVX512-BF16 where the
  // bfloat16 kernel is chosen (a task that uses the tiles holds a tiles::Scope).
  bool bf16_products = false;
  bool bf16_tiles = false;  // those products on AMX tiles (bf16::Unit::tiles), else by vdpbf16ps
};

// Pass 3, for query block blk of (b, h), bh = b H + h: its row i < rows, at out + i out_stride (cols
// elements), = scale x the sum over chunks, in chunk order, of the chunks' partials, kept as
// transposed query blocks (B, H, chunks, blocks, cols, kBlockQ): the block's kBlockQ lanes of a
// column summed in vectors (contiguous in every partial), then transposed into out. Shared with the
// additive backward (its dqp, scale 1). (Compiled for the baseline and summed lane by lane with
// strided scalar stores, it took 5% of the multi-head layer's forward+backward on a Zen 5.)
template <class T>
void sum_chunk_partials(T* out, index_t out_stride, const T* partials, index_t bh, index_t blk, index_t rows,
                        index_t chunks, index_t blocks, index_t cols, T scale, simd::Target simd);

// Whether pass 2 keeps the chunk's dK and dV key-major, in panels of kBlockQ columns (see
// SdpaChunkArrays): when the query and value sizes are whole panels, for the float products and the
// bfloat16 vectors. dV = W^T dout and dK = dS^T Q then take W^T and dS^T as the tile already holds
// them, key-major, and the block's output gradients and queries packed once per block, where the
// transposed layout (sizes that are not whole panels, whose padding would cost more products than
// it saves, and AMX's tiles, bf16_tiles) transposes W and dS on every tile. Both give the same sums
// in the same order.
inline bool backward_grads_key_major(index_t d, index_t v, bool bf16_tiles) {
  return !bf16_tiles && d % kBlockQ == 0 && v % kBlockQ == 0;
}

// Pass 2's work space for query size d, value size v and chunks of chunk_keys keys: a block's
// arrays, then D (float64) of its rows, five (kBlockK, kBlockQ) tiles, dK and dV of every key tile
// of the chunk, and in the key-major layout the block's queries and output gradients in panels.
template <class T>
struct SdpaChunkArrays {
  BlockArrays<T> block;  // qt: queries^T, s: P^T, ot: dout^T, max / alpha: row max / 1/sum
  double* row_dot;       // (kBlockQ): D of the block's rows
  T* pm;                 // (kBlockQ, kBlockK): W, query-major (transposed layout)
  T* dst;                // (kBlockK, kBlockQ): dP^T, then dS^T
  T* dsm;                // (kBlockQ, kBlockK): dS (transposed layout)
  T* softcap_tanh;       // (kBlockK, kBlockQ): tanh of the soft-capped scores
  T* raw;                // (kBlockK, kBlockQ): the scores before the caller's score_mod
  // dK and dV of the chunk's keys: key-major, (d / kBlockQ) x (chunk_keys, kBlockQ) panels of
  // columns; transposed, (chunk_keys / kBlockK) x (d, kBlockK), dK^T of each tile (v for dV).
  T* dk_chunk;
  T* dv_chunk;
  // Key-major layout: the block's queries (dead rows zeroed) and output gradients, query-major in
  // (d / kBlockQ) x (kBlockQ, kBlockQ) panels of columns. Empty otherwise.
  T* q_panels;
  T* o_panels;

  // With bf16_products, the operands as bfloat16 pairs (bf16/dot_bf16.hpp): of a query block (q_b,
  // o_b: Q^T and dout^T in pairs of their rows; q_a, o_a: Q and dout in pairs of their rows, in the
  // key-major layout a panel of kBlockQ columns at a time ((d / kBlockQ) x (kBlockQ / 2, kBlockQ)),
  // else Q^T and dout^T in pairs along the queries), of the chunk's key tiles, packed once per chunk
  // (k_a, v_a: the rows in pairs along d and v, a tile's at its first row; k_t: kBlockK / 2 d words a
  // tile, its key rows in pairs (vectors) or K^T in pairs along the keys (tiles)), and of a tile's W
  // and dS (w_b, ds_b: W^T and dS^T rows in pairs along the queries, key-major; else W and dS in pairs
  // of rows) and dS^T in pairs of rows (dst_b). Empty otherwise.
  std::uint32_t *q_b, *o_b, *q_a, *o_a, *k_a, *v_a, *k_t, *w_b, *ds_b, *dst_b;

  SdpaChunkArrays(Carve& c, index_t d, index_t v, index_t chunk_keys, bool bf16 = false, bool bf16_tiles = false)
      : block(c, d, v), row_dot(c.take<double>(kBlockQ)), pm(c.take<T>(kBlockQ * kBlockK)),
        dst(c.take<T>(kBlockK * kBlockQ)), dsm(c.take<T>(kBlockQ * kBlockK)), softcap_tanh(c.take<T>(kBlockK * kBlockQ)), raw(c.take<T>(kBlockK * kBlockQ)),
        dk_chunk(c.take<T>(static_cast<std::size_t>(d * chunk_keys))),
        dv_chunk(c.take<T>(static_cast<std::size_t>(v * chunk_keys))),
        q_panels(c.take<T>(backward_grads_key_major(d, v, bf16_tiles) ? static_cast<std::size_t>(d * kBlockQ) : 0)),
        o_panels(c.take<T>(backward_grads_key_major(d, v, bf16_tiles) ? static_cast<std::size_t>(v * kBlockQ) : 0)),
        q_b(words(c, bf16, (d + 1) / 2 * kBlockQ)), o_b(words(c, bf16, (v + 1) / 2 * kBlockQ)),
        q_a(words(c, bf16, d * kBlockQ / 2)), o_a(words(c, bf16, v * kBlockQ / 2)),
        k_a(words(c, bf16, chunk_keys * ((d + 1) / 2))), v_a(words(c, bf16, chunk_keys * ((v + 1) / 2))),
        k_t(words(c, bf16, chunk_keys / 2 * d)), w_b(words(c, bf16, kBlockQ / 2 * kBlockK)),
        ds_b(words(c, bf16, kBlockQ / 2 * kBlockK)), dst_b(words(c, bf16, kBlockK / 2 * kBlockQ)) {}

  static std::uint32_t* words(Carve& c, bool bf16, index_t count) {
    return c.take<std::uint32_t>(bf16 ? static_cast<std::size_t>(count) : 0);
  }
};

// Work space of pass 1 (a block's arrays without an output) and of pass 2 for query size d, value
// size v and chunks of chunk_keys keys.
template <class T>
std::size_t sdpa_backward_work_bytes(index_t d, index_t v, index_t chunk_keys, bool bf16_products = false,
                                     bool bf16_tiles = false) {
  return std::max(layout_bytes<BlockArrays<T>>(d, 0),
                  layout_bytes<SdpaChunkArrays<T>>(d, v, chunk_keys, bf16_products, bf16_tiles));
}

// Pass 1 for rows [i0, i0 + kBlockQ) of (b, h).
template <class T>
void sdpa_backward_stats(const SdpaBackward<T>& p, index_t b, index_t h, index_t i0, void* work);

// Pass 2 for chunk `chunk` of key head hk of batch b (every query head of its group).
template <class T>
void sdpa_backward_chunk(const SdpaBackward<T>& p, index_t b, index_t hk, index_t chunk, void* work);

}  // namespace attn::cpu::fused
