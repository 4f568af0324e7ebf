// Test cases shared by the attention ops whose queries and keys have free sizes q and k (additive,
// bilinear): their sizes, the mask and dropout cases every such op is checked with, the comparison
// with the float64 reference and the finite-difference check of every input and parameter.
#pragma once

#include <cmath>
#include <cstdint>
#include <ostream>
#include <string>
#include <type_traits>
#include <vector>

#include "attn/dropout.hpp"
#include "attn/mask.hpp"
#include "attn/config.hpp"
#include "support/testing.hpp"

namespace attn::testing {

// B batch, H heads (0: 3-D tensors without a heads axis), n queries, m keys, q and k the query and
// key sizes, v the value size.
struct QkvSizes {
  index_t B, H, n, m, q, k, v;
  std::vector<index_t> dims(index_t rows, index_t cols) const {
    return H == 0 ? std::vector<index_t>{B, rows, cols} : std::vector<index_t>{B, H, rows, cols};
  }
};

// The odd sizes of STYLE.md (n = 113, m = 203, q != k), as 3-D tensors and with 3 heads; and small
// sizes for finite differences.
inline constexpr QkvSizes kOdd3{2, 0, 113, 203, 59, 37, 23};
inline constexpr QkvSizes kOdd4{2, 3, 113, 203, 59, 37, 23};
inline constexpr QkvSizes kSmall3{2, 0, 3, 5, 4, 3, 2};
inline constexpr QkvSizes kSmall4{2, 2, 3, 5, 4, 3, 2};

// One way of restricting which keys a query sees, with or without dropout.
struct MaskCase {
  const char* name;
  bool lens_per_batch = false, lens_per_query = false, keep = false;
  Causal causal = Causal::none;
  MaskedFill fill = MaskedFill::exclude;
  double dropout = 0;
  bool additive = false;  // an additive (n, m) float mask, some entries -inf
};

// gtest prints a case by its name (in test listings and CTest names).
inline void PrintTo(const MaskCase& c, std::ostream* os) { *os << c.name; }

inline std::vector<MaskCase> all_mask_cases() {
  return {MaskCase{"none"},
          MaskCase{"lens_per_batch", true},
          MaskCase{"lens_per_query", false, true},
          MaskCase{"keep_broadcast", false, false, true},
          MaskCase{"causal", false, false, false, Causal::top_left},
          MaskCase{"causal_bottom_right", false, false, false, Causal::bottom_right},
          MaskCase{"d2l_fill", false, true, false, Causal::none, MaskedFill::d2l_minus_1e6},
          MaskCase{"dropout", false, false, false, Causal::none, MaskedFill::exclude, 0.3},
          MaskCase{"lens_and_dropout", false, true, false, Causal::none, MaskedFill::exclude, 0.3},
          MaskCase{"additive_mask", false, false, false, Causal::none, MaskedFill::exclude, 0, true},
          MaskCase{"everything", false, true, true, Causal::bottom_right, MaskedFill::exclude, 0.2, true}};
}

// The tensors of a MaskCase for sizes s, kept alive for the masks built from them:
//   valid lengths (B,): m/3 + 1 for the first batch element, m for the others;
//   valid lengths (B, n): (37 r) mod (m + 1) for row r = b n + i, which covers 0 and m;
//   keep (B, 1, 1, m) (or (B, 1, m) for 3-D tensors): key j of batch element b unless (b m + j) mod 7 = 3;
//   additive (n, m): uniform in [-2, 2), -inf where (i m + j) mod 11 = 5, and all of row 1.
struct MaskTensors {
  MaskCase c;
  Tensor<std::int64_t> lens_b, lens_q;
  Tensor<bool> keep;
  Tensor<double> bias64;
  Tensor<float> bias32;

  MaskTensors(const MaskCase& mc, const QkvSizes& s)
      : c(mc), lens_b({s.B}), lens_q({s.B, s.n}), keep(std::span<const index_t>(keep_shape(s))),
        bias64(random_tensor<double>({s.n, s.m}, 900, -2, 2)) {
    for (index_t b = 0; b < s.B; ++b) lens_b[b] = b == 0 ? s.m / 3 + 1 : s.m;
    for (index_t r = 0; r < s.B * s.n; ++r) lens_q[r] = (37 * r) % (s.m + 1);
    for (index_t e = 0; e < keep.numel(); ++e) keep[e] = e % 7 != 3;
    for (index_t e = 0; e < bias64.numel(); ++e)
      if (e % 11 == 5 || (s.n > 1 && e / s.m == 1)) bias64[e] = -INFINITY;
    bias32 = convert<float>(bias64);
  }
  static std::vector<index_t> keep_shape(const QkvSizes& s) {
    return s.H == 0 ? std::vector<index_t>{s.B, 1, s.m} : std::vector<index_t>{s.B, 1, 1, s.m};
  }
  template <class T>
  Mask<T> mask() const {
    Mask<T> mask;
    if (c.lens_per_batch) mask.valid_lens = lens_b.view();
    if (c.lens_per_query) mask.valid_lens = lens_q.view();
    if (c.keep) mask.keep = keep.view();
    if (c.additive) {
      if constexpr (std::is_same_v<T, float>) mask.additive = bias32.view();
      else mask.additive = bias64.view();
    }
    mask.causal = c.causal;
    mask.fill = c.fill;
    return mask;
  }
  Dropout dropout() const { return {c.dropout, 20240611}; }
};

// ---- checks of an op ------------------------------------------------------------------------
// An Op is a struct with, for T = float and double and inputs `in` (queries, keys, values, then
// the parameters):
//   static Tensor<T> forward(in, sizes, mask, dropout, Tensor<T>* weights)   -> out
//   static std::vector<Tensor<T>> backward(in, dout, mask, dropout)          -> one gradient per input

// out without the weights (the cpu backend's fused path, where the op has one), out and the weights
// asked for together (its unfused path), then every gradient, in precision T with the current backend.
template <class Op, class T>
std::vector<Tensor<T>> run_op(const std::vector<Tensor<double>>& in64, const Tensor<double>& dout64, const QkvSizes& s,
                              const MaskTensors& mt) {
  std::vector<Tensor<T>> in;
  for (const auto& t : in64) in.push_back(convert<T>(t));
  const Mask<T> mask = mt.mask<T>();
  Tensor<T> weights(s.dims(s.n, s.m));
  std::vector<Tensor<T>> r{Op::template forward<T>(in, s, mask, mt.dropout(), nullptr),
                           Op::template forward<T>(in, s, mask, mt.dropout(), &weights), weights};
  for (Tensor<T>& g : Op::template backward<T>(in, convert<T>(dout64), mask, mt.dropout())) r.push_back(std::move(g));
  return r;
}

// The cpu backend against the float64 reference (in float32 within the error budget of the
// float32 reference, in float64 to 1e-9), and at 1 against 2 threads (bit-identical), for out,
// weights and every gradient.
template <class Op>
void expect_op_matches_reference(const QkvSizes& s, const MaskCase& mc, const std::vector<Tensor<double>>& in) {
  const Tensor<double> dout = random_tensor<double>(s.dims(s.n, s.v), 200);
  const MaskTensors mt(mc, s);
  auto run = [&]<class T>() { return run_op<Op, T>(in, dout, s, mt); };
  expect_cpu_matches_reference(run, 1e-9);
  expect_same_at_1_and_2_threads<float>([&] { return run.template operator()<float>(); });
}

// One float32 call without a mask or dropout, made with the current backend, against the reference
// backend: `tested` is out, the weights, then one gradient per input (from `in` and `dout`); each
// within the error budget of the reference in float32 against the reference in float64.
template <class Op>
void expect_call_matches_reference(const QkvSizes& s, const std::vector<Tensor<float>>& in, const Tensor<float>& dout,
                                   const std::vector<Tensor<float>>& tested, const std::vector<std::string>& names) {
  ScopedBackend reference(Backend::reference);
  std::vector<Tensor<double>> in64;
  for (const Tensor<float>& t : in) in64.push_back(convert<double>(t));
  const Tensor<double> dout64 = convert<double>(dout);
  const MaskTensors none(MaskCase{"none"}, s);
  auto run = [&]<class T>() {
    std::vector<Tensor<T>> r = run_op<Op, T>(in64, dout64, s, none);
    r.erase(r.begin());  // run_op's out without the weights: `tested` asked for the weights
    return r;
  };
  const std::vector<Tensor<double>> oracle = run.template operator()<double>();
  const std::vector<Tensor<float>> ref32 = run.template operator()<float>();
  ASSERT_EQ(tested.size(), oracle.size());
  for (std::size_t i = 0; i < oracle.size(); ++i) {
    const std::string name = i == 0 ? "out" : i == 1 ? "weights" : "gradient of " + names[i - 2];
    EXPECT_TRUE(within_error_budget(tested[i], ref32[i], oracle[i])) << name;
  }
}

// The gradient of loss = sum(out * dout) with respect to every input and parameter, by both
// backends, against central differences in float64: worst relative error below 1e-6.
template <class Op>
void expect_op_gradients_match(const QkvSizes& s, const MaskCase& mc, std::vector<Tensor<double>> in,
                               const std::vector<std::string>& names) {
  const Tensor<double> dout = random_tensor<double>(s.dims(s.n, s.v), 400);
  const MaskTensors mt(mc, s);
  const Mask<double> mask = mt.mask<double>();
  for (Backend backend : {Backend::reference, Backend::cpu}) {
    SCOPED_TRACE(backend == Backend::cpu ? "cpu" : "reference");
    ScopedBackend use(backend);
    const std::vector<Tensor<double>> grads = Op::template backward<double>(in, dout, mask, mt.dropout());
    auto loss = [&] { return dot(Op::template forward<double>(in, s, mask, mt.dropout(), nullptr), dout); };
    ASSERT_EQ(in.size(), grads.size());
    for (std::size_t t = 0; t < in.size(); ++t) {
      std::string where;
      const double err = gradient_error(grads[t].values(), numeric_gradient(loss, in[t].values()), &where);
      EXPECT_LT(err, 1e-6) << "gradient of " << names[t] << ", " << where;
    }
  }
}

}  // namespace attn::testing
