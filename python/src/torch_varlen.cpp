// attn._attn._torch's variable-length calls, as attn.flash (python/attn/flash.py) makes them: the
// packed tensors (total, heads, headdim) and cu_seqlens read in place (torch_borrow.hpp) and handed
// to attn::varlen_forward / varlen_backward (attn/varlen.hpp). attn.flash checks devices, dtypes and
// cu_seqlens' dtype and allocates every output; the shapes and values are attn's own checks, whose
// messages name FlashAttention's arguments. The GIL is released while attn computes.
//
// Options dict: causal: "none" | "top_left" | "bottom_right"; align: None | "top_left" |
// "bottom_right"; window: None or (left, right); alibi_slopes, sinks: tensors or None (float32 for
// 16-bit q); scale, softcap: None or a float; dropout_p: a float; seed: an int.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <string>

#include "attn/dropout.hpp"
#include "attn/varlen.hpp"
#include "bindings.hpp"
#include "call.hpp"
#include "torch_borrow.hpp"

namespace attn_py {
namespace {

struct VarlenOptions {
  Borrowed alibi, sinks;
  attn::Causal causal = attn::Causal::none;
  std::optional<attn::Align> align;
  std::optional<attn::Window> window;
  attn::SdpaOptions sdpa;

  template <class W>
  attn::Mask<W> mask() const {
    attn::Mask<W> m;
    m.alibi_slopes = view<const W>(alibi, "alibi_slopes");
    m.sinks = view<const W>(sinks, "sinks");
    m.causal = causal, m.align = align, m.window = window;
    return m;
  }
};

VarlenOptions options_from(const py::dict& o) {
  VarlenOptions r;
  auto given = [&](const char* key) { return o.contains(key) && !o[key].is_none(); };
  if (given("alibi_slopes")) r.alibi = borrow(o["alibi_slopes"]);
  if (given("sinks")) r.sinks = borrow(o["sinks"]);
  auto align = [](const std::string& a) { return a == "bottom_right" ? attn::Align::bottom_right : attn::Align::top_left; };
  if (given("align")) r.align = align(o["align"].cast<std::string>());
  const std::string causal = given("causal") ? o["causal"].cast<std::string>() : "none";
  r.causal = causal == "top_left"       ? attn::Causal::top_left
             : causal == "bottom_right" ? attn::Causal::bottom_right
                                        : attn::Causal::none;
  if (given("window")) {
    const auto w = o["window"].cast<std::pair<index_t, index_t>>();
    r.window = attn::Window{w.first, w.second};
  }
  if (given("scale")) r.sdpa.scale = o["scale"].cast<double>();
  if (given("softcap")) r.sdpa.softcap = o["softcap"].cast<double>();
  if (given("dropout_p")) r.sdpa.dropout.p = o["dropout_p"].cast<double>();
  if (given("seed")) r.sdpa.dropout.seed = o["seed"].cast<std::uint64_t>();
  return r;
}

// FlashAttention's names for the arguments attn's messages start with.
Renames flash_renames() {
  return {{"queries", "q"},         {"keys", "k"},       {"values", "v"},           {"dout", "grad_output"},
          {"dsinks", "grad_sinks"}, {"out", "out"},      {"lse", "softmax_lse"},    {"dropout p", "dropout_p"},
          {"scale", "softmax_scale"}, {"softcap", "softcap"}, {"alibi_slopes", "alibi_slopes"}, {"sinks", "sinks"}};
}


attn::VarlenSeqs seqs_of(const Borrowed& cu_q, const Borrowed& cu_k, index_t max_q, index_t max_k) {
  return {view<const std::int32_t>(cu_q, "cu_seqlens_q"), view<const std::int32_t>(cu_k, "cu_seqlens_k"), max_q, max_k};
}

void varlen_forward(py::handle out_t, py::handle lse_t, py::handle weights_t, py::handle q_t, py::handle k_t,
                    py::handle v_t, py::handle cu_q_t, py::handle cu_k_t, index_t max_q, index_t max_k,
                    const py::dict& opts) {
  const Borrowed out = borrow(out_t), lse = borrow(lse_t), weights = borrow(weights_t);
  const Borrowed q = borrow(q_t), k = borrow(k_t), v = borrow(v_t), cu_q = borrow(cu_q_t), cu_k = borrow(cu_k_t);
  const VarlenOptions o = options_from(opts);
  Call call("flash_attn_varlen_func", flash_renames());
  for_dtype(q, "attn.flash: q", [&](auto tag) {
    using T = decltype(tag);
    const auto mask = o.mask<Wide<T>>();
    const auto seqs = seqs_of(cu_q, cu_k, max_q, max_k);
    const auto ov = view<T>(out, "out");
    const auto lv = view<Wide<T>>(lse, "softmax_lse");
    const auto qv = view<const T>(q, "q"), kv = view<const T>(k, "k"), vv = view<const T>(v, "v");
    if constexpr (attn::Half16<T>) {
      if (weights.given) throw py::type_error("attn.flash: the attention probabilities of 16-bit q are computed in float32");
      call.run([&] { attn::varlen_forward<T>(ov, lv, qv, kv, vv, seqs, mask, o.sdpa); });
    } else {
      const auto wv = view<T>(weights, "S_dmask");
      call.run([&] { attn::varlen_forward<T>(ov, lv, wv, qv, kv, vv, seqs, mask, o.sdpa); });
    }
  });
}

void varlen_backward(py::handle dq_t, py::handle dk_t, py::handle dv_t, py::handle dout_t, py::handle q_t,
                     py::handle k_t, py::handle v_t, py::handle out_t, py::handle lse_t, py::handle cu_q_t,
                     py::handle cu_k_t, index_t max_q, index_t max_k, const py::dict& opts, py::handle dsinks_t) {
  const Borrowed dq = borrow(dq_t), dk = borrow(dk_t), dv = borrow(dv_t), dout = borrow(dout_t);
  const Borrowed q = borrow(q_t), k = borrow(k_t), v = borrow(v_t), out = borrow(out_t), lse = borrow(lse_t);
  const Borrowed cu_q = borrow(cu_q_t), cu_k = borrow(cu_k_t), dsinks = borrow(dsinks_t);
  const VarlenOptions o = options_from(opts);
  Call call("flash_attn_varlen_func.backward", flash_renames());
  for_dtype(q, "attn.flash: q", [&](auto tag) {
    using T = decltype(tag);
    const auto mask = o.mask<Wide<T>>();
    const auto seqs = seqs_of(cu_q, cu_k, max_q, max_k);
    const auto dqv = view<T>(dq, "grad_q"), dkv = view<T>(dk, "grad_k"), dvv = view<T>(dv, "grad_v");
    const auto gv = view<const T>(dout, "grad_output");
    const auto qv = view<const T>(q, "q"), kv = view<const T>(k, "k"), vv = view<const T>(v, "v");
    const auto ov = view<const T>(out, "out");
    const auto lv = view<const Wide<T>>(lse, "softmax_lse");
    const auto dsv = view<Wide<T>>(dsinks, "grad_sinks");
    call.run([&] { attn::varlen_backward<T>(dqv, dkv, dvv, gv, qv, kv, vv, ov, lv, seqs, mask, o.sdpa, dsv); });
  });
}

// Dropout's keep decisions (attn/dropout.hpp) for scores (B, H, n, m), placed by row_start and
// key_start: what attn.flash's S_dmask encodes as signs.
void dropout_keep(py::handle keep_t, double p, std::uint64_t seed, index_t row_start, index_t key_start) {
  const Borrowed keep = borrow(keep_t);
  const auto kv = view<bool>(keep, "keep");
  Call call("flash_attn (return_attn_probs)", {});
  call.run([&] { attn::dropout_keep_mask(kv, attn::Dropout{p, seed, row_start, key_start}); });
}

}  // namespace

void bind_torch_varlen(py::module_& m) {
  using py::arg;
  py::module_ t = m.attr("_torch").cast<py::module_>();
  t.def("varlen_forward", &varlen_forward, arg("out"), arg("softmax_lse"), arg("weights"), arg("q"), arg("k"), arg("v"),
        arg("cu_seqlens_q"), arg("cu_seqlens_k"), arg("max_seqlen_q"), arg("max_seqlen_k"), arg("options"));
  t.def("varlen_backward", &varlen_backward, arg("grad_q"), arg("grad_k"), arg("grad_v"), arg("grad_output"), arg("q"),
        arg("k"), arg("v"), arg("out"), arg("softmax_lse"), arg("cu_seqlens_q"), arg("cu_seqlens_k"),
        arg("max_seqlen_q"), arg("max_seqlen_k"), arg("options"), arg("grad_sinks") = py::none());
  t.def("dropout_keep", &dropout_keep, arg("keep"), arg("dropout_p"), arg("seed"), arg("row_start") = 0,
        arg("key_start") = 0);
}

}  // namespace attn_py
