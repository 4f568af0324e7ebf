// The 16-bit and int8 cases of `attn bench`: bfloat16 and float16 forward and decode, the int8
// forward and the int8, float8 and 4-bit caches' decode through the public API,
// each against the float32 call on the same values run in the same process (the "unfused" column:
// float32; the two interleaved), so the ratio is measured. Decode reads its 16-bit keys and values
// in place (half the bytes of float32); the forward runs the fused 16-bit kernel (keys and values
// widened once per call), or the AVX512-BF16 products for bfloat16 where they are chosen.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <type_traits>

#include "attn/half.hpp"
#include "attn/kv_cache.hpp"
#include "attn/sdpa.hpp"
#include "bench.hpp"

namespace attn_cli {
namespace {

using attn::index_t;
using attn::Tensor;

template <class H>
Tensor<H> narrowed(const Tensor<float>& t) {
  Tensor<H> h(t.shape());
  attn::convert(std::span<const float>(t.data(), static_cast<std::size_t>(t.numel())),
                std::span<H>(h.data(), static_cast<std::size_t>(h.numel())));
  return h;
}

// 4 units of each storage type's roundoff: bfloat16 2^-8, float16 2^-11, int8 (q8_0) 1/254 of a
// group's largest magnitude.
constexpr double kBf16Tolerance = 4.0 / 256, kF16Tolerance = 4.0 / 2048, kInt8Tolerance = 4.0 / 254;
// int4 (q4_1) and int4_kivi: 4 units of a group's rounding, (max - lo) / 30 <= max|x| / 15.
constexpr double kInt4Tolerance = 4.0 / 15;

template <class H>
struct HalfData {
  index_t B, n, m, d;
  Tensor<float> q32{}, k32{}, v32{}, out32{};
  Tensor<H> q{}, k{}, v{}, out{};
  void prepare() {
    q32 = uniform({B, n, d}, 1), k32 = uniform({B, m, d}, 2), v32 = uniform({B, m, d}, 3);
    q = narrowed<H>(q32), k = narrowed<H>(k32), v = narrowed<H>(v32);
    out32 = Tensor<float>({B, n, d}), out = Tensor<H>({B, n, d});
  }
  void release() { *this = HalfData{B, n, m, d}; }
};

// The largest difference of a 16-bit (or int8-computed float) result from float32's on the
// unrounded values, relative to float32's largest magnitude.
template <class H>
double relative_to_float32(const Tensor<H>& got, const Tensor<float>& want) {
  double worst = 0, top = 1e-30;
  for (index_t i = 0; i < want.numel(); ++i) {
    const auto value = [](auto x) -> double {
      if constexpr (std::is_same_v<decltype(x), float>) return x;
      else return attn::to_float(x);
    };
    worst = std::max(worst, std::abs(value(got.data()[i]) - want[i]));
    top = std::max(top, std::abs(static_cast<double>(want[i])));
  }
  return worst / top;
}

template <class H>
BenchCase half_case(const char* type, index_t B, index_t n, index_t m, index_t d) {
  auto s = std::make_shared<HalfData<H>>(HalfData<H>{B, n, m, d});
  BenchCase c;
  c.tolerance = std::is_same_v<H, attn::bfloat16> ? kBf16Tolerance : kF16Tolerance;
  const bool decode = n <= 4;
  c.name = std::string(decode ? "sdpa decode " : "sdpa forward ") + type + " (" + std::to_string(B) + "," +
           std::to_string(n) + "," + std::to_string(m) + "," + std::to_string(d) + ")";
  c.flops = 4.0 * static_cast<double>(B) * n * m * d;
  c.formula = "4 B n m d; float32 in the unfused column";
  if (decode) {
    c.bytes = 2.0 * static_cast<double>(B) * (2.0 * m * d + 2.0 * n * d);
    c.formula = "bytes of 16-bit keys, values, queries and out; float32 in the unfused column";
  }
  c.prepare = [s] { s->prepare(); };
  c.run_fused = [s] { attn::sdpa_forward<H>(s->out.view(), {}, s->q.view(), s->k.view(), s->v.view()); };
  c.run_unfused = [s] {
    attn::sdpa_forward<float>(s->out32.view(), {}, {}, s->q32.view(), s->k32.view(), s->v32.view());
  };
  // Against float32 on the unrounded values: the 16-bit rounding shows (about 1e-2 for bf16).
  c.check = [s] { return relative_to_float32(s->out, s->out32); };
  c.release = [s] { s->release(); };
  return c;
}

// A training step's attention in 16 bits: forward then backward, against float32's forward and
// backward on the same (unrounded) values, interleaved.
template <class H>
BenchCase half_backward_case(const char* type, index_t B, index_t n, index_t m, index_t d) {
  struct Data {
    index_t B, n, m, d;
    Tensor<float> q32{}, k32{}, v32{}, g32{}, out32{}, lse32{}, dq32{}, dk32{}, dv32{}, lse{};
    Tensor<H> q{}, k{}, v{}, g{}, out{}, dq{}, dk{}, dv{};
  };
  auto s = std::make_shared<Data>(Data{B, n, m, d});
  BenchCase c;
  c.tolerance = std::is_same_v<H, attn::bfloat16> ? kBf16Tolerance : kF16Tolerance;
  c.name = std::string("sdpa forward+backward ") + type + " (" + std::to_string(B) + "," + std::to_string(n) + "," +
           std::to_string(m) + "," + std::to_string(d) + ")";
  c.flops = 12.0 * static_cast<double>(B) * n * m * d;
  c.formula = "12 B n m d; float32 in the unfused column";
  c.prepare = [s] {
    s->q32 = uniform({s->B, s->n, s->d}, 1), s->k32 = uniform({s->B, s->m, s->d}, 2);
    s->v32 = uniform({s->B, s->m, s->d}, 3), s->g32 = uniform({s->B, s->n, s->d}, 4);
    s->q = narrowed<H>(s->q32), s->k = narrowed<H>(s->k32), s->v = narrowed<H>(s->v32), s->g = narrowed<H>(s->g32);
    s->out32 = Tensor<float>({s->B, s->n, s->d}), s->lse32 = Tensor<float>({s->B, s->n}), s->lse = s->lse32;
    s->dq32 = s->out32, s->dk32 = Tensor<float>({s->B, s->m, s->d}), s->dv32 = s->dk32;
    s->out = Tensor<H>({s->B, s->n, s->d}), s->dq = s->out, s->dk = Tensor<H>({s->B, s->m, s->d}), s->dv = s->dk;
  };
  c.run_fused = [s] {
    attn::sdpa_forward<H>(s->out.view(), s->lse.view(), s->q.view(), s->k.view(), s->v.view());
    attn::sdpa_backward<H>(s->dq.view(), s->dk.view(), s->dv.view(), s->g.view(), s->q.view(), s->k.view(), s->v.view(),
                           s->out.view(), s->lse.view());
  };
  c.run_unfused = [s] {
    attn::sdpa_forward<float>(s->out32.view(), s->lse32.view(), {}, s->q32.view(), s->k32.view(), s->v32.view());
    attn::sdpa_backward<float>(s->dq32.view(), s->dk32.view(), s->dv32.view(), s->g32.view(), s->q32.view(),
                               s->k32.view(), s->v32.view(), s->out32.view(), s->lse32.view());
  };
  c.check = [s] {
    return std::max({relative_to_float32(s->out, s->out32), relative_to_float32(s->dq, s->dq32),
                     relative_to_float32(s->dk, s->dk32), relative_to_float32(s->dv, s->dv32)});
  };
  c.release = [s] { *s = Data{s->B, s->n, s->m, s->d}; };
  return c;
}

// The int8 forward (sdpa_forward_int8) on float32 values against the float32 forward on the same
// values, interleaved. Its FLOPs are the float32 forward's: the fraction of the FMA peak may pass 1,
// Q K^T running at vpdpbusd's rate (four times FMA's multiplies an instruction).
BenchCase int8_forward_case(index_t B, index_t n, index_t m, index_t d) {
  struct Data {
    index_t B, n, m, d;
    Tensor<float> q{}, k{}, v{}, out{}, out32{};
  };
  auto s = std::make_shared<Data>(Data{B, n, m, d});
  BenchCase c;
  c.name = "sdpa forward int8 (" + std::to_string(B) + "," + std::to_string(n) + "," + std::to_string(m) + "," +
           std::to_string(d) + ")";
  c.flops = 4.0 * static_cast<double>(B) * n * m * d;
  c.formula = "4 B n m d, as float32's (Q K^T in int8 may pass the FMA peak); float32 in the unfused column";
  c.tolerance = kInt8Tolerance;
  c.prepare = [s] {
    s->q = uniform({s->B, s->n, s->d}, 1), s->k = uniform({s->B, s->m, s->d}, 2), s->v = uniform({s->B, s->m, s->d}, 3);
    s->out = Tensor<float>({s->B, s->n, s->d}), s->out32 = s->out;
  };
  c.run_fused = [s] { attn::sdpa_forward_int8(s->out.view(), {}, s->q.view(), s->k.view(), s->v.view()); };
  c.run_unfused = [s] { attn::sdpa_forward<float>(s->out32.view(), {}, {}, s->q.view(), s->k.view(), s->v.view()); };
  c.check = [s] { return relative_to_float32(s->out, s->out32); };
  c.release = [s] { *s = Data{s->B, s->n, s->m, s->d}; };
  return c;
}

// Decoding over a KV cache of `type` holding m tokens of each of B sequences (one key head, or
// kv_heads read by `heads` query heads, grouped-query attention): attend against float32 sdpa over
// the same values.
BenchCase cache_decode_case(const char* type, attn::KvDtype dtype, index_t B, index_t m, index_t d, index_t heads = 1,
                            index_t kv_heads = 1) {
  struct Data {
    std::unique_ptr<attn::KvCache> cache;
    Tensor<float> q, k, v, out, out32;
  };
  auto s = std::make_shared<Data>();
  BenchCase c;
  const std::string grouped = heads > 1 ? " " + std::to_string(heads) + "/" + std::to_string(kv_heads) + " heads" : "";
  c.name = std::string("sdpa decode ") + type + grouped + " (" + std::to_string(B) + ",1," + std::to_string(m) + "," + std::to_string(d) + ")";
  const bool eight_bit_float = dtype == attn::KvDtype::float8_e4m3 || dtype == attn::KvDtype::float8_e5m2;
  const bool four_bit = dtype == attn::KvDtype::int4 || dtype == attn::KvDtype::int4_kivi;
  // 4-bit: half a byte a value and a float32 scale and minimum a group of 32 (int4_kivi's bfloat16
  // tail of m % 32 tokens is not counted: none at m a multiple of 32).
  const double bytes_per_value = dtype == attn::KvDtype::float32 ? 4.0
                                 : dtype == attn::KvDtype::int8 ? 1.0 + 4.0 / 32
                                 : four_bit                   ? 0.5 + 8.0 / 32
                                 : eight_bit_float            ? 1.0
                                                              : 2.0;
  c.bytes = static_cast<double>(B) * (2.0 * kv_heads * m * d * bytes_per_value + 8.0 * heads * d);
  c.formula = "bytes of the cache's keys and values (int8 and int4 with their scales and minima), queries and out; "
              "float32 in the unfused column";
  c.flops = 4.0 * static_cast<double>(B * heads) * m * d;
  // float8: a value within 2^-4 (e4m3) or 2^-3 (e5m2) of the float32 one, relatively (kv_cache.hpp).
  // int4 and int4_kivi: within (max - lo) / 30 of it, a group's range over 30, at most 2 max|x| / 30
  // = max|x| / 15 (int4_kivi's quantizing of bfloat16 values adds 2^-9 of max|x| at most).
  c.tolerance = dtype == attn::KvDtype::float32       ? 1e-5  // the same floats, summed in another order
                : dtype == attn::KvDtype::int8          ? kInt8Tolerance
                : dtype == attn::KvDtype::float8_e4m3 ? 4.0 / 16
                : dtype == attn::KvDtype::float8_e5m2 ? 4.0 / 8
                : four_bit                            ? kInt4Tolerance
                                                      : kBf16Tolerance;
  c.prepare = [s, dtype, B, m, d, heads, kv_heads] {
    s->q = uniform({B, heads, 1, d}, 1), s->k = uniform({B, kv_heads, m, d}, 2), s->v = uniform({B, kv_heads, m, d}, 3);
    s->out = Tensor<float>({B, heads, 1, d}), s->out32 = Tensor<float>({B, heads, 1, d});
    s->cache = std::make_unique<attn::KvCache>(B, kv_heads, d, attn::KvCacheOptions{.dtype = dtype});
    s->cache->append(s->k.view(), s->v.view());
  };
  c.run_fused = [s] { s->cache->attend(s->out.view(), s->q.view()); };
  c.run_unfused = [s] { attn::sdpa_forward<float>(s->out32.view(), {}, {}, s->q.view(), s->k.view(), s->v.view()); };
  c.check = [s] {
    double worst = 0, top = 1e-30;
    for (index_t i = 0; i < s->out32.numel(); ++i) {
      worst = std::max(worst, std::abs(static_cast<double>(s->out[i]) - s->out32[i]));
      top = std::max(top, std::abs(static_cast<double>(s->out32[i])));
    }
    return worst / top;
  };
  c.release = [s] { *s = Data{}; };
  return c;
}

// One token appended to each of B sequences of H key heads: the cache holds up to 4096 tokens and
// is emptied when full (blocks kept, so no run allocates).
BenchCase cache_append_case(index_t B, index_t H, index_t d) {
  struct Data {
    std::unique_ptr<attn::KvCache> cache;
    Tensor<float> k, v;
    index_t length = 0;
  };
  auto s = std::make_shared<Data>();
  BenchCase c;
  c.name = "kv cache append (" + std::to_string(B) + "," + std::to_string(H) + ",1," + std::to_string(d) + ")";
  c.bytes = 2.0 * 4.0 * static_cast<double>(B) * H * d;
  c.formula = "bytes of the float32 keys and values appended";
  c.prepare = [s, B, H, d] {
    s->cache = std::make_unique<attn::KvCache>(B, H, d, attn::KvCacheOptions{.dtype = attn::KvDtype::bfloat16, .capacity = 4096});
    s->k = uniform({B, H, 1, d}, 1), s->v = uniform({B, H, 1, d}, 2), s->length = 0;
  };
  c.run_fused = [s, B] {
    if (s->length == 4096) {
      for (index_t b = 0; b < B; ++b) s->cache->reset(b);
      s->length = 0;
    }
    s->cache->append(s->k.view(), s->v.view());
    ++s->length;
  };
  c.check = [] { return 0.0; };
  c.release = [s] { *s = Data{}; };
  return c;
}

}  // namespace

std::vector<BenchCase> half_cases() {
  return {half_case<attn::bfloat16>("bf16", 1, 4096, 4096, 128),
          half_case<attn::float16>("f16", 1, 4096, 4096, 128),
          half_case<attn::bfloat16>("bf16", 32, 1, 8192, 128),
          half_case<attn::float16>("f16", 32, 1, 8192, 128),
          half_backward_case<attn::bfloat16>("bf16", 4, 1024, 1024, 64),
          int8_forward_case(1, 4096, 4096, 128),
          cache_decode_case("int8", attn::KvDtype::int8, 32, 8192, 128),
          cache_decode_case("bf16 cache", attn::KvDtype::bfloat16, 32, 8192, 128),
          cache_decode_case("float8_e4m3 cache", attn::KvDtype::float8_e4m3, 32, 8192, 128),
          cache_decode_case("int4 cache", attn::KvDtype::int4, 32, 8192, 128),
          cache_decode_case("int4_kivi cache", attn::KvDtype::int4_kivi, 32, 8192, 128),
          cache_decode_case("float32 cache", attn::KvDtype::float32, 4, 8192, 128, 32, 8),
          cache_decode_case("bf16 cache", attn::KvDtype::bfloat16, 4, 8192, 128, 32, 8),
          cache_append_case(32, 8, 128)};
}

}  // namespace attn_cli
