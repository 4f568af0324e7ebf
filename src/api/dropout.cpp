#include "attn/dropout.hpp"

#include "core/dropout_plan.hpp"
#include "core/view4.hpp"

namespace attn {

void dropout_keep_mask(TensorView<bool> keep, const Dropout& dropout) {
  const View4<bool> k = detail::to_view4(keep, "dropout_keep_mask", "keep");
  if (k.empty()) detail::fail("dropout_keep_mask: keep must be given");
  const DropoutPlan plan = plan_dropout(dropout, "dropout_keep_mask", k.H, /*offsets=*/true);
#pragma omp parallel for collapse(2) schedule(static)
  for (index_t b = 0; b < k.B; ++b)
    for (index_t h = 0; h < k.H; ++h)
      for (index_t i = 0; i < k.R; ++i)
        for (index_t j = 0; j < k.C; ++j) k.at(b, h, i, j) = plan.keep(b * k.H + h, i, j);
}

}  // namespace attn
