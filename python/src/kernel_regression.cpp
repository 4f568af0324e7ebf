// Kernel regression (attn/kernel_regression.hpp): the low-level class _KernelRegression that
// attn.KernelReg (python/attn/kernel_reg.py) wraps, and plug_in_bandwidth. Arrays are read as float64
// (converted when they are not); each C++ call runs without the GIL, its attn::Error a ValueError
// naming the Python argument.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "attn/kernel_regression.hpp"
#include "bindings.hpp"
#include "call.hpp"

namespace attn_py {
namespace {

using Float64 = py::array_t<double, py::array::c_style | py::array::forcecast>;

// The C++ names of the arguments, and what KernelReg calls them.
Renames kreg_renames() {
  return {{"x", "exog"}, {"y", "endog"}, {"queries", "data_predict"}, {"bandwidths", "bw"},
          {"var_type", "var_type"}, {"degree", "degree"}, {"level", "level"}, {"replicates", "replicates"}};
}

std::string type_name_of(py::handle obj) { return str_of(py::type::of(obj).attr("__name__")); }

std::string shape_text(const Float64& a) {
  std::string s = "(";
  for (py::ssize_t i = 0; i < a.ndim(); ++i) {
    if (i > 0) s += ",";
    s += std::to_string(a.shape(i));
  }
  return s + (a.ndim() == 1 ? ",)" : ")");
}

// `obj` as a C-ordered float64 array (np.asarray's conversions); TypeError naming `name` when it is
// not numbers, ValueError unless it has 1 or 2 dimensions.
Float64 float64_array(Call& call, py::handle obj, const char* name) {
  if (obj.is_none() || py::isinstance<py::str>(obj))
    call.type_error(std::string(name) + " must be an array of numbers; got " + type_name_of(obj));
  Float64 a = Float64::ensure(obj);  // a null handle, the Python error cleared, when it cannot convert
  if (!a) call.type_error(std::string(name) + " must be an array of numbers; got " + type_name_of(obj));
  if (a.ndim() < 1 || a.ndim() > 2)
    call.value_error(std::string(name) + " has shape " + shape_text(a) + "; it must have 1 or 2 dimensions");
  return a;
}

attn::TensorView<const double> view_of_array(const Float64& a) {
  if (a.ndim() == 1) return attn::TensorView<const double>(a.data(), {static_cast<index_t>(a.shape(0))});
  return attn::TensorView<const double>(a.data(), {static_cast<index_t>(a.shape(0)), static_cast<index_t>(a.shape(1))});
}

// Bandwidths as a float64 vector (any shape, read flat; attn checks the count and the values).
std::vector<double> bandwidths_of(Call& call, py::handle obj) {
  if (obj.is_none() || py::isinstance<py::str>(obj))
    call.type_error("bw must be an array of numbers; got " + type_name_of(obj));
  const Float64 a = Float64::ensure(obj);
  if (!a) call.type_error("bw must be an array of numbers; got " + type_name_of(obj));
  return std::vector<double>(a.data(), a.data() + a.size());
}

py::array_t<double> vector_array(const std::vector<double>& v) {
  return py::array_t<double>(static_cast<py::ssize_t>(v.size()), v.data());
}

py::array_t<double> matrix_array(const std::vector<double>& v, index_t rows, index_t cols) {
  py::array_t<double> a({static_cast<py::ssize_t>(rows), static_cast<py::ssize_t>(cols)});
  std::copy(v.begin(), v.end(), a.mutable_data());
  return a;
}

attn::KernelRegression* make_regression(py::object x_obj, py::object y_obj, const std::string& var_type, int degree,
                                        const std::string& ckertype) {
  Call call("KernelReg", kreg_renames());
  const Float64 x = float64_array(call, x_obj, "exog");
  const Float64 y = float64_array(call, y_obj, "endog");
  attn::KernelRegOptions options;
  options.var_type = var_type;
  options.degree = degree;
  call.run([&] { options.kernel = attn::continuous_kernel_from_name(ckertype); });
  const auto xv = view_of_array(x), yv = view_of_array(y);
  attn::KernelRegression* reg = nullptr;
  call.run([&] { reg = new attn::KernelRegression(xv, yv, options); });
  return reg;
}

// data_predict as a float64 view held by `storage`, or an empty view (the data points) for None.
attn::TensorView<const double> optional_queries(Call& call, py::object queries_obj, Float64& storage) {
  if (queries_obj.is_none()) return {};
  storage = float64_array(call, queries_obj, "data_predict");
  return view_of_array(storage);
}

// The fit at queries (None: the data points): (mean (nq,), slopes (nq, k)).
py::tuple fit(const attn::KernelRegression& reg, py::object bw_obj, py::object queries_obj) {
  Call call("KernelReg.fit", kreg_renames());
  const std::vector<double> bw = bandwidths_of(call, bw_obj);
  Float64 q;
  const attn::TensorView<const double> qv = optional_queries(call, queries_obj, q);
  attn::KernelFit f;
  call.run([&] { f = reg.fit(bw, qv); });
  const index_t nq = static_cast<index_t>(f.mean.size());
  return py::make_tuple(vector_array(f.mean), matrix_array(f.slopes, nq, reg.regressors()));
}

// cv_ls or aicc with its gradient: (value, gradient (k,)).
template <bool kAicc>
py::tuple criterion(const attn::KernelRegression& reg, py::object bw_obj) {
  Call call(kAicc ? "KernelReg.aicc" : "KernelReg.cv_ls", kreg_renames());
  const std::vector<double> bw = bandwidths_of(call, bw_obj);
  std::vector<double> gradient;
  double value = 0;
  call.run([&] { value = kAicc ? reg.aicc(bw, &gradient) : reg.cv_ls(bw, &gradient); });
  return py::make_tuple(value, vector_array(gradient));
}

py::tuple select_bandwidth(const attn::KernelRegression& reg, const std::string& method) {
  Call call("KernelReg", kreg_renames());
  attn::BandwidthMethod m = attn::BandwidthMethod::cv_ls;
  if (method == "cv_ls") {
    m = attn::BandwidthMethod::cv_ls;
  } else if (method == "aic" || method == "aicc") {
    m = attn::BandwidthMethod::aicc;
  } else {
    call.value_error("bw is \"" + method + "\"; a method must be \"cv_ls\" or \"aic\" (the corrected AIC)");
  }
  attn::BandwidthSelection s;
  call.run([&] { s = reg.select_bandwidth(m); });
  return py::make_tuple(vector_array(s.bandwidths), s.objective, s.how);
}

py::tuple confidence_band(const attn::KernelRegression& reg, py::object bw_obj, py::object queries_obj, double level,
                          const std::string& method, py::object seed_obj, py::object replicates_obj) {
  Call call("KernelReg.confidence_band", kreg_renames());
  const std::vector<double> bw = bandwidths_of(call, bw_obj);
  Float64 q;
  const attn::TensorView<const double> qv = optional_queries(call, queries_obj, q);
  attn::BandMethod m = attn::BandMethod::asymptotic;
  if (method == "bootstrap") {
    m = attn::BandMethod::bootstrap;
  } else if (method != "asymptotic") {
    call.value_error("method is \"" + method + "\"; it must be \"asymptotic\" or \"bootstrap\"");
  }
  const std::uint64_t seed = call.seed(seed_obj, "seed");
  const index_t count = call.integer(replicates_obj, "replicates");
  if (count < std::numeric_limits<int>::min() || count > std::numeric_limits<int>::max())
    call.value_error("replicates is " + std::to_string(count) + "; it must be at most " +
                     std::to_string(std::numeric_limits<int>::max()));
  const int replicates = static_cast<int>(count);
  attn::ConfidenceBand b;
  call.run([&] { b = reg.confidence_band(bw, qv, level, m, seed, replicates); });
  return py::make_tuple(vector_array(b.mean), vector_array(b.low), vector_array(b.high),
                        vector_array(b.standard_error));
}

}  // namespace

void bind_kernel_regression(py::module_& m) {
  using py::arg;
  py::class_<attn::KernelRegression>(m, "_KernelRegression", R"(attn::KernelRegression: local polynomial regression
of degree 0 to 3 over mixed continuous and discrete regressors (attn/kernel_regression.hpp). The engine
of attn.KernelReg, which is the interface to use; this class takes arrays as they are (no reshaping)
and bandwidths on every call.)")
      .def(py::init(&make_regression), arg("x"), arg("y"), arg("var_type"), arg("degree") = 1,
           arg("ckertype") = "gaussian",
           R"(x (n, k) or (n,) regressors, y (n,) response (float64; copied), var_type one letter per
column ('c', 'u', 'o'), degree 0..3, ckertype the continuous kernel ("gaussian", "epanechnikov",
"boxcar"/"uniform", "tricube").)")
      .def_property_readonly("nobs", &attn::KernelRegression::size, "The number of points n.")
      .def_property_readonly("k_vars", &attn::KernelRegression::regressors, "The number of regressors k.")
      .def("fit", &fit, arg("bw"), arg("queries") = py::none(),
           "(mean (nq,), slopes (nq, k)) at queries (nq, k) or (nq,), or at the data points for None.")
      .def("cv_ls", &criterion<false>, arg("bw"),
           "(value, gradient (k,)): the leave-one-out least-squares criterion at bw and its exact gradient.")
      .def("aicc", &criterion<true>, arg("bw"),
           "(value, gradient (k,)): the corrected AIC (this degree's hat matrix) at bw and its gradient.")
      .def("select_bandwidth", &select_bandwidth, arg("method") = "cv_ls",
           "(bw (k,), objective, how): the bandwidths minimising \"cv_ls\" or \"aic\" (the corrected AIC).")
      .def(
          "rule_of_thumb",
          [](const attn::KernelRegression& reg) {
            std::vector<double> h;
            Call call("KernelReg.rule_of_thumb", kreg_renames());
            call.run([&] { h = reg.rule_of_thumb(); });
            return vector_array(h);
          },
          "The rule-of-thumb bandwidths (k,) the search starts from.")
      .def("confidence_band", &confidence_band, arg("bw"), arg("queries") = py::none(), arg("level") = 0.95,
           arg("method") = "asymptotic", arg("seed") = 0, arg("replicates") = 999,
           "(mean, low, high, se), each (nq,): pointwise bands, \"asymptotic\" or \"bootstrap\" (wild).")
      .def(
          "r_squared",
          [](const attn::KernelRegression& reg, py::object bw_obj) {
            Call call("KernelReg.r_squared", kreg_renames());
            const std::vector<double> bw = bandwidths_of(call, bw_obj);
            double r2 = 0;
            call.run([&] { r2 = reg.r_squared(bw); });
            return r2;
          },
          arg("bw"), "statsmodels' R^2 at bw: corr(y, m(x))^2 around the mean of the fitted values.");

  m.def(
      "plug_in_bandwidth",
      [](py::object x_obj, py::object y_obj) {
        Call call("plug_in_bandwidth", {});
        const Float64 x = float64_array(call, x_obj, "x");
        const Float64 y = float64_array(call, y_obj, "y");
        if (x.ndim() != 1 || y.ndim() != 1 || x.shape(0) != y.shape(0))
          call.value_error("x has shape " + shape_text(x) + " and y " + shape_text(y) +
                           "; they must be 1-D of one length (one continuous regressor)");
        const std::span<const double> xs(x.data(), static_cast<std::size_t>(x.size()));
        const std::span<const double> ys(y.data(), static_cast<std::size_t>(y.size()));
        double h = 0;
        call.run([&] { h = attn::plug_in_bandwidth(xs, ys); });
        return h;
      },
      arg("x"), arg("y"),
      R"(The direct plug-in bandwidth of Ruppert, Sheather and Wand (1995) for local linear regression
with the Gaussian kernel and one continuous regressor, as R's KernSmooth::dpill computes it (binned:
401 bins, blocks by Mallows' Cp, 1% of the points trimmed at each end, 5% of the grid for the
curvature). x (n,), y (n,), n >= 6; returns h, the Gaussian's standard deviation, usable as
attn.KernelReg(y, x, "c", bw=[h]).)");
}

}  // namespace attn_py
