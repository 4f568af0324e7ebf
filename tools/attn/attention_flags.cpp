// The attention commands' shared flags (see attention_flags.hpp).
#include "attention_flags.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>

#include "attn/plot.hpp"

namespace attn_cli {

void QkvFlags::add_to(CLI::App& command, const std::string& query_size, const std::string& key_size,
                      const std::string& float_types) {
  command.add_option("--queries", queries, "queries (B,n," + query_size + ") or (B,H,n," + query_size + "), " + float_types)
      ->type_name("Q.npy")
      ->required();
  command.add_option("--keys", keys, "keys (B,m," + key_size + ") or (B,H,m," + key_size + "), the queries' float type")
      ->type_name("K.npy")
      ->required();
  command.add_option("--values", values, "values (B,m,v) or (B,H,m,v), the queries' float type")
      ->type_name("V.npy")
      ->required();
}

QkvFlags::Inputs QkvFlags::read() const {
  return {read_input("--queries", queries), read_input("--keys", keys), read_input("--values", values)};
}

void MaskFlags::add_to(CLI::App& command) {
  command.add_option("--valid-lens", valid_lens,
                     "valid lengths, int32 or int64, (B,) or (B,n): query i of batch b sees keys 0 .. len-1")
      ->type_name("L.npy");
  command.add_option("--mask", keep,
                     "boolean keep-mask broadcastable to the scores (NumPy rules): true where a query may "
                     "attend to a key")
      ->type_name("M.npy");
  command.add_flag("--causal", causal, "query i sees keys 0 .. i only");
}

void check_seed(CLI::Option& option) {
  option.check(
      [](const std::string& text) -> std::string {
        const bool digits = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
        const std::string max = "18446744073709551615";  // 2^64 - 1
        if (digits && (text.size() < max.size() || (text.size() == max.size() && text <= max))) return "";
        return "the seed \"" + text + "\" must be a whole number from 0 to " + max;
      },
      "", "seed");  // no description: the help shows "--seed N", not "N:SEED"
}

void DropoutFlags::add_to(CLI::App& command) {
  CLI::Option* p_option = command.add_option(
      "--dropout", p, "probability P in [0, 1) of dropping each attention weight (scaled by 1/(1-P) otherwise)");
  p_option->type_name("P");
  CLI::Option* seed_option =
      command.add_option("--seed", seed, "the dropout generator's seed N: the same seed drops the same weights");
  seed_option->type_name("N");
  check_seed(*seed_option);
  // Each needs the other: a dropout without an explicit seed would not be reproducible, and a
  // seed alone would do nothing.
  p_option->needs(seed_option);
  seed_option->needs(p_option);
}

void OutputFlags::add_to(CLI::App& command, const std::string& out_description) {
  command.add_option("--out", out, out_description)->type_name("O.npy")->required();
  command.add_option("--weights", weights, "also write the attention weights, before dropout, (B,n,m) or (B,H,n,m)")
      ->type_name("W.npy");
  check_picture_path(*command.add_option(
      "--heatmap", heatmap, "also draw the attention weights: one heatmap per batch element and head (.svg or .png)"));
}

template <class T>
void OutputFlags::write(const attn::Tensor<T>& out_tensor, const attn::Tensor<T>& weight_tensor,
                        Progress& progress) const {
  progress.stage("writing " + out);
  write_output("--out", out, out_tensor);
  if (!weights.empty()) {
    progress.stage("writing " + weights);
    write_output("--weights", weights, weight_tensor);
  }
  if (heatmap.empty()) return;
  progress.stage("drawing " + heatmap);
  // (B, n, m) is drawn as (B, 1, n, m): a column of heatmaps, one per batch element. Titles only
  // when there is more than one heatmap to tell apart.
  const auto& s = weight_tensor.shape();
  const attn::index_t batch = s[0], heads = s.size() == 4 ? s[1] : 1;
  attn::io::HeatmapOptions options;
  if (batch * heads > 1)
    for (attn::index_t b = 0; b < batch; ++b)
      for (attn::index_t h = 0; h < heads; ++h)
        options.titles.push_back("batch " + std::to_string(b) + (heads > 1 ? ", head " + std::to_string(h) : ""));
  naming_flag("--heatmap", [&] {
    attn::io::write_heatmaps<T>(
        heatmap, attn::TensorView<const T>(weight_tensor.data(), {batch, heads, s[s.size() - 2], s[s.size() - 1]}), options);
  });
}

template void OutputFlags::write<float>(const attn::Tensor<float>&, const attn::Tensor<float>&, Progress&) const;
template void OutputFlags::write<double>(const attn::Tensor<double>&, const attn::Tensor<double>&, Progress&) const;

// Checked while parsing, so that a wrong extension costs no computation and exits with 2 (the
// library would refuse it too, but only when drawing, after the outputs were written).
void check_picture_path(CLI::Option& option) {
  option.check(CLI::Validator(
      [](const std::string& path) -> std::string {
        std::string lower = path;
        std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
        const auto ends_with = [&](const char* ext) {
          return lower.size() > 4 && lower.compare(lower.size() - 4, 4, ext) == 0;
        };
        return ends_with(".svg") || ends_with(".png") ? "" : "the picture " + path + " must end in .svg or .png";
      },
      ""));
  option.type_name("FILE.svg|FILE.png");
}

}  // namespace attn_cli
