// The reference kernels: plain loops written straight from the formulas, single-threaded, in the
// precision of T (float64 makes them the tests' oracle; float32 gives the same-precision error that
// sets the tests' error budget). They take canonical views (core/view4.hpp) and trust them: every
// argument was validated in src/api.
#pragma once

#include "attn/nadaraya_watson.hpp"
#include "core/dropout_plan.hpp"
#include "core/mask_plan.hpp"
#include "core/sdpa_plan.hpp"
#include "core/view4.hpp"

namespace attn::ref {

#include "core/kernels.inc"  // IWYU pragma: export

}  // namespace attn::ref
