// Array conversions of attn/half.hpp: sizes checked, then the SIMD kernels of cpu/simd/convert.cpp
// on the chosen target, large arrays split across threads.
#include "attn/half.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "attn/error.hpp"
#include "cpu/scratch.hpp"
#include "cpu/simd/convert.hpp"

namespace attn {
namespace {

template <class From, class To, class Kernel>
void convert_all(std::span<const From> from, std::span<To> to, const char* what, Kernel kernel) {
  if (from.size() != to.size())
    detail::fail("convert (", what, "): the source has ", from.size(), " elements but the destination ", to.size());
  const cpu::simd::Target target = cpu::simd::current();
  const auto* in = reinterpret_cast<const std::conditional_t<sizeof(From) == 2, std::uint16_t, float>*>(from.data());
  auto* out = reinterpret_cast<std::conditional_t<sizeof(To) == 2, std::uint16_t, float>*>(to.data());
  const std::ptrdiff_t count = static_cast<std::ptrdiff_t>(from.size()), chunk = std::ptrdiff_t(1) << 16;
  // A conversion reads and writes memory once, and a parallel region costs microseconds even when
  // it runs on one thread: none below two chunks (the 16-bit backward widens five tensors and
  // narrows three; at (4,1024,1024,64), 256K elements each, threads made it 1.00x-1.02x faster).
  if (count < 2 * chunk) return kernel(target, in, out, static_cast<std::size_t>(count));
  cpu::run_tasks((count + chunk - 1) / chunk, 0, true, [&](std::int64_t t, void*) {
    const std::ptrdiff_t c = t * chunk;
    kernel(target, in + c, out + c, static_cast<std::size_t>(std::min(chunk, count - c)));
  });
}

}  // namespace

void convert(std::span<const float> from, std::span<bfloat16> to) {
  convert_all(from, to, "float to bfloat16", cpu::simd::float_to_bfloat16);
}
void convert(std::span<const bfloat16> from, std::span<float> to) {
  convert_all(from, to, "bfloat16 to float", cpu::simd::bfloat16_to_float);
}
void convert(std::span<const float> from, std::span<float16> to) {
  convert_all(from, to, "float to float16", cpu::simd::float_to_float16);
}
void convert(std::span<const float16> from, std::span<float> to) {
  convert_all(from, to, "float16 to float", cpu::simd::float16_to_float);
}

}  // namespace attn
