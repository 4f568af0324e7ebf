// FlashAttention's KV-cache calls over caller-owned caches (attn/flash.hpp): every argument checked
// first, then the new tokens written into the caches, then attention through the decode path
// (fused::KvRows over the caller's blocks, read in place) or sdpa_forward per sequence.
#include "attn/flash.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "api/checks.hpp"
#include "api/decode_rows.hpp"
#include "attn/config.hpp"
#include "attn/error.hpp"
#include "attn/rotary.hpp"
#include "attn/sdpa.hpp"

namespace attn {
namespace {

using cpu::fused::KvRows;
using cpu::fused::KvType;

template <class T>
constexpr KvType kv_type() {
  if constexpr (std::is_same_v<T, bfloat16>) return KvType::bf16;
  if constexpr (std::is_same_v<T, float16>) return KvType::f16;
  return KvType::f32;
}
template <class T>
float widen(T x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else return to_float(x);
}

// d elements widened to float32, or rounded from it (attn/half.hpp's convert: to nearest even).
template <class T>
void widen_row(const T* from, float* to, index_t d) {
  if constexpr (std::is_same_v<T, float>) std::copy_n(from, d, to);
  else convert(std::span<const T>(from, static_cast<std::size_t>(d)), std::span<float>(to, static_cast<std::size_t>(d)));
}
template <class T>
void narrow_row(const float* from, T* to, index_t d) {
  if constexpr (std::is_same_v<T, float>) std::copy_n(from, d, to);
  else convert(std::span<const float>(from, static_cast<std::size_t>(d)), std::span<T>(to, static_cast<std::size_t>(d)));
}

// A tensor argument of rank `rank` with its last dimension contiguous and strides detail::check_strides takes.
template <class T>
void require_layout(const char* op, const char* name, const TensorView<T>& t, int rank, const char* shape) {
  if (t.rank() != rank) detail::fail(op, ": ", name, " has shape ", t.shape_string(), "; it must be ", shape);
  if (t.data() == nullptr && t.numel() > 0) detail::fail(op, ": ", name, " has shape ", t.shape_string(), " but no data");
  if (t.dim(rank - 1) > 1 && t.stride(rank - 1) != 1)
    detail::fail(op, ": ", name, " has stride ", t.stride(rank - 1), " in its last dimension; it must be 1 (contiguous)");
  detail::check_strides(t, op, name);
}
// An int32 vector argument (n,) read as a contiguous or strided vector; empty when not given.
std::vector<index_t> read_ints(const char* op, const char* name, const TensorView<const std::int32_t>& t, index_t n) {
  if (t.empty()) return {};
  if (t.rank() != 1 || t.dim(0) != n) detail::fail(op, ": ", name, " has shape ", t.shape_string(), "; it must be (", n, ",)");
  std::vector<index_t> v(static_cast<std::size_t>(n));
  for (index_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = t(i);
  return v;
}

void check_attend(const char* op, const FlashAttendOptions& o, index_t B, index_t H, index_t d) {
  const auto& a = o.alibi_slopes;
  if (!a.empty() && !(a.rank() == 1 && a.dim(0) == H) && !(a.rank() == 2 && a.dim(0) == B && a.dim(1) == H))
    detail::fail(op, ": alibi_slopes has shape ", a.shape_string(), "; it must be (nheads,) = (", H, ",) or (batch, nheads) = (", B,
                 ", ", H, ")");
  // Their values too, here: the attention's own checks come after the append has written the cache.
  if (!a.empty()) {
    detail::check_strides(a, op, "alibi_slopes");
    if (a.data() == nullptr && a.numel() > 0) detail::fail(op, ": alibi_slopes has no data");
    for (index_t e = 0; e < a.numel(); ++e) {
      const float slope = a.rank() == 1 ? a(e) : a(e / H, e % H);
      if (!std::isfinite(slope)) detail::fail(op, ": alibi_slopes holds ", slope, "; every slope must be finite");
    }
  }
  const auto& s = o.sinks;
  if (!s.empty()) {
    if (s.rank() != 1 || s.dim(0) != H) detail::fail(op, ": sinks has shape ", s.shape_string(), "; it must be (nheads,) = (", H, ",)");
    for (index_t h = 0; h < H; ++h)
      if (!std::isfinite(s(h))) detail::fail(op, ": sinks[", h, "] is ", s(h), "; sinks must be finite");
  }
  if (o.softcap != 0 && !detail::softcap_fits<float>(o.softcap))
    detail::fail(op, ": softcap is ", o.softcap, "; it must be 0 (off) or positive and finite in float32, and so must its "
                 "inverse");
  if (o.softmax_scale) {
    const double sc = *o.softmax_scale;
    if (!std::isfinite(sc) || !std::isfinite(static_cast<float>(sc)))
      detail::fail(op, ": softmax_scale is ", sc, "; it must be finite in float32");
  } else if (d == 0) {
    detail::fail(op, ": headdim is 0; the default softmax_scale 1/sqrt(headdim) needs headdim >= 1");
  }
}

std::optional<Window> window_of(const FlashAttendOptions& o) {
  if (o.window.left < 0 && o.window.right < 0) return std::nullopt;
  return o.window;
}

// The mask of sequence b (batch row b of the slopes) for a per-sequence call, queries bottom-right.
Mask<float> sequence_mask(const FlashAttendOptions& o, index_t b, const char* op) {
  Mask<float> mask;
  mask.causal = o.causal ? Causal::bottom_right : Causal::none;
  mask.align = Align::bottom_right;
  mask.window = window_of(o);
  const auto& a = o.alibi_slopes;
  if (a.rank() == 1) mask.alibi_slopes = a;
  if (a.rank() == 2) mask.alibi_slopes = detail::step(a, b, op, "alibi_slopes");
  mask.sinks = o.sinks;
  return mask;
}

SdpaOptions sdpa_options(const FlashAttendOptions& o) {
  SdpaOptions s;
  s.scale = o.softmax_scale;
  if (o.softcap > 0) s.softcap = o.softcap;
  return s;
}

// The keys and values of G sequences as the decode path reads them: sequence g's key j in block
// k_blocks[g * per_seq + j / block_size] (sH, sR as KvRows), m[g] keys.
struct Sequences {
  std::vector<const void*> k_blocks, v_blocks;
  std::vector<index_t> m;
  index_t per_seq = 1;
  KvRows k, v;  // blocks left null; rows() points them at the tables
  std::vector<index_t> batch;  // the caller's batch index of sequence g (for its ALiBi row)

  std::pair<KvRows, KvRows> rows(index_t g) const {
    KvRows a = k, b = v;
    a.blocks = k_blocks.data() + g * per_seq, b.blocks = v_blocks.data() + g * per_seq;
    a.table_stride = b.table_stride = per_seq;
    return {a, b};
  }
};

// out (G, H, n, d) and lse (G, H, n) (or empty), float32, from float queries q (G, H, n, d) over the
// sequences: one decode call for all of them when nothing but their lengths, the causal rule, a
// window's right bound (FlashAttention turns causal into window_size (-1, 0)) and sinks masks them
// (per-query valid lengths), else one per sequence.
void decode(TensorView<float> out, TensorView<float> lse, TensorView<const float> q, const Sequences& s, index_t Hk,
            const FlashAttendOptions& o, const char* op) {
  const index_t G = q.dim(0), n = q.dim(2), d = q.dim(3);
  if (G == 0) return;
  static const float never_read = 0;
  const SdpaOptions sdpa = sdpa_options(o);
  if (o.window.left < 0 && o.alibi_slopes.empty()) {
    const index_t m = *std::max_element(s.m.begin(), s.m.end());
    Tensor<std::int64_t> lens({G, n});
    for (index_t g = 0; g < G; ++g)
      for (index_t i = 0; i < n; ++i) {
        const index_t L = s.m[static_cast<std::size_t>(g)], p = L - n + i;  // the query's position
        index_t end = L;
        if (o.causal) end = std::min(end, p + 1);
        if (o.window.right >= 0) end = std::min(end, p + o.window.right + 1);
        lens(g, i) = std::clamp<index_t>(end, 0, L);
      }
    Mask<float> mask;
    mask.valid_lens = lens.view(), mask.sinks = o.sinks;
    const auto [k, v] = s.rows(0);
    const TensorView<const float> shape(&never_read, {G, Hk, m, d}, {0, 0, 0, 1});
    detail::sdpa_decode_rows(out, lse, q, shape, shape, k, v, mask, sdpa, op);
    return;
  }
  for (index_t g = 0; g < G; ++g) {
    auto [k, v] = s.rows(g);
    k.table_stride = v.table_stride = 0;
    const TensorView<const float> shape(&never_read, {1, Hk, s.m[static_cast<std::size_t>(g)], d}, {0, 0, 0, 1});
    // Group g's rows as a batch of one.
    const TensorView<const float> qg = detail::with_batch_of_one(detail::step(q, g, op, "q"));
    const TensorView<float> og = detail::with_batch_of_one(detail::step(out, g, op, "out"));
    const TensorView<float> lg =
        lse.empty() ? TensorView<float>() : detail::with_batch_of_one(detail::step(lse, g, op, "lse"));
    detail::sdpa_decode_rows(og, lg, qg, shape, shape, k, v, sequence_mask(o, s.batch[static_cast<std::size_t>(g)], op), sdpa, op);
  }
}

// Sequence g's keys or values gathered into (1, Hk, m, d) scratch of T (a paged cache's prompt path).
template <class T>
TensorView<const T> gather(std::vector<T>& buffer, const KvRows& rows, index_t Hk, index_t m, index_t d) {
  buffer.resize(static_cast<std::size_t>(Hk * m * d));
  for (index_t hk = 0; hk < Hk; ++hk)
    for (index_t j = 0; j < m; ++j) std::copy_n(rows.row<T>(0, hk, j), d, buffer.data() + (hk * m + j) * d);
  return TensorView<const T>(buffer.data(), {1, Hk, m, d});
}

// One sequence's prompt: sdpa_forward over (1, H, n, d) queries and (1, Hk, m, d) keys and values.
template <class T>
void prompt(TensorView<T> out, TensorView<float> lse, TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
            const Mask<float>& mask, const SdpaOptions& sdpa) {
  if constexpr (std::is_same_v<T, float>)
    sdpa_forward<float>(out, lse, {}, q, k, v, mask, sdpa);
  else
    sdpa_forward<T>(out, lse, q, k, v, mask, sdpa);
}

// Block `id` of a paged cache's block table, checked.
index_t block_of(const char* op, const TensorView<const std::int32_t>& table, index_t b, index_t i, index_t num_blocks) {
  const index_t id = table(b, i);
  if (id < 0 || id >= num_blocks)
    detail::fail(op, ": block_table[", b, ", ", i, "] is ", id, "; sequence ", b, " uses that entry and k_cache has ", num_blocks,
                 " blocks, so it must lie in [0, ", num_blocks, ")");
  return id;
}

// x (B, t, heads, d), contiguous, rotated in place (attn::apply_rotary) at positions offsets[b] + i:
// the rows [lo, hi) of the tables that those positions use, widened to float32 for 16-bit T.
template <class T>
void rotate(std::vector<T>& x, index_t B, index_t t, index_t heads, index_t d, const TensorView<const T>& cos,
            const TensorView<const T>& sin, const std::vector<index_t>& offsets, index_t span, bool interleaved) {
  if (B == 0 || t == 0) return;
  const index_t lo = *std::min_element(offsets.begin(), offsets.end());
  const index_t hi = *std::max_element(offsets.begin(), offsets.end()) + span, half = cos.dim(1);
  Tensor<RotaryTable<T>> c({hi - lo, half}), s({hi - lo, half});
  for (index_t r = lo; r < hi; ++r)
    for (index_t k = 0; k < half; ++k) c(r - lo, k) = widen(cos(r, k)), s(r - lo, k) = widen(sin(r, k));
  Tensor<std::int64_t> at({B});
  for (index_t b = 0; b < B; ++b) at(b) = offsets[static_cast<std::size_t>(b)] - lo;
  RotaryPositions positions;
  positions.offsets = TensorView<const std::int64_t>(at.view());
  const TensorView<T> v(x.data(), {B, t, heads, d});
  apply_rotary<T>(v, TensorView<const T>(v), TensorView<const RotaryTable<T>>(c.view()), TensorView<const RotaryTable<T>>(s.view()),
                  positions, {.interleaved = interleaved});
}

// t (B, s, heads, d) copied into contiguous memory.
template <class T>
std::vector<T> dense(const TensorView<const T>& t) {
  std::vector<T> r;
  r.reserve(static_cast<std::size_t>(t.numel()));
  for (index_t b = 0; b < t.dim(0); ++b)
    for (index_t i = 0; i < t.dim(1); ++i)
      for (index_t h = 0; h < t.dim(2); ++h) r.insert(r.end(), &t(b, i, h, 0), &t(b, i, h, 0) + t.dim(3));
  return r;
}

}  // namespace

template <class T>
void flash_attn_with_kvcache(TensorView<T> out, TensorView<float> lse, TensorView<const T> q, const FlashKvCacheParams<T>& p) {
  const char* op = "flash_attn_with_kvcache";
  require_layout(op, "q", q, 4, "(batch, seqlen_q, nheads, headdim)");
  const index_t B = q.dim(0), n = q.dim(1), H = q.dim(2), d = q.dim(3);
  require_layout(op, "out", TensorView<const T>(out), 4, "the shape of q");
  if (!std::equal(out.shape().begin(), out.shape().end(), q.shape().begin()))
    detail::fail(op, ": out has shape ", out.shape_string(), "; it must be the shape of q ", q.shape_string());
  if (!lse.empty() && (lse.rank() != 3 || lse.dim(0) != B || lse.dim(1) != H || lse.dim(2) != n))
    detail::fail(op, ": softmax_lse has shape ", lse.shape_string(), "; it must be (batch, nheads, seqlen_q) = (", B, ", ", H, ", ", n, ")");
  const bool paged = !p.block_table.empty();
  const char* cache_shape = paged ? "(num_blocks, page_block_size, nheads_k, headdim)" : "(batch_size_cache, seqlen_cache, nheads_k, headdim)";
  require_layout(op, "k_cache", TensorView<const T>(p.k_cache), 4, cache_shape);
  require_layout(op, "v_cache", TensorView<const T>(p.v_cache), 4, cache_shape);
  const TensorView<T>& kc = p.k_cache;
  if (!std::equal(kc.shape().begin(), kc.shape().end(), p.v_cache.shape().begin()))
    detail::fail(op, ": k_cache has shape ", kc.shape_string(), " but v_cache ", p.v_cache.shape_string(), "; they must match");
  const index_t Hk = kc.dim(2), rows = kc.dim(1);
  if (kc.dim(3) != d) detail::fail(op, ": k_cache has shape ", kc.shape_string(), " but q ", q.shape_string(), "; their headdim must match");
  if (Hk == 0 || H % Hk != 0)
    detail::fail(op, ": q has shape ", q.shape_string(), " with ", H, " heads and k_cache ", kc.shape_string(), " with ", Hk,
                 "; nheads must be a multiple of nheads_k");
  index_t max_blocks = 1, capacity = rows;
  if (paged) {
    require_layout(op, "block_table", p.block_table, 2, "(batch, max_blocks_per_seq)");
    if (p.block_table.dim(0) != B)
      detail::fail(op, ": block_table has shape ", p.block_table.shape_string(), "; it must be (batch, max_blocks_per_seq) with batch ", B);
    max_blocks = p.block_table.dim(1), capacity = max_blocks * rows;
    if (!p.cache_batch_idx.empty()) detail::fail(op, ": cache_batch_idx is given with a block_table; a paged cache does not take it");
    if (!p.cache_leftpad.empty()) detail::fail(op, ": cache_leftpad is given with a block_table; a paged cache does not take it");
  }
  // New tokens.
  const bool append = !p.k_new.empty() || !p.v_new.empty();
  index_t s = 0;
  if (append) {
    if (p.k_new.empty() || p.v_new.empty()) detail::fail(op, ": k and v must be given together (", p.k_new.empty() ? "k" : "v", " is missing)");
    for (const auto& [name, t] : {std::pair{"k", p.k_new}, std::pair{"v", p.v_new}}) {
      require_layout(op, name, t, 4, "(batch, seqlen_new, nheads_k, headdim)");
      if (t.dim(0) != B || t.dim(2) != Hk || t.dim(3) != d)
        detail::fail(op, ": ", name, " has shape ", t.shape_string(), "; it must be (batch, seqlen_new, nheads_k, headdim) = (", B,
                     ", seqlen_new, ", Hk, ", ", d, ")");
    }
    if (p.k_new.dim(1) != p.v_new.dim(1))
      detail::fail(op, ": k has shape ", p.k_new.shape_string(), " but v ", p.v_new.shape_string(), "; they must match");
    s = p.k_new.dim(1);
    if (p.cache_seqlens.empty()) detail::fail(op, ": k and v are given without cache_seqlens; appending needs the sequences' lengths");
  }
  const std::vector<index_t> seqlens = read_ints(op, "cache_seqlens", p.cache_seqlens, B);
  const std::vector<index_t> batch_idx = read_ints(op, "cache_batch_idx", p.cache_batch_idx, B);
  const std::vector<index_t> leftpad = read_ints(op, "cache_leftpad", p.cache_leftpad, B);
  std::vector<index_t> L(static_cast<std::size_t>(B)), row(static_cast<std::size_t>(B)), pad(static_cast<std::size_t>(B), 0);
  if (!paged && batch_idx.empty() && B > kc.dim(0))
    detail::fail(op, ": q has batch ", B, " but k_cache has shape ", kc.shape_string(), "; without cache_batch_idx it needs a row per sequence");
  std::vector<char> taken(paged ? 0 : static_cast<std::size_t>(kc.dim(0)), 0);
  for (index_t b = 0; b < B; ++b) {
    const auto u = static_cast<std::size_t>(b);
    const index_t held = seqlens.empty() ? capacity : seqlens[u];
    if (held < 0) detail::fail(op, ": cache_seqlens[", b, "] is ", held, "; it must be at least 0");
    L[u] = held + s;
    if (L[u] > capacity)
      detail::fail(op, ": cache_seqlens[", b, "] is ", held, " and ", s, " new tokens are appended, ", L[u], " in all; the cache holds ",
                   capacity, " per sequence (", paged ? detail::cat(max_blocks, " blocks of ", rows, " in block_table") : detail::cat("k_cache ", kc.shape_string()), ")");
    if (!batch_idx.empty()) {
      row[u] = batch_idx[u];
      if (row[u] < 0 || row[u] >= kc.dim(0))
        detail::fail(op, ": cache_batch_idx[", b, "] is ", row[u], "; k_cache has shape ", kc.shape_string(), ", so it must lie in [0, ", kc.dim(0), ")");
      if (append && taken[static_cast<std::size_t>(row[u])]++)
        detail::fail(op, ": cache_batch_idx[", b, "] is ", row[u], ", which an earlier sequence also names; the rows new tokens are written to must be distinct");
    } else {
      row[u] = b;
    }
    if (!leftpad.empty()) {
      pad[u] = leftpad[u];
      if (pad[u] < 0 || pad[u] > held)
        detail::fail(op, ": cache_leftpad[", b, "] is ", pad[u], " but sequence ", b, " holds ", held, " tokens (cache_seqlens); it must lie in [0, ", held, "]");
    }
  }
  // The block table: entries of live positions in range; no block the append writes held twice.
  const index_t num_blocks = kc.dim(0);
  if (paged && rows == 0) detail::fail(op, ": k_cache has shape ", kc.shape_string(), "; a page must hold at least one token");
  if (paged) {
    std::vector<int> users(static_cast<std::size_t>(num_blocks), 0);
    for (index_t b = 0; b < B; ++b)
      for (index_t i = 0; i * rows < L[static_cast<std::size_t>(b)]; ++i) ++users[static_cast<std::size_t>(block_of(op, p.block_table, b, i, num_blocks))];
    for (index_t b = 0; b < B && s > 0; ++b) {
      const index_t from = seqlens[static_cast<std::size_t>(b)], to = L[static_cast<std::size_t>(b)];
      for (index_t i = from / rows; i * rows < to; ++i) {
        const index_t id = p.block_table(b, i);
        if (users[static_cast<std::size_t>(id)] > 1)
          detail::fail(op, ": block_table[", b, ", ", i, "] is block ", id, ", which the new tokens of sequence ", b,
                       " are written to, and another live entry of block_table holds it too; a block written must belong to one sequence");
      }
    }
  }
  // Rotary tables.
  const bool rotary = !p.rotary_cos.empty() || !p.rotary_sin.empty();
  index_t half = 0;
  const bool q_at_steps = p.attend.causal || window_of(p.attend).has_value();
  if (rotary) {
    if (p.rotary_cos.empty() || p.rotary_sin.empty()) detail::fail(op, ": rotary_cos and rotary_sin must be given together");
    if (!append) detail::fail(op, ": rotary_cos and rotary_sin are given without k and v; rotary embedding applies to appended tokens");
    for (const auto& [name, t] : {std::pair{"rotary_cos", p.rotary_cos}, std::pair{"rotary_sin", p.rotary_sin}})
      if (t.rank() != 2) detail::fail(op, ": ", name, " has shape ", t.shape_string(), "; it must be (seqlen_ro, rotary_dim / 2)");
    if (!std::equal(p.rotary_cos.shape().begin(), p.rotary_cos.shape().end(), p.rotary_sin.shape().begin()))
      detail::fail(op, ": rotary_cos has shape ", p.rotary_cos.shape_string(), " but rotary_sin ", p.rotary_sin.shape_string(), "; they must match");
    half = p.rotary_cos.dim(1);
    if (2 * half > d)
      detail::fail(op, ": rotary_cos has shape ", p.rotary_cos.shape_string(), ", rotary_dim ", 2 * half, "; it must be at most headdim ", d);
    index_t need = 0;
    for (index_t b = 0; b < B; ++b) {
      const index_t at = seqlens[static_cast<std::size_t>(b)];
      need = std::max({need, at + s, at + (q_at_steps ? n : 1)});
    }
    if (p.rotary_cos.dim(0) < need)
      detail::fail(op, ": rotary_cos has shape ", p.rotary_cos.shape_string(), "; the positions rotated reach ", need - 1,
                   ", so it needs at least ", need, " rows");
  }
  check_attend(op, p.attend, B, H, d);
  detail::require_no_aliasing<T>(op, {{"out", out}, {"k_cache", p.k_cache}, {"v_cache", p.v_cache}},
                                 {{"q", q}, {"k", p.k_new}, {"v", p.v_new}, {"rotary_cos", p.rotary_cos}, {"rotary_sin", p.rotary_sin}});

  // ---- 1. rotary: the new keys and the queries rotated into scratch (rounded to T) -------------
  std::vector<T> k_rotated, q_rotated;
  TensorView<const T> kn = p.k_new, qs = q;  // (B, s, Hk, d), (B, n, H, d)
  if (rotary && half > 0) {
    k_rotated = dense(p.k_new), q_rotated = dense(q);
    rotate(k_rotated, B, s, Hk, d, p.rotary_cos, p.rotary_sin, seqlens, s, p.rotary_interleaved);
    // Queries at cache_seqlens[b] + i when causal or windowed, else all at cache_seqlens[b] (one
    // token of n * H heads).
    if (q_at_steps)
      rotate(q_rotated, B, n, H, d, p.rotary_cos, p.rotary_sin, seqlens, n, p.rotary_interleaved);
    else
      rotate(q_rotated, B, 1, n * H, d, p.rotary_cos, p.rotary_sin, seqlens, 1, p.rotary_interleaved);
    kn = TensorView<const T>(k_rotated.data(), {B, s, Hk, d}), qs = TensorView<const T>(q_rotated.data(), {B, n, H, d});
  }

  // ---- 2. the new tokens written into the caches ----------------------------------------------
  auto slot = [&](const TensorView<T>& cache, index_t b, index_t pos, index_t hk) -> T* {
    if (paged) return cache.data() + p.block_table(b, pos / rows) * cache.stride(0) + pos % rows * cache.stride(1) + hk * cache.stride(2);
    return cache.data() + row[static_cast<std::size_t>(b)] * cache.stride(0) + pos * cache.stride(1) + hk * cache.stride(2);
  };
  for (index_t b = 0; b < B; ++b)
    for (index_t t = 0; t < s; ++t)
      for (index_t hk = 0; hk < Hk; ++hk) {
        const index_t pos = seqlens[static_cast<std::size_t>(b)] + t;
        std::copy_n(&kn(b, t, hk, 0), d, slot(p.k_cache, b, pos, hk));
        std::copy_n(&p.v_new(b, t, hk, 0), d, slot(p.v_cache, b, pos, hk));
      }

  // ---- 3. attention ---------------------------------------------------------------------------
  // Each sequence's keys as block pointers: a paged cache's pages, or a contiguous cache's row from
  // leftpad on as one block.
  Sequences seq;
  seq.per_seq = paged ? max_blocks : 1;
  seq.k.type = seq.v.type = kv_type<T>();
  seq.k.sH = kc.stride(2), seq.k.sR = kc.stride(1), seq.v.sH = p.v_cache.stride(2), seq.v.sR = p.v_cache.stride(1);
  seq.k.block_size = seq.v.block_size = paged ? rows : std::max<index_t>(1, rows);
  seq.k_blocks.assign(static_cast<std::size_t>(B * seq.per_seq), nullptr), seq.v_blocks = seq.k_blocks;
  for (index_t b = 0; b < B; ++b) {
    const auto u = static_cast<std::size_t>(b);
    seq.m.push_back(L[u] - pad[u]);
    seq.batch.push_back(b);
    if (paged) {
      for (index_t i = 0; i * rows < L[u]; ++i) {
        const index_t id = p.block_table(b, i);
        seq.k_blocks[u * seq.per_seq + i] = kc.data() + id * kc.stride(0);
        seq.v_blocks[u * seq.per_seq + i] = p.v_cache.data() + id * p.v_cache.stride(0);
      }
    } else {
      seq.k_blocks[u] = kc.data() + row[u] * kc.stride(0) + pad[u] * kc.stride(1);
      seq.v_blocks[u] = p.v_cache.data() + row[u] * p.v_cache.stride(0) + pad[u] * p.v_cache.stride(1);
    }
  }
  if (backend() == Backend::cpu && n <= cpu::fused::kDecodeRows) {
    // Queries widened to (B, H, n, d) float; out computed in float and rounded into the caller's.
    std::vector<float> qf(static_cast<std::size_t>(B * H * n * d)), of(qf.size());
    for (index_t b = 0; b < B; ++b)
      for (index_t h = 0; h < H; ++h)
        for (index_t i = 0; i < n; ++i) widen_row(&qs(b, i, h, 0), qf.data() + ((b * H + h) * n + i) * d, d);
    decode(TensorView<float>(of.data(), {B, H, n, d}), lse, TensorView<const float>(qf.data(), {B, H, n, d}), seq, Hk, p.attend, op);
    for (index_t b = 0; b < B; ++b)
      for (index_t h = 0; h < H; ++h)
        for (index_t i = 0; i < n; ++i) narrow_row(of.data() + ((b * H + h) * n + i) * d, &out(b, i, h, 0), d);
    return;
  }
  std::vector<T> kbuf, vbuf;
  const SdpaOptions sdpa = sdpa_options(p.attend);
  for (index_t b = 0; b < B; ++b) {
    const auto u = static_cast<std::size_t>(b);
    const index_t m = seq.m[u];
    TensorView<const T> k, v;
    if (paged) {
      const auto [kr, vr] = seq.rows(b);
      k = gather(kbuf, kr, Hk, m, d), v = gather(vbuf, vr, Hk, m, d);
    } else {
      k = TensorView<const T>(static_cast<const T*>(seq.k_blocks[u]), {1, Hk, m, d}, {0, kc.stride(2), kc.stride(1), 1});
      v = TensorView<const T>(static_cast<const T*>(seq.v_blocks[u]), {1, Hk, m, d}, {0, p.v_cache.stride(2), p.v_cache.stride(1), 1});
    }
    const TensorView<const T> qb(&qs(b, 0, 0, 0), {1, H, n, d}, {0, qs.stride(2), qs.stride(1), 1});
    const TensorView<T> ob(&out(b, 0, 0, 0), {1, H, n, d}, {0, out.stride(2), out.stride(1), 1});
    const TensorView<float> lb = lse.empty() ? TensorView<float>() : TensorView<float>(&lse(b, 0, 0), {1, H, n}, {0, lse.stride(1), lse.stride(2)});
    prompt<T>(ob, lb, qb, k, v, sequence_mask(p.attend, b, op), sdpa);
  }
}

template <class T>
void flash_attn_varlen_paged(TensorView<T> out, TensorView<float> lse, TensorView<const T> q, const FlashPagedVarlenParams<T>& p) {
  const char* op = "flash_attn_varlen_func";
  require_layout(op, "q", q, 3, "(total_q, nheads, headdim)");
  const index_t total = q.dim(0), H = q.dim(1), d = q.dim(2);
  // The caches before out, which the caller shapes from them (found by probing: a v of another
  // headdim than k was reported as an out of the wrong shape, an argument the caller never passed).
  const char* cache_shape = "(num_blocks, page_block_size, nheads_k, headdim)";
  require_layout(op, "k", p.k_cache, 4, cache_shape);
  require_layout(op, "v", p.v_cache, 4, cache_shape);
  const TensorView<const T>& kc = p.k_cache;
  if (!std::equal(kc.shape().begin(), kc.shape().end(), p.v_cache.shape().begin()))
    detail::fail(op, ": k has shape ", kc.shape_string(), " but v ", p.v_cache.shape_string(), "; they must match");
  const index_t num_blocks = kc.dim(0), rows = kc.dim(1), Hk = kc.dim(2);
  if (kc.dim(3) != d) detail::fail(op, ": k has shape ", kc.shape_string(), " but q ", q.shape_string(), "; their headdim must match");
  require_layout(op, "out", TensorView<const T>(out), 3, "the shape of q");
  if (!std::equal(out.shape().begin(), out.shape().end(), q.shape().begin()))
    detail::fail(op, ": out has shape ", out.shape_string(), "; it must be the shape of q ", q.shape_string());
  if (!lse.empty() && (lse.rank() != 2 || lse.dim(0) != H || lse.dim(1) != total))
    detail::fail(op, ": softmax_lse has shape ", lse.shape_string(), "; it must be (nheads, total_q) = (", H, ", ", total, ")");
  if (Hk == 0 || H % Hk != 0)
    detail::fail(op, ": q has shape ", q.shape_string(), " with ", H, " heads and k ", kc.shape_string(), " with ", Hk,
                 "; nheads must be a multiple of nheads_k");
  if (rows == 0) detail::fail(op, ": k has shape ", kc.shape_string(), "; a page must hold at least one token");
  require_layout(op, "block_table", p.block_table, 2, "(batch, max_blocks_per_seq)");
  const index_t B = p.block_table.dim(0), max_blocks = p.block_table.dim(1);
  if (p.cu_seqlens_q.rank() == 1 && p.cu_seqlens_q.dim(0) >= 1 && p.cu_seqlens_q.dim(0) != B + 1)
    detail::fail(op, ": block_table has shape ", p.block_table.shape_string(), ", a row for each of ", B,
                 " sequences, but cu_seqlens_q has shape ", p.cu_seqlens_q.shape_string(), ": ", p.cu_seqlens_q.dim(0) - 1,
                 " sequences; block_table needs a row per sequence");
  const std::vector<index_t> cq = read_ints(op, "cu_seqlens_q", p.cu_seqlens_q, B + 1);
  const std::vector<index_t> ck = read_ints(op, "cu_seqlens_k", p.cu_seqlens_k, B + 1);
  const std::vector<index_t> used = read_ints(op, "seqused_k", p.seqused_k, B);
  if (cq.empty()) detail::fail(op, ": cu_seqlens_q is required (batch + 1 = ", B + 1, " offsets)");
  if (ck.empty() && used.empty()) detail::fail(op, ": cu_seqlens_k or seqused_k is required to give the key lengths");
  for (const auto& [name, c, last] : {std::tuple{"cu_seqlens_q", &cq, total}, std::tuple{"cu_seqlens_k", &ck, index_t(-1)}}) {
    if (c->empty()) continue;
    if ((*c)[0] != 0) detail::fail(op, ": ", name, "[0] is ", (*c)[0], "; it must be 0");
    for (index_t b = 0; b < B; ++b)
      if ((*c)[static_cast<std::size_t>(b + 1)] < (*c)[static_cast<std::size_t>(b)])
        detail::fail(op, ": ", name, "[", b + 1, "] is ", (*c)[static_cast<std::size_t>(b + 1)], " and ", name, "[", b, "] ",
                     (*c)[static_cast<std::size_t>(b)], "; the offsets must not decrease");
    if (last >= 0 && c->back() != last)
      detail::fail(op, ": ", name, "[", B, "] is ", c->back(), "; it must be total_q = ", last, " (q has shape ", q.shape_string(), ")");
  }
  std::vector<index_t> m(static_cast<std::size_t>(B));
  for (index_t b = 0; b < B; ++b) {
    const auto u = static_cast<std::size_t>(b);
    m[u] = used.empty() ? ck[u + 1] - ck[u] : used[u];
    if (m[u] < 0) detail::fail(op, ": seqused_k[", b, "] is ", m[u], "; it must be at least 0");
    if (m[u] > max_blocks * rows)
      detail::fail(op, ": sequence ", b, " has ", m[u], " keys; its ", max_blocks, " entries of block_table hold ", max_blocks * rows);
    for (index_t i = 0; i * rows < m[u]; ++i) block_of(op, p.block_table, b, i, num_blocks);
  }
  check_attend(op, p.attend, B, H, d);
  detail::require_no_aliasing<T>(op, {{"out", out}}, {{"q", q}, {"k", p.k_cache}, {"v", p.v_cache}});

  // Every sequence's pages.
  Sequences all;
  all.per_seq = max_blocks;
  all.k.type = all.v.type = kv_type<T>();
  all.k.sH = kc.stride(2), all.k.sR = kc.stride(1), all.v.sH = p.v_cache.stride(2), all.v.sR = p.v_cache.stride(1);
  all.k.block_size = all.v.block_size = rows;
  const bool decodes = backend() == Backend::cpu;
  // Decode-length sequences grouped by their number of queries, one decode call per group.
  for (index_t n = 1; decodes && n <= cpu::fused::kDecodeRows; ++n) {
    Sequences g = all;
    for (index_t b = 0; b < B; ++b) {
      const auto u = static_cast<std::size_t>(b);
      if (cq[u + 1] - cq[u] != n) continue;
      g.m.push_back(m[u]), g.batch.push_back(b);
      for (index_t i = 0; i < max_blocks; ++i) {
        const bool live = i * rows < m[u];
        g.k_blocks.push_back(live ? kc.data() + p.block_table(b, i) * kc.stride(0) : nullptr);
        g.v_blocks.push_back(live ? p.v_cache.data() + p.block_table(b, i) * p.v_cache.stride(0) : nullptr);
      }
    }
    const index_t G = static_cast<index_t>(g.m.size());
    if (G == 0) continue;
    // The group's queries widened to (G, H, n, d) float; out and lse scattered back to their rows.
    std::vector<float> qf(static_cast<std::size_t>(G * H * n * d)), of(qf.size()), lf(static_cast<std::size_t>(G * H * n));
    for (index_t j = 0; j < G; ++j) {
      const index_t r0 = cq[static_cast<std::size_t>(g.batch[static_cast<std::size_t>(j)])];
      for (index_t h = 0; h < H; ++h)
        for (index_t i = 0; i < n; ++i) widen_row(&q(r0 + i, h, 0), qf.data() + ((j * H + h) * n + i) * d, d);
    }
    decode(TensorView<float>(of.data(), {G, H, n, d}), lse.empty() ? TensorView<float>() : TensorView<float>(lf.data(), {G, H, n}),
           TensorView<const float>(qf.data(), {G, H, n, d}), g, Hk, p.attend, op);
    for (index_t j = 0; j < G; ++j) {
      const index_t r0 = cq[static_cast<std::size_t>(g.batch[static_cast<std::size_t>(j)])];
      for (index_t h = 0; h < H; ++h)
        for (index_t i = 0; i < n; ++i) {
          const index_t at = (j * H + h) * n + i;
          narrow_row(of.data() + at * d, &out(r0 + i, h, 0), d);
          if (!lse.empty()) lse(h, r0 + i) = lf[static_cast<std::size_t>(at)];
        }
    }
  }
  // Longer sequences (all, off the cpu backend): each one's pages gathered, then sdpa_forward.
  std::vector<T> kbuf, vbuf;
  const SdpaOptions sdpa = sdpa_options(p.attend);
  for (index_t b = 0; b < B; ++b) {
    const auto u = static_cast<std::size_t>(b);
    const index_t n = cq[u + 1] - cq[u];
    if (n == 0 || (decodes && n <= cpu::fused::kDecodeRows)) continue;
    Sequences one = all;
    for (index_t i = 0; i < max_blocks; ++i) {
      const bool live = i * rows < m[u];
      one.k_blocks.push_back(live ? kc.data() + p.block_table(b, i) * kc.stride(0) : nullptr);
      one.v_blocks.push_back(live ? p.v_cache.data() + p.block_table(b, i) * p.v_cache.stride(0) : nullptr);
    }
    const auto [kr, vr] = one.rows(0);
    const TensorView<const T> k = gather(kbuf, kr, Hk, m[u], d), v = gather(vbuf, vr, Hk, m[u], d);
    const TensorView<const T> qb(&q(cq[u], 0, 0), {1, H, n, d}, {0, q.stride(1), q.stride(0), 1});
    const TensorView<T> ob(&out(cq[u], 0, 0), {1, H, n, d}, {0, out.stride(1), out.stride(0), 1});
    const TensorView<float> lb = lse.empty() ? TensorView<float>() : TensorView<float>(&lse(0, cq[u]), {1, H, n}, {0, lse.stride(0), lse.stride(1)});
    prompt<T>(ob, lb, qb, k, v, sequence_mask(p.attend, b, op), sdpa);
  }
}

#define ATTN_INSTANTIATE(T)                                                                                           \
  template void flash_attn_with_kvcache(TensorView<T>, TensorView<float>, TensorView<const T>, const FlashKvCacheParams<T>&); \
  template void flash_attn_varlen_paged(TensorView<T>, TensorView<float>, TensorView<const T>, const FlashPagedVarlenParams<T>&);
ATTN_INSTANTIATE(float)
ATTN_INSTANTIATE(bfloat16)
ATTN_INSTANTIATE(float16)
#undef ATTN_INSTANTIATE

}  // namespace attn
