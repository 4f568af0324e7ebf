// attn._attn._torch.rotary_forward: apply_rotary (attn/rotary.hpp) on PyTorch tensors, as
// attn.torch.apply_rotary calls it (forward, and with inverse=True its backward). Tensors are read
// through data_ptr(), shape, stride() and dtype (torch_borrow.hpp; bfloat16 included, no copy);
// attn.torch checks devices and dtypes and allocates out (or passes x itself, in place).
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "attn/half.hpp"
#include "attn/rotary.hpp"
#include "bindings.hpp"
#include "call.hpp"
#include "torch_borrow.hpp"

namespace attn_py {
namespace {

// An int32 or int64 tensor (attn.torch passes no other), or nothing for None.
attn::IndexVector indices(py::handle t, const char* name) {
  if (t.is_none()) return {};
  const Borrowed b = borrow(t);
  if (b.dtype == "int32") return view<const std::int32_t>(b, name);
  if (b.dtype == "int64") return view<const std::int64_t>(b, name);
  throw py::type_error(std::string("attn.torch: ") + name + " has dtype torch." + b.dtype + " where int32 or int64 was expected");
}

void rotary_forward(py::handle out_t, py::handle x_t, py::handle cos_t, py::handle sin_t, index_t offset,
                    py::handle offsets_t, py::handle cu_seqlens_t, bool interleaved, bool inverse) {
  const Borrowed out = borrow(out_t), x = borrow(x_t), cos = borrow(cos_t), sin = borrow(sin_t);
  attn::RotaryPositions positions;
  positions.offset = offset;
  positions.offsets = indices(offsets_t, "seqlen_offsets");
  positions.cu_seqlens = indices(cu_seqlens_t, "cu_seqlens");
  attn::RotaryOptions options;
  options.interleaved = interleaved, options.inverse = inverse;
  Call call(inverse ? "apply_rotary.backward" : "apply_rotary", {{"offset", "offsets"}, {"out", "x"}});
  for_dtype(x, "attn.torch: apply_rotary's x", [&](auto tag) {
    using T = decltype(tag);
    using C = attn::RotaryTable<T>;
    const std::string table = std::is_same_v<C, float> ? "float32" : "float64";
    if (cos.dtype != table || sin.dtype != table || out.dtype != x.dtype)
      throw py::type_error("attn.torch: apply_rotary's tables must be torch." + table + " for x of torch." + x.dtype);
    const auto o = view<T>(out, "out");
    const auto xv = view<const T>(x, "x");
    const auto c = view<const C>(cos, "cos"), s = view<const C>(sin, "sin");
    call.run([&] { attn::apply_rotary<T>(o, xv, c, s, positions, options); });
  });
}

}  // namespace

void bind_torch_rotary(py::module_& m) {
  using py::arg;
  py::module_ t = m.attr("_torch").cast<py::module_>();
  t.def("rotary_forward", &rotary_forward, arg("out"), arg("x"), arg("cos"), arg("sin"), arg("offset"), arg("offsets"),
        arg("cu_seqlens"), arg("interleaved"), arg("inverse"));
}

}  // namespace attn_py
