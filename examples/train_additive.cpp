// Additive attention learns which key to attend to: attn::train_additive on the matching task of
// attn/train.hpp, where each query must find the one key that shares its hidden class, seen through
// different codes and sizes (q = 12, k = 10) and noise.
//
//   train_additive [--steps N] [--lr X] [--optimizer adam|sgd] [--seed S] [--out DIR]
//
// Prints the loss every --log-every steps (the mean training loss since the previous line, and the
// loss and accuracy on a fixed evaluation batch of 256 episodes), then the learned attention on an
// episode whose key j and query i both have class j = i: the right pattern is the identity. Writes
// to --out (default: the current directory) that attention as attention.png (a heatmap),
// attention.npy (n, m) and .csv, the learned parameters as w_q.npy (h, q), w_k.npy (h, k) and
// w_v.npy (h,), and W_q and W_k side by side as parameters.png.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "attn/config.hpp"
#include "attn/npy.hpp"
#include "attn/plot.hpp"
#include "attn/train.hpp"

namespace {

void write_csv(const std::string& path, const attn::Tensor<float>& t) {
  std::ofstream f(path);
  const attn::index_t cols = t.dim(-1);
  for (attn::index_t e = 0; e < t.numel(); ++e) f << t[e] << ((e + 1) % cols == 0 ? '\n' : ',');
}

// W_q (h, q) and W_k (h, k) side by side as one (1, 2, h, max(q, k)) grid of heatmaps, the narrower
// padded with NaN (grey): each input feature is a column, the noise features last.
void write_parameters(const std::string& path, const attn::MatchingTask& task, const attn::AdditiveWeights<float>& w) {
  const attn::index_t h = w.w_q.dim(0), q = task.query_size(), k = task.key_size(), cols = std::max(q, k);
  attn::Tensor<float> both({2, h, cols});
  for (attn::index_t r = 0; r < h; ++r)
    for (attn::index_t c = 0; c < cols; ++c) {
      both(0, r, c) = c < q ? w.w_q(r, c) : NAN;
      both(1, r, c) = c < k ? w.w_k(r, c) : NAN;
    }
  attn::io::HeatmapOptions heat;
  heat.xlabel = "input feature (one-hot class, then noise)", heat.ylabel = "hidden unit";
  heat.titles = {"W_q (h, q)", "W_k (h, k)"};
  heat.colormap = "viridis";
  attn::io::write_heatmaps<float>(path, both, heat);
}

}  // namespace

int main(int argc, char** argv) {
  attn::MatchingTask task;
  attn::TrainOptions options;
  options.steps = 1000;
  options.lr = 0.02;
  std::string optimizer = "adam", out_dir = ".";
  // One thread by default: a step is B n m h = 32 x 8 x 8 x 16 tanh, too little to pay for waking a
  // team of threads, and on a machine shared with other jobs spinning threads wait for each other
  // (measured on 2 busy cores: 1000 steps in 3.5 s with 1 thread, 66 s with 2).
  int threads = 1;
  CLI::App app{"Trains additive attention to attend to the key that shares a hidden class with the query"};
  app.add_option("--steps", options.steps, "optimizer steps")->capture_default_str();
  app.add_option("--lr", options.lr, "learning rate")->capture_default_str();
  app.add_option("--optimizer", optimizer, "adam or sgd (momentum 0.9)")
      ->check(CLI::IsMember({"adam", "sgd"}))
      ->capture_default_str();
  app.add_option("--hidden", options.hidden, "hidden size h of W_q, W_k, w_v")->capture_default_str();
  app.add_option("--batch", options.batch, "episodes per step")->capture_default_str();
  app.add_option("--log-every", options.log_every, "steps between log lines")->capture_default_str();
  app.add_option("--seed", task.seed, "seed of the task's episodes")->capture_default_str();
  app.add_option("--init-seed", options.init_seed, "seed of the initial weights")->capture_default_str();
  app.add_option("--threads", threads, "OpenMP threads of the attention kernels (0: all)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--out", out_dir, "directory for attention.png/.npy/.csv, parameters.png, w_q.npy, w_k.npy, w_v.npy")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  options.optimizer = optimizer == "sgd" ? attn::OptimizerKind::sgd : attn::OptimizerKind::adam;
  attn::set_num_threads(threads);

  try {
    std::printf("matching task: %lld classes, n = %lld queries (q = %lld), m = %lld keys (k = %lld), v = %lld; "
                "h = %lld, %s lr %g, batch %lld\n",
                static_cast<long long>(task.classes), static_cast<long long>(task.queries),
                static_cast<long long>(task.query_size()), static_cast<long long>(task.keys),
                static_cast<long long>(task.key_size()), static_cast<long long>(task.value_size),
                static_cast<long long>(options.hidden), optimizer.c_str(), options.lr,
                static_cast<long long>(options.batch));
    std::printf("%6s %12s %12s %10s %9s\n", "step", "train loss", "eval loss", "accuracy", "seconds");
    std::vector<attn::TrainRecord> log;
    const auto weights = attn::train_additive<float>(
        task, options,
        [](const attn::TrainRecord& r) {
          std::printf("%6lld %12.6f %12.6f %10.4f %9.3f\n", static_cast<long long>(r.step), r.train_loss,
                      r.eval_loss, r.eval_accuracy, r.seconds);
          std::fflush(stdout);
        },
        &log);
    std::printf("eval loss fell %.1fx (%.6f -> %.6f) in %.2f s\n", log.front().eval_loss / log.back().eval_loss,
                log.front().eval_loss, log.back().eval_loss, log.back().seconds);

    // The learned attention on the ordered episode: query i's right key is key i.
    attn::Tensor<float> attention;
    const auto ordered = task.ordered<float>();
    attn::evaluate_matching(weights, ordered, &attention);
    const attn::index_t n = attention.dim(1), m = attention.dim(2);
    attn::Tensor<float> grid({n, m});
    std::printf("\nattention weights of the ordered episode (row: query of class i, column: key of class j):\n");
    for (attn::index_t i = 0; i < n; ++i) {
      for (attn::index_t j = 0; j < m; ++j) {
        grid(i, j) = attention(0, i, j);
        std::printf(" %5.3f", static_cast<double>(grid(i, j)));
      }
      std::printf("\n");
    }
    std::filesystem::create_directories(out_dir);
    const std::filesystem::path dir(out_dir);
    attn::io::write_npy((dir / "attention.npy").string(), grid);
    write_csv((dir / "attention.csv").string(), grid);
    attn::io::HeatmapOptions heat;
    heat.xlabel = "Keys (class j)", heat.ylabel = "Queries (class i)", heat.vmin = 0, heat.vmax = 1;
    heat.titles = {"learned attention"};
    attn::io::write_heatmaps<float>((dir / "attention.png").string(), grid, heat);
    attn::io::write_npy((dir / "w_q.npy").string(), weights.w_q);
    attn::io::write_npy((dir / "w_k.npy").string(), weights.w_k);
    attn::io::write_npy((dir / "w_v.npy").string(), weights.w_v);
    write_parameters((dir / "parameters.png").string(), task, weights);
    std::printf("wrote attention.png, attention.npy, attention.csv, parameters.png, w_q.npy, w_k.npy, w_v.npy to %s\n",
                out_dir.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_additive: %s\n", e.what());
    return 1;
  }
  return 0;
}
