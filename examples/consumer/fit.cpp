// A consumer of the installed attn::train and attn::io: the width of Nadaraya-Watson regression of
// y = sin(x) chosen by leave-one-out cross-validation (attn::train), and the points written to a
// .npy file and read back (attn::io). Run as `fit FILE.npy`.
#include <cmath>
#include <cstdio>
#include <string>

#include "attn/npy.hpp"
#include "attn/width_selection.hpp"

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : "fit.npy";
  // x (40, 1) spread over [0, 6), y (40, 1) = sin(x).
  attn::Tensor<double> x({40, 1}), y({40, 1});
  for (int i = 0; i < 40; ++i) {
    x.data()[i] = 0.15 * i;
    y.data()[i] = std::sin(x.data()[i]);
  }
  const attn::WidthSelection chosen = attn::select_width<double>(x.cview(), y.cview(), attn::Kernel::gaussian);

  attn::io::write_npy(path, x);
  const attn::Tensor<double> back = attn::io::read_npy(path).to_tensor<double>(path);
  bool same = back.shape_string() == x.shape_string();
  for (int i = 0; same && i < 40; ++i) same = back.data()[i] == x.data()[i];

  std::printf("width %.3g (leave-one-out squared error %.3g); %s read back %s\n", chosen.widths[0], chosen.loo_error,
              path.c_str(), same ? "unchanged" : "CHANGED");
  return same && chosen.widths[0] > 0 && chosen.loo_error < 0.01 ? 0 : 1;
}
