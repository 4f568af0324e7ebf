#include "core/mask_plan.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/view4.hpp"

namespace attn {
namespace {

std::string scores_shape(index_t B, index_t H, index_t n, index_t m, int rank) {
  const index_t d4[] = {B, H, n, m};
  const index_t d3[] = {B, n, m};
  return rank == 4 ? detail::dims_string(d4) : detail::dims_string(d3);
}

// NumPy broadcasting of `t` (rank <= 4) to (B, H, n, m): returns the four strides, 0 on the
// broadcast dimensions. A 3-D mask of a 3-D call is (B, n, m) and broadcasts the same way.
template <class U>
void broadcast_strides(const TensorView<U>& t, index_t B, index_t H, index_t n, index_t m, int rank, const char* op,
                       const char* name, index_t out[4]) {
  detail::to_view4(t, op, name, 1, 4, /*any_last_stride=*/true);  // strides, overflow
  const index_t target4[] = {B, H, n, m};
  const index_t target3[] = {B, n, m};
  const index_t* target = rank == 4 ? target4 : target3;
  if (t.rank() > rank)
    detail::fail(op, ": ", name, " has shape ", t.shape_string(), " which does not broadcast to the scores' shape ",
                 scores_shape(B, H, n, m, rank), ": it has more dimensions");
  index_t strides[4] = {0, 0, 0, 0};
  for (int i = 0; i < t.rank(); ++i) {
    const int target_dim = rank - t.rank() + i;
    const index_t size = t.dim(i);
    if (size != 1 && size != target[target_dim])
      detail::fail(op, ": ", name, " has shape ", t.shape_string(), " which does not broadcast to the scores' shape ",
                   scores_shape(B, H, n, m, rank), ": dimension ", i, " is ", size, " where ",
                   target[target_dim], " or 1 is needed");
    const int axis = rank == 4 ? target_dim : (target_dim == 0 ? 0 : target_dim + 1);
    strides[axis] = size == 1 ? 0 : t.stride(i);
  }
  for (int i = 0; i < 4; ++i) out[i] = strides[i];
}

// The rows of segment ids (B, len) of int32 or int64 elements, checked; *sb receives the batch stride.
SegmentRow segment_rows(const SegmentIds& ids, index_t B, index_t len, const char* op, const char* name,
                        const char* want, index_t& sb) {
  if (!ids.i64.empty() && !ids.i32.empty()) detail::fail(op, ": ", name, " is given both as int64 and as int32");
  auto check = [&](const auto& t) {
    if (t.rank() != 2 || t.dim(0) != B || t.dim(1) != len)
      detail::fail(op, ": ", name, " has shape ", t.shape_string(), "; it must be ", want, " = (", B, ",", len, ")");
    if (t.data() == nullptr && t.numel() > 0) detail::fail(op, ": ", name, " has no data");
    if (t.stride(0) < 0 || t.stride(1) < 0) detail::fail(op, ": ", name, " has a negative stride");
    sb = t.stride(0);
    return t.stride(1);
  };
  SegmentRow r;
  if (!ids.i64.empty()) r.stride = check(ids.i64), r.i64 = ids.i64.data();
  else r.stride = check(ids.i32), r.i32 = ids.i32.data();
  return r;
}

}  // namespace

template <class T>
MaskPlan<T> plan_mask(const Mask<T>& mask, index_t B, index_t H, index_t n, index_t m, int rank, const char* op) {
  MaskPlan<T> p;
  p.switches = detail::read_switches();
  p.B = B, p.H = H, p.n = n, p.m = m;
  p.d2l_fill = mask.fill == MaskedFill::d2l_minus_1e6;

  if (!mask.valid_lens.empty()) {
    const auto& vl = mask.valid_lens;
    const bool per_batch = vl.rank() == 1 && vl.dim(0) == B;
    const bool per_query = vl.rank() == 2 && vl.dim(0) == B && vl.dim(1) == n;
    if (!per_batch && !per_query)
      detail::fail(op, ": valid_lens has shape ", vl.shape_string(), "; it must be (B,) = (", B, ",) or (B, n) = (",
                   B, ",", n, ") for scores of shape ", scores_shape(B, H, n, m, rank));
    if (vl.numel() > 0 && vl.data() == nullptr) detail::fail(op, ": valid_lens has no data");
    if (vl.stride(0) < 0 || (per_query && vl.stride(1) < 0))
      detail::fail(op, ": valid_lens has a negative stride");
    p.lens = vl.data();
    p.lens_sb = vl.stride(0);
    p.lens_si = per_query ? vl.stride(1) : 0;
    for (index_t b = 0; b < B; ++b)
      for (index_t i = 0; i < (per_query ? n : 1); ++i) {
        const std::int64_t len = p.lens[b * p.lens_sb + i * p.lens_si];
        if (len < 0 || len > m) {
          if (per_query)
            detail::fail(op, ": valid_lens[", b, ",", i, "] is ", len, "; valid lengths must lie in [0, m] = [0, ", m, "]");
          detail::fail(op, ": valid_lens[", b, "] is ", len, "; valid lengths must lie in [0, m] = [0, ", m, "]");
        }
      }
  }
  // Positions p(i) = i + offset, for the causal rule, the window and ALiBi; a block of a longer
  // attention is shifted by where its queries and keys start.
  constexpr index_t kMaxStart = index_t(1) << 48;
  if (mask.query_start < 0 || mask.query_start >= kMaxStart || mask.key_start < 0 || mask.key_start >= kMaxStart)
    detail::fail(op, ": query_start is ", mask.query_start, " and key_start ", mask.key_start,
                 "; positions must lie in [0, 2^48)");
  if (mask.align && mask.causal != Causal::none &&
      (*mask.align == Align::bottom_right) != (mask.causal == Causal::bottom_right))
    detail::fail(op, ": causal is ", mask.causal == Causal::top_left ? "top_left" : "bottom_right", " but align is ",
                 *mask.align == Align::top_left ? "top_left" : "bottom_right",
                 "; a causal mask is aligned as the queries are: give one alignment");
  p.offset = (mask.alignment() == Align::bottom_right ? m - n : 0) + mask.query_start - mask.key_start;
  p.causal = mask.causal != Causal::none;
  if (mask.window) {
    p.window = true;
    p.window_left = std::max<index_t>(mask.window->left, -1);
    p.window_right = std::max<index_t>(mask.window->right, -1);
  }
  if (!mask.segment_ids_q.empty()) {
    p.seg_q = segment_rows(mask.segment_ids_q, B, n, op, "segment_ids (queries)", "(B, n)", p.seg_q_sb);
    if (mask.segment_ids_k.empty()) {
      if (n != m)
        detail::fail(op, ": segment_ids of the queries are given without those of the keys, but n = ", n, " != m = ", m,
                     "; one tensor serves both only when n == m: pass the keys' ids (B, m) too");
      p.seg_k = p.seg_q, p.seg_k_sb = p.seg_q_sb;
    } else {
      p.seg_k = segment_rows(mask.segment_ids_k, B, m, op, "segment_ids (keys)", "(B, m)", p.seg_k_sb);
    }
  } else if (!mask.segment_ids_k.empty()) {
    detail::fail(op, ": segment_ids of the keys are given without those of the queries");
  }
  if (!mask.alibi_slopes.empty()) {
    const auto& a = mask.alibi_slopes;
    const bool per_head = a.rank() == 1 && a.dim(0) == H;
    const bool per_batch = a.rank() == 2 && a.dim(0) == B && a.dim(1) == H;
    if (!per_head && !per_batch)
      detail::fail(op, ": alibi_slopes has shape ", a.shape_string(), "; it must be (H,) = (", H, ",) or (B, H) = (", B,
                   ",", H, ") for scores of shape ", scores_shape(B, H, n, m, rank));
    if (a.data() == nullptr && a.numel() > 0) detail::fail(op, ": alibi_slopes has no data");
    for (int i = 0; i < a.rank(); ++i)
      if (a.stride(i) < 0) detail::fail(op, ": alibi_slopes has a negative stride");
    p.alibi = a.data();
    p.alibi_sb = per_batch ? a.stride(0) : 0;
    p.alibi_sh = a.stride(a.rank() - 1);
    for (index_t b = 0; b < (per_batch ? B : 1); ++b)
      for (index_t h = 0; h < H; ++h)
        if (!std::isfinite(p.alibi_slope(b, h)))
          detail::fail(op, ": alibi_slopes holds ", p.alibi_slope(b, h), " for batch ", b, ", head ", h,
                       "; every slope must be finite");
  }
  if (!mask.keep.empty()) {
    broadcast_strides(mask.keep, B, H, n, m, rank, op, "mask", p.keep_s);
    p.keep = mask.keep.data();
  }
  if (!mask.additive.empty()) {
    broadcast_strides(mask.additive, B, H, n, m, rank, op, "additive mask", p.bias_s);
    p.bias = mask.additive.data();
  }
  if (!mask.sinks.empty()) {
    const auto& s = mask.sinks;
    if (s.rank() != 1 || s.dim(0) != H)
      detail::fail(op, ": sinks has shape ", s.shape_string(), "; it must be (H,) = (", H,
                   ",): one logit per query head, for scores of shape ", scores_shape(B, H, n, m, rank));
    if (s.data() == nullptr && H > 0) detail::fail(op, ": sinks has no data");
    if (s.stride(0) < 0) detail::fail(op, ": sinks has a negative stride");
    p.sinks = s.data(), p.sinks_stride = s.stride(0);
    for (index_t h = 0; h < H; ++h)
      if (!std::isfinite(p.sink(h)))
        detail::fail(op, ": sinks holds ", p.sink(h), " for head ", h, "; every sink logit must be finite");
  }
  return p;
}

template MaskPlan<float> plan_mask(const Mask<float>&, index_t, index_t, index_t, index_t, int, const char*);
template MaskPlan<double> plan_mask(const Mask<double>&, index_t, index_t, index_t, index_t, int, const char*);

}  // namespace attn
