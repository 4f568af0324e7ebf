// The table of an additive mask's tile classes (BiasTileClasses, core/mask_plan.hpp) for one call of
// a blocked kernel: kept only when some tile of the mask is read by more than one block (the mask
// broadcast over heads, the batch or the query rows); the kernels fill it as they go.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "core/mask_plan.hpp"

namespace attn::cpu {

template <class T>
class BiasClassesFor {
 public:
  // Points mask.bias_classes at a table of empty cells for tiles of (rows_per_block, keys_per_tile)
  // when the mask's tiles are read more than once; leaves the mask as it is otherwise.
  BiasClassesFor(MaskPlan<T>& mask, index_t rows_per_block, index_t keys_per_tile) {
    if (mask.bias == nullptr || mask.n == 0 || mask.m == 0) return;
    const index_t row_blocks = (mask.n + rows_per_block - 1) / rows_per_block;
    const index_t key_tiles = (mask.m + keys_per_tile - 1) / keys_per_tile;
    const index_t slices_b = mask.bias_s[0] != 0 ? mask.B : 1, slices_h = mask.bias_s[1] != 0 ? mask.H : 1;
    const index_t slices_r = mask.bias_s[2] != 0 ? row_blocks : 1;
    if (slices_b * slices_h * slices_r == mask.B * mask.H * row_blocks) return;  // every tile read once
    const index_t cells = slices_b * slices_h * slices_r * key_tiles;
    cells_ = std::make_unique<std::atomic<std::uint8_t>[]>(static_cast<std::size_t>(cells));  // all 0 (C++20)
    table_.cells = cells_.get();
    table_.sr = mask.bias_s[2] != 0 ? key_tiles : 0;
    table_.sh = mask.bias_s[1] != 0 ? slices_r * key_tiles : 0;
    table_.sb = mask.bias_s[0] != 0 ? slices_h * slices_r * key_tiles : 0;
    table_.rows_per_block = rows_per_block, table_.keys_per_tile = keys_per_tile;
    mask.bias_classes = &table_;
  }
  BiasClassesFor(const BiasClassesFor&) = delete;
  BiasClassesFor& operator=(const BiasClassesFor&) = delete;

 private:
  std::unique_ptr<std::atomic<std::uint8_t>[]> cells_;
  BiasTileClasses table_;
};

}  // namespace attn::cpu
