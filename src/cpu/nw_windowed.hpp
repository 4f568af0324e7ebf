// The windowed Nadaraya-Watson path of the cpu backend (nadaraya_watson_windowed.cpp): for 1-D keys
// (p == 1) and the kernels whose weights vanish, or become negligible, away from a query (boxcar,
// Epanechnikov, and the Gaussian truncated at the error stated there), each query visits only the
// window of sorted keys that can carry weight: cost (n + m) log m plus the pairs visited, instead of
// n m. cpu::nw_forward / nw_backward take it when it applies and the dense path otherwise.
#pragma once

#include "cpu/cpu.hpp"

namespace attn::cpu::windowed {

// Whether the windowed path serves a call of this shape and kernel: p == 1 and a kernel other than
// the constant one (whose every key counts). A call that asks for the (n, m) weights goes dense too,
// and so does one whose queries or keys hold a value that is not finite (checked by the kernels).
bool applies(index_t p, Kernel kernel);

// The exponent A of the truncated Gaussian for m keys in precision T: a key whose
// a = ((q - k)^2 - d2_min) / sigma^2 / 2 exceeds A is dropped. A = ln(4 m / eps(T)).
template <class T>
double gaussian_cutoff(index_t m);

// Same contracts as cpu::nw_forward (without weights) and cpu::nw_backward. Each returns false,
// having written nothing, when applies() is false, queries or keys hold a non-finite value, or a
// squared distance may overflow T (|q| + |k| past sqrt(max) / 2); the caller then takes the dense path.
template <class T>
bool nw_forward(View4<T> out, View4<const T> queries, View4<const T> keys, View4<const T> values, Kernel kernel,
                T sigma);
template <class T>
bool nw_backward(View4<T> dqueries, View4<T> dkeys, View4<T> dvalues, T* dsigma, View4<const T> dout,
                 View4<const T> queries, View4<const T> keys, View4<const T> values, Kernel kernel, T sigma);

// The (query, key) pairs the windowed forward visits for these inputs (the sum of its window sizes),
// or -1 where it would not apply. For tests and `attn bench`: counted with the forward's own window
// search, without computing any weight.
template <class T>
double visited_pairs(View4<const T> queries, View4<const T> keys, Kernel kernel, T sigma);

}  // namespace attn::cpu::windowed
