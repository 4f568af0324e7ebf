// The cases of `attn bench`: the headline shapes, inputs uniform in [-1, 1) from fixed seeds.
// Each fused run calls the public API (cpu backend, no weights asked for); each unfused run calls it
// too, under Backend::unfused (scores, softmax and pooling as separate passes, the path the cpu
// backend took before its fused kernels), asking for the weights as a caller who wants them would.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>

#include "attn/attn.hpp"
#include "attn/diagnostics.hpp"
#include "bench.hpp"

namespace attn_cli {

attn::Tensor<float> uniform(std::vector<attn::index_t> shape, std::uint64_t seed) {
  attn::Tensor<float> t{std::span<const attn::index_t>(shape)};
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (attn::index_t i = 0; i < t.numel(); ++i) t[i] = u(gen);
  return t;
}

double max_rel_diff(const attn::Tensor<float>& a, const attn::Tensor<float>& b) {
  double m = 0, largest = 0;
  for (attn::index_t i = 0; i < a.numel(); ++i) {
    const double d = std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    m = std::isnan(d) ? INFINITY : std::max(m, d);
    largest = std::max(largest, static_cast<double>(std::abs(b[i])));
  }
  return m / std::max(1e-30, largest);
}

namespace {

using attn::index_t;
using attn::Tensor;

enum class MaskKind { none, lens, causal, sinks };

// Tensors of one SDPA case (B, n, m, d), 3-D as the d2l chapter uses them; allocated by prepare(), freed
// by release() so that large cases do not keep their memory.
struct SdpaData {
  index_t B, n, m, d;
  MaskKind kind;
  // Filled by prepare(); a case is built from its sizes alone.
  Tensor<float> q{}, k{}, v{}, g{}, out{}, lse{}, weights{}, out_ref{}, dq{}, dk{}, dv{}, dq_ref{}, dk_ref{}, dv_ref{};
  Tensor<std::int64_t> lens{};
  Tensor<float> sinks = Tensor<float>({1}, {0.5f});  // one head (3-D tensors): the sink's logit

  attn::Mask<float> mask() const {
    attn::Mask<float> mk;
    if (kind == MaskKind::sinks) mk.sinks = sinks.cview();
    if (kind == MaskKind::lens) mk.valid_lens = lens.view();
    if (kind == MaskKind::causal) mk.causal = attn::Causal::top_left;
    return mk;
  }
  // Query-key pairs that are computed: all, up to each valid length, or the causal triangle.
  double pairs() const {
    if (kind == MaskKind::causal) return static_cast<double>(B) * (static_cast<double>(n) * (n + 1) / 2);
    if (kind == MaskKind::lens) {
      double p = 0;
      for (index_t b = 0; b < B; ++b) p += static_cast<double>(n) * static_cast<double>(lens[b]);
      return p;
    }
    return static_cast<double>(B) * n * m;
  }
  void prepare(bool backward) {
    q = uniform({B, n, d}, 1), k = uniform({B, m, d}, 2), v = uniform({B, m, d}, 3);
    out = Tensor<float>({B, n, d}), lse = Tensor<float>({B, n});
    lens = Tensor<std::int64_t>({B});
    for (index_t b = 0; b < B; ++b) lens[b] = m / 2 + (b * m) / (2 * B) + 1;  // between m/2 and m
    if (backward) {
      g = uniform({B, n, d}, 4);
      dq = Tensor<float>({B, n, d}), dk = Tensor<float>({B, m, d}), dv = Tensor<float>({B, m, d});
      dq_ref = dq, dk_ref = dk, dv_ref = dv;
    }
  }
  void release() {
    for (Tensor<float>* t : {&q, &k, &v, &g, &out, &lse, &weights, &out_ref, &dq, &dk, &dv, &dq_ref, &dk_ref, &dv_ref})
      *t = Tensor<float>();
  }
};

std::string shape(index_t B, index_t n, index_t m, index_t d) {
  return "(" + std::to_string(B) + "," + std::to_string(n) + "," + std::to_string(m) + "," + std::to_string(d) + ")";
}

BenchCase sdpa_forward_case(index_t B, index_t n, index_t m, index_t d, MaskKind kind, bool with_baseline) {
  auto s = std::make_shared<SdpaData>(SdpaData{B, n, m, d, kind});
  BenchCase c;
  const char* suffix = kind == MaskKind::lens     ? " valid_lens"
                       : kind == MaskKind::causal ? " causal"
                       : kind == MaskKind::sinks  ? " sinks"
                                                  : "";
  const bool decode = n <= 4;
  c.name = std::string(decode ? "sdpa decode " : "sdpa forward ") + shape(B, n, m, d) + suffix;
  s->lens = Tensor<std::int64_t>({B});
  for (index_t b = 0; b < B; ++b) s->lens[b] = m / 2 + (b * m) / (2 * B) + 1;
  c.flops = 4.0 * static_cast<double>(d) * s->pairs();
  c.formula = "4 d x (query, key pairs computed)";
  if (decode) {
    c.bytes = 4.0 * static_cast<double>(B) * (2.0 * m * d + 2.0 * n * d);
    c.formula = "bytes of keys, values, queries and out";
  }
  c.baseline_bytes = with_baseline ? 2.0 * 4.0 * static_cast<double>(B) * n * m : 0;
  c.prepare = [s, with_baseline] {
    s->prepare(false);
    if (with_baseline) s->weights = Tensor<float>({s->B, s->n, s->m}), s->out_ref = s->out;
  };
  c.run_fused = [s] {
    attn::sdpa_forward<float>(s->out.view(), s->lse.view(), {}, s->q.view(), s->k.view(), s->v.view(), s->mask());
  };
  if (with_baseline)
    c.run_unfused = [s] {
      const attn::ScopedBackend unfused(attn::Backend::unfused);
      attn::sdpa_forward<float>(s->out_ref.view(), {}, s->weights.view(), s->q.view(), s->k.view(), s->v.view(),
                                s->mask());
    };
  c.check = [s, with_baseline] { return with_baseline ? max_rel_diff(s->out, s->out_ref) : 0.0; };
  c.release = [s] { s->release(); };
  return c;
}

// Forward then backward (kind none or causal), as a training step calls them.
BenchCase sdpa_backward_case(index_t B, index_t n, index_t m, index_t d, MaskKind kind) {
  auto s = std::make_shared<SdpaData>(SdpaData{B, n, m, d, kind});
  BenchCase c;
  c.name = std::string("sdpa forward+backward ") + (kind == MaskKind::causal ? "causal " : "") + shape(B, n, m, d);
  c.flops = 12.0 * static_cast<double>(d) * s->pairs();
  c.formula = "12 d x (query, key pairs computed)";
  c.baseline_bytes = 4.0 * 4.0 * static_cast<double>(B) * n * m;
  c.prepare = [s] { s->prepare(true), s->weights = Tensor<float>({s->B, s->n, s->m}), s->out_ref = s->out; };
  c.run_fused = [s] {
    attn::sdpa_forward<float>(s->out.view(), s->lse.view(), {}, s->q.view(), s->k.view(), s->v.view(), s->mask());
    attn::sdpa_backward<float>(s->dq.view(), s->dk.view(), s->dv.view(), s->g.view(), s->q.view(), s->k.view(),
                               s->v.view(), s->out.view(), s->lse.view(), s->mask());
  };
  c.run_unfused = [s] {
    const attn::ScopedBackend unfused(attn::Backend::unfused);
    attn::sdpa_forward<float>(s->out_ref.view(), {}, s->weights.view(), s->q.view(), s->k.view(), s->v.view(),
                              s->mask());
    attn::sdpa_backward<float>(s->dq_ref.view(), s->dk_ref.view(), s->dv_ref.view(), s->g.view(), s->q.view(),
                               s->k.view(), s->v.view(), {}, {}, s->mask());
  };
  c.check = [s] {
    return std::max({max_rel_diff(s->out, s->out_ref), max_rel_diff(s->dq, s->dq_ref), max_rel_diff(s->dk, s->dk_ref),
                     max_rel_diff(s->dv, s->dv_ref)});
  };
  c.release = [s] { s->release(); };
  return c;
}


// ---- Nadaraya-Watson, Gaussian, 1-D keys (the d2l chapter's regression at scale) ------------------------
// Training data as the d2l chapter make it: x sorted uniform in [0, 5), y = 2 sin x + x^0.8 + N(0, 0.5);
// queries on the grid 0, 5 / n, ..., like the d2l chapter's arange(0, 5, 0.1); sigma 0.1, the smallest of
// the d2l chapter's widths. The fused run is the public API (the windowed path, the Gaussian truncated at
// the stated error); the baseline is the dense path, timed on every `stride`-th query (n / stride
// queries over all m keys: the whole dense run would take minutes) and scaled by stride.
struct NwData {
  index_t n, m, stride;
  float sigma;
  Tensor<float> x{}, y{}, q{}, out{}, q_sub{}, out_sub{};

  void prepare() {
    std::mt19937_64 gen(7);
    std::uniform_real_distribution<float> u(0.0f, 5.0f);
    std::normal_distribution<float> noise(0.0f, 0.5f);
    x = Tensor<float>({1, m, 1}), y = Tensor<float>({1, m, 1}), q = Tensor<float>({1, n, 1});
    for (index_t j = 0; j < m; ++j) x[j] = u(gen);
    std::sort(x.data(), x.data() + m);
    for (index_t j = 0; j < m; ++j) y[j] = 2 * std::sin(x[j]) + std::pow(x[j], 0.8f) + noise(gen);
    for (index_t i = 0; i < n; ++i) q[i] = 5.0f * static_cast<float>(i) / static_cast<float>(n);
    out = Tensor<float>({1, n, 1});
    q_sub = Tensor<float>({1, n / stride, 1}), out_sub = Tensor<float>({1, n / stride, 1});
    for (index_t i = 0; i < n / stride; ++i) q_sub[i] = q[i * stride];
  }
  void release() {
    for (Tensor<float>* t : {&x, &y, &q, &out, &q_sub, &out_sub}) *t = Tensor<float>();
  }
  // The windowed outputs of the subset's queries against the dense ones.
  double check() const {
    Tensor<float> got({1, n / stride, 1});
    for (index_t i = 0; i < n / stride; ++i) got[i] = out[i * stride];
    return max_rel_diff(got, out_sub);
  }
};

BenchCase nw_gaussian_1d_case(index_t n, index_t m, float sigma, index_t stride) {
  auto s = std::make_shared<NwData>(NwData{n, m, stride, sigma});
  BenchCase c;
  c.name = "nw gaussian 1-D (" + std::to_string(n) + "," + std::to_string(m) + ") sigma 0.1";
  c.formula = "(query, key) pairs visited by the windowed path";
  c.baseline_scale = static_cast<double>(n) / static_cast<double>(n / stride);
  c.baseline_bytes = 4.0 * attn::num_threads() * static_cast<double>(m);  // a row of weights per thread
  c.prepare = [s] { s->prepare(); };
  c.pairs = [s] {
    return attn::nadaraya_watson_visited_pairs<float>(s->q.view(), s->x.view(), attn::Kernel::gaussian, s->sigma);
  };
  c.run_fused = [s] {
    attn::nadaraya_watson_forward<float>(s->out.view(), {}, s->q.view(), s->x.view(), s->y.view(),
                                         attn::Kernel::gaussian, s->sigma);
  };
  c.run_unfused = [s] {
    const attn::ScopedBackend unfused(attn::Backend::unfused);  // the dense path
    attn::nadaraya_watson_forward<float>(s->out_sub.view(), {}, s->q_sub.view(), s->x.view(), s->y.view(),
                                         attn::Kernel::gaussian, s->sigma);
  };
  c.check = [s] { return s->check(); };
  c.release = [s] { s->release(); };
  return c;
}

// ---- bmm ------------------------------------------------------------------------------------
// The d2l chapter's batched product at a size where it matters, (B, n, n) @ (B, n, n), against the
// reference backend (the formula's three loops) on the first item, its time scaled up to all B.
struct BmmData {
  index_t B, n;
  Tensor<float> a{}, b{}, out{}, out_ref{};
  void prepare() {
    a = uniform({B, n, n}, 41), b = uniform({B, n, n}, 42);
    out = Tensor<float>({B, n, n}), out_ref = Tensor<float>({1, n, n});
  }
  void release() {
    for (Tensor<float>* t : {&a, &b, &out, &out_ref}) *t = Tensor<float>();
  }
  attn::TensorView<const float> first(const Tensor<float>& t) const { return {t.data(), {1, n, n}, {n * n, n, 1}}; }
};

BenchCase bmm_case(index_t B, index_t n) {
  auto s = std::make_shared<BmmData>(BmmData{B, n});
  BenchCase c;
  const std::string N = std::to_string(n);
  c.name = "bmm (" + std::to_string(B) + "," + N + "," + N + "," + N + ")";
  c.flops = 2.0 * static_cast<double>(B) * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
  c.formula = "2 B n^3";
  c.baseline_scale = static_cast<double>(B);
  c.prepare = [s] { s->prepare(); };
  c.run_fused = [s] { attn::bmm_forward<float>(s->out.view(), s->a.view(), s->b.view()); };
  c.run_unfused = [s] {
    const attn::ScopedBackend reference(attn::Backend::reference);
    attn::bmm_forward<float>(s->out_ref.view(), s->first(s->a), s->first(s->b));
  };
  c.check = [s] {
    Tensor<float> got({1, s->n, s->n});
    std::copy(s->out.data(), s->out.data() + got.numel(), got.data());
    return max_rel_diff(got, s->out_ref);
  };
  c.release = [s] { s->release(); };
  return c;
}

// ---- additive attention ---------------------------------------------------------------------
// Tensors of one additive case: queries (B, n, 64), keys (B, m, 64), values (B, m, 64), hidden size
// h, parameters drawn like AdditiveWeights::init, no mask; prepare() allocates, release() frees.
struct AdditiveData {
  index_t B, n, m, h;
  Tensor<float> q{}, k{}, v{}, g{}, out{}, out_ref{}, weights{}, dq{}, dk{}, dv{}, dq_ref{}, dk_ref{}, dv_ref{};
  attn::AdditiveWeights<float> w{}, dw{}, dw_ref{};

  void prepare(bool backward) {
    const index_t d = 64;
    q = uniform({B, n, d}, 11), k = uniform({B, m, d}, 12), v = uniform({B, m, d}, 13);
    w = attn::AdditiveWeights<float>::init(d, d, h, 14);
    out = Tensor<float>({B, n, d}), out_ref = out, weights = Tensor<float>({B, n, m});
    if (backward) {
      g = uniform({B, n, d}, 15);
      dq = Tensor<float>({B, n, d}), dk = Tensor<float>({B, m, d}), dv = Tensor<float>({B, m, d});
      dq_ref = dq, dk_ref = dk, dv_ref = dv;
      dw = w, dw_ref = w;
    }
  }
  void release() {
    for (Tensor<float>* t : {&q, &k, &v, &g, &out, &out_ref, &weights, &dq, &dk, &dv, &dq_ref, &dk_ref, &dv_ref})
      *t = Tensor<float>();
    w = dw = dw_ref = attn::AdditiveWeights<float>();
  }
  attn::AdditiveGrads<float> grads(attn::AdditiveWeights<float>& t) { return {t.w_q.view(), t.w_k.view(), t.w_v.view()}; }

  void fused(bool backward) {
    attn::additive_attention_forward<float>(out.view(), {}, q.view(), k.view(), v.view(), w.params());
    if (backward)
      attn::additive_attention_backward<float>(dq.view(), dk.view(), dv.view(), grads(dw), g.view(), q.view(), k.view(),
                                               v.view(), w.params());
  }
  // The unfused path (Backend::unfused); the forward forms the (n, m) weights, as a caller asking
  // for them gets.
  void unfused(bool backward) {
    const attn::ScopedBackend unfused(attn::Backend::unfused);
    attn::additive_attention_forward<float>(out_ref.view(), weights.view(), q.view(), k.view(), v.view(), w.params());
    if (backward)
      attn::additive_attention_backward<float>(dq_ref.view(), dk_ref.view(), dv_ref.view(), grads(dw_ref), g.view(),
                                               q.view(), k.view(), v.view(), w.params());
  }
};

// "additive forward (B,n,m,h)" or "additive forward+backward (B,n,m,h)", q = k = v = 64. The rate
// counts the tanh the fused kernels evaluate: B n m h forward, as much again in each of the
// backward's two passes.
BenchCase additive_case(index_t B, index_t n, index_t m, index_t h, bool backward) {
  auto s = std::make_shared<AdditiveData>(AdditiveData{B, n, m, h});
  BenchCase c;
  c.name = std::string(backward ? "additive forward+backward " : "additive forward ") + shape(B, n, m, h);
  const double bnmh = static_cast<double>(B) * n * m * h;
  c.tanhs = (backward ? 3 : 1) * bnmh;
  c.formula = backward ? "3 B n m h tanh (forward, backward passes 1 and 2)" : "B n m h tanh";
  // qp, kp, scores and weights; the backward adds dscores' weights and dqp, dkp, their row shares of dw_v.
  const double proj = 4.0 * B * static_cast<double>(n + m) * h, nm = 4.0 * B * static_cast<double>(n) * m;
  c.baseline_bytes = backward ? 2 * (proj + 2 * nm) + proj + 4.0 * B * n * h : proj + 2 * nm;
  c.prepare = [s, backward] { s->prepare(backward); };
  c.run_fused = [s, backward] { s->fused(backward); };
  c.run_unfused = [s, backward] { s->unfused(backward); };
  c.check = [s, backward] {
    double e = max_rel_diff(s->out, s->out_ref);
    if (backward)
      e = std::max({e, max_rel_diff(s->dq, s->dq_ref), max_rel_diff(s->dk, s->dk_ref), max_rel_diff(s->dv, s->dv_ref),
                    max_rel_diff(s->dw.w_q, s->dw_ref.w_q), max_rel_diff(s->dw.w_k, s->dw_ref.w_k),
                    max_rel_diff(s->dw.w_v, s->dw_ref.w_v)});
    return e;
  };
  c.release = [s] { s->release(); };
  return c;
}

}  // namespace

std::vector<BenchCase> bench_cases(bool large) {
  std::vector<BenchCase> cases;
  const index_t shapes[][4] = {{8, 512, 512, 64}, {4, 1024, 1024, 64}, {1, 4096, 4096, 64}, {1, 4096, 4096, 128}};
  for (const auto& s : shapes)
    for (MaskKind kind : {MaskKind::none, MaskKind::lens, MaskKind::causal})
      cases.push_back(sdpa_forward_case(s[0], s[1], s[2], s[3], kind, true));
  cases.push_back(sdpa_backward_case(4, 1024, 1024, 64, MaskKind::none));
  cases.push_back(sdpa_backward_case(4, 1024, 1024, 64, MaskKind::causal));
  cases.push_back(sdpa_backward_case(1, 4096, 4096, 128, MaskKind::none));
  cases.push_back(sdpa_forward_case(32, 1, 8192, 128, MaskKind::none, true));
  // Attention sinks beside the same attention without them (forward and decode).
  cases.push_back(sdpa_forward_case(4, 1024, 1024, 64, MaskKind::sinks, false));
  cases.push_back(sdpa_forward_case(32, 1, 8192, 128, MaskKind::sinks, false));
  cases.push_back(additive_case(2, 512, 512, 128, false));
  cases.push_back(additive_case(2, 512, 512, 128, true));
  cases.push_back(nw_gaussian_1d_case(100000, 100000, 0.1f, 100));
  cases.push_back(bmm_case(8, 512));
  for (BenchCase& c : variant_cases()) cases.push_back(std::move(c));
  for (BenchCase& c : half_cases()) cases.push_back(std::move(c));
  for (BenchCase& c : varlen_cases()) cases.push_back(std::move(c));
  for (BenchCase& c : kreg_cases()) cases.push_back(std::move(c));
  if (large) cases.push_back(sdpa_forward_case(1, 16384, 16384, 64, MaskKind::none, false));
  return cases;
}

}  // namespace attn_cli
