// Whether strided tensors share memory (api/checks.hpp, require_no_aliasing).
//
// Both questions have a fast answer for the layouts callers use: a tensor whose strides, sorted,
// each step over everything the smaller ones span cannot overlap itself, and two tensors whose byte
// ranges are disjoint cannot overlap each other. Only when those fail is the tensor cut into its
// rows (every index but the last, whose elements lie contiguously), and the rows' intervals sorted
// and compared: exact, and O(rows log rows) on layouts that are rare.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "api/checks.hpp"

namespace attn::detail {
namespace {

// An interval [lo, hi) of byte addresses.
struct Interval {
  std::uintptr_t lo, hi;
};

// At most this many rows are compared one by one (16 bytes each): past it a layout whose strides
// interleave is refused rather than checked.
constexpr index_t kMaxRowsChecked = index_t(1) << 22;

index_t count(const Footprint& f) {
  index_t n = 1;
  for (int i = 0; i < f.rank; ++i) n *= f.dims[i];
  return n;
}

// The bytes from the first element to one past the last.
Interval range(const Footprint& f) {
  std::uintptr_t span = 1;  // in elements
  for (int i = 0; i < f.rank; ++i)
    if (f.dims[i] > 1) span += static_cast<std::uintptr_t>((f.dims[i] - 1) * f.strides[i]);
  const auto lo = reinterpret_cast<std::uintptr_t>(f.data);
  return {lo, lo + span * f.item};
}

// No two elements share memory: every dimension longer than 1, in ascending order of stride, steps
// over everything the dimensions before it span. Sufficient, not necessary.
bool strides_nest(const Footprint& f) {
  std::vector<std::pair<index_t, index_t>> dims;  // (stride, size)
  for (int i = 0; i < f.rank; ++i)
    if (f.dims[i] > 1) dims.emplace_back(f.strides[i], f.dims[i]);
  std::sort(dims.begin(), dims.end());
  index_t span = 1;
  for (const auto& [stride, size] : dims) {
    if (stride < span) return false;
    span = stride * (size - 1) + span;
  }
  return true;
}

// The byte intervals of every row of f (each row: its last dimension, contiguous), sorted by start.
std::vector<Interval> rows(const Footprint& f, const char* op, const char* name) {
  const index_t row_elems = f.rank > 0 ? f.dims[f.rank - 1] : 1;
  const index_t n_rows = row_elems > 0 ? count(f) / row_elems : 0;
  if (n_rows > kMaxRowsChecked)
    fail(op, ": ", name, " has ", n_rows, " rows and strides whose order interleaves its dimensions; attn checks such ",
         "layouts for overlapping memory up to ", kMaxRowsChecked, " rows: pass a layout whose strides are ordered");
  std::vector<Interval> out;
  out.reserve(static_cast<std::size_t>(n_rows));
  index_t idx[kMaxRank] = {0, 0, 0, 0};
  const auto base = reinterpret_cast<std::uintptr_t>(f.data);
  const auto row_bytes = static_cast<std::uintptr_t>(row_elems) * f.item;
  for (index_t r = 0; r < n_rows; ++r) {
    index_t off = 0;
    for (int i = 0; i + 1 < f.rank; ++i) off += idx[i] * f.strides[i];
    const std::uintptr_t lo = base + static_cast<std::uintptr_t>(off) * f.item;
    out.push_back({lo, lo + row_bytes});
    for (int i = f.rank - 2; i >= 0; --i) {  // next row index, last dimension fastest
      if (++idx[i] < f.dims[i]) break;
      idx[i] = 0;
    }
  }
  std::sort(out.begin(), out.end(), [](const Interval& a, const Interval& b) { return a.lo < b.lo; });
  return out;
}

}  // namespace

bool overlaps_itself(const Footprint& f, const char* op, const char* name) {
  if (count(f) <= 1 || strides_nest(f)) return false;
  const std::vector<Interval> r = rows(f, op, name);
  for (std::size_t i = 1; i < r.size(); ++i)
    if (r[i].lo < r[i - 1].hi) return true;
  return false;
}

bool overlap(const Footprint& a, const char* a_name, const Footprint& b, const char* b_name, const char* op) {
  if (count(a) == 0 || count(b) == 0) return false;
  const Interval ra = range(a), rb = range(b);
  if (ra.hi <= rb.lo || rb.hi <= ra.lo) return false;
  // Ranges that intersect: compare the rows. A row of b meets a row of a when some row of a starts
  // before its end and ends after its start; `reach` is the furthest end of a's rows so far.
  const std::vector<Interval> rows_a = rows(a, op, a_name), rows_b = rows(b, op, b_name);
  std::vector<std::uintptr_t> reach(rows_a.size());
  std::uintptr_t furthest = 0;
  for (std::size_t i = 0; i < rows_a.size(); ++i) reach[i] = furthest = std::max(furthest, rows_a[i].hi);
  for (const Interval& row : rows_b) {
    const auto after = std::lower_bound(rows_a.begin(), rows_a.end(), row.hi,
                                        [](const Interval& x, std::uintptr_t v) { return x.lo < v; });
    if (after != rows_a.begin() && reach[static_cast<std::size_t>(after - rows_a.begin() - 1)] > row.lo) return true;
  }
  return false;
}

}  // namespace attn::detail
