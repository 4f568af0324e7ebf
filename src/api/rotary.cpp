// apply_rotary (attn/rotary.hpp): every argument checked once, the positions turned into one int64
// offset per sequence (and int64 starts for the varlen form), then the kernel (cpu/rotary.hpp).
#include "api/rotary.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "api/checks.hpp"
#include "cpu/rotary.hpp"

namespace attn {
namespace detail {

template <class C>
index_t check_rotary_tables(const char* op, const TensorView<const C>& cos, const TensorView<const C>& sin,
                            index_t head_dim, const char* what) {
  if (cos.empty() || sin.empty())
    fail(op, ": ", cos.empty() ? "cos" : "sin", " is required but was not given (cos and sin: (seqlen_ro, rotary_dim / 2))");
  to_view4(cos, op, "cos", 2, 2), to_view4(sin, op, "sin", 2, 2);
  if (cos.dim(0) != sin.dim(0) || cos.dim(1) != sin.dim(1))
    fail(op, ": cos has shape ", cos.shape_string(), " but sin has shape ", sin.shape_string(),
         "; they must be the same (seqlen_ro, rotary_dim / 2)");
  const index_t half = cos.dim(1);
  if (2 * half > head_dim)
    fail(op, ": cos and sin have shape ", cos.shape_string(), ", so rotary_dim = 2 * ", half, " = ", 2 * half, "; ", what,
         " has head_dim ", head_dim, ", and rotary_dim must be at most head_dim");
  return half;
}

template index_t check_rotary_tables(const char*, const TensorView<const float>&, const TensorView<const float>&, index_t,
                                     const char*);
template index_t check_rotary_tables(const char*, const TensorView<const double>&, const TensorView<const double>&,
                                     index_t, const char*);

Tensor<float> rotated_rows(const RotaryTables& tables, const TensorView<const float>& rows,
                           std::span<const std::int64_t> first) {
  Tensor<float> out(rows.shape());
  cpu::RotaryParams<float, float> p;
  const index_t B = rows.dim(0), H = rows.dim(1), n = rows.dim(2), d = rows.dim(3);
  p.x = rows.data(), p.x_sb = rows.stride(0), p.x_sh = rows.stride(1), p.x_ss = rows.stride(2);
  p.out = out.data(), p.out_sb = H * n * d, p.out_sh = n * d, p.out_ss = d;
  p.batch = B, p.seqlen = n, p.heads = H, p.head_dim = d, p.half = tables.cos.dim(1);
  p.cos = tables.cos.data(), p.sin = tables.sin.data(), p.cos_s = tables.cos.stride(0), p.sin_s = tables.sin.stride(0);
  p.offsets = first.data(), p.interleaved = tables.interleaved;
  cpu::rotary(p);
  return out;
}

}  // namespace detail

namespace {

// Sequence b's first position and, varlen, its start in x: from offset/offsets and cu_seqlens,
// checked against the tables' seqlen_ro rows.
struct Sequences {
  std::vector<std::int64_t> first, starts;  // (B,), and (B + 1,) varlen or empty
};

Sequences sequences_of(const char* op, const RotaryPositions& pos, index_t x_batch, index_t seqlen, index_t total,
                       index_t seqlen_ro) {
  Sequences s;
  const bool varlen = !pos.cu_seqlens.empty();
  index_t B = x_batch;
  if (varlen) {
    const IndexVector& cu = pos.cu_seqlens;
    if (cu.rank() != 1 || cu.dim(0) < 1)
      detail::fail(op, ": cu_seqlens has shape ", cu.shape_string(), "; it must be (batch + 1,): the start of every ",
                   "sequence in x, then x's total tokens");
    B = cu.dim(0) - 1;
    s.starts.resize(static_cast<std::size_t>(B + 1));
    for (index_t b = 0; b <= B; ++b) s.starts[static_cast<std::size_t>(b)] = cu[b];
    if (s.starts[0] != 0) detail::fail(op, ": cu_seqlens[0] is ", s.starts[0], "; it must be 0 (the first sequence starts x)");
    for (index_t b = 0; b < B; ++b)
      if (s.starts[static_cast<std::size_t>(b + 1)] < s.starts[static_cast<std::size_t>(b)])
        detail::fail(op, ": cu_seqlens[", b + 1, "] is ", s.starts[static_cast<std::size_t>(b + 1)], " but cu_seqlens[", b,
                     "] is ", s.starts[static_cast<std::size_t>(b)], "; cu_seqlens must not decrease (sequence ", b,
                     " would hold a negative number of tokens)");
    if (s.starts[static_cast<std::size_t>(B)] != total)
      detail::fail(op, ": cu_seqlens ends at ", s.starts[static_cast<std::size_t>(B)], " but x has shape (total, heads, ",
                   "head_dim) with total = ", total, "; the last entry must be x's total tokens");
  }
  if (pos.offset < 0) detail::fail(op, ": offset is ", pos.offset, "; positions start at 0, so it must not be negative");
  if (!pos.offsets.empty()) {
    if (pos.offsets.rank() != 1 || pos.offsets.dim(0) != B)
      detail::fail(op, ": offsets has shape ", pos.offsets.shape_string(), "; it must be (batch,) = (", B,
                   ",): one first position per sequence", varlen ? " (batch = cu_seqlens' length - 1)" : " of x");
    if (pos.offset != 0)
      detail::fail(op, ": offset is ", pos.offset, " and offsets is given too; pass one of them");
  }
  s.first.resize(static_cast<std::size_t>(B));
  for (index_t b = 0; b < B; ++b) {
    const index_t off = pos.offsets.empty() ? pos.offset : pos.offsets[b];
    if (off < 0)
      detail::fail(op, ": offsets[", b, "] is ", off, "; positions start at 0, so offsets must not be negative");
    const index_t len = varlen ? s.starts[static_cast<std::size_t>(b + 1)] - s.starts[static_cast<std::size_t>(b)] : seqlen;
    if (len > 0 && off > seqlen_ro - len)
      detail::fail(op, ": sequence ", b, " (batch index ", b, ") starts at offset ", off, " and holds ", len,
                   " tokens, so its last position is ",
                   static_cast<std::uint64_t>(off) + static_cast<std::uint64_t>(len - 1),  // both >= 0: no overflow
                   ", but cos and sin have ", seqlen_ro,
                   " rows (seqlen_ro): every position must be less than seqlen_ro");
    s.first[static_cast<std::size_t>(b)] = off;
  }
  return s;
}

}  // namespace

template <class T>
void apply_rotary(TensorView<T> out, TensorView<const T> x, TensorView<const RotaryTable<T>> cos,
                  TensorView<const RotaryTable<T>> sin, const RotaryPositions& positions, const RotaryOptions& options) {
  using C = RotaryTable<T>;
  const char* op = "apply_rotary";
  const bool varlen = !positions.cu_seqlens.empty();
  const int rank = varlen ? 3 : 4;
  for (const auto& [name, t] : {std::pair{"x", x}, std::pair{"out", TensorView<const T>(out)}}) {
    if (t.empty()) detail::fail(op, ": ", name, " is required but was not given");
    if (t.rank() != rank)
      detail::fail(op, ": ", name, " has shape ", t.shape_string(), "; it must be ",
                   varlen ? "(total, heads, head_dim) when cu_seqlens is given"
                          : "(batch, seqlen, heads, head_dim), or (total, heads, head_dim) with cu_seqlens");
    detail::to_view4(t, op, name, rank, rank);
  }
  if (!std::equal(out.shape().begin(), out.shape().end(), x.shape().begin()))
    detail::fail(op, ": out has shape ", out.shape_string(), " but x has shape ", x.shape_string(), "; they must be the same");
  const index_t d = x.dim(-1);
  const index_t half = detail::check_rotary_tables(op, cos, sin, d, "x");
  // Memory: out is x itself (in place) or apart from it; never over the tables, never broadcast.
  const bool in_place = static_cast<const T*>(out.data()) == x.data() &&
                        std::equal(out.strides().begin(), out.strides().end(), x.strides().begin());
  detail::require_no_aliasing<T, C>(op, {{"out", out}}, {{"cos", cos}, {"sin", sin}});
  if (!in_place && detail::overlap(detail::footprint(TensorView<const T>(out)), "out", detail::footprint(x), "x", op))
    detail::fail(op, ": out and x share memory (out ", out.shape_string(), " strides ", detail::dims_string(out.strides()),
                 ", x strides ", detail::dims_string(x.strides()), "); out must be x itself (in place: the same data and ",
                 "strides) or memory of its own");
  const Sequences s = sequences_of(op, positions, varlen ? 0 : x.dim(0), varlen ? 0 : x.dim(1), varlen ? x.dim(0) : 0, cos.dim(0));

  cpu::RotaryParams<T, C> p;
  p.x = x.data(), p.out = out.data();
  if (varlen) {
    p.x_ss = x.stride(0), p.x_sh = x.stride(1), p.out_ss = out.stride(0), p.out_sh = out.stride(1);
    p.batch = static_cast<index_t>(s.first.size()), p.starts = s.starts.data();
  } else {
    p.x_sb = x.stride(0), p.x_ss = x.stride(1), p.x_sh = x.stride(2);
    p.out_sb = out.stride(0), p.out_ss = out.stride(1), p.out_sh = out.stride(2);
    p.batch = x.dim(0), p.seqlen = x.dim(1);
  }
  p.heads = x.dim(-2), p.head_dim = d, p.half = half;
  p.cos = cos.data(), p.sin = sin.data(), p.cos_s = cos.stride(0), p.sin_s = sin.stride(0);
  p.offsets = s.first.data(), p.interleaved = options.interleaved, p.inverse = options.inverse;
  if (x.numel() == 0) return;
  cpu::rotary(p);
}

#define ATTN_INSTANTIATE_ROTARY(T)                                                                         \
  template void apply_rotary(TensorView<T>, TensorView<const T>, TensorView<const RotaryTable<T>>,         \
                             TensorView<const RotaryTable<T>>, const RotaryPositions&, const RotaryOptions&);
ATTN_INSTANTIATE_ROTARY(float)
ATTN_INSTANTIATE_ROTARY(double)
ATTN_INSTANTIATE_ROTARY(bfloat16)
ATTN_INSTANTIATE_ROTARY(float16)
#undef ATTN_INSTANTIATE_ROTARY

}  // namespace attn
