// `attn softmax`: the masked softmax over the last axis of a scores file, as the d2l chapter's
// masked_softmax(X, valid_lens), with the keep-mask and causal mask beside valid lengths.
#include <CLI/CLI.hpp>

#include <memory>

#include "attention_flags.hpp"
#include "attn/softmax.hpp"
#include "commands.hpp"
#include "exit_codes.hpp"

namespace attn_cli {
namespace {

struct SoftmaxArgs {
  std::string scores, out;
  MaskFlags mask;
};

void run_softmax(const SoftmaxArgs& args) {
  Progress progress("softmax");
  progress.stage("reading inputs");
  const NpyInput scores = read_input("--scores", args.scores);
  const MaskInputs masks = args.mask.read();
  // The weights have the scores' float type: float32 in, float32 out.
  with_float_type(common_float_type({&scores}), [&]<class T>() {
    const attn::Tensor<T> x = to_tensor<T>(scores);
    progress.stage("computing");
    const attn::Tensor<T> weights = as_usage([&] { return attn::masked_softmax<T>(x.cview(), masks.mask<T>()); });
    progress.stage("writing " + args.out);
    write_output("--out", args.out, weights);
  });
  progress.done();
}

}  // namespace

void add_softmax_command(CLI::App& app) {
  auto args = std::make_shared<SoftmaxArgs>();
  CLI::App* command = app.add_subcommand("softmax", "masked softmax over the last axis of a scores file");
  command->add_option("--scores", args->scores, "attention scores (B,n,m) or (B,H,n,m), float32 or float64")
      ->type_name("S.npy")
      ->required();
  args->mask.add_to(*command);
  command->add_option("--out", args->out, "where to write the weights: the scores' shape and float type")
      ->type_name("W.npy")
      ->required();
  command->footer(
      "Masked keys get weight 0; a query with no key left gets weights 0 (not the d2l chapter's uniform row).\n"
      "Exit codes: 0 success, 1 failed run, 2 bad usage (see attn --help).\n\n"
      "Example (the d2l chapter's masked_softmax(torch.rand(2, 2, 4), torch.tensor([2, 3]))):\n"
      "  python3 -c \"import numpy as np; np.save('S.npy', np.random.rand(2, 2, 4)); np.save('L.npy', np.array([2, 3]))\"\n"
      "  attn softmax --scores S.npy --valid-lens L.npy --out W.npy");
  command->callback([args] { run_softmax(*args); });
}

}  // namespace attn_cli
