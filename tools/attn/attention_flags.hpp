// The flags that the attention commands (softmax, sdpa, additive) share, declared, described and
// read in one place so that they mean the same everywhere, and the writing of their outputs.
#pragma once

#include <cstdint>
#include <string>

#include "attn/dropout.hpp"
#include "attn/tensor.hpp"
#include "npy_inputs.hpp"
#include "progress.hpp"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace attn_cli {

// Checks that a seed flag's text is a whole number from 0 to 2^64 - 1 (CLI11 reads "-1" into an
// unsigned seed as 2^64 - 1 and saturates larger numbers). Used by --seed here and by attn kreg's.
void check_seed(CLI::Option& option);

// --queries Q.npy --keys K.npy --values V.npy (required), of one float type.
struct QkvFlags {
  std::string queries, keys, values;

  // query_size and key_size name the last dimensions in the help: "d" and "d" for dot products;
  // float_types the types the command reads, "float32 or float64" unless it names others.
  void add_to(CLI::App& command, const std::string& query_size, const std::string& key_size,
              const std::string& float_types = "float32 or float64");
  struct Inputs {
    NpyInput queries, keys, values;
  };
  Inputs read() const;
};

// --valid-lens L.npy, --mask M.npy, --causal.
struct MaskFlags {
  std::string valid_lens, keep;
  bool causal = false;

  void add_to(CLI::App& command);
  MaskInputs read() const { return MaskInputs::read(valid_lens, keep, causal); }
};

// --dropout P --seed N, each needing the other; without them nothing is dropped.
struct DropoutFlags {
  double p = 0;
  std::uint64_t seed = 0;

  void add_to(CLI::App& command);
  attn::Dropout dropout() const { return {p, seed}; }
};

// --out O.npy (required), --weights W.npy, --heatmap FILE.svg|FILE.png.
struct OutputFlags {
  std::string out, weights, heatmap;

  void add_to(CLI::App& command, const std::string& out_description);
  // Whether the attention weights must be computed: they are written or drawn.
  bool wants_weights() const { return !weights.empty() || !heatmap.empty(); }

  // Writes out and, as asked, the weights (B, n, m) or (B, H, n, m) and their heatmaps: one per
  // batch element (a row of the grid) and head (a column). Failures: attn::Error (exit code 1).
  template <class T>
  void write(const attn::Tensor<T>& out, const attn::Tensor<T>& weights, Progress& progress) const;
};

// A CLI11 check for a picture's path: it must end in .svg or .png (else a usage error, before any
// work is done).
void check_picture_path(CLI::Option& option);

}  // namespace attn_cli
