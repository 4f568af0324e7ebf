// The KV cache (attn/kv_cache.hpp): blocks of block_size tokens, each holding every key head's rows
// [hk][row][c] in the cache's storage type (4-bit: two codes a byte, with each group's scale and
// minimum; int4_kivi's newest tokens in a bfloat16 tail per sequence), a block table per sequence,
// freed blocks reused. attend hands the decode path or the blocked forward the sequence's block
// pointers (fused::KvRows), read in place; the reference backend gets the keys and values gathered
// into float32.
#include "attn/kv_cache.hpp"

#if defined(__SANITIZE_ADDRESS__)
#define ATTN_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ATTN_ASAN 1
#endif
#endif
#ifdef ATTN_ASAN
#include <sanitizer/asan_interface.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "api/checks.hpp"
#include "api/decode_rows.hpp"
#include "api/rotary.hpp"
#include "attn/config.hpp"
#include "attn/error.hpp"
#include "attn/half.hpp"
#include "attn/memory.hpp"
#include "attn/sdpa.hpp"
#include "core/buffer.hpp"
#include "core/view4.hpp"
#include "core/float8.hpp"
#include "cpu/quant/q4.hpp"
#include "cpu/quant/q8_0.hpp"

namespace attn {
namespace {

using cpu::fused::KvRows;
using cpu::fused::KvType;

index_t element_bytes(KvDtype t) {
  switch (t) {
    case KvDtype::float32: return 4;
    case KvDtype::bfloat16:
    case KvDtype::float16: return 2;
    case KvDtype::int8:
    case KvDtype::float8_e4m3:
    case KvDtype::float8_e5m2:
    case KvDtype::int4:  // two codes a byte: State::bytes_of
    case KvDtype::int4_kivi: return 1;
  }
  return 4;
}

KvType kv_type(KvDtype t) {
  switch (t) {
    case KvDtype::float32: return KvType::f32;
    case KvDtype::bfloat16: return KvType::bf16;
    case KvDtype::float16: return KvType::f16;
    case KvDtype::int8: return KvType::i8;
    case KvDtype::float8_e4m3: return KvType::f8e4m3;
    case KvDtype::float8_e5m2: return KvType::f8e5m2;
    case KvDtype::int4:
    case KvDtype::int4_kivi: return KvType::i4;  // an int4_kivi cache's keys: i4_channels (State::key_rows)
  }
  return KvType::f32;
}

// Queries (B, heads, n, head_dim) as attention over int8 or int4 keys uses them (kv_cache.hpp): each
// row rounded as the decode path rounds it (quant::rounded_query). For the paths that compute in
// float over those keys: int8's prompts (their keys widened to float32), every int4 call, and the
// reference backend.
Tensor<float> rounded_queries(TensorView<const float> q) {
  Tensor<float> out(q.shape());
  const index_t d = q.dim(3);
  std::vector<float> row(static_cast<std::size_t>(d));
  std::vector<std::int16_t> r(static_cast<std::size_t>(d));
  float* to = out.data();
  for (index_t b = 0; b < q.dim(0); ++b)
    for (index_t h = 0; h < q.dim(1); ++h)
      for (index_t i = 0; i < q.dim(2); ++i, to += d) {
        const float* from = &q(b, h, i, 0);
        if (q.stride(3) != 1) {  // a strided row gathered first
          for (index_t c = 0; c < d; ++c) row[static_cast<std::size_t>(c)] = from[c * q.stride(3)];
          from = row.data();
        }
        cpu::quant::rounded_query(cpu::simd::current(), from, d, r.data(), to);
      }
  return out;
}

// Whether a call over a cache of this type takes its queries rounded to 16 bits here (kv_cache.hpp's
// rule for int8 and int4 keys; not int4_kivi's, quantized per channel): int4's always (the decode's
// float products read them), int8's unless the decode reads its rows in place (it rounds them itself).
bool rounds_queries_here(KvDtype t, bool decode_in_place) {
  return t == KvDtype::int4 || (t == KvDtype::int8 && !decode_in_place);
}

// One block: keys and values (kv_heads, block_size, head_dim) in the storage type, for int8 one
// scale per 32 of them, for the 4-bit types one scale and one minimum per group of 32 (cpu/quant/q4.hpp).
// Its arrays lie in one of the cache's regions (BlockStore), each from a cache line (BlockLayout).
struct Block {
  std::span<std::uint8_t> k, v;
  std::span<float> k_scales, v_scales, k_mins, v_mins;
  detail::MemoryReservation counted;  // its bytes, against the memory attn may use (attn/memory.hpp)
  Block() = default;
  Block(Block&&) = default;
  Block(const Block&) = delete;  // two views of one block's memory, counted twice
};

// The memory of a cache's blocks: regions cut into blocks as the cache takes them. A block of its
// own, each 4 KiB page of it faulted in on its first write, made a cache slow to fill on a virtual
// machine whose page faults are slow: on a 2-core Zen 5 VM, appending 8,192 float32 tokens of 8 heads
// of 128 (64 MiB) to a new cache took 140-240 ms, where copying them took 2-5 ms. A region of
// detail::kHugePagesFrom bytes or more is backed by 2 MiB pages where the system allows
// (detail::allocate_aligned), and the same append took 11-19 ms. Regions grow with the cache
// (KvCache::State::new_block), so that a small cache stays small. Blocks are counted against attn's
// memory limit one by one as they are taken (Block::counted); a region's untaken part is not: mapped
// afresh (as regions that large are), it holds memory only once written, that is up to the rest of
// the 2 MiB page its last block ends in. In a build with AddressSanitizer, what is not a block's
// array is poisoned, a line at least after each (BlockLayout::kRedzone), so reading past an array is
// caught as it was when each had an allocation.
class BlockStore {
 public:
  BlockStore() = default;
  BlockStore(const BlockStore&) = delete;
  BlockStore& operator=(const BlockStore&) = delete;
  ~BlockStore() {
    for (auto& r : regions_) mark(r.get(), r.get_deleter().bytes, true);
  }

  // `span` bytes (a multiple of 64, at most region_bytes) from the last region, or from a new one of
  // region_bytes when it has no room; not usable until cut (mark).
  std::byte* take(std::size_t span, std::size_t region_bytes) {
    if (span > region_bytes) detail::fail("KvCache: a block of ", span, " bytes asked of a region of ", region_bytes);
    if (regions_.empty() || span > size_ - used_) {
      if (regions_.size() == regions_.capacity()) regions_.reserve(std::max<std::size_t>(8, 2 * regions_.size()));  // no throw once allocated
      std::unique_ptr<std::byte, Free> region(static_cast<std::byte*>(detail::allocate_aligned(region_bytes)), Free{region_bytes});
      mark(region.get(), region_bytes, false);
      regions_.push_back(std::move(region));
      used_ = 0, size_ = region_bytes;
    }
    std::byte* at = regions_.back().get() + used_;
    used_ += span;
    return at;
  }

  // Marks bytes [p, p + n) as usable (a block's array) or not, in builds with AddressSanitizer.
  static void mark(const void* p, std::size_t n, bool usable) {
#ifdef ATTN_ASAN
    if (usable) {
      ASAN_UNPOISON_MEMORY_REGION(p, n);
    } else {
      ASAN_POISON_MEMORY_REGION(p, n);
    }
#else
    (void)p, (void)n, (void)usable;
#endif
  }

 private:
  struct Free {
    std::size_t bytes;
    void operator()(std::byte* p) const { detail::free_aligned(p, bytes); }
  };
  std::vector<std::unique_ptr<std::byte, Free>> regions_;
  std::size_t used_ = 0, size_ = 0;  // of the last region
};

bool is_float8(KvDtype t) { return t == KvDtype::float8_e4m3 || t == KvDtype::float8_e5m2; }
bool is_int4(KvDtype t) { return t == KvDtype::int4 || t == KvDtype::int4_kivi; }
// Storage types with a scale per 32 values.
bool has_group_scales(KvDtype t) { return t == KvDtype::int8 || is_int4(t); }

// A block's arrays: `data` bytes of keys and as many of values, `groups` scales of each (int8 and the
// 4-bit types) and `mins` minima of each (4-bit): the bytes counted against the memory limit (not
// the padding), and those it takes of a region, each array from a cache line (and, with
// AddressSanitizer, followed by a poisoned line, as an allocation of its own would be).
struct BlockLayout {
#ifdef ATTN_ASAN
  static constexpr std::size_t kRedzone = detail::kCacheLineBytes;
#else
  static constexpr std::size_t kRedzone = 0;
#endif
  std::size_t data = 0, groups = 0, mins = 0;
  BlockLayout(KvDtype t, std::size_t values)  // values: kv_heads x block_size x head_dim (at most 2^40)
      : data(is_int4(t) ? values / 2 : values * static_cast<std::size_t>(element_bytes(t))),
        groups(has_group_scales(t) ? values / 32 : 0), mins(is_int4(t) ? values / 32 : 0) {}
  std::size_t counted() const { return 2 * data + 2 * (groups + mins) * sizeof(float); }
  std::size_t span() const { return 2 * taken(data) + 2 * taken(groups * sizeof(float)) + 2 * taken(mins * sizeof(float)); }
  // The bytes of a region an array of `bytes` takes.
  static std::size_t taken(std::size_t bytes) {
    return (bytes + detail::kCacheLineBytes - 1) / detail::kCacheLineBytes * detail::kCacheLineBytes + kRedzone;
  }
};
// The largest magnitude a 4-bit cache stores: the range of a group, max - min, stays finite.
constexpr float kInt4Largest = 0x1p126f;

// x / scale as the 8-bit float F, for each of count values (checked finite and in range).
template <class F>
void store_float8(const float* x, index_t count, float scale, std::uint8_t* to) {
  for (index_t c = 0; c < count; ++c) to[c] = detail::to_float8<F>(x[c] / scale).bits;
}
template <class F>
void load_float8(const std::uint8_t* from, index_t count, float scale, float* to) {
  for (index_t c = 0; c < count; ++c) to[c] = detail::to_float(F{from[c]}) * scale;
}

// Row `from` (head_dim floats) stored as `type` at `to` (and its scales for int8, scales and mins
// for int4; `scale` divides it for float8). Not for an int4_kivi cache's keys (State::store).
void store_row(KvDtype type, const float* from, index_t count, std::uint8_t* to, float* scales, float* mins, float scale) {
  const auto n = static_cast<std::size_t>(count);
  switch (type) {
    case KvDtype::float32: std::memcpy(to, from, n * sizeof(float)); return;
    case KvDtype::bfloat16:
      convert(std::span<const float>(from, n), std::span<bfloat16>(reinterpret_cast<bfloat16*>(to), n));
      return;
    case KvDtype::float16:
      convert(std::span<const float>(from, n), std::span<float16>(reinterpret_cast<float16*>(to), n));
      return;
    case KvDtype::int8: cpu::quant::q8_0_pack(from, count, reinterpret_cast<std::int8_t*>(to), scales); return;
    case KvDtype::float8_e4m3: store_float8<detail::float8_e4m3>(from, count, scale, to); return;
    case KvDtype::float8_e5m2: store_float8<detail::float8_e5m2>(from, count, scale, to); return;
    case KvDtype::int4:
    case KvDtype::int4_kivi: cpu::quant::q4_pack_row(from, count, to, scales, mins); return;
  }
}

// The stored row as float32 (float8: times `scale`; int4 rows with their scales and mins).
void load_row(KvDtype type, const std::uint8_t* from, const float* scales, const float* mins, index_t count, float* to,
              float scale) {
  const auto n = static_cast<std::size_t>(count);
  switch (type) {
    case KvDtype::float32: std::memcpy(to, from, n * sizeof(float)); return;
    case KvDtype::bfloat16:
      convert(std::span<const bfloat16>(reinterpret_cast<const bfloat16*>(from), n), std::span<float>(to, n));
      return;
    case KvDtype::float16:
      convert(std::span<const float16>(reinterpret_cast<const float16*>(from), n), std::span<float>(to, n));
      return;
    case KvDtype::int8: cpu::quant::q8_0_unpack(reinterpret_cast<const std::int8_t*>(from), scales, count, to); return;
    case KvDtype::float8_e4m3: load_float8<detail::float8_e4m3>(from, count, scale, to); return;
    case KvDtype::float8_e5m2: load_float8<detail::float8_e5m2>(from, count, scale, to); return;
    case KvDtype::int4:
    case KvDtype::int4_kivi: cpu::quant::q4_unpack_row(from, scales, mins, count, to); return;
  }
}

}  // namespace

struct KvCache::State {
  index_t batch, kv_heads, head_dim;
  KvCacheOptions options;
  index_t elem;                                   // bytes per stored element
  BlockStore memory;                              // the blocks' memory
  std::size_t up_front = 0;                       // the blocks a capacity takes at construction (one region)
  std::vector<Block> blocks;                      // every block allocated; a block's id is its place
  std::vector<index_t> free;                      // ids of the blocks no sequence holds
  std::vector<std::vector<index_t>> table;        // per sequence: its blocks' ids, in order
  std::vector<index_t> lengths;                   // per sequence: its tokens
  // Per sequence: the parents of the draft tree its last tree attend was given, kept for
  // commit_tree (written by attend, a const call: the tree is a note, not the cache's contents);
  // none after every change of the sequence. An entry of no rows in a tree attend_batch records
  // a tree of no drafts (commit_tree then keeps the sequence as it is).
  mutable std::vector<std::optional<std::vector<index_t>>> trees;
  // Per sequence of an int4_kivi cache: its newest tokens' keys then values in bfloat16, (2, kv_heads,
  // 32, head_dim), token p at row p % 32 (those from tail_from(seq) on are the sequence's).
  std::vector<detail::Buffer<std::uint16_t>> tails;

  index_t block_rows() const { return kv_heads * options.block_size; }
  // The blocks that hold `tokens` tokens (rounded up without forming tokens + block_size - 1).
  std::size_t blocks_for(index_t tokens) const {
    return static_cast<std::size_t>(tokens / options.block_size + (tokens % options.block_size != 0));
  }
  // The bfloat16 values of an int4_kivi sequence's tail: keys then values, (2, kv_heads, 32, head_dim).
  std::size_t tail_values() const { return static_cast<std::size_t>(2 * kv_heads * 32 * head_dim); }
  bool kivi() const { return options.dtype == KvDtype::int4_kivi; }
  // Bytes of `values` stored values (a multiple of 32 for the 4-bit types: two codes a byte).
  index_t bytes_of(index_t values) const { return is_int4(options.dtype) ? values / 2 : values * elem; }
  // The first token of sequence seq in its bfloat16 tail (int4_kivi), or its length.
  index_t tail_from(index_t seq) const {
    const index_t L = lengths[static_cast<std::size_t>(seq)];
    return kivi() ? L / cpu::quant::kQ4Group * cpu::quant::kQ4Group : L;
  }
  // Where sequence seq's tail keys or values start, or null for a sequence that has none yet
  // (found by fuzzing: an offset into the unallocated tail of a sequence never appended to).
  const std::uint16_t* tail_of(index_t seq, bool values) const {
    const detail::Buffer<std::uint16_t>& t = tails[static_cast<std::size_t>(seq)];
    return t.size() == 0 ? nullptr : t.data() + static_cast<index_t>(values) * kv_heads * 32 * head_dim;
  }
  // Row p % 32 of head hk of a sequence's tail (allocated: the sequence holds tokens).
  std::uint16_t* tail_row(index_t seq, bool values, index_t hk, index_t p) const {
    return const_cast<std::uint16_t*>(tails[static_cast<std::size_t>(seq)].data()) +
           ((static_cast<index_t>(values) * kv_heads + hk) * 32 + p % 32) * head_dim;
  }
  // An int4_kivi block's scale or min of channel c of the 32 tokens from row r (r % 32 == 0) of head hk.
  index_t channel_group(index_t hk, index_t r, index_t c) const {
    return hk * options.block_size * head_dim / 32 + r % options.block_size / 32 * head_dim + c;
  }
  // A block no sequence holds: a freed one, or a new one. `wanted`: the blocks the caller is taking
  // now, this one among them. A new region holds as many blocks as the cache has (it doubles them),
  // or as are wanted where more, up to kMaxRegionBytes; a capacity's first, all of its blocks.
  index_t new_block(std::size_t wanted = 1) {
    if (!free.empty()) {
      const index_t id = free.back();
      free.pop_back();
      return id;
    }
    const BlockLayout layout(options.dtype, static_cast<std::size_t>(block_rows() * head_dim));
    const std::size_t span = layout.span();
    if (blocks.size() == blocks.capacity()) blocks.reserve(std::max<std::size_t>(16, 2 * blocks.size()));  // no throw once cut
    Block b;
    b.counted = detail::MemoryReservation(layout.counted(), "a block of a KvCache");
    const std::size_t most = std::max<std::size_t>(1, kMaxRegionBytes / span);
    const std::size_t region = blocks.empty() && up_front > 0 ? up_front : std::min(std::max({std::size_t{1}, wanted, blocks.size()}), most);
    std::byte* at = memory.take(span, region * span);
    const auto cut = [&at]<class E>(std::span<E>& to, std::size_t count) {
      BlockStore::mark(at, count * sizeof(E), true);
      std::memset(at, 0, count * sizeof(E));  // zeros until written, as a new block always held
      to = std::span<E>(reinterpret_cast<E*>(at), count);
      at += BlockLayout::taken(count * sizeof(E));
    };
    cut(b.k, layout.data), cut(b.v, layout.data), cut(b.k_scales, layout.groups), cut(b.v_scales, layout.groups);
    cut(b.k_mins, layout.mins), cut(b.v_mins, layout.mins);
    blocks.push_back(std::move(b));
    return static_cast<index_t>(blocks.size()) - 1;
  }
  // The largest region a growing cache takes at once (its blocks' bytes, rounded to whole blocks).
  static constexpr std::size_t kMaxRegionBytes = std::size_t{256} << 20;
  // Whether appends of t tokens to each of sequences [first, last) fit (check_room).
  void check_room(const char* op, index_t first, index_t last, index_t t) const;
  void check_append(const char* op, index_t seq, const TensorView<const float>& keys, const TensorView<const float>& values) const;
  void hold(index_t seq, index_t tokens);
  void store(index_t seq, const TensorView<const float>& keys, const TensorView<const float>& values);
  // int4_kivi: the 32 tokens from 32 g of sequence seq, full in its tail, quantized into its block.
  void store_group(index_t seq, index_t g);
  // Queries (1, H, n, d) of sequence seq, or (batch, H, n, d) of every sequence (seq < 0), rotated at
  // their positions length - n + i; empty without rotary tables.
  Tensor<float> rotated_queries(const char* op, const TensorView<const float>& q, index_t seq) const;
  void check_seq(index_t seq, const char* op) const {
    if (seq < 0 || seq >= batch) detail::fail(op, ": seq is ", seq, "; the cache holds sequences 0 to ", batch - 1);
  }
  // Where row r of head hk of sequence seq lives: block and element offset in it.
  std::pair<Block*, index_t> place(index_t seq, index_t hk, index_t r) {
    Block& b = blocks[static_cast<std::size_t>(table[static_cast<std::size_t>(seq)][static_cast<std::size_t>(r / options.block_size)])];
    return {&b, (hk * options.block_size + r % options.block_size) * head_dim};
  }
  // The blocks of sequences seqs[g] for the decode path (batch entry g), as KvRows of keys and of
  // values; valid while this lives (and the cache is not changed).
  struct Sources {
    std::vector<const void*> k, v;
    std::vector<const float*> k_scales, v_scales, k_mins, v_mins;
    std::vector<const std::uint16_t*> k_tails, v_tails;
    std::vector<index_t> tail_from;
    KvRows keys, values;
  };
  Sources sources(std::span<const index_t> seqs) const {
    Sources x;
    index_t per_seq = 0;
    for (const index_t seq : seqs) per_seq = std::max(per_seq, static_cast<index_t>(table[static_cast<std::size_t>(seq)].size()));
    const auto slots = static_cast<std::size_t>(static_cast<index_t>(seqs.size()) * per_seq);
    x.k.resize(slots), x.v.resize(slots), x.k_scales.resize(slots), x.v_scales.resize(slots), x.k_mins.resize(slots), x.v_mins.resize(slots);
    for (std::size_t g = 0; g < seqs.size(); ++g) {
      const auto& ids = table[static_cast<std::size_t>(seqs[g])];
      for (std::size_t k = 0; k < ids.size(); ++k) {
        const Block& b = blocks[static_cast<std::size_t>(ids[k])];
        const std::size_t at = g * static_cast<std::size_t>(per_seq) + k;
        x.k[at] = b.k.data(), x.v[at] = b.v.data(), x.k_scales[at] = b.k_scales.data(), x.v_scales[at] = b.v_scales.data();
        x.k_mins[at] = b.k_mins.data(), x.v_mins[at] = b.v_mins.data();
      }
      if (kivi()) {
        x.k_tails.push_back(tail_of(seqs[g], false)), x.v_tails.push_back(tail_of(seqs[g], true));
        x.tail_from.push_back(tail_from(seqs[g]));
      }
    }
    KvRows& k = x.keys;
    k.type = kv_type(options.dtype), k.sH = options.block_size * head_dim, k.sR = head_dim;
    k.block_size = options.block_size, k.table_stride = per_seq;
    x.values = k;
    if (kivi()) {
      k.type = KvType::i4_channels;
      k.tails = x.k_tails.data(), x.values.tails = x.v_tails.data();
      k.tail_from = x.values.tail_from = x.tail_from.data();
    }
    k.blocks = x.k.data(), k.scale_blocks = x.k_scales.data(), k.min_blocks = x.k_mins.data();
    x.values.blocks = x.v.data(), x.values.scale_blocks = x.v_scales.data(), x.values.min_blocks = x.v_mins.data();
    return x;
  }
  // One decode call over sequences seqs[g] with queries q and out (G, heads, n, head_dim), n at most
  // cpu::fused::kDecodeRows: each sequence's length and the causal rule as per-query valid lengths,
  // blocks past a sequence's length never read.
  void decode_batch(TensorView<float> out, TensorView<const float> q, std::span<const index_t> seqs,
                    const KvAttendOptions& how, const char* op) const;
  // Attention of sequence seq's last t tokens, a draft tree (kv_cache.hpp), over its keys; q and out
  // (1, heads, t, head_dim), q rotated already.
  void attend_tree(TensorView<float> out, TensorView<const float> q, index_t seq, const KvAttendOptions& how,
                   const char* op) const;
  // Attention of queries q (1, heads, n, head_dim) over sequence seq under mask, into out: on the cpu
  // backend over the blocks read in place (the decode path up to cpu::fused::kDecodeRows queries,
  // else the blocked forward widening a tile of rows at a time; float8's scales folded into q and
  // out, int8's queries rounded as kv_cache.hpp states), elsewhere over the keys and values
  // gathered into float32.
  void run(TensorView<float> out, TensorView<const float> q, index_t seq, const Mask<float>& mask, const SdpaOptions& sdpa,
           const char* op) const;
  // A float8 cache's scale of key head hk's keys or values (one for all heads, or one each).
  float scale_of(bool values, index_t hk) const {
    const std::vector<float>& scale = values ? options.v_scale : options.k_scale;
    return scale.size() == 1 ? scale[0] : scale[static_cast<std::size_t>(hk)];
  }
  // What a call that reads the rows in place folds into its queries (keys) or output (values): the
  // float8 scale, times the factor e4m3 rows are widened over (core/float8.hpp).
  float folded_scale(bool values, index_t hk) const {
    return scale_of(values, hk) * (options.dtype == KvDtype::float8_e4m3 ? detail::kE4m3WideningFactor : 1.0f);
  }
  bool scaled() const {
    if (options.dtype == KvDtype::float8_e4m3) return true;
    for (const auto* scale : {&options.k_scale, &options.v_scale})
      for (const float x : *scale)
        if (x != 1) return true;
    return false;
  }
  // The queries (B, H, n, d) of a call that reads float8 keys in place, each head times its key
  // head's folded_scale; empty when every such factor is 1.
  Tensor<float> scaled_queries(const TensorView<const float>& q) const {
    if (!scaled()) return {};
    Tensor<float> t(q.shape());
    float* to = t.data();
    const index_t group = q.dim(1) / kv_heads, d = q.dim(3), step = q.stride(3);
    for (index_t b = 0; b < q.dim(0); ++b)
      for (index_t h = 0; h < q.dim(1); ++h) {
        const float factor = folded_scale(false, h / group);
        for (index_t i = 0; i < q.dim(2); ++i, to += d) {
          const float* from = &q(b, h, i, 0);
          if (step == 1) {  // row by row, not element by element through the view: a prompt's queries
            for (index_t c = 0; c < d; ++c) to[c] = from[c] * factor;
          } else {
            for (index_t c = 0; c < d; ++c) to[c] = from[c * step] * factor;
          }
        }
      }
    return t;
  }
  // The options of a call that reads the keys in place: a folded_scale other than 1 goes into the
  // softmax scale when every key head shares it (the same scores: the factor multiplies q . k either
  // way, and e4m3's 256 exactly), else into a copy of the queries, `copy` (scaled_queries).
  SdpaOptions with_key_scale(const TensorView<const float>& q, const SdpaOptions& sdpa, Tensor<float>& copy) const {
    if (!scaled()) return sdpa;
    if (options.k_scale.size() == 1) {
      const double scale = (sdpa.scale ? *sdpa.scale : 1.0 / std::sqrt(static_cast<double>(head_dim))) * folded_scale(false, 0);
      if (const auto narrow = static_cast<float>(scale); std::isfinite(narrow) && narrow > 0) {
        SdpaOptions folded = sdpa;
        folded.scale = scale;
        return folded;
      }
    }
    copy = scaled_queries(q);
    return sdpa;
  }
  // out (B, H, n, v) of such a call, each head times its key head's folded_scale of the values.
  void scale_values(const TensorView<float>& out) const {
    if (!scaled()) return;
    const index_t group = out.dim(1) / kv_heads, v = out.dim(3), step = out.stride(3);
    for (index_t b = 0; b < out.dim(0); ++b)
      for (index_t h = 0; h < out.dim(1); ++h) {
        const float factor = folded_scale(true, h / group);
        for (index_t i = 0; i < out.dim(2); ++i) {
          float* row = &out(b, h, i, 0);
          if (step == 1) {
            for (index_t c = 0; c < v; ++c) row[c] *= factor;
          } else {
            for (index_t c = 0; c < v; ++c) row[c * step] *= factor;
          }
        }
      }
  }
  // Row r of head hk of sequence seq's keys or values, as stored, widened to float32.
  void read_row(index_t seq, bool values, index_t hk, index_t r, float* to) const {
    if (kivi() && r >= tail_from(seq)) {
      convert(std::span<const bfloat16>(reinterpret_cast<const bfloat16*>(tail_row(seq, values, hk, r)), static_cast<std::size_t>(head_dim)),
              std::span<float>(to, static_cast<std::size_t>(head_dim)));
      return;
    }
    const Block& b = blocks[static_cast<std::size_t>(table[static_cast<std::size_t>(seq)][static_cast<std::size_t>(r / options.block_size)])];
    const index_t at = (hk * options.block_size + r % options.block_size) * head_dim;
    const std::uint8_t* stored = (values ? b.v : b.k).data() + bytes_of(at);
    if (kivi() && !values) {  // a channel's scale and min per 32 tokens
      for (index_t c = 0; c < head_dim; ++c) {
        const index_t group = channel_group(hk, r / 32 * 32, c);
        to[c] = cpu::quant::q4_value(cpu::quant::q4_code(stored, c), b.k_scales[static_cast<std::size_t>(group)],
                                     b.k_mins[static_cast<std::size_t>(group)]);
      }
      return;
    }
    const float* scales = has_group_scales(options.dtype) ? (values ? b.v_scales : b.k_scales).data() + at / 32 : nullptr;
    const float* mins = is_int4(options.dtype) ? (values ? b.v_mins : b.k_mins).data() + at / 32 : nullptr;
    load_row(options.dtype, stored, scales, mins, head_dim, to, scale_of(values, hk));
  }
  Tensor<float> gather(index_t seq, bool values) const {
    const index_t L = lengths[static_cast<std::size_t>(seq)];
    Tensor<float> t({kv_heads, L, head_dim});
    for (index_t hk = 0; hk < kv_heads; ++hk)
      for (index_t r = 0; r < L; ++r) read_row(seq, values, hk, r, t.data() + (hk * L + r) * head_dim);
    return t;
  }
};

KvCache::KvCache(index_t batch, index_t kv_heads, index_t head_dim, const KvCacheOptions& options)
    : s_(std::make_unique<State>()) {
  const char* op = "KvCache";
  if (batch < 1 || kv_heads < 1 || head_dim < 1)
    detail::fail(op, ": batch ", batch, ", kv_heads ", kv_heads, " and head_dim ", head_dim, " must all be at least 1");
  if (options.block_size < 1) detail::fail(op, ": block_size is ", options.block_size, "; it must be at least 1");
  if (options.capacity < 0) detail::fail(op, ": capacity is ", options.capacity, "; it must be 0 (no limit) or more");
  if (has_group_scales(options.dtype) && head_dim % 32 != 0)
    detail::fail(op, ": head_dim is ", head_dim, "; an ", options.dtype == KvDtype::int8 ? "int8" : "int4",
                 " cache stores groups of 32 values, so head_dim must be a multiple of 32");
  if (options.dtype == KvDtype::int4_kivi && options.block_size % 32 != 0)
    detail::fail(op, ": block_size is ", options.block_size, "; an int4_kivi cache quantizes keys in groups of 32 tokens, "
                 "which must not straddle blocks, so block_size must be a multiple of 32");
  for (const auto& [scale, name] : {std::pair{&options.k_scale, "k_scale"}, std::pair{&options.v_scale, "v_scale"}}) {
    if (scale->size() != 1 && static_cast<index_t>(scale->size()) != kv_heads)
      detail::fail(op, ": ", name, " has ", scale->size(), " values; it must have 1 (every head) or kv_heads = ", kv_heads);
    for (const float x : *scale) {
      if (x != 1 && !is_float8(options.dtype))  // first: a scale of 0 given to a float32 cache is not a float8 cache's
        detail::fail(op, ": ", name, " holds ", x, "; scales belong to float8 caches (dtype float8_e4m3 or float8_e5m2)");
      if (!(std::isfinite(x) && x > 0))
        detail::fail(op, ": ", name, " holds ", x, "; a float8 cache's scale must be finite and greater than 0");
      // The cache's values are codes times the scale: its largest code times the scale must be a
      // float (else a key of the largest code reads back as inf, and a stored 0 times it as NaN).
      const bool e4m3 = options.dtype == KvDtype::float8_e4m3;
      const float largest = e4m3 ? detail::Float8Format<detail::float8_e4m3>::kMax : detail::Float8Format<detail::float8_e5m2>::kMax;
      if (is_float8(options.dtype) && !std::isfinite(x * largest))
        detail::fail(op, ": ", name, " holds ", x, "; a ", e4m3 ? "float8_e4m3" : "float8_e5m2",
                     " cache's scale times its largest value, ", largest, ", must be a finite float32, so the scale must be at most ",
                     std::numeric_limits<float>::max() / largest);
    }
  }
  if (options.capacity == 0 && !options.grow)
    detail::fail(op, ": capacity is 0 (no limit: blocks allocated as sequences grow) and grow is false, so no token "
                 "could ever be appended; give a capacity, or let the cache grow");
  index_t block_values = 0;
  if (__builtin_mul_overflow(kv_heads, options.block_size, &block_values) ||
      __builtin_mul_overflow(block_values, head_dim, &block_values) || block_values > (index_t(1) << 40))
    detail::fail(op, ": a block of ", options.block_size, " tokens x ", kv_heads, " heads x ", head_dim, " values is too large");
  // Sizes checked before anything is allocated (found by probing: a batch of 2^62 sequences raised
  // the standard library's length_error, and a capacity of 2^62 tokens allocated blocks one by one
  // until the memory limit, minutes later, naming neither): the per-sequence tables, and a capacity's
  // blocks, all of them, against the memory attn may use.
  const BlockLayout layout(options.dtype, static_cast<std::size_t>(block_values));
  const std::size_t block_bytes = layout.counted();  // keys and values, and their scales and minima
  std::size_t table_bytes = 0;
  if (__builtin_mul_overflow(static_cast<std::size_t>(batch), sizeof(std::vector<index_t>) + sizeof(index_t), &table_bytes))
    detail::fail(op, ": batch is ", batch, "; the tables of that many sequences would not fit in a 64-bit size");
  detail::release_memory(detail::reserve_memory(table_bytes, detail::cat("the block tables of a KvCache of ", batch, " sequences").c_str()));
  const index_t per_seq = options.capacity > 0 ? (options.capacity - 1) / options.block_size + 1 : 0;
  // The capacity's blocks, and the region they are cut from (each array from a cache line: up to
  // 64 times their bytes for the smallest blocks), must fit in a 64-bit size.
  std::size_t up_front = 0, capacity_bytes = 0, region_bytes = 0;
  if (__builtin_mul_overflow(static_cast<std::size_t>(batch), static_cast<std::size_t>(per_seq), &up_front) ||
      __builtin_mul_overflow(up_front, block_bytes, &capacity_bytes) ||
      __builtin_mul_overflow(up_front, layout.span(), &region_bytes))
    detail::fail(op, ": capacity is ", options.capacity, " tokens for each of ", batch, " sequences (", per_seq,
                 " blocks of ", block_bytes, " bytes each); that many bytes do not fit in a 64-bit size");
  detail::release_memory(detail::reserve_memory(
      capacity_bytes, detail::cat("a KvCache's capacity, ", options.capacity, " tokens for each of ", batch, " sequences (",
                                  per_seq, " blocks of ", block_bytes, " bytes each) allocated up front,").c_str()));
  if (!options.rotary.empty())
    detail::check_rotary_tables(op, options.rotary.cos, options.rotary.sin, head_dim, "the cache (head_dim)");
  State& s = *s_;
  s.batch = batch, s.kv_heads = kv_heads, s.head_dim = head_dim, s.options = options;
  s.elem = element_bytes(options.dtype);
  s.up_front = up_front;
  s.table.resize(static_cast<std::size_t>(batch));
  s.lengths.assign(static_cast<std::size_t>(batch), 0);
  s.trees.resize(static_cast<std::size_t>(batch));
  if (s.kivi()) s.tails.resize(static_cast<std::size_t>(batch));
  for (index_t seq = 0; seq < batch; ++seq)  // a capacity's blocks, allocated up front
    for (index_t i = 0; i < per_seq; ++i) s.table[static_cast<std::size_t>(seq)].push_back(s.new_block());
}

KvCache::~KvCache() = default;
KvCache::KvCache(KvCache&&) noexcept = default;
KvCache& KvCache::operator=(KvCache&&) noexcept = default;

index_t KvCache::batch() const { return s_->batch; }
index_t KvCache::kv_heads() const { return s_->kv_heads; }
index_t KvCache::head_dim() const { return s_->head_dim; }
KvDtype KvCache::dtype() const { return s_->options.dtype; }
index_t KvCache::block_size() const { return s_->options.block_size; }
index_t KvCache::length(index_t seq) const {
  s_->check_seq(seq, "KvCache::length");
  return s_->lengths[static_cast<std::size_t>(seq)];
}
std::size_t KvCache::bytes() const {
  std::size_t total = 0;
  for (const Block& b : s_->blocks)
    total += b.k.size() + b.v.size() + (b.k_scales.size() + b.v_scales.size() + b.k_mins.size() + b.v_mins.size()) * sizeof(float);
  return total;
}

namespace {

// Fails unless keys and values are one sequence's tokens, (kv_heads, t, head_dim), or (batched) every
// sequence's, (batch, kv_heads, t, head_dim): the same t in both, rows contiguous, no negative stride.
// Messages name the arrays as the caller gave them.
void check_tokens(const char* op, index_t batch, index_t kv_heads, index_t head_dim, const TensorView<const float>& keys,
                  const TensorView<const float>& values, bool batched) {
  const int rank = batched ? 4 : 3, lead = batched ? 1 : 0;
  const std::string want = batched ? detail::cat("(batch, kv_heads, t, head_dim) = (", batch, ", ", kv_heads, ", t, ", head_dim,
                                                 "), or (kv_heads, t, head_dim) with seq given")
                                   : detail::cat("(kv_heads, t, head_dim) = (", kv_heads, ", t, ", head_dim, ")");
  for (const auto& [name, t] : {std::pair{"keys", keys}, std::pair{"values", values}}) {
    if (t.rank() != rank || (batched && t.dim(0) != batch) || t.dim(lead) != kv_heads || t.dim(lead + 2) != head_dim)
      detail::fail(op, ": ", name, " has shape ", t.shape_string(), "; it must be ", want);
    if (t.data() == nullptr && t.numel() > 0) detail::fail(op, ": ", name, " has shape ", t.shape_string(), " but no data");
    if (t.dim(rank - 1) > 1 && t.stride(rank - 1) != 1)
      detail::fail(op, ": ", name, " has stride ", t.stride(rank - 1), " in its last dimension; it must be 1");
    detail::check_strides(t, op, name);
  }
  if (keys.dim(lead + 1) != values.dim(lead + 1))
    detail::fail(op, ": keys has shape ", keys.shape_string(), " but values ", values.shape_string(), "; they must hold the same tokens");
}

// Sequence b's (kv_heads, t, head_dim) of a (batch, kv_heads, t, head_dim) array.
TensorView<const float> sequence_of(const TensorView<const float>& t, index_t b, const char* name) {
  return detail::step(t, b, "KvCache::append", name);
}

}  // namespace

// The checks of one sequence's append that depend on its values and its room, before anything is stored.
void KvCache::State::check_append(const char* op, index_t seq, const TensorView<const float>& keys,
                                  const TensorView<const float>& values) const {
  const index_t t = keys.dim(1), length = lengths[static_cast<std::size_t>(seq)];
  if (options.dtype == KvDtype::int8)
    for (const auto& v : {keys, values})
      for (index_t hk = 0; hk < kv_heads; ++hk)
        for (index_t r = 0; r < t; ++r)
          for (index_t c = 0; c < head_dim; ++c)
            if (!std::isfinite(v.data()[hk * v.stride(0) + r * v.stride(1) + c]))
              detail::fail(op, ": an int8 cache stores finite values only; sequence ", seq, " was given a non-finite one");
  if (is_int4(options.dtype))
    for (const auto& [v, name] : {std::pair{keys, "keys"}, std::pair{values, "values"}})
      for (index_t hk = 0; hk < kv_heads; ++hk)
        for (index_t r = 0; r < t; ++r)
          for (index_t c = 0; c < head_dim; ++c)
            if (const float x = v.data()[hk * v.stride(0) + r * v.stride(1) + c]; !(std::abs(x) <= kInt4Largest))
              detail::fail(op, ": sequence ", seq, " was given ", name, " holding ", x, "; a 4-bit cache stores finite values of ",
                           "magnitude up to 2^126 (so that a group's range, max - min, is finite)");
  if (is_float8(options.dtype)) {
    const float top = options.dtype == KvDtype::float8_e4m3 ? 448.0f : 57344.0f;
    for (const auto& [v, of_values, name] : {std::tuple{keys, false, "keys"}, std::tuple{values, true, "values"}})
      for (index_t hk = 0; hk < kv_heads; ++hk)
        for (index_t r = 0; r < t; ++r)
          for (index_t c = 0; c < head_dim; ++c) {
            const float x = v.data()[hk * v.stride(0) + r * v.stride(1) + c], scale = scale_of(of_values, hk);
            if (!(std::abs(x / scale) <= top))
              detail::fail(op, ": sequence ", seq, " was given ", name, " holding ", x, ", which over the scale ", scale, " is ",
                           x / scale, "; a ", options.dtype == KvDtype::float8_e4m3 ? "float8_e4m3" : "float8_e5m2",
                           " cache stores finite values up to ", top, " times its scale (make the scale larger)");
          }
  }
  if (const index_t rows = options.rotary.cos.dim(0); !options.rotary.empty() && t > 0 && length > rows - t)
    detail::fail(op, ": sequence ", seq, " holds ", length, " tokens, so its ", t, " new keys sit at positions ", length,
                 " to ", length + t - 1, ", but the rotary tables (cos, sin) have ", rows,
                 " rows (max_pos): every position must be less than max_pos");
}

// Before any value of an append is scanned or stored, or any block taken (found by probing: an
// append of 2^40 tokens took blocks one by one until the memory limit, and kept them; into an int8
// cache it first scanned its 2^45 values for one that is not finite): each sequence's room in a
// cache that does not grow, token counts that overflow, and the bytes of the new blocks, all of
// them, against the memory attn may use (counted, not taken).
void KvCache::State::check_room(const char* op, index_t first, index_t last, index_t t) const {
  std::size_t new_blocks = 0, new_tails = 0;  // tails: int4_kivi's bfloat16 rows, taken by a first append
  for (index_t seq = first; seq < last; ++seq) {
    new_tails += kivi() && t > 0 && tails[static_cast<std::size_t>(seq)].size() == 0;
    const index_t length = lengths[static_cast<std::size_t>(seq)];
    index_t total = 0;
    if (__builtin_add_overflow(length, t, &total))
      detail::fail(op, ": sequence ", seq, " holds ", length, " tokens; ", t, " more overflow a 64-bit count");
    if (!options.grow && total > options.capacity)
      detail::fail(op, ": sequence ", seq, " holds ", length, " of its ", options.capacity, " tokens; ", t,
                   " more do not fit (the cache was made with grow = false)");
    const std::size_t needed = blocks_for(total);
    const std::size_t held = table[static_cast<std::size_t>(seq)].size();
    if (__builtin_add_overflow(new_blocks, needed - std::min(needed, held), &new_blocks)) new_blocks = SIZE_MAX;
  }
  new_blocks -= std::min(new_blocks, free.size());
  const std::size_t block_bytes = BlockLayout(options.dtype, static_cast<std::size_t>(block_rows() * head_dim)).counted();
  const std::size_t tail_bytes = tail_values() * sizeof(std::uint16_t);
  std::size_t bytes = 0, tails_total = 0;
  if (__builtin_mul_overflow(new_blocks, block_bytes, &bytes) ||
      __builtin_mul_overflow(new_tails, tail_bytes, &tails_total) || __builtin_add_overflow(bytes, tails_total, &bytes))
    bytes = SIZE_MAX;
  detail::release_memory(detail::reserve_memory(
      bytes, detail::cat(op, ": ", new_blocks, new_blocks == 1 ? " new block of " : " new blocks of ", block_bytes,
                         " bytes",
                         new_tails > 0 ? detail::cat(" and ", new_tails,
                                                     new_tails == 1 ? " bfloat16 tail of " : " bfloat16 tails of ",
                                                     tail_bytes, " bytes")
                                       : "",
                         " for the appended tokens").c_str()));
}

// Blocks enough for `tokens` tokens of sequence seq (a freed one reused, or a new one).
void KvCache::State::hold(index_t seq, index_t tokens) {
  auto& ids = table[static_cast<std::size_t>(seq)];
  const std::size_t needed = blocks_for(tokens);
  while (ids.size() < needed) ids.push_back(new_block(needed - ids.size()));
  if (kivi() && tails[static_cast<std::size_t>(seq)].size() == 0)
    tails[static_cast<std::size_t>(seq)].resize(tail_values());
}

// Stores checked tokens after sequence seq's, in blocks it holds already (hold).
void KvCache::State::store(index_t seq, const TensorView<const float>& given_keys, const TensorView<const float>& values) {
  const index_t t = given_keys.dim(1), length = lengths[static_cast<std::size_t>(seq)];
  // With rotary tables, the keys rotated at their positions length + r (checked in check_append).
  const std::int64_t first[] = {length};
  const Tensor<float> rotated = options.rotary.empty() || t == 0 ? Tensor<float>()
                                : detail::rotated_rows(options.rotary, detail::with_batch_of_one(given_keys), first);
  const TensorView<const float> keys =
      rotated.numel() > 0 ? TensorView<const float>(rotated.data(), {kv_heads, t, head_dim}) : given_keys;
  const auto n = static_cast<std::size_t>(head_dim);
  for (index_t r = 0; r < t; ++r) {
    const float* key = keys.data() + r * keys.stride(1);
    const float* value = values.data() + r * values.stride(1);
    if (kivi()) {  // into the tail; a full group quantized into its block
      const index_t p = length + r;
      for (index_t hk = 0; hk < kv_heads; ++hk) {
        convert(std::span<const float>(key + hk * keys.stride(0), n), std::span<bfloat16>(reinterpret_cast<bfloat16*>(tail_row(seq, false, hk, p)), n));
        convert(std::span<const float>(value + hk * values.stride(0), n), std::span<bfloat16>(reinterpret_cast<bfloat16*>(tail_row(seq, true, hk, p)), n));
      }
      if (p % 32 == 31) store_group(seq, p / 32);
      continue;
    }
    const bool scales = has_group_scales(options.dtype), mins = is_int4(options.dtype);  // others have none (found by fuzzing)
    for (index_t hk = 0; hk < kv_heads; ++hk) {
      auto [block, at] = place(seq, hk, length + r);
      store_row(options.dtype, key + hk * keys.stride(0), head_dim, block->k.data() + bytes_of(at),
                scales ? block->k_scales.data() + at / 32 : nullptr, mins ? block->k_mins.data() + at / 32 : nullptr,
                scale_of(false, hk));
      store_row(options.dtype, value + hk * values.stride(0), head_dim, block->v.data() + bytes_of(at),
                scales ? block->v_scales.data() + at / 32 : nullptr, mins ? block->v_mins.data() + at / 32 : nullptr,
                scale_of(true, hk));
    }
  }
  lengths[static_cast<std::size_t>(seq)] = length + t;
  trees[static_cast<std::size_t>(seq)].reset();
}

void KvCache::State::store_group(index_t seq, index_t g) {
  const index_t first = g * 32;
  std::vector<float> rows(static_cast<std::size_t>(32 * head_dim));  // the group's 32 tokens, widened
  std::uint8_t codes[32];
  for (index_t hk = 0; hk < kv_heads; ++hk)
    for (const bool of_values : {false, true}) {
      for (index_t i = 0; i < 32; ++i)
        convert(std::span<const bfloat16>(reinterpret_cast<const bfloat16*>(tail_row(seq, of_values, hk, first + i)), static_cast<std::size_t>(head_dim)),
                std::span<float>(rows.data() + i * head_dim, static_cast<std::size_t>(head_dim)));
      if (of_values) {  // per token, as int4
        for (index_t i = 0; i < 32; ++i) {
          auto [block, at] = place(seq, hk, first + i);
          cpu::quant::q4_pack_row(rows.data() + i * head_dim, head_dim, block->v.data() + at / 2, block->v_scales.data() + at / 32,
                                  block->v_mins.data() + at / 32);
        }
        continue;
      }
      Block* block = place(seq, hk, first).first;  // the group's 32 tokens lie in one block
      for (index_t c = 0; c < head_dim; ++c) {  // per channel
        const auto group = static_cast<std::size_t>(channel_group(hk, first, c));
        cpu::quant::q4_quantize(rows.data() + c, head_dim, codes, block->k_scales[group], block->k_mins[group]);
        for (index_t i = 0; i < 32; ++i) cpu::quant::q4_set_code(block->k.data() + place(seq, hk, first + i).second / 2, c, codes[i]);
      }
    }
}

Tensor<float> KvCache::State::rotated_queries(const char* op, const TensorView<const float>& q, index_t seq) const {
  if (options.rotary.empty()) return {};
  detail::to_view4(q, op, "queries", 4, 4);  // strides checked before the copy reads them
  const index_t n = q.dim(2), rows = options.rotary.cos.dim(0);
  std::vector<std::int64_t> first;
  for (index_t b = seq < 0 ? 0 : seq; b < (seq < 0 ? batch : seq + 1); ++b) {
    const index_t L = lengths[static_cast<std::size_t>(b)];
    if (n > L)
      detail::fail(op, ": queries has ", n, " rows for sequence ", b, ", which holds ", L, " tokens; with rotary tables query i ",
                   "sits at position length - n + i, which must not be negative: append the queries' tokens first");
    if (L > rows)
      detail::fail(op, ": sequence ", b, " holds ", L, " tokens, but the rotary tables (cos, sin) have ", rows,
                   " rows (max_pos): every query position must be less than max_pos");
    first.push_back(L - n);
  }
  return detail::rotated_rows(options.rotary, q, first);
}

void KvCache::append(index_t seq, TensorView<const float> keys, TensorView<const float> values) {
  const char* op = "KvCache::append";
  State& s = *s_;
  s.check_seq(seq, op);
  check_tokens(op, s.batch, s.kv_heads, s.head_dim, keys, values, false);
  s.check_room(op, seq, seq + 1, keys.dim(1));
  s.check_append(op, seq, keys, values);
  s.hold(seq, s.lengths[static_cast<std::size_t>(seq)] + keys.dim(1));
  s.store(seq, keys, values);
}

// All or nothing: every sequence's tokens checked, and every block they need held, before any is
// stored (found by probing: a non-finite value for sequence 1 of an int8 cache raised after sequence
// 0's tokens had been appended).
void KvCache::append(TensorView<const float> keys, TensorView<const float> values) {
  const char* op = "KvCache::append";
  State& s = *s_;
  check_tokens(op, s.batch, s.kv_heads, s.head_dim, keys, values, true);
  s.check_room(op, 0, s.batch, keys.dim(2));
  for (index_t b = 0; b < s.batch; ++b) s.check_append(op, b, sequence_of(keys, b, "keys"), sequence_of(values, b, "values"));
  for (index_t b = 0; b < s.batch; ++b) s.hold(b, s.lengths[static_cast<std::size_t>(b)] + keys.dim(2));
  for (index_t b = 0; b < s.batch; ++b) s.store(b, sequence_of(keys, b, "keys"), sequence_of(values, b, "values"));
}

namespace {
// A cache's queries are its newest tokens, so its causal mask is bottom-right or none.
void check_causal(const KvAttendOptions& options, const char* op) {
  if (options.causal == Causal::top_left)
    detail::fail(op, ": causal is top_left; a cache's queries are the newest tokens of their sequence, aligned "
                 "bottom-right: causal must be bottom_right or none");
}
}  // namespace

void KvCache::State::decode_batch(TensorView<float> out, TensorView<const float> q, std::span<const index_t> seqs,
                                   const KvAttendOptions& how, const char* op) const {
  const auto G = static_cast<index_t>(seqs.size());
  const index_t n = q.dim(2);
  index_t m = 0;
  for (const index_t seq : seqs) m = std::max(m, lengths[static_cast<std::size_t>(seq)]);
  Tensor<std::int64_t> lens({G, n});
  for (index_t g = 0; g < G; ++g) {
    const index_t L = lengths[static_cast<std::size_t>(seqs[static_cast<std::size_t>(g)])];
    for (index_t i = 0; i < n; ++i)
      lens(g, i) = how.causal == Causal::bottom_right ? std::clamp<index_t>(L - n + i + 1, 0, L) : L;
  }
  const Sources rows = sources(seqs);
  Mask<float> mask;
  mask.valid_lens = lens.view(), mask.sinks = how.sinks;
  SdpaOptions sdpa;
  sdpa.scale = how.scale, sdpa.softcap = how.softcap;
  static const float never_read = 0;  // the keys' and values' shapes for the checks
  const TensorView<const float> shape(&never_read, {G, kv_heads, m, head_dim}, {0, 0, 0, 1});
  Tensor<float> scaled_q;  // float8: the keys' folded scale; int4: the queries rounded (int8's: by the decode itself)
  const SdpaOptions used = with_key_scale(q, sdpa, scaled_q);
  if (rounds_queries_here(options.dtype, true)) scaled_q = rounded_queries(q);
  detail::sdpa_decode_rows(out, {}, scaled_q.numel() > 0 ? scaled_q.view() : q, shape, shape, rows.keys, rows.values, mask, used, op);
  scale_values(out);
}

namespace {

// The parents of a draft tree of t tokens (kv_cache.hpp) checked, and each draft's depth.
std::vector<index_t> tree_depths(const TensorView<const std::int64_t>& parents, index_t t, index_t length, const char* op) {
  if (parents.rank() != 1 || parents.dim(0) != t)
    detail::fail(op, ": tree_parents has shape ", parents.shape_string(), "; it must be (t,) = (", t,
                 ",), one parent for each of the queries' ", t, " draft tokens");
  if (t > length)
    detail::fail(op, ": tree_parents names ", t, " draft tokens, but the sequence holds ", length,
                 ": the drafts are its last tokens, appended first");
  std::vector<index_t> depth(static_cast<std::size_t>(t));
  for (index_t i = 0; i < t; ++i) {
    const std::int64_t p = parents.data()[i * parents.stride(0)];
    if (p < -1 || p >= i)
      detail::fail(op, ": tree_parents[", i, "] is ", p, "; a draft's parent is -1 (the last accepted token) or an ",
                   "earlier draft, in [0, ", i, ") (a parent listed after its child, or a cycle, is refused)");
    depth[static_cast<std::size_t>(i)] = p < 0 ? 0 : depth[static_cast<std::size_t>(p)] + 1;
  }
  return depth;
}

}  // namespace

void KvCache::State::attend_tree(TensorView<float> out, TensorView<const float> q, index_t seq,
                                 const KvAttendOptions& how, const char* op) const {
  const index_t H = q.dim(1), t = q.dim(2), L = lengths[static_cast<std::size_t>(seq)], P = L - t;
  if (!options.rotary.empty())
    detail::fail(op, ": tree_parents is given to a cache with rotary tables, which rotates every key at its index in "
                 "the sequence; a draft sits at its depth in the tree: give such a cache keys and queries rotated by the "
                 "caller instead");
  const std::vector<index_t> depth = tree_depths(how.tree_parents, t, L, op);
  std::vector<index_t> parents(static_cast<std::size_t>(t));
  for (index_t i = 0; i < t; ++i) parents[static_cast<std::size_t>(i)] = how.tree_parents.data()[i * how.tree_parents.stride(0)];
  if (!how.alibi_slopes.empty() && (how.alibi_slopes.rank() != 1 || how.alibi_slopes.dim(0) != H))
    detail::fail(op, ": alibi_slopes has shape ", how.alibi_slopes.shape_string(), "; it must be (heads,) = (", H, ",)");
  // Positions: accepted token j at j, draft i at P + depth(i); the window and ALiBi measure them.
  auto position = [&](index_t j) { return j < P ? j : P + depth[static_cast<std::size_t>(j - P)]; };
  Tensor<bool> keep({1, 1, t, L});
  for (index_t i = 0; i < t; ++i) {
    for (index_t j = 0; j < L; ++j) keep(0, 0, i, j) = j < P;
    for (index_t a = i; a >= 0; a = parents[static_cast<std::size_t>(a)]) keep(0, 0, i, P + a) = true;  // ancestors, itself
    if (how.window)
      for (index_t j = 0; j < L; ++j) {
        const index_t gap = position(j) - position(P + i);  // key minus query
        if ((how.window->left >= 0 && gap < -how.window->left) || (how.window->right >= 0 && gap > how.window->right))
          keep(0, 0, i, j) = false;
      }
  }
  Tensor<float> bias;  // ALiBi by position: -slope |p(i) - p(j)|
  if (!how.alibi_slopes.empty()) {
    bias = Tensor<float>({1, H, t, L});
    for (index_t h = 0; h < H; ++h)
      for (index_t i = 0; i < t; ++i)
        for (index_t j = 0; j < L; ++j)
          bias(0, h, i, j) = -how.alibi_slopes.data()[h * how.alibi_slopes.stride(0)] *
                             static_cast<float>(std::abs(position(P + i) - position(j)));
  }
  Mask<float> mask;
  mask.keep = keep.view(), mask.sinks = how.sinks;
  if (bias.numel() > 0) mask.additive = bias.view();
  SdpaOptions sdpa;
  sdpa.scale = how.scale, sdpa.softcap = how.softcap;
  run(out, q, seq, mask, sdpa, op);
  trees[static_cast<std::size_t>(seq)] = std::move(parents);
}

void KvCache::State::run(TensorView<float> out, TensorView<const float> q, index_t seq, const Mask<float>& mask,
                         const SdpaOptions& sdpa, const char* op) const {
  const index_t L = lengths[static_cast<std::size_t>(seq)], n = q.dim(2);
  if (backend() == Backend::cpu && L <= cpu::fused::kMaxKeys) {
    const index_t one[] = {seq};
    const Sources rows = sources(one);
    // The keys' and values' shapes for the checks: (1, kv_heads, length, head_dim), never read.
    static const float never_read = 0;
    const TensorView<const float> shape(&never_read, {1, kv_heads, L, head_dim}, {0, 0, 0, 1});
    const bool decode = n <= cpu::fused::kDecodeRows;
    // int8 and int4 queries rounded where rounds_queries_here says; float8: the keys' folded k_scale in
    // the scale or the queries (and out times the values' below).
    Tensor<float> given;
    SdpaOptions how = sdpa;
    if (rounds_queries_here(options.dtype, decode)) {
      given = rounded_queries(q);
    } else {
      how = with_key_scale(q, sdpa, given);
    }
    const TensorView<const float> used = given.numel() > 0 ? given.view() : q;
    if (decode) detail::sdpa_decode_rows(out, {}, used, shape, shape, rows.keys, rows.values, mask, how, op);
    else detail::sdpa_forward_rows(out, {}, used, shape, shape, rows.keys, rows.values, mask, how, op);
    scale_values(out);
    return;
  }
  // Other backends (the reference): over the keys and values widened to float32 (float8's scales applied).
  const Tensor<float> keys = gather(seq, false), values = gather(seq, true);
  const Tensor<float> rounded = rounds_queries_here(options.dtype, false) ? rounded_queries(q) : Tensor<float>();
  sdpa_forward<float>(out, {}, {}, rounded.numel() > 0 ? rounded.view() : q, detail::with_batch_of_one(keys.view()),
                      detail::with_batch_of_one(values.view()), mask, sdpa);
}

void KvCache::attend(TensorView<float> out, index_t seq, TensorView<const float> queries,
                     const KvAttendOptions& options) const {
  attend_sequence(out, seq, queries, options, false);
}

void KvCache::attend_sequence(TensorView<float> out, index_t seq, TensorView<const float> queries,
                              const KvAttendOptions& options, bool rotated) const {
  const char* op = "KvCache::attend";
  const State& s = *s_;
  s.check_seq(seq, op);
  const bool batched = queries.rank() == 4;
  if ((queries.rank() != 3 && !batched) || (batched && queries.dim(0) != 1) || queries.dim(-1) != s.head_dim)
    detail::fail(op, ": queries has shape ", queries.shape_string(), "; it must be (heads, n, head_dim) or (1, heads, n, head_dim) with head_dim ",
                 s.head_dim);
  if (out.rank() != queries.rank() || !std::equal(out.shape().begin(), out.shape().end(), queries.shape().begin()))
    detail::fail(op, ": out has shape ", out.shape_string(), "; it must be the shape of queries ", queries.shape_string());
  // Before any row is read (the rotary and int8 copies below read the queries element by element).
  detail::check_strides(queries, op, "queries"), detail::check_strides(out, op, "out");
  const TensorView<const float> given = batched ? queries : detail::with_batch_of_one(queries);
  // With rotary tables, a copy of the queries rotated at their positions (once: the batched attend
  // hands its sequences rotated ones).
  const Tensor<float> rotated_q = rotated ? Tensor<float>() : s.rotated_queries(op, given, seq);
  const TensorView<const float> q = rotated_q.numel() > 0 ? rotated_q.view() : given;
  const TensorView<float> o = batched ? out : detail::with_batch_of_one(out);
  const index_t H = q.dim(1);
  if (H % s.kv_heads != 0)
    detail::fail(op, ": queries has shape ", queries.shape_string(), " with ", H, " heads; the cache has ", s.kv_heads,
                 " key heads, and the query heads must be a multiple of them");
  check_causal(options, op);
  if (!options.tree_parents.empty()) {
    s.attend_tree(o, q, seq, options, op);
    return;
  }
  // The queries are the sequence's newest tokens: aligned bottom-right, causal or not.
  Mask<float> mask;
  mask.causal = options.causal, mask.align = Align::bottom_right, mask.window = options.window;
  mask.alibi_slopes = options.alibi_slopes, mask.sinks = options.sinks;
  SdpaOptions sdpa;
  sdpa.scale = options.scale, sdpa.softcap = options.softcap;
  s.run(o, q, seq, mask, sdpa, op);
}

void KvCache::attend(TensorView<float> out, TensorView<const float> queries, const KvAttendOptions& options) const {
  const char* op = "KvCache::attend";
  if (queries.rank() != 4 || queries.dim(0) != s_->batch || queries.dim(3) != s_->head_dim)
    detail::fail(op, ": queries has shape ", queries.shape_string(), "; it must be (batch, heads, n, head_dim) = (", s_->batch,
                 ", heads, n, ", s_->head_dim, "), or (heads, n, head_dim) with seq given");
  if (out.rank() != 4 || !std::equal(out.shape().begin(), out.shape().end(), queries.shape().begin()))
    detail::fail(op, ": out has shape ", out.shape_string(), "; it must be the shape of queries ", queries.shape_string());
  // Layouts and memory before the tensors are cut into sequences through their batch strides (found
  // by fuzzing: a batch stride of 0 made the sequences write the same rows; an overflowing one was
  // used in pointer arithmetic).
  detail::to_view4(queries, op, "queries", 4, 4), detail::to_view4(TensorView<const float>(out), op, "out", 4, 4);
  detail::require_no_aliasing<float>(op, {{"out", out}}, {{"queries", queries}});
  const State& s = *s_;
  check_causal(options, op);
  const Tensor<float> rotated = s.rotated_queries(op, queries, -1);  // with rotary tables; else empty
  const bool rotary = !s.options.rotary.empty();
  const TensorView<const float> rq = rotary ? rotated.view() : queries;
  const index_t n = queries.dim(2);
  if (queries.dim(1) % s.kv_heads != 0)  // here, not in a sequence's attend, which would name its slice
    detail::fail(op, ": queries has shape ", queries.shape_string(), " with ", queries.dim(1), " heads; the cache has ",
                 s.kv_heads, " key heads, and the query heads must be a multiple of them");
  if (!options.tree_parents.empty())
    detail::fail(op, ": tree_parents is given; a draft tree belongs to one sequence: give it to attend with seq, or to "
                 "attend_batch (one tree per entry)");
  if (backend() == Backend::cpu && n <= cpu::fused::kDecodeRows && !options.window && options.alibi_slopes.empty()) {
    std::vector<index_t> every(static_cast<std::size_t>(s.batch));
    for (index_t b = 0; b < s.batch; ++b) every[static_cast<std::size_t>(b)] = b;
    s.decode_batch(out, rq, every, options, op);
    return;
  }
  // ALiBi slopes (heads,) for every sequence, or (batch, heads): row b for sequence b.
  const TensorView<const float>& slopes = options.alibi_slopes;
  const index_t H = queries.dim(1);
  if (!slopes.empty() && !(slopes.rank() == 1 && slopes.dim(0) == H) &&
      !(slopes.rank() == 2 && slopes.dim(0) == s.batch && slopes.dim(1) == H))
    detail::fail(op, ": alibi_slopes has shape ", slopes.shape_string(), "; it must be (heads,) = (", H,
                 ",) or (batch, heads) = (", s.batch, ",", H, ") for queries of shape ", queries.shape_string());
  for (index_t b = 0; b < s_->batch; ++b) {
    KvAttendOptions one = options;
    if (slopes.rank() == 2) one.alibi_slopes = detail::step(slopes, b, op, "alibi_slopes");
    attend_sequence(detail::step(out, b, op, "out"), b, detail::step(rq, b, op, "queries"), one, rotary);
  }
}

namespace {

// Element i of a rank-1 int32 tensor, read through its stride.
index_t entry(const TensorView<const std::int32_t>& t, index_t i) { return t.data()[i * t.stride(0)]; }

}  // namespace

void KvCache::attend_batch(TensorView<float> out, TensorView<const float> queries, TensorView<const std::int32_t> cu_seqlens_q,
                           TensorView<const std::int32_t> seqs, const KvAttendOptions& options) const {
  const char* op = "KvCache::attend_batch";
  const State& s = *s_;
  if (queries.rank() != 3 || queries.dim(2) != s.head_dim)
    detail::fail(op, ": queries has shape ", queries.shape_string(), "; it must be (total_q, heads, head_dim) with head_dim ", s.head_dim);
  if (out.rank() != 3 || !std::equal(out.shape().begin(), out.shape().end(), queries.shape().begin()))
    detail::fail(op, ": out has shape ", out.shape_string(), "; it must be the shape of queries ", queries.shape_string());
  detail::check_strides(queries, op, "queries"), detail::check_strides(out, op, "out");
  detail::require_no_aliasing<float>(op, {{"out", out}}, {{"queries", queries}});
  const index_t total_q = queries.dim(0), H = queries.dim(1);
  if (H % s.kv_heads != 0)
    detail::fail(op, ": queries has shape ", queries.shape_string(), " with ", H, " heads; the cache has ", s.kv_heads,
                 " key heads, and the query heads must be a multiple of them");
  check_causal(options, op);
  const TensorView<const std::int64_t>& trees = options.tree_parents;  // (total_q,): every entry a draft tree
  if (!trees.empty() && (trees.rank() != 1 || trees.dim(0) != total_q))
    detail::fail(op, ": tree_parents has shape ", trees.shape_string(), "; it must be (total_q,) = (", total_q,
                 ",): entry b's parents at rows cu_seqlens_q[b] to cu_seqlens_q[b + 1], in the entry's own indices");
  if (cu_seqlens_q.rank() != 1 || cu_seqlens_q.dim(0) < 1)
    detail::fail(op, ": cu_seqlens_q has shape ", cu_seqlens_q.shape_string(), "; it must be (B + 1,), B >= 0 entries");
  const index_t B = cu_seqlens_q.dim(0) - 1;
  for (const auto& [t, name] : {std::pair{cu_seqlens_q, "cu_seqlens_q"}, std::pair{seqs, "seqs"}})
    if (t.rank() > 0 && t.data() == nullptr && t.numel() > 0) detail::fail(op, ": ", name, " has shape ", t.shape_string(), " but no data");
  if (entry(cu_seqlens_q, 0) != 0 || entry(cu_seqlens_q, B) != total_q)
    detail::fail(op, ": cu_seqlens_q runs from ", entry(cu_seqlens_q, 0), " to ", entry(cu_seqlens_q, B),
                 "; it must run from 0 to total_q = ", total_q, " (queries has shape ", queries.shape_string(), ")");
  if (!seqs.empty() && (seqs.rank() != 1 || seqs.dim(0) != B))
    detail::fail(op, ": seqs has shape ", seqs.shape_string(), "; it must be (B,) = (", B, ",), one sequence per entry of cu_seqlens_q");
  if (seqs.empty() && B > s.batch)
    detail::fail(op, ": cu_seqlens_q has ", B, " entries and seqs is not given, so entry b is sequence b, but the cache holds ",
                 s.batch, " sequences");
  const TensorView<const float>& slopes = options.alibi_slopes;
  if (!slopes.empty() && !(slopes.rank() == 1 && slopes.dim(0) == H) && !(slopes.rank() == 2 && slopes.dim(0) == B && slopes.dim(1) == H))
    detail::fail(op, ": alibi_slopes has shape ", slopes.shape_string(), "; it must be (heads,) = (", H, ",) or (B, heads) = (", B,
                 ", ", H, ")");
  std::vector<index_t> seq_of(static_cast<std::size_t>(B)), first(static_cast<std::size_t>(B)), rows(static_cast<std::size_t>(B));
  std::vector<bool> taken(static_cast<std::size_t>(s.batch), false);
  for (index_t b = 0; b < B; ++b) {
    const index_t seq = seqs.empty() ? b : entry(seqs, b), lo = entry(cu_seqlens_q, b), hi = entry(cu_seqlens_q, b + 1);
    if (seq < 0 || seq >= s.batch) detail::fail(op, ": seqs[", b, "] is ", seq, "; the cache holds sequences 0 to ", s.batch - 1);
    if (taken[static_cast<std::size_t>(seq)])
      detail::fail(op, ": sequence ", seq, " is given twice in seqs; each entry's queries are its sequence's newest tokens, "
                   "so a sequence takes one entry");
    taken[static_cast<std::size_t>(seq)] = true;
    if (hi < lo) detail::fail(op, ": cu_seqlens_q[", b + 1, "] = ", hi, " is less than cu_seqlens_q[", b, "] = ", lo, "; it must not decrease");
    const index_t L = s.lengths[static_cast<std::size_t>(seq)];
    if (hi - lo > L)
      detail::fail(op, ": entry ", b, " has ", hi - lo, " queries for sequence ", seq, ", which holds ", L,
                   " tokens; the queries are the sequence's newest tokens: append them first");
    seq_of[static_cast<std::size_t>(b)] = seq, first[static_cast<std::size_t>(b)] = lo, rows[static_cast<std::size_t>(b)] = hi - lo;
    for (index_t i = 0; !trees.empty() && i < hi - lo; ++i) {  // named by packed row and entry here
      const std::int64_t p = trees.data()[(lo + i) * trees.stride(0)];
      if (p < -1 || p >= i)
        detail::fail(op, ": tree_parents[", lo + i, "] is ", p, "; it is draft ", i, " of entry ", b, " (rows ", lo, " to ",
                     hi, "), whose parent is -1 (the last accepted token) or an earlier draft of the entry, in [0, ", i,
                     ") (a parent listed after its child, or a cycle, is refused)");
    }
  }
  // Entry b's queries and out as (1, heads, n_b, head_dim) views of the packed rows.
  auto rows_of = [&](const auto& t, index_t b) {
    using V = std::remove_cvref_t<decltype(t)>;
    const index_t n = rows[static_cast<std::size_t>(b)];
    return V(t.data() + first[static_cast<std::size_t>(b)] * t.stride(0), {1, H, n, s.head_dim},
             {std::max<index_t>(1, n) * t.stride(0), t.stride(1), t.stride(0), t.stride(2)});
  };
  // With rotary tables, the queries rotated at their positions, packed as given.
  Tensor<float> rotated;
  if (!s.options.rotary.empty()) {
    rotated = Tensor<float>({total_q, H, s.head_dim});
    for (index_t b = 0; b < B; ++b) {
      if (rows[static_cast<std::size_t>(b)] == 0) continue;
      const Tensor<float> r = s.rotated_queries(op, rows_of(queries, b), seq_of[static_cast<std::size_t>(b)]);
      TensorView<float> to = rows_of(rotated.view(), b);
      for (index_t h = 0; h < H; ++h)
        for (index_t i = 0; i < rows[static_cast<std::size_t>(b)]; ++i)
          std::copy_n(&r.view()(0, h, i, 0), s.head_dim, &to(0, h, i, 0));
    }
  }
  const TensorView<const float> q = rotated.numel() > 0 ? TensorView<const float>(rotated.view()) : queries;
  // Entries of up to kDecodeRows queries (no window, no ALiBi): one decode call per query count,
  // their rows copied into (G, heads, n, head_dim) and back. The others: a call each.
  const bool decodes = backend() == Backend::cpu && !options.window && slopes.empty() && trees.empty();
  for (index_t n = 1; decodes && n <= cpu::fused::kDecodeRows; ++n) {
    std::vector<index_t> group, entries;
    for (index_t b = 0; b < B; ++b)
      if (rows[static_cast<std::size_t>(b)] == n) group.push_back(seq_of[static_cast<std::size_t>(b)]), entries.push_back(b);
    if (group.empty()) continue;
    const auto G = static_cast<index_t>(group.size());
    Tensor<float> gq({G, H, n, s.head_dim}), go({G, H, n, s.head_dim});
    for (index_t g = 0; g < G; ++g) {
      const TensorView<const float> from = rows_of(q, entries[static_cast<std::size_t>(g)]);
      for (index_t h = 0; h < H; ++h)
        for (index_t i = 0; i < n; ++i) std::copy_n(&from(0, h, i, 0), s.head_dim, &gq(g, h, i, 0));
    }
    s.decode_batch(go.view(), gq.view(), group, options, op);
    for (index_t g = 0; g < G; ++g) {
      TensorView<float> to = rows_of(out, entries[static_cast<std::size_t>(g)]);
      for (index_t h = 0; h < H; ++h)
        for (index_t i = 0; i < n; ++i) std::copy_n(&go(g, h, i, 0), s.head_dim, &to(0, h, i, 0));
    }
  }
  // Each entry's attend records its draft tree as it succeeds; a later entry's failure (its sinks,
  // softcap or scale refused, the memory limit) puts every entry's tree back as it was, so that a
  // failed call changes no tree (found by probing: commit_tree after such a call kept the drafts it
  // should have dropped).
  std::vector<std::optional<std::vector<index_t>>> trees_before;
  if (!trees.empty())
    for (index_t b = 0; b < B; ++b) trees_before.push_back(s.trees[static_cast<std::size_t>(seq_of[static_cast<std::size_t>(b)])]);
  try {
    for (index_t b = 0; b < B; ++b) {
      const index_t n = rows[static_cast<std::size_t>(b)];
      if (n == 0 && !trees.empty()) s.trees[static_cast<std::size_t>(seq_of[static_cast<std::size_t>(b)])].emplace();  // no drafts
      if (n == 0 || (decodes && n <= cpu::fused::kDecodeRows)) continue;
      KvAttendOptions one = options;
      if (slopes.rank() == 2) one.alibi_slopes = detail::step(slopes, b, op, "alibi_slopes");
      if (!trees.empty())  // entry b's drafts: its rows of tree_parents
        one.tree_parents = TensorView<const std::int64_t>(trees.data() + first[static_cast<std::size_t>(b)] * trees.stride(0), {n},
                                                          {trees.stride(0)});
      attend_sequence(rows_of(out, b), seq_of[static_cast<std::size_t>(b)], rows_of(q, b), one, true);
    }
  } catch (...) {
    for (std::size_t b = 0; b < trees_before.size(); ++b) s.trees[static_cast<std::size_t>(seq_of[b])] = std::move(trees_before[b]);
    throw;
  }
}

void KvCache::commit_tree(index_t seq, std::span<const index_t> accepted) {
  const char* op = "KvCache::commit_tree";
  State& s = *s_;
  s.check_seq(seq, op);
  const std::optional<std::vector<index_t>>& tree = s.trees[static_cast<std::size_t>(seq)];
  if (!tree)
    detail::fail(op, ": sequence ", seq, " has no draft tree: call attend with tree_parents first (an append, truncate or "
                 "reset since then forgets it)");
  const std::vector<index_t>& parents = *tree;
  const auto t = static_cast<index_t>(parents.size());
  const auto kept = static_cast<index_t>(accepted.size());
  for (index_t k = 0; k < kept; ++k) {
    const index_t a = accepted[static_cast<std::size_t>(k)];
    if (a < 0 || a >= t) detail::fail(op, ": accepted[", k, "] is ", a, "; the tree has drafts 0 to ", t - 1);
    const index_t want = k == 0 ? -1 : accepted[static_cast<std::size_t>(k - 1)];
    if (parents[static_cast<std::size_t>(a)] != want)
      detail::fail(op, ": accepted[", k, "] is draft ", a, ", whose parent is ", parents[static_cast<std::size_t>(a)],
                   ", not ", want, "; the accepted drafts must be a path from a root (parent -1), each the child of the one before");
  }
  // Draft accepted[k] moves to position P + k: accepted[k] >= k (parents come before their
  // children), so no row is overwritten before it is read.
  const index_t P = s.lengths[static_cast<std::size_t>(seq)] - t;
  if (s.kivi()) {  // keys quantized across tokens: the accepted drafts read back, then appended again
    Tensor<float> k({s.kv_heads, kept, s.head_dim}), v({s.kv_heads, kept, s.head_dim});
    for (index_t hk = 0; hk < s.kv_heads; ++hk)
      for (index_t i = 0; i < kept; ++i) {
        s.read_row(seq, false, hk, P + accepted[static_cast<std::size_t>(i)], &k(hk, i, 0));
        s.read_row(seq, true, hk, P + accepted[static_cast<std::size_t>(i)], &v(hk, i, 0));
      }
    truncate(seq, P);
    s.hold(seq, P + kept);
    s.store(seq, k.view(), v.view());
    return;
  }
  const bool scales = has_group_scales(s.options.dtype), mins = is_int4(s.options.dtype);
  const auto row_bytes = static_cast<std::size_t>(s.bytes_of(s.head_dim));
  for (index_t k = 0; k < kept; ++k) {
    const index_t from = P + accepted[static_cast<std::size_t>(k)], to = P + k;
    if (from == to) continue;
    for (index_t hk = 0; hk < s.kv_heads; ++hk) {
      auto [src, at_src] = s.place(seq, hk, from);
      auto [dst, at_dst] = s.place(seq, hk, to);
      std::memcpy(dst->k.data() + s.bytes_of(at_dst), src->k.data() + s.bytes_of(at_src), row_bytes);
      std::memcpy(dst->v.data() + s.bytes_of(at_dst), src->v.data() + s.bytes_of(at_src), row_bytes);
      if (scales) {
        std::copy_n(src->k_scales.data() + at_src / 32, s.head_dim / 32, dst->k_scales.data() + at_dst / 32);
        std::copy_n(src->v_scales.data() + at_src / 32, s.head_dim / 32, dst->v_scales.data() + at_dst / 32);
      }
      if (mins) {
        std::copy_n(src->k_mins.data() + at_src / 32, s.head_dim / 32, dst->k_mins.data() + at_dst / 32);
        std::copy_n(src->v_mins.data() + at_src / 32, s.head_dim / 32, dst->v_mins.data() + at_dst / 32);
      }
    }
  }
  truncate(seq, P + kept);  // forgets the tree
}

void KvCache::reset(index_t seq) { truncate(seq, 0); }

void KvCache::truncate(index_t seq, index_t length) {
  State& s = *s_;
  s.check_seq(seq, "KvCache::truncate");
  const index_t now = s.lengths[static_cast<std::size_t>(seq)];
  if (length < 0 || length > now)
    detail::fail("KvCache::truncate: length is ", length, "; sequence ", seq, " holds ", now, " tokens, so it must lie in [0, ", now, "]");
  if (s.kivi() && length < s.tail_from(seq))  // a full group cut: its first tokens back into the tail, as they read back
    for (index_t r = length / 32 * 32; r < length; ++r)
      for (index_t hk = 0; hk < s.kv_heads; ++hk)
        for (const bool values : {false, true}) {
          std::vector<float> row(static_cast<std::size_t>(s.head_dim));
          s.read_row(seq, values, hk, r, row.data());
          convert(std::span<const float>(row), std::span<bfloat16>(reinterpret_cast<bfloat16*>(s.tail_row(seq, values, hk, r)), row.size()));
        }
  s.lengths[static_cast<std::size_t>(seq)] = length;
  s.trees[static_cast<std::size_t>(seq)].reset();
  if (s.options.capacity > 0) return;  // blocks allocated up front stay with their sequence
  auto& blocks = s.table[static_cast<std::size_t>(seq)];
  const auto keep = static_cast<std::size_t>((length + s.options.block_size - 1) / s.options.block_size);
  while (blocks.size() > keep) s.free.push_back(blocks.back()), blocks.pop_back();
}

Tensor<float> KvCache::keys(index_t seq) const {
  s_->check_seq(seq, "KvCache::keys");
  return s_->gather(seq, false);
}
Tensor<float> KvCache::values(index_t seq) const {
  s_->check_seq(seq, "KvCache::values");
  return s_->gather(seq, true);
}

}  // namespace attn
