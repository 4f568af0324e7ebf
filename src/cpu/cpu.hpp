// The production kernels of the cpu backend: the unfused path (scores, softmax and weighted sum as
// separate threaded passes over an (n, m) buffer), threaded with OpenMP over rows. Same contracts as
// the reference kernels in ref/ref.hpp, tested against them. Arguments were validated in src/api.
#pragma once

#include "attn/nadaraya_watson.hpp"
#include "core/dropout_plan.hpp"
#include "core/mask_plan.hpp"
#include "core/view4.hpp"

namespace attn::cpu {

// ---- masked softmax (attn/softmax.hpp); scores, weights: (B, H, n, m) -------------------------
template <class T>
void masked_softmax_forward(View4<T> weights, View4<const T> scores, const MaskPlan<T>& mask);
template <class T>
void masked_softmax_backward(View4<T> dscores, View4<const T> dweights, View4<const T> weights,
                             const MaskPlan<T>& mask);

// ---- bmm (attn/bmm.hpp): out = op(a) @ op(b) per (b, h) ---------------------------------------
template <class T>
void bmm_forward(View4<T> out, View4<const T> a, View4<const T> b, bool transpose_a, bool transpose_b);
template <class T>
void bmm_backward(View4<T> da, View4<T> db, View4<const T> dout, View4<const T> a, View4<const T> b,
                  bool transpose_a, bool transpose_b);

// ---- attention pooling, shared by every scoring function ----------------------------------------
// From raw scores (B, H, n, m) (scaled, before any mask): weights = masked softmax (before dropout),
// lse (B, H, n, 1) when given, out (B, H, n, v) = dropout(weights) @ values, skipping keys that do
// not take part (RowMask::participates) so that nothing stored there is read.
template <class T>
void pool_forward(View4<T> out, View4<T> lse, View4<T> weights, View4<const T> scores, View4<const T> values,
                  const MaskPlan<T>& mask, const DropoutPlan& dropout);
// From the forward's weights (before dropout): dscores (B, H, n, m) (0 where masked) and, when
// given, dvalues (B, H, m, v) = dropout(weights)^T @ dout.
template <class T>
void pool_backward(View4<T> dscores, View4<T> dvalues, View4<const T> dout, View4<const T> weights,
                   View4<const T> values, const MaskPlan<T>& mask, const DropoutPlan& dropout);

// ---- scaled dot-product attention (attn/sdpa.hpp); lse is (B, H, n, 1) -------------------------
template <class T>
void sdpa_forward(View4<T> out, View4<T> lse, View4<T> weights, View4<const T> queries, View4<const T> keys,
                  View4<const T> values, const MaskPlan<T>& mask, T scale, const DropoutPlan& dropout);
template <class T>
void sdpa_backward(View4<T> dqueries, View4<T> dkeys, View4<T> dvalues, View4<const T> dout,
                   View4<const T> queries, View4<const T> keys, View4<const T> values, View4<const T> out,
                   View4<const T> lse, const MaskPlan<T>& mask, T scale, const DropoutPlan& dropout);

// ---- additive attention (attn/additive.hpp); w_q (1, 1, h, q), w_k (1, 1, h, k), w_v (1, 1, 1, h)
template <class T>
void additive_forward(View4<T> out, View4<T> weights, View4<const T> queries, View4<const T> keys,
                      View4<const T> values, View4<const T> w_q, View4<const T> w_k, View4<const T> w_v,
                      const MaskPlan<T>& mask, const DropoutPlan& dropout);
template <class T>
void additive_backward(View4<T> dqueries, View4<T> dkeys, View4<T> dvalues, View4<T> dw_q, View4<T> dw_k,
                       View4<T> dw_v, View4<const T> dout, View4<const T> queries, View4<const T> keys,
                       View4<const T> values, View4<const T> w_q, View4<const T> w_k, View4<const T> w_v,
                       const MaskPlan<T>& mask, const DropoutPlan& dropout);

// ---- bilinear attention (attn/bilinear.hpp); w (1, 1, q, k) -----------------------------------
template <class T>
void bilinear_forward(View4<T> out, View4<T> weights, View4<const T> queries, View4<const T> keys,
                      View4<const T> values, View4<const T> w, const MaskPlan<T>& mask, const DropoutPlan& dropout);
template <class T>
void bilinear_backward(View4<T> dqueries, View4<T> dkeys, View4<T> dvalues, View4<T> dw, View4<const T> dout,
                       View4<const T> queries, View4<const T> keys, View4<const T> values, View4<const T> w,
                       const MaskPlan<T>& mask, const DropoutPlan& dropout);

// ---- Nadaraya-Watson (attn/nadaraya_watson.hpp) ------------------------------------------------
template <class T>
void nw_forward(View4<T> out, View4<T> weights, View4<const T> queries, View4<const T> keys, View4<const T> values,
                Kernel kernel, T sigma);
template <class T>
void nw_backward(View4<T> dqueries, View4<T> dkeys, View4<T> dvalues, T* dsigma, View4<const T> dout,
                 View4<const T> queries, View4<const T> keys, View4<const T> values, Kernel kernel, T sigma);

}  // namespace attn::cpu
