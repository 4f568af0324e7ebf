// The parts of the Python module, each defined in its own file and added to it by module.cpp.
#pragma once

#include <pybind11/pybind11.h>

namespace attn_py {

void bind_functions(pybind11::module_& m);  // functions.cpp: masked_softmax, bmm, sdpa, nadaraya_watson
void bind_layers(pybind11::module_& m);     // layers.cpp: DotProductAttention, AdditiveAttention
void bind_plot(pybind11::module_& m);       // plot.cpp: show_heatmaps
void bind_config(pybind11::module_& m);     // config.cpp: SIMD target, threads
void bind_multi_head(pybind11::module_& m);  // multi_head.cpp: MultiHeadAttention
void bind_kv_cache(pybind11::module_& m);    // kv_cache.cpp: KVCache
void bind_rotary(pybind11::module_& m);        // rotary.cpp: apply_rotary
void bind_torch_rotary(pybind11::module_& m);  // torch_rotary.cpp: attn._attn._torch.rotary_forward
void bind_torch_bridge(pybind11::module_& m);  // torch_bridge.cpp: attn._attn._torch, what attn.torch calls
void bind_torch_varlen(pybind11::module_& m);  // torch_varlen.cpp: its varlen calls, what attn.flash calls (after bind_torch_bridge)
void bind_varlen(pybind11::module_& m);        // varlen.cpp: varlen_attention (NumPy)
void bind_torch_flash(pybind11::module_& m);   // torch_flash.cpp: flash_attn_with_kvcache, paged varlen (after bind_torch_bridge)
void bind_kernel_regression(pybind11::module_& m);  // kernel_regression.cpp: _KernelRegression, plug_in_bandwidth

}  // namespace attn_py
