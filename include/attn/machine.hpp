// What this machine can do, and what attn holds on to: the figures `attn bench` reports its kernels
// against, public so that any benchmark of attn can report the same.
//
// The probes run with the SIMD target the kernels use (simd_target in attn/config.hpp) and the
// current number of threads (set_num_threads); each takes a fraction of a second.
#pragma once

#include <cstddef>

namespace attn::machine {

// FLOP/s (an FMA counts 2) of independent FMA chains in registers on every thread, best of a few runs:
// the roof a compute-bound kernel's GFLOP/s is a fraction of.
double fma_peak_flops();

// Bytes/s read from a buffer of `bytes` (well past the last-level cache: 512 MiB is safe), split
// over the threads, best of a few runs after the pages were touched once: the roof of a kernel
// bound by memory, such as decoding from a KV cache.
double read_bandwidth(std::size_t bytes);

// Frees the calling thread's scratch arena: each of attn's threads keeps one that grows to the
// largest call it ran, so that calls allocate nothing (run it inside `#pragma omp parallel` to free
// every thread's). Call it only between attn calls of that thread. memory_in_use (attn/memory.hpp)
// counts the arenas; the probes `attn bench` reports memory with (read_once, scratch_bytes) are in
// attn/diagnostics.hpp.
void release_scratch();

}  // namespace attn::machine
