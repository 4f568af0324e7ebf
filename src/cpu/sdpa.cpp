// cpu backend, scaled dot-product attention: the fused kernels (cpu/simd) unless the caller asks for
// the (n, m) weights, which only the unfused path (cpu/unfused.hpp) forms.
#include <algorithm>

#include "cpu/cpu.hpp"
#include "cpu/scratch.hpp"
#include "cpu/simd/fused.hpp"
#include "cpu/unfused.hpp"

namespace attn::cpu {

// Forward: blocks of kBlockQ queries of one (b, h), dynamically scheduled because causal blocks
// differ in cost. Every row is computed by one block in a fixed key order, so results do not depend
// on the thread count.
template <class T>
void sdpa_forward(View4<T> out, View4<T> lse, View4<T> weights, View4<const T> queries, View4<const T> keys,
                  View4<const T> values, const MaskPlan<T>& mask, T scale, const DropoutPlan& dropout) {
  if (!weights.empty() || keys.R > fused::kMaxKeys)
    return unfused::sdpa_forward<T>(out, lse, weights, queries, keys, values, mask, scale, dropout);
  fused::init_simd_target();
  const fused::SdpaForward<T> p{out, lse, queries, keys, values, &mask, scale, &dropout};
  const index_t B = queries.B, H = queries.H, n = queries.R;
  const index_t blocks = (n + fused::kBlockQ - 1) / fused::kBlockQ;
  const index_t tasks = B * H * blocks;
  const std::size_t work = fused::sdpa_forward_work_bytes<T>(queries.C, values.C);
#pragma omp parallel if (tasks > 1)
  {
    Scratch scratch(work);
    void* w = scratch.take<unsigned char>(work);
#pragma omp for schedule(dynamic, 1)
    for (index_t t = 0; t < tasks; ++t) {
      const index_t bh = t / blocks;
      fused::sdpa_forward_block<T>(p, bh / H, bh % H, (t % blocks) * fused::kBlockQ, w);
    }
  }
}

template <class T>
void sdpa_backward(View4<T> dqueries, View4<T> dkeys, View4<T> dvalues, View4<const T> dout,
                   View4<const T> queries, View4<const T> keys, View4<const T> values, View4<const T> out,
                   View4<const T> lse, const MaskPlan<T>& mask, T scale, const DropoutPlan& dropout) {
  unfused::sdpa_backward<T>(dqueries, dkeys, dvalues, dout, queries, keys, values, out, lse, mask, scale, dropout);
}

#define ATTN_INSTANTIATE(T)                                                                                         \
  template void sdpa_forward(View4<T>, View4<T>, View4<T>, View4<const T>, View4<const T>, View4<const T>,          \
                             const MaskPlan<T>&, T, const DropoutPlan&);                                           \
  template void sdpa_backward(View4<T>, View4<T>, View4<T>, View4<const T>, View4<const T>, View4<const T>,         \
                              View4<const T>, View4<const T>, View4<const T>, const MaskPlan<T>&, T, const DropoutPlan&);
ATTN_INSTANTIATE(float)
ATTN_INSTANTIATE(double)
#undef ATTN_INSTANTIATE

}  // namespace attn::cpu
