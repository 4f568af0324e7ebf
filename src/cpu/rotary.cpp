// The rotary kernel: a loop over tokens (threaded past 64K elements), each head's first rotary_dim
// features rotated by one loop the compiler vectorises, the rest copied when out is not x.
#include "cpu/rotary.hpp"

#include <algorithm>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

#include "attn/half.hpp"
#include "attn/rotary.hpp"

namespace attn::cpu {
namespace {

// The first 2 * half features of one head: out = R(p) x, R the rotation of attn/rotary.hpp, s = -sin
// when inverse. out may be x: each pair is read before it is written and no pair shares an element
// with another, so the iterations are independent (omp simd) whether out is x or not.
template <class F, class C>
void rotate(F* out, const F* x, const C* cos, const C* sin, index_t half, bool interleaved, bool inverse) {
  const F sign = inverse ? F(-1) : F(1);
  if (interleaved) {
#pragma omp simd
    for (index_t k = 0; k < half; ++k) {
      const F c = static_cast<F>(cos[k]), s = sign * static_cast<F>(sin[k]);
      const F x1 = x[2 * k], x2 = x[2 * k + 1];
      out[2 * k] = x1 * c - x2 * s;
      out[2 * k + 1] = x1 * s + x2 * c;
    }
  } else {
#pragma omp simd
    for (index_t k = 0; k < half; ++k) {
      const F c = static_cast<F>(cos[k]), s = sign * static_cast<F>(sin[k]);
      const F x1 = x[k], x2 = x[k + half];
      out[k] = x1 * c - x2 * s;
      out[k + half] = x1 * s + x2 * c;
    }
  }
}

constexpr bool is_half(auto tag) {
  using T = decltype(tag);
  return std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>;
}

}  // namespace

template <class T, class C>
void rotary(const RotaryParams<T, C>& p) {
  const index_t tokens = p.starts != nullptr ? p.starts[p.batch] : p.batch * p.seqlen;
  const index_t rd = 2 * p.half, d = p.head_dim;
  const bool in_place = static_cast<const T*>(p.out) == p.x && p.out_sb == p.x_sb && p.out_ss == p.x_ss && p.out_sh == p.x_sh;
#pragma omp parallel if (tokens * p.heads * d > 65536)
  {
    std::vector<float> row(is_half(T{}) ? static_cast<std::size_t>(rd) : 0);  // a 16-bit row in float32
#pragma omp for schedule(static)
    for (index_t t = 0; t < tokens; ++t) {
      index_t b = 0, i = t;
      if (p.starts != nullptr) {  // the sequence holding token t: the last start at or before it
        b = static_cast<index_t>(std::upper_bound(p.starts + 1, p.starts + p.batch + 1, t) - (p.starts + 1));
        i = t - p.starts[b];
      } else if (p.seqlen > 0) {
        b = t / p.seqlen, i = t % p.seqlen;
      }
      const index_t pos = p.offsets[b] + i;
      const C* cos = p.cos + pos * p.cos_s;
      const C* sin = p.sin + pos * p.sin_s;
      const T* x = p.starts != nullptr ? p.x + t * p.x_ss : p.x + b * p.x_sb + i * p.x_ss;
      T* out = p.starts != nullptr ? p.out + t * p.out_ss : p.out + b * p.out_sb + i * p.out_ss;
      for (index_t h = 0; h < p.heads; ++h) {
        const T* xh = x + h * p.x_sh;
        T* oh = out + h * p.out_sh;
        if constexpr (is_half(T{})) {
          const auto n = static_cast<std::size_t>(rd);
          convert(std::span<const T>(xh, n), std::span<float>(row.data(), n));
          rotate(row.data(), row.data(), cos, sin, p.half, p.interleaved, p.inverse);
          convert(std::span<const float>(row.data(), n), std::span<T>(oh, n));
        } else {
          rotate(oh, xh, cos, sin, p.half, p.interleaved, p.inverse);
        }
        if (!in_place && d > rd) std::memcpy(oh + rd, xh + rd, static_cast<std::size_t>(d - rd) * sizeof(T));
      }
    }
  }
}

template void rotary(const RotaryParams<float, float>&);
template void rotary(const RotaryParams<double, double>&);
template void rotary(const RotaryParams<bfloat16, float>&);
template void rotary(const RotaryParams<float16, float>&);

}  // namespace attn::cpu
