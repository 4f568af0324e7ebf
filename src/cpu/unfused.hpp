// The cpu backend's unfused scaled dot-product attention (sdpa_unfused.cpp) and additive attention
// (additive_unfused.cpp): scores, softmax and pooling as separate threaded passes over an (n, m)
// buffer. Same contracts as cpu::sdpa_forward, cpu::sdpa_backward, cpu::additive_forward and
// cpu::additive_backward (core/kernels.inc). They serve the calls that ask for the weights, and are
// the baseline `attn bench` reports the fused kernels against.
#pragma once

#include "cpu/cpu.hpp"

namespace attn::cpu::unfused {

template <class T>
void sdpa_forward(View4<T> out, View4<T> lse, View4<T> weights, const SdpaPlan<T>& plan);
template <class T>
void sdpa_backward(View4<T> dqueries, View4<T> dkeys, View4<T> dvalues, View4<const T> dout, View4<const T> out,
                   View4<const T> lse, const SdpaPlan<T>& plan);

template <class T>
void additive_forward(View4<T> out, View4<T> weights, View4<const T> queries, View4<const T> keys,
                      View4<const T> values, View4<const T> w_q, View4<const T> w_k, View4<const T> w_v,
                      const MaskPlan<T>& mask, const DropoutPlan& dropout);
template <class T>
void additive_backward(View4<T> dqueries, View4<T> dkeys, View4<T> dvalues, View4<T> dw_q, View4<T> dw_k,
                       View4<T> dw_v, View4<const T> dout, View4<const T> queries, View4<const T> keys,
                       View4<const T> values, View4<const T> w_q, View4<const T> w_k, View4<const T> w_v,
                       const MaskPlan<T>& mask, const DropoutPlan& dropout);

}  // namespace attn::cpu::unfused

// ---- dense Nadaraya-Watson pooling (nadaraya_watson.cpp) ----------------------------------------
// Every (query, key) pair, through (n, m) buffers in the backward. Same contract as cpu::nw_forward
// and cpu::nw_backward (core/kernels.inc), which use it wherever the windowed path
// (cpu/nw_windowed.hpp) does not apply; `attn bench` times the windowed path against it.
namespace attn::cpu::dense {

template <class T>
void nw_forward(View4<T> out, View4<T> weights, View4<const T> queries, View4<const T> keys, View4<const T> values,
                Kernel kernel, T sigma);
template <class T>
void nw_backward(View4<T> dqueries, View4<T> dkeys, View4<T> dvalues, T* dsigma, View4<const T> dout,
                 View4<const T> queries, View4<const T> keys, View4<const T> values, Kernel kernel, T sigma);

}  // namespace attn::cpu::dense
