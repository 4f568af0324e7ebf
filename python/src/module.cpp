// attn._attn: the compiled part of the Python package `attn` (python/attn/__init__.py re-exports it).
#include <pybind11/pybind11.h>

#include "attn/error.hpp"
#include "bindings.hpp"

namespace py = pybind11;

PYBIND11_MODULE(_attn, m) {
  m.doc() = R"(attn: attention scoring functions, computed by the attn C++ library.

The chapter's PyTorch code as NumPy functions and layers: masked_softmax, bmm,
scaled_dot_product_attention, nadaraya_watson, the layers DotProductAttention,
AdditiveAttention and MultiHeadAttention with their backward passes, a KVCache for decoding,
show_heatmaps and plot (SVG or PNG files), and kernel regression (plug_in_bandwidth, and the
_KernelRegression that attn.KernelReg wraps). attn.torch (import attn.torch) offers the kernels
to PyTorch with autograd.

Arrays are float32 or float64 (all arrays of one call in the same dtype; scaled_dot_product_attention
also takes float16, and computes float32 ones in bfloat16 with compute_dtype='bfloat16'); C-contiguous arrays, and
any array whose last axis is contiguous, are used without a copy; other layouts are copied. The GIL
is released while attn computes. A bad argument raises ValueError (shapes, values) or TypeError
(types, dtypes) whose message names the argument; a call needing more memory than attn may use
(memory_limit) raises MemoryError naming the bytes, before it allocates.)";
  // attn::MemoryError (attn/memory.hpp) wherever it is thrown: before the library's other errors,
  // which pybind11 raises as ValueError (attn::Error is a std::invalid_argument).
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const attn::MemoryError& e) {
      PyErr_SetString(PyExc_MemoryError, e.what());
    }
  });
  m.attr("__version__") = ATTN_VERSION;
  attn_py::bind_functions(m);
  attn_py::bind_layers(m);
  attn_py::bind_plot(m);
  attn_py::bind_config(m);
  attn_py::bind_multi_head(m);
  attn_py::bind_kv_cache(m);
  attn_py::bind_torch_bridge(m);
  attn_py::bind_rotary(m);
  attn_py::bind_torch_rotary(m);
  attn_py::bind_torch_varlen(m);
  attn_py::bind_varlen(m);
  attn_py::bind_torch_flash(m);
  attn_py::bind_kernel_regression(m);
}
