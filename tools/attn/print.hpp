// Printing tensors for people: the nested-bracket layout of PyTorch and NumPy,
//
//   tensor([[[1     , 0     , 0     , 0     ],
//            [0.2648, 0.4207, 0.3145, 0     ]],
//
//           [[0.552 , 0.448 , 0     , 0     ],
//            [0.2636, 0.2515, 0.29  , 0.1949]]])
//
// Every element is rounded to `digits` significant digits of its own, trailing zeros are dropped
// (0.29, not 0.2900; 2, not 2.000) and the columns are aligned on the decimal point, as NumPy's
// default "maxprec" float mode does. Exact zeros therefore print as a bare 0, which makes
// masked-out attention weights stand out. A tensor with a magnitude of 1e5 or more, or a nonzero
// one below 1e-4, is printed in scientific notation throughout.
#pragma once

#include <cstdint>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "attn/tensor.hpp"

namespace attn_cli {

// "(2, 1, 4)": the shape as Python prints a tuple.
std::string format_shape(std::span<const attn::index_t> shape);

// One column of a table, formatted as the elements of a tensor are (common rounding, trailing
// zeros dropped, decimal points aligned): every string has the same width.
std::vector<std::string> format_column(const std::vector<double>& values, int digits = 4);

// The elements of a tensor in C order, as doubles, with their shape: what format_tensor needs,
// whatever the element type and strides of the view.
struct Flat {
  std::vector<attn::index_t> shape;
  std::vector<double> values;
};

template <class T>
Flat flatten(attn::TensorView<const T> view) {
  Flat flat{{view.shape().begin(), view.shape().end()}, {}};
  flat.values.reserve(static_cast<std::size_t>(view.numel()));
  // Walk the index space in C order with an odometer, reading through the strides.
  std::vector<attn::index_t> idx(flat.shape.size(), 0);
  for (attn::index_t k = 0; k < view.numel(); ++k) {
    attn::index_t off = 0;
    for (int d = 0; d < view.rank(); ++d) off += idx[static_cast<std::size_t>(d)] * view.stride(d);
    flat.values.push_back(static_cast<double>(view.data()[off]));
    for (int d = view.rank() - 1; d >= 0 && ++idx[static_cast<std::size_t>(d)] == view.dim(d); --d)
      idx[static_cast<std::size_t>(d)] = 0;
  }
  return flat;
}

// A table, column by column: the first column (labels) left-aligned, the others right-aligned,
// two spaces apart. Every column has as many cells as the first.
void print_table(std::ostream& os, const std::vector<std::string>& headers,
                 const std::vector<std::vector<std::string>>& columns);

// "tensor([[...]])", laid out as in the comment at the top of this file.
std::string format_tensor(const Flat& flat, int digits = 4);

template <class T>
std::string format_tensor(attn::TensorView<const T> view, int digits = 4) {
  return format_tensor(flatten(view), digits);
}

// Two lines and more: "<name>    # shape (2, 1, 4)" and then the tensor.
template <class T>
void print_tensor(std::ostream& os, std::string_view name, attn::TensorView<const T> view) {
  os << name << "    # shape " << format_shape(view.shape()) << '\n' << format_tensor(view) << '\n';
}

}  // namespace attn_cli
