// Scoring functions of your own, fused: a C++ FlexAttention (PyTorch's flex_attention).
//
//   score_mod(score, b, h, i, j) -> score   changes the scaled (and soft-capped) score of query i and
//                                            key j of batch b, head h, before ALiBi and the masks
//   mask_mod(b, h, i, j) -> bool             false masks the pair
//
// Both are functors of the caller's, compiled in the caller's file and called from the fused
// kernels on every tile they compute: the forward and backward never form the (n, m) scores. Before
// a call, mask_mod is evaluated once per (query block, key tile) pair (BlockMask), so that tiles it
// masks entirely are skipped, not computed.
//
// The backward needs the derivative of score_mod with respect to the score: score_mod is called
// with a dual number (Dual<T>, the value and its derivative) in place of the score, so it must be
// generic in the score's type:
//   template <class S> S operator()(S score, index_t b, index_t h, index_t i, index_t j) const;
// Dual<T> has the arithmetic of T and abs, tanh, exp, log, sqrt, min, max, so ordinary code works
// unchanged. A score_mod with learnable parameters (a bias table, say) gives their gradients with
// three members, called with dL/d(modified score) of every pair the kernels compute:
//   using Grad = ...;                                       // a value type, default-constructed = 0
//   void accumulate(Grad& g, T dmod, index_t b, index_t h, index_t i, index_t j) const;
//   void combine(Grad& total, const Grad& part) const;      // total += part
// flex_attention_backward returns the Grad, summed in an order fixed by the shapes (bit-identical
// at any number of threads).
//
// Shapes, masks (applied with mask_mod), grouped-query attention, options: as attn/sdpa.hpp. These
// entry points always run the cpu backend's fused kernels (there is no (n, m) path to ask for the
// weights), and score_mod must return a finite score wherever it is given a finite one: a NaN it
// makes propagates to its row, as in PyTorch.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "attn/mask.hpp"
#include "attn/sdpa.hpp"
#include "attn/tensor.hpp"

namespace attn {

// A forward-mode dual number: v + d epsilon, epsilon^2 = 0. f(Dual{x, 1}).d is f'(x).
template <class T>
struct Dual {
  T v = 0, d = 0;
  Dual() = default;
  /// A constant (derivative 0), or a value with its derivative.
  Dual(T value) : v(value) {}  // NOLINT(google-explicit-constructor): constants have derivative 0
  Dual(T value, T derivative) : v(value), d(derivative) {}
};
/// Arithmetic, comparisons and functions of dual numbers, each carrying its derivative by the chain
/// rule, so that a score_mod written generic in its score type differentiates itself.
template <class T> Dual<T> operator+(Dual<T> a, Dual<T> b) { return {a.v + b.v, a.d + b.d}; }
template <class T> Dual<T> operator-(Dual<T> a, Dual<T> b) { return {a.v - b.v, a.d - b.d}; }
template <class T> Dual<T> operator-(Dual<T> a) { return {-a.v, -a.d}; }
template <class T> Dual<T> operator*(Dual<T> a, Dual<T> b) { return {a.v * b.v, a.d * b.v + a.v * b.d}; }
template <class T> Dual<T> operator/(Dual<T> a, Dual<T> b) { return {a.v / b.v, (a.d * b.v - a.v * b.d) / (b.v * b.v)}; }
template <class T> Dual<T> operator+(Dual<T> a, T b) { return {a.v + b, a.d}; }
template <class T> Dual<T> operator+(T a, Dual<T> b) { return {a + b.v, b.d}; }
template <class T> Dual<T> operator-(Dual<T> a, T b) { return {a.v - b, a.d}; }
template <class T> Dual<T> operator-(T a, Dual<T> b) { return {a - b.v, -b.d}; }
template <class T> Dual<T> operator*(Dual<T> a, T b) { return {a.v * b, a.d * b}; }
template <class T> Dual<T> operator*(T a, Dual<T> b) { return {a * b.v, a * b.d}; }
template <class T> Dual<T> operator/(Dual<T> a, T b) { return {a.v / b, a.d / b}; }
template <class T> bool operator<(Dual<T> a, Dual<T> b) { return a.v < b.v; }
template <class T> bool operator>(Dual<T> a, Dual<T> b) { return a.v > b.v; }
template <class T> Dual<T> abs(Dual<T> a) { return a.v < 0 ? -a : a; }
template <class T> Dual<T> tanh(Dual<T> a) {
  const T t = std::tanh(a.v);
  return {t, a.d * (1 - t * t)};
}
template <class T> Dual<T> exp(Dual<T> a) {
  const T e = std::exp(a.v);
  return {e, a.d * e};
}
template <class T> Dual<T> log(Dual<T> a) { return {std::log(a.v), a.d / a.v}; }
template <class T> Dual<T> sqrt(Dual<T> a) {
  const T r = std::sqrt(a.v);
  return {r, a.d / (2 * r)};
}
template <class T> Dual<T> min(Dual<T> a, Dual<T> b) { return b.v < a.v ? b : a; }
template <class T> Dual<T> max(Dual<T> a, Dual<T> b) { return a.v < b.v ? b : a; }

// No score_mod: the score unchanged. No mask_mod: every pair kept.
struct IdentityScore {
  /// The score unchanged.
  template <class S>
  S operator()(S score, index_t, index_t, index_t, index_t) const { return score; }
};
struct KeepAll {
  /// Every (query, key) pair kept.
  bool operator()(index_t, index_t, index_t, index_t) const { return true; }
};

namespace detail {

// The caller's functors are compiled in the caller's file, for the compiler's baseline (SSE2 on
// x86-64) unless the caller asks for more; the loops that call them per tile are therefore cloned
// for AVX-512 and AVX2 and the CPU's best picked at load time (GCC's target_clones), so that a
// score_mod vectorises as the kernels around it do.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(ATTN_FLEX_NO_CLONES)
#define ATTN_FLEX_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define ATTN_FLEX_CLONES
#endif

// What the fused kernels call, type-erased: the caller's functors behind function pointers, one
// call per tile. A tile is `cnt` keys j0 .. j0 + cnt - 1 by `rows` queries i0 .. i0 + rows - 1, its
// scores s[jj * lanes + r] for key j0 + jj and query i0 + r (lanes >= rows).
template <class T>
struct ScoreHook {
  const void* ctx = nullptr;
  // Forward and backward: the scaled scores -> score_mod's, and -inf where mask_mod is false.
  void (*modify)(const void* ctx, T* s, index_t lanes, index_t b, index_t h, index_t i0, index_t rows, index_t j0,
                 index_t cnt) = nullptr;
  // Backward: ds holds dL/d(modified score) (0 where masked), raw the scores before modify: adds
  // their share to the parameter gradients of part `part`, then ds *= d(modified)/d(raw).
  void (*backward)(const void* ctx, index_t part, T* ds, const T* raw, index_t lanes, index_t b, index_t h, index_t i0,
                   index_t rows, index_t j0, index_t cnt) = nullptr;
  // Backward, before any part is used: the number of parts (one per task, in an order fixed by the
  // shapes), called once on the calling thread.
  void (*begin_parts)(const void* ctx, index_t parts) = nullptr;
  // Whether a tile may hold a pair mask_mod keeps (the block mask), per (b, h, query block, key tile)
  // of kFlexBlock x kFlexBlock: live[((b H + h) blocks + block) tiles + tile]; empty: every tile.
  const std::uint8_t* live = nullptr;
  index_t live_blocks = 0, live_tiles = 0;
  bool masks = true;  // false: mask_mod keeps every pair (KeepAll)
};

inline constexpr index_t kFlexBlock = 64;  // the fused kernels' query block and key tile

template <class T>
void flex_forward(TensorView<T> out, TensorView<T> lse, TensorView<const T> queries, TensorView<const T> keys,
                  TensorView<const T> values, const Mask<T>& mask, const SdpaOptions& options, const ScoreHook<T>& hook);
template <class T>
void flex_backward(TensorView<T> dqueries, TensorView<T> dkeys, TensorView<T> dvalues, TensorView<const T> dout,
                   TensorView<const T> queries, TensorView<const T> keys, TensorView<const T> values,
                   TensorView<const T> out, TensorView<const T> lse, const Mask<T>& mask, const SdpaOptions& options,
                   const ScoreHook<T>& hook);

template <class F, class T>
concept HasGrad = requires(const F& f, typename F::Grad& g, const typename F::Grad& part, T dmod) {
  f.accumulate(g, dmod, index_t{}, index_t{}, index_t{}, index_t{});
  f.combine(g, part);
};

struct NoGrad {};

// ScoreMod::Grad when score_mod has parameters, NoGrad otherwise.
template <class F, class T, bool = HasGrad<F, T>>
struct GradOf {
  using type = NoGrad;
};
template <class F, class T>
struct GradOf<F, T, true> {
  using type = typename F::Grad;
};

// The functors and, during a backward, the per-part parameter gradients.
template <class T, class ScoreMod, class MaskMod>
struct FlexContext {
  const ScoreMod& score_mod;
  const MaskMod& mask_mod;
  using Grad = typename GradOf<ScoreMod, T>::type;
  std::vector<Grad> parts;
  static constexpr bool masks = !std::is_same_v<MaskMod, KeepAll>;

  ATTN_FLEX_CLONES static void modify(const void* ctx, T* s, index_t lanes, index_t b, index_t h, index_t i0, index_t rows, index_t j0,
                     index_t cnt) {
    const auto& c = *static_cast<const FlexContext*>(ctx);
    for (index_t jj = 0; jj < cnt; ++jj) {
      T* sj = s + jj * lanes;
      for (index_t r = 0; r < rows; ++r) {
        const index_t i = i0 + r, j = j0 + jj;
        if constexpr (masks)
          sj[r] = c.mask_mod(b, h, i, j) ? static_cast<T>(c.score_mod(sj[r], b, h, i, j)) : -INFINITY;
        else
          sj[r] = static_cast<T>(c.score_mod(sj[r], b, h, i, j));
      }
    }
  }
  ATTN_FLEX_CLONES static void backward(const void* ctx, index_t part, T* ds, const T* raw, index_t lanes, index_t b, index_t h,
                       index_t i0, index_t rows, index_t j0, index_t cnt) {
    const auto& c = *static_cast<const FlexContext*>(ctx);
    for (index_t jj = 0; jj < cnt; ++jj)
      for (index_t r = 0; r < rows; ++r) {
        T& g = ds[jj * lanes + r];
        if (g == T(0)) continue;  // masked, or no gradient
        const index_t i = i0 + r, j = j0 + jj;
        if constexpr (HasGrad<ScoreMod, T>)
          c.score_mod.accumulate(const_cast<Grad&>(c.parts[static_cast<std::size_t>(part)]), g, b, h, i, j);
        g *= c.score_mod(Dual<T>(raw[jj * lanes + r], T(1)), b, h, i, j).d;
      }
  }
  static void begin_parts(const void* ctx, index_t parts) {
    auto& c = *const_cast<FlexContext*>(static_cast<const FlexContext*>(ctx));
    c.parts.assign(static_cast<std::size_t>(parts), Grad{});
  }
};

// The block mask: whether mask_mod keeps some pair of each (query block, key tile).
template <class MaskMod>
std::vector<std::uint8_t> block_mask(const MaskMod& mask_mod, index_t B, index_t H, index_t n, index_t m) {
  const index_t blocks = (n + kFlexBlock - 1) / kFlexBlock, tiles = (m + kFlexBlock - 1) / kFlexBlock;
  std::vector<std::uint8_t> live(static_cast<std::size_t>(B * H * blocks * tiles), 0);
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h)
      for (index_t blk = 0; blk < blocks; ++blk)
        for (index_t t = 0; t < tiles; ++t) {
          bool any = false;
          for (index_t i = blk * kFlexBlock; i < std::min(n, (blk + 1) * kFlexBlock) && !any; ++i)
            for (index_t j = t * kFlexBlock; j < std::min(m, (t + 1) * kFlexBlock) && !any; ++j) any = mask_mod(b, h, i, j);
          live[static_cast<std::size_t>(((b * H + h) * blocks + blk) * tiles + t)] = any;
        }
  return live;
}

template <class T, class Ctx>
ScoreHook<T> hook_of(const Ctx& ctx, const std::vector<std::uint8_t>& live, index_t n, index_t m) {
  ScoreHook<T> hook;
  hook.ctx = &ctx;
  hook.modify = &Ctx::modify;
  hook.backward = &Ctx::backward;
  hook.begin_parts = &Ctx::begin_parts;
  hook.live = live.data();
  hook.live_blocks = (n + kFlexBlock - 1) / kFlexBlock;
  hook.live_tiles = (m + kFlexBlock - 1) / kFlexBlock;
  hook.masks = Ctx::masks;
  return hook;
}

// Batch size, heads, queries and keys of a call, for the block mask (the library checks them all).
template <class T>
std::array<index_t, 4> flex_sizes(const TensorView<const T>& queries, const TensorView<const T>& keys) {
  const bool heads = queries.rank() == 4;
  return {queries.rank() > 0 ? queries.dim(0) : 0, heads ? queries.dim(1) : 1, queries.rank() >= 2 ? queries.dim(-2) : 0,
          keys.rank() >= 2 ? keys.dim(-2) : 0};
}

}  // namespace detail

// out (and lse, when given) of attention with the caller's score_mod and mask_mod.
template <class T, class ScoreMod, class MaskMod = KeepAll>
void flex_attention_forward(TensorView<T> out, TensorView<T> lse, TensorView<const T> queries,
                            TensorView<const T> keys, TensorView<const T> values, const ScoreMod& score_mod,
                            const MaskMod& mask_mod = {}, const Mask<T>& mask = {}, const SdpaOptions& options = {}) {
  const auto [B, H, n, m] = detail::flex_sizes(queries, keys);
  detail::FlexContext<T, ScoreMod, MaskMod> ctx{score_mod, mask_mod, {}};
  const std::vector<std::uint8_t> live = detail::block_mask(mask_mod, B, H, n, m);
  detail::flex_forward<T>(out, lse, queries, keys, values, mask, options, detail::hook_of<T>(ctx, live, n, m));
}

// The gradients of queries, keys and values (each may be empty) and, when score_mod has parameters,
// theirs (returned; detail::NoGrad otherwise). out and lse as sdpa_backward takes them.
template <class T, class ScoreMod, class MaskMod = KeepAll>
auto flex_attention_backward(TensorView<T> dqueries, TensorView<T> dkeys, TensorView<T> dvalues,
                             TensorView<const T> dout, TensorView<const T> queries, TensorView<const T> keys,
                             TensorView<const T> values, TensorView<const T> out, TensorView<const T> lse,
                             const ScoreMod& score_mod, const MaskMod& mask_mod = {}, const Mask<T>& mask = {},
                             const SdpaOptions& options = {}) {
  const auto [B, H, n, m] = detail::flex_sizes(queries, keys);
  detail::FlexContext<T, ScoreMod, MaskMod> ctx{score_mod, mask_mod, {}};
  const std::vector<std::uint8_t> live = detail::block_mask(mask_mod, B, H, n, m);
  detail::flex_backward<T>(dqueries, dkeys, dvalues, dout, queries, keys, values, out, lse, mask, options,
                           detail::hook_of<T>(ctx, live, n, m));
  typename decltype(ctx)::Grad total{};
  if constexpr (detail::HasGrad<ScoreMod, T>)
    for (const auto& part : ctx.parts) score_mod.combine(total, part);
  return total;
}

}  // namespace attn
