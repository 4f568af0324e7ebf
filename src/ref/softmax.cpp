// Reference masked softmax and attention pooling, straight from the formulas:
//   w_j = exp(x_j - max) / sum_k exp(x_k - max) over the keys that take part,
//   out = sum_j dropout(w)_j v_j.
#include <cmath>
#include <limits>
#include <vector>

#include "core/buffer.hpp"
#include "ref/ref.hpp"

namespace attn::ref {
namespace {

// The score softmax sees for key j: the raw score plus the additive mask where the key is allowed,
// and the d2l chapter's -1e6 where it is masked under MaskedFill::d2l_minus_1e6.
template <class T>
T masked_score(const T* s, const RowMask<T>& rm, index_t j) {
  return rm.allowed(j) ? s[j] + rm.bias_at(j) : T(-1e6);
}

// One row: w (m) from scores s (m). Returns the log-sum-exp of the masked scores, -inf for a row
// with nothing to attend to (then w is all 0). A NaN score of an attended key makes the row NaN. An
// attention sink (rm.has_sink) is one more score, rm.sink, in the max and the sum, with no weight
// of its own in w.
template <class T>
T softmax_row(T* w, const T* s, const RowMask<T>& rm, index_t m) {
  const T inf = std::numeric_limits<T>::infinity();
  T max = rm.has_sink ? rm.sink : -inf;
  for (index_t j = 0; j < m; ++j)
    if (rm.participates(j) && (masked_score(s, rm, j) > max || std::isnan(masked_score(s, rm, j)))) {
      max = masked_score(s, rm, j);
      if (std::isnan(max)) break;
    }
  if (max == -inf) {  // empty row: no key to attend to
    for (index_t j = 0; j < m; ++j) w[j] = 0;
    return -inf;
  }
  T sum = rm.has_sink ? std::exp(rm.sink - max) : T(0);
  for (index_t j = 0; j < m; ++j)
    if (rm.participates(j)) sum += std::exp(masked_score(s, rm, j) - max);
  for (index_t j = 0; j < m; ++j) w[j] = rm.participates(j) ? std::exp(masked_score(s, rm, j) - max) / sum : T(0);
  return max + std::log(sum);
}

// d loss / d x_j for one row given d loss / d w (dw) and w: w_j (dw_j - sum_k w_k dw_k), and 0 for
// masked keys, whose score (if any) was a constant. The sum D = sum_k w_k dw_k is *given instead when
// not null (pool_backward's D from out).
template <class T>
void softmax_row_backward(T* ds, const T* dw, const T* w, const RowMask<T>& rm, index_t m, const T* given = nullptr) {
  T dot = 0;
  for (index_t j = 0; j < m; ++j)
    if (rm.participates(j)) dot += w[j] * dw[j];
  if (given != nullptr) dot = *given;
  for (index_t j = 0; j < m; ++j) ds[j] = rm.allowed(j) ? w[j] * (dw[j] - dot) : T(0);
}

}  // namespace

template <class T>
void masked_softmax_forward(View4<T> weights, View4<const T> scores, const MaskPlan<T>& mask) {
  detail::Buffer<T> row(static_cast<std::size_t>(scores.C));  // weights may alias scores
  for (index_t b = 0; b < scores.B; ++b)
    for (index_t h = 0; h < scores.H; ++h)
      for (index_t i = 0; i < scores.R; ++i) {
        softmax_row(row.data(), scores.row(b, h, i), mask.row(b, h, i), scores.C);
        for (index_t j = 0; j < scores.C; ++j) weights.row(b, h, i)[j] = row[static_cast<std::size_t>(j)];
      }
}

template <class T>
void masked_softmax_backward(View4<T> dscores, View4<const T> dweights, View4<const T> weights,
                             const MaskPlan<T>& mask) {
  detail::Buffer<T> row(static_cast<std::size_t>(weights.C));  // dscores may alias dweights
  for (index_t b = 0; b < weights.B; ++b)
    for (index_t h = 0; h < weights.H; ++h)
      for (index_t i = 0; i < weights.R; ++i) {
        softmax_row_backward(row.data(), dweights.row(b, h, i), weights.row(b, h, i), mask.row(b, h, i), weights.C);
        for (index_t j = 0; j < weights.C; ++j) dscores.row(b, h, i)[j] = row[static_cast<std::size_t>(j)];
      }
}

template <class T>
void pool_forward(View4<T> out, View4<T> lse, View4<T> weights, View4<const T> scores, View4<const T> values,
                  const MaskPlan<T>& mask, const DropoutPlan& dropout, index_t group) {
  const T keep_scale = static_cast<T>(dropout.scale);
  for (index_t b = 0; b < scores.B; ++b)
    for (index_t h = 0; h < scores.H; ++h)
      for (index_t i = 0; i < scores.R; ++i) {
        const RowMask<T> rm = mask.row(b, h, i);
        T* w = weights.row(b, h, i);
        const T row_lse = softmax_row(w, scores.row(b, h, i), rm, scores.C);
        if (!lse.empty()) lse.at(b, h, i, 0) = row_lse;
        T* o = out.row(b, h, i);
        for (index_t c = 0; c < out.C; ++c) o[c] = 0;
        for (index_t j = 0; j < scores.C; ++j) {
          if (!rm.participates(j) || !dropout.keep(b * scores.H + h, i, j)) continue;
          for (index_t c = 0; c < out.C; ++c) o[c] += w[j] * keep_scale * values.at(b, h / group, j, c);
        }
      }
}

template <class T>
void pool_backward(View4<T> dscores, View4<T> dvalues, View4<const T> dout, View4<const T> weights,
                   View4<const T> values, const MaskPlan<T>& mask, const DropoutPlan& dropout, index_t group,
                   View4<const T> out) {
  const T keep_scale = static_cast<T>(dropout.scale);
  const index_t m = weights.C;
  detail::Buffer<T> dw(static_cast<std::size_t>(m));
  if (!dvalues.empty())
    for (index_t b = 0; b < dvalues.B; ++b)
      for (index_t h = 0; h < dvalues.H; ++h)
        for (index_t j = 0; j < m; ++j)
          for (index_t c = 0; c < dvalues.C; ++c) dvalues.at(b, h, j, c) = 0;
  for (index_t b = 0; b < weights.B; ++b)
    for (index_t h = 0; h < weights.H; ++h)
      for (index_t i = 0; i < weights.R; ++i) {
        const RowMask<T> rm = mask.row(b, h, i);
        const T* w = weights.row(b, h, i);
        const T* g = dout.row(b, h, i);
        // out_i = sum_j w_j D_j s v_j  =>  d w_j = D_j s (dout_i . v_j),  d v_j += w_j D_j s dout_i
        for (index_t j = 0; j < m; ++j) {
          dw[static_cast<std::size_t>(j)] = 0;
          if (!rm.participates(j) || !dropout.keep(b * weights.H + h, i, j)) continue;
          T dot = 0;
          for (index_t c = 0; c < dout.C; ++c) dot += g[c] * values.at(b, h / group, j, c);
          dw[static_cast<std::size_t>(j)] = dot * keep_scale;
          if (!dvalues.empty())
            for (index_t c = 0; c < dout.C; ++c) dvalues.at(b, h / group, j, c) += w[j] * keep_scale * g[c];
        }
        T given = 0;  // D_i = dout_i . out_i
        if (!out.empty())
          for (index_t c = 0; c < dout.C; ++c) given += g[c] * out.at(b, h, i, c);
        softmax_row_backward(dscores.row(b, h, i), dw.data(), w, rm, m, out.empty() ? nullptr : &given);
      }
}

// core/kernels.inc's softmax and pool kernels, for float and double.
ATTN_KERNELS_SOFTMAX(ATTN_INSTANTIATE_KERNEL)
ATTN_KERNELS_POOL(ATTN_INSTANTIATE_KERNEL)

}  // namespace attn::ref
