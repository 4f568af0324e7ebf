// The d2l chapter's layers, DotProductAttention and AdditiveAttention, as Python classes over attn.
//
// Called as attention(queries, keys, values, valid_lens=None) they return the output and keep the
// weights before dropout in .attention_weights, as the d2l chapter's nn.Modules. backward(grad_out), the
// gradient of a loss with respect to the output of the last call, returns a dict of the gradients
// of every input and parameter: "queries", "keys", "values" (and "W_q", "W_k", "w_v").
//
// Modes and dropout seeds: layer.hpp.
//
// What backward reads: a call keeps references (not copies) to its input arrays as attn read them
// (the caller's own arrays when they were used without a copy) and to the parameter arrays, with its
// valid_lens, masked_fill and dropout seed, like PyTorch's saved tensors. Changing those arrays in
// place between a call and its backward changes what backward differentiates; assigning a new array
// to a parameter (attention.W_q = ...) does not.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <optional>
#include <string>
#include <type_traits>

#include "attn/additive.hpp"
#include "attn/dropout.hpp"
#include "attn/sdpa.hpp"
#include "bindings.hpp"
#include "call.hpp"
#include "layer.hpp"

namespace attn_py {
namespace {

// What a call keeps for its backward.
struct Saved {
  DType dtype = DType::f32;  // what attn computes in
  bool half = false;         // float16 inputs (DotProductAttention): out, weights and gradients float16
  py::array queries = no_array(), keys = no_array(), values = no_array();
  py::array w_q = no_array(), w_k = no_array(), w_v = no_array();  // AdditiveAttention's, as the call used them
  MaskArgs mask;            // valid_lens and masked_fill
  attn::Dropout dropout;
};

// What a layer's forward computes from and into, as attn's views.
template <class T>
struct ForwardViews {
  attn::TensorView<T> out, weights;
  attn::TensorView<const T> queries, keys, values;
  attn::Mask<T> mask;
};

// A new array shaped like `a`, in precision T (a MemoryError names the call).
template <class T>
py::array_t<T> like(const Call& call, const py::array& a) {
  return call.new_array<T>(dims(a));
}

// What the two layers share besides the mode (LayerMode): the last call's weights and saved inputs.
class Layer : public LayerMode {
 public:
  Layer(std::string name, py::object dropout, py::object seed, py::object masked_fill)
      : LayerMode(std::move(name), dropout, seed) {
    Call call(name_, {});
    fill_ = masked_fill_from(call, masked_fill);
  }

  py::object attention_weights = py::none();

 protected:
  // The inputs of a call: queries, keys, values and valid_lens converted, the dropout of the mode.
  // float16 (where the call allows it) is computed in float32: the saved inputs are widened copies.
  Saved inputs(Call& call, py::object queries, py::object keys, py::object values, py::object valid_lens) const {
    Saved s;
    s.queries = widened(call, call.floating(queries, "queries"));
    s.keys = widened(call, call.floating(keys, "keys"));
    s.values = widened(call, call.floating(values, "values"));
    s.half = call.dtype() == DType::f16;
    s.dtype = computed_in(call);
    if (!valid_lens.is_none()) s.mask.valid_lens = call.lengths(valid_lens, "valid_lens");
    s.mask.fill = fill_;
    s.dropout = call_dropout();
    return s;
  }

  // A call: new arrays out (.., n, v) and weights (.., n, m) in the call's precision T; then
  // forward(views, s), given ForwardViews<T> and the inputs, returns the function that runs attn (its
  // views made with the GIL held). After it succeeds: the weights, what backward needs, the next seed.
  template <class Forward>
  py::object run_forward(Call& call, Saved s, const Forward& forward) {
    std::vector<index_t> out_shape = dims(s.queries, 0, -1), weights_shape = out_shape;
    out_shape.push_back(dim(s.values, -1));
    weights_shape.push_back(dim(s.keys, -2));
    return dispatch(s.dtype, [&](auto tag) -> py::object {
      using T = decltype(tag);
      py::array_t<T> out = call.new_array<T>(out_shape), weights = call.new_array<T>(weights_shape, "the weights");
      const ForwardViews<T> views{view_of<T>(out),  view_of<T>(weights), cview<T>(s.queries),
                                  cview<T>(s.keys), cview<T>(s.values),  s.mask.mask<T>()};
      call.run(forward(views, s));
      attention_weights = narrowed(call, weights);  // float16 calls: rounded (call.hpp)
      saved_ = std::move(s);
      advance();
      return narrowed(call, out);
    });
  }

  // The last call's inputs, for `function` (a backward); RuntimeError before the first call.
  const Saved& last_call(const std::string& function) const {
    if (!saved_)
      throw std::runtime_error(function + ": the layer has not been called yet; backward differentiates the output "
                                          "of the last call attention(queries, keys, values, valid_lens)");
    return *saved_;
  }

  attn::MaskedFill fill_ = attn::MaskedFill::exclude;
  std::optional<Saved> saved_;
};

// ---- DotProductAttention -----------------------------------------------------------------------

class DotProductAttention : public Layer {
 public:
  DotProductAttention(py::object dropout, py::object seed, py::object masked_fill)
      : Layer("DotProductAttention", dropout, seed, masked_fill) {}

  py::object forward(py::object queries, py::object keys, py::object values, py::object valid_lens) {
    Call call(name_, {});
    call.allow_float16();  // no parameters: float16 in, float16 out (computed in float32)
    return run_forward(call, inputs(call, queries, keys, values, valid_lens), [](const auto& v, const Saved& s) {
      const attn::SdpaOptions options{std::nullopt, s.dropout, std::nullopt};
      return [v, options] { attn::sdpa_forward(v.out, {}, v.weights, v.queries, v.keys, v.values, v.mask, options); };
    });
  }

  py::object backward(py::object grad_out) const {
    const std::string function = name_ + ".backward";
    const Saved& s = last_call(function);
    Call call(function, {{"dout", "grad_out"}});
    const py::array g = grad_of_last_call(call, grad_out, s.half, s.dtype);
    return narrowed(call, dispatch(s.dtype, [&](auto tag) -> py::dict {
      using T = decltype(tag);
      py::array_t<T> dq = like<T>(call, s.queries), dk = like<T>(call, s.keys), dv = like<T>(call, s.values);
      const auto dqv = view_of<T>(dq), dkv = view_of<T>(dk), dvv = view_of<T>(dv);
      const auto gv = cview<T>(g), q = cview<T>(s.queries), k = cview<T>(s.keys), v = cview<T>(s.values);
      const attn::Mask<T> mask = s.mask.mask<T>();
      const attn::SdpaOptions options{std::nullopt, s.dropout, std::nullopt};
      call.run([&] { attn::sdpa_backward<T>(dqv, dkv, dvv, gv, q, k, v, {}, {}, mask, options); });
      return py::dict(py::arg("queries") = dq, py::arg("keys") = dk, py::arg("values") = dv);
    }));
  }

  std::string repr() const { return name_ + "(dropout=" + py::repr(py::float_(dropout_)).cast<std::string>() + ")"; }
};

// ---- AdditiveAttention -------------------------------------------------------------------------

// attn's names of the parameters and sizes, and the layer's.
Renames additive_renames() {
  return {{"w_q", "W_q"}, {"w_k", "W_k"}, {"w_v", "w_v"}, {"dout", "grad_out"}, {"hidden_size", "num_hiddens"}};
}

class AdditiveAttention : public Layer {
 public:
  AdditiveAttention(py::object key_size, py::object query_size, py::object num_hiddens, py::object dropout,
                    py::object seed, py::object masked_fill, py::object dtype)
      : Layer("AdditiveAttention", dropout, seed, masked_fill) {
    Call call(name_, additive_renames());
    k_ = call.integer(key_size, "key_size");
    q_ = call.integer(query_size, "query_size");
    h_ = call.integer(num_hiddens, "num_hiddens");
    const py::dtype dt = py::dtype::from_args(dtype);
    if (dt.kind() != 'f' || (dt.itemsize() != 4 && dt.itemsize() != 8))
      call.type_error("dtype is " + str_of(dt) + "; the parameters are float32 or float64");
    dispatch(dt.itemsize() == 4 ? DType::f32 : DType::f64, [&](auto tag) {
      using T = decltype(tag);
      attn::AdditiveWeights<T> init;
      call.run([&] { init = attn::AdditiveWeights<T>::init(q_, k_, h_, seed_); });
      w_q_ = to_array(init.w_q), w_k_ = to_array(init.w_k), w_v_ = to_array(init.w_v);
    });
  }

  py::object forward(py::object queries, py::object keys, py::object values, py::object valid_lens) {
    Call call(name_, additive_renames());
    call.allow_float16();  // computed in float32, the parameters' copies too; out and weights float16
    Saved s = inputs(call, queries, keys, values, valid_lens);
    // The parameters in the call's dtype: themselves, or a converted copy.
    const char* dt = dtype_name(s.dtype);
    s.w_q = w_q_.attr("astype")(dt, py::arg("copy") = false);
    s.w_k = w_k_.attr("astype")(dt, py::arg("copy") = false);
    s.w_v = w_v_.attr("astype")(dt, py::arg("copy") = false);
    return run_forward(call, std::move(s), [](const auto& v, const Saved& saved) {
      using T = typename std::decay_t<decltype(v.out)>::value_type;
      const attn::AdditiveParams<T> params{cview<T>(saved.w_q), cview<T>(saved.w_k), cview<T>(saved.w_v)};
      return [v, params, dropout = saved.dropout] {
        attn::additive_attention_forward<T>(v.out, v.weights, v.queries, v.keys, v.values, params, v.mask, dropout);
      };
    });
  }

  py::object backward(py::object grad_out) const {
    const std::string function = name_ + ".backward";
    const Saved& s = last_call(function);
    Call call(function, additive_renames());
    const py::array g = grad_of_last_call(call, grad_out, s.half, s.dtype);
    return narrowed(call, dispatch(s.dtype, [&](auto tag) -> py::dict {
      using T = decltype(tag);
      py::array_t<T> dq = like<T>(call, s.queries), dk = like<T>(call, s.keys), dv = like<T>(call, s.values);
      py::array_t<T> dw_q = like<T>(call, s.w_q), dw_k = like<T>(call, s.w_k), dw_v = like<T>(call, s.w_v);
      const auto dqv = view_of<T>(dq), dkv = view_of<T>(dk), dvv = view_of<T>(dv);
      const attn::AdditiveGrads<T> grads{view_of<T>(dw_q), view_of<T>(dw_k), view_of<T>(dw_v)};
      const auto gv = cview<T>(g), q = cview<T>(s.queries), k = cview<T>(s.keys), v = cview<T>(s.values);
      const attn::AdditiveParams<T> params{cview<T>(s.w_q), cview<T>(s.w_k), cview<T>(s.w_v)};
      const attn::Mask<T> mask = s.mask.mask<T>();
      call.run([&] {
        attn::additive_attention_backward<T>(dqv, dkv, dvv, grads, gv, q, k, v, params, mask, s.dropout);
      });
      return py::dict(py::arg("queries") = dq, py::arg("keys") = dk, py::arg("values") = dv,
                      py::arg("W_q") = dw_q, py::arg("W_k") = dw_k, py::arg("w_v") = dw_v);
    }));
  }

  // The parameters, nn.Linear's weight layout: W_q (num_hiddens, query_size), W_k (num_hiddens,
  // key_size), w_v (num_hiddens,). The getters return the arrays themselves (in-place updates
  // reach the layer); a setter keeps the array it is given (a C-ordered copy when attn cannot read
  // its layout), of the layer's sizes, float32 or float64.
  py::array& param(const std::string& name) { return name == "W_q" ? w_q_ : name == "W_k" ? w_k_ : w_v_; }
  void set_param(const std::string& name, py::object value) {
    Call call(name_, {});
    py::array a = call.floating(value, name.c_str());
    const std::vector<index_t> expected =
        name == "w_v" ? std::vector<index_t>{h_} : std::vector<index_t>{h_, name == "W_q" ? q_ : k_};
    if (dims(a) != expected) {
      const char* layout = name == "W_q" ? "(num_hiddens, query_size)" : name == "W_k" ? "(num_hiddens, key_size)"
                                                                                        : "(num_hiddens,)";
      call.value_error(name + " has shape " + attn::shape_string(dims(a)) + " but must be " + layout + " = " +
                       attn::shape_string(expected) + ", the sizes the layer was built with");
    }
    param(name) = a;
  }

  std::string repr() const {
    return name_ + "(key_size=" + std::to_string(k_) + ", query_size=" + std::to_string(q_) +
           ", num_hiddens=" + std::to_string(h_) + ", dropout=" + py::repr(py::float_(dropout_)).cast<std::string>() + ")";
  }

  index_t key_size() const { return k_; }
  index_t query_size() const { return q_; }
  index_t num_hiddens() const { return h_; }

 private:
  template <class T>
  static py::array to_array(const attn::Tensor<T>& t) {
    py::array_t<T> a = new_array<T>(t.shape());
    std::copy(t.data(), t.data() + t.numel(), a.mutable_data());
    return a;
  }

  index_t k_ = 0, q_ = 0, h_ = 0;
  py::array w_q_ = no_array(), w_k_ = no_array(), w_v_ = no_array();
};

// The members both layers have, with the same Python names and docstrings.
template <class L>
void def_layer(py::class_<L>& c) {
  using py::arg;
  const auto call_args = std::make_tuple(arg("queries"), arg("keys"), arg("values"), arg("valid_lens") = py::none());
  c.def("__call__", &L::forward, std::get<0>(call_args), std::get<1>(call_args), std::get<2>(call_args),
        std::get<3>(call_args),
        "attention(queries, keys, values, valid_lens=None): the output (B, n, v); sets .attention_weights")
      .def("forward", &L::forward, std::get<0>(call_args), std::get<1>(call_args), std::get<2>(call_args),
           std::get<3>(call_args), "The same as calling the layer (nn.Module's name for it)")
      .def("backward", &L::backward, arg("grad_out"),
           "The gradients, as a dict of arrays, of sum(output * grad_out) for the output of the last call")
      .def_readonly("attention_weights", &L::attention_weights,
                    "The weights (B, n, m) of the last call, before dropout; None before the first call")
      .def("__repr__", &L::repr);
  def_mode(c);
}

}  // namespace

void bind_layers(py::module_& m) {
  using py::arg;
  py::class_<DotProductAttention> dot(m, "DotProductAttention", R"(Scaled dot-product attention, the d2l chapter's layer.

DotProductAttention(dropout, *, seed=0, masked_fill="exclude")
attention(queries (B, n, d), keys (B, m, d), values (B, m, v), valid_lens=None) -> (B, n, v);
softmax(queries keys^T / sqrt(d)) values with the weights of masked keys 0 and dropout in training
mode. 4-D inputs (B, H, ., .) have heads. backward(grad_out) -> {"queries", "keys", "values"}.
float32, float64 or float16 arrays (float16 computed in float32 on widened copies, out, weights and
gradients rounded to float16). Modes, seeds and what backward reads: the "Layers" notes of
docs/python.md.)");
  dot.def(py::init<py::object, py::object, py::object>(), arg("dropout"), py::kw_only(), arg("seed") = 0,
          arg("masked_fill") = "exclude", "A layer with dropout probability `dropout` (see the class).");
  def_layer(dot);

  py::class_<AdditiveAttention> add(m, "AdditiveAttention", R"(Additive attention, the d2l chapter's layer.

AdditiveAttention(key_size, query_size, num_hiddens, dropout, *, seed=0, masked_fill="exclude", dtype="float32")
attention(queries (B, n, query_size), keys (B, m, key_size), values (B, m, v), valid_lens=None) -> (B, n, v);
scores w_v^T tanh(W_q q + W_k k). Parameters W_q (num_hiddens, query_size), W_k (num_hiddens, key_size),
w_v (num_hiddens,), nn.Linear's layout and initialisation (uniform in +-1/sqrt(fan_in), drawn from
`seed`, not from PyTorch's generator); readable and assignable NumPy arrays. A call computes in the
dtype of its inputs (the parameters are converted when theirs differs); float16 inputs compute in
float32 (widened copies) and out, weights and every gradient are rounded to float16.
backward(grad_out) -> {"queries", "keys", "values", "W_q", "W_k", "w_v"}.)");
  add.def(py::init<py::object, py::object, py::object, py::object, py::object, py::object, py::object>(),
          arg("key_size"), arg("query_size"), arg("num_hiddens"), arg("dropout"), py::kw_only(), arg("seed") = 0,
          arg("masked_fill") = "exclude", arg("dtype") = "float32",
          "A layer with parameters of the given sizes, drawn from `seed` (see the class).");
  def_layer(add);
  for (const char* name : {"W_q", "W_k", "w_v"}) {
    const std::string n = name;
    add.def_property(
        name, [n](AdditiveAttention& a) { return a.param(n); },
        [n](AdditiveAttention& a, py::object value) { a.set_param(n, value); },
        ("Parameter " + n + " (see the class): a NumPy array, assignable with one of its shape.").c_str());
  }
  add.def_property_readonly("key_size", &AdditiveAttention::key_size, "Width of a key row.")
      .def_property_readonly("query_size", &AdditiveAttention::query_size, "Width of a query row.")
      .def_property_readonly("num_hiddens", &AdditiveAttention::num_hiddens, "Width of the hidden layer (rows of W_q and W_k).");
}

}  // namespace attn_py
