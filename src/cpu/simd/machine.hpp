// What this machine can do, measured, for `attn bench` to report its kernels against: the peak rate
// of fused multiply-adds and the rate of streaming reads from memory, both with the SIMD target the
// kernels use (simd_target in attn/config.hpp) and the current number of OpenMP threads.
#pragma once

#include <cstddef>

namespace attn::cpu::machine {

// FLOP/s (an FMA counts 2) of independent FMA chains in registers on every thread, best of a few runs.
double fma_peak_flops();

// Bytes/s read from a buffer of `bytes` (well past the last-level cache), split over the threads,
// best of a few runs after the pages were touched once.
double read_bandwidth(std::size_t bytes);

}  // namespace attn::cpu::machine
