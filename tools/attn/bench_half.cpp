// The 16-bit cases of `attn bench`: bfloat16 and float16 forward and decode through the public API,
// each against the float32 call on the same values run in the same process (the "unfused" column:
// float32), so the ratio is measured. Decode reads its 16-bit keys and values in place (half the
// bytes of float32); the forward widens them to float32 on entry (no 16-bit tile kernel yet).
#include <memory>
#include <string>

#include "attn/half.hpp"
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

template <class H>
BenchCase half_case(const char* type, index_t B, index_t n, index_t m, index_t d) {
  auto s = std::make_shared<HalfData<H>>(HalfData<H>{B, n, m, d});
  BenchCase c;
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
  c.check = [s] {  // against float32 on the unrounded values: the 16-bit rounding shows (about 1e-2 for bf16)
    double worst = 0, top = 1e-30;
    for (index_t i = 0; i < s->out32.numel(); ++i) {
      worst = std::max(worst, std::abs(static_cast<double>(attn::to_float(s->out.data()[i])) - s->out32[i]));
      top = std::max(top, std::abs(static_cast<double>(s->out32[i])));
    }
    return worst / top;
  };
  c.release = [s] { s->release(); };
  return c;
}

}  // namespace

std::vector<BenchCase> half_cases() {
  return {half_case<attn::bfloat16>("bf16", 1, 4096, 4096, 128), half_case<attn::float16>("f16", 1, 4096, 4096, 128),
          half_case<attn::bfloat16>("bf16", 32, 1, 8192, 128), half_case<attn::float16>("f16", 32, 1, 8192, 128)};
}

}  // namespace attn_cli
