// One call of a function of the Python module: its arguments converted to what attn reads, the C++
// call run without the GIL, and its attn::Error raised as a ValueError naming the Python argument.
//
// Arrays (Call::floating): float32 or float64, every floating array of one call in the same dtype
// (else TypeError). An array attn can read in place (native byte order, aligned, non-negative
// strides, a contiguous last dimension: any C-contiguous array and the slices of one) is used without
// a copy; any other layout (Fortran order, negative strides, byte-swapped) is copied to C order.
// Anything else np.asarray accepts (lists, torch tensors) is converted first. At most 4 dimensions.
//
// Errors: the checks are attn's own (src/api), and their messages name the C++ operation and
// argument: "sdpa_forward: keys has shape (2,10,3) but must be ...". Call::run replaces the operation
// by the Python function and the argument the message starts with by the Python one, from the
// call's renames: "scaled_dot_product_attention: k (keys) has shape (2,10,3) but must be ...".
// Wrong types (a str where an array goes, int arrays, mixed dtypes) raise TypeError here.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "attn/error.hpp"
#include "attn/mask.hpp"
#include "attn/memory.hpp"
#include "attn/tensor.hpp"

namespace attn_py {

namespace py = pybind11;
using attn::index_t;

// f16 (NumPy's float16) only in calls that take it (Call::allow_float16), which do not dispatch.
enum class DType { f32, f64, f16 };

const char* dtype_name(DType dt);

// Whether `a`, the array NumPy made of `obj`, holds integers: an integer dtype, or no element from a
// list or tuple (which NumPy reads as float64), so that its shape is what an error names.
bool holds_integers(py::handle obj, const py::array& a);

// str(obj), as Python prints it.
inline std::string str_of(py::handle obj) { return py::str(obj).cast<std::string>(); }

// Runs f(float{}) or f(double{}): the generic lambdas of the bindings, in the call's precision.
template <class F>
auto dispatch(DType dt, F&& f) {
  if (dt == DType::f32) return f(float{});
  return f(double{});
}

// A C++ argument name a message may start with, and the words naming the Python argument instead.
using Renames = std::vector<std::pair<std::string, std::string>>;

class Call {
 public:
  // `function`: what messages start with ("scaled_dot_product_attention", "AdditiveAttention.backward").
  Call(std::string function, Renames renames) : function_(std::move(function)), renames_(std::move(renames)) {}

  // A required floating array. The first one fixes the call's dtype; later ones must have it.
  py::array floating(py::handle obj, const char* name);
  // Lets floating() take float16 arrays too (the 16-bit functions).
  void allow_float16() { float16_ = true; }
  // Fixes the dtype before any argument is read: a backward takes the dtype of its forward.
  // `whose` ends the messages' "... but <whose> float32": "the inputs of the last call have".
  void expect_dtype(DType dt, const char* whose);
  DType dtype() const { return *dtype_; }
  // Valid lengths: an array of any integer dtype, as int64.
  py::array lengths(py::handle obj, const char* name);
  // An array of integers (any integer dtype) as int64, its entries to lie in `range` (for messages;
  // checked by the call): a draft tree's parents.
  py::array integers(py::handle obj, const char* name, const char* range);
  // A mask: bool (kept as is) or floating (the call's dtype).
  py::array mask(py::handle obj, const char* name);
  // Segment ids: int32 or int64, kept as they are.
  py::array segment_ids(py::handle obj, const char* name);
  // An array of the call's floating dtype (after the first floating array fixed it); float32 in a
  // float16 call.
  py::array same_dtype(py::handle obj, const char* name);

  // Scalars, with TypeError naming the argument for a wrong type.
  double number(py::handle obj, const char* name);
  std::uint64_t seed(py::handle obj, const char* name);
  index_t integer(py::handle obj, const char* name);
  std::string text(py::handle obj, const char* name);

  // Adds a sentence to the call's messages about shapes, e.g. how a 1-D argument was reshaped.
  void note(const std::string& sentence) { notes_ += (notes_.empty() ? " (" : "; ") + sentence; }

  // Runs `body` with the GIL released; an attn::Error it throws becomes a ValueError. Views must be
  // made before (they read the arrays, a Python API).
  // An attn::MemoryError (more memory than attn may use) becomes a MemoryError.
  template <class F>
  void run(F&& body) {
    std::string error;
    bool memory = false;
    {
      py::gil_scoped_release released;
      try {
        body();
      } catch (const attn::MemoryError& e) {
        error = e.what(), memory = true;
      } catch (const attn::Error& e) {
        error = e.what();
      }
    }
    if (memory) {
      PyErr_SetString(PyExc_MemoryError, (function_ + ": " + error).c_str());
      throw py::error_already_set();
    }
    if (!error.empty()) throw py::value_error(rewrite(error));
  }

  // new_array (below) for this call: its MemoryError, too, starts with the call's function (found
  // by probing: KVCache.attend's result array past the memory limit was refused without a name).
  template <class T>
  py::array_t<T> new_array(const std::vector<index_t>& shape, const char* name = "a result array") const;

  // A positive scalar x in T, the floating type the call computes in: a positive finite x that T
  // cannot hold (1e-50 or 1e300 in float32) is refused naming the value given, not the 0 or inf it
  // would have become; any other x (0, negative, NaN, inf) is left to attn's own check.
  template <class T>
  T positive_in(double x, const char* name) const {
    const T t = static_cast<T>(x);
    if (x > 0 && std::isfinite(x) && (t == T(0) || !std::isfinite(t)))
      value_error(std::string(name) + " is " + str_of(py::float_(x)) + ", which is " + str_of(py::float_(t)) + " in " +
                  (sizeof(T) == 4 ? "float32" : "float64") +
                  ", the dtype the call computes in; it must be positive and finite there");
    return t;
  }

  [[noreturn]] void type_error(const std::string& what) const { throw py::type_error(function_ + ": " + what); }
  [[noreturn]] void value_error(const std::string& what) const { throw py::value_error(function_ + ": " + what); }

 private:
  // lengths and integers: `what` names the entries in messages (null: "its entries").
  py::array int64_array(py::handle obj, const char* name, const char* what, const char* range);
  std::string rewrite(const std::string& message) const;
  py::int_ python_int(py::handle obj, const char* name) const;

  std::string function_;
  Renames renames_;
  std::string notes_;
  std::optional<DType> dtype_;
  bool float16_ = false;
  std::string dtype_from_;  // who fixed the dtype, with a verb: "q has"
};

// ---- views and new arrays ----------------------------------------------------------------------

// An attn view of an array from Call (element strides; any rank up to 4). An array without
// elements gets C-order strides: NumPy may give it any (often all 0), which attn would refuse.
template <class T>
attn::TensorView<T> view_of(const py::array& a) {
  std::vector<index_t> shape, strides;
  for (py::ssize_t i = 0; i < a.ndim(); ++i) {
    shape.push_back(a.shape(i));
    strides.push_back(a.strides(i) / static_cast<py::ssize_t>(sizeof(T)));
  }
  T* data = static_cast<T*>(const_cast<void*>(a.data()));
  if (a.size() == 0) return {data, shape};
  return {data, shape, strides};
}

template <class T>
attn::TensorView<const T> cview(const py::array& a) {
  return view_of<const T>(a);
}

// A new C-ordered array of `shape`, checked first against the memory attn may use (attn/memory.hpp):
// MemoryError naming `name` and the bytes, before NumPy allocates. NumPy owns the array; attn does
// not count it as held.
template <class T>
py::array_t<T> new_array(const std::vector<index_t>& shape, const char* name = "a result array") {
  attn::check_allocation(shape, sizeof(T), name);
  return py::array_t<T>(std::vector<py::ssize_t>(shape.begin(), shape.end()));
}

template <class T>
py::array_t<T> Call::new_array(const std::vector<index_t>& shape, const char* name) const {
  try {
    return attn_py::new_array<T>(shape, name);
  } catch (const attn::MemoryError& e) {
    PyErr_SetString(PyExc_MemoryError, (function_ + ": " + e.what()).c_str());
    throw py::error_already_set();
  }
}

// The sizes of dimensions [from, to) of `a`, as a vector to extend; negative indices count from the
// end and to = 0 means through the last: dims(a) is the shape, dims(a, 0, -1) all but the last size.
std::vector<index_t> dims(const py::array& a, int from = 0, int to = 0);
// Size of dimension i (negative: from the end), or 0 when `a` has fewer dimensions.
index_t dim(const py::array& a, int i);

// float16 where attn has no 16-bit kernel (the functions and layers that take float16 arrays and
// compute in float32): the call's compute dtype, an array of it (float16 widened to float32), and
// results (an array, or a tuple or dict of arrays) rounded to float16 (NumPy's astype: nearest even)
// when the call's arrays were float16.
DType computed_in(const Call& call);
py::array widened(const Call& call, const py::array& a);
py::object narrowed(const Call& call, const py::object& result);
py::object to_float16(const py::object& result);

// ---- masks -------------------------------------------------------------------------------------

// A null array handle, for an optional argument that was not given (a default-constructed py::array
// is an allocated empty array, which would read as given).
inline py::array no_array() { return py::reinterpret_steal<py::array>(py::handle()); }

// valid_lens, mask, causal and masked_fill as the functions take them, converted by a Call.
struct MaskArgs {
  py::array valid_lens = no_array();  // int64, or null
  py::array keep = no_array();        // bool, or null
  py::array additive = no_array();    // the call's dtype, or null
  attn::Causal causal = attn::Causal::none;
  std::optional<attn::Align> align;
  attn::MaskedFill fill = attn::MaskedFill::exclude;

  template <class T>
  attn::Mask<T> mask() const {
    attn::Mask<T> m;
    if (valid_lens) m.valid_lens = cview<std::int64_t>(valid_lens);
    if (keep) m.keep = cview<bool>(keep);
    if (additive) m.additive = cview<T>(additive);
    m.causal = causal;
    m.align = align;
    m.fill = fill;
    return m;
  }
};

// valid_lens: None or integers; mask: None, bool or floating; causal: a bool, "top_left" or
// "bottom_right"; masked_fill: "exclude" or "d2l_minus_1e6".
MaskArgs mask_args(Call& call, py::handle valid_lens, py::handle mask, py::handle causal, py::handle masked_fill);
// align: None, "top_left" or "bottom_right" (attn/mask.hpp), read into m.align; with causal=True it
// also places the causal mask (causal=True, align="bottom_right" is the bottom-right causal mask).
void align_from(Call& call, py::handle causal, py::handle align, MaskArgs& m);
// A window argument: None, or a pair (left, right) of integers or None (unbounded).
std::optional<attn::Window> window_from(Call& call, py::handle window);
attn::MaskedFill masked_fill_from(Call& call, py::handle masked_fill);
const char* masked_fill_name(attn::MaskedFill fill);

}  // namespace attn_py
