// libFuzzer target for the C++ API's arguments. The bytes choose an operation (scaled dot-product
// attention forward and backward in float, double, bfloat16 and float16 and with a 16-bit KV,
// masked softmax, bmm, additive attention, Nadaraya-Watson, the KV cache), the backend (cpu or
// unfused), the SIMD target and threads, small shapes (0 to 16 per size, mismatched now and then),
// memory layouts (padded, permuted, broadcast, negative or overflowing strides), every mask and
// option (valid lengths out of range, keep and additive masks with -inf and NaN, causal, windows,
// segments, ALiBi, soft-capping, query and key starts, head ratios that do not divide, scales and
// dropout p such as -0.1, 1.5 or NaN) and values (NaN, infinities, overflowing ones).
//
// The promise checked: every call either computes or throws attn::Error. Any other exception, a
// crash or a sanitizer report aborts. When it computes: outputs that share memory were refused,
// padding around strided outputs is untouched, and, unless a NaN, infinity or huge value makes it
// meaningless, every result matches the float64 reference backend (Backend::reference on dense
// copies) within a tolerance scaled by the scores' size (api_fuzz_input.hpp, kTol).
//
// Build with -DATTN_FUZZ=ON and clang++ (CMakeLists.txt), then for example
//   build/fuzz/api_fuzz -max_total_time=600 -max_len=2048 new-corpus fuzz/corpus/api
#include <exception>
#include <optional>
#include <string>
#include <typeinfo>
#include <vector>

#include "api_fuzz_input.hpp"
#include "attn/additive.hpp"
#include "attn/bmm.hpp"
#include "attn/config.hpp"
#include "attn/kv_cache.hpp"
#include "attn/memory.hpp"
#include "attn/nadaraya_watson.hpp"
#include "attn/sdpa.hpp"
#include "attn/softmax.hpp"

namespace {

using namespace fuzz;
using attn::Tensor;

// Runs a library call: true when it computed, false when it refused with attn::Error.
template <class F>
bool computes(F f) {
  try {
    f();
    ++g_computed;
    return true;
  } catch (const attn::Error&) {
    ++g_refused;
    return false;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "api_fuzz: %s escaped the library: %s\n", typeid(e).name(), e.what());
    std::abort();
  }
}

// Runs the reference backend on the dense copies of arguments the cpu backend accepted: it must accept them too.
template <class F>
void reference(F f, const char* what) {
  attn::ScopedBackend scope(attn::Backend::reference);
  try {
    f();
  } catch (const attn::Error& e) {
    std::fprintf(stderr, "api_fuzz: %s: the reference refused what the cpu backend accepted: %s\n", what, e.what());
    std::abort();
  }
}

// Finding 2, fixed: the 16-bit sdpa calls widened and narrowed their tensors through the strides
// before any check (an overflowing stride crashed, a last stride of 0 was read as contiguous); they
// now check every 16-bit argument's layout and the outputs' memory first. Every layout for all types.
template <class T>
Layout layout_for(Bytes& in) {
  return pick_layout(in);
}

// An input of the given shape (mutated now and then) in a layout the bytes choose.
template <class T>
Strided<T> input(Bytes& in, std::vector<index_t> shape, bool overflow = true) {
  std::vector<index_t> s = mutate(in, std::move(shape));
  return Strided<T>(in, std::move(s), layout_for<T>(in), [&in] { return in.value(); }, overflow);
}

// An output, filled with NaN so that an element the call does not write shows.
template <class T>
Strided<T> output(Bytes& in, std::vector<index_t> shape, bool given = true) {
  if (!given) return {};
  std::vector<index_t> s = mutate(in, std::move(shape));
  return Strided<T>(in, std::move(s), layout_for<T>(in), [] { return std::numeric_limits<double>::quiet_NaN(); });
}

// After a call computed: it must have refused tensors no buffer can hold and outputs that share
// memory, and left the outputs' padding alone.
template <class T>
void check_output(const Strided<T>& t, const char* name) {
  if (!t.given()) return;
  if (t.unbacked()) broken(name);
  if (t.shares() && t.numel() > 0) {
    std::fprintf(stderr, "api_fuzz: %s (%s) shares memory between its elements but was accepted as an output\n", name,
                 t.describe().c_str());
    broken("outputs that share memory are refused");
  }
  if (!t.padding_intact()) {
    std::fprintf(stderr, "api_fuzz: %s: an element outside the output's view was written\n", name);
    broken("a call writes only its outputs' elements");
  }
}
template <class T>
void check_input(const Strided<T>& t) {
  if (t.given() && t.unbacked()) broken("a tensor whose extent overflows 64 bits is refused");
}

double at_least_1(double x) { return std::max(x, 1.0); }

// Scores this large overflow the computation's type C: no result to compare (nor a promise broken).
template <class C>
bool beyond_range(double smax) {
  return !(smax < 1e-3 * static_cast<double>(std::numeric_limits<C>::max()));
}

// Finding 1, fixed: a scale finite as a double but infinite in the computation's type C (1e300 for
// float32) passed sdpa's check, and the scores became inf/NaN; sdpa now refuses it. Such calls are
// still never compared.
template <class C>
bool scale_overflows(const std::optional<double>& scale) {
  return scale && !std::isfinite(static_cast<C>(*scale));
}

// ---- masks -------------------------------------------------------------------------------------

// One of a few values, chosen by the bytes, for the bounds and positions of masks.
index_t position(Bytes& in) {
  static constexpr index_t kTable[10] = {-1, 0, 1, 2, 3, 5, 16, std::numeric_limits<index_t>::max(),
                                         std::numeric_limits<index_t>::min(), -7};
  return kTable[in.pick(10)];
}

// A sliding window's bound. Finding 3, fixed: a bound near INT64_MAX overflowed p(i) + right + 1 in
// MaskPlan::end (src/core/mask_plan.hpp); the bounds are now summed in 128 bits.
attn::Window window_of(Bytes& in) {
  auto bound = [&in] { return position(in); };
  const index_t left = bound();
  return attn::Window{left, bound()};
}

// A shape broadcastable to the scores (or, mutated, not): each size full or 1, leading ones dropped.
std::vector<index_t> broadcast_shape(Bytes& in, const std::vector<index_t>& scores) {
  const std::uint8_t bits = in.u8();
  std::vector<index_t> s;
  for (std::size_t i = 0; i < scores.size(); ++i) s.push_back((bits >> i) & 1 ? 1 : scores[i]);
  const int drop = in.pick(static_cast<int>(scores.size()));
  s.erase(s.begin(), s.begin() + (bits & 0x80 ? drop : 0));
  return mutate(in, s);
}

// Every mask component the bytes ask for, for scores (B, H, n, m) of a call of rank 3 or 4, with
// M the mask's float type.
template <class M>
struct MaskArgs {
  Strided<std::int64_t> lens, seg_q64, seg_k64;
  Strided<std::int32_t> seg_q32, seg_k32;
  Strided<bool> keep;
  Strided<M> additive, alibi;
  attn::Causal causal = attn::Causal::none;
  attn::MaskedFill fill = attn::MaskedFill::exclude;
  std::optional<attn::Window> window;
  index_t query_start = 0, key_start = 0;
  double bias = 0;  // the most the masks add to a score's size (ALiBi, additive)

  MaskArgs(Bytes& in, int rank, index_t B, index_t H, index_t n, index_t m) {
    const std::uint8_t which = in.u8();
    const std::vector<index_t> scores = rank == 4 ? std::vector<index_t>{B, H, n, m} : std::vector<index_t>{B, n, m};
    if (which & 1) {
      const bool per_query = in.flag();
      lens = Strided<std::int64_t>(in, mutate(in, per_query ? std::vector<index_t>{B, n} : std::vector<index_t>{B}),
                                   pick_layout(in), [&in, m] {
                                     const std::uint8_t b = in.u8();
                                     static constexpr double kOut[4] = {-1.0, 0.0, 1099511627776.0, -9.2233720368547758e18};
                                     return b < 220 ? static_cast<double>(b % (m + 1)) : b < 240 ? static_cast<double>(m + 1) : kOut[b % 4];
                                   }, false);
    }
    if (which & 2)
      keep = Strided<bool>(in, broadcast_shape(in, scores), pick_layout(in), [&in] { return in.u8() < 190 ? 1.0 : 0.0; });
    if (which & 4) {
      additive = Strided<M>(in, broadcast_shape(in, scores), pick_layout(in), [&in] {
        return in.chance(30) ? -std::numeric_limits<double>::infinity() : in.value();
      });
      bias += additive.max_abs();
    }
    if (which & 8) causal = static_cast<attn::Causal>(in.pick(3));
    if (which & 16) window = window_of(in);
    if (which & 32) {
      const bool wide = in.flag(), keys = in.flag(), only_keys = in.chance(10);
      auto ids = [&in] { return static_cast<double>(in.pick(3)); };
      if (wide) {
        if (!only_keys) seg_q64 = Strided<std::int64_t>(in, mutate(in, {B, n}), pick_layout(in), ids, false);
        if (keys || only_keys) seg_k64 = Strided<std::int64_t>(in, mutate(in, {B, m}), pick_layout(in), ids, false);
      } else {
        if (!only_keys) seg_q32 = Strided<std::int32_t>(in, mutate(in, {B, n}), pick_layout(in), ids, false);
        if (keys || only_keys) seg_k32 = Strided<std::int32_t>(in, mutate(in, {B, m}), pick_layout(in), ids, false);
      }
    }
    if (which & 64) {
      alibi = Strided<M>(in, mutate(in, in.flag() ? std::vector<index_t>{B, H} : std::vector<index_t>{H}), pick_layout(in),
                         [&in] { return in.value(); }, false);
    }
    if (which & 128) {
      if (in.chance(60)) fill = attn::MaskedFill::d2l_minus_1e6;
      if (in.flag()) query_start = position(in), key_start = position(in);
    }
    // ALiBi's -slope |p(i) - j| reaches slope times the largest distance of positions.
    if (alibi.given()) {
      const double reach = static_cast<double>(n + m) + std::abs(static_cast<double>(query_start)) +
                           std::abs(static_cast<double>(key_start));
      bias += alibi.max_abs() * reach;
    }
  }

  attn::Mask<M> mask() const {
    attn::Mask<M> k;
    k.valid_lens = lens.cview(), k.keep = keep.cview(), k.additive = additive.cview();
    k.causal = causal, k.fill = fill, k.window = window;
    if (seg_q64.given()) k.segment_ids_q = seg_q64.cview();
    if (seg_q32.given()) k.segment_ids_q = seg_q32.cview();
    if (seg_k64.given()) k.segment_ids_k = seg_k64.cview();
    if (seg_k32.given()) k.segment_ids_k = seg_k32.cview();
    k.alibi_slopes = alibi.cview();
    k.query_start = query_start, k.key_start = key_start;
    return k;
  }
};

// The same masks as dense float64 tensors, for the reference. Built in place; holds the tensors the mask views.
struct DenseMask {
  Tensor<std::int64_t> lens, seg_q, seg_k;
  Tensor<bool> keep;
  Tensor<double> additive, alibi;
  attn::Mask<double> mask;

  template <class M>
  explicit DenseMask(const MaskArgs<M>& a) {
    mask.causal = a.causal, mask.fill = a.fill, mask.window = a.window;
    mask.query_start = a.query_start, mask.key_start = a.key_start;
    if (a.lens.given()) lens = a.lens.template dense<std::int64_t>(), mask.valid_lens = lens.cview();
    if (a.keep.given()) keep = a.keep.template dense<bool>(), mask.keep = keep.cview();
    if (a.additive.given()) additive = a.additive.template dense<double>(), mask.additive = additive.cview();
    if (a.alibi.given()) alibi = a.alibi.template dense<double>(), mask.alibi_slopes = alibi.cview();
    if (a.seg_q64.given()) seg_q = a.seg_q64.template dense<std::int64_t>(), mask.segment_ids_q = seg_q.cview();
    if (a.seg_q32.given()) seg_q = a.seg_q32.template dense<std::int64_t>(), mask.segment_ids_q = seg_q.cview();
    if (a.seg_k64.given()) seg_k = a.seg_k64.template dense<std::int64_t>(), mask.segment_ids_k = seg_k.cview();
    if (a.seg_k32.given()) seg_k = a.seg_k32.template dense<std::int64_t>(), mask.segment_ids_k = seg_k.cview();
  }
  DenseMask(const DenseMask&) = delete;
};

// Dropout: mostly none; p valid or not (-0.1, 1, 1.5, NaN), and now and then the offsets.
attn::Dropout dropout(Bytes& in) {
  attn::Dropout d;
  if (!in.chance(50)) return d;
  static constexpr double kP[10] = {0.1, 0.5, 0.9, -0.1, 1.0, 1.5, std::numeric_limits<double>::quiet_NaN(), 0.999999, 1e-300, 0.0};
  d.p = kP[in.pick(10)];
  d.seed = in.u64();
  if (in.chance(25)) d.row_start = position(in), d.key_start = position(in), d.head_start = in.pick(3), d.heads = in.pick(5) - 1;
  return d;
}
double dropout_scale(const attn::Dropout& d) { return d.p > 0 && d.p < 1 ? 1 / (1 - d.p) : 1; }

// ---- scaled dot-product attention --------------------------------------------------------------

struct SdpaDims {
  int rank = 3;
  index_t B = 0, H = 1, Hk = 1, n = 0, m = 0, d = 0, dv = 0;
  std::vector<index_t> dims(index_t heads, index_t rows, index_t cols) const {
    return rank == 4 ? std::vector<index_t>{B, heads, rows, cols} : std::vector<index_t>{B, rows, cols};
  }
  std::vector<index_t> lse() const { return rank == 4 ? std::vector<index_t>{B, H, n} : std::vector<index_t>{B, n}; }
  bool too_large() const { return B * H > 64 || B * H * n * m * (d + dv + 1) > (1 << 15); }
};

SdpaDims sdpa_dims(Bytes& in) {
  SdpaDims s;
  s.rank = in.pick(5) < 2 ? 3 : 4;
  s.B = in.dim();
  if (s.rank == 4) {
    s.H = in.dim();
    switch (in.pick(4)) {  // grouped-query attention: Hk divides H, or not
      case 0: s.Hk = s.H; break;
      case 1: s.Hk = 1; break;
      case 2: s.Hk = s.H / 2; break;
      default: s.Hk = in.dim();
    }
  }
  s.n = in.dim(), s.m = in.dim(), s.d = in.dim(), s.dv = in.dim();
  return s;
}

attn::SdpaOptions sdpa_options(Bytes& in) {
  attn::SdpaOptions o;
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN(), kInf = std::numeric_limits<double>::infinity();
  if (in.chance(50)) {
    static constexpr double kScale[10] = {0.0, -1.0, 0.5, 1e-3, 2.0, kNaN, kInf, 1e300, 1e-300, 3e38};
    o.scale = kScale[in.pick(10)];
  }
  if (in.chance(40)) {
    static constexpr double kCap[9] = {0.5, 5.0, 30.0, 0.0, -1.0, kNaN, kInf, 1e-30, 1e300};
    o.softcap = kCap[in.pick(9)];
  }
  o.dropout = dropout(in);
  return o;
}

// Q: the queries' and out's element type; KV: the keys' and values'; L: lse's and the masks' (float
// for the 16-bit calls). Q == KV == L: the float and double calls; Q == KV 16-bit; Q float, KV 16-bit:
// a decoder reading a 16-bit cache (forward only).
// The scale a call uses (|scale|, or 1 / sqrt(d)), and the largest |score| it can see: scale q . k,
// soft-capped, plus the additive masks' largest bias. The comparisons' tolerances grow with it.
double scale_of(const attn::SdpaOptions& options, index_t d) {
  return options.scale ? std::abs(*options.scale) : 1 / std::sqrt(static_cast<double>(std::max<index_t>(d, 1)));
}
template <class Q, class KV>
double score_bound(double scale, index_t d, const Strided<Q>& q, const Strided<KV>& k, const attn::SdpaOptions& options,
                   double bias) {
  double smax = scale * static_cast<double>(d) * q.max_abs() * k.max_abs();
  if (options.softcap) smax = std::min(smax, *options.softcap);
  return smax + bias;
}

template <class Q, class KV, class L>
void sdpa_case(Bytes& in, bool backward) {
  const SdpaDims s = sdpa_dims(in);
  if (s.too_large()) return;
  const Strided<Q> q = input<Q>(in, s.dims(s.H, s.n, s.d));
  const Strided<KV> k = input<KV>(in, s.dims(s.Hk, s.m, s.d)), v = input<KV>(in, s.dims(s.Hk, s.m, s.dv));
  const MaskArgs<L> masks(in, s.rank, s.B, s.H, s.n, s.m);
  const attn::SdpaOptions options = sdpa_options(in);
  attn::Mask<L> mask_view;
  if (!computes([&] { mask_view = masks.mask(); })) return;  // a view's constructor refused a negative size
  constexpr bool kHalf = !std::is_same_v<KV, L>;
  constexpr bool kSame = std::is_same_v<Q, KV>;

  if (!backward) {
    Strided<Q> out = output<Q>(in, s.dims(s.H, s.n, s.dv));
    Strided<L> lse = output<L>(in, s.lse(), in.chance(100));
    Strided<Q> weights;
    if constexpr (!kHalf) weights = output<Q>(in, s.dims(s.H, s.n, s.m), in.chance(80));
    // out over the queries' memory: refused unless empty.
    const bool alias = kSame && in.chance(8);
    const bool ok = computes([&] {
      attn::TensorView<Q> o = alias ? attn::TensorView<Q>(q.data(), q.shape()) : out.view();
      if constexpr (!kHalf) attn::sdpa_forward<Q>(o, lse.view(), weights.view(), q.cview(), k.cview(), v.cview(), mask_view, options);
      else attn::sdpa_forward<KV>(o, lse.view(), q.cview(), k.cview(), v.cview(), mask_view, options);
    });
    if (!ok) return;
    if (alias && q.numel() > 0 && out.numel() > 0) broken("an output over an input's memory is refused");
    if (alias) return;
    check_input(q), check_input(k), check_input(v), check_output(out, "out"), check_output(lse, "lse"), check_output(weights, "weights");
    if (in.special) return;
    // The float64 reference on dense copies.
    const DenseMask dm(masks);
    const Tensor<double> qd = q.template dense<double>(), kd = k.template dense<double>(), vd = v.template dense<double>();
    Tensor<double> ro(out.shape()), rl(lse.given() ? lse.shape() : std::vector<index_t>{0}), rw(weights.given() ? weights.shape() : std::vector<index_t>{0});
    reference([&] {
      attn::sdpa_forward<double>(ro.view(), lse.given() ? rl.view() : attn::TensorView<double>{},
                                 weights.given() ? rw.view() : attn::TensorView<double>{}, qd.cview(), kd.cview(), vd.cview(), dm.mask, options);
    }, "sdpa_forward");
    const double scale = scale_of(options, s.d), smax = score_bound(scale, s.d, q, k, options, masks.bias);
    if (beyond_range<L>(smax) || scale_overflows<L>(options.scale)) return;
    const double tol = (kTol<Q> + kTol<float>) * (1 + smax);
    expect_close(out, ro, tol * at_least_1(v.max_abs()) * dropout_scale(options.dropout), tol, "sdpa_forward out");
    if (lse.given()) expect_close(lse, rl, tol * (1 + smax), tol, "sdpa_forward lse");
    if (weights.given()) expect_close(weights, rw, tol, tol, "sdpa_forward weights");
    return;
  } else if constexpr (kSame) {
    // The forward's out and lse (contiguous) for the backward, when it computes.
    Tensor<Q> fo(s.dims(s.H, s.n, s.dv));
    Tensor<L> fl(s.lse());
    const bool forward_ok = computes([&] {
      if constexpr (!kHalf) attn::sdpa_forward<Q>(fo.view(), fl.view(), {}, q.cview(), k.cview(), v.cview(), mask_view, options);
      else attn::sdpa_forward<KV>(fo.view(), fl.view(), q.cview(), k.cview(), v.cview(), mask_view, options);
    });
    const bool give_out = forward_ok && in.flag(), give_lse = forward_ok && in.flag();
    const Strided<Q> dout = input<Q>(in, s.dims(s.H, s.n, s.dv));
    Strided<Q> dq = output<Q>(in, q.shape(), in.chance(200)), dk = output<Q>(in, k.shape(), in.chance(200));
    Strided<Q> dv = output<Q>(in, v.shape(), in.chance(200));
    const bool ok = computes([&] {
      const attn::TensorView<const Q> o = give_out ? fo.cview() : attn::TensorView<const Q>{};
      const attn::TensorView<const L> l = give_lse ? fl.cview() : attn::TensorView<const L>{};
      if constexpr (!kHalf) attn::sdpa_backward<Q>(dq.view(), dk.view(), dv.view(), dout.cview(), q.cview(), k.cview(), v.cview(), o, l, mask_view, options);
      else attn::sdpa_backward<KV>(dq.view(), dk.view(), dv.view(), dout.cview(), q.cview(), k.cview(), v.cview(), o, l, mask_view, options);
    });
    if (!ok) return;
    check_input(q), check_input(k), check_input(v), check_input(dout);
    check_output(dq, "dqueries"), check_output(dk, "dkeys"), check_output(dv, "dvalues");
    if (in.special) return;
    const DenseMask dm(masks);
    const Tensor<double> qd = q.template dense<double>(), kd = k.template dense<double>(), vd = v.template dense<double>();
    const Tensor<double> gd = dout.template dense<double>();
    std::vector<index_t> lse_shape = dout.shape();  // the accepted shapes, not the decoded ones
    lse_shape.pop_back();
    Tensor<double> ro(dout.shape()), rl(lse_shape), rdq(q.shape()), rdk(k.shape()), rdv(v.shape());
    reference([&] {
      attn::sdpa_forward<double>(ro.view(), rl.view(), {}, qd.cview(), kd.cview(), vd.cview(), dm.mask, options);
      attn::sdpa_backward<double>(dq.given() ? rdq.view() : attn::TensorView<double>{}, dk.given() ? rdk.view() : attn::TensorView<double>{},
                                  dv.given() ? rdv.view() : attn::TensorView<double>{}, gd.cview(), qd.cview(), kd.cview(), vd.cview(),
                                  give_out ? ro.cview() : attn::TensorView<const double>{},
                                  give_lse ? rl.cview() : attn::TensorView<const double>{}, dm.mask, options);
    }, "sdpa_backward");
    const double scale = scale_of(options, s.d), smax = score_bound(scale, s.d, q, k, options, masks.bias);
    if (beyond_range<L>(smax) || scale_overflows<L>(options.scale)) return;
    const double tol = (kTol<Q> + kTol<float>) * (1 + smax);
    const double df = dropout_scale(options.dropout), g = at_least_1(dout.max_abs());
    const double ds = 2 * static_cast<double>(s.dv) * g * at_least_1(v.max_abs()) * df;  // |dS| bound
    const double group = static_cast<double>(s.Hk > 0 ? std::max<index_t>(s.H / s.Hk, 1) : 1);
    if (dq.given()) expect_close(dq, rdq, tol * at_least_1(scale) * static_cast<double>(s.m) * ds * at_least_1(k.max_abs()), tol, "sdpa_backward dqueries");
    if (dk.given()) expect_close(dk, rdk, tol * group * at_least_1(scale) * static_cast<double>(s.n) * ds * at_least_1(q.max_abs()), tol, "sdpa_backward dkeys");
    if (dv.given()) expect_close(dv, rdv, tol * group * static_cast<double>(s.n) * g * df, tol, "sdpa_backward dvalues");
  }
}

// ---- masked softmax, bmm -----------------------------------------------------------------------

template <class T>
void softmax_case(Bytes& in) {
  const int rank = in.pick(5) < 2 ? 3 : 4;
  const index_t B = in.dim(), H = rank == 4 ? in.dim() : 1, n = in.dim(), m = in.dim();
  if (B * H * n * m > (1 << 14)) return;
  const std::vector<index_t> shape = rank == 4 ? std::vector<index_t>{B, H, n, m} : std::vector<index_t>{B, n, m};
  Strided<T> scores = input<T>(in, shape);
  const MaskArgs<T> masks(in, rank, B, H, n, m);
  attn::Mask<T> mask;
  if (!computes([&] { mask = masks.mask(); })) return;  // a view's constructor refused a negative size
  const bool backward = in.flag(), in_place = in.chance(40);
  const std::vector<double> before = scores.values();  // in place, the scores are overwritten
  Strided<T> weights = output<T>(in, shape);
  const bool ok = computes([&] {
    attn::masked_softmax_forward<T>(in_place ? scores.view() : weights.view(), scores.cview(), mask);
  });
  if (!ok) return;
  const Strided<T>& w = in_place ? scores : weights;
  check_input(scores), check_output(w, "weights");
  const bool comparable = !in.special;
  const DenseMask dm(masks);
  Tensor<double> sd(scores.shape()), rw(scores.shape());
  std::copy(before.begin(), before.end(), sd.data());
  if (comparable) {
    reference([&] { attn::masked_softmax_forward<double>(rw.view(), sd.cview(), dm.mask); }, "masked_softmax_forward");
    if (beyond_range<T>(scores.max_abs() + masks.bias)) return;
    const double tol = (kTol<T> + kTol<float>) * (1 + std::max(scores.max_abs(), 0.0) * 2 + masks.bias);
    expect_close(w, rw, tol, tol, "masked_softmax_forward weights");
  }
  if (!backward) return;
  Strided<T> dweights = input<T>(in, shape);
  const bool over_dweights = in.chance(60);
  const std::vector<double> g = dweights.values();
  const double gmax = dweights.max_abs();
  Strided<T> dscores = output<T>(in, shape);
  const bool bok = computes([&] {
    attn::masked_softmax_backward<T>(over_dweights ? dweights.view() : dscores.view(), dweights.cview(), w.cview(), mask);
  });
  if (!bok || in.special || !comparable) return;
  const Strided<T>& ds = over_dweights ? dweights : dscores;
  check_output(ds, "dscores");
  Tensor<double> gd(dweights.shape()), rds(dweights.shape());
  const Tensor<double> wd = w.template dense<double>();
  std::copy(g.begin(), g.end(), gd.data());
  reference([&] { attn::masked_softmax_backward<double>(rds.view(), gd.cview(), wd.cview(), dm.mask); }, "masked_softmax_backward");
  const double tol = kTol<T> * 4;
  expect_close(ds, rds, tol * at_least_1(static_cast<double>(m)) * at_least_1(gmax), tol, "masked_softmax_backward dscores");
}

template <class T>
void bmm_case(Bytes& in) {
  const int rank = in.pick(5) < 2 ? 3 : 4;
  const index_t B = in.dim(), H = rank == 4 ? in.dim() : 1, r = in.dim(), k = in.dim(), c = in.dim();
  if (B * H * r * k * c > (1 << 15)) return;
  const bool ta = in.flag(), tb = in.flag(), backward = in.flag();
  auto dims = [&](index_t a, index_t b) { return rank == 4 ? std::vector<index_t>{B, H, a, b} : std::vector<index_t>{B, a, b}; };
  const Strided<T> a = input<T>(in, ta ? dims(k, r) : dims(r, k)), b = input<T>(in, tb ? dims(c, k) : dims(k, c));
  const double tol = kTol<T> * at_least_1(static_cast<double>(k + r + c)) * at_least_1(a.max_abs()) * at_least_1(b.max_abs());
  if (!backward) {
    Strided<T> out = output<T>(in, dims(r, c));
    if (!computes([&] { attn::bmm_forward<T>(out.view(), a.cview(), b.cview(), ta, tb); })) return;
    check_input(a), check_input(b), check_output(out, "out");
    if (in.special) return;
    const Tensor<double> ad = a.template dense<double>(), bd = b.template dense<double>();
    Tensor<double> ro(out.shape());
    reference([&] { attn::bmm_forward<double>(ro.view(), ad.cview(), bd.cview(), ta, tb); }, "bmm_forward");
    expect_close(out, ro, tol, kTol<T>, "bmm_forward out");
    return;
  }
  const Strided<T> dout = input<T>(in, dims(r, c));
  Strided<T> da = output<T>(in, a.shape(), in.chance(200)), db = output<T>(in, b.shape(), in.chance(200));
  if (!computes([&] { attn::bmm_backward<T>(da.view(), db.view(), dout.cview(), a.cview(), b.cview(), ta, tb); })) return;
  check_input(a), check_input(b), check_input(dout), check_output(da, "da"), check_output(db, "db");
  if (in.special) return;
  const Tensor<double> ad = a.template dense<double>(), bd = b.template dense<double>(), gd = dout.template dense<double>();
  Tensor<double> rda(a.shape()), rdb(b.shape());
  reference([&] {
    attn::bmm_backward<double>(da.given() ? rda.view() : attn::TensorView<double>{}, db.given() ? rdb.view() : attn::TensorView<double>{},
                               gd.cview(), ad.cview(), bd.cview(), ta, tb);
  }, "bmm_backward");
  const double g = at_least_1(dout.max_abs());
  if (da.given()) expect_close(da, rda, tol * g, kTol<T>, "bmm_backward da");
  if (db.given()) expect_close(db, rdb, tol * g, kTol<T>, "bmm_backward db");
}

// ---- additive attention, Nadaraya-Watson ---------------------------------------------------------

template <class T>
void additive_case(Bytes& in) {
  const int rank = in.pick(5) < 2 ? 3 : 4;
  const index_t B = in.dim(), H = rank == 4 ? in.dim() : 1, n = in.dim(), m = in.dim();
  const index_t qs = in.dim(), ks = in.dim(), vs = in.dim(), h = in.dim();
  if (B * H > 64 || B * H * n * m * (h + vs + 1) > (1 << 14) || h * (qs + ks) > 1024) return;
  auto dims = [&](index_t a, index_t b) { return rank == 4 ? std::vector<index_t>{B, H, a, b} : std::vector<index_t>{B, a, b}; };
  const Strided<T> q = input<T>(in, dims(n, qs)), k = input<T>(in, dims(m, ks)), v = input<T>(in, dims(m, vs));
  const Strided<T> wq = input<T>(in, {h, qs}), wk = input<T>(in, {h, ks}), wv = input<T>(in, {h});
  const MaskArgs<T> masks(in, rank, B, H, n, m);
  attn::Mask<T> mask;
  if (!computes([&] { mask = masks.mask(); })) return;  // a view's constructor refused a negative size
  const attn::Dropout drop = dropout(in);
  const bool backward = in.flag();
  attn::AdditiveParams<T> params;
  computes([&] { params = {wq.cview(), wk.cview(), wv.cview()}; });
  const double smax = static_cast<double>(h) * wv.max_abs() + masks.bias, df = dropout_scale(drop);
  const double tol = 2 * kTol<T> * (1 + smax);
  const bool comparable = !beyond_range<T>(smax);
  if (!backward) {
    Strided<T> out = output<T>(in, dims(n, vs), !in.chance(5)), weights = output<T>(in, dims(n, m), in.chance(100));
    if (!computes([&] { attn::additive_attention_forward<T>(out.view(), weights.view(), q.cview(), k.cview(), v.cview(), params, mask, drop); }))
      return;
    check_input(q), check_input(k), check_input(v), check_output(out, "out"), check_output(weights, "weights");
    if (in.special || !comparable) return;
    const DenseMask dm(masks);
    const Tensor<double> qd = q.template dense<double>(), kd = k.template dense<double>(), vd = v.template dense<double>();
    const Tensor<double> wqd = wq.template dense<double>(), wkd = wk.template dense<double>(), wvd = wv.template dense<double>();
    Tensor<double> ro(out.shape()), rw(weights.given() ? weights.shape() : std::vector<index_t>{0});
    reference([&] {
      attn::additive_attention_forward<double>(ro.view(), weights.given() ? rw.view() : attn::TensorView<double>{}, qd.cview(), kd.cview(), vd.cview(),
                                               {wqd.cview(), wkd.cview(), wvd.cview()}, dm.mask, drop);
    }, "additive_attention_forward");
    expect_close(out, ro, tol * at_least_1(v.max_abs()) * df, tol, "additive_attention_forward out");
    if (weights.given()) expect_close(weights, rw, tol, tol, "additive_attention_forward weights");
    return;
  }
  const Strided<T> dout = input<T>(in, dims(n, vs));
  Strided<T> dq = output<T>(in, q.shape(), in.chance(200)), dk = output<T>(in, k.shape(), in.chance(200));
  Strided<T> dv = output<T>(in, v.shape(), in.chance(200));
  Strided<T> gq = output<T>(in, wq.shape(), !in.chance(5)), gk = output<T>(in, wk.shape()), gv = output<T>(in, wv.shape());
  const bool ok = computes([&] {
    attn::additive_attention_backward<T>(dq.view(), dk.view(), dv.view(), {gq.view(), gk.view(), gv.view()}, dout.cview(),
                                         q.cview(), k.cview(), v.cview(), params, mask, drop);
  });
  if (!ok) return;
  check_input(dout), check_output(dq, "dqueries"), check_output(dk, "dkeys"), check_output(dv, "dvalues");
  check_output(gq, "grads.w_q"), check_output(gk, "grads.w_k"), check_output(gv, "grads.w_v");
  if (in.special || !comparable) return;
  const DenseMask dm(masks);
  const Tensor<double> qd = q.template dense<double>(), kd = k.template dense<double>(), vd = v.template dense<double>();
  const Tensor<double> wqd = wq.template dense<double>(), wkd = wk.template dense<double>(), wvd = wv.template dense<double>();
  const Tensor<double> gd = dout.template dense<double>();
  Tensor<double> rdq(q.shape()), rdk(k.shape()), rdv(v.shape()), rgq(wq.shape()), rgk(wk.shape()), rgv(wv.shape());
  reference([&] {
    attn::additive_attention_backward<double>(dq.given() ? rdq.view() : attn::TensorView<double>{},
                                              dk.given() ? rdk.view() : attn::TensorView<double>{},
                                              dv.given() ? rdv.view() : attn::TensorView<double>{},
                                              {rgq.view(), rgk.view(), rgv.view()}, gd.cview(), qd.cview(), kd.cview(), vd.cview(),
                                              {wqd.cview(), wkd.cview(), wvd.cview()}, dm.mask, drop);
  }, "additive_attention_backward");
  // A loose bound of every gradient: the sizes summed over times the largest factors.
  const double big = static_cast<double>(B * H * n * m + 1) * 2 * static_cast<double>(vs + 1) * at_least_1(dout.max_abs()) *
                     at_least_1(v.max_abs()) * df * at_least_1(wv.max_abs()) * at_least_1(std::max(wq.max_abs(), wk.max_abs())) *
                     at_least_1(std::max(q.max_abs(), k.max_abs())) * static_cast<double>(h + 1);
  if (dq.given()) expect_close(dq, rdq, tol * big, tol, "additive_attention_backward dqueries");
  if (dk.given()) expect_close(dk, rdk, tol * big, tol, "additive_attention_backward dkeys");
  if (dv.given()) expect_close(dv, rdv, tol * big, tol, "additive_attention_backward dvalues");
  expect_close(gq, rgq, tol * big, tol, "additive_attention_backward grads.w_q");
  expect_close(gk, rgk, tol * big, tol, "additive_attention_backward grads.w_k");
  expect_close(gv, rgv, tol * big, tol, "additive_attention_backward grads.w_v");
}

template <class T>
void nw_case(Bytes& in) {
  const int rank = in.pick(5) < 2 ? 3 : 4;
  const index_t B = in.dim(), H = rank == 4 ? in.dim() : 1, n = in.dim(), m = in.dim(), p = in.dim(), vs = in.dim();
  if (B * H > 64 || B * H * n * m * (p + vs + 1) > (1 << 15)) return;
  auto dims = [&](index_t a, index_t b) { return rank == 4 ? std::vector<index_t>{B, H, a, b} : std::vector<index_t>{B, a, b}; };
  const Strided<T> q = input<T>(in, dims(n, p)), k = input<T>(in, dims(m, p)), v = input<T>(in, dims(m, vs));
  const std::uint8_t kb = in.u8();
  const auto kernel = static_cast<attn::Kernel>(kb < 240 ? kb % 4 : 4 + kb % 4);  // 4..7: not a Kernel
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN(), kInf = std::numeric_limits<double>::infinity();
  static constexpr double kSigma[13] = {0.5, 1.0, 2.0, 0.25, 0.1, 3.0, 0.0, -1.0, kNaN, kInf, 1e-30, 1e30, 1e-3};
  const T sigma = static_cast<T>(kSigma[in.pick(13)]);
  const bool backward = in.flag();
  Strided<T> out, weights, dq, dk, dv;
  Strided<T> dout;
  T dsigma = std::numeric_limits<T>::quiet_NaN();
  bool want_dsigma = false;
  bool ok = false;
  if (!backward) {
    out = output<T>(in, dims(n, vs), !in.chance(5)), weights = output<T>(in, dims(n, m), in.chance(100));
    ok = computes([&] { attn::nadaraya_watson_forward<T>(out.view(), weights.view(), q.cview(), k.cview(), v.cview(), kernel, sigma); });
  } else {
    dout = input<T>(in, dims(n, vs));
    dq = output<T>(in, q.shape(), in.chance(200)), dk = output<T>(in, k.shape(), in.chance(200)), dv = output<T>(in, v.shape(), in.chance(200));
    want_dsigma = in.flag();
    ok = computes([&] {
      attn::nadaraya_watson_backward<T>(dq.view(), dk.view(), dv.view(), want_dsigma ? &dsigma : nullptr, dout.cview(), q.cview(), k.cview(),
                                        v.cview(), kernel, sigma);
    });
  }
  if (!ok) return;
  check_input(q), check_input(k), check_input(v), check_input(dout);
  check_output(out, "out"), check_output(weights, "weights"), check_output(dq, "dqueries"), check_output(dk, "dkeys"), check_output(dv, "dvalues");
  if (in.special) return;
  const Tensor<double> qd = q.template dense<double>(), kd = k.template dense<double>(), vd = v.template dense<double>();
  // u = |q - k| / sigma over every pair: the Gaussian's score size, and the compact kernels' edge
  // u = 1, where float and double may rightly disagree about a key.
  const double s = static_cast<double>(sigma);
  double umax = 0, dmax = 0;
  bool edge = false;
  const index_t pairs_b = B * H;
  for (index_t bh = 0; bh < pairs_b; ++bh)
    for (index_t i = 0; i < n; ++i)
      for (index_t j = 0; j < m; ++j) {
        double d2 = 0;
        for (index_t c = 0; c < p; ++c) {
          const double x = qd.data()[(bh * n + i) * p + c] - kd.data()[(bh * m + j) * p + c];
          d2 += x * x;
        }
        const double u = std::sqrt(d2) / s;
        umax = std::max(umax, u), dmax = std::max(dmax, std::sqrt(d2));
        edge = edge || std::abs(u - 1) < 1e-3;
      }
  if (edge && (kernel == attn::Kernel::boxcar || kernel == attn::Kernel::epanechnikov)) return;
  const double smax = kernel == attn::Kernel::gaussian ? umax * umax / 2 : 0;
  if (beyond_range<T>(smax) || beyond_range<T>(1 / s)) return;
  const double tol = 2 * kTol<T> * (1 + smax);
  if (!backward) {
    Tensor<double> ro(out.shape()), rw(weights.given() ? weights.shape() : std::vector<index_t>{0});
    reference([&] { attn::nadaraya_watson_forward<double>(ro.view(), weights.given() ? rw.view() : attn::TensorView<double>{}, qd.cview(), kd.cview(), vd.cview(), kernel, s); },
              "nadaraya_watson_forward");
    expect_close(out, ro, tol * at_least_1(v.max_abs()), tol, "nadaraya_watson_forward out");
    if (weights.given()) expect_close(weights, rw, tol, tol, "nadaraya_watson_forward weights");
    return;
  }
  const Tensor<double> gd = dout.template dense<double>();
  Tensor<double> rdq(q.shape()), rdk(k.shape()), rdv(v.shape());
  double rds = 0;
  reference([&] {
    attn::nadaraya_watson_backward<double>(dq.given() ? rdq.view() : attn::TensorView<double>{},
                                           dk.given() ? rdk.view() : attn::TensorView<double>{},
                                           dv.given() ? rdv.view() : attn::TensorView<double>{}, want_dsigma ? &rds : nullptr,
                                           gd.cview(), qd.cview(), kd.cview(), vd.cview(), kernel, s);
  }, "nadaraya_watson_backward");
  const double big = static_cast<double>(B * H * n * m + 1) * static_cast<double>(vs + 1) * at_least_1(dout.max_abs()) *
                     at_least_1(v.max_abs()) * (1 + umax) * (1 + umax) * (1 + dmax) * (1 + 1 / s);
  if (dq.given()) expect_close(dq, rdq, tol * big, tol, "nadaraya_watson_backward dqueries");
  if (dk.given()) expect_close(dk, rdk, tol * big, tol, "nadaraya_watson_backward dkeys");
  if (dv.given()) expect_close(dv, rdv, tol * big, tol, "nadaraya_watson_backward dvalues");
  if (want_dsigma && !(std::abs(static_cast<double>(dsigma) - rds) <= tol * big * (1 + 1 / s) + tol * std::abs(rds))) {
    std::fprintf(stderr, "api_fuzz: nadaraya_watson_backward dsigma is %.17g but the reference gives %.17g\n", static_cast<double>(dsigma), rds);
    broken("the cpu backend matches the reference");
  }
}

// ---- the KV cache ------------------------------------------------------------------------------

// A short life of a cache: appends (one sequence or all), attends, truncates and resets, each with
// arguments right or wrong, against a shadow of what was appended.
void kv_cache_case(Bytes& in) {
  static constexpr index_t kBatch[6] = {1, 1, 2, 3, 0, -1}, kHeads[5] = {1, 2, 1, 3, 0};
  static constexpr index_t kDim[9] = {1, 2, 3, 4, 8, 32, 64, 0, 33};
  // 32 and 64: head_dim as int8 and the 4-bit types need it (a multiple of 32); block sizes 32 and
  // 256 as int4_kivi needs them (a multiple of 32: a key group's 32 tokens lie in one block).
  static constexpr index_t kBlock[10] = {1, 2, 3, 4, 16, 256, 0, -1, index_t(1) << 30, 32};
  static constexpr index_t kCapacity[8] = {0, 0, 1, 2, 3, 5, 8, -1};
  const index_t batch = kBatch[in.pick(6)], kvh = kHeads[in.pick(5)], hd = kDim[in.pick(9)];
  attn::KvCacheOptions options;
  options.dtype = static_cast<attn::KvDtype>(in.pick(8));  // every KvDtype, float32 .. int4_kivi
  options.block_size = kBlock[in.pick(10)], options.capacity = kCapacity[in.pick(8)], options.grow = !in.chance(60);
  const bool four_bit = options.dtype == attn::KvDtype::int4 || options.dtype == attn::KvDtype::int4_kivi;
  const bool kivi = options.dtype == attn::KvDtype::int4_kivi;
  std::optional<attn::KvCache> cache;
  if (!computes([&] { cache.emplace(batch, kvh, hd, options); })) return;
  // shadow[seq][token]: the token's keys then values, (kv_heads, head_dim) each, as appended.
  std::vector<std::vector<std::vector<double>>> shadow(static_cast<std::size_t>(batch));
  auto pick_seq = [&] { return in.chance(15) ? (in.flag() ? index_t(-1) : batch) : in.pick(static_cast<int>(batch)); };
  auto lengths = [&] {
    std::vector<index_t> l;
    for (index_t b = 0; b < batch; ++b) l.push_back(cache->length(b));
    return l;
  };
  // Appends (kv_heads, t, head_dim) keys and values, given as C-order values, to the shadow of seq.
  auto remember = [&](index_t seq, const std::vector<double>& k, const std::vector<double>& v, index_t t, index_t first) {
    for (index_t r = 0; r < t; ++r) {
      std::vector<double> token;
      for (const auto* x : {&k, &v})
        for (index_t h = 0; h < kvh; ++h)
          for (index_t c = 0; c < hd; ++c) token.push_back((*x)[static_cast<std::size_t>(first + (h * t + r) * hd + c)]);
      shadow[static_cast<std::size_t>(seq)].push_back(std::move(token));
    }
  };
  // Tokens appended: 0 to 3, or for int4_kivi now and then 29 to 32, so that its key groups of 32
  // tokens fill (and are quantized from the bfloat16 tail) at every phase.
  auto tokens_to_append = [&] { return in.pick(4) + (kivi && in.chance(64) ? index_t(29) : index_t(0)); };
  // A 4-bit cache refuses keys or values that are not finite or beyond 2^126 in magnitude (their
  // group's range, max - min, would overflow float32): one it accepted held none.
  auto accepted = [&](const std::vector<double>& k, const std::vector<double>& v) {
    if (!four_bit) return;
    for (const auto* x : {&k, &v})
      for (double e : *x)
        if (!(std::abs(e) <= 0x1p126)) {
          std::fprintf(stderr, "api_fuzz: KvCache: a %s cache accepted %.9g\n", kivi ? "int4_kivi" : "int4", e);
          broken("a 4-bit KvCache refuses values that are not finite or beyond 2^126");
        }
  };
  // What the cache returns for sequence b is what was appended, within the storage type's rounding.
  auto check_stored = [&](index_t b) {
    const Tensor<float> ks = cache->keys(b), vs = cache->values(b);
    const auto& tokens = shadow[static_cast<std::size_t>(b)];
    const index_t L = static_cast<index_t>(tokens.size());
    const index_t tail = kivi ? L / 32 * 32 : L;  // int4_kivi: tokens from here on are kept in bfloat16
    // A 4-bit group's rounding, (max - lo) / 30, with float32's of the scale, the codes' product and
    // the fused multiply-add (a few ulp of the group's largest magnitude); over bfloat16 values for
    // int4_kivi (a group's max and lo move by 2^-8 of theirs at most).
    auto q4_bound = [&](double top, double lo, bool bf16) {
      const double range = top - lo + (bf16 ? (std::abs(top) + std::abs(lo)) / 256 : 0.0);
      return range / 30 + std::max(std::abs(top), std::abs(lo)) * 0x1p-18 + 0x1p-140;
    };
    for (index_t r = 0; r < L; ++r)
      for (int which = 0; which < 2; ++which)
        for (index_t h = 0; h < kvh; ++h)
          for (index_t c = 0; c < hd; ++c) {
            const std::vector<double>& token = tokens[static_cast<std::size_t>(r)];
            const auto at = [&](index_t e) { return static_cast<std::size_t>((which * kvh + h) * hd + e); };
            const double want = token[at(c)];
            const double got = (which == 0 ? ks : vs).data()[(h * L + r) * hd + c];
            double bound = 0;
            switch (options.dtype) {
              case attn::KvDtype::float32: bound = 0; break;
              case attn::KvDtype::bfloat16: bound = std::abs(want) / 256; break;
              case attn::KvDtype::float16: bound = std::abs(want) / 2048 + 3e-8; break;
              // Scale 1: half a step of 3 or 2 mantissa bits, or of the subnormals (kv_cache.hpp).
              case attn::KvDtype::float8_e4m3: bound = std::abs(want) / 16 + 0x1p-10; break;
              case attn::KvDtype::float8_e5m2: bound = std::abs(want) / 8 + 0x1p-17; break;
              case attn::KvDtype::int8: {
                double top = 0;
                for (index_t e = c / 32 * 32; e < c / 32 * 32 + 32; ++e) top = std::max(top, std::abs(token[at(e)]));
                bound = top / 254 * (1 + 1e-5);
                break;
              }
              case attn::KvDtype::int4: {  // the 32 values of the row's group
                double top = -HUGE_VAL, lo = HUGE_VAL;
                for (index_t e = c / 32 * 32; e < c / 32 * 32 + 32; ++e) top = std::max(top, token[at(e)]), lo = std::min(lo, token[at(e)]);
                bound = q4_bound(top, lo, false);
                break;
              }
              case attn::KvDtype::int4_kivi: {
                bound = std::abs(want) / 256;  // bfloat16, in the tail or before its group was quantized
                if (r >= tail) break;
                double top = -HUGE_VAL, lo = HUGE_VAL;
                if (which == 0)  // keys: channel c of the group's 32 tokens
                  for (index_t i = r / 32 * 32; i < r / 32 * 32 + 32; ++i) {
                    const double x = tokens[static_cast<std::size_t>(i)][at(c)];
                    top = std::max(top, x), lo = std::min(lo, x);
                  }
                else  // values: per token, as int4
                  for (index_t e = c / 32 * 32; e < c / 32 * 32 + 32; ++e) top = std::max(top, token[at(e)]), lo = std::min(lo, token[at(e)]);
                bound += q4_bound(top, lo, true);
                break;
              }
            }
            if (!(std::abs(got - want) <= bound)) {
              std::fprintf(stderr, "api_fuzz: KvCache: sequence %lld token %lld head %lld element %lld is %.9g but %.9g was appended\n",
                           static_cast<long long>(b), static_cast<long long>(r), static_cast<long long>(h), static_cast<long long>(c), got, want);
              broken("KvCache::keys and values return what was appended");
            }
          }
  };
  const int steps = 1 + in.pick(8);
  for (int step = 0; step < steps; ++step) {
    const std::vector<index_t> before = lengths();
    switch (in.pick(6)) {
      case 0: {  // append to one sequence
        const index_t seq = pick_seq(), t = tokens_to_append();
        const Strided<float> k = input<float>(in, {kvh, t, hd}, false), v = input<float>(in, {kvh, t, hd}, false);
        if (computes([&] { cache->append(seq, k.cview(), v.cview()); })) {
          accepted(k.values(), v.values());
          remember(seq, k.values(), v.values(), t, 0);
        }
        break;
      }
      case 1: {  // append to every sequence
        const index_t t = tokens_to_append();
        const Strided<float> k = input<float>(in, {batch, kvh, t, hd}, false), v = input<float>(in, {batch, kvh, t, hd}, false);
        if (computes([&] { cache->append(k.cview(), v.cview()); })) {
          const std::vector<double> kv = k.values(), vv = v.values();
          accepted(kv, vv);
          for (index_t b = 0; b < batch; ++b) remember(b, kv, vv, t, b * kvh * t * hd);
        }
        break;
      }
      case 2:
      case 3: {  // attend: one sequence, or every one
        const bool all = in.flag();
        const index_t H = in.chance(20) ? in.dim() : kvh * (1 + in.pick(3)), n = in.dim();
        const index_t seq = all ? 0 : pick_seq();
        const bool four = all || in.flag();
        std::vector<index_t> shape = four ? std::vector<index_t>{all ? batch : 1, H, n, hd} : std::vector<index_t>{H, n, hd};
        // Finding 6, fixed: attend over every sequence sliced queries and out by their batch stride
        // without checking it (a batch stride of 0 in out was accepted, an overflowing one used in
        // pointer arithmetic); both are checked first now. Every layout.
        auto plain = [&](bool is_output) {
          const std::vector<index_t> sh = mutate(in, shape);
          Layout l = pick_layout(in);
          if (is_output) return Strided<float>(in, sh, l, [] { return std::numeric_limits<double>::quiet_NaN(); });
          return Strided<float>(in, sh, l, [&in] { return in.value(); });
        };
        const Strided<float> queries = plain(false);
        Strided<float> out = plain(true);
        attn::KvAttendOptions o;
        o.causal = static_cast<attn::Causal>(in.pick(4) % 3 == 0 ? 2 : in.pick(3));
        if (in.chance(40)) o.window = window_of(in);
        Strided<float> alibi;
        if (in.chance(40)) alibi = input<float>(in, {H}, false);
        if (in.chance(40)) o.softcap = std::vector<double>{0.5, 5.0, 0.0, -1.0}[static_cast<std::size_t>(in.pick(4))];
        if (in.chance(40)) o.scale = std::vector<double>{0.5, 2.0, 0.0, std::numeric_limits<double>::quiet_NaN()}[static_cast<std::size_t>(in.pick(4))];
        const bool ok = computes([&] {
          o.alibi_slopes = alibi.cview();
          if (all) cache->attend(out.view(), queries.cview(), o);
          else cache->attend(out.view(), seq, queries.cview(), o);
        });
        if (!ok) break;
        check_input(queries), check_output(out, "KvCache::attend out");
        if (in.special) break;
        // The reference: sdpa over each sequence's keys and values as stored.
        const std::vector<double> qv = queries.values();
        Tensor<double> ro(std::vector<index_t>{all ? batch : 1, H, n, hd});
        double smax = 0;
        for (index_t b = 0; b < (all ? batch : 1); ++b) {
          const index_t s = all ? b : seq, L = cache->length(s);
          const Tensor<float> ks = cache->keys(s), vs = cache->values(s);
          Tensor<double> qd({1, H, n, hd}), kd({1, kvh, L, hd}), vd({1, kvh, L, hd}), od({1, H, n, hd});
          std::copy(qv.begin() + b * H * n * hd, qv.begin() + (b + 1) * H * n * hd, qd.data());
          std::copy(ks.data(), ks.data() + ks.numel(), kd.data());
          std::copy(vs.data(), vs.data() + vs.numel(), vd.data());
          attn::Mask<double> mask;
          mask.causal = o.causal, mask.window = o.window, mask.align = attn::Align::bottom_right;  // the newest tokens
          const Tensor<double> slopes = alibi.given() ? alibi.dense<double>() : Tensor<double>();
          if (alibi.given()) mask.alibi_slopes = slopes.cview();
          attn::SdpaOptions so;
          so.scale = o.scale, so.softcap = o.softcap;
          reference([&] { attn::sdpa_forward<double>(od.view(), {}, {}, qd.cview(), kd.cview(), vd.cview(), mask, so); }, "KvCache::attend");
          std::copy(od.data(), od.data() + od.numel(), ro.data() + b * H * n * hd);
          double kmax = 0;
          for (index_t e = 0; e < ks.numel(); ++e) kmax = std::max(kmax, std::abs(static_cast<double>(ks.data()[e])));
          const double scale = o.scale ? std::abs(*o.scale) : 1 / std::sqrt(static_cast<double>(hd));
          smax = std::max(smax, scale * static_cast<double>(hd) * queries.max_abs() * kmax +
                                    (alibi.given() ? alibi.max_abs() * static_cast<double>(n + L) : 0.0));
        }
        if (beyond_range<float>(smax) || scale_overflows<float>(o.scale)) break;
        const double tol = 2 * kTol<float> * (1 + smax);
        double vmax = 1;
        for (index_t b = 0; b < batch; ++b)
          for (const auto& token : shadow[static_cast<std::size_t>(b)])
            for (double x : token) vmax = std::max(vmax, std::abs(x));
        expect_close(out, ro, tol * vmax * 2, tol, "KvCache::attend out");
        break;
      }
      case 4: {  // truncate
        const index_t seq = pick_seq();
        static constexpr int kWhere[5] = {0, 1, 2, 3, 4};
        const int where = kWhere[in.pick(5)];
        const index_t now = seq >= 0 && seq < batch ? before[static_cast<std::size_t>(seq)] : 0;
        const index_t length = where == 0 ? 0 : where == 1 ? now / 2 : where == 2 ? now : where == 3 ? now + 1 : -1;
        // int4_kivi: a truncate inside a full group keeps its first tokens as they read back (rounded to
        // bfloat16, in the tail again), so they are checked first and the shadow takes them as read.
        if (kivi && !in.special && seq >= 0 && seq < batch) check_stored(seq);
        if (computes([&] { cache->truncate(seq, length); })) {
          auto& tokens = shadow[static_cast<std::size_t>(seq)];
          tokens.resize(static_cast<std::size_t>(length));
          if (kivi) {
            const Tensor<float> ks = cache->keys(seq), vs = cache->values(seq);
            for (index_t r = length / 32 * 32; r < length; ++r)
              for (int which = 0; which < 2; ++which)
                for (index_t h = 0; h < kvh; ++h)
                  for (index_t c = 0; c < hd; ++c)
                    tokens[static_cast<std::size_t>(r)][static_cast<std::size_t>((which * kvh + h) * hd + c)] =
                        (which == 0 ? ks : vs).data()[(h * length + r) * hd + c];
          }
        }
        break;
      }
      default: {  // reset
        const index_t seq = pick_seq();
        if (computes([&] { cache->reset(seq); })) shadow[static_cast<std::size_t>(seq)].clear();
        break;
      }
    }
    // Whatever happened, the lengths are the shadow's: a refused call changed nothing.
    for (index_t b = 0; b < batch; ++b)
      if (cache->length(b) != static_cast<index_t>(shadow[static_cast<std::size_t>(b)].size())) {
        std::fprintf(stderr, "api_fuzz: KvCache: sequence %lld holds %lld tokens, but %zu were appended and kept\n",
                     static_cast<long long>(b), static_cast<long long>(cache->length(b)), shadow[static_cast<std::size_t>(b)].size());
        broken("a KvCache call either completes or leaves the cache unchanged");
      }
  }
  if (in.special) return;
  for (index_t b = 0; b < batch; ++b) check_stored(b);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  attn::set_memory_limit(std::size_t(256) << 20);  // a size the bytes make large is refused, not allocated
  if (std::getenv("FUZZ_STATS") != nullptr)
    std::atexit([] { std::fprintf(stderr, "api_fuzz: %ld calls computed, %ld refused, %ld results compared\n", g_computed, g_refused, g_compared); });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Bytes in(data, size);
  static const std::vector<std::string> targets = attn::simd_targets();
  // The setting: backend, SIMD target, threads.
  const std::uint8_t setting = in.u8();
  attn::ScopedBackend backend(setting % 4 == 3 ? attn::Backend::unfused : attn::Backend::cpu);
  attn::ScopedSimdTarget target(targets[(setting >> 2) % targets.size()]);
  attn::ScopedThreads threads(setting >= 224 ? 2 : 1);
  switch (in.pick(16)) {
    case 0: sdpa_case<float, float, float>(in, false); break;
    case 1: sdpa_case<double, double, double>(in, false); break;
    case 2: sdpa_case<float, float, float>(in, true); break;
    case 3: sdpa_case<double, double, double>(in, true); break;
    case 4: sdpa_case<attn::bfloat16, attn::bfloat16, float>(in, in.flag()); break;
    case 5: sdpa_case<attn::float16, attn::float16, float>(in, in.flag()); break;
    case 6: in.flag() ? sdpa_case<float, attn::bfloat16, float>(in, false) : sdpa_case<float, attn::float16, float>(in, false); break;
    case 7: in.flag() ? softmax_case<float>(in) : softmax_case<double>(in); break;
    case 8: in.flag() ? bmm_case<float>(in) : bmm_case<double>(in); break;
    case 9: in.flag() ? additive_case<float>(in) : additive_case<double>(in); break;
    case 10: in.flag() ? nw_case<float>(in) : nw_case<double>(in); break;
    case 11: kv_cache_case(in); break;
    case 12: in.flag() ? sdpa_case<float, float, float>(in, in.flag()) : sdpa_case<double, double, double>(in, in.flag()); break;
    case 13: additive_case<double>(in); break;
    case 14: nw_case<double>(in); break;
    default: kv_cache_case(in); break;
  }
  return 0;
}
