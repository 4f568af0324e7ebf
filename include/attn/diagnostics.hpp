// attn's diagnostics: probes into what the library did, for its tests and for `attn bench`.
//
// NOT STABLE. Nothing in this header is part of attn's API: any of it may change or go in any
// release, a patch release included, with no deprecation. A program that wants attention calls
// needs none of it (attn/attn.hpp does not include it). It is installed, and linked through
// attn::attn, so that attn's own front ends (the `attn` command line, the Python module) and its
// tests use it as any program could, without reaching into the library's internals.
//
// The baseline backend. Backend::unfused (attn/config.hpp) is a diagnostic too: the cpu backend
// with its fused kernels left out, so that scores, softmax and pooling run as separate threaded
// passes over an (n, m) buffer (the path that calls asking for the weights take anyway). It is the
// baseline `attn bench` measures the fused kernels against and a second opinion for the tests; it is
// never faster and uses (n, m) memory. set_backend(Backend::unfused), ScopedBackend or
// ATTN_BACKEND=unfused select it; it stays in the Backend enumeration so that every switch reads one
// value, and it is as unstable as the rest of this header.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "attn/config.hpp"
#include "attn/nadaraya_watson.hpp"
#include "attn/tensor.hpp"

namespace attn {

// The SIMD targets the fused kernels actually ran on, on any thread, since the last call with
// reset = true (best first, names as simd_targets() gives them; empty if none ran): recorded by the
// kernels themselves, so that a test or a benchmark shows which code ran, not only which was chosen.
std::vector<std::string> simd_targets_ran(bool reset = false);

// The (query, key) pairs the cpu backend's windowed Nadaraya-Watson path (1-D keys,
// attn/nadaraya_watson.hpp) visits for these inputs: the work `attn bench` counts for that path. -1
// where the path does not apply (keys of more than one dimension, the constant kernel). Counted by
// the forward's own window search, computing no weight.
template <class T>
double nadaraya_watson_visited_pairs(TensorView<const T> queries, TensorView<const T> keys, Kernel kernel, T sigma);

namespace machine {

// Reads `count` floats from x once, split over the threads as machine::read_bandwidth
// (attn/machine.hpp) does, and returns their sum: the plain read a memory-bound kernel is timed
// against, in turn with it and over as many bytes, so that both see the same moments of a shared
// machine (read_bandwidth's best of a few runs may land in a quiet one the kernel's median never sees).
float read_once(const float* x, std::size_t count);

// The scratch memory attn's threads hold between calls (each thread keeps an arena that grows to
// the largest call it ran, so that calls allocate nothing): the bytes of every thread's arena. After
// machine::release_scratch (attn/machine.hpp) on every thread, what the next calls need: how
// `attn bench` reports each case's extra memory.
std::size_t scratch_bytes();

}  // namespace machine
}  // namespace attn
