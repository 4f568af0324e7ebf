// Nadaraya-Watson kernel regression, the first attention pooling of the d2l chapter:
//   f(q) = sum_j K(||q - k_j|| / sigma) v_j / sum_j K(||q - k_j|| / sigma)
// with the d2l chapter's kernels of u = ||q - k|| / sigma:
//   gaussian      exp(-u^2 / 2)            (= softmax of -||q - k||^2 / (2 sigma^2))
//   boxcar        1 if u <= 1, else 0
//   epanechnikov  max(0, 1 - u)            (the d2l chapter's definition; textbooks' is 3/4 (1 - u^2))
//   constant      1                        (every key weighs the same: the plain average)
//
//   queries (B, n, p) or (B, H, n, p)     keys (B, m, p) / (B, H, m, p)
//   values  (B, m, v) / (B, H, m, v)      out  (B, n, v) / (B, H, n, v)
//   weights (B, n, m) / (B, H, n, m)      only written when given
// A query with no key inside a compact kernel's support outputs 0 and has weights 0 (as an empty
// masked row does). The Gaussian's weights are taken relative to the nearest key's (the softmax's
// maximum), so a tiny sigma gives the nearest key weight 1 and the others 0; on the cpu backend, a
// query so far from the keys that every squared distance overflows the type gets the limit too, the
// nearest keys' weights (1 / count each; with p > 1 compared in long double) and no gradient but
// that of the values. sigma must be positive and finite.
//
// With 1-D keys (p = 1) and the boxcar, Epanechnikov or Gaussian kernel, the cpu backend visits only
// the keys near each query (sorted keys and binary search: (n + m) log m plus the pairs visited),
// unless the weights are asked for. Its Gaussian then drops the keys whose weight is below
// eps / (4 m) of the nearest key's (eps the type's machine epsilon, m the key count): Z is off by
// less than eps / 4 relatively, out by less than eps / 2 of the largest |value|.
#pragma once

#include <string_view>

#include "attn/tensor.hpp"

namespace attn {

enum class Kernel { gaussian, boxcar, epanechnikov, constant };

// "gaussian" -> Kernel::gaussian, ...; attn::Error for an unknown name, listing the known ones.
Kernel kernel_from_name(std::string_view name);
/// The name kernel_from_name reads: "gaussian", "boxcar", "epanechnikov", "constant".
const char* kernel_name(Kernel kernel);

/// out (B, n, v) = sum_j w_ij values_j with w_ij = K(|q_i - k_j| / sigma) / sum_j' K(...) for queries
/// (B, n, p) and keys (B, m, p); weights (B, n, m) when not empty.
template <class T>
void nadaraya_watson_forward(TensorView<T> out, TensorView<T> weights, TensorView<const T> queries,
                             TensorView<const T> keys, TensorView<const T> values, Kernel kernel, T sigma);

// Gradients of queries, keys, values and sigma (each may be empty / null when not needed).
// The boxcar's weights are piecewise constant: its gradients with respect to queries, keys and sigma
// are 0 (almost everywhere). At q == k the Epanechnikov kernel is not differentiable; 0 is used.
template <class T>
void nadaraya_watson_backward(TensorView<T> dqueries, TensorView<T> dkeys, TensorView<T> dvalues, T* dsigma,
                              TensorView<const T> dout, TensorView<const T> queries, TensorView<const T> keys,
                              TensorView<const T> values, Kernel kernel, T sigma);

// The pairs the windowed path visits: nadaraya_watson_visited_pairs, in attn/diagnostics.hpp.

}  // namespace attn
