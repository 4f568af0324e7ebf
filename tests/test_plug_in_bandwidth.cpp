// attn::plug_in_bandwidth (attn/kernel_regression.hpp), KernSmooth's dpill: values printed by R 4.2 with
// KernSmooth 2.23 for data both sides generate from the same integer recurrence (so R is not needed
// here), the equivariances the rule has (scale of x; shifts of x and y; the order of the points, ties
// included), and one test per argument check and degenerate case.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "attn/kernel_regression.hpp"
#include "support/testing.hpp"

namespace attn {
namespace {

using testing::expect_error;

// u in [0, 1): s <- (69069 s + 1) mod 2^32, u = s / 2^32. Every step is exact in float64, so R's
// doubles give the same numbers:
//   lcg <- function(n, s) { u <- numeric(n); for (i in 1:n) { s <- (69069 * s + 1) %% 4294967296;
//                           u[i] <- s / 4294967296 }; u }
std::vector<double> lcg(int n, std::uint64_t s) {
  std::vector<double> u(n);
  for (double& v : u) {
    s = (69069 * s + 1) % 4294967296ULL;
    v = static_cast<double>(s) / 4294967296.0;
  }
  return u;
}

struct Data {
  std::vector<double> x, y;
};

// x = fx(u), y = fy(x) + sd (u1 + u2 + u3 - 1.5), the three u's per point from their own recurrence:
//   noise <- function(n, s) colSums(matrix(lcg(3 * n, s), nrow = 3)) - 1.5
Data make(int n, std::uint64_t sx, std::uint64_t sy, const std::function<double(double)>& fx,
          const std::function<double(double)>& fy, double sd) {
  Data d;
  const std::vector<double> u = lcg(n, sx), e = lcg(3 * n, sy);
  for (int i = 0; i < n; ++i) {
    d.x.push_back(fx(u[i]));
    d.y.push_back(fy(d.x.back()) + sd * (e[3 * i] + e[3 * i + 1] + e[3 * i + 2] - 1.5));
  }
  return d;
}

// The four data sets of the R check, as R wrote them: x <- fx(lcg(n, 1000 + k)),
// y <- fy(x) + sd * noise(n, 2000 + k), and dpill(x, y) printed with %.17g.
struct Golden {
  Data data;
  double dpill;
};

std::vector<Golden> goldens() {
  return {
      {make(30, 1001, 2001, [](double u) { return u; }, [](double x) { return std::sin(6 * x); }, 0.3),
       0.043167433838523533},
      {make(200, 1002, 2002, [](double u) { return 6 * u - 3; }, [](double x) { return x * x * x - x; }, 1.0),
       0.12782863651988202},
      {make(1000, 1003, 2003, [](double u) { return 5 * u * u; }, [](double x) { return 10 * std::exp(-x); }, 0.5),
       0.098660831709615482},
      {make(5000, 1004, 2004, [](double u) { return 4 * u - 2; }, [](double x) { return std::tanh(3 * x); }, 0.3),
       0.06155433776666476},
  };
}

double rel(double a, double b) { return std::abs(a - b) / std::abs(b); }

TEST(PlugInBandwidth, MatchesKernSmoothDpill) {
  // Measured agreement on these and 40 other data sets: 1e-13 relative or better; 1e-9 leaves room
  // for another libm's sin, exp and tanh in the data and pow in the rule.
  for (const Golden& g : goldens()) {
    const double h = plug_in_bandwidth(g.data.x, g.data.y);
    EXPECT_LT(rel(h, g.dpill), 1e-9) << "n = " << g.data.x.size() << ": " << h << " against dpill's " << g.dpill;
  }
}

TEST(PlugInBandwidth, ScalesWithX) {
  // dpi(c x, y) = c dpi(x, y): every step is in x units (the grid, the blocks, the bandwidths).
  for (const Golden& g : goldens()) {
    const double h = plug_in_bandwidth(g.data.x, g.data.y);
    for (double c : {0.001, 2.5, 1000.0}) {
      std::vector<double> xs = g.data.x;
      for (double& v : xs) v *= c;
      EXPECT_LT(rel(plug_in_bandwidth(xs, g.data.y), c * h), 1e-10) << "n = " << xs.size() << ", c = " << c;
    }
  }
}

TEST(PlugInBandwidth, InvariantToTheScaleOfY) {
  // sigma^2 and theta_22 both scale with y^2: y times a power of two gives the same bits, and y of
  // 1e150 or 1e-160 (whose squares pass float64's range) the same bandwidth. (Squared as given, they
  // gave NaN pilot bandwidths or an infinite sigma^2.)
  for (const Golden& g : goldens()) {
    const double h = plug_in_bandwidth(g.data.x, g.data.y);
    for (double c : {0x1p500, 0x1p-500, 1e150, 1e-160, 3.0}) {
      std::vector<double> ys = g.data.y;
      for (double& v : ys) v *= c;
      const double got = plug_in_bandwidth(g.data.x, ys);
      if (c == 0x1p500 || c == 0x1p-500)
        EXPECT_EQ(got, h) << "y times " << c << ", n = " << ys.size();
      else
        EXPECT_LT(rel(got, h), 1e-9) << "y times " << c << ", n = " << ys.size();
    }
  }
}

TEST(PlugInBandwidth, InvariantToShifts) {
  // The quartic blocks are fitted about their own centre and y is centred, so a shift far from the
  // data's spread costs no digits (R's raw powers of x lose 1e-5 relative at x + 100 on [0, 1]).
  for (const Golden& g : goldens()) {
    const double h = plug_in_bandwidth(g.data.x, g.data.y);
    for (double c : {-7.0, 100.0, 1000.0}) {
      std::vector<double> xs = g.data.x, ys = g.data.y;
      for (double& v : xs) v += c;
      for (double& v : ys) v += 100 * c;
      EXPECT_LT(rel(plug_in_bandwidth(xs, g.data.y), h), 1e-9) << "x + " << c << ", n = " << xs.size();
      EXPECT_LT(rel(plug_in_bandwidth(g.data.x, ys), h), 1e-9) << "y + " << 100 * c << ", n = " << xs.size();
    }
  }
}

TEST(PlugInBandwidth, InvariantToOrderTiesIncluded) {
  // Points are sorted by x and then y, so any order of the input gives the same bits, also where x has
  // ties across the trimmed ends and the block edges (x on a grid of 51 values, 600 points).
  Data tied = make(600, 7, 8, [](double u) { return std::round(50 * u) / 50; }, [](double x) { return x * x; }, 0.1);
  std::vector<Data> sets = {goldens()[1].data, goldens()[2].data, tied};
  for (const Data& d : sets) {
    const double h = plug_in_bandwidth(d.x, d.y);
    std::vector<size_t> p(d.x.size());
    std::iota(p.begin(), p.end(), size_t{0});
    for (int round = 0; round < 3; ++round) {
      // A fixed shuffle: reverse, then interleave the halves.
      if (round == 0) std::reverse(p.begin(), p.end());
      else {
        std::vector<size_t> q;
        const size_t half = p.size() / 2;
        for (size_t i = 0; i < half; ++i) q.push_back(p[half + i]), q.push_back(p[i]);
        for (size_t i = 2 * half; i < p.size(); ++i) q.push_back(p[i]);
        p = q;
      }
      Data s;
      for (size_t i : p) s.x.push_back(d.x[i]), s.y.push_back(d.y[i]);
      EXPECT_EQ(plug_in_bandwidth(s.x, s.y), h) << "n = " << d.x.size() << ", order " << round;
    }
  }
}

TEST(PlugInBandwidth, SixPoints) {
  // Six points is the least the quartic pilot fit allows (dpill fails at 5: sigma^2 is 0 / 0).
  // R: dpill(1:6, c(1, 3, 2, 5, 4, 7)).
  const std::vector<double> x = {1, 2, 3, 4, 5, 6}, y = {1, 3, 2, 5, 4, 7};
  EXPECT_LT(rel(plug_in_bandwidth(x, y), 0.92986268606551092), 1e-9);
}

TEST(PlugInBandwidth, ArgumentErrors) {
  const Data d = goldens()[1].data;
  const std::vector<double> shorter(d.y.begin(), d.y.end() - 1);
  expect_error([&] { plug_in_bandwidth(d.x, shorter); }, {"plug_in_bandwidth", "x has 200 points but y has 199"});
  const std::vector<double> five = {0, 1, 2, 3, 4};
  expect_error([&] { plug_in_bandwidth(five, five); }, {"plug_in_bandwidth", "x has 5 points", "at least 6"});
  expect_error([&] { plug_in_bandwidth({}, {}); }, {"plug_in_bandwidth", "x has 0 points"});
  for (double bad : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    std::vector<double> x = d.x, y = d.y;
    x[17] = bad;
    expect_error([&] { plug_in_bandwidth(x, d.y); }, {"plug_in_bandwidth", "x[17]", "not finite"});
    y[3] = -bad;
    expect_error([&] { plug_in_bandwidth(d.x, y); }, {"plug_in_bandwidth", "y[3]", "not finite"});
  }
}

TEST(PlugInBandwidth, DegenerateData) {
  const Data d = goldens()[1].data;
  // x constant; and constant after trimming 1% (2 of 200) at each end.
  const std::vector<double> same(200, 3.0);
  expect_error([&] { plug_in_bandwidth(same, d.y); }, {"plug_in_bandwidth", "x has zero spread"});
  std::vector<double> trimmed(200, 1.0);
  trimmed[0] = -5, trimmed[199] = 5;
  expect_error([&] { plug_in_bandwidth(trimmed, d.y); }, {"x has zero spread after trimming"});
  // Four distinct x values: the quartic blocks are singular.
  std::vector<double> four(40);
  for (size_t i = 0; i < four.size(); ++i) four[i] = static_cast<double>(i % 4);
  expect_error([&] { plug_in_bandwidth(four, std::vector<double>(d.y.begin(), d.y.begin() + 40)); },
               {"plug_in_bandwidth", "x has 4 distinct values", "at least 5"});
  // y constant: sigma^2 is 0.
  expect_error([&] { plug_in_bandwidth(d.x, std::vector<double>(200, 2.0)); },
               {"plug_in_bandwidth", "sigma^2", "positive"});
  // A point 10 spreads from the rest: its local fit has nothing else in its window (R: NaN).
  Data far = make(49, 5, 6, [](double u) { return u; }, [](double x) { return std::sin(6 * x); }, 0.3);
  far.x.push_back(10.0), far.y.push_back(0.0);
  expect_error([&] { plug_in_bandwidth(far.x, far.y); }, {"plug_in_bandwidth", "occupied bins", "x = 10"});
}

}  // namespace
}  // namespace attn
