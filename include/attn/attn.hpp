// attn: attention scoring functions. The whole public API: every public header is included here
// or, where it cannot be, listed below. Each header's functions are in one of the libraries of the
// CMake package (cmake/attnConfig.cmake.in) and of pkg-config; a program links those it calls.
// Every header included here needs only the C++20 standard library.
#pragma once

// attn::attn (libattn.a, pkg-config attn): the kernels, their switches and the types they take.
#include "attn/additive.hpp"
#include "attn/bilinear.hpp"
#include "attn/bmm.hpp"
#include "attn/config.hpp"
#include "attn/dropout.hpp"
#include "attn/error.hpp"
#include "attn/flash.hpp"
#include "attn/flex.hpp"
#include "attn/half.hpp"
#include "attn/kv_cache.hpp"
#include "attn/machine.hpp"
#include "attn/mask.hpp"
#include "attn/memory.hpp"
#include "attn/multi_head.hpp"
#include "attn/nadaraya_watson.hpp"
#include "attn/rotary.hpp"
#include "attn/sdpa.hpp"
#include "attn/softmax.hpp"
#include "attn/tensor.hpp"
#include "attn/varlen.hpp"
#include "attn/version.hpp"

// attn::io (libattn_io.a, pkg-config attn-io; links libpng and FreeType): .npy files and pictures.
#include "attn/npy.hpp"
#include "attn/plot.hpp"

// attn::train (libattn_train.a, pkg-config attn-train): optimizers, training, width selection.
#include "attn/optim.hpp"
#include "attn/train.hpp"
#include "attn/kernel_regression.hpp"
#include "attn/width_selection.hpp"

// Not included:
//   attn/distributed.hpp  attn::distributed (libattn_distributed.a, where attn was built with MPI):
//                         ring and all-to-all attention across MPI ranks; includes mpi.h.
//   attn/diagnostics.hpp  probes for attn's tests and `attn bench` (in libattn.a): not part of the
//                         API and not stable; a program that wants attention needs none of it.
