// Argument checks shared by the attention ops whose scoring function has learnable parameters
// (additive, bilinear): queries (B, [H,] n, q), keys (B, [H,] m, k) and values (B, [H,] m, v) with
// q and k free, their outputs and gradients, and parameter matrices shared by every head.
// Everything is validated here once; the kernels trust the views they receive.
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

#include "api/checks.hpp"
#include "attn/dropout.hpp"
#include "attn/mask.hpp"
#include "core/dropout_plan.hpp"
#include "core/mask_plan.hpp"

namespace attn::detail {

// The validated queries, keys, values, mask and dropout of one call, and their sizes.
template <class T>
struct QkvCall {
  const char* op = "";
  int rank = 3;
  index_t B = 0, H = 1, n = 0, m = 0, q = 0, k = 0, v = 0;
  std::string queries_shape;
  View4<const T> queries, keys, values;
  MaskPlan<T> mask;
  DropoutPlan dropout;

  // (B, [H,] rows, cols) as the caller writes it.
  std::vector<index_t> dims(index_t rows, index_t cols) const { return caller_dims(rank, B, H, rows, cols); }
  const char* batch_axes() const { return rank == 4 ? "batch and heads" : "batch"; }
};

template <class T>
QkvCall<T> check_qkv(const char* op, const TensorView<const T>& queries, const TensorView<const T>& keys,
                     const TensorView<const T>& values, const Mask<T>& mask, const Dropout& dropout) {
  QkvCall<T> c;
  c.op = op;
  c.queries = require_tensor(queries, op, "queries", 0);
  c.rank = queries.rank();
  c.queries_shape = queries.shape_string();
  c.B = c.queries.B, c.H = c.queries.H, c.n = c.queries.R, c.q = c.queries.C;

  c.keys = require_tensor(keys, op, "keys", c.rank);
  c.m = keys.dim(-2), c.k = keys.dim(-1);
  require_shape(keys, c.dims(c.m, c.k), op, "keys", cat("its ", c.batch_axes(), " must match queries ", c.queries_shape));

  c.values = require_tensor(values, op, "values", c.rank);
  c.v = values.dim(-1);
  require_shape(values, c.dims(c.m, c.v), op, "values",
                cat("its ", c.batch_axes(), " must match queries ", c.queries_shape, " and its m = ", c.m,
                    " rows the keys ", keys.shape_string()));

  detail::refuse_sinks(mask, op);
  c.mask = plan_mask(mask, c.B, c.H, c.n, c.m, c.rank, op);
  c.dropout = plan_dropout(dropout, op);
  return c;
}

// A required output or gradient argument of shape `expected`.
template <class T>
View4<T> require_output(const TensorView<T>& t, const std::vector<index_t>& expected, const char* op, const char* name,
                        int rank, const std::string& why) {
  View4<T> v = require_tensor(t, op, name, rank);
  require_shape(t, expected, op, name, why);
  return v;
}

// An optional output or gradient argument: empty, or of shape `expected`.
template <class T>
View4<T> optional_output(const TensorView<T>& t, const std::vector<index_t>& expected, const char* op,
                         const char* name, int rank, const std::string& why) {
  return t.empty() ? View4<T>{} : require_output(t, expected, op, name, rank, why);
}

// A parameter (or its gradient) of exactly the shape `expected` (a matrix or a vector), shared by
// every batch element and head; the kernels see it as a (1, 1, rows, cols) view.
template <class T>
View4<T> require_param(const TensorView<T>& t, const std::vector<index_t>& expected, const char* op, const char* name,
                       const std::string& why) {
  if (t.empty()) fail(op, ": ", name, " is required but was not given");
  const int rank = static_cast<int>(expected.size());
  View4<T> v = to_view4(t, op, name, rank, rank);
  require_shape(t, expected, op, name, why);
  return v;
}

}  // namespace attn::detail
