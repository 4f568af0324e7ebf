// The module's functions: masked_softmax, bmm, scaled_dot_product_attention, nadaraya_watson.
// Each converts its arguments (call.hpp), allocates its outputs as NumPy arrays, and runs the C++
// forward on views of them: attn writes straight into the arrays it returns.
#include <span>
#include <string>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "attn/bmm.hpp"
#include "attn/half.hpp"
#include "attn/nadaraya_watson.hpp"
#include "attn/sdpa.hpp"
#include "attn/softmax.hpp"
#include "attn/width_selection.hpp"
#include "bindings.hpp"
#include "call.hpp"

namespace attn_py {
namespace {

// What the messages of the masks call each argument (the same as the Python names).
Renames mask_renames() {
  return {{"valid_lens", "valid_lens"}, {"mask", "mask"}, {"additive mask", "mask (a float mask)"},
          {"dropout p", "dropout_p"}, {"scale", "scale"}};
}

Renames with_masks(Renames renames) {
  for (auto& r : mask_renames()) renames.push_back(std::move(r));
  return renames;
}

py::array masked_softmax(py::object X, py::object valid_lens, py::object mask, py::object causal,
                         py::object masked_fill) {
  Call call("masked_softmax", with_masks({{"scores", "X"}}));
  call.allow_float16();
  const py::array x = widened(call, call.floating(X, "X"));
  const MaskArgs m = mask_args(call, valid_lens, mask, causal, masked_fill);
  return narrowed(call, dispatch(computed_in(call), [&](auto tag) -> py::array {
    using T = decltype(tag);
    py::array_t<T> weights = call.new_array<T>(dims(x));
    const auto w = view_of<T>(weights);
    const auto s = cview<T>(x);
    const attn::Mask<T> mk = m.mask<T>();
    call.run([&] { attn::masked_softmax_forward<T>(w, s, mk); });
    return weights;
  }));
}

py::array bmm(py::object a_obj, py::object b_obj, bool transpose_a, bool transpose_b) {
  Call call("bmm", {});
  call.allow_float16();
  const py::array a = widened(call, call.floating(a_obj, "a"));
  const py::array b = widened(call, call.floating(b_obj, "b"));
  // out (batch..., rows of op(a), columns of op(b)); attn checks the shapes, this only sizes out.
  std::vector<index_t> shape = dims(a, 0, -2);
  shape.push_back(dim(a, transpose_a ? -1 : -2));
  shape.push_back(dim(b, transpose_b ? -2 : -1));
  return narrowed(call, dispatch(computed_in(call), [&](auto tag) -> py::array {
    using T = decltype(tag);
    py::array_t<T> out = call.new_array<T>(shape);
    const auto o = view_of<T>(out);
    const auto av = cview<T>(a), bv = cview<T>(b);
    call.run([&] { attn::bmm_forward<T>(o, av, bv, transpose_a, transpose_b); });
    return out;
  }));
}

// segment_ids: None, one array for queries and keys (n == m), or a pair (queries' ids, keys' ids).
struct SegmentArgs {
  py::array q = no_array(), k = no_array();
};
SegmentArgs segments_from(Call& call, py::handle obj) {
  SegmentArgs s;
  if (obj.is_none()) return s;
  if (py::isinstance<py::tuple>(obj) || py::isinstance<py::list>(obj)) {
    const py::sequence pair = py::reinterpret_borrow<py::sequence>(obj);
    if (py::len(pair) != 2)
      call.type_error("segment_ids must be an array (B, n), or a pair of arrays (B, n) and (B, m); got a sequence of " +
                      std::to_string(py::len(pair)));
    s.q = call.segment_ids(pair[0], "segment_ids[0] (queries)");
    s.k = call.segment_ids(pair[1], "segment_ids[1] (keys)");
    return s;
  }
  s.q = call.segment_ids(obj, "segment_ids");
  return s;
}

attn::SegmentIds segment_view(const py::array& a) {
  if (!a) return {};
  if (a.itemsize() == 4) return cview<std::int32_t>(a);
  return cview<std::int64_t>(a);
}

// The 16-bit paths of scaled_dot_product_attention: float16 arrays (out float16), or float32 arrays
// computed in bfloat16 (rounded once on entry, out the float32 result, not rounded); lse float32.
py::object sdpa_16bit(Call& call, const py::array& q, const py::array& k, const py::array& v, const MaskArgs& m,
                      attn::Mask<float> mk, const attn::SdpaOptions& options, const std::vector<index_t>& out_shape,
                      const std::vector<index_t>& lse_shape, bool return_lse) {
  if (m.additive) mk.additive = cview<float>(m.additive);  // float32 already (Call::mask)
  py::array_t<float> lse = return_lse ? call.new_array<float>(lse_shape) : py::array_t<float>();
  const attn::TensorView<float> l = return_lse ? view_of<float>(lse) : attn::TensorView<float>{};
  py::object result;
  if (call.dtype() == DType::f16) {
    py::array out(py::dtype("float16"), std::vector<py::ssize_t>(out_shape.begin(), out_shape.end()));
    const auto o = view_of<attn::float16>(out);
    const auto qv = cview<attn::float16>(q), kv = cview<attn::float16>(k), vv = cview<attn::float16>(v);
    call.run([&] { attn::sdpa_forward<attn::float16>(o, l, qv, kv, vv, mk, options); });
    result = out;
  } else {
    // bfloat16: NumPy has none, so the rounded copies live in attn tensors.
    auto rounded = [](const py::array& a) {
      const py::array c = py::module_::import("numpy").attr("ascontiguousarray")(a, py::arg("dtype") = "float32");
      attn::Tensor<attn::bfloat16> t(dims(c));
      attn::convert(std::span<const float>(static_cast<const float*>(c.data()), static_cast<std::size_t>(c.size())),
                    std::span<attn::bfloat16>(t.data(), static_cast<std::size_t>(t.numel())));
      return t;
    };
    const attn::Tensor<attn::bfloat16> qb = rounded(q), kb = rounded(k), vb = rounded(v);
    py::array_t<float> out = call.new_array<float>(out_shape);
    const auto o = view_of<float>(out);
    call.run([&] { attn::sdpa_forward<attn::bfloat16>(o, l, qb.view(), kb.view(), vb.view(), mk, options); });
    result = out;
  }
  if (return_lse) return py::make_tuple(result, lse);
  return result;
}

// compute_dtype='int8' (attn::sdpa_forward_int8): float32 arrays, out and lse float32.
py::object sdpa_int8(Call& call, const py::array& q, const py::array& k, const py::array& v, const MaskArgs& m,
                     attn::Mask<float> mk, const attn::SdpaOptions& options, const std::vector<index_t>& out_shape,
                     const std::vector<index_t>& lse_shape, bool return_lse) {
  if (m.additive) mk.additive = cview<float>(m.additive);
  py::array_t<float> out = call.new_array<float>(out_shape);
  py::array_t<float> lse = return_lse ? call.new_array<float>(lse_shape) : py::array_t<float>();
  const auto o = view_of<float>(out);
  const attn::TensorView<float> l = return_lse ? view_of<float>(lse) : attn::TensorView<float>{};
  const auto qv = cview<float>(q), kv = cview<float>(k), vv = cview<float>(v);
  call.run([&] { attn::sdpa_forward_int8(o, l, qv, kv, vv, mk, options); });
  if (return_lse) return py::make_tuple(out, lse);
  return out;
}

py::object scaled_dot_product_attention(py::object q_obj, py::object k_obj, py::object v_obj, py::object valid_lens,
                                        py::object mask, py::object causal, py::object scale,
                                        py::object dropout_p, py::object seed, bool return_weights,
                                        py::object masked_fill, py::object window, py::object alibi_slopes,
                                        py::object softcap, py::object segment_ids, bool return_lse,
                                        py::object compute_dtype, py::object align, py::object sinks) {
  Call call("scaled_dot_product_attention",
            with_masks({{"queries", "q (queries)"}, {"keys", "k (keys)"}, {"values", "v (values)"},
                        {"segment_ids (queries)", "segment_ids (queries)"}, {"alibi_slopes", "alibi_slopes"},
                        {"softcap", "softcap"}, {"sinks", "sinks"}}));
  call.allow_float16();
  const py::array q = call.floating(q_obj, "q");
  const py::array k = call.floating(k_obj, "k");
  const py::array v = call.floating(v_obj, "v");
  const std::string compute = compute_dtype.is_none() ? "" : call.text(compute_dtype, "compute_dtype");
  if (!compute.empty() && compute != "bfloat16" && compute != "int8" && compute != dtype_name(call.dtype()))
    call.value_error("compute_dtype is '" + compute + "'; it must be None (the inputs' dtype), '" +
                     dtype_name(call.dtype()) + "', 'bfloat16' or 'int8'");
  const bool reduced = compute == "bfloat16" || compute == "int8";
  if (reduced && call.dtype() != DType::f32)
    call.type_error("compute_dtype='" + compute + "' takes float32 arrays; q has dtype " + dtype_name(call.dtype()));
  if (reduced && return_weights)
    call.value_error("return_weights=True needs float32 or float64 computation (the " + compute +
                     " kernel is fused and forms no weights)");
  // float16 with return_weights: computed in float32 (the 16-bit kernel is fused and forms no
  // weights), out and weights rounded to float16, lse float32 as the 16-bit path returns it.
  const bool sixteen = (call.dtype() == DType::f16 && !return_weights) || compute == "bfloat16";
  MaskArgs m = mask_args(call, valid_lens, mask, causal, masked_fill);
  align_from(call, causal, align, m);
  const std::optional<attn::Window> win = window_from(call, window);
  const SegmentArgs segments = segments_from(call, segment_ids);
  const py::array slopes = alibi_slopes.is_none() ? no_array() : call.same_dtype(alibi_slopes, "alibi_slopes");
  const py::array sink_logits = sinks.is_none() ? no_array() : call.same_dtype(sinks, "sinks");
  attn::SdpaOptions options;
  if (!scale.is_none()) options.scale = call.number(scale, "scale");
  if (!softcap.is_none()) options.softcap = call.number(softcap, "softcap");
  options.dropout = {call.number(dropout_p, "dropout_p"), call.seed(seed, "seed")};
  std::vector<index_t> out_shape = dims(q, 0, -1), weights_shape = dims(q, 0, -1), lse_shape = dims(q, 0, -1);
  out_shape.push_back(dim(v, -1));
  weights_shape.push_back(dim(k, -2));
  if (sixteen || compute == "int8") {
    attn::Mask<float> mk;
    mk.valid_lens = m.valid_lens ? cview<std::int64_t>(m.valid_lens) : attn::TensorView<const std::int64_t>{};
    if (m.keep) mk.keep = cview<bool>(m.keep);
    mk.causal = m.causal, mk.align = m.align, mk.fill = m.fill, mk.window = win;
    mk.segment_ids_q = segment_view(segments.q);
    mk.segment_ids_k = segment_view(segments.k);
    if (slopes) mk.alibi_slopes = cview<float>(slopes);  // float32 in a 16-bit call (Call::same_dtype)
    if (sink_logits) mk.sinks = cview<float>(sink_logits);
    if (compute == "int8") return sdpa_int8(call, q, k, v, m, mk, options, out_shape, lse_shape, return_lse);
    return sdpa_16bit(call, q, k, v, m, mk, options, out_shape, lse_shape, return_lse);
  }
  return dispatch(computed_in(call), [&](auto tag) -> py::object {
    using T = decltype(tag);
    py::array_t<T> out = call.new_array<T>(out_shape);
    const py::array weights = return_weights ? py::array(call.new_array<T>(weights_shape, "the weights")) : no_array();
    const py::array lse = return_lse ? py::array(call.new_array<T>(lse_shape)) : no_array();
    const auto o = view_of<T>(out);
    const auto w = return_weights ? view_of<T>(weights) : attn::TensorView<T>{};
    const auto l = return_lse ? view_of<T>(lse) : attn::TensorView<T>{};
    const py::array q32 = widened(call, q), k32 = widened(call, k), v32 = widened(call, v);
    const auto qv = cview<T>(q32), kv = cview<T>(k32), vv = cview<T>(v32);
    attn::Mask<T> mk = m.mask<T>();
    mk.window = win;
    mk.segment_ids_q = segment_view(segments.q);
    mk.segment_ids_k = segment_view(segments.k);
    if (slopes) mk.alibi_slopes = cview<T>(slopes);
    if (sink_logits) mk.sinks = cview<T>(sink_logits);
    call.run([&] { attn::sdpa_forward<T>(o, l, w, qv, kv, vv, mk, options); });
    const py::object out_as_given = narrowed(call, out);
    const py::object weights_as_given = return_weights ? narrowed(call, weights) : py::object();
    if (return_weights && return_lse) return py::make_tuple(out_as_given, weights_as_given, lse);
    if (return_weights) return py::make_tuple(out_as_given, weights_as_given);
    if (return_lse) return py::make_tuple(out_as_given, lse);
    return out_as_given;
  });
}

// ---- Nadaraya-Watson ---------------------------------------------------------------------------

// One of x_train, y_train, x_query as the kernels take it: 1-D (len,) is a column (1, len, 1) and
// 2-D (len, c) one batch element (1, len, c); 3-D and 4-D arrays are batches already.
template <class T>
attn::TensorView<const T> as_batch(Call& call, const py::array& a, const char* name) {
  const attn::TensorView<const T> v = cview<T>(a);
  if (a.ndim() == 0)
    call.value_error(std::string(name) + " has shape (); it must have 1 to 4 dimensions: (len,), (len, features), or a batch "
                     "(B, len, features) or (B, H, len, features)");
  if (a.ndim() > 2) return v;
  const index_t rows = v.dim(0), cols = a.ndim() == 2 ? v.dim(1) : 1;
  const index_t row_stride = v.stride(0), col_stride = a.ndim() == 2 ? v.stride(1) : 1;
  const attn::TensorView<const T> batch(v.data(), {1, rows, cols}, {0, row_stride, col_stride});
  call.note(std::string(name) + " " + v.shape_string() + " is passed to attn as " + batch.shape_string());
  return batch;
}

py::object nadaraya_watson(py::object x_train_obj, py::object y_train_obj, py::object x_query_obj,
                           py::object kernel_obj, py::object width_obj, bool return_weights) {
  Call call("nadaraya_watson", {{"keys", "x_train (keys)"},
                                {"values", "y_train (values)"},
                                {"queries", "x_query (queries)"},
                                {"width sigma", "width"},
                                {"unknown kernel", "kernel: unknown kernel"}});
  call.allow_float16();
  const py::array x_train = widened(call, call.floating(x_train_obj, "x_train"));
  const py::array y_train = widened(call, call.floating(y_train_obj, "y_train"));
  const py::array x_query = widened(call, call.floating(x_query_obj, "x_query"));
  const std::string kernel_name = call.text(kernel_obj, "kernel");
  // width='auto': one width per input dimension, chosen by leave-one-out cross-validation.
  const bool auto_width = py::isinstance<py::str>(width_obj) && width_obj.cast<std::string>() == "auto";
  const double width = auto_width ? 0.0 : call.number(width_obj, "width");
  attn::Kernel kernel{};
  call.run([&] { kernel = attn::kernel_from_name(kernel_name); });

  // Unbatched queries give unbatched results: (n, v) or, for a 1-D y_train, (n,); weights (n, m).
  const bool batched = x_query.ndim() > 2;
  const index_t n = dim(x_query, batched ? -2 : 0), m = dim(x_train, x_train.ndim() > 2 ? -2 : 0);
  const index_t v = y_train.ndim() == 1 ? 1 : dim(y_train, -1);
  std::vector<index_t> out_shape = batched ? dims(x_query, 0, -1) : std::vector<index_t>{n};
  std::vector<index_t> weights_shape = out_shape;
  if (batched || y_train.ndim() != 1) out_shape.push_back(v);
  weights_shape.push_back(m);
  return narrowed(call, dispatch(computed_in(call), [&](auto tag) -> py::object {
    using T = decltype(tag);
    py::array_t<T> out = call.new_array<T>(out_shape);
    const py::array weights = return_weights ? py::array(call.new_array<T>(weights_shape, "the weights")) : no_array();
    // The outputs as (1, n, v) and (1, n, m) batches when unbatched: the same C-ordered memory.
    attn::TensorView<T> o = view_of<T>(out), w = return_weights ? view_of<T>(weights) : attn::TensorView<T>{};
    if (!batched) {
      o = attn::TensorView<T>(o.data(), {1, n, v});
      if (return_weights) w = attn::TensorView<T>(w.data(), {1, n, m});
    }
    const auto keys = as_batch<T>(call, x_train, "x_train");
    const auto values = as_batch<T>(call, y_train, "y_train");
    const auto queries = as_batch<T>(call, x_query, "x_query");
    const T sigma = auto_width ? T(0) : call.positive_in<T>(width, "width");
    call.run([&] {
      if (!auto_width) {
        attn::nadaraya_watson_forward<T>(o, w, queries, keys, values, kernel, sigma);
        return;
      }
      const attn::WidthSelection chosen = attn::select_width<T>(keys, values, kernel);
      attn::nadaraya_watson_forward<T>(o, w, queries, keys, values, kernel, std::span<const double>(chosen.widths));
    });
    if (return_weights) return py::make_tuple(out, weights);
    return out;
  }));
}

}  // namespace

void bind_functions(py::module_& m) {
  using py::arg;
  m.def("masked_softmax", &masked_softmax, arg("X"), arg("valid_lens") = py::none(), arg("mask") = py::none(),
        arg("causal") = false, py::kw_only(), arg("masked_fill") = "exclude",
        R"(Softmax over the last axis of X, each row restricted to the keys its masks allow.

X: scores (B, n, m) or (B, H, n, m), float32 or float64 (or float16: computed in float32, the weights
  rounded to float16). Returns the weights, same shape and dtype.
valid_lens: None, (B,) (one length per batch element, as the d2l chapter) or (B, n) (one per query), integers
  in [0, m]; query i of batch b attends to keys [0, valid_lens[b] or valid_lens[b, i]).
mask: None, a bool array (True = attend) or a float array (added to the scores, -inf excludes a key),
  broadcastable to the scores' shape.
causal: False, True or "top_left" (query i sees keys j <= i), "bottom_right" (j <= i + m - n).
masked_fill: "exclude" (default): masked keys take no part and a row left with no key is all 0;
  "d2l_minus_1e6": the d2l chapter's code, masked scores become -1e6 before an ordinary softmax (an
  empty row then weighs every key alike). The two agree whenever every row keeps a key.)");

  m.def("bmm", &bmm, arg("a"), arg("b"), py::kw_only(), arg("transpose_a") = false, arg("transpose_b") = false,
        R"(Batched matrix product, torch.bmm: out[b] = op(a[b]) @ op(b[b]).

a (B, r, k) and b (B, k, c), or 4-D with a heads axis (B, H, ., .); op transposes the last two axes when
transpose_a / transpose_b is set (MXNet's batch_dot). Returns (B, r, c) in the inputs' dtype (float16
computed in float32, then rounded).)");

  m.def("scaled_dot_product_attention", &scaled_dot_product_attention, arg("q"), arg("k"), arg("v"),
        arg("valid_lens") = py::none(), arg("mask") = py::none(), arg("causal") = false, arg("scale") = py::none(),
        arg("dropout_p") = 0.0, arg("seed") = 0, arg("return_weights") = false, py::kw_only(),
        arg("masked_fill") = "exclude", arg("window") = py::none(), arg("alibi_slopes") = py::none(),
        arg("softcap") = py::none(), arg("segment_ids") = py::none(), arg("return_lse") = false,
        arg("compute_dtype") = py::none(), arg("align") = py::none(), arg("sinks") = py::none(),
        R"(dropout(masked_softmax(q k^T * scale)) v: the d2l chapter's DotProductAttention as one function.

q (B, n, d), k (B, m, d), v (B, m, v), or 4-D with a heads axis: q (B, H, n, d), k (B, Hk, m, d),
v (B, Hk, m, v), where H is a multiple of Hk (grouped-query attention: query head h reads key head
h // (H // Hk); Hk = 1 is multi-query attention). All float32 or all float64. Returns out (B, n, v),
or (out, weights) with return_weights=True, (out, lse) with return_lse=True, (out, weights, lse) with
both; weights (B, n, m) are the attention weights before dropout (the d2l chapter's attention_weights), lse
(B, n) or (B, H, n) each row's log-sum-exp (natural log; -inf for a row with no key).
valid_lens, mask, causal, masked_fill: as masked_softmax.
scale: default 1/sqrt(d).
dropout_p, seed: each weight is dropped with probability dropout_p (the others scaled by
  1/(1 - dropout_p)); the mask is a function of the seed and the position only (Philox4x32-10), so one
  seed always drops the same weights.
align: where query i sits among the keys, for the causal mask, the window and ALiBi together:
  "top_left" p(i) = i (the default), or "bottom_right" p(i) = i + m - n (the queries are the last n
  of the m tokens: FlashAttention's convention); causal="bottom_right" implies it. With causal=True,
  align="bottom_right" is the bottom-right causal mask.
window: (left, right): query i attends key j only when p(i) - left <= j <= p(i) + right; None or -1
  leaves a side unbounded.
alibi_slopes: (H,) or (B, H): score += -slope * |p(i) - j| (with align="bottom_right",
  FlashAttention-2's ALiBi for any n and m).
sinks: (H,) ((1,) for 3-D inputs): attention sinks (gpt-oss), one logit per head that joins each
  row's softmax with no value; the weights then sum to less than 1, and lse includes the sink.
softcap: c > 0: score = c * tanh(score * scale / c) (Gemma 2), before ALiBi and masks.
segment_ids: int32 or int64 (B, n) when n == m, or a pair ((B, n), (B, m)): a query attends only
  to the keys of its own segment (packed sequences).
16-bit: float16 arrays compute in float16 storage with float32 accumulation and return float16 (lse
  float32); compute_dtype='bfloat16' rounds float32 arrays to bfloat16 once on entry, computes as
  float16 does, and returns the float32 result (not rounded to bfloat16); it forms no weights
  (return_weights=True is refused). float16 arrays with return_weights=True compute in float32 (the
  16-bit kernel forms no weights) and return out and weights rounded to float16, lse float32.
int8: compute_dtype='int8' computes q k^T in int8 (SageAttention's scheme: attn::sdpa_forward_int8):
  float32 arrays, each query row and each key row less the keys' mean quantized with a scale a row,
  products summed exactly in int32 (vpdpbusd where the CPU has AVX512-VNNI), every mask and option as
  in float32, out and lse float32. An approximation: on keys with outlier channels 10 to 50 times
  the rest, out keeps a cosine similarity above 0.999 with float64 attention. q and k must be
  finite; no weights.)");

  m.def("nadaraya_watson", &nadaraya_watson, arg("x_train"), arg("y_train"), arg("x_query"),
        arg("kernel") = "gaussian", arg("width") = 1.0, arg("return_weights") = false,
        R"(Nadaraya-Watson kernel regression: y_hat(x) = sum_i K(|x - x_i| / width) y_i / sum_j K(|x - x_j| / width).

kernel: "gaussian" exp(-u^2/2), "boxcar" 1 if u <= 1, "epanechnikov" max(0, 1 - u), "constant" 1.
x_train (m,) points, y_train (m,) targets and x_query (n,) queries, as in the d2l chapter's regression; or
vectors: x_train (m, p), y_train (m, v), x_query (n, p); or batches (B, m, p), (B, m, v), (B, n, p) and
4-D with heads. Returns y_hat: (n,) for a 1-D y_train, (n, v) for a 2-D one, (B, n, v) for batches; with
return_weights=True, (y_hat, weights) where weights[i, j] is the weight of x_train[j] for x_query[i]
(n, m): queries along the rows, like attention_weights (d2l's attention_w is its transpose). A query
with no training point inside a compact kernel's support predicts 0 with weights 0.
width='auto' chooses one width per input dimension by leave-one-out cross-validation (statsmodels'
cv_ls; see select_width) and predicts with it. float32 or float64 arrays, or float16 (computed in
float32, the results rounded to float16).)");

  m.def(
      "select_width",
      [](py::object x_train_obj, py::object y_train_obj, py::object kernel_obj) {
        Call call("select_width", {{"keys", "x_train"}, {"values", "y_train"}, {"unknown kernel", "kernel: unknown kernel"}});
        call.allow_float16();  // float16 computed in float32; the widths are float64 whatever the dtype
        const py::array x_train = widened(call, call.floating(x_train_obj, "x_train"));
        const py::array y_train = widened(call, call.floating(y_train_obj, "y_train"));
        attn::Kernel kernel{};
        const std::string kernel_name = call.text(kernel_obj, "kernel");
        call.run([&] { kernel = attn::kernel_from_name(kernel_name); });
        return dispatch(computed_in(call), [&](auto tag) -> py::object {
          using T = decltype(tag);
          attn::WidthSelection chosen;
          const auto keys = as_batch<T>(call, x_train, "x_train");
          const auto values = as_batch<T>(call, y_train, "y_train");
          call.run([&] { chosen = attn::select_width<T>(keys, values, kernel); });
          return py::make_tuple(py::array_t<double>(static_cast<py::ssize_t>(chosen.widths.size()), chosen.widths.data()),
                                chosen.loo_error);
        });
      },
      arg("x_train"), arg("y_train"), arg("kernel") = "gaussian",
      R"(The Nadaraya-Watson width by leave-one-out cross-validation (statsmodels' cv_ls): returns
(widths, loo_error), one width per input dimension of x_train ((m,) or (m, p) points, y_train (m,) or
(m, v) targets), minimising the mean squared error of predicting each training point from the others.)");
}

}  // namespace attn_py
