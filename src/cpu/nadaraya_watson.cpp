// Dense Nadaraya-Watson pooling of the cpu backend (attn::cpu::dense, cpu/unfused.hpp): every
// (query, key) pair, threaded with OpenMP over query rows, with contiguous inner loops left to the
// compiler's vectoriser. cpu::nw_forward / nw_backward (nadaraya_watson_windowed.cpp) use it for
// p > 1, the constant kernel, calls that ask for the weights, non-finite inputs and inputs whose
// squared distances may overflow; `attn bench` times the windowed path against it. Results do not
// depend on the thread count: every output element is summed by one thread in a fixed order, and
// dsigma is reduced from per-row partials in row order.
//
// The backward writes every gradient through one coefficient per (query, key), kept in units of
// sigma (cpu/nw_gradient.hpp: b_ij = a_ij sigma^e):
//   dL/dq_i = sum_j a_ij (q_i - k_j),  dL/dk_j = -sum_i a_ij (q_i - k_j),
//   dL/dsigma = -(1 / sigma) sum_ij a_ij ||q_i - k_j||^2   (u = ||q - k|| / sigma is homogeneous)
// summed over b and divided by sigma^e at the end; the boxcar's and the constant kernel's
// coefficients are 0 (piecewise constant weights).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/buffer.hpp"
#include "cpu/nw_gradient.hpp"
#include "cpu/unfused.hpp"

namespace attn::cpu::dense {
namespace {

constexpr index_t kKeyBlock = 64;                     // keys per task of the backward's key pass
constexpr index_t kScratchElems = index_t(1) << 22;   // elements of an (n, m) buffer per group of (b, h)
constexpr index_t kParallelWork = index_t(1) << 15;   // below this many (query, key, feature) terms: 1 thread

// Whether rows x m x (p + v + 1) terms pay for waking a team of threads.
inline bool worth_threads(index_t rows, index_t m, index_t p, index_t v) {
  return static_cast<double>(rows) * static_cast<double>(m) * static_cast<double>(p + v + 1) >= kParallelWork;
}

// d2 (m) = ||q - k_j||^2 for the m keys of (b, h), summed in Out; q is one query row of p features.
template <class Out, class T>
void squared_distances(Out* d2, const T* q, const View4<const T>& k, index_t b, index_t h) {
  for (index_t j = 0; j < k.R; ++j) {
    const T* kj = k.row(b, h, j);
    Out s = 0;
#pragma omp simd reduction(+ : s)
    for (index_t x = 0; x < k.C; ++x) {
      const Out diff = static_cast<Out>(q[x]) - static_cast<Out>(kj[x]);
      s += diff * diff;
    }
    d2[j] = s;
  }
}

// The Gaussian's limit where every squared distance of query row q overflows T (the softmax of
// -d2 / 2 sigma^2 puts all its weight on the nearest keys): w (m) = 1 / count on the keys nearest q,
// their distances compared in long double (x87's 80 bits: exponents to 16383), else 0.
template <class T>
void nearest_keys(T* w, const T* q, const View4<const T>& k, index_t b, index_t h) {
  // -1, 0 or 1 as key j is nearer q than key i, as near, or further. One feature: decided exactly
  // where both lie on one side of q (far from the keys every distance rounds alike).
  const auto compare = [&](index_t j, index_t i) -> int {
    const T* kj = k.row(b, h, j);
    const T* ki = k.row(b, h, i);
    if (k.C == 1) {
      const T a = kj[0], c = ki[0], at = q[0];
      if (a == c) return 0;
      if (a <= at && c <= at) return a > c ? -1 : 1;
      if (a >= at && c >= at) return a < c ? -1 : 1;
    }
    long double dj = 0, di = 0;
    for (index_t x = 0; x < k.C; ++x) {
      const long double ej = static_cast<long double>(q[x]) - kj[x], ei = static_cast<long double>(q[x]) - ki[x];
      dj += ej * ej, di += ei * ei;
    }
    return dj < di ? -1 : dj > di ? 1 : 0;
  };
  index_t best = 0;
  for (index_t j = 1; j < k.R; ++j)
    if (compare(j, best) < 0) best = j;
  index_t count = 0;
  for (index_t j = 0; j < k.R; ++j) count += compare(j, best) == 0;
  for (index_t j = 0; j < k.R; ++j) w[j] = compare(j, best) == 0 ? T(1) / static_cast<T>(count) : T(0);
}

// w (m) = K_j / Z from d2 (m) = squared distances; w may be d2 (in place). Returns Z, 0 for an empty
// row (then w = 0), and -1 for a Gaussian row whose every squared distance overflowed T (w then
// undefined: nearest_keys gives the limit). The Gaussian subtracts the nearest key's distance first
// (the softmax's max subtraction, on squared distances so that a tiny sigma cannot give inf - inf):
// its Z >= 1. A distance that is NaN (a NaN in the query or a key) makes the whole row NaN, w and Z,
// as a NaN score does PyTorch's softmax (found by probing: a NaN query took the Gaussian's limit of
// overflowing distances, the values' mean, and the boxcar and Epanechnikov dropped a NaN key), except
// for the constant kernel, whose weights read no distance.
template <class T>
T normalize_row(T* w, const T* d2, index_t m, Kernel kernel, T sigma) {
  if (kernel != Kernel::constant && std::any_of(d2, d2 + m, [](T x) { return std::isnan(x); })) {
    std::fill(w, w + m, std::numeric_limits<T>::quiet_NaN());
    return std::numeric_limits<T>::quiet_NaN();
  }
  switch (kernel) {
    case Kernel::gaussian: {
      T d2_min = std::numeric_limits<T>::infinity();
      for (index_t j = 0; j < m; ++j) d2_min = std::min(d2_min, d2[j]);
      if (m > 0 && !(d2_min < std::numeric_limits<T>::infinity())) return T(-1);
      for (index_t j = 0; j < m; ++j) w[j] = std::exp(-((d2[j] - d2_min) / sigma / sigma) / 2);
      break;
    }
    case Kernel::boxcar:
      for (index_t j = 0; j < m; ++j) w[j] = std::sqrt(d2[j]) / sigma <= 1 ? T(1) : T(0);
      break;
    case Kernel::epanechnikov:
      for (index_t j = 0; j < m; ++j) w[j] = std::max(T(0), 1 - std::sqrt(d2[j]) / sigma);
      break;
    case Kernel::constant:
      std::fill(w, w + m, T(1));
      break;
  }
  T Z = 0;
#pragma omp simd reduction(+ : Z)
  for (index_t j = 0; j < m; ++j) Z += w[j];
  if (Z > 0)
    for (index_t j = 0; j < m; ++j) w[j] /= Z;
  return Z;
}

// o (v) = sum_j w_j v_j over the m value rows of (b, h).
template <class T>
void weighted_sum(T* o, const T* w, const View4<const T>& values, index_t b, index_t h) {
  std::fill(o, o + values.C, T(0));
  for (index_t j = 0; j < values.R; ++j) {
    const T* vj = values.row(b, h, j);
    const T wj = w[j];
    for (index_t x = 0; x < values.C; ++x) o[x] += wj * vj[x];
  }
}

// One query row of the backward: the coefficients b_j (cpu/nw_gradient.hpp) into b (m), in double:
// b times a float's q - k may overflow float where the product does not. qi (p) and di (v) = dout_i
// are the row's query and output gradient; Z is the forward's normalizer in T (0: an empty row,
// which has no gradient). Returns sum_j b_j d2_j, this row's share of -sigma^(e + 1) dL/dsigma.
// Distances, weights and g are recomputed in double in `scratch` (3 m): dsigma is a covariance of g
// and d2 under w whose terms cancel, and the rounding of a float d2 or w would dominate its error.
template <class T>
double row_coefficients(double* b, double* scratch, T Z, const T* qi, const T* di, const View4<const T>& keys,
                        const View4<const T>& values, index_t bi, index_t h, Kernel kernel, T sigma) {
  const index_t m = values.R;
  double* d2 = scratch;
  double* w = scratch + m;
  double* g = scratch + 2 * m;
  squared_distances(d2, qi, keys, bi, h);
  const double s = sigma;
  const double Zd = normalize_row(w, d2, m, kernel, s);
  if (Z <= 0 || Zd <= 0) {  // an empty row outputs a constant 0, a Gaussian's limit its nearest keys' values
    std::fill(b, b + m, 0.0);
    return 0;
  }
  for (index_t j = 0; j < m; ++j) {
    const T* vj = values.row(bi, h, j);
    double dot = 0;
#pragma omp simd reduction(+ : dot)
    for (index_t x = 0; x < values.C; ++x) dot += static_cast<double>(di[x]) * vj[x];
    g[j] = dot;
  }
  double c = 0;
#pragma omp simd reduction(+ : c)
  for (index_t j = 0; j < m; ++j) c += w[j] * g[j];
  double sum_bd2 = 0;
  const auto fill = [&]<Kernel K>() {
    for (index_t j = 0; j < m; ++j) {
      b[j] = scaled_coefficient<K>(w[j], d2[j], Zd, g[j], c, s);
      sum_bd2 += b[j] * d2[j];
    }
  };
  if (kernel == Kernel::gaussian)
    fill.template operator()<Kernel::gaussian>();
  else
    fill.template operator()<Kernel::epanechnikov>();
  return sum_bd2;
}

// fill_zero (core/view4.hpp) with threads for large views.
template <class T>
void fill_zero_threaded(View4<T> x) {
  if (x.empty()) return;
#pragma omp parallel for collapse(3) schedule(static) if (worth_threads(x.B * x.H * x.R, x.C, 0, 0))
  for (index_t b = 0; b < x.B; ++b)
    for (index_t h = 0; h < x.H; ++h)
      for (index_t r = 0; r < x.R; ++r) std::fill(x.row(b, h, r), x.row(b, h, r) + x.C, T(0));
}

}  // namespace

// out (B,H,n,v) = weights @ values; weights (B,H,n,m), when given, K / Z per row (0 for an empty
// row). Threads own whole query rows.
template <class T>
void nw_forward(View4<T> out, View4<T> weights, View4<const T> queries, View4<const T> keys, View4<const T> values,
                Kernel kernel, T sigma) {
  const index_t m = keys.R;
  const int threads = omp_get_max_threads();
  // Without a weights output, each thread keeps its row of weights in its slice of scratch.
  detail::Buffer<T> scratch(weights.empty() ? static_cast<std::size_t>(threads * m) : 0);
  const bool parallel = worth_threads(queries.B * queries.H * queries.R, m, keys.C, values.C);
#pragma omp parallel for collapse(3) schedule(static) num_threads(threads) if (parallel)
  for (index_t b = 0; b < queries.B; ++b)
    for (index_t h = 0; h < queries.H; ++h)
      for (index_t i = 0; i < queries.R; ++i) {
        T* w = weights.empty() ? scratch.data() + omp_get_thread_num() * m : weights.row(b, h, i);
        squared_distances(w, queries.row(b, h, i), keys, b, h);
        if (normalize_row(w, w, m, kernel, sigma) < 0) nearest_keys(w, queries.row(b, h, i), keys, b, h);
        weighted_sum(out.row(b, h, i), w, values, b, h);
      }
}

// Gradients of out_i = sum_j w_ij v_j: dq (B,H,n,p), dk (B,H,m,p), dv (B,H,m,v), each written when
// given, and *dsigma when dsigma is not null. Two passes per group of (b, h) pairs over (n, m)
// buffers W (weights) and A (coefficients): pass 1 owns query rows (W, A, dq, dsigma partials),
// pass 2 owns blocks of keys (dk, dv summed over queries in ascending order).
template <class T>
void nw_backward(View4<T> dqueries, View4<T> dkeys, View4<T> dvalues, T* dsigma, View4<const T> dout,
                 View4<const T> queries, View4<const T> keys, View4<const T> values, Kernel kernel, T sigma) {
  const index_t H = queries.H, n = queries.R, m = keys.R, p = keys.C, v = values.C;
  const index_t pairs = queries.B * H;
  const bool smooth = kernel == Kernel::gaussian || kernel == Kernel::epanechnikov;
  const bool need_a = smooth && (!dqueries.empty() || !dkeys.empty() || dsigma != nullptr);
  if (!need_a) {  // only dvalues can be non-zero
    fill_zero_threaded(dqueries), fill_zero_threaded(dkeys);
    if (dsigma != nullptr) *dsigma = 0;
    if (dvalues.empty()) return;
  }
  const index_t group = std::clamp<index_t>(kScratchElems / std::max<index_t>(1, n * m), 1,
                                            std::max<index_t>(1, pairs));
  const int threads = omp_get_max_threads();
  detail::Buffer<T> W(static_cast<std::size_t>(group * n * m));
  detail::Buffer<double> A(need_a ? W.size() : 0);  // the coefficients b
  detail::Buffer<double> scratch(need_a ? static_cast<std::size_t>(threads * 3 * m) : 0);
  detail::Buffer<double> row_ds(need_a ? static_cast<std::size_t>(pairs * n) : 0);  // per (b, h, i)
  const bool do_dk = need_a && !dkeys.empty(), do_dv = !dvalues.empty();
  const int power = sigma_power(kernel);
  const double s = sigma;
  const index_t key_blocks = do_dk || do_dv ? (m + kKeyBlock - 1) / kKeyBlock : 0;  // 0: no pass 2

  for (index_t first = 0; first < pairs; first += group) {
    const index_t count = std::min(group, pairs - first);
    const bool parallel = worth_threads(count * n, m, p, v);
#pragma omp parallel num_threads(threads) if (parallel)
    {
      // Pass 1: one query row at a time.
#pragma omp for collapse(2) schedule(static)
      for (index_t pp = 0; pp < count; ++pp)
        for (index_t i = 0; i < n; ++i) {
          const index_t b = (first + pp) / H, h = (first + pp) % H;
          const T* qi = queries.row(b, h, i);
          T* w = W.data() + (pp * n + i) * m;
          squared_distances(w, qi, keys, b, h);
          const T Z = normalize_row(w, w, m, kernel, sigma);
          if (Z < 0) nearest_keys(w, qi, keys, b, h);  // no gradient but the nearest keys' dv
          if (!need_a) continue;
          double* a = A.data() + (pp * n + i) * m;
          row_ds[(first + pp) * n + i] = row_coefficients(a, scratch.data() + omp_get_thread_num() * 3 * m, Z, qi,
                                                          dout.row(b, h, i), keys, values, b, h, kernel, sigma);
          if (dqueries.empty()) continue;
          T* dq = dqueries.row(b, h, i);
          std::fill(dq, dq + p, T(0));
          for (index_t j = 0; j < m; ++j) {
            if (a[j] == 0) continue;  // outside a compact kernel's support
            const T* kj = keys.row(b, h, j);
            for (index_t x = 0; x < p; ++x) dq[x] += a[j] * (qi[x] - kj[x]);
          }
          for (index_t x = 0; x < p; ++x) dq[x] = static_cast<T>(divided_by_sigma(dq[x], s, power));
        }
      // Pass 2 (after the implicit barrier): one block of keys at a time, queries in order.
#pragma omp for collapse(2) schedule(static)
      for (index_t pp = 0; pp < count; ++pp)
        for (index_t blk = 0; blk < key_blocks; ++blk) {
          const index_t b = (first + pp) / H, h = (first + pp) % H;
          const index_t j0 = blk * kKeyBlock, j1 = std::min(m, j0 + kKeyBlock);
          for (index_t j = j0; j < j1; ++j) {
            if (do_dk) std::fill(dkeys.row(b, h, j), dkeys.row(b, h, j) + p, T(0));
            if (do_dv) std::fill(dvalues.row(b, h, j), dvalues.row(b, h, j) + v, T(0));
          }
          for (index_t i = 0; i < n; ++i) {
            const T* w = W.data() + (pp * n + i) * m;
            const T* di = dout.row(b, h, i);
            for (index_t j = j0; do_dv && j < j1; ++j) {  // dv_j += w_ij dout_i
              T* dvj = dvalues.row(b, h, j);
              for (index_t x = 0; x < v; ++x) dvj[x] += w[j] * di[x];
            }
            if (!do_dk) continue;
            const double* a = A.data() + (pp * n + i) * m;
            const T* qi = queries.row(b, h, i);
            for (index_t j = j0; j < j1; ++j) {  // dk_j -= a_ij (q_i - k_j)
              if (a[j] == 0) continue;
              const T* kj = keys.row(b, h, j);
              T* dkj = dkeys.row(b, h, j);
              for (index_t x = 0; x < p; ++x) dkj[x] += a[j] * (kj[x] - qi[x]);
            }
          }
          for (index_t j = j0; do_dk && j < j1; ++j) {
            T* dkj = dkeys.row(b, h, j);
            for (index_t x = 0; x < p; ++x) dkj[x] = static_cast<T>(divided_by_sigma(dkj[x], s, power));
          }
        }
    }
  }
  if (need_a && dsigma != nullptr) {
    // In row order: the same sum for any thread count.
    double sum = 0;
    for (const double r : row_ds) sum -= r;  // sum -= r: +0, not -0, when every row is 0
    *dsigma = static_cast<T>(divided_by_sigma(sum, s, power + 1));
  }
}

// core/kernels.inc's nw kernels, for float and double.
ATTN_KERNELS_NW(ATTN_INSTANTIATE_KERNEL)

}  // namespace attn::cpu::dense
