// Public masked softmax: argument checks, then the kernel of the current backend.
#include "attn/softmax.hpp"

#include "api/checks.hpp"
#include "cpu/cpu.hpp"
#include "ref/ref.hpp"

namespace attn {
namespace {

// The very same view as an input: the op then works in place, row by row.
template <class T>
bool same_view(const TensorView<T>& out, const TensorView<const T>& in) {
  if (static_cast<const void*>(out.data()) != static_cast<const void*>(in.data()) || out.rank() != in.rank()) return false;
  for (int i = 0; i < out.rank(); ++i)
    if (out.dim(i) != in.dim(i) || out.stride(i) != in.stride(i)) return false;
  return true;
}

}  // namespace

template <class T>
void masked_softmax_forward(TensorView<T> weights, TensorView<const T> scores, const Mask<T>& mask) {
  const char* op = "masked_softmax_forward";
  const View4<const T> s = detail::require_tensor(scores, op, "scores", 0);
  const View4<T> w = detail::require_tensor(weights, op, "weights", scores.rank(), "scores");
  detail::require_shape(weights, {scores.shape().begin(), scores.shape().end()}, op, "weights",
                        "the same shape as scores");
  // In place (weights the very view of scores), or memory of its own.
  detail::require_no_aliasing<T>(op, {{"weights", weights}},
                                 {{"scores", same_view(weights, scores) ? TensorView<const T>{} : scores}});
  detail::refuse_sinks(mask, op);
  const MaskPlan<T> plan = plan_mask(mask, s.B, s.H, s.R, s.C, scores.rank(), op);
  ATTN_DISPATCH_ON(plan.switches, masked_softmax_forward<T>, w, s, plan);
}

template <class T>
void masked_softmax_backward(TensorView<T> dscores, TensorView<const T> dweights, TensorView<const T> weights,
                             const Mask<T>& mask) {
  const char* op = "masked_softmax_backward";
  const View4<const T> w = detail::require_tensor(weights, op, "weights", 0);
  const std::vector<index_t> shape(weights.shape().begin(), weights.shape().end());
  const View4<const T> dw = detail::require_tensor(dweights, op, "dweights", weights.rank(), "weights");
  detail::require_shape(dweights, shape, op, "dweights", "the same shape as weights");
  const View4<T> ds = detail::require_tensor(dscores, op, "dscores", weights.rank(), "weights");
  detail::require_shape(dscores, shape, op, "dscores", "the same shape as weights");
  // In place over dweights (the very same view), or memory of its own.
  detail::require_no_aliasing<T>(
      op, {{"dscores", dscores}},
      {{"dweights", same_view(dscores, dweights) ? TensorView<const T>{} : dweights}, {"weights", weights}});
  detail::refuse_sinks(mask, op);
  const MaskPlan<T> plan = plan_mask(mask, w.B, w.H, w.R, w.C, weights.rank(), op);
  ATTN_DISPATCH_ON(plan.switches, masked_softmax_backward<T>, ds, dw, w, plan);
}

template <class T>
Tensor<T> masked_softmax(TensorView<const T> scores, const Mask<T>& mask) {
  if (scores.empty()) detail::fail("masked_softmax: scores is required but was not given");
  Tensor<T> weights(scores.shape());
  masked_softmax_forward<T>(weights.view(), scores, mask);
  return weights;
}

#define ATTN_INSTANTIATE(T)                                                                                  \
  template void masked_softmax_forward(TensorView<T>, TensorView<const T>, const Mask<T>&);                  \
  template void masked_softmax_backward(TensorView<T>, TensorView<const T>, TensorView<const T>, const Mask<T>&); \
  template Tensor<T> masked_softmax(TensorView<const T>, const Mask<T>&);
ATTN_INSTANTIATE(float)
ATTN_INSTANTIATE(double)
#undef ATTN_INSTANTIATE

}  // namespace attn
