// Variable-length attention (attn/varlen.hpp): the packed tensors and cu_seqlens checked once, then
// one sdpa call per sequence on strided views of the packed rows (no copy), each with its own mask
// (ALiBi row, dropout offsets) and options. Sequences run one after another; each call is itself
// parallel over heads and query blocks.
#include "attn/varlen.hpp"

#include <cmath>
#include <limits>
#include <vector>

#include "api/checks.hpp"
#include "core/dropout_plan.hpp"
#include "core/view4.hpp"

namespace attn {
namespace {

// 16-bit attention keeps lse, the slopes, the sinks and their gradient in float32.
template <class E>
using Wide = std::conditional_t<Half16<E>, float, E>;

// The checked packing: sizes and the sequences' first rows.
struct Packed {
  index_t B = 0, total_q = 0, total_k = 0, H = 0, Hk = 0, d = 0, dv = 0;
  std::vector<index_t> cq, ck;  // (B+1,) each
  index_t n(index_t b) const { return cq[b + 1] - cq[b]; }
  index_t m(index_t b) const { return ck[b + 1] - ck[b]; }
};

// cu_seqlens as row offsets: (B+1,) int32, from 0, non-decreasing, ending at `total`.
std::vector<index_t> offsets(const TensorView<const std::int32_t>& cu, const char* op, const char* name, index_t total,
                             const char* tensor) {
  if (cu.empty()) detail::fail(op, ": ", name, " is required: (B+1,) int32, the first row of each sequence and the total");
  if (cu.rank() != 1 || cu.dim(0) < 1)
    detail::fail(op, ": ", name, " has shape ", cu.shape_string(), "; it must be (B+1,) with B >= 0 sequences");
  if (cu.data() == nullptr) detail::fail(op, ": ", name, " has shape ", cu.shape_string(), " but no data");
  if (cu.stride(0) < 0) detail::fail(op, ": ", name, " has stride ", cu.stride(0), "; strides must not be negative");
  std::vector<index_t> r(static_cast<std::size_t>(cu.dim(0)));
  for (index_t b = 0; b < cu.dim(0); ++b) {
    r[b] = cu(b);
    if (b == 0 && r[b] != 0) detail::fail(op, ": ", name, "[0] is ", r[b], "; it must be 0 (the first sequence starts at row 0)");
    if (b > 0 && r[b] < r[b - 1])
      detail::fail(op, ": ", name, "[", b, "] is ", r[b], " but ", name, "[", b - 1, "] is ", r[b - 1],
                   "; it must not decrease (sequence ", b - 1, " would have a negative length)");
  }
  if (r.back() != total)
    detail::fail(op, ": ", name, " ends at ", r.back(), " but ", tensor, " has ", total,
                 " rows; its last element must be the total number of rows");
  return r;
}

// A packed (total, heads, c) tensor: rank 3, strides non-negative, the last contiguous.
template <class E>
void require_packed(const TensorView<E>& t, const char* op, const char* name, const char* layout) {
  if (t.empty()) return;
  if (t.rank() != 3) detail::fail(op, ": ", name, " has shape ", t.shape_string(), "; it must be ", layout);
  detail::to_view4(t, op, name, 3, 3);
}

template <class E, class W>
Packed check_packed(const char* op, const TensorView<const E>& q, const TensorView<const E>& k,
                    const TensorView<const E>& v, const VarlenSeqs& s, const Mask<W>& mask, const SdpaOptions& o) {
  if (q.empty()) detail::fail(op, ": queries is required but was not given");
  if (k.empty()) detail::fail(op, ": keys is required but was not given");
  if (v.empty()) detail::fail(op, ": values is required but was not given");
  require_packed(q, op, "queries", "(total_q, H, d)");
  require_packed(k, op, "keys", "(total_k, Hk, d)");
  require_packed(v, op, "values", "(total_k, Hk, v)");
  Packed p;
  p.total_q = q.dim(0), p.H = q.dim(1), p.d = q.dim(2), p.total_k = k.dim(0), p.Hk = k.dim(1), p.dv = v.dim(2);
  if (k.dim(2) != p.d)
    detail::fail(op, ": keys has shape ", k.shape_string(), " but queries ", q.shape_string(), " has d = ", p.d,
                 "; their last dimensions must match");
  if (v.dim(0) != p.total_k || v.dim(1) != p.Hk)
    detail::fail(op, ": values has shape ", v.shape_string(), " but keys ", k.shape_string(),
                 "; values must have the rows and heads of keys, (total_k, Hk, v)");
  if (p.Hk == 0 ? p.H != 0 : p.H % p.Hk != 0)
    detail::fail(op, ": keys has ", p.Hk, " heads but queries has ", p.H,
                 "; the query heads must be a multiple of the key heads (grouped-query attention)");
  p.cq = offsets(s.cu_seqlens_q, op, "cu_seqlens_q", p.total_q, "queries");
  p.ck = offsets(s.cu_seqlens_k, op, "cu_seqlens_k", p.total_k, "keys");
  if (p.cq.size() != p.ck.size())
    detail::fail(op, ": cu_seqlens_q has shape (", p.cq.size(), ",) but cu_seqlens_k has (", p.ck.size(),
                 ",); both must be (B+1,) for the same B sequences");
  p.B = static_cast<index_t>(p.cq.size()) - 1;
  auto longest = [&](index_t max, const char* name, bool queries) {
    if (max < 0) detail::fail(op, ": ", name, " is ", max, "; it must not be negative");
    for (index_t b = 0; b < p.B; ++b) {
      const index_t len = queries ? p.n(b) : p.m(b);
      if (len > max)
        detail::fail(op, ": ", name, " is ", max, " but sequence ", b, " has ", len, queries ? " queries" : " keys",
                     "; it must be at least the longest sequence");
    }
  };
  longest(s.max_seqlen_q, "max_seqlen_q", true);
  longest(s.max_seqlen_k, "max_seqlen_k", false);
  // The mask components that have no meaning per sequence.
  if (!mask.valid_lens.empty())
    detail::fail(op, ": valid_lens has shape ", mask.valid_lens.shape_string(),
                 "; packed sequences take their lengths from cu_seqlens_q and cu_seqlens_k, not valid lengths");
  if (!mask.keep.empty())
    detail::fail(op, ": mask (keep) has shape ", mask.keep.shape_string(),
                 "; packed sequences take no boolean mask (causal, window and ALiBi apply per sequence)");
  if (!mask.additive.empty())
    detail::fail(op, ": additive mask has shape ", mask.additive.shape_string(),
                 "; packed sequences take no additive mask (causal, window and ALiBi apply per sequence)");
  if (!mask.segment_ids_q.empty() || !mask.segment_ids_k.empty())
    detail::fail(op, ": segment_ids are given; packed sequences are separated by cu_seqlens_q and cu_seqlens_k, "
                     "not segment ids");
  if (mask.fill != MaskedFill::exclude)
    detail::fail(op, ": masked fill d2l_minus_1e6 is not taken; packed sequences exclude masked keys");
  if (!mask.alibi_slopes.empty()) {
    const auto& a = mask.alibi_slopes;
    const bool per_head = a.rank() == 1 && a.dim(0) == p.H, per_seq = a.rank() == 2 && a.dim(0) == p.B && a.dim(1) == p.H;
    if (!per_head && !per_seq)
      detail::fail(op, ": alibi_slopes has shape ", a.shape_string(), "; it must be (H,) = (", p.H, ",) or (B, H) = (",
                   p.B, ",", p.H, ")");
    detail::check_strides(a, op, "alibi_slopes");
  }
  if (!mask.sinks.empty() && (mask.sinks.rank() != 1 || mask.sinks.dim(0) != p.H))
    detail::fail(op, ": sinks has shape ", mask.sinks.shape_string(), "; it must be (H,) = (", p.H, ",)");
  // Values too, here: a batch whose sequences are all empty makes no call that would check them.
  for (index_t h = 0; h < (mask.sinks.empty() ? 0 : p.H); ++h)
    if (!std::isfinite(mask.sinks(h)))
      detail::fail(op, ": sinks holds ", mask.sinks(h), " for head ", h, "; every sink logit must be finite");
  for (index_t e = 0; e < (mask.alibi_slopes.empty() ? 0 : mask.alibi_slopes.numel()); ++e) {
    const auto& a = mask.alibi_slopes;
    const W slope = a.rank() == 1 ? a(e) : a(e / p.H, e % p.H);
    if (!std::isfinite(slope)) detail::fail(op, ": alibi_slopes holds ", slope, "; every slope must be finite");
  }
  // The options, once (each sequence's call checks them again, with the same result).
  if (p.d == 0 && !o.scale)
    detail::fail(op, ": queries has shape ", q.shape_string(), " with d = 0; the default scale 1/sqrt(d) needs d >= 1");
  if (o.scale && !std::isfinite(static_cast<Wide<E>>(*o.scale)))
    detail::fail(op, ": scale is ", *o.scale, "; it must be finite in the computation's type");
  if (o.softcap && !detail::softcap_fits<Wide<E>>(*o.softcap))
    detail::fail(op, ": softcap is ", *o.softcap, "; it must be positive and finite in the computation's type, and so must "
                 "its inverse");
  plan_dropout(o.dropout, op, p.H, /*offsets=*/true);
  return p;
}

// Rows [start, start + count) of a packed (total, heads, c) tensor as a (1, heads, count, c) view.
template <class E>
TensorView<E> rows(const TensorView<E>& t, index_t start, index_t count) {
  if (t.empty()) return {};
  const index_t shape[] = {1, t.dim(1), count, t.dim(2)};
  const index_t strides[] = {0, t.stride(1), t.stride(0), 1};
  return TensorView<E>(t.data() + start * t.stride(0), shape, strides);
}

// Columns [start, start + count) of lse (H, total_q) as a (1, H, count) view.
template <class W>
TensorView<W> lse_rows(const TensorView<W>& l, index_t start, index_t count) {
  if (l.empty()) return {};
  const index_t shape[] = {1, l.dim(0), count};
  const index_t strides[] = {0, l.stride(0), l.stride(1)};
  return TensorView<W>(l.data() + start * l.stride(1), shape, strides);
}

template <class E>
void zero_rows(const TensorView<E>& t, index_t start, index_t count) {
  if (t.empty()) return;
  for (index_t r = start; r < start + count; ++r)
    for (index_t h = 0; h < t.dim(1); ++h)
      for (index_t c = 0; c < t.dim(2); ++c) t(r, h, c) = E{};
}

// Sequence b's mask and options: its row of (B, H) slopes, its place in the packed dropout pattern.
template <class W>
Mask<W> sequence_mask(const Mask<W>& mask, index_t b, const char* op) {
  Mask<W> m = mask;
  const auto& a = mask.alibi_slopes;
  if (!a.empty() && a.rank() == 2) {
    m.alibi_slopes = detail::step(a, b, op, "alibi_slopes");
  }
  return m;
}

SdpaOptions sequence_options(const SdpaOptions& o, const Packed& p, index_t b) {
  SdpaOptions r = o;
  r.dropout.row_start += p.cq[b], r.dropout.key_start += p.ck[b];
  return r;
}

// Runs one sequence's call, its error named with the sequence.
template <class F>
void per_sequence(const char* op, const Packed& p, index_t b, F&& f) {
  try {
    f();
  } catch (const MemoryError&) {
    throw;
  } catch (const Error& e) {
    detail::fail(op, ": sequence ", b, " (", p.n(b), " queries, ", p.m(b), " keys): ", e.what());
  }
}

template <class E, class W>
void check_outputs(const char* op, const Packed& p, const TensorView<E>& out, const TensorView<W>& lse) {
  require_packed(out, op, "out", "(total_q, H, v)");
  if (!out.empty()) detail::require_shape(out, {p.total_q, p.H, p.dv}, op, "out", "(total_q, H, v) from queries and values");
  if (!lse.empty()) {
    detail::require_shape(lse, {p.H, p.total_q}, op, "lse", "(H, total_q), FlashAttention's varlen layout");
    detail::to_view4(lse, op, "lse", 2, 2, /*any_last_stride=*/true);
  }
}

template <class E, class W>
void forward(TensorView<E> out, TensorView<W> lse, TensorView<W> weights, TensorView<const E> q, TensorView<const E> k,
             TensorView<const E> v, const VarlenSeqs& s, const Mask<W>& mask, const SdpaOptions& o) {
  const char* op = "varlen_forward";
  const Packed p = check_packed<E, W>(op, q, k, v, s, mask, o);
  if (out.empty()) detail::fail(op, ": out is required but was not given");
  check_outputs(op, p, out, lse);
  if (!weights.empty()) {
    detail::require_shape(weights, {p.B, p.H, s.max_seqlen_q, s.max_seqlen_k}, op, "weights",
                          "(B, H, max_seqlen_q, max_seqlen_k)");
    detail::to_view4(weights, op, "weights", 4, 4);
  }
  const detail::Named<E> ins[] = {{"queries", q}, {"keys", k}, {"values", v}};
  detail::require_no_aliasing<E>(op, {{"out", out}}, {ins[0], ins[1], ins[2]});
  if constexpr (std::is_same_v<E, W>) {
    detail::require_no_aliasing<W>(op, {{"lse", lse}, {"weights", weights}}, {ins[0], ins[1], ins[2], {"out", out}});
  } else {
    detail::require_no_aliasing<W, E>(op, {{"lse", lse}}, {ins[0], ins[1], ins[2], {"out", out}});
  }
  if (!weights.empty()) fill_zero(detail::to_view4(weights, op, "weights", 4, 4));
  for (index_t b = 0; b < p.B; ++b) {
    const index_t n = p.n(b), m = p.m(b);
    if (n == 0) continue;
    const TensorView<E> ob = rows(out, p.cq[b], n);
    const TensorView<W> lb = lse_rows(lse, p.cq[b], n);
    if (m == 0) {  // queries without keys: out 0, lse -inf, or the sink's logit
      zero_rows(out, p.cq[b], n);
      for (index_t h = 0; h < p.H && !lb.empty(); ++h)
        for (index_t i = 0; i < n; ++i)
          lb(0, h, i) = mask.sinks.empty() ? -std::numeric_limits<W>::infinity() : mask.sinks(h);
      continue;
    }
    const Mask<W> mb = sequence_mask(mask, b, op);
    const SdpaOptions obo = sequence_options(o, p, b);
    const TensorView<const E> qb = rows(q, p.cq[b], n), kb = rows(k, p.ck[b], m), vb = rows(v, p.ck[b], m);
    per_sequence(op, p, b, [&] {
      if constexpr (Half16<E>) {
        sdpa_forward<E>(ob, lb, qb, kb, vb, mb, obo);
      } else {
        TensorView<W> wb;
        if (!weights.empty()) {
          const TensorView<W> ws = detail::step(weights, b, op, "weights");
          const index_t shape[] = {1, p.H, n, m};
          const index_t strides[] = {0, ws.stride(0), ws.stride(1), 1};
          wb = TensorView<W>(ws.data(), shape, strides);
        }
        sdpa_forward<E>(ob, lb, wb, qb, kb, vb, mb, obo);
      }
    });
  }
}

template <class E, class W>
void backward(TensorView<E> dq, TensorView<E> dk, TensorView<E> dv, TensorView<const E> dout, TensorView<const E> q,
              TensorView<const E> k, TensorView<const E> v, TensorView<const E> out, TensorView<const W> lse,
              const VarlenSeqs& s, const Mask<W>& mask, const SdpaOptions& o, TensorView<W> dsinks) {
  const char* op = "varlen_backward";
  const Packed p = check_packed<E, W>(op, q, k, v, s, mask, o);
  if (dout.empty()) detail::fail(op, ": dout is required but was not given");
  require_packed(dout, op, "dout", "(total_q, H, v)");
  detail::require_shape(dout, {p.total_q, p.H, p.dv}, op, "dout", "the shape of varlen_forward's out, (total_q, H, v)");
  check_outputs(op, p, out, lse);
  require_packed(dq, op, "dqueries", "(total_q, H, d)");
  require_packed(dk, op, "dkeys", "(total_k, Hk, d)");
  require_packed(dv, op, "dvalues", "(total_k, Hk, v)");
  if (!dq.empty()) detail::require_shape(dq, {p.total_q, p.H, p.d}, op, "dqueries", "the shape of queries");
  if (!dk.empty()) detail::require_shape(dk, {p.total_k, p.Hk, p.d}, op, "dkeys", "the shape of keys");
  if (!dv.empty()) detail::require_shape(dv, {p.total_k, p.Hk, p.dv}, op, "dvalues", "the shape of values");
  if (!dsinks.empty()) {
    if (mask.sinks.empty()) detail::fail(op, ": dsinks is given but the mask has no sinks");
    detail::require_shape(dsinks, {p.H}, op, "dsinks", "the shape of sinks, (H,)");
    detail::to_view4(dsinks, op, "dsinks", 1, 1);
  }
  detail::require_no_aliasing<E>(op, {{"dqueries", dq}, {"dkeys", dk}, {"dvalues", dv}},
                                 {{"dout", dout}, {"queries", q}, {"keys", k}, {"values", v}, {"out", out}});
  detail::require_no_aliasing<W>(op, {{"dsinks", dsinks}}, {{"lse", lse}, {"sinks", mask.sinks}});
  std::vector<double> dsum(static_cast<std::size_t>(p.H), 0.0);
  Tensor<W> dsinks_b;
  if (!dsinks.empty()) dsinks_b = Tensor<W>({p.H});
  for (index_t b = 0; b < p.B; ++b) {
    const index_t n = p.n(b), m = p.m(b);
    if (n == 0 || m == 0) {  // no weights: zero gradients (and no share of dsinks: out is 0)
      zero_rows(dq, p.cq[b], n), zero_rows(dk, p.ck[b], m), zero_rows(dv, p.ck[b], m);
      continue;
    }
    const Mask<W> mb = sequence_mask(mask, b, op);
    const SdpaOptions obo = sequence_options(o, p, b);
    const TensorView<const E> qb = rows(q, p.cq[b], n), kb = rows(k, p.ck[b], m), vb = rows(v, p.ck[b], m);
    const TensorView<const E> gb = rows(dout, p.cq[b], n), ob = rows(out, p.cq[b], n);
    const TensorView<const W> lb = lse_rows(lse, p.cq[b], n);
    const TensorView<W> db = dsinks.empty() ? TensorView<W>{} : dsinks_b.view();
    per_sequence(op, p, b, [&] {
      sdpa_backward<E>(rows(dq, p.cq[b], n), rows(dk, p.ck[b], m), rows(dv, p.ck[b], m), gb, qb, kb, vb, ob, lb, mb, obo,
                       db);
    });
    if (!dsinks.empty())
      for (index_t h = 0; h < p.H; ++h) dsum[h] += static_cast<double>(dsinks_b[h]);
  }
  if (!dsinks.empty())
    for (index_t h = 0; h < p.H; ++h) dsinks(h) = static_cast<W>(dsum[h]);
}

}  // namespace

template <class T>
void varlen_forward(TensorView<T> out, TensorView<T> lse, TensorView<T> weights, TensorView<const T> queries,
                    TensorView<const T> keys, TensorView<const T> values, const VarlenSeqs& seqs, const Mask<T>& mask,
                    const SdpaOptions& options) {
  forward<T, T>(out, lse, weights, queries, keys, values, seqs, mask, options);
}

template <class T>
void varlen_backward(TensorView<T> dqueries, TensorView<T> dkeys, TensorView<T> dvalues, TensorView<const T> dout,
                     TensorView<const T> queries, TensorView<const T> keys, TensorView<const T> values,
                     TensorView<const T> out, TensorView<const T> lse, const VarlenSeqs& seqs, const Mask<T>& mask,
                     const SdpaOptions& options, TensorView<T> dsinks) {
  backward<T, T>(dqueries, dkeys, dvalues, dout, queries, keys, values, out, lse, seqs, mask, options, dsinks);
}

template <Half16 H>
void varlen_forward(TensorView<H> out, TensorView<float> lse, TensorView<const H> queries, TensorView<const H> keys,
                    TensorView<const H> values, const VarlenSeqs& seqs, const Mask<float>& mask,
                    const SdpaOptions& options) {
  forward<H, float>(out, lse, {}, queries, keys, values, seqs, mask, options);
}

template <Half16 H>
void varlen_backward(TensorView<H> dqueries, TensorView<H> dkeys, TensorView<H> dvalues, TensorView<const H> dout,
                     TensorView<const H> queries, TensorView<const H> keys, TensorView<const H> values,
                     TensorView<const H> out, TensorView<const float> lse, const VarlenSeqs& seqs,
                     const Mask<float>& mask, const SdpaOptions& options, TensorView<float> dsinks) {
  backward<H, float>(dqueries, dkeys, dvalues, dout, queries, keys, values, out, lse, seqs, mask, options, dsinks);
}

#define ATTN_INSTANTIATE(T, W)                                                                                      \
  template void varlen_forward(TensorView<T>, TensorView<W>, TensorView<const T>, TensorView<const T>,              \
                               TensorView<const T>, const VarlenSeqs&, const Mask<W>&, const SdpaOptions&);         \
  template void varlen_backward(TensorView<T>, TensorView<T>, TensorView<T>, TensorView<const T>, TensorView<const T>, \
                                TensorView<const T>, TensorView<const T>, TensorView<const T>, TensorView<const W>, \
                                const VarlenSeqs&, const Mask<W>&, const SdpaOptions&, TensorView<W>);
ATTN_INSTANTIATE(bfloat16, float)
ATTN_INSTANTIATE(float16, float)
#undef ATTN_INSTANTIATE

#define ATTN_INSTANTIATE(T)                                                                                         \
  template void varlen_forward(TensorView<T>, TensorView<T>, TensorView<T>, TensorView<const T>, TensorView<const T>, \
                               TensorView<const T>, const VarlenSeqs&, const Mask<T>&, const SdpaOptions&);         \
  template void varlen_backward(TensorView<T>, TensorView<T>, TensorView<T>, TensorView<const T>, TensorView<const T>, \
                                TensorView<const T>, TensorView<const T>, TensorView<const T>, TensorView<const T>, \
                                const VarlenSeqs&, const Mask<T>&, const SdpaOptions&, TensorView<T>);
ATTN_INSTANTIATE(float)
ATTN_INSTANTIATE(double)
#undef ATTN_INSTANTIATE

}  // namespace attn
