// The inner loop of the windowed Nadaraya-Watson forward (cpu/nadaraya_watson_windowed.cpp) for
// scalar values (v = 1, the d2l chapter's regression), written once with Google Highway and compiled for
// every SIMD target (see fused.hpp): one query against a contiguous run of sorted 1-D keys.
#pragma once

#include "attn/nadaraya_watson.hpp"
#include "core/view4.hpp"
#include "cpu/simd/dispatch.hpp"

namespace attn::cpu::fused {

// Z = sum_j K_j and S = sum_j K_j vals[j] over j < count, with K_j the kernel of key ks[j] for query q
// in precision T by the dense path's expressions (Gaussian exp(-((d2 - d2_min) / sigma / sigma) / 2)
// with Highway's exp, at most 1 ulp from the exact value; Epanechnikov max(0, 1 - sqrt(d2) / sigma);
// boxcar 1). The sums are kept in double, lane by lane, then added in a fixed order: the result
// depends on the SIMD target, never on the thread count.
struct WindowSums {
  double Z = 0, S = 0;
};
// On the SIMD target `simd`.
template <class T>
WindowSums nw_window_sums(const T* ks, const T* vals, index_t count, T q, T d2_min, T sigma, Kernel kernel,
                          simd::Target simd);

}  // namespace attn::cpu::fused
