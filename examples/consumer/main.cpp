// A consumer of the installed attn: one causal scaled dot-product attention through the public API,
// checked against the formula written out by hand, and the versions of the headers and the library.
#include <cmath>
#include <cstdio>
#include <string_view>

#include "attn/attn.hpp"

int main() {
  // queries, keys, values (1, 3, 2): query i attends keys 0..i (causal, top-left).
  attn::Tensor<float> q({1, 3, 2}), k({1, 3, 2}), v({1, 3, 2});
  for (int i = 0; i < 6; ++i) {
    q.data()[i] = 0.1f * static_cast<float>(i);
    k.data()[i] = 0.2f * static_cast<float>(5 - i);
    v.data()[i] = static_cast<float>(i * i);
  }
  attn::Mask<float> mask;
  mask.causal = attn::Causal::top_left;
  const attn::Tensor<float> out = attn::scaled_dot_product_attention<float>(q.view(), k.view(), v.view(), mask);

  double worst = 0;
  const double scale = 1 / std::sqrt(2.0);
  for (int i = 0; i < 3; ++i) {
    double weights[3] = {}, total = 0;
    for (int j = 0; j <= i; ++j) {
      const double score = (q.data()[2 * i] * k.data()[2 * j] + q.data()[2 * i + 1] * k.data()[2 * j + 1]) * scale;
      total += weights[j] = std::exp(score);
    }
    for (int c = 0; c < 2; ++c) {
      double expected = 0;
      for (int j = 0; j <= i; ++j) expected += weights[j] / total * v.data()[2 * j + c];
      worst = std::fmax(worst, std::fabs(expected - out.data()[2 * i + c]));
    }
  }
  std::printf("attn headers %s, library %s; causal attention off the formula by %.3g\n", ATTN_VERSION_STRING,
              attn::version(), worst);
  return worst < 1e-5 && std::string_view(attn::version()) == ATTN_VERSION_STRING ? 0 : 1;
}
