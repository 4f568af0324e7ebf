// The varlen case of `attn bench` (attn/varlen.hpp): packed sequences of mixed lengths, causal, timed
// beside one dense causal forward of the longest sequence's length, per (query, key) pair attended:
// the cost of the packing (one call per sequence, short sequences' smaller tiles) against a dense
// call that has no padding either.
#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <vector>

#include "attn/attn.hpp"
#include "bench.hpp"

namespace attn_cli {
namespace {

using attn::index_t;
using attn::Tensor;

// 16 sequences from 64 to 4096 rows, 16384 in all; the longest first (check() compares it with the
// dense call).
const std::vector<index_t> kLengths = {4096, 2048, 2048, 1024, 1024, 1024, 1024, 768,
                                       768,  512,  512,  448,  384,  320,  320,  64};

struct VarlenData {
  index_t H = 8, d = 128, total = 0;
  Tensor<float> q{}, k{}, v{}, out{}, lse{}, dense_out{};
  Tensor<std::int32_t> cu{};

  // (1, H, n, d) view of rows [0, n) of a packed (total, H, d) tensor.
  template <class T>
  attn::TensorView<T> head_major(Tensor<float>& t, index_t n) const {
    return attn::TensorView<T>(t.data(), {1, H, n, d}, {0, d, H * d, 1});
  }
  void prepare() {
    total = std::accumulate(kLengths.begin(), kLengths.end(), index_t(0));
    q = uniform({total, H, d}, 1), k = uniform({total, H, d}, 2), v = uniform({total, H, d}, 3);
    out = Tensor<float>({total, H, d}), lse = Tensor<float>({H, total}), dense_out = Tensor<float>({total, H, d});
    cu = Tensor<std::int32_t>({static_cast<index_t>(kLengths.size()) + 1});
    for (std::size_t b = 0; b < kLengths.size(); ++b)
      cu[static_cast<index_t>(b) + 1] = cu[static_cast<index_t>(b)] + static_cast<std::int32_t>(kLengths[b]);
  }
  void release() {
    for (Tensor<float>* t : {&q, &k, &v, &out, &lse, &dense_out}) *t = Tensor<float>();
  }
};

double causal_pairs(index_t n) { return static_cast<double>(n) * static_cast<double>(n + 1) / 2; }

BenchCase varlen_causal_case() {
  auto s = std::make_shared<VarlenData>();
  BenchCase c;
  c.name = "flash_attn_varlen_func causal (16 seqs 64..4096, total 16384, H=8, d=128)";
  double pairs = 0;
  for (index_t n : kLengths) pairs += causal_pairs(n);
  c.flops = 4.0 * static_cast<double>(s->d) * static_cast<double>(s->H) * pairs;
  c.formula = "4 d H x (causal query, key pairs of every sequence); baseline: the dense causal forward "
              "(1, H, 4096, 4096, d) scaled to the same pairs";
  c.baseline_scale = pairs / causal_pairs(kLengths[0]);
  c.prepare = [s] { s->prepare(); };
  c.run_fused = [s] {
    attn::Mask<float> mask;
    mask.causal = attn::Causal::bottom_right;
    const index_t longest = *std::max_element(kLengths.begin(), kLengths.end());
    attn::varlen_forward<float>(s->out.view(), s->lse.view(), {}, s->q.cview(), s->k.cview(), s->v.cview(),
                                attn::VarlenSeqs{s->cu.cview(), s->cu.cview(), longest, longest}, mask);
  };
  c.run_unfused = [s] {  // the dense fused kernel on the first sequence's rows, read in place
    attn::Mask<float> mask;
    mask.causal = attn::Causal::bottom_right;
    const index_t n = kLengths[0];
    attn::sdpa_forward<float>(s->head_major<float>(s->dense_out, n), {}, {}, s->head_major<const float>(s->q, n),
                              s->head_major<const float>(s->k, n), s->head_major<const float>(s->v, n), mask);
  };
  c.check = [s] {  // the first sequence: the varlen call against the dense one
    const index_t rows = kLengths[0] * s->H * s->d;
    double diff = 0, top = 1e-30;
    for (index_t e = 0; e < rows; ++e) {
      diff = std::max(diff, std::abs(static_cast<double>(s->out[e]) - s->dense_out[e]));
      top = std::max(top, std::abs(static_cast<double>(s->dense_out[e])));
    }
    return diff / top;
  };
  c.release = [s] { s->release(); };
  return c;
}

}  // namespace

std::vector<BenchCase> varlen_cases() { return {varlen_causal_case()}; }

}  // namespace attn_cli
