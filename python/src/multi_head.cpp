// attn.MultiHeadAttention: the layer of the next d2l chapter (d2l's MultiHeadAttention) over
// attn::multi_head_attention_forward and _backward (attn/multi_head.hpp), with grouped key and value
// heads. Its parameters W_q, W_k, W_v, W_o (and b_q, b_k, b_v, b_o) are NumPy arrays in
// nn.Linear's layout, created at the first call from its inputs' sizes (as d2l's nn.LazyLinear) unless
// the sizes are given, readable and assignable. Modes and dropout seeds: layer.hpp. A call keeps
// copies of its inputs, parameters and valid lengths (unlike the other layers, which keep references)
// and the projections it computed, for backward and attention_weights.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <variant>

#include "attn/multi_head.hpp"
#include "bindings.hpp"
#include "call.hpp"
#include "layer.hpp"

namespace attn_py {
namespace {

constexpr std::array<const char*, 8> kParams = {"W_q", "W_k", "W_v", "W_o", "b_q", "b_k", "b_v", "b_o"};

// attn's names of the parameters, and the layer's.
Renames renames() {
  return {{"w_q", "W_q"}, {"w_k", "W_k"}, {"w_v", "W_v"}, {"w_o", "W_o"}, {"dout", "grad_out"}};
}

template <class T>
py::array to_array(const attn::Tensor<T>& t) {
  py::array_t<T> a = new_array<T>(t.shape());
  std::copy(t.data(), t.data() + t.numel(), a.mutable_data());
  return a;
}

// What a call keeps for its backward.
struct Saved {
  DType dtype = DType::f32;  // what attn computes in
  bool half = false;         // float16 inputs: computed in float32, out and gradients float16
  py::array queries = no_array(), keys = no_array(), values = no_array();
  std::array<py::array, 8> params{no_array(), no_array(), no_array(), no_array(),
                                  no_array(), no_array(), no_array(), no_array()};
  MaskArgs mask;
  std::optional<attn::Window> window;
  attn::Dropout dropout;
  std::variant<attn::MultiHeadState<float>, attn::MultiHeadState<double>> state;
  py::object weights = py::none();  // attention_weights, formed when first read
};

class MultiHeadAttention : public LayerMode {
 public:
  MultiHeadAttention(py::object num_hiddens, py::object num_heads, py::object dropout, bool bias,
                     py::object num_kv_heads, py::object seed, py::object query_size, py::object key_size,
                     py::object value_size, py::object dtype)
      : LayerMode("MultiHeadAttention", dropout, seed), bias_(bias) {
    Call call(name_, renames());
    D_ = call.integer(num_hiddens, "num_hiddens");
    config_.num_heads = call.integer(num_heads, "num_heads");
    config_.num_kv_heads = num_kv_heads.is_none() ? config_.num_heads : call.integer(num_kv_heads, "num_kv_heads");
    if (D_ < 1) call.value_error("num_hiddens is " + std::to_string(D_) + "; it must be at least 1");
    if (config_.num_heads < 1 || D_ % config_.num_heads != 0)
      call.value_error("num_heads is " + std::to_string(config_.num_heads) + "; it must divide num_hiddens = " +
                       std::to_string(D_));
    if (config_.num_kv_heads < 1 || config_.num_heads % config_.num_kv_heads != 0)
      call.value_error("num_kv_heads is " + std::to_string(config_.num_kv_heads) + "; it must divide num_heads = " +
                       std::to_string(config_.num_heads));
    const py::dtype dt = py::dtype::from_args(dtype);
    if (dt.kind() != 'f' || (dt.itemsize() != 4 && dt.itemsize() != 8))
      call.type_error("dtype is " + str_of(dt) + "; the parameters are float32 or float64");
    dtype_ = dt.itemsize() == 4 ? DType::f32 : DType::f64;
    const bool any = !query_size.is_none() || !key_size.is_none() || !value_size.is_none();
    if (any) {
      if (query_size.is_none() || key_size.is_none() || value_size.is_none())
        call.type_error("query_size, key_size and value_size are given together, or none (then the first call sizes "
                        "the layer)");
      init(call, call.integer(query_size, "query_size"), call.integer(key_size, "key_size"),
           call.integer(value_size, "value_size"));
    }
  }

  py::object forward(py::object queries, py::object keys, py::object values, py::object valid_lens, py::object causal,
                     py::object window) {
    Call call(name_, renames());
    call.allow_float16();  // computed in float32, the parameters' copies too; out float16
    Saved s;
    s.queries = widened(call, call.floating(queries, "queries"));
    s.keys = widened(call, call.floating(keys, "keys"));
    s.values = widened(call, call.floating(values, "values"));
    s.half = call.dtype() == DType::f16;
    s.dtype = computed_in(call);
    s.mask = mask_args(call, valid_lens, py::none(), causal, py::str("exclude"));
    s.window = window_from(call, window);
    if (s.queries.ndim() != 3 || s.keys.ndim() != 3 || s.values.ndim() != 3)
      call.value_error("queries, keys and values must be 3-D, (B, n, query_size), (B, m, key_size) and (B, m, "
                       "value_size); they have " + std::to_string(s.queries.ndim()) + ", " +
                       std::to_string(s.keys.ndim()) + " and " + std::to_string(s.values.ndim()) + " dimensions");
    if (!initialized()) init(call, dim(s.queries, -1), dim(s.keys, -1), dim(s.values, -1));  // nn.LazyLinear
    // The layer's sizes, fixed by its first call: an argument of other features is named as such (its
    // weight matrix had been named instead, "W_v has shape (8,12) but must be (8,13)").
    for (const auto& [a, name, param] : {std::tuple{&s.queries, "queries", 0}, std::tuple{&s.keys, "keys", 1},
                                         std::tuple{&s.values, "values", 2}})
      if (const index_t size = dim(params_[static_cast<std::size_t>(param)], 1); dim(*a, -1) != size)
        call.value_error(std::string(name) + " has shape " + attn::shape_string(dims(*a)) + ", " +
                         std::to_string(dim(*a, -1)) + " features, but the layer was sized for " + std::to_string(size) +
                         " (by its first call, or its query_size, key_size and value_size)");
    const char* dt = dtype_name(s.dtype);
    for (std::size_t i = 0; i < kParams.size(); ++i)
      if (params_[i]) s.params[i] = params_[i].attr("astype")(dt, py::arg("copy") = false);
    // Copies, not references (unlike the other layers): the backward also reads the projections this
    // call saves, so it differentiates the values the call saw; an array changed in place before it
    // would otherwise mix old and new values in the gradients.
    for (py::array* a : {&s.queries, &s.keys, &s.values}) *a = a->attr("copy")();
    if (s.mask.valid_lens) s.mask.valid_lens = s.mask.valid_lens.attr("copy")();  // read again by backward and the weights
    for (py::array& a : s.params)
      if (a) a = a.attr("copy")();
    s.dropout = call_dropout();
    return dispatch(s.dtype, [&](auto tag) -> py::object {
      using T = decltype(tag);
      py::array_t<T> out = call.new_array<T>({dim(s.queries, 0), dim(s.queries, 1), D_});
      const auto o = view_of<T>(out);
      const auto q = cview<T>(s.queries), k = cview<T>(s.keys), v = cview<T>(s.values);
      const attn::MultiHeadParams<T> p = params<T>(s);
      attn::Mask<T> mask = s.mask.mask<T>();
      mask.window = s.window;
      const attn::SdpaOptions options{std::nullopt, s.dropout, std::nullopt};
      attn::MultiHeadState<T> state;
      call.run([&] { attn::multi_head_attention_forward<T>(o, &state, q, k, v, p, config_, mask, options); });
      s.state = std::move(state);
      saved_ = std::move(s);
      advance();
      return narrowed(call, out);
    });
  }

  py::object backward(py::object grad_out) const {
    const std::string function = name_ + ".backward";
    if (!saved_)
      throw std::runtime_error(function + ": the layer has not been called yet; backward differentiates the output "
                                          "of the last call mha(queries, keys, values, valid_lens)");
    const Saved& s = *saved_;
    Call call(function, renames());
    const py::array g = grad_of_last_call(call, grad_out, s.half, s.dtype);
    return narrowed(call, dispatch(s.dtype, [&](auto tag) -> py::dict {
      using T = decltype(tag);
      py::array_t<T> dq = call.new_array<T>(dims(s.queries)), dk = call.new_array<T>(dims(s.keys)),
                     dv = call.new_array<T>(dims(s.values));
      std::array<py::array, 8> dp{no_array(), no_array(), no_array(), no_array(),
                                  no_array(), no_array(), no_array(), no_array()};
      for (std::size_t i = 0; i < kParams.size(); ++i)
        if (s.params[i]) dp[i] = call.new_array<T>(dims(s.params[i]));
      auto grad = [&](std::size_t i) { return dp[i] ? view_of<T>(dp[i]) : attn::TensorView<T>{}; };
      const attn::MultiHeadGrads<T> grads{grad(0), grad(1), grad(2), grad(3), grad(4), grad(5), grad(6), grad(7)};
      const auto dqv = view_of<T>(dq), dkv = view_of<T>(dk), dvv = view_of<T>(dv);
      const auto gv = cview<T>(g), q = cview<T>(s.queries), k = cview<T>(s.keys), v = cview<T>(s.values);
      const attn::MultiHeadParams<T> p = params<T>(s);
      attn::Mask<T> mask = s.mask.mask<T>();
      mask.window = s.window;
      const attn::SdpaOptions options{std::nullopt, s.dropout, std::nullopt};
      const auto& state = std::get<attn::MultiHeadState<T>>(s.state);
      call.run([&] {
        attn::multi_head_attention_backward<T>(dqv, dkv, dvv, grads, gv, q, k, v, p, config_, state, mask, options);
      });
      py::dict result(py::arg("queries") = dq, py::arg("keys") = dk, py::arg("values") = dv);
      for (std::size_t i = 0; i < kParams.size(); ++i)
        if (dp[i]) result[kParams[i]] = dp[i];
      return result;
    }));
  }

  // The last call's heads' weights before dropout, (B, num_heads, n, m) (the d2l chapter's
  // attention_weights per head; .reshape(-1, n, m) is d2l's (B num_heads, n, m)), formed from the saved
  // projections when first read (the forward forms none). None before the first call.
  py::object attention_weights() {
    if (!saved_) return py::none();
    Saved& s = *saved_;
    if (!s.weights.is_none()) return s.weights;
    Call call(name_ + ".attention_weights", {});
    s.weights = dispatch(s.dtype, [&](auto tag) -> py::object {
      using T = decltype(tag);
      const auto& state = std::get<attn::MultiHeadState<T>>(s.state);
      py::array_t<T> weights =
          call.new_array<T>({state.q.dim(0), config_.num_heads, state.q.dim(1), state.k.dim(1)}, "the weights");
      const auto w = view_of<T>(weights);
      attn::Mask<T> mask = s.mask.mask<T>();
      mask.window = s.window;
      call.run([&] { attn::multi_head_attention_weights<T>(w, state, config_, mask); });
      return weights;
    });
    if (s.half) s.weights = s.weights.attr("astype")("float16");
    return s.weights;
  }

  // A parameter: the array itself (in-place updates reach the layer), None before the layer is sized.
  py::object param(const std::string& name) const {
    const py::array& a = params_[index(name)];
    return a ? py::object(a) : py::object(py::none());
  }
  // A setter keeps the array it is given (a C-ordered copy when attn cannot read its layout), of the
  // layer's sizes, float32 or float64.
  void set_param(const std::string& name, py::object value) {
    Call call(name_, {});
    const std::size_t i = index(name);
    if (!initialized()) call.value_error(name + " cannot be set before the layer is sized (by its first call, or by "
                                                "query_size, key_size and value_size)");
    if (!params_[i]) call.value_error(name + " does not exist: the layer was built with bias=False");
    py::array a = call.floating(value, name.c_str());
    if (dims(a) != dims(params_[i]))
      call.value_error(name + " has shape " + attn::shape_string(dims(a)) + " but must be " +
                       attn::shape_string(dims(params_[i])) + ", the sizes of the layer");
    params_[i] = a;
  }

  std::string repr() const {
    return name_ + "(num_hiddens=" + std::to_string(D_) + ", num_heads=" + std::to_string(config_.num_heads) +
           ", num_kv_heads=" + std::to_string(config_.num_kv_heads) + ", dropout=" +
           py::repr(py::float_(dropout_)).cast<std::string>() + ", bias=" + (bias_ ? "True" : "False") + ")";
  }
  index_t num_hiddens() const { return D_; }
  index_t num_heads() const { return config_.num_heads; }
  index_t num_kv_heads() const { return config_.num_kv_heads; }

 private:
  bool initialized() const { return static_cast<bool>(params_[0]); }
  static std::size_t index(const std::string& name) {
    return static_cast<std::size_t>(std::find(kParams.begin(), kParams.end(), name) - kParams.begin());
  }
  void init(Call& call, index_t query_size, index_t key_size, index_t value_size) {
    dispatch(dtype_, [&](auto tag) {
      using T = decltype(tag);
      attn::MultiHeadWeights<T> w;
      call.run([&] { w = attn::MultiHeadWeights<T>::init(query_size, key_size, value_size, D_, config_, bias_, seed_); });
      const attn::Tensor<T>* t[] = {&w.w_q, &w.w_k, &w.w_v, &w.w_o, &w.b_q, &w.b_k, &w.b_v, &w.b_o};
      for (std::size_t i = 0; i < kParams.size(); ++i) params_[i] = i < 4 || bias_ ? to_array(*t[i]) : no_array();
    });
  }
  template <class T>
  static attn::MultiHeadParams<T> params(const Saved& s) {
    auto view = [&](std::size_t i) { return s.params[i] ? cview<T>(s.params[i]) : attn::TensorView<const T>{}; };
    return {view(0), view(1), view(2), view(3), view(4), view(5), view(6), view(7)};
  }

  index_t D_ = 0;
  attn::MultiHeadConfig config_;
  bool bias_ = false;
  DType dtype_ = DType::f32;
  std::array<py::array, 8> params_{no_array(), no_array(), no_array(), no_array(),
                                   no_array(), no_array(), no_array(), no_array()};
  std::optional<Saved> saved_;
};

}  // namespace

void bind_multi_head(py::module_& m) {
  using py::arg;
  py::class_<MultiHeadAttention> c(m, "MultiHeadAttention", R"(Multi-head attention, d2l's layer, with grouped key heads.

MultiHeadAttention(num_hiddens, num_heads, dropout, bias=False, *, num_kv_heads=None, seed=0,
                   query_size=None, key_size=None, value_size=None, dtype="float32")
mha(queries (B, n, query_size), keys (B, m, key_size), values (B, m, value_size), valid_lens=None, *,
    causal=False, window=None) -> (B, n, num_hiddens)
Each of num_heads heads attends (scaled dot product) with its num_hiddens / num_heads columns of
W_q queries over those of W_k keys and W_v values of key head h // (num_heads // num_kv_heads); the
heads' outputs, concatenated, go through W_o. Parameters W_q (num_hiddens, query_size), W_k and W_v
(num_kv_heads * num_hiddens / num_heads, key_size and value_size), W_o (num_hiddens, num_hiddens),
and with bias=True b_q, b_k, b_v, b_o: nn.Linear's layout, initialised as it does (uniform in
+-1/sqrt(fan_in)) from `seed`; sized by the first call (nn.LazyLinear) unless the three sizes are
given. valid_lens (B,) or (B, n) apply to every head (d2l repeats them per head); causal and window
as scaled_dot_product_attention. backward(grad_out) -> {"queries", "keys", "values", "W_q", "W_k",
"W_v", "W_o"[, "b_q", "b_k", "b_v", "b_o"]}. attention_weights: the last call's heads' weights before
dropout, (B, num_heads, n, m), formed when first read. A call computes in the dtype of its inputs (the
parameters are converted when theirs differs); float16 inputs compute in float32 (widened copies) and
out and every gradient are rounded to float16.)");
  c.def(py::init<py::object, py::object, py::object, bool, py::object, py::object, py::object, py::object,
                 py::object, py::object>(),
        arg("num_hiddens"), arg("num_heads"), arg("dropout"), arg("bias") = false, py::kw_only(),
        arg("num_kv_heads") = py::none(), arg("seed") = 0, arg("query_size") = py::none(), arg("key_size") = py::none(),
        arg("value_size") = py::none(), arg("dtype") = "float32",
        "A layer of num_heads heads over num_hiddens columns (see the class).");
  const auto call_doc = "mha(queries, keys, values, valid_lens=None, *, causal=False, window=None): (B, n, num_hiddens)";
  for (const char* name : {"__call__", "forward"})
    c.def(name, &MultiHeadAttention::forward, arg("queries"), arg("keys"), arg("values"), arg("valid_lens") = py::none(),
          py::kw_only(), arg("causal") = false, arg("window") = py::none(), call_doc);
  c.def("backward", &MultiHeadAttention::backward, arg("grad_out"),
        "The gradients, as a dict of arrays, of sum(output * grad_out) for the output of the last call")
      .def("__repr__", &MultiHeadAttention::repr)
      .def_property_readonly("attention_weights", &MultiHeadAttention::attention_weights,
                             "The last call's weights before dropout, (B, num_heads, n, m); None before a call.")
      .def_property_readonly("num_hiddens", &MultiHeadAttention::num_hiddens, "Width of the output and of W_q's rows.")
      .def_property_readonly("num_heads", &MultiHeadAttention::num_heads, "Query heads.")
      .def_property_readonly("num_kv_heads", &MultiHeadAttention::num_kv_heads,
                             "Key and value heads (num_heads unless grouped).");
  def_mode(c);
  for (const char* name : kParams) {
    const std::string n = name;
    c.def_property(
        name, [n](const MultiHeadAttention& a) { return a.param(n); },
        [n](MultiHeadAttention& a, py::object value) { a.set_param(n, value); },
        ("Parameter " + n + " (see the class): a NumPy array, assignable with one of its shape.").c_str());
  }
}

}  // namespace attn_py
