// A boolean key-padding mask, one row of keys for every head and query of a batch element, whose
// rows are prefixes ([true ... true, false ... false], as padded batches are usually masked) masks
// exactly as valid lengths do. The cpu kernels run it as lengths: tiles past them are skipped
// without a look at the mask, and the decode path takes its unmasked loop.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/mask_plan.hpp"

namespace attn::cpu {

template <class T>
class KeyPaddingAsLengths {
 public:
  // Rewrites `mask` in place when its keep-mask is such a mask (the lengths live in this object).
  explicit KeyPaddingAsLengths(MaskPlan<T>& mask) {
    if (mask.keep == nullptr || mask.keep_s[1] != 0 || mask.keep_s[2] != 0 || mask.d2l_fill) return;
    std::vector<std::int64_t> prefix(static_cast<std::size_t>(mask.B));
    for (index_t b = 0; b < mask.B; ++b) {
      const bool* row = mask.keep + b * mask.keep_s[0];
      index_t len = 0;
      while (len < mask.m && row[len * mask.keep_s[3]]) ++len;
      for (index_t j = len; j < mask.m; ++j)
        if (row[j * mask.keep_s[3]]) return;  // a key kept after a masked one: not a prefix
      prefix[static_cast<std::size_t>(b)] = len;
    }
    if (mask.lens == nullptr) {
      lens_ = std::move(prefix);
      mask.lens_sb = 1, mask.lens_si = 0;
    } else {  // both: the shorter, per query
      lens_.resize(static_cast<std::size_t>(mask.B * mask.n));
      for (index_t b = 0; b < mask.B; ++b)
        for (index_t i = 0; i < mask.n; ++i)
          lens_[static_cast<std::size_t>(b * mask.n + i)] =
              std::min(mask.lens[b * mask.lens_sb + i * mask.lens_si], prefix[static_cast<std::size_t>(b)]);
      mask.lens_sb = mask.n, mask.lens_si = 1;
    }
    mask.lens = lens_.data();
    mask.keep = nullptr;
  }
  KeyPaddingAsLengths(const KeyPaddingAsLengths&) = delete;
  KeyPaddingAsLengths& operator=(const KeyPaddingAsLengths&) = delete;

 private:
  std::vector<std::int64_t> lens_;
};

}  // namespace attn::cpu
