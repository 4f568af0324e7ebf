// attn._attn._torch.rotary_forward: apply_rotary (attn/rotary.hpp) on PyTorch tensors, as
// attn.torch.apply_rotary calls it (forward, and with inverse=True its backward). Tensors are read
// through data_ptr(), shape, stride() and dtype as torch_bridge.cpp reads them (bfloat16 included, no
// copy); attn.torch checks devices and dtypes and allocates out (or passes x itself, in place).
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

#include "attn/half.hpp"
#include "attn/rotary.hpp"
#include "bindings.hpp"
#include "call.hpp"

namespace attn_py {
namespace {

// A tensor's data, shape, strides (elements) and dtype name ("float32", "int64", ...).
struct Tensor {
  void* data = nullptr;
  std::vector<index_t> shape, strides;
  std::string dtype;
};

Tensor borrow(py::handle t) {
  Tensor b;
  b.data = reinterpret_cast<void*>(t.attr("data_ptr")().cast<std::uintptr_t>());
  for (py::handle s : t.attr("shape")) b.shape.push_back(s.cast<index_t>());
  for (py::handle s : t.attr("stride")()) b.strides.push_back(s.cast<index_t>());
  const std::string name = py::str(t.attr("dtype"));
  b.dtype = name.rfind("torch.", 0) == 0 ? name.substr(6) : name;
  return b;
}

template <class T>
attn::TensorView<T> view(const Tensor& b) {
  index_t numel = 1;
  for (const index_t s : b.shape) numel *= s;
  if (numel == 0) return {static_cast<T*>(b.data), b.shape};  // torch gives an empty tensor any strides
  return {static_cast<T*>(b.data), b.shape, b.strides};
}

// An int32 or int64 tensor (attn.torch passes no other), or nothing for None.
attn::IndexVector indices(py::handle t, const char* name) {
  if (t.is_none()) return {};
  const Tensor b = borrow(t);
  if (b.dtype == "int32") return view<const std::int32_t>(b);
  if (b.dtype == "int64") return view<const std::int64_t>(b);
  throw py::type_error(std::string("attn.torch: ") + name + " has dtype torch." + b.dtype + " where int32 or int64 was expected");
}

void rotary_forward(py::handle out_t, py::handle x_t, py::handle cos_t, py::handle sin_t, index_t offset,
                    py::handle offsets_t, py::handle cu_seqlens_t, bool interleaved, bool inverse) {
  const Tensor out = borrow(out_t), x = borrow(x_t), cos = borrow(cos_t), sin = borrow(sin_t);
  attn::RotaryPositions positions;
  positions.offset = offset;
  positions.offsets = indices(offsets_t, "seqlen_offsets");
  positions.cu_seqlens = indices(cu_seqlens_t, "cu_seqlens");
  attn::RotaryOptions options;
  options.interleaved = interleaved, options.inverse = inverse;
  Call call(inverse ? "apply_rotary.backward" : "apply_rotary", {{"offset", "offsets"}, {"out", "x"}});
  auto run = [&](auto tag) {
    using T = decltype(tag);
    using C = attn::RotaryTable<T>;
    const std::string table = std::is_same_v<C, float> ? "float32" : "float64";
    if (cos.dtype != table || sin.dtype != table || out.dtype != x.dtype)
      throw py::type_error("attn.torch: apply_rotary's tables must be torch." + table + " for x of torch." + x.dtype);
    const auto o = view<T>(out);
    const auto xv = view<const T>(x);
    const auto c = view<const C>(cos), s = view<const C>(sin);
    call.run([&] { attn::apply_rotary<T>(o, xv, c, s, positions, options); });
  };
  if (x.dtype == "float32") return run(float{});
  if (x.dtype == "float64") return run(double{});
  if (x.dtype == "bfloat16") return run(attn::bfloat16{});
  if (x.dtype == "float16") return run(attn::float16{});
  throw py::type_error("attn.torch: x has dtype torch." + x.dtype + "; attn rotates float32, float64, bfloat16 or float16");
}

}  // namespace

void bind_torch_rotary(py::module_& m) {
  using py::arg;
  py::module_ t = m.attr("_torch").cast<py::module_>();
  t.def("rotary_forward", &rotary_forward, arg("out"), arg("x"), arg("cos"), arg("sin"), arg("offset"), arg("offsets"),
        arg("cu_seqlens"), arg("interleaved"), arg("inverse"));
}

}  // namespace attn_py
