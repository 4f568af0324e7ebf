// What fuzz/api_fuzz.cpp builds its arguments from: the fuzzer's bytes read as decisions (Bytes),
// tensors laid out in memory the way the bytes say (Strided: padded, permuted, broadcast, or with
// strides the library must refuse), and the checks of its results against the float64 reference.
//
// Memory is always honest: a Strided tensor's storage holds every element its strides can reach
// (negative strides included), so a sanitizer report is the library's own access, never the
// harness's lie. Storage its view does not reach (padding) holds a canary: a NaN the kernels would
// carry into a result if they read it, and that an output's padding must still hold after a call.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "attn/half.hpp"
#include "attn/tensor.hpp"

namespace fuzz {

using attn::index_t;

// Calls that computed, refused, and results compared with the reference (printed at exit with FUZZ_STATS=1).
inline long g_computed = 0, g_refused = 0, g_compared = 0;

// Aborts with a note: a broken promise of the library (libFuzzer then saves the input).
[[noreturn]] inline void broken(const char* what) {
  std::fprintf(stderr, "api_fuzz: broken promise: %s\n", what);
  std::abort();
}

// The fuzzer's bytes as decisions. Past the end every read gives 0 (the first choice), so any byte
// string is an input; element values past the end come from a counter instead, so tensors stay varied.
class Bytes {
 public:
  Bytes(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  std::uint8_t u8() { return pos_ < size_ ? data_[pos_++] : 0; }
  bool flag() { return (u8() & 1) != 0; }
  int pick(int n) { return u8() % n; }                  // one of n choices, n <= 256
  bool chance(int k) { return pos_ < size_ && u8() < k; }  // probability about k / 256; never past the end
  std::uint64_t u64() {
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = v << 8 | u8();
    return v;
  }
  // A size: mostly 1 to 5, sometimes 0 or up to 16.
  index_t dim() {
    const std::uint8_t b = u8();
    return b < 16 ? 0 : b < 208 ? 1 + b % 5 : b % 17;
  }
  // An element value: multiples of 1/32 in [-3.6, 3.6], or now and then NaN, an infinity, a value
  // too large for float32 or float16, a subnormal or -0. `special` is set for those that make the
  // comparison with the reference meaningless.
  double value() {
    if (pos_ >= size_) {  // past the end: a deterministic, varied sequence
      counter_ = counter_ * 6364136223846793005ull + 1442695040888963407ull;
      return static_cast<double>(static_cast<int>((counter_ >> 33) % 231) - 115) / 32.0;
    }
    const std::uint8_t b = u8();
    if (b < 240) return (static_cast<int>(b % 231) - 115) / 32.0;
    static constexpr double kSpecial[16] = {
        std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
        -std::numeric_limits<double>::infinity(), 1e30, -1e30, 1e300, 7e4, -7e4,
        1e-40, -0.0, 3e38, 1e5, 1e-300, 65504.0, -1e5, 20.0};
    const double v = kSpecial[b - 240];
    if (!(std::abs(v) <= 20.0) || (v != 0 && std::abs(v) < 1e-30)) special = true;
    return v;
  }
  bool exhausted() const { return pos_ >= size_; }

  bool special = false;  // a value was drawn that the reference cannot be compared on

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
  std::uint64_t counter_ = 0x9E3779B97F4A7C15ull;
};

// Conversions between the element types and double.
template <class T>
double to_double(T x) {
  if constexpr (std::is_same_v<T, attn::bfloat16> || std::is_same_v<T, attn::float16>) return attn::to_float(x);
  else return static_cast<double>(x);
}
template <class T>
T from_double(double x) {
  if constexpr (std::is_same_v<T, attn::bfloat16>) return attn::to_bfloat16(static_cast<float>(x));
  else if constexpr (std::is_same_v<T, attn::float16>) return attn::to_float16(static_cast<float>(x));
  else if constexpr (std::is_same_v<T, bool>) return x != 0;
  else return static_cast<T>(x);
}

// How a tensor lies in memory.
enum class Layout { contiguous, padded, permuted, broadcast, hostile };

inline Layout pick_layout(Bytes& in) {
  const std::uint8_t b = in.exhausted() ? 0 : in.u8();
  return b < 150 ? Layout::contiguous : b < 185 ? Layout::padded : b < 215 ? Layout::permuted : b < 238 ? Layout::broadcast : Layout::hostile;
}

// A tensor of T with the shape and strides the bytes chose, over storage that holds every element
// the strides reach. bool is stored in bytes (a canary byte that is neither 0 nor 1 is then a
// UBSan report if a kernel reads it as a bool).
template <class T>
class Strided {
  using S = std::conditional_t<std::is_same_v<T, bool>, std::uint8_t, T>;

 public:
  Strided() = default;

  // Lays out `shape` (any rank, sizes possibly negative: the view's constructor refuses those) and
  // fills it with gen(). `overflow`: hostile strides may overflow a 64-bit extent (only for
  // arguments whose extent the library checks).
  template <class Gen>
  Strided(Bytes& in, std::vector<index_t> shape, Layout layout, Gen gen, bool overflow = true)
      : shape_(std::move(shape)), strides_(shape_.size(), 0), given_(true) {
    const int rank = static_cast<int>(shape_.size());
    bool negative = false;
    for (index_t s : shape_) negative = negative || s < 0;
    // Natural strides first, then the layout's change.
    index_t running = 1;
    for (int i = rank - 1; i >= 0; --i) {
      strides_[i] = running;
      running = running * std::max<index_t>(shape_[i], 1) + (layout == Layout::padded ? in.pick(3) : 0);
    }
    if (layout == Layout::permuted && rank >= 3) {  // two outer dimensions swap places in memory
      const int a = in.pick(rank - 1), b = in.pick(rank - 1);
      std::vector<int> order(rank);  // order[k]: the dimension k-th from the outside in memory
      for (int i = 0; i < rank; ++i) order[i] = i;
      std::swap(order[a], order[b]);
      index_t r = 1;
      for (int k = rank - 1; k >= 0; --k) strides_[order[k]] = r, r *= std::max<index_t>(shape_[order[k]], 1);
    } else if (layout == Layout::broadcast && rank > 0) {
      strides_[in.pick(rank)] = 0;
    } else if (layout == Layout::hostile && rank > 0) {
      static constexpr index_t kHostile[8] = {0, -1, 2, -3, 7, std::numeric_limits<index_t>::min() / 2,
                                              std::numeric_limits<index_t>::max() / 2, 1};
      const int i = in.pick(rank);
      strides_[i] = kHostile[in.pick(8)];
      if (!overflow && std::abs(strides_[i]) > 64) strides_[i] = 64;
    }
    // The element offsets the view reaches: [lo, hi], or an overflow.
    index_t lo = 0, hi = 0;
    bool overflows = false;
    for (int i = 0; i < rank && !negative; ++i) {
      if (shape_[i] <= 1) continue;
      index_t span = 0;
      if (__builtin_mul_overflow(shape_[i] - 1, strides_[i], &span)) overflows = true;
      else if (span < 0 ? __builtin_add_overflow(lo, span, &lo) : __builtin_add_overflow(hi, span, &hi)) overflows = true;
    }
    if (negative || numel() == 0) {
      storage_.assign(1, canary());
      return;
    }
    index_t extent = 0;
    if (__builtin_sub_overflow(hi, lo, &extent)) overflows = true;
    if (overflows || extent > (index_t(1) << 20)) {
      if (!overflows) {  // too large to allocate: lay it out plainly
        reset_contiguous(in, gen);
        return;
      }
      storage_.assign(1, canary());  // no buffer can hold it: the library must refuse it
      unbacked_ = true;
      return;
    }
    base_ = -lo;
    storage_.assign(static_cast<std::size_t>(hi - lo + 1), canary());
    reached_.assign(storage_.size(), 0);
    index_t distinct = 0;
    for_each([&](index_t off) {
      S& e = storage_[static_cast<std::size_t>(base_ + off)];
      if (!reached_[static_cast<std::size_t>(base_ + off)]) ++distinct;
      reached_[static_cast<std::size_t>(base_ + off)] = 1;
      e = static_cast<S>(from_double<T>(gen()));
    });
    shares_ = distinct < numel();
  }

  bool given() const { return given_; }
  // "shape (..) strides (..)", for the messages.
  std::string describe() const {
    std::string d = "shape (";
    for (index_t x : shape_) d += std::to_string(x) + ",";
    d += ") strides (";
    for (index_t x : strides_) d += std::to_string(x) + ",";
    return d + ")";
  }
  // Two elements share memory (a broadcast or folded strides): fine for an input, refused for an output.
  bool shares() const { return shares_; }
  bool unbacked() const { return unbacked_; }
  const std::vector<index_t>& shape() const { return shape_; }
  index_t numel() const {
    index_t n = 1;
    for (index_t s : shape_) n *= s;
    return n;
  }
  T* data() const { return reinterpret_cast<T*>(const_cast<S*>(storage_.data())) + base_; }
  // The view (an empty one when not given). Its constructor may throw attn::Error (rank > 4, a
  // negative size): that is part of the API under test.
  attn::TensorView<T> view() const {
    if (!given_) return {};
    return attn::TensorView<T>(data(), shape_, strides_);
  }
  attn::TensorView<const T> cview() const { return view(); }

  // The elements in C order, as double (shape validated: only after a call accepted the view).
  std::vector<double> values() const {
    std::vector<double> v;
    if (numel() > 0) v.reserve(static_cast<std::size_t>(numel()));
    for_each([&](index_t off) { v.push_back(to_double<T>(static_cast<T>(storage_[static_cast<std::size_t>(base_ + off)]))); });
    return v;
  }
  // A dense copy as U (a view's dims must be valid).
  template <class U>
  attn::Tensor<U> dense() const {
    attn::Tensor<U> t(std::vector<index_t>(shape_.begin(), shape_.end()));
    const std::vector<double> v = values();
    for (std::size_t i = 0; i < v.size(); ++i) t.data()[i] = from_double<U>(v[i]);
    return t;
  }
  // Padding untouched: every storage element outside the view still holds the canary.
  bool padding_intact() const {
    const S c = canary();
    for (std::size_t i = 0; i < reached_.size(); ++i)
      if (!reached_[i] && std::memcmp(&storage_[i], &c, sizeof(S)) != 0) return false;
    return true;
  }
  double max_abs() const {
    double m = 0;
    for (double x : values())
      if (std::isfinite(x)) m = std::max(m, std::abs(x));
    return m;
  }

 private:
  static S canary() {
    if constexpr (std::is_same_v<T, bool>) return 0x5A;
    else if constexpr (std::is_same_v<T, float>) return std::bit_cast<float>(0x7FC0DEADu);
    else if constexpr (std::is_same_v<T, double>) return std::bit_cast<double>(0x7FF8DEADDEADDEADull);
    else if constexpr (std::is_same_v<T, attn::bfloat16> || std::is_same_v<T, attn::float16>) return T::from_bits(0x7FDE);
    else return static_cast<S>(0x5A5A5A5A5A5A5A5Bll);  // an integer no valid length or id equals
  }
  template <class F>
  void for_each(F f) const {
    const int rank = static_cast<int>(shape_.size());
    if (numel() <= 0 || unbacked_) return;
    std::vector<index_t> idx(rank, 0);
    for (index_t e = 0, n = numel(); e < n; ++e) {
      index_t off = 0;
      for (int i = 0; i < rank; ++i) off += idx[i] * strides_[i];
      f(off);
      for (int i = rank - 1; i >= 0; --i) {
        if (++idx[i] < shape_[i]) break;
        idx[i] = 0;
      }
    }
  }
  template <class Gen>
  void reset_contiguous(Bytes& in, Gen gen) {
    *this = Strided(in, shape_, Layout::contiguous, gen);
  }

  std::vector<index_t> shape_, strides_;
  std::vector<S> storage_;
  std::vector<std::uint8_t> reached_;
  index_t base_ = 0;
  bool given_ = false, shares_ = false, unbacked_ = false;
};

// Changes one size of `shape` now and then (a mismatch the library must name), or its rank.
inline std::vector<index_t> mutate(Bytes& in, std::vector<index_t> shape) {
  if (!in.chance(10)) return shape;
  switch (in.pick(4)) {
    case 0: shape.push_back(in.dim()); break;
    case 1:
      if (!shape.empty()) shape.erase(shape.begin());
      break;
    case 2:
      if (!shape.empty()) shape[static_cast<std::size_t>(in.pick(static_cast<int>(shape.size())))] = -1;
      break;
    default:
      if (!shape.empty()) shape[static_cast<std::size_t>(in.pick(static_cast<int>(shape.size())))] = in.dim();
  }
  return shape;
}

// ---- comparison with the float64 reference ------------------------------------------------------

// The tolerance of a result of type T: rtol relative to each reference element plus atol, both
// scaled by the caller's magnitude estimate. Wide enough for rounding in T (and the 16-bit types'
// one rounding of the result); a wrong mask, stride or index is off by the values' own size.
template <class T>
constexpr double kTol = std::is_same_v<T, double> ? 1e-11 : std::is_same_v<T, float> ? 2e-4
                      : std::is_same_v<T, attn::bfloat16> ? 1.0 / 64 : 1.0 / 256;

// Aborts unless every element of got matches want within atol + rtol |want| (NaN only with NaN,
// an infinity only with itself).
template <class T>
void expect_close(const Strided<T>& got, const attn::Tensor<double>& want, double atol, double rtol, const char* what) {
  if (!std::isfinite(atol) || !std::isfinite(rtol)) return;  // scores beyond double's range: nothing to compare
  const std::vector<double> g = got.values();
  if (static_cast<index_t>(g.size()) != want.numel()) broken(what);
  ++g_compared;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double a = g[i], b = want.data()[i];
    if (a == b || (std::isnan(a) && std::isnan(b))) continue;
    if (std::isfinite(a) && std::isfinite(b) && std::abs(a - b) <= atol + rtol * std::abs(b)) continue;
    std::fprintf(stderr, "api_fuzz: %s: element %zu is %.17g but the float64 reference gives %.17g (atol %.3g, rtol %.3g)\n",
                 what, i, a, b, atol, rtol);
    broken("the cpu backend matches the reference");
  }
}

}  // namespace fuzz
