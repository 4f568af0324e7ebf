// `attn sdpa`: scaled dot-product attention, softmax(Q K^T * scale) V, as the seeds'
// DotProductAttention, through .npy files.
#include <CLI/CLI.hpp>

#include <memory>

#include "attention_flags.hpp"
#include "attn/sdpa.hpp"
#include "commands.hpp"
#include "exit_codes.hpp"

namespace attn_cli {
namespace {

struct SdpaArgs {
  QkvFlags qkv;
  MaskFlags mask;
  double scale = 0;
  bool has_scale = false;  // --scale was given; otherwise 1/sqrt(d)
  DropoutFlags dropout;
  OutputFlags output;
};

void run_sdpa(const SdpaArgs& args) {
  Progress progress("sdpa");
  progress.stage("reading inputs");
  const QkvFlags::Inputs in = args.qkv.read();
  const MaskInputs masks = args.mask.read();
  with_float_type(common_float_type({&in.queries, &in.keys, &in.values}), [&]<class T>() {
    const attn::Tensor<T> q = to_tensor<T>(in.queries), k = to_tensor<T>(in.keys), v = to_tensor<T>(in.values);
    attn::SdpaOptions options;
    if (args.has_scale) options.scale = args.scale;
    options.dropout = args.dropout.dropout();
    progress.stage("computing");
    attn::Tensor<T> weights;
    const attn::Tensor<T> out = as_usage([&] {
      return attn::scaled_dot_product_attention<T>(q.cview(), k.cview(), v.cview(), masks.mask<T>(), options,
                                                   args.output.wants_weights() ? &weights : nullptr);
    });
    args.output.write(out, weights, progress);
  });
  progress.done();
}

}  // namespace

void add_sdpa_command(CLI::App& app) {
  auto args = std::make_shared<SdpaArgs>();
  CLI::App* command = app.add_subcommand("sdpa", "scaled dot-product attention softmax(Q K^T / sqrt(d)) V");
  args->qkv.add_to(*command, "d", "d");
  args->mask.add_to(*command);
  CLI::Option* scale = command->add_option("--scale", args->scale, "the scores' factor S instead of 1/sqrt(d)");
  scale->type_name("S");
  args->dropout.add_to(*command);
  args->output.add_to(*command, "where to write the output (B,n,v) or (B,H,n,v), the inputs' float type");
  command->footer(
      "Exit codes: 0 success, 1 failed run, 2 bad usage (see attn --help).\n\n"
      "Example (the seeds' DotProductAttention on queries (2,1,2), keys (2,10,2), values (2,10,4)):\n"
      "  python3 -c \"import numpy as np; np.save('Q.npy', np.random.randn(2, 1, 2).astype('f4')); \\\n"
      "    np.save('K.npy', np.ones((2, 10, 2), 'f4')); np.save('L.npy', np.array([2, 6])); \\\n"
      "    np.save('V.npy', np.tile(np.arange(40, dtype='f4').reshape(1, 10, 4), (2, 1, 1)))\"\n"
      "  attn sdpa --queries Q.npy --keys K.npy --values V.npy --valid-lens L.npy --out O.npy \\\n"
      "            --weights W.npy --heatmap W.png");
  command->callback([args, scale] {
    args->has_scale = scale->count() > 0;
    run_sdpa(*args);
  });
}

}  // namespace attn_cli
