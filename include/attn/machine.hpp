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

// Reads `count` floats from x once, split over the threads as read_bandwidth does, and returns their
// sum: the plain read a memory-bound kernel is timed against, in turn with it and over as many
// bytes, so that both see the same moments of a shared machine (read_bandwidth's best of a few runs
// may land in a quiet one that the kernel's median never sees).
float read_once(const float* x, std::size_t count);

// The scratch memory attn's threads hold between calls (each thread keeps an arena that grows to
// the largest call it ran, so that calls allocate nothing): the bytes of every thread's arena.
std::size_t scratch_bytes();

// Frees the calling thread's arena (run it inside `#pragma omp parallel` to free every thread's).
// Call it only between attn calls of that thread; scratch_bytes() afterwards counts what the next
// calls need, which is how `attn bench` reports each case's extra memory.
void release_scratch();

}  // namespace attn::machine
