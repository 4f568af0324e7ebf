// Ticks, labels and frames shared by the heatmap and plot layouts (see figure.hpp).
#include "io/figure.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace attn::io::figure {
namespace {

// printf into a std::string, for one number.
std::string format(const char* spec, int precision, double v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, spec, precision, v);
  std::string s = buf;
  return s == "-0" ? "0" : s;
}

// The next round step after `step` (itself 1, 2 or 5 times a power of ten): 1 -> 2 -> 5 -> 10.
double next_step(double step) {
  const double power = std::pow(10.0, std::floor(std::log10(step) + 1e-9));
  const double mantissa = std::round(step / power);
  return (mantissa < 1.5 ? 2 : mantissa < 3.5 ? 5 : 10) * power;
}

// How many multiples of `step` lie in [lo, hi].
double tick_count(double lo, double hi, double step) { return std::floor(hi / step + 1e-9) - std::ceil(lo / step - 1e-9) + 1; }

}  // namespace

Ticks nice_ticks(double lo, double hi, int target) {
  Ticks ticks;
  if (!(hi > lo)) {  // one value: one tick
    ticks.values = {lo};
    ticks.labels = {format("%.*g", 4, lo)};
    return ticks;
  }
  // The finest round step that gives at most target + 1 ticks.
  double step = std::pow(10.0, std::floor(std::log10((hi - lo) / std::max(1, target))) - 1);
  while (tick_count(lo, hi, step) > target + 1) step = next_step(step);
  const double magnitude = std::max(std::abs(lo), std::abs(hi));
  const bool scientific = magnitude >= 1e5 || step < 1e-4;
  const int decimals = std::max(0, static_cast<int>(-std::floor(std::log10(step) + 1e-9)));
  for (double k = std::ceil(lo / step - 1e-9); k * step <= hi + step * 1e-9; k += 1) {
    const double v = k * step == 0 ? 0.0 : k * step;  // never "-0.0"
    ticks.values.push_back(v);
    ticks.labels.push_back(scientific ? format("%.*g", 3, v) : format("%.*f", decimals, v));
  }
  return ticks;
}

Ticks index_ticks(long count, double cell, double min_spacing) {
  long step = 1;
  for (long power = 1; step * cell < min_spacing && power < count; power *= 10) {
    for (long m : {1L, 2L, 5L}) {
      step = m * power;
      if (step * cell >= min_spacing) break;
    }
  }
  Ticks ticks;
  for (long i = 0; i < count; i += step) {
    ticks.values.push_back(static_cast<double>(i));
    ticks.labels.push_back(std::to_string(i));
  }
  return ticks;
}

double widest(const std::vector<std::string>& labels, double size) {
  double w = 0;
  for (const std::string& label : labels) w = std::max(w, draw::text_width(label, size));
  return w;
}

void frame(draw::Canvas& canvas, double x, double y, double w, double h) {
  const draw::Point corners[] = {{x, y}, {x + w, y}, {x + w, y + h}, {x, y + h}, {x, y}};
  canvas.polyline(corners, kInk, kFrameWidth);
}

void tick(draw::Canvas& canvas, double pos, double edge, const std::string& label, Side side) {
  if (side != Side::bottom) {
    const double out = side == Side::left ? -1 : 1;  // the direction away from the frame
    const draw::Point mark[] = {{edge, pos}, {edge + out * kTickLength, pos}};
    canvas.polyline(mark, kInk, kFrameWidth);
    if (!label.empty())
      canvas.text(edge + out * (kTickLength + kGap / 2), pos + draw::kCapHeight * kTickFont / 2, label, kTickFont, kInk,
                side == Side::left ? draw::Anchor::end : draw::Anchor::start);
  } else {
    const draw::Point mark[] = {{pos, edge}, {pos, edge + kTickLength}};
    canvas.polyline(mark, kInk, kFrameWidth);
    if (!label.empty())
      canvas.text(pos, edge + kTickLength + kGap / 2 + draw::kAscent * kTickFont, label, kTickFont, kInk,
                draw::Anchor::middle);
  }
}

}  // namespace attn::io::figure
