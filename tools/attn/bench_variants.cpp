// The cases of `attn bench` for attention as models use it today (bench.hpp): grouped-query heads
// beside multi-head attention of the same size, a causal sliding window beside full causal
// attention, ALiBi and soft-capping beside plain attention, ALiBi as a flex_attention score_mod beside the built-in, packed sequences beside one causal
// sequence of the same length, masks given as tensors beside their built-in forms, and the
// multi-head attention layer forward and backward. Each pair runs in the same process, so their
// ratio is measured, not estimated; the additive masks are timed in turn with their built-in form
// (the "unfused" column) and checked against the unfused backend. Inputs uniform in [-1, 1) from
// fixed seeds, (B, H, n, d) tensors; no other unfused baseline (its (n, m) buffers would not fit).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "attn/flex.hpp"
#include "bench.hpp"

namespace attn_cli {
namespace {

using attn::index_t;
using attn::Tensor;

std::string shape(std::initializer_list<index_t> dims) {
  std::string s = "(";
  for (index_t d : dims) {
    if (s.size() > 1) s += ',';
    s += std::to_string(d);
  }
  return s + ")";
}

// One SDPA forward case: queries (B, H, n, d), keys and values (B, Hk, m, d), a mask and options.
// The mask's tensors (ALiBi slopes, segment ids) are made by prepare() with the inputs.
struct VariantData {
  index_t B, H, Hk, n, m, d;
  attn::Causal causal = attn::Causal::none;
  std::optional<attn::Window> window = std::nullopt;
  bool alibi = false;
  index_t documents = 0;  // packed sequences: this many documents of equal length
  double softcap = 0;
  bool alibi_functor = false;  // ALiBi as a flex_attention score_mod instead of the built-in option
  // Masks given as tensors: keys [0, valid) as lengths or as a bool
  // key-padding mask (1, 1, 1, m); a bool causal mask (1, 1, n, m); a bool mask (1, 1, n, m) whose
  // 64 x 64 tiles alternate between all kept and all masked (a checkerboard: half of them empty); an
  // additive float mask (1, 1, n, m) of values in [-1, 0), or the causal mask as an additive one (0
  // on and below the diagonal, -inf above).
  enum class Given { none, lengths, key_padding, causal_tensor, block_sparse, additive, additive_causal };
  Given given = Given::none;
  index_t valid = 0;
  Tensor<float> q{}, k{}, v{}, out{}, slopes{}, bias{}, out_builtin{}, out_ref{};
  Tensor<std::int32_t> segments{};
  Tensor<std::int64_t> lens{};
  Tensor<bool> keep{};

  void prepare() {
    q = uniform({B, H, n, d}, 1), k = uniform({B, Hk, m, d}, 2), v = uniform({B, Hk, m, d}, 3);
    out = Tensor<float>({B, H, n, d}), out_builtin = out, out_ref = out;
    slopes = Tensor<float>({H});
    for (index_t h = 0; h < H; ++h) slopes[h] = std::pow(2.0f, -8.0f * static_cast<float>(h + 1) / static_cast<float>(H));
    segments = Tensor<std::int32_t>({B, n});
    for (index_t i = 0; i < segments.numel(); ++i)
      segments[i] = documents > 0 ? static_cast<std::int32_t>(i % n * documents / n) : 0;
    lens = Tensor<std::int64_t>({B});
    for (index_t b = 0; b < B; ++b) lens[b] = valid;
    if (given == Given::key_padding) {
      keep = Tensor<bool>({1, 1, 1, m});
      for (index_t j = 0; j < m; ++j) keep[j] = j < valid;
    } else if (given == Given::causal_tensor || given == Given::block_sparse) {
      keep = Tensor<bool>({1, 1, n, m});
      for (index_t i = 0; i < n; ++i)
        for (index_t j = 0; j < m; ++j)
          keep[i * m + j] = given == Given::causal_tensor ? j <= i : (i / 64 + j / 64) % 2 == 0;
    } else if (given == Given::additive) {
      bias = uniform({1, 1, n, m}, 4);
      for (index_t e = 0; e < bias.numel(); ++e) bias[e] = (bias[e] - 1.0f) / 2.0f;
    } else if (given == Given::additive_causal) {
      bias = Tensor<float>({1, 1, n, m});
      for (index_t i = 0; i < n; ++i)
        for (index_t j = 0; j < m; ++j) bias[i * m + j] = j <= i ? 0.0f : -std::numeric_limits<float>::infinity();
    }
  }
  void release() {
    for (Tensor<float>* t : {&q, &k, &v, &out, &slopes, &bias, &out_builtin, &out_ref}) *t = Tensor<float>();
    segments = Tensor<std::int32_t>();
    lens = Tensor<std::int64_t>();
    keep = Tensor<bool>();
  }
  // ALiBi written as a user's score_mod (attn/flex.hpp), n == m.
  struct AlibiScore {
    const float* slopes;
    template <class S>
    S operator()(S score, index_t, index_t h, index_t i, index_t j) const {
      return score - slopes[h] * static_cast<float>(std::abs(i - j));
    }
  };

  // The case's attention into `out`.
  void run() { run_into(out, given, causal); }
  // The same attention with the mask's built-in form instead of its tensor, into `out_builtin`: no
  // mask for the additive float mask, causal=True for the additive causal mask (the baseline an
  // additive case is timed beside).
  void run_builtin() {
    run_into(out_builtin, Given::none, given == Given::additive_causal ? attn::Causal::top_left : causal);
  }
  // The case's attention through the unfused backend (scores, softmax and pooling as separate
  // passes) into `out_ref`: what check() compares `out` with.
  void run_unfused() {
    const attn::ScopedBackend unfused(attn::Backend::unfused);
    run_into(out_ref, given, causal);
  }
  void run_into(Tensor<float>& into, Given as, attn::Causal causal_as) const {
    if (alibi_functor) {
      attn::flex_attention_forward<float>(into.view(), {}, q.cview(), k.cview(), v.cview(), AlibiScore{slopes.data()});
      return;
    }
    attn::Mask<float> mask;
    mask.causal = causal_as;
    mask.window = window;
    if (alibi) mask.alibi_slopes = slopes.cview();
    if (documents > 0) mask.segment_ids_q = segments.cview();
    if (as == Given::lengths) mask.valid_lens = lens.cview();
    if (as != Given::none && keep.numel() > 0) mask.keep = keep.cview();
    if (as != Given::none && bias.numel() > 0) mask.additive = bias.cview();
    attn::SdpaOptions options;
    if (softcap > 0) options.softcap = softcap;
    attn::sdpa_forward<float>(into.view(), {}, {}, q.cview(), k.cview(), v.cview(), mask, options);
  }
  // (query, key) pairs the kernels compute: those of the key tiles of kTile keys (from a multiple of
  // kTile) each block of kTile queries may attend to, as the fused forward visits them.
  double pairs_computed() const {
    constexpr index_t kTile = 64;
    double pairs = 0;
    for (index_t i0 = 0; i0 < n; i0 += kTile) {
      const index_t rows = std::min(kTile, n - i0), last = i0 + rows - 1;
      index_t lo = 0, hi = m;  // keys [lo, hi)
      if (causal != attn::Causal::none || given == Given::causal_tensor || given == Given::additive_causal)
        hi = std::min(m, last + 1 + (causal == attn::Causal::bottom_right ? m - n : 0));
      if (given == Given::lengths || given == Given::key_padding) hi = std::min(hi, valid);
      if (window && window->left >= 0) lo = std::max<index_t>(0, i0 - window->left) / kTile * kTile;
      if (documents > 0) {  // the documents of the block's queries
        const index_t doc = n / documents;
        lo = std::max(lo, i0 / doc * doc / kTile * kTile), hi = std::min(hi, (last / doc + 1) * doc);
      }
      const double tiles = static_cast<double>(std::max<index_t>(0, hi - lo + kTile - 1) / kTile);
      // The checkerboard: of a block's tiles, those of its parity (half, rounded by the first tile's).
      const double live = given == Given::block_sparse ? std::floor((tiles + (i0 / kTile % 2 == 0 ? 1 : 0)) / 2) : tiles;
      pairs += static_cast<double>(rows) * live * kTile;
    }
    return pairs * static_cast<double>(B * H);
  }
};

BenchCase variant_case(const std::string& name, const VariantData& data) {
  auto s = std::make_shared<VariantData>(data);
  BenchCase c;
  c.name = name;
  c.flops = 4.0 * static_cast<double>(data.d) * data.pairs_computed();
  c.formula = "4 d x (query, key) pairs of the tiles computed";
  c.prepare = [s] { s->prepare(); };
  c.run_fused = [s] { s->run(); };
  c.release = [s] { s->release(); };
  if (data.given == VariantData::Given::additive || data.given == VariantData::Given::additive_causal) {
    // Timed in turn with the built-in form of its mask (the "unfused" column: its speed-up is then
    // the additive mask's share of the built-in rate), and checked against the unfused backend.
    c.formula += "; the mask's built-in form (none, or causal=True) in the unfused column";
    c.run_unfused = [s] { s->run_builtin(); };
    c.check = [s] {
      s->run_unfused();
      return max_rel_diff(s->out, s->out_ref);
    };
  }
  return c;
}

// The multi-head attention layer (attn/multi_head.hpp) forward and backward: projections and
// attention, FLOPs of each counted.
BenchCase multi_head_case(index_t B, index_t n, index_t D, index_t H) {
  struct Data {
    index_t B, n, D, H;
    Tensor<float> x{}, g{}, out{}, dx{};
    attn::MultiHeadWeights<float> w{}, dw{};
    attn::MultiHeadState<float> state{};
  };
  auto s = std::make_shared<Data>(Data{B, n, D, H});
  BenchCase c;
  c.name = "multi-head forward+backward " + shape({B, n, D, H});
  // Four projections of 2 B n D^2 FLOPs, twice that backward; attention 12 B n n D.
  c.flops = 3.0 * 4 * 2 * static_cast<double>(B) * n * D * D + 12.0 * static_cast<double>(B) * n * n * D;
  c.formula = "24 B n D^2 (projections) + 12 B n^2 D (attention)";
  c.prepare = [s] {
    s->x = uniform({s->B, s->n, s->D}, 5), s->g = uniform({s->B, s->n, s->D}, 6);
    s->out = Tensor<float>({s->B, s->n, s->D}), s->dx = s->out;
    s->w = attn::MultiHeadWeights<float>::init(s->D, s->D, s->D, s->D, {s->H, s->H}, false, 7);
    s->dw = s->w;
  };
  c.run_fused = [s] {
    const attn::MultiHeadConfig config{s->H, s->H};
    attn::multi_head_attention_forward<float>(s->out.view(), &s->state, s->x.cview(), s->x.cview(), s->x.cview(),
                                              s->w.params(), config);
    const attn::MultiHeadGrads<float> grads{s->dw.w_q.view(), s->dw.w_k.view(), s->dw.w_v.view(), s->dw.w_o.view(), {}, {}, {}, {}};
    attn::multi_head_attention_backward<float>(s->dx.view(), {}, {}, grads, s->g.cview(), s->x.cview(), s->x.cview(),
                                               s->x.cview(), s->w.params(), config, s->state);
  };
  c.release = [s] { *s = Data{s->B, s->n, s->D, s->H}; };
  return c;
}

}  // namespace

std::vector<BenchCase> variant_cases() {
  using attn::Causal;
  std::vector<BenchCase> cases;
  cases.push_back(variant_case("sdpa forward mha (1,32,2048,2048,128)", {1, 32, 32, 2048, 2048, 128}));
  cases.push_back(variant_case("sdpa forward gqa 32/8 (1,32,2048,2048,128)", {1, 32, 8, 2048, 2048, 128}));
  cases.push_back(variant_case("sdpa forward causal (1,16384,16384,64)", {1, 1, 1, 16384, 16384, 64, Causal::top_left}));
  cases.push_back(variant_case("sdpa forward window 256 causal (1,16384,16384,64)",
                               {1, 1, 1, 16384, 16384, 64, Causal::top_left, attn::Window{256, 0}}));
  cases.push_back(variant_case("sdpa forward plain (1,4,2048,2048,64)", {1, 4, 4, 2048, 2048, 64}));
  cases.push_back(variant_case("sdpa forward alibi (1,4,2048,2048,64)", {1, 4, 4, 2048, 2048, 64, Causal::none,
                                                                           std::nullopt, true}));
  VariantData alibi_functor{1, 4, 4, 2048, 2048, 64};
  alibi_functor.alibi_functor = true;
  cases.push_back(variant_case("flex forward alibi score_mod (1,4,2048,2048,64)", alibi_functor));
  cases.push_back(variant_case("sdpa forward softcap 30 (1,4,2048,2048,64)",
                               {1, 4, 4, 2048, 2048, 64, Causal::none, std::nullopt, false, 0, 30.0}));
  cases.push_back(variant_case("sdpa forward causal (1,8192,8192,64)", {1, 1, 1, 8192, 8192, 64, Causal::top_left}));
  cases.push_back(variant_case("sdpa forward packed 16 docs causal (1,8192,8192,64)",
                               {1, 1, 1, 8192, 8192, 64, Causal::top_left, std::nullopt, false, 16}));
  // Masks given as tensors beside the same attention without them or with their built-in form.
  const auto masked = [&](const std::string& what, VariantData::Given given, attn::Causal causal = attn::Causal::none) {
    VariantData data{1, 4, 4, 2048, 2048, 128, causal};
    data.given = given, data.valid = 1500;
    cases.push_back(variant_case("sdpa forward " + what + " (1,4,2048,2048,128)", data));
  };
  masked("no mask", VariantData::Given::none);
  masked("valid_lens 1500", VariantData::Given::lengths);
  masked("bool key padding 1500", VariantData::Given::key_padding);
  masked("causal=True", VariantData::Given::none, Causal::top_left);
  masked("bool causal tensor", VariantData::Given::causal_tensor);
  masked("bool block-sparse half", VariantData::Given::block_sparse);
  masked("additive float mask", VariantData::Given::additive);
  masked("additive causal mask", VariantData::Given::additive_causal);
  cases.push_back(multi_head_case(4, 512, 512, 8));
  return cases;
}

}  // namespace attn_cli
