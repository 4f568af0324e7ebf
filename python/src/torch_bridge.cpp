// attn._attn._torch: the kernels as attn.torch (python/attn/torch.py) calls them, on PyTorch tensors.
//
// A tensor is read through its own data_ptr(), shape, stride() and dtype, not through NumPy: no
// copy, any strides attn reads (the last dimension contiguous; 0 for an expanded dimension), and
// bfloat16, which NumPy lacks. The module links no libtorch; it only calls those four attributes.
// attn.torch checks devices and dtypes, makes the inputs' last dimension contiguous when it is not,
// and allocates every output (as torch tensors) before calling; the shapes are attn's own checks,
// whose messages Call::run rewrites to PyTorch's argument names. The GIL is released while attn
// computes.
//
// Each function takes its options as a dict (attn.torch._options builds it):
//   keep, additive, valid_lens, alibi_slopes, segment_ids_q, segment_ids_k: tensors or None
//   causal: "none" | "top_left" | "bottom_right"; align: None | "top_left" | "bottom_right";
//   window: None or (left, right); sinks: a tensor (H,) or None (attn/mask.hpp)
//   scale, softcap: None or a float; dropout_p: a float; seed: an int
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attn/additive.hpp"
#include "attn/half.hpp"
#include "attn/nadaraya_watson.hpp"
#include "attn/sdpa.hpp"
#include "bindings.hpp"
#include "call.hpp"
#include "torch_borrow.hpp"

namespace attn_py {
namespace {

// The data pointers the last forward of this thread read its inputs through: the no-copy test
// compares them with the tensors' data_ptr().
thread_local std::vector<std::uintptr_t> last_inputs;

struct MaskTensors {
  Borrowed keep, additive, valid_lens, alibi, segment_q, segment_k, sinks;
  attn::Causal causal = attn::Causal::none;
  std::optional<attn::Align> align;
  std::optional<attn::Window> window;

  // M: the dtype of the additive mask and the slopes (float32 for 16-bit attention).
  template <class M>
  attn::Mask<M> mask() const {
    attn::Mask<M> m;
    m.keep = view<const bool>(keep, "attn_mask");
    m.additive = view<const M>(additive, "attn_mask");
    m.valid_lens = view<const std::int64_t>(valid_lens, "valid_lens");
    m.alibi_slopes = view<const M>(alibi, "alibi_slopes");
    m.segment_ids_q = segments(segment_q, "segment_ids");
    m.segment_ids_k = segments(segment_k, "segment_ids");
    m.sinks = view<const M>(sinks, "sinks");
    m.causal = causal;
    m.align = align;
    m.window = window;
    return m;
  }

  static attn::SegmentIds segments(const Borrowed& b, const char* name) {
    if (!b.given) return {};
    if (b.dtype == "int32") return view<const std::int32_t>(b, name);
    return view<const std::int64_t>(b, name);
  }
};

struct Options {
  MaskTensors masks;
  attn::SdpaOptions sdpa;
};

Options options_from(const py::dict& o) {
  Options r;
  auto tensor = [&](const char* key) { return o.contains(key) ? borrow(o[key]) : Borrowed{}; };
  r.masks.keep = tensor("keep");
  r.masks.additive = tensor("additive");
  r.masks.valid_lens = tensor("valid_lens");
  r.masks.alibi = tensor("alibi_slopes");
  r.masks.segment_q = tensor("segment_ids_q");
  r.masks.segment_k = tensor("segment_ids_k");
  r.masks.sinks = tensor("sinks");
  if (o.contains("align") && !o["align"].is_none())
    r.masks.align = o["align"].cast<std::string>() == "bottom_right" ? attn::Align::bottom_right : attn::Align::top_left;
  const std::string causal = o.contains("causal") ? o["causal"].cast<std::string>() : "none";
  r.masks.causal = causal == "top_left" ? attn::Causal::top_left
                   : causal == "bottom_right" ? attn::Causal::bottom_right
                                              : attn::Causal::none;
  if (o.contains("window") && !o["window"].is_none()) {
    const auto w = o["window"].cast<std::pair<index_t, index_t>>();
    r.masks.window = attn::Window{w.first, w.second};
  }
  if (o.contains("scale") && !o["scale"].is_none()) r.sdpa.scale = o["scale"].cast<double>();
  if (o.contains("softcap") && !o["softcap"].is_none()) r.sdpa.softcap = o["softcap"].cast<double>();
  if (o.contains("dropout_p")) r.sdpa.dropout.p = o["dropout_p"].cast<double>();
  if (o.contains("seed")) r.sdpa.dropout.seed = o["seed"].cast<std::uint64_t>();
  return r;
}

// PyTorch's names for the arguments attn's messages start with.
Renames torch_renames() {
  return {{"queries", "query"},         {"keys", "key"},
          {"values", "value"},          {"dout", "grad_output"},
          {"valid_lens", "valid_lens"}, {"additive mask", "attn_mask (a float mask)"},
          {"mask", "attn_mask"},        {"dropout p", "dropout_p"},
          {"scale", "scale"},           {"alibi_slopes", "alibi_slopes"},
          {"softcap", "softcap"},       {"segment_ids (queries)", "segment_ids"},
          {"dsinks", "grad_sinks"}};
}

// FlashAttention's names for them (attn.flash).
Renames flash_renames() {
  return {{"queries", "q"},           {"keys", "k"},
          {"values", "v"},            {"dout", "dout"},
          {"dropout p", "dropout_p"}, {"scale", "softmax_scale"},
          {"alibi_slopes", "alibi_slopes"}, {"softcap", "softcap"},
          {"dsinks", "dsinks"}};
}

// The call of a function's kernel: its messages start with the Python function's name (options'
// "function": attn.flash's functions pass theirs, with FlashAttention's argument names), else
// scaled_dot_product_attention's, followed by `suffix`.
Call sdpa_call(const py::dict& o, const std::string& suffix) {
  if (o.contains("function")) return Call(o["function"].cast<std::string>() + suffix, flash_renames());
  return Call("scaled_dot_product_attention" + suffix, torch_renames());
}

void sdpa_forward(py::handle out_t, py::handle lse_t, py::handle q_t, py::handle k_t, py::handle v_t,
                  const py::dict& opts) {
  const Borrowed out = borrow(out_t), lse = borrow(lse_t), q = borrow(q_t), k = borrow(k_t), v = borrow(v_t);
  const Options o = options_from(opts);
  last_inputs = {reinterpret_cast<std::uintptr_t>(q.data), reinterpret_cast<std::uintptr_t>(k.data),
                 reinterpret_cast<std::uintptr_t>(v.data)};
  Call call = sdpa_call(opts, "");
  for_dtype(q, "attn.torch: query", [&](auto tag) {
    using T = decltype(tag);
    const auto mask = o.masks.mask<Wide<T>>();
    const auto ov = view<T>(out, "out");
    const auto lv = view<Wide<T>>(lse, "lse");
    const auto qv = view<const T>(q, "query"), kv = view<const T>(k, "key"), vv = view<const T>(v, "value");
    if constexpr (attn::Half16<T>)
      call.run([&] { attn::sdpa_forward<T>(ov, lv, qv, kv, vv, mask, o.sdpa); });
    else
      call.run([&] { attn::sdpa_forward<T>(ov, lv, {}, qv, kv, vv, mask, o.sdpa); });
  });
}

void sdpa_backward(py::handle dq_t, py::handle dk_t, py::handle dv_t, py::handle dout_t, py::handle q_t,
                   py::handle k_t, py::handle v_t, py::handle out_t, py::handle lse_t, const py::dict& opts,
                   py::handle dsinks_t) {
  const Borrowed dq = borrow(dq_t), dk = borrow(dk_t), dv = borrow(dv_t), dout = borrow(dout_t);
  const Borrowed q = borrow(q_t), k = borrow(k_t), v = borrow(v_t), out = borrow(out_t), lse = borrow(lse_t);
  const Borrowed dsinks = borrow(dsinks_t);
  const Options o = options_from(opts);
  Call call = sdpa_call(opts, ".backward");
  for_dtype(q, "attn.torch: query", [&](auto tag) {
    using T = decltype(tag);
    const auto mask = o.masks.mask<Wide<T>>();
    const auto dqv = view<T>(dq, "grad_query"), dkv = view<T>(dk, "grad_key"), dvv = view<T>(dv, "grad_value");
    const auto dov = view<const T>(dout, "grad_output");
    const auto qv = view<const T>(q, "query"), kv = view<const T>(k, "key"), vv = view<const T>(v, "value");
    const auto ov = view<const T>(out, "out");
    const auto lv = view<const Wide<T>>(lse, "lse");
    const auto dsv = view<Wide<T>>(dsinks, "grad_sinks");
    call.run([&] { attn::sdpa_backward<T>(dqv, dkv, dvv, dov, qv, kv, vv, ov, lv, mask, o.sdpa, dsv); });
  });
}

// Runs f(T{}) for float32 or float64 (additive attention and Nadaraya-Watson).
template <class F>
void for_float(const Borrowed& q, const char* function, F&& f) {
  if (q.dtype == "float32") return f(float{});
  if (q.dtype == "float64") return f(double{});
  throw py::type_error(std::string("attn.torch.") + function + ": queries have dtype torch." + q.dtype +
                       "; this operation computes in float32 or float64");
}

Renames additive_renames() {
  Renames r = torch_renames();
  r.insert(r.begin(), {{"W_q", "W_q"}, {"W_k", "W_k"}, {"w_v", "w_v"}, {"queries", "queries"}, {"keys", "keys"},
                       {"values", "values"}});
  return r;
}

template <class T>
attn::AdditiveParams<T> additive_params(const Borrowed& w_q, const Borrowed& w_k, const Borrowed& w_v) {
  return {view<const T>(w_q, "W_q"), view<const T>(w_k, "W_k"), view<const T>(w_v, "w_v")};
}

void additive_forward(py::handle out_t, py::handle q_t, py::handle k_t, py::handle v_t, py::handle w_q_t,
                      py::handle w_k_t, py::handle w_v_t, const py::dict& opts) {
  const Borrowed out = borrow(out_t), q = borrow(q_t), k = borrow(k_t), v = borrow(v_t);
  const Borrowed w_q = borrow(w_q_t), w_k = borrow(w_k_t), w_v = borrow(w_v_t);
  const Options o = options_from(opts);
  Call call("additive_attention", additive_renames());
  for_float(q, "additive_attention", [&](auto tag) {
    using T = decltype(tag);
    const auto mask = o.masks.mask<T>();
    const auto params = additive_params<T>(w_q, w_k, w_v);
    const auto ov = view<T>(out, "out");
    const auto qv = view<const T>(q, "queries"), kv = view<const T>(k, "keys"), vv = view<const T>(v, "values");
    call.run([&] { attn::additive_attention_forward<T>(ov, {}, qv, kv, vv, params, mask, o.sdpa.dropout); });
  });
}

void additive_backward(py::handle dq_t, py::handle dk_t, py::handle dv_t, py::handle dw_q_t, py::handle dw_k_t,
                       py::handle dw_v_t, py::handle dout_t, py::handle q_t, py::handle k_t, py::handle v_t,
                       py::handle w_q_t, py::handle w_k_t, py::handle w_v_t, const py::dict& opts) {
  const Borrowed dq = borrow(dq_t), dk = borrow(dk_t), dv = borrow(dv_t), dout = borrow(dout_t);
  const Borrowed dw_q = borrow(dw_q_t), dw_k = borrow(dw_k_t), dw_v = borrow(dw_v_t);
  const Borrowed q = borrow(q_t), k = borrow(k_t), v = borrow(v_t);
  const Borrowed w_q = borrow(w_q_t), w_k = borrow(w_k_t), w_v = borrow(w_v_t);
  const Options o = options_from(opts);
  Call call("additive_attention.backward", additive_renames());
  for_float(q, "additive_attention", [&](auto tag) {
    using T = decltype(tag);
    const auto mask = o.masks.mask<T>();
    const auto params = additive_params<T>(w_q, w_k, w_v);
    const attn::AdditiveGrads<T> grads{view<T>(dw_q, "grad_W_q"), view<T>(dw_k, "grad_W_k"), view<T>(dw_v, "grad_w_v")};
    const auto dqv = view<T>(dq, "grad_queries"), dkv = view<T>(dk, "grad_keys"), dvv = view<T>(dv, "grad_values");
    const auto dov = view<const T>(dout, "grad_output");
    const auto qv = view<const T>(q, "queries"), kv = view<const T>(k, "keys"), vv = view<const T>(v, "values");
    call.run([&] {
      attn::additive_attention_backward<T>(dqv, dkv, dvv, grads, dov, qv, kv, vv, params, mask, o.sdpa.dropout);
    });
  });
}

Renames nw_renames() {
  return {{"queries", "queries"}, {"keys", "keys"}, {"values", "values"}, {"width sigma", "width"},
          {"unknown kernel", "kernel: unknown kernel"}};
}

void nw_forward(py::handle out_t, py::handle q_t, py::handle k_t, py::handle v_t, const std::string& kernel_name,
                double width) {
  const Borrowed out = borrow(out_t), q = borrow(q_t), k = borrow(k_t), v = borrow(v_t);
  Call call("nadaraya_watson", nw_renames());
  attn::Kernel kernel{};
  call.run([&] { kernel = attn::kernel_from_name(kernel_name); });
  for_float(q, "nadaraya_watson", [&](auto tag) {
    using T = decltype(tag);
    const auto ov = view<T>(out, "out");
    const auto qv = view<const T>(q, "queries"), kv = view<const T>(k, "keys"), vv = view<const T>(v, "values");
    call.run([&] { attn::nadaraya_watson_forward<T>(ov, {}, qv, kv, vv, kernel, static_cast<T>(width)); });
  });
}

// Returns d loss / d width (0.0 when want_dwidth is false).
double nw_backward(py::handle dq_t, py::handle dk_t, py::handle dv_t, py::handle dout_t, py::handle q_t,
                   py::handle k_t, py::handle v_t, const std::string& kernel_name, double width, bool want_dwidth) {
  const Borrowed dq = borrow(dq_t), dk = borrow(dk_t), dv = borrow(dv_t), dout = borrow(dout_t);
  const Borrowed q = borrow(q_t), k = borrow(k_t), v = borrow(v_t);
  Call call("nadaraya_watson.backward", nw_renames());
  attn::Kernel kernel{};
  call.run([&] { kernel = attn::kernel_from_name(kernel_name); });
  double dwidth = 0.0;
  for_float(q, "nadaraya_watson", [&](auto tag) {
    using T = decltype(tag);
    const auto dqv = view<T>(dq, "grad_queries"), dkv = view<T>(dk, "grad_keys"), dvv = view<T>(dv, "grad_values");
    const auto dov = view<const T>(dout, "grad_output");
    const auto qv = view<const T>(q, "queries"), kv = view<const T>(k, "keys"), vv = view<const T>(v, "values");
    T ds{};
    call.run([&] {
      attn::nadaraya_watson_backward<T>(dqv, dkv, dvv, want_dwidth ? &ds : nullptr, dov, qv, kv, vv, kernel,
                                        static_cast<T>(width));
    });
    dwidth = static_cast<double>(ds);
  });
  return dwidth;
}

}  // namespace

void bind_torch_bridge(py::module_& m) {
  using py::arg;
  py::module_ t = m.def_submodule("_torch", "The kernels on PyTorch tensors, as attn.torch calls them (internal).");
  t.def("sdpa_forward", &sdpa_forward, arg("out"), arg("lse"), arg("query"), arg("key"), arg("value"), arg("options"));
  t.def("sdpa_backward", &sdpa_backward, arg("grad_query"), arg("grad_key"), arg("grad_value"), arg("grad_output"),
        arg("query"), arg("key"), arg("value"), arg("out"), arg("lse"), arg("options"), arg("grad_sinks") = py::none());
  t.def("additive_forward", &additive_forward, arg("out"), arg("queries"), arg("keys"), arg("values"), arg("W_q"),
        arg("W_k"), arg("w_v"), arg("options"));
  t.def("additive_backward", &additive_backward, arg("grad_queries"), arg("grad_keys"), arg("grad_values"),
        arg("grad_W_q"), arg("grad_W_k"), arg("grad_w_v"), arg("grad_output"), arg("queries"), arg("keys"),
        arg("values"), arg("W_q"), arg("W_k"), arg("w_v"), arg("options"));
  t.def("nadaraya_watson_forward", &nw_forward, arg("out"), arg("queries"), arg("keys"), arg("values"), arg("kernel"),
        arg("width"));
  t.def("nadaraya_watson_backward", &nw_backward, arg("grad_queries"), arg("grad_keys"), arg("grad_values"),
        arg("grad_output"), arg("queries"), arg("keys"), arg("values"), arg("kernel"), arg("width"),
        arg("want_grad_width"));
  t.def("last_input_pointers", [] { return last_inputs; },
        "The data pointers the last sdpa_forward of this thread read query, key and value through.");
}

}  // namespace attn_py
