// `attn additive`: additive attention w_v^T tanh(W_q q + W_k k), as the d2l chapter's AdditiveAttention,
// with its parameters read from files in nn.Linear's weight layout.
#include <CLI/CLI.hpp>

#include <memory>
#include <vector>

#include "attention_flags.hpp"
#include "attn/additive.hpp"
#include "commands.hpp"
#include "exit_codes.hpp"

namespace attn_cli {
namespace {

struct AdditiveArgs {
  QkvFlags qkv;
  std::string w_q, w_k, w_v;
  MaskFlags mask;
  DropoutFlags dropout;
  OutputFlags output;
};

// The shapes of out (queries' with the last dimension v) and of the weights (with the last
// dimension m). UsageError unless queries, keys and values are all 3-D or all 4-D; the library
// checks the rest.
struct ResultShapes {
  std::vector<attn::index_t> out, weights;
};

ResultShapes result_shapes(const QkvFlags::Inputs& in) {
  const auto &q = in.queries.array.shape, &k = in.keys.array.shape, &v = in.values.array.shape;
  const std::size_t rank = q.size();
  if ((rank != 3 && rank != 4) || k.size() != rank || v.size() != rank)
    throw UsageError(in.queries.where() + ", " + in.keys.where() + " and " + in.values.where() + " have " +
                     std::to_string(rank) + ", " + std::to_string(k.size()) + " and " + std::to_string(v.size()) +
                     " dimensions; they must all be 3-D (B,n,q), (B,m,k), (B,m,v) or all 4-D with a heads axis");
  ResultShapes shapes{q, q};
  shapes.out.back() = v.back();
  shapes.weights.back() = k[rank - 2];
  return shapes;
}

void run_additive(const AdditiveArgs& args) {
  Progress progress("additive");
  progress.stage("reading inputs");
  const QkvFlags::Inputs in = args.qkv.read();
  const NpyInput w_q = read_input("--wq", args.w_q), w_k = read_input("--wk", args.w_k), w_v = read_input("--wv", args.w_v);
  const MaskInputs masks = args.mask.read();
  const auto dtype = common_float_type({&in.queries, &in.keys, &in.values, &w_q, &w_k, &w_v});
  // The outputs are allocated before the library checks the inputs, so their shapes are taken
  // from inputs whose ranks have been checked here first.
  const ResultShapes shapes = result_shapes(in);
  with_float_type(dtype, [&]<class T>() {
    const attn::Tensor<T> q = to_tensor<T>(in.queries), k = to_tensor<T>(in.keys), v = to_tensor<T>(in.values);
    const attn::Tensor<T> wq = to_tensor<T>(w_q), wk = to_tensor<T>(w_k), wv = to_tensor<T>(w_v);
    progress.stage("computing");
    attn::Tensor<T> out(shapes.out), weights;
    if (args.output.wants_weights()) weights = attn::Tensor<T>(shapes.weights);
    as_usage([&] {
      attn::additive_attention_forward<T>(out.view(), weights.view(), q.cview(), k.cview(), v.cview(),
                                          {wq.cview(), wk.cview(), wv.cview()}, masks.mask<T>(), args.dropout.dropout());
    });
    args.output.write(out, weights, progress);
  });
  progress.done();
}

}  // namespace

void add_additive_command(CLI::App& app) {
  auto args = std::make_shared<AdditiveArgs>();
  CLI::App* command = app.add_subcommand("additive", "additive attention w_v^T tanh(W_q q + W_k k), then softmax and V");
  args->qkv.add_to(*command, "q", "k");
  command->add_option("--wq", args->w_q, "W_q (h,q): nn.Linear(q, h, bias=False).weight")
      ->type_name("WQ.npy")
      ->required();
  command->add_option("--wk", args->w_k, "W_k (h,k): nn.Linear(k, h, bias=False).weight")
      ->type_name("WK.npy")
      ->required();
  command->add_option("--wv", args->w_v, "w_v (h,): nn.Linear(h, 1, bias=False).weight[0]")
      ->type_name("WV.npy")
      ->required();
  args->mask.add_to(*command);
  args->dropout.add_to(*command);
  args->output.add_to(*command, "where to write the output (B,n,v) or (B,H,n,v), the inputs' float type");
  command->footer(
      "Exit codes: 0 success, 1 failed run, 2 bad usage (see attn --help).\n\n"
      "Example (the d2l chapter's AdditiveAttention(key_size=2, query_size=20, num_hiddens=8)):\n"
      "  python3 -c \"import numpy as np; r = np.random.default_rng(0); \\\n"
      "    np.save('Q.npy', r.normal(size=(2, 1, 20))); np.save('K.npy', np.ones((2, 10, 2))); \\\n"
      "    np.save('V.npy', np.tile(np.arange(40.0).reshape(1, 10, 4), (2, 1, 1))); np.save('L.npy', np.array([2, 6])); \\\n"
      "    np.save('WQ.npy', r.uniform(-.2, .2, (8, 20))); np.save('WK.npy', r.uniform(-.7, .7, (8, 2))); \\\n"
      "    np.save('WV.npy', r.uniform(-.35, .35, 8))\"\n"
      "  attn additive --queries Q.npy --keys K.npy --values V.npy --wq WQ.npy --wk WK.npy --wv WV.npy \\\n"
      "                --valid-lens L.npy --out O.npy --heatmap W.svg");
  command->callback([args] { run_additive(*args); });
}

}  // namespace attn_cli
