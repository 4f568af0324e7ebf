// What the heatmap and plot layouts share: the look (font sizes, line widths, colours, in
// matplotlib's spirit), axis ticks at round numbers and their labels, and the axes' frame.
#pragma once

#include <string>
#include <vector>

#include "io/canvas.hpp"

namespace attn::io::figure {

inline constexpr double kTickFont = 11;   // tick labels
inline constexpr double kLabelFont = 12;  // axis labels, legend entries
inline constexpr double kTitleFont = 13;  // titles above a heatmap or plot
inline constexpr double kTickLength = 4;  // ticks point out of the frame
inline constexpr double kGap = 5;         // between a tick, its label and the axis label
inline constexpr double kFrameWidth = 0.8;
inline constexpr draw::Color kInk{38, 38, 38, 255};  // text, frames and ticks: near-black

// The height a line of text of font `size` takes: ascent and descent, so nothing is clipped.
inline double line_height(double size) { return (draw::kAscent + draw::kDescent) * size; }

// Tick positions at round numbers (1, 2 or 5 times a power of ten apart) inside [lo, hi], as many
// as the finest such step gives without exceeding target + 1, with their labels: as many decimals as the step
// needs ("0.25" is not a step; "0.2", "0.4"), or %g when the numbers are very large or small.
struct Ticks {
  std::vector<double> values;
  std::vector<std::string> labels;
};
Ticks nice_ticks(double lo, double hi, int target);

// The integers 0, step, 2 step, ... below `count`, for the rows or columns of a heatmap: the
// smallest step of 1, 2, 5, 10, 20, ... that leaves `min_spacing` units between neighbours spaced
// `cell` units apart.
Ticks index_ticks(long count, double cell, double min_spacing);

// The widest of the labels at font `size`.
double widest(const std::vector<std::string>& labels, double size);

// The frame around the axes' area (x, y, w, h).
void frame(draw::Canvas& canvas, double x, double y, double w, double h);

// A tick mark from the frame's edge outwards and its label: below the bottom edge at x = pos, or
// beside the left or right edge at y = pos. `edge` is the frame's y (bottom) or x (left, right).
enum class Side { bottom, left, right };
void tick(draw::Canvas& canvas, double pos, double edge, const std::string& label, Side side);

// The room a tick and its label take beside the frame: below it (bottom, one line of text), or
// beside it (left, right) for labels `label_width` wide.
inline double tick_room(Side side, double label_width = 0) {
  return kTickLength + kGap / 2 + (side == Side::bottom ? line_height(kTickFont) : label_width);
}

}  // namespace attn::io::figure
