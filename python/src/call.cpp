#include "call.hpp"

#include <algorithm>
#include <cctype>
#include <cstdint>

namespace attn_py {
namespace {

py::object numpy() { return py::module_::import("numpy"); }

std::string type_name(py::handle obj) { return py::str(py::type::handle_of(obj).attr("__name__")); }

// "(2,10,3)", as attn's messages write shapes.
std::string shape_text(const py::array& a) { return attn::shape_string(dims(a)); }

std::string dtype_text(const py::array& a) { return py::str(a.dtype()); }

// `obj` as an ndarray (np.asarray for lists, torch tensors and other array-likes).
py::array as_array(const Call& call, py::handle obj, const char* name, const char* expected) {
  if (obj.is_none()) call.type_error(std::string(name) + " is required; got None");
  if (py::isinstance<py::array>(obj)) return py::reinterpret_borrow<py::array>(obj);
  if (py::isinstance<py::str>(obj) || py::isinstance<py::bytes>(obj))
    call.type_error(std::string(name) + " must be " + expected + "; got " + type_name(obj));
  try {
    return numpy().attr("asarray")(obj);
  } catch (py::error_already_set& e) {
    call.type_error(std::string(name) + " must be " + expected + "; got " + type_name(obj) +
                    ", which numpy cannot convert: " + e.what());
  }
}

// attn reads `a` as it is: native byte order, aligned, non-negative strides that are whole
// elements, and a contiguous last dimension (or one of size 1).
bool readable_in_place(const py::array& a) {
  if (!py::cast<bool>(a.dtype().attr("isnative"))) return false;
  if (!(a.flags() & py::detail::npy_api::NPY_ARRAY_ALIGNED_)) return false;
  const py::ssize_t item = a.itemsize();
  for (py::ssize_t i = 0; i < a.ndim(); ++i)
    if (a.strides(i) < 0 || a.strides(i) % item != 0) return false;
  return a.ndim() == 0 || a.shape(a.ndim() - 1) <= 1 || a.strides(a.ndim() - 1) == item;
}

// `a` itself when attn reads it in place, else a C-ordered copy in the native `dtype` (a copy
// always: NumPy's ascontiguousarray returns an array whose reversed axes are all of length 1 as it
// is, C-contiguous by its flags, with its negative strides).
py::array readable(const py::array& a, const char* dtype) {
  if (readable_in_place(a)) return a;
  return numpy().attr("array")(a, py::arg("dtype") = dtype, py::arg("order") = "C", py::arg("copy") = true);
}

}  // namespace

bool holds_integers(py::handle obj, const py::array& a) {
  const char kind = a.dtype().kind();
  return kind == 'i' || kind == 'u' || (a.size() == 0 && !py::isinstance<py::array>(obj));
}

const char* dtype_name(DType dt) { return dt == DType::f32 ? "float32" : dt == DType::f64 ? "float64" : "float16"; }

std::vector<index_t> dims(const py::array& a, int from, int to) {
  const int n = static_cast<int>(a.ndim());
  const int begin = from < 0 ? std::max(0, n + from) : std::min(n, from);
  const int end = to <= 0 ? std::max(0, n + to) : std::min(n, to);
  std::vector<index_t> r;
  for (int i = begin; i < end; ++i) r.push_back(a.shape(i));
  return r;
}

index_t dim(const py::array& a, int i) {
  const int n = static_cast<int>(a.ndim());
  const int k = i < 0 ? n + i : i;
  return k >= 0 && k < n ? a.shape(k) : 0;
}

py::array Call::floating(py::handle obj, const char* name) {
  py::array a = as_array(*this, obj, name, float16_ ? "an array of float16, float32 or float64" : "an array of float32 or float64");
  const bool half = float16_ && a.dtype().kind() == 'f' && a.itemsize() == 2;
  if (!half && (a.dtype().kind() != 'f' || (a.itemsize() != 4 && a.itemsize() != 8)))
    type_error(std::string(name) + " has dtype " + dtype_text(a) +
               (float16_ ? "; this function takes float16, float32 or float64 (convert it with .astype(numpy.float32))"
                         : "; attn computes in float32 or float64 (convert it with .astype(numpy.float32))"));
  if (a.ndim() > attn::kMaxRank)
    value_error(std::string(name) + " has shape " + shape_text(a) + " with " + std::to_string(a.ndim()) +
                " dimensions; attn's tensors have at most " + std::to_string(attn::kMaxRank));
  const DType dt = a.itemsize() == 2 ? DType::f16 : a.itemsize() == 4 ? DType::f32 : DType::f64;
  if (!dtype_) {
    dtype_ = dt;
    dtype_from_ = std::string(name) + " has";
  } else if (dt != *dtype_) {
    type_error(std::string(name) + " has dtype " + dtype_name(dt) + " but " + dtype_from_ + " " +
               dtype_name(*dtype_) + "; the arrays of one call must have the same dtype");
  }
  return readable(a, dtype_name(dt));
}

DType computed_in(const Call& call) { return call.dtype() == DType::f16 ? DType::f32 : call.dtype(); }

py::array widened(const Call& call, const py::array& a) {
  if (call.dtype() != DType::f16) return a;
  return numpy().attr("ascontiguousarray")(a, py::arg("dtype") = "float32");
}

py::object to_float16(const py::object& result) {
  if (py::isinstance<py::dict>(result)) {
    py::dict rounded;
    for (const auto& [key, value] : py::reinterpret_borrow<py::dict>(result)) rounded[key] = value.attr("astype")("float16");
    return rounded;
  }
  if (!py::isinstance<py::tuple>(result)) return result.attr("astype")("float16");
  py::list parts;
  for (const py::handle r : result) parts.append(r.attr("astype")("float16"));
  return py::tuple(parts);
}

py::object narrowed(const Call& call, const py::object& result) {
  return call.dtype() == DType::f16 ? to_float16(result) : result;
}

void Call::expect_dtype(DType dt, const char* whose) {
  dtype_ = dt;
  dtype_from_ = whose;
}

py::array Call::lengths(py::handle obj, const char* name) { return int64_array(obj, name, "valid lengths", "[0, m]"); }

py::array Call::integers(py::handle obj, const char* name, const char* range) {
  return int64_array(obj, name, nullptr, range);
}

py::array Call::int64_array(py::handle obj, const char* name, const char* what, const char* range) {
  py::array a = as_array(*this, obj, name, "an array of integers");
  const char kind = a.dtype().kind();
  if (!holds_integers(obj, a))
    type_error(std::string(name) + " has dtype " + dtype_text(a) + (what ? std::string("; ") + what + " are integers" : "; it must hold integers"));
  if (a.ndim() > attn::kMaxRank)
    value_error(std::string(name) + " has shape " + shape_text(a) + "; it must be (B,) or (B, n)");
  if (kind == 'i' && a.itemsize() == 8) return readable(a, "int64");
  if (kind == 'u' && a.itemsize() == 8 && a.size() > 0) {  // past 2^63 - 1 it would wrap to a negative value
    const auto largest = py::cast<std::uint64_t>(a.attr("max")());
    if (largest > static_cast<std::uint64_t>(INT64_MAX))
      value_error(std::string(name) + " holds " + std::to_string(largest) + "; " + (what ? what : "its entries") +
                  " must lie in " + range);
  }
  return numpy().attr("ascontiguousarray")(a, py::arg("dtype") = "int64");
}

py::array Call::mask(py::handle obj, const char* name) {
  py::array a = as_array(*this, obj, name, "an array of bool or float");
  const char kind = a.dtype().kind();
  if (a.ndim() > attn::kMaxRank)
    value_error(std::string(name) + " has shape " + shape_text(a) + " with " + std::to_string(a.ndim()) +
                " dimensions; a mask broadcasts to the scores, which have at most " + std::to_string(attn::kMaxRank));
  if (kind == 'b') return readable(a, "bool");
  if (kind == 'f') {
    const DType dt = a.itemsize() == 2 ? DType::f16 : a.itemsize() == 4 ? DType::f32 : DType::f64;
    // A float16 call adds its float mask in float32 (attn's 16-bit attention takes float32 masks).
    if (dtype_ && *dtype_ == DType::f16 && (a.itemsize() == 2 || a.itemsize() == 4))
      return numpy().attr("ascontiguousarray")(a, py::arg("dtype") = "float32");
    if ((a.itemsize() == 4 || a.itemsize() == 8) && dtype_ && dt == *dtype_) return readable(a, dtype_name(dt));
    if (dtype_)
      type_error(std::string(name) + " has dtype " + dtype_text(a) + " but " + dtype_from_ + " " +
                 dtype_name(*dtype_) + "; a float mask (added to the scores) must have the dtype of the call");
  }
  type_error(std::string(name) + " has dtype " + dtype_text(a) +
             "; a mask is bool (True = the query attends to the key) or float (added to the scores)");
}

py::array Call::segment_ids(py::handle obj, const char* name) {
  py::array a = as_array(*this, obj, name, "an array of int32 or int64");
  if (a.dtype().kind() != 'i' || (a.itemsize() != 4 && a.itemsize() != 8))
    type_error(std::string(name) + " has dtype " + dtype_text(a) + "; segment ids are int32 or int64");
  if (a.ndim() > attn::kMaxRank) value_error(std::string(name) + " has shape " + shape_text(a) + "; it must be 2-D");
  return readable(a, a.itemsize() == 4 ? "int32" : "int64");
}

py::array Call::same_dtype(py::handle obj, const char* name) {
  py::array a = as_array(*this, obj, name, "an array of floats");
  if (a.ndim() > attn::kMaxRank) value_error(std::string(name) + " has shape " + shape_text(a));
  const char kind = a.dtype().kind();
  if (kind != 'f' && kind != 'i' && kind != 'u')
    type_error(std::string(name) + " has dtype " + dtype_text(a) + "; it must hold numbers");
  // float32 in a float16 call, as its float masks: attn's 16-bit attention takes them in float32 (found
  // by probing: ALiBi slopes rounded to float16 biased distant keys by up to slope 2^-11 |i - j|).
  const DType as = *dtype_ == DType::f16 ? DType::f32 : *dtype_;
  return numpy().attr("ascontiguousarray")(a, py::arg("dtype") = dtype_name(as));
}

double Call::number(py::handle obj, const char* name) {
  if (obj.is_none() || py::isinstance<py::str>(obj) || py::isinstance<py::bool_>(obj))
    type_error(std::string(name) + " must be a number; got " + type_name(obj));
  const double x = PyFloat_AsDouble(obj.ptr());
  if (x == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    type_error(std::string(name) + " must be a number; got " + type_name(obj));
  }
  return x;
}

// `obj` as a Python int: TypeError unless it is an integer (int, numpy integer; not a bool).
py::int_ Call::python_int(py::handle obj, const char* name) const {
  if (py::isinstance<py::bool_>(obj) || !PyIndex_Check(obj.ptr()))
    type_error(std::string(name) + " must be an integer; got " + type_name(obj));
  return py::reinterpret_steal<py::int_>(PyNumber_Index(obj.ptr()));
}

std::uint64_t Call::seed(py::handle obj, const char* name) {
  const py::object i = python_int(obj, name);
  const unsigned long long v = PyLong_AsUnsignedLongLong(i.ptr());
  if (PyErr_Occurred()) {
    PyErr_Clear();
    value_error(std::string(name) + " is " + str_of(i) + "; it must lie in [0, 2**64)");
  }
  return static_cast<std::uint64_t>(v);
}

index_t Call::integer(py::handle obj, const char* name) {
  const py::object i = python_int(obj, name);
  const long long v = PyLong_AsLongLong(i.ptr());
  if (PyErr_Occurred()) {
    PyErr_Clear();
    value_error(std::string(name) + " is " + str_of(i) + "; it must fit in a signed 64-bit integer");
  }
  return static_cast<index_t>(v);
}

std::string Call::text(py::handle obj, const char* name) {
  if (!py::isinstance<py::str>(obj)) type_error(std::string(name) + " must be a str; got " + type_name(obj));
  return py::cast<std::string>(obj);
}

namespace {

// The rename whose C++ name `text` starts with, followed by a character that cannot continue a name;
// the longest one. Null if none.
const std::pair<std::string, std::string>* subject_of(const std::string& text, const Renames& renames) {
  const std::pair<std::string, std::string>* best = nullptr;
  for (const auto& r : renames) {
    if (text.compare(0, r.first.size(), r.first) != 0) continue;
    const char next = text.size() > r.first.size() ? text[r.first.size()] : ' ';
    if (std::isalnum(static_cast<unsigned char>(next)) || next == '_' || next == '.') continue;
    if (best == nullptr || r.first.size() > best->first.size()) best = &r;
  }
  return best;
}

// The C++ operation a message starts with ("sdpa_forward: ", "AdditiveWeights::init: "), or "".
std::size_t operation_length(const std::string& message) {
  const std::size_t colon = message.find(": ");
  if (colon == std::string::npos || colon == 0) return 0;
  for (std::size_t i = 0; i < colon; ++i) {
    const char c = message[i];
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != ':') return 0;
  }
  return colon + 2;
}

}  // namespace

// "<op>: <subject> <rest>" -> "<function>: <python subject> <rest><notes>". A message that starts
// with a rename (a path: "out.svg: cannot ...") keeps it as its subject; any other loses its
// operation, and the rest's subject is renamed.
std::string Call::rewrite(const std::string& message) const {
  std::string rest = subject_of(message, renames_) != nullptr ? message : message.substr(operation_length(message));
  if (const auto* subject = subject_of(rest, renames_)) rest = subject->second + rest.substr(subject->first.size());
  // The notes say how arguments were reshaped: only messages about shapes need them.
  const bool about_shapes = rest.find("shape") != std::string::npos;
  return function_ + ": " + rest + (notes_.empty() || !about_shapes ? "" : notes_ + ")");
}

// ---- masks -------------------------------------------------------------------------------------

const char* masked_fill_name(attn::MaskedFill fill) {
  return fill == attn::MaskedFill::d2l_minus_1e6 ? "d2l_minus_1e6" : "exclude";
}

attn::MaskedFill masked_fill_from(Call& call, py::handle masked_fill) {
  const std::string fill = call.text(masked_fill, "masked_fill");
  if (fill == "exclude") return attn::MaskedFill::exclude;
  if (fill == "d2l_minus_1e6") return attn::MaskedFill::d2l_minus_1e6;
  call.value_error("masked_fill is \"" + fill + "\"; it must be \"exclude\" (masked keys take no part, a row "
                   "with none left is 0) or \"d2l_minus_1e6\" (the d2l chapter's fill)");
}

MaskArgs mask_args(Call& call, py::handle valid_lens, py::handle mask, py::handle causal, py::handle masked_fill) {
  MaskArgs m;
  if (!valid_lens.is_none()) m.valid_lens = call.lengths(valid_lens, "valid_lens");
  if (!mask.is_none()) {
    py::array a = call.mask(mask, "mask");
    (a.dtype().kind() == 'b' ? m.keep : m.additive) = a;
  }
  if (py::isinstance<py::str>(causal)) {
    const std::string c = py::cast<std::string>(causal);
    if (c == "top_left") {
      m.causal = attn::Causal::top_left;
    } else if (c == "bottom_right") {
      m.causal = attn::Causal::bottom_right;
    } else {
      call.value_error("causal is \"" + c + "\"; it must be True or False, \"top_left\" or \"bottom_right\"");
    }
  } else if (py::isinstance<py::bool_>(causal) || causal.is_none() ||
             py::isinstance(causal, numpy().attr("bool_"))) {
    m.causal = PyObject_IsTrue(causal.ptr()) == 1 ? attn::Causal::top_left : attn::Causal::none;
  } else {
    call.type_error("causal must be a bool, \"top_left\" or \"bottom_right\"; got " + type_name(causal));
  }
  m.fill = masked_fill_from(call, masked_fill);
  return m;
}

void align_from(Call& call, py::handle causal, py::handle align, MaskArgs& m) {
  if (align.is_none()) return;
  if (!py::isinstance<py::str>(align))
    call.type_error("align must be None, \"top_left\" or \"bottom_right\"; got " + type_name(align));
  const std::string a = py::cast<std::string>(align);
  if (a != "top_left" && a != "bottom_right")
    call.value_error("align is \"" + a + "\"; it must be None, \"top_left\" or \"bottom_right\"");
  m.align = a == "bottom_right" ? attn::Align::bottom_right : attn::Align::top_left;
  // causal=True takes the alignment given; a causal spelled "top_left" or "bottom_right" is checked
  // against it by attn (a contradiction is refused).
  if (!py::isinstance<py::str>(causal) && m.causal != attn::Causal::none)
    m.causal = a == "bottom_right" ? attn::Causal::bottom_right : attn::Causal::top_left;
}

std::optional<attn::Window> window_from(Call& call, py::handle obj) {
  if (obj.is_none()) return std::nullopt;
  if (!py::isinstance<py::sequence>(obj) || py::isinstance<py::str>(obj) || py::len(obj) != 2)
    call.type_error("window must be a pair (left, right) of integers (None or -1: unbounded); got " + str_of(obj));
  const py::sequence pair = py::reinterpret_borrow<py::sequence>(obj);
  auto side = [&](py::handle x, const char* name) -> index_t {
    return x.is_none() ? -1 : std::max<index_t>(-1, call.integer(x, name));
  };
  return attn::Window{side(pair[0], "window[0] (left)"), side(pair[1], "window[1] (right)")};
}

}  // namespace attn_py
