// Reference Nadaraya-Watson pooling: plain single-threaded loops in T, written from the formulas
// of attn/nadaraya_watson.hpp. The test oracle in float64; in float32 the same-precision baseline.
//
// The backward goes through t = u^2 = ||q - k||^2 / sigma^2, the one variable every kernel
// depends on, smoothly in q, k and sigma:
//   dt/dq = 2 (q - k) / sigma^2,   dt/dk = -dt/dq,   dt/dsigma = -2 t / sigma
// and, with w_j = K_j / Z and g_j = dout . v_j,  dL/dK_j = (g_j - sum_l w_l g_l) / Z.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/buffer.hpp"
#include "ref/ref.hpp"

namespace attn::ref {
namespace {

// One query row: K[j] the kernel value of key j, t[j] = ||q - k_j||^2 / sigma^2. Returns Z = sum K.
// The Gaussian is scaled by exp(t_min / 2), the softmax's max subtraction, so its nearest key has
// K = 1 and a row is never empty; the scale cancels in K / Z. The subtraction is done on squared
// distances so that a tiny sigma gives exp(-0 / 2) for the nearest key, not exp(inf - inf).
template <class T>
T kernel_row(detail::Buffer<T>& K, detail::Buffer<T>& t, View4<const T> q, View4<const T> k, index_t b, index_t h,
             index_t i, Kernel kernel, T sigma) {
  const T* qi = q.row(b, h, i);
  for (index_t j = 0; j < k.R; ++j) {  // t holds ||q - k_j||^2 until the end
    const T* kj = k.row(b, h, j);
    t[j] = 0;
    for (index_t x = 0; x < k.C; ++x) t[j] += (qi[x] - kj[x]) * (qi[x] - kj[x]);
  }
  const T d2_min = t.empty() ? T(0) : *std::min_element(t.begin(), t.end());
  T Z = 0;
  for (index_t j = 0; j < k.R; ++j) {
    const T d2 = t[j], u = std::sqrt(d2) / sigma;
    switch (kernel) {
      case Kernel::gaussian: K[j] = std::exp(-((d2 - d2_min) / sigma / sigma) / 2); break;
      case Kernel::boxcar: K[j] = u <= 1 ? T(1) : T(0); break;
      case Kernel::epanechnikov: K[j] = std::max(T(0), 1 - u); break;
      case Kernel::constant: K[j] = 1; break;
    }
    Z += K[j];
    t[j] = d2 / sigma / sigma;
  }
  return Z;
}

// dK/dt at one key, given its K and t. Boxcar and constant: 0. Epanechnikov K = 1 - sqrt(t) inside
// its support: -1 / (2 sqrt(t)), with 0 at t = 0 where it is undefined (the header's rule).
template <class T>
T kernel_dt(Kernel kernel, T K, T t) {
  switch (kernel) {
    case Kernel::gaussian: return -K / 2;
    case Kernel::epanechnikov: return K > 0 && t > 0 ? -1 / (2 * std::sqrt(t)) : T(0);
    case Kernel::boxcar:
    case Kernel::constant: return 0;
  }
  return 0;
}

}  // namespace

// out (B,H,n,v) = weights @ values; weights (B,H,n,m) = K / Z per row, or 0 for an empty row.
template <class T>
void nw_forward(View4<T> out, View4<T> weights, View4<const T> queries, View4<const T> keys, View4<const T> values,
                Kernel kernel, T sigma) {
  const index_t m = keys.R;
  detail::Buffer<T> K(static_cast<std::size_t>(m)), t(K.size());
  for (index_t b = 0; b < queries.B; ++b)
    for (index_t h = 0; h < queries.H; ++h)
      for (index_t i = 0; i < queries.R; ++i) {
        const T Z = kernel_row(K, t, queries, keys, b, h, i, kernel, sigma);
        T* o = out.row(b, h, i);
        std::fill(o, o + out.C, T(0));
        for (index_t j = 0; j < m; ++j) {
          const T w = Z > 0 ? K[j] / Z : T(0);
          if (!weights.empty()) weights.at(b, h, i, j) = w;
          for (index_t x = 0; x < out.C; ++x) o[x] += w * values.at(b, h, j, x);
        }
      }
}

// Differentiates out_i = sum_j (K_ij / Z_i) v_j. dq (B,H,n,p), dk (B,H,m,p), dv (B,H,m,v): each
// written when given; *dsigma written when dsigma is not null.
template <class T>
void nw_backward(View4<T> dqueries, View4<T> dkeys, View4<T> dvalues, T* dsigma, View4<const T> dout,
                 View4<const T> queries, View4<const T> keys, View4<const T> values, Kernel kernel, T sigma) {
  const index_t m = keys.R, p = keys.C, v = values.C;
  fill_zero(dqueries), fill_zero(dkeys), fill_zero(dvalues);
  T ds = 0;
  detail::Buffer<T> K(static_cast<std::size_t>(m)), t(K.size()), g(K.size());
  for (index_t b = 0; b < queries.B; ++b)
    for (index_t h = 0; h < queries.H; ++h)
      for (index_t i = 0; i < queries.R; ++i) {
        const T Z = kernel_row(K, t, queries, keys, b, h, i, kernel, sigma);
        if (Z == 0) continue;  // an empty row outputs a constant 0: no gradient
        const T* qi = queries.row(b, h, i);
        const T* di = dout.row(b, h, i);
        // c = sum_l w_l g_l = dout_i . out_i
        T c = 0;
        for (index_t j = 0; j < m; ++j) {
          g[j] = 0;
          for (index_t x = 0; x < v; ++x) g[j] += di[x] * values.at(b, h, j, x);
          c += K[j] / Z * g[j];
        }
        for (index_t j = 0; j < m; ++j) {
          // dv_j += w_j dout_i
          if (!dvalues.empty())
            for (index_t x = 0; x < v; ++x) dvalues.at(b, h, j, x) += K[j] / Z * di[x];
          const T dLdt = (g[j] - c) / Z * kernel_dt(kernel, K[j], t[j]);
          if (dLdt == 0) continue;
          const T* kj = keys.row(b, h, j);
          for (index_t x = 0; x < p; ++x) {
            const T dt_dq = 2 * (qi[x] - kj[x]) / sigma / sigma;
            if (!dqueries.empty()) dqueries.at(b, h, i, x) += dLdt * dt_dq;
            if (!dkeys.empty()) dkeys.at(b, h, j, x) -= dLdt * dt_dq;
          }
          ds += dLdt * (-2 * t[j] / sigma);
        }
      }
  if (dsigma != nullptr) *dsigma = ds;
}

// core/kernels.inc's nw kernels, for float and double.
ATTN_KERNELS_NW(ATTN_INSTANTIATE_KERNEL)

}  // namespace attn::ref
