// attn._distributed: the compiled part of attn.distributed (python/attn/distributed.py), a module of
// its own so that `import attn` needs no MPI. Communicators arrive as mpi4py's Fortran handles
// (comm.py2f()), turned back into MPI_Comm by MPI_Comm_f2c; arrays as C-contiguous NumPy float32 or
// float64 arrays (attn.distributed converts them). The GIL is released while the ranks compute.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "attn/config.hpp"
#include "attn/distributed.hpp"
#include "attn/error.hpp"
#include "attn/memory.hpp"
#include "attn/sdpa.hpp"

namespace py = pybind11;

namespace {

using attn::index_t;

template <class T>
using Array = py::array_t<T, py::array::c_style | py::array::forcecast>;

template <class T>
attn::TensorView<const T> view_of(const Array<T>& a) {
  std::vector<index_t> shape(a.shape(), a.shape() + a.ndim());
  return attn::TensorView<const T>(a.data(), shape);
}

template <class T>
attn::TensorView<T> view_of(Array<T>& a) {
  std::vector<index_t> shape(a.shape(), a.shape() + a.ndim());
  return attn::TensorView<T>(a.mutable_data(), shape);
}

template <class T>
Array<T> like(const std::vector<index_t>& shape) {
  return Array<T>(std::vector<py::ssize_t>(shape.begin(), shape.end()));
}

// The mask and options of every call, as attn.distributed passed them.
struct Settings {
  std::string causal;  // "", "top_left" or "bottom_right"
  std::string align;   // "", "top_left" or "bottom_right" (attn/mask.hpp)
  std::string layout, algorithm;
  std::optional<Array<std::int64_t>> valid_lens;
  std::optional<std::pair<index_t, index_t>> window;
  std::optional<double> scale, softcap;
  double dropout = 0;
  std::uint64_t seed = 0;
  // attn's settings (attn.distributed takes them from attn's module): this module holds a copy of the
  // library of its own, whose settings are set from these for each call. memory_limit: set_memory_limit's
  // bytes, 0 when none is set (this copy then reads ATTN_MAX_BYTES or the machine, as attn does).
  std::string simd_target;
  std::size_t memory_limit = 0;

  bool ring() const { return algorithm == "ring"; }
  attn::ShardLayout shard_layout() const {
    return layout == "zigzag" ? attn::ShardLayout::zigzag : attn::ShardLayout::contiguous;
  }
  template <class T>
  attn::Mask<T> mask(const std::optional<Array<T>>& alibi, const std::optional<Array<T>>& sinks) const {
    attn::Mask<T> m;
    m.causal = causal == "top_left" ? attn::Causal::top_left : causal == "bottom_right" ? attn::Causal::bottom_right : attn::Causal::none;
    if (!align.empty()) m.align = align == "bottom_right" ? attn::Align::bottom_right : attn::Align::top_left;
    if (sinks) m.sinks = view_of(*sinks);
    if (valid_lens) m.valid_lens = view_of(*valid_lens);
    if (window) m.window = attn::Window{window->first, window->second};
    if (alibi) m.alibi_slopes = view_of(*alibi);
    return m;
  }
  // The SIMD target the call runs on: attn's, else this copy's own.
  std::string target() const { return simd_target.empty() ? attn::simd_target() : simd_target; }
  attn::SdpaOptions options() const {
    attn::SdpaOptions o;
    o.scale = scale, o.softcap = softcap;
    o.dropout = attn::Dropout{dropout, seed};
    return o;
  }
};

MPI_Comm comm_of(std::int64_t handle) { return MPI_Comm_f2c(static_cast<MPI_Fint>(handle)); }

// (out, lse) of this rank's queries.
template <class T>
py::tuple forward(std::int64_t comm, const Array<T>& q, const Array<T>& k, const Array<T>& v,
                  const std::optional<Array<T>>& alibi, const std::optional<Array<T>>& sinks, const Settings& s) {
  std::vector<index_t> out_shape(q.shape(), q.shape() + q.ndim()), lse_shape(out_shape.begin(), out_shape.end() - 1);
  if (v.ndim() == q.ndim() && q.ndim() >= 1) out_shape.back() = v.shape(v.ndim() - 1);
  Array<T> out = like<T>(out_shape), lse = like<T>(lse_shape);
  const attn::Mask<T> mask = s.mask<T>(alibi, sinks);
  attn::set_memory_limit(s.memory_limit);
  {
    py::gil_scoped_release unlocked;
    const attn::ScopedSimdTarget simd(s.target());  // this thread's, for the call
    const auto call = s.ring() ? attn::ring_sdpa_forward<T> : attn::ulysses_sdpa_forward<T>;
    call(comm_of(comm), view_of(out), view_of(lse), view_of(q), view_of(k), view_of(v), mask, s.options(), s.shard_layout());
  }
  return py::make_tuple(out, lse);
}

// (dq, dk, dv) of this rank's shards, and with sinks their gradient over the whole sequences.
template <class T>
py::tuple backward(std::int64_t comm, const Array<T>& dout, const Array<T>& q, const Array<T>& k, const Array<T>& v,
                   const Array<T>& out, const Array<T>& lse, const std::optional<Array<T>>& alibi,
                   const std::optional<Array<T>>& sinks, const Settings& s) {
  Array<T> dq = like<T>({q.shape(), q.shape() + q.ndim()}), dk = like<T>({k.shape(), k.shape() + k.ndim()}),
           dv = like<T>({v.shape(), v.shape() + v.ndim()});
  const attn::Mask<T> mask = s.mask<T>(alibi, sinks);
  attn::set_memory_limit(s.memory_limit);
  {
    py::gil_scoped_release unlocked;
    const attn::ScopedSimdTarget simd(s.target());  // this thread's, for the call
    const auto call = s.ring() ? attn::ring_sdpa_backward<T> : attn::ulysses_sdpa_backward<T>;
    call(comm_of(comm), view_of(dq), view_of(dk), view_of(dv), view_of(dout), view_of(q), view_of(k), view_of(v),
         view_of(out), view_of(lse), mask, s.options(), s.shard_layout());
  }
  if (!sinks) return py::make_tuple(dq, dk, dv);
  // d(sinks): this rank's rows (attn/sdpa.hpp's sdpa_sinks_backward), summed over the ranks.
  Array<T> ds = like<T>({sinks->shape(), sinks->shape() + sinks->ndim()});
  {
    py::gil_scoped_release unlocked;
    attn::sdpa_sinks_backward<T>(view_of(ds), view_of(dout), view_of(out), view_of(lse), view_of(*sinks));
    MPI_Allreduce(MPI_IN_PLACE, ds.mutable_data(), static_cast<int>(ds.size()),
                  std::is_same_v<T, float> ? MPI_FLOAT : MPI_DOUBLE, MPI_SUM, comm_of(comm));
  }
  return py::make_tuple(dq, dk, dv, ds);
}

template <class T>
void bind_dtype(py::module_& m, const std::string& dtype) {
  m.def(("forward_" + dtype).c_str(), &forward<T>, py::arg("comm"), py::arg("queries"), py::arg("keys"), py::arg("values"),
        py::arg("alibi_slopes"), py::arg("sinks"), py::arg("settings"));
  m.def(("backward_" + dtype).c_str(), &backward<T>, py::arg("comm"), py::arg("dout"), py::arg("queries"), py::arg("keys"),
        py::arg("values"), py::arg("out"), py::arg("lse"), py::arg("alibi_slopes"), py::arg("sinks"), py::arg("settings"));
}

}  // namespace

PYBIND11_MODULE(_distributed, m) {
  m.doc() = "attn._distributed: the compiled part of attn.distributed (attention across MPI ranks)";
  py::register_exception<attn::Error>(m, "Error", PyExc_ValueError);
  // attn::MemoryError as MemoryError, as attn's own module raises it (registered after attn::Error's
  // translator, so tried before it).
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const attn::MemoryError& e) {
      PyErr_SetString(PyExc_MemoryError, e.what());
    }
  });
  py::class_<Settings>(m, "Settings")
      .def(py::init<>())
      .def_readwrite("causal", &Settings::causal)
      .def_readwrite("align", &Settings::align)
      .def_readwrite("layout", &Settings::layout)
      .def_readwrite("algorithm", &Settings::algorithm)
      .def_readwrite("valid_lens", &Settings::valid_lens)
      .def_readwrite("window", &Settings::window)
      .def_readwrite("scale", &Settings::scale)
      .def_readwrite("softcap", &Settings::softcap)
      .def_readwrite("dropout", &Settings::dropout)
      .def_readwrite("seed", &Settings::seed)
      .def_readwrite("simd_target", &Settings::simd_target)
      .def_readwrite("memory_limit", &Settings::memory_limit);
  bind_dtype<float>(m, "float32");  // one name per dtype: forcecast would turn float64 into float32
  bind_dtype<double>(m, "float64");
  m.def("shard_rows", [](index_t length, int ranks, int rank, const std::string& layout) {
    return attn::shard_rows(length, ranks, rank, layout == "zigzag" ? attn::ShardLayout::zigzag : attn::ShardLayout::contiguous);
  });
}
