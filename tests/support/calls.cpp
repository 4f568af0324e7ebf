// The mixed calls of support/calls.hpp. Sizes cross the kernels' tile and block boundaries (64
// queries, 64 keys) and are small enough that the tests run each call hundreds of times.
#include "support/calls.hpp"

#include <cmath>
#include <cstdint>
#include <memory>

#include "attn/additive.hpp"
#include "attn/bilinear.hpp"
#include "attn/bmm.hpp"
#include "attn/config.hpp"
#include "attn/flex.hpp"
#include "attn/half.hpp"
#include "attn/kv_cache.hpp"
#include "attn/nadaraya_watson.hpp"
#include "attn/sdpa.hpp"
#include "attn/softmax.hpp"
#include "support/testing.hpp"

namespace attn::testing {
namespace {

// Appends t's values to `to`, as float64.
template <class T>
void put(std::vector<double>& to, const Tensor<T>& t) {
  for (index_t i = 0; i < t.numel(); ++i) {
    if constexpr (std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>) {
      to.push_back(to_float(t[i]));
    } else {
      to.push_back(static_cast<double>(t[i]));
    }
  }
}

template <class T>
Tensor<T> like(const Tensor<T>& t) {
  return Tensor<T>(std::span<const index_t>(t.shape()));
}

// Queries, keys, values and an output gradient of one SDPA case, made once.
template <class T>
struct Qkv {
  Tensor<T> q, k, v, dout;
  Qkv(std::initializer_list<index_t> qs, std::initializer_list<index_t> ks, std::initializer_list<index_t> vs,
      std::uint64_t seed)
      : q(random_tensor<T>(qs, seed)), k(random_tensor<T>(ks, seed + 1)), v(random_tensor<T>(vs, seed + 2)) {
    std::vector<index_t> out_shape(q.shape());
    out_shape.back() = v.shape().back();
    dout = random_tensor<T>(out_shape, seed + 3);
  }
};

// The SDPA forward (out, lse) and, when `backward`, its gradients dQ, dK, dV.
template <class T>
std::vector<double> sdpa_call(const Qkv<T>& x, const Mask<T>& mask, const SdpaOptions& options, bool backward) {
  Tensor<T> out = like(x.dout);
  std::vector<index_t> lse_shape(out.shape());
  lse_shape.pop_back();
  Tensor<T> lse(lse_shape);
  sdpa_forward<T>(out, lse, {}, x.q, x.k, x.v, mask, options);
  std::vector<double> r;
  put(r, out), put(r, lse);
  if (backward) {
    Tensor<T> dq = like(x.q), dk = like(x.k), dv = like(x.v);
    sdpa_backward<T>(dq, dk, dv, x.dout, x.q, x.k, x.v, out, lse, mask, options);
    put(r, dq), put(r, dk), put(r, dv);
  }
  return r;
}

// The same values rounded to a 16-bit type H.
template <class H>
struct HalfQkv {
  Tensor<H> q, k, v, dout;
  explicit HalfQkv(const Qkv<float>& x) : q(to_half<H>(x.q)), k(to_half<H>(x.k)), v(to_half<H>(x.v)), dout(to_half<H>(x.dout)) {}
};

template <class H>
std::vector<double> half_sdpa_call(const HalfQkv<H>& x, const Mask<float>& mask, const SdpaOptions& options) {
  Tensor<H> out = like(x.dout);
  std::vector<index_t> lse_shape(out.shape());
  lse_shape.pop_back();
  Tensor<float> lse(lse_shape);
  sdpa_forward<H>(out, lse, x.q, x.k, x.v, mask, options);
  Tensor<H> dq = like(x.q), dk = like(x.k), dv = like(x.v);
  sdpa_backward<H>(dq, dk, dv, x.dout, x.q, x.k, x.v, out, lse, mask, options);
  std::vector<double> r;
  put(r, out), put(r, lse), put(r, dq), put(r, dk), put(r, dv);
  return r;
}

// A score_mod of flex attention: ALiBi-like distance penalty per head (differentiable in the score).
struct DistancePenalty {
  template <class S>
  S operator()(S score, index_t, index_t h, index_t i, index_t j) const {
    return score - static_cast<double>(h + 1) * 0.05 * static_cast<double>(std::abs(i - j));
  }
};
// A mask_mod: every third key of a query's past excluded.
struct EveryThirdKey {
  bool operator()(index_t, index_t, index_t i, index_t j) const { return j > i || j % 3 != 1; }
};

std::vector<MixedCall> make_calls() {
  std::vector<MixedCall> calls;
  constexpr double kF64 = 1e-12, kF32 = 2e-5, kBf16 = 3e-2, kF16 = 4e-3, kInt8 = 3e-2;

  {  // float32, 3-D, causal: the fused forward and backward
    auto x = std::make_shared<Qkv<float>>(std::initializer_list<index_t>{2, 130, 32}, std::initializer_list<index_t>{2, 150, 32},
                                          std::initializer_list<index_t>{2, 150, 24}, 10);
    calls.push_back({"sdpa float32 causal", kF32, [x] {
                       Mask<float> mask;
                       mask.causal = Causal::top_left;
                       return sdpa_call<float>(*x, mask, {}, true);
                     }});
  }
  {  // float32, valid lengths per query, dropout
    auto x = std::make_shared<Qkv<float>>(std::initializer_list<index_t>{2, 2, 70, 16}, std::initializer_list<index_t>{2, 2, 90, 16},
                                          std::initializer_list<index_t>{2, 2, 90, 16}, 20);
    auto lens = std::make_shared<Tensor<std::int64_t>>(Tensor<std::int64_t>({2, 70}));
    for (index_t i = 0; i < lens->numel(); ++i) (*lens)[i] = (i * 37) % 91;  // 0 (an empty row) to 90
    calls.push_back({"sdpa float32 valid_lens dropout", kF32, [x, lens] {
                       Mask<float> mask;
                       mask.valid_lens = lens->view();
                       SdpaOptions options;
                       options.dropout = {.p = 0.2, .seed = 7};
                       return sdpa_call<float>(*x, mask, options, true);
                     }});
  }
  {  // float64, 4-D, sliding window and ALiBi, GQA (4 query heads over 2 key heads), soft-capping
    auto x = std::make_shared<Qkv<double>>(std::initializer_list<index_t>{1, 4, 100, 24}, std::initializer_list<index_t>{1, 2, 130, 24},
                                           std::initializer_list<index_t>{1, 2, 130, 8}, 30);
    auto slopes = std::make_shared<Tensor<double>>(Tensor<double>({4}, {0.5, 0.25, 0.125, 0.0625}));
    calls.push_back({"sdpa float64 window alibi gqa softcap", kF64, [x, slopes] {
                       Mask<double> mask;
                       mask.window = Window{20, 5};
                       mask.alibi_slopes = slopes->view();
                       SdpaOptions options;
                       options.softcap = 5.0;
                       return sdpa_call<double>(*x, mask, options, true);
                     }});
  }
  {  // float32, packed sequences: segment ids, bottom-right causal
    auto x = std::make_shared<Qkv<float>>(std::initializer_list<index_t>{2, 96, 40}, std::initializer_list<index_t>{2, 96, 40},
                                          std::initializer_list<index_t>{2, 96, 40}, 40);
    auto ids = std::make_shared<Tensor<std::int64_t>>(Tensor<std::int64_t>({2, 96}));
    for (index_t i = 0; i < ids->numel(); ++i) (*ids)[i] = (i % 96) / 30;
    calls.push_back({"sdpa float32 segments causal", kF32, [x, ids] {
                       Mask<float> mask;
                       mask.segment_ids_q = ids->view();
                       mask.causal = Causal::bottom_right;
                       return sdpa_call<float>(*x, mask, {}, true);
                     }});
  }
  {  // float32 decode: one query per head, GQA, many keys (keys split across threads)
    auto x = std::make_shared<Qkv<float>>(std::initializer_list<index_t>{2, 8, 1, 32}, std::initializer_list<index_t>{2, 2, 400, 32},
                                          std::initializer_list<index_t>{2, 2, 400, 32}, 50);
    calls.push_back({"sdpa float32 decode gqa", kF32, [x] { return sdpa_call<float>(*x, {}, {}, true); }});
  }
  {  // the unfused path, asked for the weights
    auto x = std::make_shared<Qkv<float>>(std::initializer_list<index_t>{2, 33, 16}, std::initializer_list<index_t>{2, 65, 16},
                                          std::initializer_list<index_t>{2, 65, 16}, 60);
    calls.push_back({"sdpa float32 weights", kF32, [x] {
                       Tensor<float> out = like(x->dout), weights({2, 33, 65});
                       sdpa_forward<float>(out, {}, weights, x->q, x->k, x->v);
                       std::vector<double> r;
                       put(r, out), put(r, weights);
                       return r;
                     }});
  }
  {  // 16-bit: bfloat16 (the AVX512-BF16 kernel where chosen) and float16, forward and backward
    auto x32 = std::make_shared<Qkv<float>>(std::initializer_list<index_t>{1, 2, 130, 64}, std::initializer_list<index_t>{1, 2, 140, 64},
                                            std::initializer_list<index_t>{1, 2, 140, 64}, 70);
    auto bf = std::make_shared<HalfQkv<bfloat16>>(*x32);
    auto f16 = std::make_shared<HalfQkv<float16>>(*x32);
    calls.push_back({"sdpa bfloat16 causal", kBf16, [bf] {
                       Mask<float> mask;
                       mask.causal = Causal::top_left;
                       return half_sdpa_call<bfloat16>(*bf, mask, {});
                     }});
    calls.push_back({"sdpa float16 window", kF16, [f16] {
                       Mask<float> mask;
                       mask.window = Window{30, 0};
                       return half_sdpa_call<float16>(*f16, mask, {});
                     }});
  }
  {  // additive attention, valid lengths, dropout: forward, and every gradient
    auto x = std::make_shared<Qkv<float>>(std::initializer_list<index_t>{2, 70, 20}, std::initializer_list<index_t>{2, 80, 12},
                                          std::initializer_list<index_t>{2, 80, 10}, 80);
    auto w = std::make_shared<AdditiveWeights<float>>(AdditiveWeights<float>::init(20, 12, 16, 81));
    auto lens = std::make_shared<Tensor<std::int64_t>>(Tensor<std::int64_t>({2}, {80, 33}));
    calls.push_back({"additive float32 valid_lens dropout", kF32, [x, w, lens] {
                       Mask<float> mask;
                       mask.valid_lens = lens->view();
                       const Dropout dropout{.p = 0.1, .seed = 3};
                       Tensor<float> out = like(x->dout);
                       additive_attention_forward<float>(out, {}, x->q, x->k, x->v, w->params(), mask, dropout);
                       Tensor<float> dq = like(x->q), dk = like(x->k), dv = like(x->v);
                       Tensor<float> dwq = like(w->w_q), dwk = like(w->w_k), dwv = like(w->w_v);
                       additive_attention_backward<float>(dq, dk, dv, {dwq.view(), dwk.view(), dwv.view()}, x->dout, x->q,
                                                          x->k, x->v, w->params(), mask, dropout);
                       std::vector<double> r;
                       put(r, out), put(r, dq), put(r, dk), put(r, dv), put(r, dwq), put(r, dwk), put(r, dwv);
                       return r;
                     }});
  }
  {  // bilinear attention (q^T W k) and flex attention (score_mod and mask_mod), forward and backward
    auto x = std::make_shared<Qkv<float>>(std::initializer_list<index_t>{2, 70, 12}, std::initializer_list<index_t>{2, 90, 10},
                                          std::initializer_list<index_t>{2, 90, 8}, 84);
    auto w = std::make_shared<Tensor<float>>(random_tensor<float>({12, 10}, 85));
    calls.push_back({"bilinear float32", kF32, [x, w] {
                       Tensor<float> out = like(x->dout), dq = like(x->q), dk = like(x->k), dv = like(x->v), dw = like(*w);
                       bilinear_attention_forward<float>(out, {}, x->q, x->k, x->v, *w);
                       bilinear_attention_backward<float>(dq, dk, dv, dw, x->dout, x->q, x->k, x->v, *w);
                       std::vector<double> r;
                       put(r, out), put(r, dq), put(r, dk), put(r, dv), put(r, dw);
                       return r;
                     }});
    auto f = std::make_shared<Qkv<double>>(std::initializer_list<index_t>{1, 2, 90, 16}, std::initializer_list<index_t>{1, 2, 90, 16},
                                           std::initializer_list<index_t>{1, 2, 90, 16}, 86);
    calls.push_back({"flex float64 score_mod mask_mod", kF64, [f] {
                       Tensor<double> out = like(f->dout), lse({1, 2, 90}), dq = like(f->q), dk = like(f->k), dv = like(f->v);
                       flex_attention_forward<double>(out, lse, f->q, f->k, f->v, DistancePenalty{}, EveryThirdKey{});
                       flex_attention_backward<double>(dq, dk, dv, f->dout, f->q, f->k, f->v, out, lse, DistancePenalty{},
                                                       EveryThirdKey{});
                       std::vector<double> r;
                       put(r, out), put(r, lse), put(r, dq), put(r, dk), put(r, dv);
                       return r;
                     }});
  }
  {  // Nadaraya-Watson on 1-D keys (the windowed path) and on 3-D keys, with sigma's gradient
    auto one_d = std::make_shared<Qkv<double>>(std::initializer_list<index_t>{1, 150, 1}, std::initializer_list<index_t>{1, 170, 1},
                                               std::initializer_list<index_t>{1, 170, 2}, 90);
    auto three_d = std::make_shared<Qkv<float>>(std::initializer_list<index_t>{2, 40, 3}, std::initializer_list<index_t>{2, 50, 3},
                                                std::initializer_list<index_t>{2, 50, 4}, 95);
    calls.push_back({"nadaraya-watson float64 1-D gaussian", kF64, [one_d] {
                       const Qkv<double>& x = *one_d;
                       Tensor<double> out = like(x.dout), dq = like(x.q), dk = like(x.k), dv = like(x.v);
                       double dsigma = 0;
                       nadaraya_watson_forward<double>(out, {}, x.q, x.k, x.v, Kernel::gaussian, 0.3);
                       nadaraya_watson_backward<double>(dq, dk, dv, &dsigma, x.dout, x.q, x.k, x.v, Kernel::gaussian, 0.3);
                       std::vector<double> r;
                       put(r, out), put(r, dq), put(r, dk), put(r, dv);
                       r.push_back(dsigma);
                       return r;
                     }});
    calls.push_back({"nadaraya-watson float32 epanechnikov", kF32, [three_d] {
                       const Qkv<float>& x = *three_d;
                       Tensor<float> out = like(x.dout), weights({2, 40, 50}), dq = like(x.q), dk = like(x.k), dv = like(x.v);
                       float dsigma = 0;
                       nadaraya_watson_forward<float>(out, weights, x.q, x.k, x.v, Kernel::epanechnikov, 1.5f);
                       nadaraya_watson_backward<float>(dq, dk, dv, &dsigma, x.dout, x.q, x.k, x.v, Kernel::epanechnikov, 1.5f);
                       std::vector<double> r;
                       put(r, out), put(r, weights), put(r, dq), put(r, dk), put(r, dv);
                       r.push_back(dsigma);
                       return r;
                     }});
  }
  {  // masked softmax (valid lengths per query) and bmm, forward and backward
    auto scores = std::make_shared<Tensor<float>>(random_tensor<float>({3, 40, 70}, 100, -5, 5));
    auto dweights = std::make_shared<Tensor<float>>(random_tensor<float>({3, 40, 70}, 101));
    auto lens = std::make_shared<Tensor<std::int64_t>>(Tensor<std::int64_t>({3, 40}));
    for (index_t i = 0; i < lens->numel(); ++i) (*lens)[i] = (i * 13) % 71;
    calls.push_back({"masked_softmax float32 valid_lens", kF32, [scores, dweights, lens] {
                       Mask<float> mask;
                       mask.valid_lens = lens->view();
                       Tensor<float> w = like(*scores), ds = like(*scores);
                       masked_softmax_forward<float>(w, *scores, mask);
                       masked_softmax_backward<float>(ds, *dweights, w, mask);
                       std::vector<double> r;
                       put(r, w), put(r, ds);
                       return r;
                     }});
    auto a = std::make_shared<Tensor<float>>(random_tensor<float>({3, 70, 45}, 110));
    auto b = std::make_shared<Tensor<float>>(random_tensor<float>({3, 45, 66}, 111));
    auto dout = std::make_shared<Tensor<float>>(random_tensor<float>({3, 70, 66}, 112));
    calls.push_back({"bmm float32", kF32, [a, b, dout] {
                       Tensor<float> out = like(*dout), da = like(*a), db = like(*b);
                       bmm_forward<float>(out, *a, *b);
                       bmm_backward<float>(da, db, *dout, *a, *b);
                       std::vector<double> r;
                       put(r, out), put(r, da), put(r, db);
                       return r;
                     }});
  }
  {  // KV cache: int8 and bfloat16 storage, GQA, appends across blocks, decode and a prompt's queries
    auto keys = std::make_shared<Tensor<float>>(random_tensor<float>({2, 2, 300, 64}, 120));
    auto values = std::make_shared<Tensor<float>>(random_tensor<float>({2, 2, 300, 64}, 121));
    auto queries = std::make_shared<Tensor<float>>(random_tensor<float>({2, 8, 3, 64}, 122));
    for (const auto& [dtype, name, tolerance] : {std::tuple{KvDtype::int8, "kv cache int8", kInt8},
                                                 std::tuple{KvDtype::bfloat16, "kv cache bfloat16", kBf16}}) {
      calls.push_back({name, tolerance, [keys, values, queries, dtype = dtype] {
                         KvCache cache(2, 2, 64, {.dtype = dtype, .block_size = 64});
                         cache.append(keys->view(), values->view());
                         Tensor<float> out = like(*queries);
                         cache.attend(out, queries->view());
                         std::vector<double> r;
                         put(r, out);
                         return r;
                       }});
    }
  }
  return calls;
}

}  // namespace

const std::vector<MixedCall>& mixed_calls() {
  static const std::vector<MixedCall> calls = make_calls();
  return calls;
}

}  // namespace attn::testing
