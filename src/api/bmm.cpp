// Public batched matrix multiplication: argument checks, then the kernel of the current backend.
#include "attn/bmm.hpp"

#include "api/checks.hpp"
#include "cpu/cpu.hpp"
#include "ref/ref.hpp"

namespace attn {
namespace {

// The checked sizes of out = op(a) @ op(b): batch (B, H), rows, inner and columns.
struct BmmSizes {
  index_t B, H, rows, inner, cols;
  int rank;
};

template <class T>
BmmSizes check_bmm(const TensorView<const T>& a, const TensorView<const T>& b, bool transpose_a, bool transpose_b,
                   const char* op) {
  const View4<const T> av = detail::require_tensor(a, op, "a", 0);
  const View4<const T> bv = detail::require_tensor(b, op, "b", a.rank(), "a");
  if (av.B != bv.B || av.H != bv.H)
    detail::fail(op, ": a has shape ", a.shape_string(), " and b has shape ", b.shape_string(),
                 "; their batch dimensions must match");
  const index_t a_inner = transpose_a ? av.R : av.C, b_inner = transpose_b ? bv.C : bv.R;
  if (a_inner != b_inner)
    detail::fail(op, ": a has shape ", a.shape_string(), (transpose_a ? " (transposed)" : ""), " and b has shape ",
                 b.shape_string(), (transpose_b ? " (transposed)" : ""), "; the inner dimensions ", a_inner, " and ",
                 b_inner, " must match");
  return {av.B, av.H, transpose_a ? av.C : av.R, a_inner, transpose_b ? bv.R : bv.C, a.rank()};
}

}  // namespace

template <class T>
void bmm_forward(TensorView<T> out, TensorView<const T> a, TensorView<const T> b, bool transpose_a, bool transpose_b) {
  const char* op = "bmm_forward";
  const BmmSizes z = check_bmm(a, b, transpose_a, transpose_b, op);
  const View4<T> o = detail::require_tensor(out, op, "out", z.rank, "a");
  detail::require_shape(out, detail::caller_dims(z.rank, z.B, z.H, z.rows, z.cols), op, "out",
                        "the batch of a and b, the rows of op(a) and the columns of op(b)");
  detail::require_no_aliasing<T>(op, {{"out", out}}, {{"a", a}, {"b", b}});
  ATTN_DISPATCH(bmm_forward<T>, o, detail::to_view4(a, op, "a"), detail::to_view4(b, op, "b"), transpose_a,
                transpose_b);
}

template <class T>
void bmm_backward(TensorView<T> da, TensorView<T> db, TensorView<const T> dout, TensorView<const T> a,
                  TensorView<const T> b, bool transpose_a, bool transpose_b) {
  const char* op = "bmm_backward";
  const BmmSizes z = check_bmm(a, b, transpose_a, transpose_b, op);
  const View4<const T> g = detail::require_tensor(dout, op, "dout", z.rank, "a");
  detail::require_shape(dout, detail::caller_dims(z.rank, z.B, z.H, z.rows, z.cols), op, "dout",
                        "the shape of bmm_forward's out");
  const View4<T> dav = detail::optional_tensor(da, op, "da", z.rank, "a");
  const View4<T> dbv = detail::optional_tensor(db, op, "db", z.rank, "a");
  if (!da.empty()) detail::require_shape(da, {a.shape().begin(), a.shape().end()}, op, "da", "the shape of a");
  if (!db.empty()) detail::require_shape(db, {b.shape().begin(), b.shape().end()}, op, "db", "the shape of b");
  detail::require_no_aliasing<T>(op, {{"da", da}, {"db", db}}, {{"dout", dout}, {"a", a}, {"b", b}});
  ATTN_DISPATCH(bmm_backward<T>, dav, dbv, g, detail::to_view4(a, op, "a"), detail::to_view4(b, op, "b"),
                transpose_a, transpose_b);
}

template <class T>
Tensor<T> bmm(TensorView<const T> a, TensorView<const T> b, bool transpose_a, bool transpose_b) {
  const BmmSizes z = check_bmm(a, b, transpose_a, transpose_b, "bmm");
  Tensor<T> out(detail::caller_dims(z.rank, z.B, z.H, z.rows, z.cols));
  bmm_forward<T>(out.view(), a, b, transpose_a, transpose_b);
  return out;
}

#define ATTN_INSTANTIATE(T)                                                                                      \
  template void bmm_forward(TensorView<T>, TensorView<const T>, TensorView<const T>, bool, bool);                \
  template void bmm_backward(TensorView<T>, TensorView<T>, TensorView<const T>, TensorView<const T>,             \
                             TensorView<const T>, bool, bool);                                                    \
  template Tensor<T> bmm(TensorView<const T>, TensorView<const T>, bool, bool);
ATTN_INSTANTIATE(float)
ATTN_INSTANTIATE(double)
#undef ATTN_INSTANTIATE

}  // namespace attn
