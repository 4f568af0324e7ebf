// attn.apply_rotary: rotary position embeddings (attn/rotary.hpp) on NumPy arrays: float32, float64
// or float16 x (float16 rotated in float32 and rounded once; its tables float32), the tables in x's
// precision, offsets an int or an int32/int64 array, cu_seqlens an int32/int64 array.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>

#include "attn/half.hpp"
#include "attn/rotary.hpp"
#include "bindings.hpp"
#include "call.hpp"

namespace attn_py {
namespace {

// An int32 or int64 array (TypeError otherwise), C-ordered.
py::array index_array(Call& call, py::handle obj, const char* name) {
  const py::array a = py::module_::import("numpy").attr("asarray")(obj);
  if (a.dtype().kind() != 'i' || (a.itemsize() != 4 && a.itemsize() != 8))
    call.type_error(std::string(name) + " has dtype " + std::string(py::str(a.dtype())) + "; it must be int32 or int64");
  return py::module_::import("numpy").attr("ascontiguousarray")(a);
}

attn::IndexVector index_view(const py::array& a) {
  if (a.itemsize() == 4) return cview<std::int32_t>(a);
  return cview<std::int64_t>(a);
}

py::object apply_rotary(py::object x_obj, py::object cos_obj, py::object sin_obj, bool interleaved, py::object offsets,
                        py::object cu_seqlens, bool inplace, bool inverse) {
  Call call("apply_rotary", {{"offset", "offsets"}, {"out", "x"}});
  call.allow_float16();
  const py::array x = call.floating(x_obj, "x");
  if (inplace && (!x.is(x_obj) || !x.writeable()))
    call.value_error("inplace=True writes into x, which must then be a writable NumPy array of float16, float32 or float64 "
                     "whose last axis is contiguous (attn would otherwise rotate a copy)");
  const py::array cos = call.same_dtype(cos_obj, "cos"), sin = call.same_dtype(sin_obj, "sin");
  attn::RotaryPositions positions;
  py::array offsets_array = no_array(), cu_array = no_array();
  if (py::isinstance<py::array>(offsets) || py::isinstance<py::list>(offsets) || py::isinstance<py::tuple>(offsets)) {
    offsets_array = index_array(call, offsets, "offsets");
    positions.offsets = index_view(offsets_array);
  } else {
    positions.offset = call.integer(offsets, "offsets");
  }
  if (!cu_seqlens.is_none()) {
    cu_array = index_array(call, cu_seqlens, "cu_seqlens");
    positions.cu_seqlens = index_view(cu_array);
  }
  attn::RotaryOptions options;
  options.interleaved = interleaved, options.inverse = inverse;
  const std::vector<index_t> shape = dims(x);
  const std::vector<py::ssize_t> pshape(shape.begin(), shape.end());
  if (call.dtype() == DType::f16) {
    const py::array out = inplace ? x : py::array(py::dtype("float16"), pshape);
    const auto o = view_of<attn::float16>(out);
    const auto xv = cview<attn::float16>(x);
    const auto c = cview<float>(cos), s = cview<float>(sin);
    call.run([&] { attn::apply_rotary<attn::float16>(o, xv, c, s, positions, options); });
    return out;
  }
  return dispatch(call.dtype(), [&](auto tag) -> py::object {
    using T = decltype(tag);
    const py::array out = inplace ? x : py::array(call.new_array<T>(shape));
    const auto o = view_of<T>(out);
    const auto xv = cview<T>(x);
    const auto c = cview<T>(cos), s = cview<T>(sin);
    call.run([&] { attn::apply_rotary<T>(o, xv, c, s, positions, options); });
    return out;
  });
}

}  // namespace

void bind_rotary(py::module_& m) {
  using py::arg;
  m.def("apply_rotary", &apply_rotary, arg("x"), arg("cos"), arg("sin"), py::kw_only(), arg("interleaved") = false,
        arg("offsets") = 0, arg("cu_seqlens") = py::none(), arg("inplace") = false, arg("inverse") = false,
        R"(Rotary position embeddings (RoPE), as FlashAttention's flash_attn.layers.rotary.apply_rotary_emb.

x: (batch, seqlen, nheads, headdim), or (total, nheads, headdim) with cu_seqlens (batch + 1,) int32 or
  int64: the sequences packed, sequence b being x[cu_seqlens[b]:cu_seqlens[b+1]].
cos, sin: (seqlen_ro, rotary_dim / 2); rotary_dim <= headdim; only x[..., :rotary_dim] rotates.
Token i of sequence b sits at position i + offsets (an int, or (batch,) int32/int64 per sequence), which
must be less than seqlen_ro. Non-interleaved (GPT-NeoX): x1 = x[..., :r/2], x2 = x[..., r/2:r],
out = (x1 cos - x2 sin, x1 sin + x2 cos); interleaved (GPT-J): the pairs (x[2k], x[2k+1]) likewise.
inverse=True rotates by the transpose (sin negated): it undoes the forward and is its backward.
inplace=True writes into x (a writable array whose last axis is contiguous) and returns it.
float32, float64 or float16 x (float16 computed in float32 and rounded once; its tables float32);
cos and sin are converted to x's precision. Returns an array like x.)");
}

}  // namespace attn_py
