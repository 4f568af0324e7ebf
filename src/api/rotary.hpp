// The rotary checks and kernel call shared by apply_rotary (api/rotary.cpp) and the KV cache, which
// rotates its keys and queries with the tables it was given (attn/kv_cache.hpp).
#pragma once

#include <cstdint>
#include <span>

#include "attn/rotary.hpp"

namespace attn::detail {

// cos and sin: rank 2, the same shape (P, r / 2), their last dimension contiguous, r <= head_dim.
// Returns r / 2. `what` names the tensor whose last dimension is head_dim ("x", "the cache's keys").
template <class C>
index_t check_rotary_tables(const char* op, const TensorView<const C>& cos, const TensorView<const C>& sin,
                            index_t head_dim, const char* what);

// rows (B, H, n, d) float32 rotated with `tables` into a new tensor of that shape: row i of batch b
// at position first[b] + i, which the caller checked lies in [0, P).
Tensor<float> rotated_rows(const RotaryTables& tables, const TensorView<const float>& rows,
                           std::span<const std::int64_t> first);

}  // namespace attn::detail
