// The cpu backend's unfused scaled dot-product attention (sdpa_unfused.cpp) and additive attention
// (additive_unfused.cpp): scores, softmax and pooling as separate threaded passes over an (n, m)
// buffer. Same contracts as cpu::sdpa_forward, cpu::sdpa_backward, cpu::additive_forward and
// cpu::additive_backward (core/kernels.inc). They serve the calls that ask for the weights, and are
// the baseline `attn bench` reports the fused kernels against.
#pragma once

#include "cpu/cpu.hpp"

namespace attn::cpu::unfused {

ATTN_KERNELS_SDPA(ATTN_DECLARE_KERNEL)      // sdpa_forward, sdpa_backward
ATTN_KERNELS_ADDITIVE(ATTN_DECLARE_KERNEL)  // additive_forward, additive_backward

}  // namespace attn::cpu::unfused

// ---- dense Nadaraya-Watson pooling (nadaraya_watson.cpp) ----------------------------------------
// Every (query, key) pair, through (n, m) buffers in the backward. Same contract as cpu::nw_forward
// and cpu::nw_backward (core/kernels.inc), which use it wherever the windowed path
// (cpu/nw_windowed.hpp) does not apply; `attn bench` times the windowed path against it.
namespace attn::cpu::dense {

ATTN_KERNELS_NW(ATTN_DECLARE_KERNEL)  // nw_forward, nw_backward

}  // namespace attn::cpu::dense
