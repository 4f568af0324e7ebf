// Nadaraya-Watson pooling of the cpu backend: the entry points cpu::nw_forward / nw_backward, and
// the windowed path (cpu/nw_windowed.hpp) they take for 1-D keys with the boxcar, Epanechnikov or
// Gaussian kernel. Everything else (p > 1, the constant kernel, a call asking for the (n, m)
// weights, non-finite queries or keys, or ones so far apart that (q - k)^2 may overflow) goes to
// the dense path, cpu::dense (nadaraya_watson.cpp).
//
// Keys. Per group (b, h) the keys are checked for ascending order (O(m)) and, when they are not
// sorted, ordered by a stable argsort (m log m, once per call); keys and values are gathered in that
// order into contiguous buffers, and perm maps a sorted position back to the caller's row.
//
// Windows. Each query finds the keys it visits, [lo, hi) of the sorted keys, by binary searches
// (log m): cost (n + m) log m plus the pairs visited.
//   boxcar, epanechnikov: the keys with sqrt((q - k)^2) / sigma <= 1 computed in T: the dense path's
//     support test, so both paths count the same keys, on the boundary too. The test only gets
//     harder away from q on either side (rounding is monotone), so the window's ends are binary
//     searches on the test itself. Keys at u = 1 exactly are in the boxcar's support; they weigh 0
//     in the Epanechnikov kernel.
//   gaussian (truncated): d2_min, the squared distance of the nearest key (one of the two keys
//     around q's insertion point), then the keys with a = ((q - k)^2 - d2_min) / sigma^2 / 2 <= A,
//     the exponent of their weight exp(-a) relative to the nearest key's weight 1 (the dense path's
//     max subtraction). The stated truncation error: every dropped key weighs less than e^-A while
//     Z >= 1, so the dropped mass Z' is less than m e^-A relative to Z, and out = S / Z moves by at
//     most Z' / (Z + Z') * 2 max_j |v_j| < 2 m e^-A max_j |v_j|. A = ln(4 m / eps) with eps the
//     machine epsilon of T (2^-23 float, 2^-52 double), from the key count m of the call: Z is off by
//     less than eps / 4 relatively and out by less than eps / 2 of the largest |value| (up to the
//     rounding of a itself). For m = 1e5 that keeps the keys within about 7.6 sigma (float) or 9.9
//     sigma (double) of the nearest one.
//
// Forward: weights K computed in T with the dense path's expressions (for v = 1 in SIMD, with
// Highway's exp); Z = sum K and S = sum K v in double, out = S / Z (0 for an empty window).
// Backward, with the coefficients b_ij of cpu/nw_gradient.hpp (the dense path's) recomputed in
// double from the window of the T support test (Gaussian: of the double exponent against T's
// cutoff A):
//   pass 1, fixed chunks of queries in ascending order: Z_i, c_i = dout_i . out_i, dq_i and the
//     row's share of dsigma, kept per query with its window;
//   pass 2, fixed chunks of sorted keys: dk_j and dv_j summed over the queries whose window holds j,
//     in ascending query order, found by binary search on the running max of the windows' ends and
//     the running min of their starts (the Gaussian's windows need not be monotone in q).
// Each output element is summed by one task in a fixed order and dsigma in query order, so results
// do not depend on the thread count. A task owns kChunk queries or keys; threads take tasks.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "attn/config.hpp"
#include "core/switch_plan.hpp"
#include "cpu/nw_gradient.hpp"
#include "cpu/nw_windowed.hpp"
#include "cpu/scratch.hpp"
#include "cpu/simd/fused.hpp"
#include "cpu/simd/nw_window.hpp"
#include "cpu/unfused.hpp"

namespace attn::cpu {
namespace windowed {
namespace {

constexpr index_t kChunk = 256;                      // queries (pass 1, forward) or keys (pass 2) per task
constexpr double kParallelWork = double(1 << 15);    // below this estimate of terms: 1 thread
constexpr index_t kParallelSort = index_t(1) << 16;  // keys over all groups from which sorting is threaded

// Whether work of `rows` queries of `m` keys each, with values of size v, pays for a team of threads:
// a query visits at least log2 m keys in its searches, and a window of up to m keys.
bool worth_threads(index_t rows, index_t m, index_t v) {
  const double per_row = std::log2(static_cast<double>(m) + 1) + static_cast<double>(std::min<index_t>(m, 64));
  return static_cast<double>(rows) * per_row * static_cast<double>(v + 1) >= kParallelWork;
}

// The largest |x| of column 0 of x (B, H, R, 1); infinity where some element is not finite.
template <class T>
T largest_magnitude(const View4<const T>& x) {
  T top = 0;
  for (index_t b = 0; b < x.B; ++b)
    for (index_t h = 0; h < x.H; ++h)
      for (index_t r = 0; r < x.R; ++r) {
        const T e = x.at(b, h, r, 0);
        if (!std::isfinite(e)) return std::numeric_limits<T>::infinity();
        top = std::max(top, std::abs(e));
      }
  return top;
}

// Whether the windowed path takes a call: 1-D keys, a kernel it has (applies), and queries and keys
// finite and near enough that no squared distance overflows T (|q| + |k| below sqrt(max) / 2).
// The others go to the dense path: non-finite ones cannot be ordered, and where (q - k)^2
// overflows, the dense path gives the Gaussian's limit, the nearest keys' values (nearest_keys).
template <class T>
bool windowable(const View4<const T>& queries, const View4<const T>& keys, Kernel kernel) {
  static const T reach = std::sqrt(std::numeric_limits<T>::max()) / 2;
  return applies(keys.C, kernel) && largest_magnitude(queries) + largest_magnitude(keys) <= reach;
}

// Stable argsort: perm (count) = the rows 0..count-1 ordered by x(row), ties in row order; the
// identity without sorting when x is already ascending (an O(count) check).
template <class X>
void argsort(index_t* perm, index_t count, const X& x) {
  std::iota(perm, perm + count, index_t(0));
  bool sorted = true;
  for (index_t r = 1; r < count && sorted; ++r) sorted = !(x(r) < x(r - 1));
  if (!sorted) std::stable_sort(perm, perm + count, [&](index_t a, index_t b) { return x(a) < x(b); });
}

// The keys of every group g = (b, h) in ascending order, with their values in the same order.
template <class T>
struct SortedKeys {
  index_t m = 0, v = 0;
  T* keys = nullptr;        // (G, m)
  T* values = nullptr;      // (G, m, v)
  index_t* perm = nullptr;  // (G, m): the caller's row of each sorted key
  const T* k(index_t g) const { return keys + g * m; }
  const T* val(index_t g, index_t j) const { return values + (g * m + j) * v; }

  SortedKeys() = default;
  SortedKeys(Carve& c, index_t G, index_t m_, index_t v_)
      : m(m_), v(v_), keys(c.take<T>(static_cast<std::size_t>(G * m))),
        values(c.take<T>(static_cast<std::size_t>(G * m * v))), perm(c.take<index_t>(static_cast<std::size_t>(G * m))) {}

  // Fills the arrays from keys (B, H, m, 1) and values (B, H, m, v).
  void fill(const View4<const T>& key_rows, const View4<const T>& value_rows) {
    const index_t B = key_rows.B, H = key_rows.H, G = B * H;
#pragma omp parallel for schedule(dynamic, 1) if (G > 1 && G * m >= kParallelSort)
    for (index_t g = 0; g < G; ++g) {
      const index_t b = g / H, h = g % H;
      index_t* p = perm + g * m;
      argsort(p, m, [&](index_t r) { return key_rows.at(b, h, r, 0); });
      for (index_t j = 0; j < m; ++j) {
        keys[g * m + j] = key_rows.at(b, h, p[j], 0);
        std::copy_n(value_rows.row(b, h, p[j]), v, values + (g * m + j) * v);
      }
    }
  }
};

// The keys [lo, hi) of the sorted keys that one query visits; d2_min is the nearest key's squared
// distance (Gaussian only).
template <class U>
struct Window {
  index_t lo = 0, hi = 0;
  U d2_min = 0;
};

// The window of query q among sorted keys ks (m), computed in precision U (T, or double for the
// backward's Gaussian): the support test sqrt(d2) / sigma <= 1 of the compact kernels, or the
// Gaussian's a = ((d2 - d2_min) / sigma / sigma) / 2 <= cutoff, with d2 = (q - k)^2 in U. Both tests
// fail only further away on either side of q, so each end is a binary search on the test.
template <class U, class T>
Window<U> find_window(const T* ks, index_t m, U q, Kernel kernel, U sigma, U cutoff) {
  Window<U> w;
  if (m == 0) return w;
  const auto d2 = [q](T k) {
    const U d = q - static_cast<U>(k);
    return d * d;
  };
  const index_t pos = std::lower_bound(ks, ks + m, q, [](T k, U x) { return static_cast<U>(k) < x; }) - ks;
  U d2_min = std::numeric_limits<U>::infinity();
  if (pos > 0) d2_min = d2(ks[pos - 1]);
  if (pos < m) d2_min = std::min(d2_min, d2(ks[pos]));
  w.d2_min = d2_min;
  const auto inside = [&](T k) {
    if (kernel == Kernel::gaussian) return ((d2(k) - d2_min) / sigma / sigma) / 2 <= cutoff;
    return std::sqrt(d2(k)) / sigma <= 1;
  };
  w.lo = std::partition_point(ks, ks + pos, [&](T k) { return !inside(k); }) - ks;
  w.hi = std::partition_point(ks + pos, ks + m, inside) - ks;
  return w;
}

// The kernel value of a key at squared distance d2 in precision U, the dense path's expressions
// (the Gaussian relative to the nearest key at d2_min). The boxcar's window is its support: 1.
template <Kernel K, class U>
U weight(U d2, U d2_min, U sigma) {
  if constexpr (K == Kernel::gaussian) return std::exp(-((d2 - d2_min) / sigma / sigma) / 2);
  if constexpr (K == Kernel::epanechnikov) return std::max(U(0), 1 - std::sqrt(d2) / sigma);
  return U(1);
}

// f.template operator()<K>() for the kernel K = kernel (boxcar, epanechnikov or gaussian), so that
// the loops over a window are compiled once per kernel.
template <class F>
void with_kernel(Kernel kernel, F&& f) {
  switch (kernel) {
    case Kernel::gaussian: return f.template operator()<Kernel::gaussian>();
    case Kernel::epanechnikov: return f.template operator()<Kernel::epanechnikov>();
    default: return f.template operator()<Kernel::boxcar>();
  }
}

// dout_i . v_j in double, over v elements.
template <class T>
double dot(const T* a, const T* b, index_t v) {
  double s = 0;
  for (index_t x = 0; x < v; ++x) s += static_cast<double>(a[x]) * b[x];
  return s;
}

// ---- forward -------------------------------------------------------------------------------------

// out row (v) of query q over its window: S / Z in double, 0 when Z = 0. acc (v) is work space.
// For v = 1 the sums come from the SIMD loop of simd/nw_window.hpp (Highway's exp in place of
// std::exp, at most 1 ulp apart) on the call's SIMD target; wider values take the scalar loop below.
template <Kernel K, class T>
void forward_row(T* out, double* acc, T q, const Window<T>& w, const SortedKeys<T>& s, index_t g, T sigma,
                 simd::Target target) {
  const T* ks = s.k(g);
  const index_t v = s.v;
  if (v == 1) {  // the d2l chapter's regression, scalar targets: the SIMD loop
    const fused::WindowSums sums = fused::nw_window_sums<T>(ks + w.lo, s.val(g, w.lo), w.hi - w.lo, q, w.d2_min,
                                                            sigma, K, target);
    out[0] = sums.Z > 0 ? static_cast<T>(sums.S / sums.Z) : T(0);
    return;
  }
  double Z = 0;
  std::fill(acc, acc + v, 0.0);
  for (index_t j = w.lo; j < w.hi; ++j) {
    const T d = q - ks[j];
    const double Kv = weight<K>(d * d, w.d2_min, sigma);
    if (Kv == 0) continue;
    Z += Kv;
    const T* vj = s.val(g, j);
    for (index_t x = 0; x < v; ++x) acc[x] += Kv * vj[x];
  }
  for (index_t x = 0; x < v; ++x) out[x] = Z > 0 ? static_cast<T>(acc[x] / Z) : T(0);
}

// ---- backward ------------------------------------------------------------------------------------

// The backward's arrays for G groups of n queries and m keys with v values each: the sorted keys,
// and what pass 1 leaves per query for pass 2. Per-query arrays are (G, n) indexed by the caller's
// query row; the reach arrays by sorted position.
template <class T>
struct BackwardArrays {
  SortedKeys<T> keys;
  index_t* qperm;     // (G, n): query rows in ascending order of their query
  double* Z;          // (G, n): sum of K over the window, 0 for an empty row
  double* c;          // (G, n): dout_i . out_i
  double* d2_min;     // (G, n)
  double* row_ds;     // (G, n): sum_j b_ij d2_ij, the row's share of -sigma^(e + 1) dL/dsigma
  index_t* lo;        // (G, n): window [lo, hi) of sorted keys
  index_t* hi;
  index_t* reach_hi;  // (G, n): max of hi over the first s + 1 queries in sorted order
  index_t* reach_lo;  // (G, n): min of lo over the queries from sorted position s on

  BackwardArrays(Carve& carve, index_t G, index_t n, index_t m, index_t v)
      : keys(carve, G, m, v), qperm(carve.take<index_t>(count(G, n))), Z(carve.take<double>(count(G, n))),
        c(carve.take<double>(count(G, n))), d2_min(carve.take<double>(count(G, n))),
        row_ds(carve.take<double>(count(G, n))), lo(carve.take<index_t>(count(G, n))),
        hi(carve.take<index_t>(count(G, n))), reach_hi(carve.take<index_t>(count(G, n))),
        reach_lo(carve.take<index_t>(count(G, n))) {}
  static std::size_t count(index_t G, index_t n) { return static_cast<std::size_t>(G * n); }
};

// A thread's work memory: `count` doubles (the forward's accumulator of a row's v values; the
// backward's per-row arrays, backward_row and backward_keys).
struct WorkDoubles {
  double* w;
  WorkDoubles(Carve& c, std::size_t count) : w(c.take<double>(count)) {}
  // Over the work memory run_tasks gives a task.
  static double* in(void* work, std::size_t count) {
    Carve c(work);
    return WorkDoubles(c, count).w;
  }
};

// One backward call: the arguments and the arrays.
template <class T>
struct Backward : BackwardArrays<T> {
  View4<T> dq, dk, dv;
  View4<const T> dout, q;
  double sigma = 0, cutoff = 0;
  bool need_a = false;  // dq, dk or dsigma asked for, and a smooth kernel
  index_t G = 0, H = 0, n = 0;

  explicit Backward(const BackwardArrays<T>& arrays) : BackwardArrays<T>(arrays) {}
  T query(index_t g, index_t i) const { return q.at(g / H, g % H, i, 0); }
};

// The window of query row i of group g for the backward, in double: the support of the compact
// kernels decided in T as in the forward, the Gaussian's exponent in double against T's cutoff.
template <class T>
Window<double> backward_window(const Backward<T>& p, index_t g, index_t i, Kernel kernel) {
  const T* ks = p.keys.k(g);
  if (kernel == Kernel::gaussian)
    return find_window<double>(ks, p.keys.m, static_cast<double>(p.query(g, i)), kernel, p.sigma, p.cutoff);
  const Window<T> w = find_window<T>(ks, p.keys.m, p.query(g, i), kernel, static_cast<T>(p.sigma), T(0));
  return {w.lo, w.hi, 0.0};
}

// Pass 1 for query row i of group g: its window, Z, c, dq_i and row_ds. scratch: 3 m doubles
// (K, g and d2 of the window, computed once).
template <Kernel K, class T>
void backward_row(const Backward<T>& p, index_t g, index_t i, double* scratch) {
  const index_t b = g / p.H, h = g % p.H, at = g * p.n + i;
  const Window<double> w = backward_window(p, g, i, K);
  const index_t len = w.hi - w.lo;
  double* Kw = scratch;
  double* gw = scratch + len;
  double* d2w = scratch + 2 * len;
  const T* ks = p.keys.k(g);
  const double q = p.query(g, i), s = p.sigma;
  double Z = 0;
  for (index_t j = 0; j < len; ++j) {
    const double d = q - static_cast<double>(ks[w.lo + j]);
    d2w[j] = d * d;
    Kw[j] = weight<K>(d2w[j], w.d2_min, s);
    Z += Kw[j];
  }
  p.Z[at] = Z, p.d2_min[at] = w.d2_min, p.lo[at] = w.lo, p.hi[at] = Z > 0 ? w.hi : w.lo;
  p.c[at] = 0, p.row_ds[at] = 0;
  T* dq = p.dq.empty() ? nullptr : p.dq.row(b, h, i);
  if (dq != nullptr) dq[0] = 0;
  if (!p.need_a || Z == 0) return;  // an empty row outputs a constant 0: no gradient
  const T* di = p.dout.row(b, h, i);
  double c = 0;
  for (index_t j = 0; j < len; ++j) {
    gw[j] = dot(di, p.keys.val(g, w.lo + j), p.keys.v);
    c += Kw[j] / Z * gw[j];
  }
  double dqi = 0, ds = 0;
  for (index_t j = 0; j < len; ++j) {
    const double b = scaled_coefficient<K>(Kw[j] / Z, d2w[j], Z, gw[j], c, s);
    dqi += b * (q - static_cast<double>(ks[w.lo + j]));
    ds += b * d2w[j];
  }
  p.c[at] = c, p.row_ds[at] = ds;
  if (dq != nullptr) dq[0] = static_cast<T>(divided_by_sigma(dqi, s, sigma_power(K)));
}

// Pass 2 for the sorted keys [j0, j1) of group g: dk and dv of those keys, written to the caller's
// rows. acc: (j1 - j0) (1 + v) doubles.
template <Kernel K, class T>
void backward_keys(const Backward<T>& p, index_t g, index_t j0, index_t j1, double* acc) {
  const index_t b = g / p.H, h = g % p.H, n = p.n, v = p.keys.v, count = j1 - j0;
  const bool do_dk = p.need_a && !p.dk.empty(), do_dv = !p.dv.empty();
  double* dk = acc;
  double* dv = acc + count;
  std::fill(acc, acc + count * (1 + v), 0.0);
  // Sorted positions [sa, sb) hold every query whose window meets [j0, j1): before sa every window
  // ends by j0, from sb on every window starts at j1 or later.
  const index_t* rh = p.reach_hi + g * n;
  const index_t* rl = p.reach_lo + g * n;
  const index_t sa = std::partition_point(rh, rh + n, [j0](index_t e) { return e <= j0; }) - rh;
  const index_t sb = std::partition_point(rl, rl + n, [j1](index_t e) { return e < j1; }) - rl;
  const T* ks = p.keys.k(g);
  const double s = p.sigma;
  for (index_t pos = sa; pos < sb; ++pos) {
    const index_t i = p.qperm[g * n + pos], at = g * n + i;
    const index_t lo = std::max(j0, p.lo[at]), hi = std::min(j1, p.hi[at]);
    if (lo >= hi) continue;
    const double q = p.query(g, i), Z = p.Z[at], c = p.c[at], d2_min = p.d2_min[at];
    const T* di = p.dout.row(b, h, i);
    for (index_t j = lo; j < hi; ++j) {
      const double k = ks[j], d = q - k, d2 = d * d;
      const double Kv = weight<K>(d2, d2_min, s);
      if (do_dv) {  // dv_j += w_ij dout_i
        const double w = Kv / Z;
        double* dvj = dv + (j - j0) * v;
        for (index_t x = 0; x < v; ++x) dvj[x] += w * di[x];
      }
      if (do_dk)  // dk_j -= a_ij (q_i - k_j)
        dk[j - j0] += scaled_coefficient<K>(Kv / Z, d2, Z, dot(di, p.keys.val(g, j), v), c, s) * (k - q);
    }
  }
  for (index_t j = j0; j < j1; ++j) {
    const index_t row = p.keys.perm[g * p.keys.m + j];
    if (do_dk) p.dk.at(b, h, row, 0) = static_cast<T>(divided_by_sigma(dk[j - j0], p.sigma, sigma_power(K)));
    if (do_dv)
      for (index_t x = 0; x < v; ++x) p.dv.at(b, h, row, x) = static_cast<T>(dv[(j - j0) * v + x]);
  }
}

}  // namespace

bool applies(index_t p, Kernel kernel) {
  return p == 1 && (kernel == Kernel::gaussian || kernel == Kernel::boxcar || kernel == Kernel::epanechnikov);
}

template <class T>
double gaussian_cutoff(index_t m) {
  return std::log(4.0 * static_cast<double>(std::max<index_t>(m, 1)) / std::numeric_limits<T>::epsilon());
}

// out (B, H, n, v): tasks of kChunk queries of one group, each query over its window.
template <class T>
bool nw_forward(View4<T> out, View4<const T> queries, View4<const T> keys, View4<const T> values, Kernel kernel,
                T sigma) {
  if (!windowable(queries, keys, kernel)) return false;
  const simd::Target target = simd::current();
  const index_t H = queries.H, G = queries.B * H, n = queries.R, m = keys.R, v = values.C;
  Scratch<SortedKeys<T>> sorted(G, m, v);
  const SortedKeys<T>& s = *sorted;
  sorted->fill(keys, values);
  const T cutoff = static_cast<T>(gaussian_cutoff<T>(m));
  const index_t chunks = (n + kChunk - 1) / kChunk, tasks = G * chunks;
  const auto acc_count = static_cast<std::size_t>(v);
  with_kernel(kernel, [&]<Kernel K>() {
    run_tasks(tasks, layout_bytes<WorkDoubles>(acc_count), worth_threads(G * n, m, v), [&](index_t t, void* work) {
      double* acc = WorkDoubles::in(work, acc_count);
      const index_t g = t / chunks, b = g / H, h = g % H, i0 = t % chunks * kChunk;
      for (index_t i = i0; i < std::min(n, i0 + kChunk); ++i) {
        const T q = queries.at(b, h, i, 0);
        const Window<T> w = find_window<T>(s.k(g), m, q, K, sigma, cutoff);
        forward_row<K>(out.row(b, h, i), acc, q, w, s, g, sigma, target);
      }
    });
  });
  return true;
}

// dq (B, H, n, 1), dk (B, H, m, 1), dv (B, H, m, v), *dsigma: pass 1 over chunks of sorted queries,
// the reach arrays per group, pass 2 over chunks of sorted keys (see the top of this file).
template <class T>
bool nw_backward(View4<T> dqueries, View4<T> dkeys, View4<T> dvalues, T* dsigma, View4<const T> dout,
                 View4<const T> queries, View4<const T> keys, View4<const T> values, Kernel kernel, T sigma) {
  if (!windowable(queries, keys, kernel)) return false;
  const index_t H = queries.H, G = queries.B * H, n = queries.R, m = keys.R, v = values.C;
  const bool need_a = kernel != Kernel::boxcar && (!dqueries.empty() || !dkeys.empty() || dsigma != nullptr);
  if (!need_a) {  // only dvalues can be non-zero (the boxcar's weights are piecewise constant)
    fill_zero(dqueries), fill_zero(dkeys);
    if (dsigma != nullptr) *dsigma = 0;
    if (dvalues.empty()) return true;
  }
  const auto gn = static_cast<std::size_t>(G * n);
  Scratch<BackwardArrays<T>> arrays(G, n, m, v);
  Backward<T> p(*arrays);
  p.dq = dqueries, p.dk = dkeys, p.dv = dvalues, p.dout = dout, p.q = queries;
  p.sigma = sigma, p.cutoff = gaussian_cutoff<T>(m), p.need_a = need_a, p.G = G, p.H = H, p.n = n;
  p.keys.fill(keys, values);
  const index_t q_chunks = (n + kChunk - 1) / kChunk, k_chunks = (m + kChunk - 1) / kChunk;
  const bool parallel = G * std::max(q_chunks, k_chunks) > 1 && worth_threads(G * n, m, v);
  const auto work_count = static_cast<std::size_t>(std::max(3 * m, kChunk * (1 + v)));
  with_kernel(kernel, [&]<Kernel K>() {
    // Queries in ascending order per group, so that pass 2 finds a key chunk's queries together.
    const auto sort_queries = [&](index_t g, void*) {
      argsort(p.qperm + g * n, n, [&](index_t i) { return p.query(g, i); });
    };
    // Pass 1: chunks of sorted queries.
    const auto pass1 = [&](index_t t, void* work) {
      double* w = WorkDoubles::in(work, work_count);
      const index_t g = t / q_chunks, s0 = t % q_chunks * kChunk;
      for (index_t pos = s0; pos < std::min(n, s0 + kChunk); ++pos) backward_row<K>(p, g, p.qperm[g * n + pos], w);
    };
    // The reach arrays: running max of the windows' ends, running min of their starts from the end.
    const auto reach = [&](index_t g, void*) {
      index_t top = 0, bottom = m;
      for (index_t pos = 0; pos < n; ++pos) {
        const index_t at = g * n + p.qperm[g * n + pos];
        top = std::max(top, p.hi[at] > p.lo[at] ? p.hi[at] : 0);
        p.reach_hi[g * n + pos] = top;
      }
      for (index_t pos = n - 1; pos >= 0; --pos) {
        const index_t at = g * n + p.qperm[g * n + pos];
        bottom = std::min(bottom, p.hi[at] > p.lo[at] ? p.lo[at] : m);
        p.reach_lo[g * n + pos] = bottom;
      }
    };
    // Pass 2: chunks of sorted keys.
    const auto pass2 = [&](index_t t, void* work) {
      double* w = WorkDoubles::in(work, work_count);
      const index_t g = t / k_chunks, j0 = t % k_chunks * kChunk;
      backward_keys<K>(p, g, j0, std::min(m, j0 + kChunk), w);
    };
    run_phases(layout_bytes<WorkDoubles>(work_count), parallel, dynamic_phase(G, sort_queries),
               dynamic_phase(G * q_chunks, pass1), static_phase(G, reach),
               dynamic_phase(!dkeys.empty() || !dvalues.empty() ? G * k_chunks : 0, pass2));
  });
  if (need_a && dsigma != nullptr) {
    double s = 0;  // in row order: the same sum for any thread count
    for (std::size_t r = 0; r < gn; ++r) s -= p.row_ds[r];  // s -= r: +0, not -0, when every row is 0
    *dsigma = static_cast<T>(divided_by_sigma(s, sigma, sigma_power(kernel) + 1));
  }
  return true;
}

template <class T>
double visited_pairs(View4<const T> queries, View4<const T> keys, Kernel kernel, T sigma) {
  if (!windowable(queries, keys, kernel)) return -1;
  const index_t H = queries.H, G = queries.B * H, n = queries.R, m = keys.R;
  Scratch<SortedKeys<T>> sorted(G, m, index_t(0));
  const SortedKeys<T>& s = *sorted;
  sorted->fill(keys, View4<const T>{keys.data, keys.B, keys.H, keys.R, 0, keys.sB, keys.sH, keys.sR});
  const T cutoff = static_cast<T>(gaussian_cutoff<T>(m));
  double pairs = 0;
  for (index_t g = 0; g < G; ++g)
    for (index_t i = 0; i < n; ++i) {
      const Window<T> w = find_window<T>(s.k(g), m, queries.at(g / H, g % H, i, 0), kernel, sigma, cutoff);
      pairs += static_cast<double>(w.hi - w.lo);
    }
  return pairs;
}

}  // namespace windowed

// The cpu backend's entry points (core/kernels.inc): the windowed path where it applies (and the
// call's backend, pinned by its dispatch, is not Backend::unfused), else dense.
template <class T>
void nw_forward(View4<T> out, View4<T> weights, View4<const T> queries, View4<const T> keys, View4<const T> values,
                Kernel kernel, T sigma) {
  if (weights.empty() && detail::read_switches().backend != Backend::unfused &&
      windowed::nw_forward<T>(out, queries, keys, values, kernel, sigma))
    return;
  dense::nw_forward<T>(out, weights, queries, keys, values, kernel, sigma);
}

template <class T>
void nw_backward(View4<T> dqueries, View4<T> dkeys, View4<T> dvalues, T* dsigma, View4<const T> dout,
                 View4<const T> queries, View4<const T> keys, View4<const T> values, Kernel kernel, T sigma) {
  if (detail::read_switches().backend != Backend::unfused &&
      windowed::nw_backward<T>(dqueries, dkeys, dvalues, dsigma, dout, queries, keys, values, kernel, sigma))
    return;
  dense::nw_backward<T>(dqueries, dkeys, dvalues, dsigma, dout, queries, keys, values, kernel, sigma);
}

// core/kernels.inc's nw kernels, for float and double.
ATTN_KERNELS_NW(ATTN_INSTANTIATE_KERNEL)
// The windowed path's estimates (cpu/nw_windowed.hpp).
#define ATTN_INSTANTIATE(T)                              \
  template double windowed::gaussian_cutoff<T>(index_t); \
  template double windowed::visited_pairs<T>(View4<const T>, View4<const T>, Kernel, T);
ATTN_INSTANTIATE(float)
ATTN_INSTANTIATE(double)
#undef ATTN_INSTANTIATE

}  // namespace attn::cpu
