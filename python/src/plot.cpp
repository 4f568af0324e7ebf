// show_heatmaps (d2l.show_heatmaps) and plot (curves, such as training losses), drawn by
// attn's renderer (attn/plot.hpp), the one the command line uses, into an SVG or PNG file instead of a
// matplotlib window.
#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "attn/plot.hpp"
#include "bindings.hpp"
#include "call.hpp"

namespace attn_py {
namespace {

py::str show_heatmaps(py::object matrices, py::object xlabel, py::object ylabel, py::object titles, py::object path,
                      py::object cmap) {
  // A str or an os.PathLike (pathlib.Path); its errors ("out.txt: cannot tell the picture format")
  // start with the path itself, which the messages then call `path`.
  if (path.is_none()) Call("show_heatmaps", {}).type_error("path is required: the .svg or .png file to write");
  const std::string file = Call("show_heatmaps", {}).text(py::module_::import("os").attr("fspath")(path), "path");
  Call call("show_heatmaps", {{file, "path \"" + file + "\""}, {"unknown colormap", "cmap: unknown colormap"}});
  const py::array m = call.floating(matrices, "matrices");
  attn::io::HeatmapOptions options;
  options.xlabel = call.text(xlabel, "xlabel");
  options.ylabel = call.text(ylabel, "ylabel");
  options.colormap = call.text(cmap, "cmap");
  if (!titles.is_none()) {
    if (py::isinstance<py::str>(titles) || !py::isinstance<py::sequence>(titles))
      call.type_error("titles must be a list of str, one per column or per heatmap");
    for (py::handle title : titles) options.titles.push_back(call.text(title, "each title"));
  }
  dispatch(call.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const auto view = cview<T>(m);
    call.run([&] { attn::io::write_heatmaps<T>(file, view, options); });
  });
  return py::str(file);
}

// plot: line plots of named curves (attn::io::write_plot), e.g. training losses.
py::str plot(py::object path, py::dict curves, py::object title, py::object xlabel, py::object ylabel) {
  if (path.is_none()) Call("plot", {}).type_error("path is required: the .svg or .png file to write");
  const std::string file = Call("plot", {}).text(py::module_::import("os").attr("fspath")(path), "path");
  Call call("plot", {{file, "path \"" + file + "\""}});
  attn::io::PlotOptions options;
  options.title = call.text(title, "title");
  options.xlabel = call.text(xlabel, "xlabel");
  options.ylabel = call.text(ylabel, "ylabel");
  std::vector<attn::io::Series> series;
  auto numbers = [&](py::handle values, const std::string& what) {
    const py::array a = py::module_::import("numpy").attr("asarray")(values, py::arg("dtype") = "float64");
    if (a.ndim() != 1) call.value_error(what + " must be 1-D; got " + std::to_string(a.ndim()) + " dimensions");
    const double* data = static_cast<const double*>(a.data());
    return std::vector<double>(data, data + a.size());
  };
  for (const auto& [label, curve] : curves) {
    const std::string name = call.text(label, "each label of curves");
    if (!py::isinstance<py::sequence>(curve) || py::len(curve) != 2)
      call.type_error("curves[\"" + name + "\"] must be a pair (x, y)");
    const py::sequence xy = py::reinterpret_borrow<py::sequence>(curve);
    attn::io::Series line;
    line.label = name;
    line.x = numbers(xy[0], "curves[\"" + name + "\"] x");
    line.y = numbers(xy[1], "curves[\"" + name + "\"] y");
    series.push_back(std::move(line));
  }
  call.run([&] { attn::io::write_plot(file, series, options); });
  return py::str(file);
}

}  // namespace

void bind_plot(py::module_& m) {
  using py::arg;
  m.def("show_heatmaps", &show_heatmaps, arg("matrices"), arg("xlabel") = "Keys", arg("ylabel") = "Queries",
        arg("titles") = py::none(), py::kw_only(), arg("path") = py::none(), arg("cmap") = "Reds",
        R"(d2l.show_heatmaps into a file: a grid of heatmaps with one colorbar, as the command line draws them.

matrices: (rows, cols, n, m), (cols, n, m) or (n, m); heatmap (r, c) shows an n x m matrix, row i (a
  query) from the top, column j (a key) from the left. The d2l chapter calls it on
  attention.attention_weights.reshape((1, 1, 2, 10)).
xlabel, ylabel: under the bottom row and left of the first column.
titles: None, one title per column, or one per heatmap (row-major).
path (keyword, required): the file, ".svg" or ".png" (PNG text needs Debian's fonts-dejavu-core).
cmap: "Reds" (the d2l chapter's), "Blues", "Greens", "Greys", "Oranges", "Purples" or "viridis".
Returns the path written.)");

  m.def("plot", &plot, arg("path"), arg("curves"), py::kw_only(), arg("title") = "", arg("xlabel") = "",
        arg("ylabel") = "",
        R"(Line plots into a file (".svg" or ".png"), drawn by attn's renderer, the one the command line uses.

curves: a dict {label: (x, y)} of 1-D sequences of equal length, one line each, in matplotlib's default
colours; non-finite points break a line. Returns the path written.)");
}

}  // namespace attn_py
