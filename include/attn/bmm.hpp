// Batched matrix multiplication: torch.bmm, with the transposes of MXNet's batch_dot.
#pragma once

#include "attn/tensor.hpp"

namespace attn {

// out[b] = op(a[b]) @ op(b[b]), op = transpose when the flag is set. Batch dims: (B,) or (B, H).
//   a (B, r, k) or, transposed, (B, k, r); b (B, k, c) or, transposed, (B, c, k); out (B, r, c).
// 4-D inputs (B, H, ., .) work the same way per (b, h).
template <class T>
void bmm_forward(TensorView<T> out, TensorView<const T> a, TensorView<const T> b, bool transpose_a = false,
                 bool transpose_b = false);

// Gradients of bmm_forward: da = dout @ op(b)^T (laid out like a), db = op(a)^T @ dout (laid out
// like b). Either output may be empty when not needed.
template <class T>
void bmm_backward(TensorView<T> da, TensorView<T> db, TensorView<const T> dout, TensorView<const T> a,
                  TensorView<const T> b, bool transpose_a = false, bool transpose_b = false);

// Convenience: returns a new tensor.
template <class T>
Tensor<T> bmm(TensorView<const T> a, TensorView<const T> b, bool transpose_a = false, bool transpose_b = false);

}  // namespace attn
