// attn's run-time switches in Python (attn/config.hpp): the SIMD target of the fused kernels, the
// number of threads, and the probe of which target ran.
#include <pybind11/stl.h>

#include "attn/config.hpp"
#include "attn/diagnostics.hpp"
#include "attn/memory.hpp"
#include "bindings.hpp"

namespace attn_py {

namespace py = pybind11;

void bind_config(py::module_& m) {
  m.def("simd_targets", &attn::simd_targets,
        R"(The SIMD targets attn's kernels were compiled for and this CPU runs, best first: "avx3"
(AVX-512), "avx2", "sse4", "scalar".)");
  m.def("simd_target", &attn::simd_target, "The SIMD target the kernels run now.");
  m.def("set_simd_target", &attn::set_simd_target, py::arg("name"),
        R"(Runs the kernels on `name`, one of simd_targets(), or on the best with "". ValueError for any
other name. The environment variable ATTN_SIMD_TARGET chooses one at start-up.)");
  m.def("simd_targets_ran", &attn::simd_targets_ran, py::arg("reset") = false,
        R"(The SIMD targets the kernels actually ran on since the last call with reset=True, as the
kernels record it: what ran, not what was chosen.)");
  m.def("num_threads", &attn::num_threads, "The threads attn's kernels use.");
  m.def("set_num_threads", &attn::set_num_threads, py::arg("threads"),
        "Threads for attn's kernels; 0 restores the default (OMP_NUM_THREADS or every core).");
  m.def("set_memory_limit", &attn::set_memory_limit, py::arg("bytes"),
        R"(The most memory attn may hold at once, in bytes (its tensors, the kernels' scratch; each result
array is checked against it too); 0 goes back to the environment variable ATTN_MAX_BYTES ("8G"), or,
without it, to the memory the machine has available. A call that would need more raises MemoryError
naming the bytes, before it allocates.)");
  m.def("memory_limit_set", &attn::memory_limit_set,
        "set_memory_limit's bytes; 0 when none is set (the limit is then ATTN_MAX_BYTES's or the machine's).");
  m.def("memory_limit", &attn::memory_limit, "The memory attn may use now, in bytes (set_memory_limit).");
  m.def("memory_in_use", &attn::memory_in_use, "The bytes attn holds now: its tensors and the kernels' scratch.");
}

}  // namespace attn_py
