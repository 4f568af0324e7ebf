// Masked softmax over the last axis, as the d2l chapter's masked_softmax.
#pragma once

#include "attn/mask.hpp"
#include "attn/tensor.hpp"

namespace attn {

// weights = masked_softmax(scores) along the last axis.
//   scores (B, n, m) or (B, H, n, m); weights the same shape (it may alias scores).
// The mask rules are in attn/mask.hpp: masked entries get weight 0, empty rows are all 0.
template <class T>
void masked_softmax_forward(TensorView<T> weights, TensorView<const T> scores, const Mask<T>& mask = {});

// dscores = d loss / d scores, given dweights = d loss / d weights and the forward's weights:
//   dscores[j] = weights[j] * (dweights[j] - sum_k weights[k] * dweights[k]).
// Masked entries get 0 (with MaskedFill::d2l_minus_1e6 their score was replaced by a constant).
//   dscores, dweights, weights: (B, n, m) or (B, H, n, m). dscores may alias dweights.
template <class T>
void masked_softmax_backward(TensorView<T> dscores, TensorView<const T> dweights, TensorView<const T> weights,
                             const Mask<T>& mask = {});

// Convenience: returns a new tensor.
template <class T>
Tensor<T> masked_softmax(TensorView<const T> scores, const Mask<T>& mask = {});

}  // namespace attn
