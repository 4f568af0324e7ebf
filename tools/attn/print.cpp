// Tensor printing: see print.hpp for the layout and the number format.
#include "print.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>

namespace attn_cli {
namespace {

// The printed text of one element, split at the decimal point so columns can align on it:
// "13.25" -> {"13", ".25"}, "2" -> {"2", ""}, "nan" -> {"nan", ""}.
struct Cell {
  std::string whole;
  std::string frac;
};

// printf into a std::string (numbers only, so 64 characters are plenty).
template <class... Args>
std::string sprint(const char* format, Args... args) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, args...);
  return buf;
}

// Drops the trailing zeros of a fixed-point number, then a bare trailing '.'; "-0" becomes "0".
std::string trim_zeros(std::string s) {
  if (s.find('.') != std::string::npos) {
    s.erase(s.find_last_not_of('0') + 1);
    if (s.back() == '.') s.pop_back();
  }
  return s == "-0" ? "0" : s;
}

// How the elements of a tensor are written: fixed-point with `digits` significant digits each,
// or, when the magnitudes would need more than 5 integer digits or more than 3 leading zeros,
// scientific notation for all of them (a column of mixed notations would not align).
struct NumberFormat {
  bool scientific = false;
  int digits = 4;

  NumberFormat(const std::vector<double>& values, int significant) : digits(significant) {
    for (double v : values)
      if (std::isfinite(v) && v != 0) scientific = scientific || std::abs(v) >= 1e5 || std::abs(v) < 1e-4;
  }

  Cell cell(double v) const {
    std::string s;
    if (std::isnan(v))
      s = "nan";
    else if (std::isinf(v))
      s = v > 0 ? "inf" : "-inf";
    else if (v == 0)
      s = "0";
    else if (scientific)
      s = sprint("%.*e", digits - 1, v);
    else  // digits - 1 decimals for 1.234, digits for 0.1234, ...
      s = trim_zeros(sprint("%.*f", std::max(0, digits - 1 - static_cast<int>(std::floor(std::log10(std::abs(v))))), v));
    const std::size_t dot = scientific ? std::string::npos : s.find('.');
    if (dot == std::string::npos) return {s, ""};
    return {s.substr(0, dot), s.substr(dot)};
  }
};

// Renders the sub-tensor of dimension `dim` starting at element `offset` into `out`.
// `cells` are already padded to a common width. Blocks of dimension d are separated by a comma,
// a newline, one blank line per dimension below d+1 (PyTorch's layout) and the indentation.
struct Renderer {
  const std::vector<attn::index_t>& shape;
  const std::vector<std::string>& cells;
  int column;  // where the outermost '[' stands, counted from the start of the line
  std::string out;

  attn::index_t block_size(std::size_t dim) const {
    attn::index_t n = 1;
    for (std::size_t d = dim; d < shape.size(); ++d) n *= shape[d];
    return n;
  }

  void render(std::size_t dim, attn::index_t offset) {
    out += '[';
    const bool last = dim + 1 == shape.size();
    const attn::index_t step = last ? 1 : block_size(dim + 1);
    for (attn::index_t i = 0; i < shape[dim]; ++i) {
      if (i > 0) {
        if (last) {
          out += ", ";
        } else {
          out += ',';
          out.append(shape.size() - dim - 1, '\n');
          out.append(static_cast<std::size_t>(column) + dim + 1, ' ');
        }
      }
      if (last)
        out += cells[static_cast<std::size_t>(offset + i)];
      else
        render(dim + 1, offset + i * step);
    }
    out += ']';
  }
};

}  // namespace

std::string format_shape(std::span<const attn::index_t> shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i > 0 ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

std::vector<std::string> format_column(const std::vector<double>& values, int digits) {
  // Format every element, then pad: integer parts to the right, fractions to the left, so that
  // the decimal points line up.
  const NumberFormat format(values, digits);
  std::vector<Cell> parts;
  std::size_t whole_width = 0, frac_width = 0;
  for (double v : values) {
    parts.push_back(format.cell(v));
    whole_width = std::max(whole_width, parts.back().whole.size());
    frac_width = std::max(frac_width, parts.back().frac.size());
  }
  std::vector<std::string> cells;
  for (const Cell& c : parts)
    cells.push_back(std::string(whole_width - c.whole.size(), ' ') + c.whole + c.frac +
                    std::string(frac_width - c.frac.size(), ' '));
  return cells;
}

void print_table(std::ostream& os, const std::vector<std::string>& headers,
                 const std::vector<std::vector<std::string>>& columns) {
  std::vector<std::size_t> widths;
  for (std::size_t c = 0; c < columns.size(); ++c) {
    widths.push_back(headers[c].size());
    for (const std::string& cell : columns[c]) widths[c] = std::max(widths[c], cell.size());
  }
  // Row -1 is the header line.
  const auto rows = static_cast<std::ptrdiff_t>(columns.empty() ? 0 : columns[0].size());
  for (std::ptrdiff_t r = -1; r < rows; ++r) {
    std::string line;
    for (std::size_t c = 0; c < columns.size(); ++c) {
      const std::string& cell = r < 0 ? headers[c] : columns[c][static_cast<std::size_t>(r)];
      const std::string pad(widths[c] - cell.size(), ' ');
      line += c == 0 ? cell + pad : "  " + pad + cell;
    }
    line.erase(line.find_last_not_of(' ') + 1);
    os << line << '\n';
  }
}

std::string format_tensor(const Flat& flat, int digits) {
  const std::vector<std::string> cells = format_column(flat.values, digits);
  if (flat.shape.empty()) return "tensor(" + (cells.empty() ? std::string("0") : cells[0]) + ")";
  Renderer r{flat.shape, cells, 7, ""};  // 7 = the width of "tensor("
  r.render(0, 0);
  return "tensor(" + r.out + ")";
}

}  // namespace attn_cli
