// attn.varlen_attention: attention over packed variable-length sequences (attn/varlen.hpp) on NumPy
// arrays, float32 or float64; cu_seqlens int32 (FlashAttention's dtype).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <string>

#include "attn/varlen.hpp"
#include "bindings.hpp"
#include "call.hpp"

namespace attn_py {
namespace {

py::array offsets_array(Call& call, py::handle obj, const char* name) {
  const py::array a = py::module_::import("numpy").attr("asarray")(obj);
  if (a.dtype().kind() != 'i' || a.itemsize() != 4)
    call.type_error(std::string(name) + " has dtype " + std::string(py::str(a.dtype())) +
                    "; it must be int32 (FlashAttention's cu_seqlens)");
  return py::module_::import("numpy").attr("ascontiguousarray")(a);
}

// The longest sequence of cu_seqlens (0 for one that decreases: attn then names the fault).
index_t longest(const py::array& cu) {
  const auto v = cview<std::int32_t>(cu);
  index_t m = 0;
  for (index_t b = 0; v.rank() == 1 && b + 1 < v.dim(0); ++b) m = std::max<index_t>(m, v(b + 1) - v(b));
  return m;
}

py::object varlen_attention(py::object q_obj, py::object k_obj, py::object v_obj, py::object cu_q_obj,
                            py::object cu_k_obj, py::object max_q_obj, py::object max_k_obj, py::object causal_obj,
                            py::object align_obj, py::object window_obj, py::object slopes_obj, py::object softcap_obj,
                            py::object scale_obj, py::object sinks_obj, py::object dropout_obj, py::object seed_obj,
                            bool return_lse) {
  Call call("varlen_attention", {{"queries", "q"}, {"keys", "k"}, {"values", "v"}, {"dropout p", "dropout_p"}});
  const py::array q = call.floating(q_obj, "q"), k = call.floating(k_obj, "k"), v = call.floating(v_obj, "v");
  const py::array cu_q = offsets_array(call, cu_q_obj, "cu_seqlens_q"), cu_k = offsets_array(call, cu_k_obj, "cu_seqlens_k");
  const index_t max_q = max_q_obj.is_none() ? longest(cu_q) : call.integer(max_q_obj, "max_seqlen_q");
  const index_t max_k = max_k_obj.is_none() ? longest(cu_k) : call.integer(max_k_obj, "max_seqlen_k");
  py::array slopes = no_array(), sinks = no_array();
  if (!slopes_obj.is_none()) slopes = call.same_dtype(slopes_obj, "alibi_slopes");
  if (!sinks_obj.is_none()) sinks = call.same_dtype(sinks_obj, "sinks");
  const std::string align = call.text(align_obj, "align");
  if (align != "bottom_right" && align != "top_left")
    call.value_error("align is \"" + align + "\"; it must be \"bottom_right\" (FlashAttention's) or \"top_left\"");
  const bool causal = py::isinstance<py::bool_>(causal_obj) ? causal_obj.cast<bool>() : false;
  if (!py::isinstance<py::bool_>(causal_obj)) call.type_error("causal must be a bool; got " + str_of(causal_obj));
  attn::SdpaOptions options;
  if (!scale_obj.is_none()) options.scale = call.number(scale_obj, "scale");
  if (!softcap_obj.is_none()) options.softcap = call.number(softcap_obj, "softcap");
  options.dropout.p = call.number(dropout_obj, "dropout_p");
  options.dropout.seed = call.seed(seed_obj, "seed");
  const std::optional<attn::Window> window = window_from(call, window_obj);
  if (q.ndim() != 3 || v.ndim() != 3)
    call.value_error("q has shape " + str_of(q.attr("shape")) + " and v " + str_of(v.attr("shape")) +
                     "; packed tensors are (total, nheads, headdim)");
  const std::vector<index_t> out_shape = {dim(q, 0), dim(q, 1), dim(v, 2)}, lse_shape = {dim(q, 1), dim(q, 0)};
  return dispatch(call.dtype(), [&](auto tag) -> py::object {
    using T = decltype(tag);
    attn::Mask<T> mask;
    mask.causal = causal ? attn::Causal::bottom_right : attn::Causal::none;
    mask.align = align == "bottom_right" ? attn::Align::bottom_right : attn::Align::top_left;
    if (causal && align == "top_left") mask.causal = attn::Causal::top_left;
    mask.window = window;
    if (slopes) mask.alibi_slopes = cview<T>(slopes);
    if (sinks) mask.sinks = cview<T>(sinks);
    const attn::VarlenSeqs seqs{cview<std::int32_t>(cu_q), cview<std::int32_t>(cu_k), max_q, max_k};
    py::array out = call.new_array<T>(out_shape, "out"), lse = return_lse ? py::array(call.new_array<T>(lse_shape, "lse")) : no_array();
    const auto o = view_of<T>(out);
    const auto l = lse ? view_of<T>(lse) : attn::TensorView<T>{};
    const auto qv = cview<T>(q), kv = cview<T>(k), vv = cview<T>(v);
    call.run([&] { attn::varlen_forward<T>(o, l, {}, qv, kv, vv, seqs, mask, options); });
    if (return_lse) return py::make_tuple(out, lse);
    return out;
  });
}

}  // namespace

void bind_varlen(py::module_& m) {
  using py::arg;
  m.def("varlen_attention", &varlen_attention, arg("q"), arg("k"), arg("v"), arg("cu_seqlens_q"), arg("cu_seqlens_k"),
        arg("max_seqlen_q") = py::none(), arg("max_seqlen_k") = py::none(), py::kw_only(), arg("causal") = false,
        arg("align") = "bottom_right", arg("window") = py::none(), arg("alibi_slopes") = py::none(),
        arg("softcap") = py::none(), arg("scale") = py::none(), arg("sinks") = py::none(), arg("dropout_p") = 0.0,
        arg("seed") = 0, arg("return_lse") = false,
        R"(Scaled dot-product attention over variable-length sequences packed along the first axis
(FlashAttention's flash_attn_varlen_func; attn/varlen.hpp), forward only (attn.flash has autograd).

q (total_q, nheads, headdim), k (total_k, nheads_k, headdim), v (total_k, nheads_k, headdim_v): float32
or float64; cu_seqlens_q, cu_seqlens_k (batch + 1,) int32, 0 then the cumulative lengths: sequence b's
queries are q[cu_seqlens_q[b]:cu_seqlens_q[b+1]] and it attends only to its own keys. max_seqlen_q,
max_seqlen_k: at least every sequence's length (default: the longest). Per sequence, with its own
lengths n, m: causal (query i sees keys j <= p(i)), window (left, right) (None or -1: unbounded) and
ALiBi slopes (nheads,) or (batch, nheads) (score -= slope |p(i) - j|), where p(i) = i + m - n for
align="bottom_right" (FlashAttention's, the default) or i for "top_left"; softcap c > 0 (score =
c tanh(score / c)); sinks (nheads,) logits joining each row's softmax; dropout_p with seed (sequence b's
weight (h, i, j) takes the decision of one (1, nheads, total_q, total_k) attention at
(h, cu_seqlens_q[b] + i, cu_seqlens_k[b] + j)). nheads a multiple of nheads_k (GQA). A query with no key
outputs 0. Returns out (total_q, nheads, headdim_v), and with return_lse=True also lse (nheads, total_q)
(-inf for a row with no key and no sink).)");
}

}  // namespace attn_py
