// What every layer of the module shares (layers.cpp, multi_head.cpp): its name for messages, the
// dropout probability and seed, and the mode, as nn.Module has them. A new layer is in training
// mode; eval() and train() switch and return the layer. In training mode a call drops weights with
// probability `dropout`, by a mask that is a function of `seed` and the position only; every
// training-mode call then advances `seed` by one, so successive calls draw new masks and two layers
// built with one seed draw the same ones. In eval mode nothing is dropped and `seed` stays.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "attn/dropout.hpp"
#include "attn/tensor.hpp"
#include "call.hpp"

namespace attn_py {

class LayerMode {
 public:
  LayerMode(std::string name, py::object dropout, py::object seed) : name_(std::move(name)) {
    Call call(name_, {});
    set_dropout(call.number(dropout, "dropout"));
    seed_ = call.seed(seed, "seed");
  }

  double dropout() const { return dropout_; }
  // p is checked by attn's own dropout check (the one every kernel call runs), here at once.
  void set_dropout(double p) {
    Call call(name_, {{"dropout p", "dropout"}});
    attn::Tensor<bool> probe({1, 1, 1});
    const attn::TensorView<bool> view = probe.view();
    call.run([&] { attn::dropout_keep_mask(view, attn::Dropout{p, 0}); });
    dropout_ = p;
  }
  std::uint64_t seed() const { return seed_; }
  void set_seed(py::object seed) { seed_ = Call(name_, {}).seed(seed, "seed"); }

  bool training = true;

 protected:
  // The dropout of a call in the current mode; after the call succeeds, advance() moves the seed on.
  attn::Dropout call_dropout() const { return training ? attn::Dropout{dropout_, seed_} : attn::Dropout{}; }
  void advance() {
    if (training) ++seed_;
  }

  std::string name_;
  double dropout_ = 0.0;
  std::uint64_t seed_ = 0;
};

// The members of LayerMode, with the same Python names and docstrings on every layer.
template <class L>
void def_mode(py::class_<L>& c) {
  using py::arg;
  c.def("train", [](py::object self, bool mode) { py::cast<L&>(self).training = mode; return self; },
        arg("mode") = true, "Training mode (dropout on) or, with mode=False, eval mode; returns the layer")
      .def("eval", [](py::object self) { py::cast<L&>(self).training = false; return self; },
           "Eval mode: no dropout; returns the layer")
      .def_readonly("training", &L::training, "True in training mode")
      .def_property("dropout", &L::dropout, &L::set_dropout, "The probability of dropping a weight in training mode")
      .def_property("seed", &L::seed, &L::set_seed,
                    "The dropout seed of the next training-mode call (each such call advances it by one)");
}

// A layer's backward reads grad_out as its last call read the inputs: float16 when they were
// float16 (widened here; the gradients are rounded back by narrowed), else of their dtype.
inline py::array grad_of_last_call(Call& call, const py::object& grad_out, bool half, DType dtype) {
  if (half) call.allow_float16();
  call.expect_dtype(half ? DType::f16 : dtype, "the inputs of the last call have");
  return widened(call, call.floating(grad_out, "grad_out"));
}

}  // namespace attn_py
