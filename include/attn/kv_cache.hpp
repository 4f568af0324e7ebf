// A KV cache for decoding: the keys and values of `batch` sequences, each growing by the tokens a
// decoder appends, stored in blocks of `block_size` tokens (a block table per sequence, as vLLM's
// paged attention and FlashAttention's flash_attn_with_kvcache): sequences of different lengths grow
// without copying, and a block freed by reset or truncate is reused.
//
//   KvCache cache(batch, kv_heads, head_dim, {.dtype = KvDtype::bfloat16});
//   cache.append(seq, keys, values);            // (kv_heads, t, head_dim) each, t >= 1 tokens
//   cache.attend(out, seq, queries);            // queries, out (heads, n, head_dim) or (1, heads, n, head_dim)
//
// Storage types: float32; bfloat16 and float16 (rounded to nearest even on append; float16 stores a
// value beyond its +-65504 as +-inf, as a cast does, and attention over it is not finite); int8, ggml's
// q8_0 layout: each 32 values of a row share one float32 scale s = max|x| / 127 and are stored as
// round(x / s), so a dequantised value is within s / 2 = max|x| / 254 of the appended one, up to
// float32's rounding (where s falls below float32's normal range, max|x| < 127 * 2^-126 ~ 1.5e-36, its
// subnormal rounding adds at most 2^-143 ~ 1.1e-43); head_dim must be a multiple of 32; float8_e4m3
// and float8_e5m2 (OCP's 8-bit floats, as PyTorch's float8_e4m3fn and float8_e5m2): x / scale
// rounded to nearest even with 3 or 2 mantissa bits, so a stored value is within 2^-4 (e4m3) or 2^-3
// (e5m2) of x relatively, or within scale 2^-10 (e4m3) or scale 2^-17 (e5m2) where |x / scale| is
// below the smallest normal (2^-6, 2^-14), up to float32's rounding; |x / scale| above the largest finite
// (448, 57344) or not finite is refused at append. Over float8 keys read in place the keys' scale
// multiplies each query (of its key head's group) and the values' the output, once (vLLM's
// convention, per head). int4 (ggml's q4_1 with float32 scale and minimum): each 32 values of a
// row form a group stored as codes r in [0, 15] with the group's minimum lo and scale
// s = (max - lo) / 15 (float32), r = round((x - lo) / s) to nearest even, read as fma(r, s, lo): a
// value is within s / 2 = (max - lo) / 30 of the appended one, up to float32's rounding (a few ulp
// of max|x|); head_dim a multiple of 32. int4_kivi (KIVI's layout): keys quantized per channel,
// each group one channel of 32 consecutive tokens (tokens 32 g .. 32 g + 31 of a sequence), values
// per token as int4; a sequence's newest length % 32 tokens (keys and values) are kept in bfloat16
// until their group fills, then quantized from those bfloat16 values (so a stored value is within
// (max - lo) / 30 of the bfloat16 value, and the tail within bfloat16's rounding of the appended
// one); head_dim and block_size multiples of 32. A 4-bit cache stores finite values of magnitude
// up to 2^126 (others are refused at append). Truncating an int4_kivi sequence inside a full group
// keeps that group's first tokens as they read back (rounded to bfloat16, in the tail again), and
// its commit_tree appends the accepted drafts again as they read back. Attention
// computes in float32 over the values as stored (4-bit rows widened a tile at a time). Over int8 and
// int4 keys (not int4_kivi's) each query row is rounded to integers of 16 bits, q ~ r sigma with
// sigma = max|q| / 32767 and r = round(q / sigma) (to nearest even in the default rounding mode), and
// its products with the stored integers are summed in integers (int4's by AVX512-VNNI where the CPU
// has it and the AVX-512 target runs, else in float over the rounded query; ggml rounds a query to 8
// bits): a score q . k moves by at most sigma / 2 sum|k_c| (k as
// stored; float32's rounding of q / sigma adds under sigma 2^-7 an element), a 65534th of max|q|
// sum|k_c|, where the keys' own rounding moves it by up to sum|q_c| max|k| / 254 (int8) or
// sum|q_c| (max - min) / 30 (int4). A row whose largest magnitude is not finite or below 2^-100 is
// used as given.
//
// attend runs attention of n new queries over the sequence's keys (n >= 1; heads a multiple of
// kv_heads, grouped-query attention). The queries are the sequence's last n tokens: query i sits at
// position length - n + i (n may pass the length, as flash_attn_with_kvcache's cache_seqlens may
// be shorter than the queries: a query at a negative position sees no key under the causal rule or a
// window, and its row is 0; attend_batch, whose entries must be appended already, refuses such an
// entry), with or without a causal mask (attn/mask.hpp's bottom-right alignment,
// as FlashAttention's flash_attn_with_kvcache), for the causal rule (on by default: query i sees the
// keys up to length - n + i), a window and ALiBi; soft-capping, attention sinks and a scale as in
// sdpa_forward. Up to four queries per head read the blocks in place
// and split the keys across threads (the decode path); more queries (a prompt chunk) run the blocked
// forward over the blocks in place too, each block of queries widening a tile of 64 key and value
// rows at a time to float32 (never the whole prefix).
//
// attend_batch runs one call over a mixed batch, as a server's step hands it: some sequences decode
// (one new query, or a few), others add a chunk of a prompt. Entry b's queries are rows
// cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 of packed queries (total_q, heads, head_dim) (FlashAttention's
// varlen layout), the newest tokens of sequence seqs[b] (appended already), each aligned bottom-right
// in its own sequence as attend aligns them. Entries of up to four queries with no window and no
// ALiBi run as one decode call per query count (the blocks read in place, the keys split across
// threads); the other entries one call each, threaded over heads and query blocks. The result of each
// entry is the one attend gives for its sequence and queries, bit for bit: the decode path splits
// keys at fixed points (every 1024 keys), whatever the batch and the thread count.
//
// Tree attention for speculative decoding: with KvAttendOptions::tree_parents (t,), the last t tokens
// of the sequence are draft tokens forming a tree, parents[i] = -1 for a child of the last accepted
// token, else the index (< i) of its parent among the drafts. attend's n = t queries are the drafts:
// draft i attends every accepted token (a window or ALiBi measures positions by depth: draft i sits
// at position length - t + depth(i), depth 0 for a child of the last accepted token) and, among the
// drafts, its ancestors and itself. commit_tree(seq, accepted) then keeps the accepted tokens followed
// by the drafts listed (a chain from a root: accepted[0]'s parent is -1, accepted[k]'s is
// accepted[k - 1]), dropping the others; only draft rows move. A sequence remembers the tree of its
// last tree attend until its next append, truncate, reset or commit_tree. A cache with rotary tables
// refuses trees (it rotates keys by their index, a draft's position is its depth): rotate drafts'
// keys and queries at their depths before appending them to a cache without tables. attend_batch
// with tree_parents (total_q,) attends every entry as its sequence's tree (one call per entry), so
// that a server's step verifies several requests' drafts, and commit_tree then takes each (an entry
// of no rows is a tree of no drafts: its commit_tree(seq, {}) keeps the sequence as it is).
//
// Rotary position embeddings (attn/rotary.hpp), fused: with KvCacheOptions::rotary's tables (cos, sin
// (max_pos, rotary_dim / 2) float32; views, so the caller keeps their memory alive as long as the
// cache lives), append stores each key rotated at its position (the sequence's length before the
// append, plus its row) and attend rotates a copy of the queries at theirs (query i of n at
// length - n + i, causal or not: every query at its own position; flash_attn_with_kvcache puts all
// of a non-causal, unwindowed call's queries at the first new position instead). keys() returns the keys
// as stored: rotated. A position past the tables' rows, or a query before position 0 (n > length), is
// an error at append or attend.
//
// Threads: a KvCache is one object as a std::vector is: calls that only read it (attend,
// attend_batch without a tree, keys, values, length, bytes) may run side by side; a call that
// changes it (append, truncate, reset, commit_tree, a tree attend, which records its tree) must not
// run beside any other call on the same cache. Each call threads its own work (set_num_threads).
// Python's attn.KVCache takes a lock per cache for every call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "attn/mask.hpp"
#include "attn/rotary.hpp"
#include "attn/tensor.hpp"

namespace attn {

enum class KvDtype { float32, bfloat16, float16, int8, float8_e4m3, float8_e5m2, int4, int4_kivi };

struct KvCacheOptions {
  KvDtype dtype = KvDtype::float32;
  index_t block_size = 256;  // tokens per block
  // Tokens each sequence may hold: 0 = no limit (blocks allocated as sequences grow); else that many
  // are allocated up front (their bytes checked against the memory attn may use first), and an
  // append past them is an error when `grow` is false (capacity 0 with grow false is refused).
  index_t capacity = 0;
  bool grow = true;
  // float8 caches: the keys' and values' scales (vLLM's k_scale and v_scale), one for every head or
  // one per key head (kv_heads values): a key x of head hk is stored as the 8-bit float nearest
  // x / k_scale[hk] (computed in float32) and read as that times k_scale[hk]; finite and > 0, and
  // at most FLT_MAX / 448 (e4m3) or FLT_MAX / 57344 (e5m2), so that the largest value is a float;
  // {1} for other types.
  std::vector<float> k_scale{1.0f}, v_scale{1.0f};
  // Rotary tables the keys and queries are rotated with (above), or empty: none.
  RotaryTables rotary = {};
};

struct KvAttendOptions {
  Causal causal = Causal::bottom_right;  // bottom_right or none (top_left is refused)
  std::optional<Window> window;
  TensorView<const float> alibi_slopes;  // (heads,), or (batch, heads) for every sequence's attend; or empty
  std::optional<double> softcap;
  std::optional<double> scale;  // default 1 / sqrt(head_dim)
  TensorView<const float> sinks;  // (heads,) attention sinks' logits, or empty
  // attend of one sequence: the last t tokens are draft tokens, a tree given by their parents (t,)
  // (above), and the call's n queries are those t drafts; attend_batch: (total_q,), every entry's
  // queries its sequence's drafts, their parents at the entry's rows in its own indices (a decode is
  // the tree {-1}, a prompt chunk the chain {-1, 0, 1, ...}); empty: no tree.
  TensorView<const std::int64_t> tree_parents;
};

class KvCache {
 public:
  /// An empty cache of `batch` sequences, each kv_heads heads of head_dim; attn::Error for sizes below 1
  /// or options out of range.
  KvCache(index_t batch, index_t kv_heads, index_t head_dim, const KvCacheOptions& options = {});
  ~KvCache();
  /// Movable, not copyable (the blocks move).
  KvCache(KvCache&&) noexcept;
  KvCache& operator=(KvCache&&) noexcept;

  /// The sizes and storage type it was made with; length(seq): the tokens sequence seq holds.
  index_t batch() const;
  index_t kv_heads() const;
  index_t head_dim() const;
  KvDtype dtype() const;
  index_t block_size() const;
  index_t length(index_t seq) const;
  // Bytes of the blocks allocated (keys, values and the int8 and int4 scales and minima; not an
  // int4_kivi sequence's bfloat16 tail).
  std::size_t bytes() const;

  // Appends keys and values (kv_heads, t, head_dim) to sequence seq. The new blocks it needs, all of
  // them, are checked against the memory attn may use before any value is read or block taken
  // (attn::MemoryError, the cache as it was).
  void append(index_t seq, TensorView<const float> keys, TensorView<const float> values);
  // Appends (batch, kv_heads, t, head_dim) to every sequence: all or nothing (every sequence's tokens
  // are checked, and its blocks held, before any is stored).
  void append(TensorView<const float> keys, TensorView<const float> values);

  // out (like queries) = attention of queries (heads, n, head_dim) or (1, heads, n, head_dim) over
  // sequence seq.
  void attend(TensorView<float> out, index_t seq, TensorView<const float> queries,
              const KvAttendOptions& options = {}) const;
  // Every sequence: queries and out (batch, heads, n, head_dim).
  void attend(TensorView<float> out, TensorView<const float> queries, const KvAttendOptions& options = {}) const;

  // A mixed batch (above): out and queries (total_q, heads, head_dim); cu_seqlens_q (B + 1,) from 0,
  // non-decreasing, ending at total_q; seqs (B,) distinct sequences, or empty: entry b is sequence b.
  // alibi_slopes (heads,) or (B, heads), row b for entry b.
  void attend_batch(TensorView<float> out, TensorView<const float> queries, TensorView<const std::int32_t> cu_seqlens_q,
                    TensorView<const std::int32_t> seqs = {}, const KvAttendOptions& options = {}) const;

  // Keeps sequence seq's accepted tokens and the drafts `accepted` of its last tree attend (above).
  void commit_tree(index_t seq, std::span<const index_t> accepted);

  // Sequence seq emptied, or cut to its first `length` tokens; its freed blocks are reused.
  void reset(index_t seq);
  void truncate(index_t seq, index_t length);

  // The keys or values of sequence seq as stored, widened to float32: (kv_heads, length, head_dim).
  Tensor<float> keys(index_t seq) const;
  Tensor<float> values(index_t seq) const;

 private:
  // attend for one sequence; `rotated`: the queries were rotated already (by the batched attend).
  void attend_sequence(TensorView<float> out, index_t seq, TensorView<const float> queries,
                       const KvAttendOptions& options, bool rotated) const;
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace attn
