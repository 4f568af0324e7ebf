// attn._attn._torch's KV-cache calls (attn/flash.hpp) on torch tensors, as attn's
// flash_attn_with_kvcache (python/attn/_flash_kvcache.py) and attn.flash's paged varlen forward make
// them: every tensor read in place through its data_ptr and strides (torch_borrow.hpp), the caches
// written in place. The Python side checks devices and dtypes and allocates out and softmax_lse;
// shapes and values are attn's own checks, whose messages name FlashAttention's arguments. The GIL
// is released while attn computes.
//
// Options dict: attn.flash's (attend_from below).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>

#include "attn/flash.hpp"
#include "bindings.hpp"
#include "call.hpp"
#include "torch_borrow.hpp"

namespace attn_py {
namespace {

struct AttendTensors {
  Borrowed alibi, sinks;
  attn::FlashAttendOptions options;  // without the tensors, which view() makes once the dtype is known

  attn::FlashAttendOptions with_views() const {
    attn::FlashAttendOptions o = options;
    o.alibi_slopes = view<const float>(alibi, "alibi_slopes");
    o.sinks = view<const float>(sinks, "sinks");
    return o;
  }
};

// The options dict of attn.flash (python/attn/flash.py's _options): causal "bottom_right" | "none"
// (or a bool), window None or (left, right), scale and softcap None or a float, alibi_slopes and
// sinks float32 tensors or None, dropout_p 0 (the KV-cache calls have no dropout).
AttendTensors attend_from(const py::dict& d, const char* function) {
  AttendTensors r;
  auto given = [&](const char* key) { return d.contains(key) && !d[key].is_none(); };
  if (given("alibi_slopes")) r.alibi = borrow(d["alibi_slopes"]);
  if (given("sinks")) r.sinks = borrow(d["sinks"]);
  if (given("scale")) r.options.softmax_scale = d["scale"].cast<double>();
  if (given("causal"))
    r.options.causal = py::isinstance<py::bool_>(d["causal"]) ? d["causal"].cast<bool>() : d["causal"].cast<std::string>() == "bottom_right";
  if (given("softcap")) r.options.softcap = d["softcap"].cast<double>();
  if (given("window")) {
    const auto w = d["window"].cast<std::pair<index_t, index_t>>();
    r.options.window = attn::Window{w.first, w.second};
  }
  if (given("dropout_p") && d["dropout_p"].cast<double>() != 0)
    throw py::value_error(std::string(function) + ": dropout_p is " + std::string(py::str(d["dropout_p"])) +
                          "; the paged forward has no dropout (inference only)");
  return r;
}


void with_kvcache(py::handle out_t, py::handle lse_t, py::handle q_t, py::handle k_cache_t, py::handle v_cache_t,
                  py::handle k_t, py::handle v_t, py::handle cos_t, py::handle sin_t, py::handle seqlens_t,
                  py::handle batch_idx_t, py::handle leftpad_t, py::handle table_t, bool interleaved, const py::dict& opts) {
  const Borrowed out = borrow(out_t), lse = borrow(lse_t), q = borrow(q_t), kc = borrow(k_cache_t), vc = borrow(v_cache_t);
  const Borrowed k = borrow(k_t), v = borrow(v_t), cos = borrow(cos_t), sin = borrow(sin_t), seqlens = borrow(seqlens_t);
  const Borrowed idx = borrow(batch_idx_t), pad = borrow(leftpad_t), table = borrow(table_t);
  const AttendTensors a = attend_from(opts, "flash_attn_with_kvcache");
  Call call("flash_attn_with_kvcache", {});
  for_dtype</*kFloat64=*/false>(q, "flash_attn_with_kvcache: q", [&](auto tag) {
    using T = decltype(tag);
    attn::FlashKvCacheParams<T> p;
    p.k_cache = view<T>(kc, "k_cache"), p.v_cache = view<T>(vc, "v_cache");
    p.k_new = view<const T>(k, "k"), p.v_new = view<const T>(v, "v");
    p.rotary_cos = view<const T>(cos, "rotary_cos"), p.rotary_sin = view<const T>(sin, "rotary_sin");
    p.rotary_interleaved = interleaved;
    p.cache_seqlens = view<const std::int32_t>(seqlens, "cache_seqlens");
    p.cache_batch_idx = view<const std::int32_t>(idx, "cache_batch_idx");
    p.cache_leftpad = view<const std::int32_t>(pad, "cache_leftpad");
    p.block_table = view<const std::int32_t>(table, "block_table");
    p.attend = a.with_views();
    const auto ov = view<T>(out, "out");
    const auto lv = view<float>(lse, "softmax_lse");
    const auto qv = view<const T>(q, "q");
    call.run([&] { attn::flash_attn_with_kvcache<T>(ov, lv, qv, p); });
  });
}

// attn.flash's contract (flash.py's _paged); max_seqlen_q and max_seqlen_k are not needed.
void paged_varlen_forward(py::handle out_t, py::handle lse_t, py::handle q_t, py::handle k_cache_t, py::handle v_cache_t,
                          py::handle cu_q_t, py::handle cu_k_t, index_t /*max_seqlen_q*/, index_t /*max_seqlen_k*/,
                          py::handle table_t, const py::dict& opts, py::handle seqused_t) {
  const Borrowed out = borrow(out_t), lse = borrow(lse_t), q = borrow(q_t), kc = borrow(k_cache_t), vc = borrow(v_cache_t);
  const Borrowed table = borrow(table_t), cu_q = borrow(cu_q_t), cu_k = borrow(cu_k_t), used = borrow(seqused_t);
  const AttendTensors a = attend_from(opts, "flash_attn_varlen_func");
  Call call("flash_attn_varlen_func", {});
  for_dtype</*kFloat64=*/false>(q, "flash_attn_varlen_func: q", [&](auto tag) {
    using T = decltype(tag);
    attn::FlashPagedVarlenParams<T> p;
    p.k_cache = view<const T>(kc, "k"), p.v_cache = view<const T>(vc, "v");
    p.block_table = view<const std::int32_t>(table, "block_table");
    p.cu_seqlens_q = view<const std::int32_t>(cu_q, "cu_seqlens_q");
    p.cu_seqlens_k = view<const std::int32_t>(cu_k, "cu_seqlens_k");
    p.seqused_k = view<const std::int32_t>(used, "seqused_k");
    p.attend = a.with_views();
    const auto ov = view<T>(out, "out");
    const auto lv = view<float>(lse, "softmax_lse");
    const auto qv = view<const T>(q, "q");
    call.run([&] { attn::flash_attn_varlen_paged<T>(ov, lv, qv, p); });
  });
}

}  // namespace

void bind_torch_flash(py::module_& m) {
  using py::arg;
  py::module_ t = m.attr("_torch").cast<py::module_>();
  t.def("flash_attn_with_kvcache", &with_kvcache, arg("out"), arg("softmax_lse"), arg("q"), arg("k_cache"), arg("v_cache"),
        arg("k"), arg("v"), arg("rotary_cos"), arg("rotary_sin"), arg("cache_seqlens"), arg("cache_batch_idx"),
        arg("cache_leftpad"), arg("block_table"), arg("rotary_interleaved"), arg("options"),
        "attn::flash_attn_with_kvcache on torch tensors: out (and softmax_lse, or None) written, the caches updated in place.");
  t.def("paged_varlen_forward", &paged_varlen_forward, arg("out"), arg("softmax_lse"), arg("q"), arg("k_cache"),
        arg("v_cache"), arg("cu_seqlens_q"), arg("cu_seqlens_k"), arg("max_seqlen_q"), arg("max_seqlen_k"),
        arg("block_table"), arg("options"), arg("seqused_k") = py::none(),
        "attn::flash_attn_varlen_paged on torch tensors: out (total_q, nheads, headdim) and softmax_lse (nheads, total_q) or None.");
}

}  // namespace attn_py
