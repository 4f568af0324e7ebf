// The production kernels of the cpu backend: the unfused path (scores, softmax and weighted sum as
// separate threaded passes over an (n, m) buffer), threaded with OpenMP over rows. Same contracts as
// the reference kernels in ref/ref.hpp, tested against them. Arguments were validated in src/api.
#pragma once

#include "attn/nadaraya_watson.hpp"
#include "core/dropout_plan.hpp"
#include "core/mask_plan.hpp"
#include "core/sdpa_plan.hpp"
#include "core/view4.hpp"

namespace attn::cpu {

#include "core/kernels.inc"  // IWYU pragma: export

}  // namespace attn::cpu
