// The `attn` command line end to end: each subcommand run on real .npy files, its outputs compared
// with the library called directly on the same inputs (the same code, so the results must be
// identical, bit for bit), in float32 and float64; the demo's pictures; progress; --help.
// The error paths are in test_cli_errors.cpp.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <span>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "attn/attn.hpp"
#include "io/png.hpp"
#include "support/cli_runner.hpp"
#include "support/testing.hpp"

namespace attn {
namespace {

using testing::random_tensor;
using testing::ScratchDir;

// Expects the run to succeed silently (stderr is a file here, so no progress either).
void expect_success(const testing::CliResult& r) {
  EXPECT_EQ(r.code, 0) << "stderr: " << r.err;
  EXPECT_EQ(r.err, "");
}

template <class T>
void expect_identical(const Tensor<T>& got, const Tensor<T>& want, const std::string& what) {
  EXPECT_EQ(got.shape(), want.shape()) << what;
  EXPECT_EQ(got.values(), want.values()) << what;
}

// A PNG that libpng reads, of a plausible size.
void expect_png(const std::string& path) {
  const io::RgbaImage image = io::read_png(path);
  EXPECT_GT(image.width, 100) << path;
  EXPECT_GT(image.height, 100) << path;
}

template <class T>
class CliTyped : public ::testing::Test {};
using FloatTypes = ::testing::Types<float, double>;
TYPED_TEST_SUITE(CliTyped, FloatTypes);

TYPED_TEST(CliTyped, SoftmaxWithEachMaskMatchesTheLibrary) {
  using T = TypeParam;
  ScratchDir dir;
  const Tensor<T> scores = random_tensor<T>({2, 3, 5}, 1, -3, 3);
  const Tensor<std::int64_t> lens_b({2}, {2, 5});
  const Tensor<std::int32_t> lens_bn({2, 3}, {1, 0, 5, 3, 2, 4});
  const Tensor<bool> keep({2, 1, 5}, {true, false, true, true, false, false, true, true, true, true});
  const std::string s = dir.npy("S.npy", scores);

  Mask<T> mask;
  mask.valid_lens = lens_b.cview();
  expect_success(dir.run({"softmax", "--scores", s, "--valid-lens", dir.npy("L.npy", lens_b), "--out", dir.file("W.npy")}));
  expect_identical(dir.load<T>("W.npy"), masked_softmax<T>(scores.cview(), mask), "valid lengths (B,)");

  // (B, n) lengths given as int32 (converted to the library's int64); a length of 0 gives zeros.
  const Tensor<std::int64_t> wide({2, 3}, {1, 0, 5, 3, 2, 4});
  mask.valid_lens = wide.cview();
  expect_success(dir.run({"softmax", "--scores", s, "--valid-lens", dir.npy("L32.npy", lens_bn), "--out", dir.file("W.npy")}));
  const Tensor<T> w = dir.load<T>("W.npy");
  expect_identical(w, masked_softmax<T>(scores.cview(), mask), "valid lengths (B, n) int32");
  for (index_t j = 0; j < 5; ++j) EXPECT_EQ(w(0, 1, j), T(0)) << "row (0, 1), of length 0, key " << j;

  mask = {};
  mask.keep = keep.cview();
  mask.causal = Causal::top_left;
  expect_success(dir.run({"softmax", "--scores", s, "--mask", dir.npy("M.npy", keep), "--causal", "--out", dir.file("W.npy")}));
  expect_identical(dir.load<T>("W.npy"), masked_softmax<T>(scores.cview(), mask), "keep-mask and causal");
}

TYPED_TEST(CliTyped, SdpaMatchesTheLibraryWithWeightsAndHeatmaps) {
  using T = TypeParam;
  ScratchDir dir;
  // The d2l chapter's shapes: queries (2, 1, 2), keys (2, 10, 2), values (2, 10, 4), valid lengths [2, 6].
  const Tensor<T> q = random_tensor<T>({2, 1, 2}, 2), k = random_tensor<T>({2, 10, 2}, 3), v = random_tensor<T>({2, 10, 4}, 4);
  const Tensor<std::int64_t> lens({2}, {2, 6});
  expect_success(dir.run({"sdpa", "--queries", dir.npy("Q.npy", q), "--keys", dir.npy("K.npy", k), "--values",
                          dir.npy("V.npy", v), "--valid-lens", dir.npy("L.npy", lens), "--out", dir.file("O.npy"),
                          "--weights", dir.file("W.npy"), "--heatmap", dir.file("W.png")}));
  Mask<T> mask;
  mask.valid_lens = lens.cview();
  Tensor<T> weights;
  expect_identical(dir.load<T>("O.npy"), scaled_dot_product_attention<T>(q.cview(), k.cview(), v.cview(), mask, {}, &weights),
                   "out");
  expect_identical(dir.load<T>("W.npy"), weights, "weights");
  expect_png(dir.file("W.png"));
}

TYPED_TEST(CliTyped, SdpaWithHeadsMaskCausalScaleAndDropoutMatchesTheLibrary) {
  using T = TypeParam;
  ScratchDir dir;
  const Tensor<T> q = random_tensor<T>({2, 3, 4, 5}, 5), k = random_tensor<T>({2, 3, 6, 5}, 6), v = random_tensor<T>({2, 3, 6, 2}, 7);
  Tensor<bool> keep({2, 1, 1, 6});
  for (index_t i = 0; i < keep.numel(); ++i) keep[i] = i % 4 != 1;
  expect_success(dir.run({"sdpa", "--queries", dir.npy("Q.npy", q), "--keys", dir.npy("K.npy", k), "--values",
                          dir.npy("V.npy", v), "--mask", dir.npy("M.npy", keep), "--causal", "--scale", "0.25",
                          "--dropout", "0.3", "--seed", "11", "--out", dir.file("O.npy"), "--weights", dir.file("W.npy"),
                          "--heatmap", dir.file("W.svg")}));
  Mask<T> mask;
  mask.keep = keep.cview();
  mask.causal = Causal::top_left;
  SdpaOptions options;
  options.scale = 0.25;
  options.dropout = {0.3, 11};
  Tensor<T> weights;
  expect_identical(dir.load<T>("O.npy"),
                   scaled_dot_product_attention<T>(q.cview(), k.cview(), v.cview(), mask, options, &weights), "out");
  expect_identical(dir.load<T>("W.npy"), weights, "weights");
  // One heatmap per batch element and head, titled so.
  const std::string svg = testing::read_file(dir.file("W.svg"));
  EXPECT_NE(svg.find(">batch 1, head 2</text>"), std::string::npos);
}

// Grouped-query heads (from the shapes), a bottom-right window, ALiBi, soft-capping, segment ids of
// queries and keys, and the log-sum-exp written out.
TYPED_TEST(CliTyped, SdpaVariantsMatchTheLibrary) {
  using T = TypeParam;
  ScratchDir dir;
  const Tensor<T> q = random_tensor<T>({2, 4, 5, 3}, 21), k = random_tensor<T>({2, 2, 9, 3}, 22);
  const Tensor<T> v = random_tensor<T>({2, 2, 9, 2}, 23), slopes = random_tensor<T>({4}, 24, 0.1, 1);
  const Tensor<std::int32_t> seg_q({2, 5}, {0, 1, 1, 1, 2, 0, 0, 0, 1, 1});
  const Tensor<std::int32_t> seg_k({2, 9}, {0, 0, 0, 0, 1, 1, 1, 1, 2, 0, 0, 0, 0, 0, 0, 0, 1, 1});
  expect_success(dir.run({"sdpa", "--queries", dir.npy("Q.npy", q), "--keys", dir.npy("K.npy", k), "--values",
                          dir.npy("V.npy", v), "--causal", "--bottom-right", "--window", "3,-1", "--alibi",
                          dir.npy("A.npy", slopes), "--softcap", "2.5", "--segment-ids", dir.npy("S.npy", seg_q),
                          "--key-segment-ids", dir.npy("SK.npy", seg_k), "--out", dir.file("O.npy"), "--lse",
                          dir.file("LSE.npy")}));
  Mask<T> mask;
  mask.causal = Causal::bottom_right;
  mask.window = Window{3, -1};
  mask.alibi_slopes = slopes.cview();
  mask.segment_ids_q = seg_q.cview(), mask.segment_ids_k = seg_k.cview();
  SdpaOptions options;
  options.softcap = 2.5;
  Tensor<T> out({2, 4, 5, 2}), lse({2, 4, 5});
  sdpa_forward<T>(out.view(), lse.view(), {}, q.cview(), k.cview(), v.cview(), mask, options);
  expect_identical(dir.load<T>("O.npy"), out, "out");
  expect_identical(dir.load<T>("LSE.npy"), lse, "lse");
  // --align bottom_right without --causal: the window and ALiBi at p(i) = i + m - n; the library's
  // result, and not the top-left one.
  expect_success(dir.run({"sdpa", "--queries", dir.npy("Q.npy", q), "--keys", dir.npy("K.npy", k), "--values",
                          dir.npy("V.npy", v), "--align", "bottom_right", "--window", "2,0", "--alibi",
                          dir.npy("A.npy", slopes), "--out", dir.file("O2.npy")}));
  Mask<T> aligned;
  aligned.align = Align::bottom_right, aligned.window = Window{2, 0}, aligned.alibi_slopes = slopes.cview();
  sdpa_forward<T>(out.view(), {}, {}, q.cview(), k.cview(), v.cview(), aligned);
  expect_identical(dir.load<T>("O2.npy"), out, "out (aligned bottom-right)");
  aligned.align = Align::top_left;
  Tensor<T> top_left({2, 4, 5, 2});
  sdpa_forward<T>(top_left.view(), {}, {}, q.cview(), k.cview(), v.cview(), aligned);
  EXPECT_GT(testing::max_abs_diff(top_left, out), 0.1) << "the two alignments must differ on n != m";
}

TYPED_TEST(CliTyped, AdditiveMatchesTheLibrary) {
  using T = TypeParam;
  ScratchDir dir;
  const Tensor<T> q = random_tensor<T>({2, 3, 4}, 8), k = random_tensor<T>({2, 5, 3}, 9), v = random_tensor<T>({2, 5, 2}, 10);
  const Tensor<T> wq = random_tensor<T>({6, 4}, 11), wk = random_tensor<T>({6, 3}, 12), wv = random_tensor<T>({6}, 13);
  const Tensor<std::int32_t> lens32({2, 3}, {1, 2, 5, 5, 0, 3});
  const Tensor<std::int64_t> lens({2, 3}, {1, 2, 5, 5, 0, 3});
  expect_success(dir.run({"additive", "--queries", dir.npy("Q.npy", q), "--keys", dir.npy("K.npy", k), "--values",
                          dir.npy("V.npy", v), "--wq", dir.npy("WQ.npy", wq), "--wk", dir.npy("WK.npy", wk), "--wv",
                          dir.npy("WV.npy", wv), "--valid-lens", dir.npy("L.npy", lens32), "--dropout", "0.25", "--seed",
                          "3", "--out", dir.file("O.npy"), "--weights", dir.file("W.npy"), "--heatmap", dir.file("W.png")}));
  Mask<T> mask;
  mask.valid_lens = lens.cview();
  Tensor<T> out({2, 3, 2}), weights({2, 3, 5});
  additive_attention_forward<T>(out, weights, q.cview(), k.cview(), v.cview(), {wq.cview(), wk.cview(), wv.cview()}, mask,
                                {0.25, 3});
  expect_identical(dir.load<T>("O.npy"), out, "out");
  expect_identical(dir.load<T>("W.npy"), weights, "weights");
  expect_png(dir.file("W.png"));
}

TYPED_TEST(CliTyped, NadarayaWatsonMatchesTheLibraryForEveryKernel) {
  using T = TypeParam;
  ScratchDir dir;
  const index_t n = 20, nq = 7;
  const Tensor<T> x = random_tensor<T>({n}, 14, 0, 5), y = random_tensor<T>({n}, 15, -2, 2), xq = random_tensor<T>({nq}, 16, 0, 5);
  for (const char* name : {"gaussian", "boxcar", "epanechnikov", "constant"}) {
    expect_success(dir.run({"nw", "--x-train", dir.npy("X.npy", x), "--y-train", dir.npy("Y.npy", y), "--x-query",
                            dir.npy("XQ.npy", xq), "--kernel", name, "--width", "0.7", "--out", dir.file("YHAT.npy"),
                            "--weights", dir.file("W.npy"), "--plot", dir.file("fit.png")}));
    Tensor<T> out({1, nq, 1}), weights({1, nq, n});
    nadaraya_watson_forward<T>(out, weights, TensorView<const T>(xq.data(), {1, nq, 1}),
                               TensorView<const T>(x.data(), {1, n, 1}), TensorView<const T>(y.data(), {1, n, 1}),
                               kernel_from_name(name), static_cast<T>(0.7));
    const Tensor<T> yhat = dir.load<T>("YHAT.npy"), w = dir.load<T>("W.npy");
    EXPECT_EQ(yhat.shape(), (std::vector<index_t>{nq})) << name;
    EXPECT_EQ(w.shape(), (std::vector<index_t>{nq, n})) << name;
    EXPECT_EQ(yhat.values(), out.values()) << name;
    EXPECT_EQ(w.values(), weights.values()) << name;
    expect_png(dir.file("fit.png"));
  }
}

TEST(Cli, NadarayaWatsonWithMultiDimensionalPoints) {
  ScratchDir dir;
  const Tensor<double> x = random_tensor<double>({30, 3}, 17), y = random_tensor<double>({30}, 18),
                       xq = random_tensor<double>({4, 3}, 19);
  expect_success(dir.run({"nw", "--x-train", dir.npy("X.npy", x), "--y-train", dir.npy("Y.npy", y), "--x-query",
                          dir.npy("XQ.npy", xq), "--kernel", "gaussian", "--width", "0.5", "--out", dir.file("YHAT.npy")}));
  Tensor<double> out({1, 4, 1});
  nadaraya_watson_forward<double>(out, {}, TensorView<const double>(xq.data(), {1, 4, 3}),
                                  TensorView<const double>(x.data(), {1, 30, 3}), TensorView<const double>(y.data(), {1, 30, 1}),
                                  Kernel::gaussian, 0.5);
  EXPECT_EQ(dir.load<double>("YHAT.npy").values(), out.values());
}

TEST(Cli, NadarayaWatsonWidthAutoPrintsAndUsesTheLeaveOneOutWidth) {
  ScratchDir dir;
  const Tensor<double> x = random_tensor<double>({40, 2}, 21, 0, 5), xq = random_tensor<double>({6, 2}, 22, 0, 5);
  Tensor<double> y({40});
  for (index_t i = 0; i < 40; ++i) y[i] = std::sin(x(i, 0)) + 0.1 * x(i, 1);
  const testing::CliResult r =
      dir.run({"nw", "--x-train", dir.npy("X.npy", x), "--y-train", dir.npy("Y.npy", y), "--x-query",
               dir.npy("XQ.npy", xq), "--kernel", "gaussian", "--width", "auto", "--out", dir.file("YHAT.npy")});
  EXPECT_EQ(r.code, 0) << r.err;
  // The library's choice on the same data, printed with its leave-one-out error, then used.
  const WidthSelection chosen = select_width<double>(TensorView<const double>(x.data(), {40, 2}),
                                                     TensorView<const double>(y.data(), {40, 1}), Kernel::gaussian);
  char expected[96];
  std::snprintf(expected, sizeof expected, "width %.6g,%.6g (leave-one-out squared error %.6g)\n", chosen.widths[0],
                chosen.widths[1], chosen.loo_error);
  EXPECT_EQ(r.out, expected);
  Tensor<double> out({1, 6, 1});
  nadaraya_watson_forward<double>(out, {}, TensorView<const double>(xq.data(), {1, 6, 2}),
                                  TensorView<const double>(x.data(), {1, 40, 2}),
                                  TensorView<const double>(y.data(), {1, 40, 1}), Kernel::gaussian,
                                  std::span<const double>(chosen.widths));
  EXPECT_EQ(dir.load<double>("YHAT.npy").values(), out.values());
  const testing::CliResult bad = dir.run({"nw", "--x-train", dir.file("X.npy"), "--y-train", dir.file("Y.npy"),
                                          "--x-query", dir.file("XQ.npy"), "--kernel", "gaussian", "--width", "wide",
                                          "--out", dir.file("YHAT.npy")});
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("--width wide: the width must be a positive number or 'auto'"), std::string::npos) << bad.err;
}

TEST(Cli, DemoDrawsItsFivePicturesAsSvgAndPng) {
  ScratchDir dir;
  const testing::CliResult r = dir.run({"demo", "--out-dir", dir.file("pictures")});
  expect_success(r);
  for (const char* name :
       {"attention-additive", "attention-dot-product", "kernels", "nadaraya-watson", "local-linear"}) {
    const std::string base = dir.file("pictures") + "/" + name;
    EXPECT_NE(r.out.find(base + ".svg"), std::string::npos) << "the demo lists " << name;
    EXPECT_EQ(testing::read_file(base + ".svg").rfind("</svg>\n"), testing::read_file(base + ".svg").size() - 7) << name;
    expect_png(base + ".png");
  }
  // The d2l chapter's heatmaps: Keys, Queries and the weights' colorbar up to 0.5.
  const std::string svg = testing::read_file(dir.file("pictures/attention-dot-product.svg"));
  for (const char* text : {">Keys<", ">Queries<", ">0.5<"}) EXPECT_NE(svg.find(text), std::string::npos) << text;
  // The regression figure: every kernel, and the Gaussian at each width.
  const std::string nw = testing::read_file(dir.file("pictures/nadaraya-watson.svg"));
  for (const char* title : {"gaussian, width 1", "boxcar, width 1", "epanechnikov, width 1", "constant, width 1",
                            "gaussian, width 0.1", "gaussian, width 0.2", "gaussian, width 0.5"})
    EXPECT_NE(nw.find(title), std::string::npos) << title;
  // Nadaraya-Watson beside local linear: both fits, over the data and near the boundary, and their means.
  const std::string ll = testing::read_file(dir.file("pictures/local-linear.svg"));
  for (const char* text : {"Nadaraya-Watson, width", "local linear, bandwidth", "near the boundary x = 0",
                           "the fits of the noiseless curve"})
    EXPECT_NE(ll.find(text), std::string::npos) << text;
}

TEST(Cli, ProgressOnlyWhenAskedOrOnATerminal) {
  ScratchDir dir;
  const std::string s = dir.npy("S.npy", random_tensor<float>({2, 2, 4}, 20));
  const std::vector<std::string> args{"softmax", "--scores", s, "--out", dir.file("W.npy")};
  // stderr is a file: nothing but errors.
  EXPECT_EQ(dir.run(args).err, "");
  // ATTN_PROGRESS=always: every stage, one line each, then the total.
  const testing::CliResult r = dir.run(args, "ATTN_PROGRESS=always");
  EXPECT_EQ(r.code, 0);
  for (const char* line : {"attn softmax: reading inputs (", "attn softmax: computing (", "attn softmax: writing ",
                           "attn softmax: done in "})
    EXPECT_NE(r.err.find(line), std::string::npos) << line << "\nstderr: " << r.err;
  EXPECT_EQ(dir.run(args, "ATTN_PROGRESS=never").err, "");
  // On a terminal (script(1) gives the run one) the line is rewritten in place, then ended. Without
  // script(1) that part is reported as skipped, not passed.
  if (!std::filesystem::exists("/usr/bin/script")) GTEST_SKIP() << "/usr/bin/script is missing: no terminal to test on";
  const std::string inner = std::string("ATTN_PROGRESS=always ") + ATTN_CLI + " softmax --scores " + s + " --out " +
                            dir.file("W.npy");
  const testing::CliResult tty = dir.run_shell("/usr/bin/script -qec '" + inner + "' /dev/null");
  EXPECT_EQ(tty.code, 0);
  EXPECT_NE(tty.out.find("\r\033[Kattn softmax: computing ... "), std::string::npos) << tty.out;
  EXPECT_NE(tty.out.find("\r\033[Kattn softmax: done in "), std::string::npos) << tty.out;
}

TEST(Cli, EveryCommandsHelpShowsAnExample) {
  ScratchDir dir;
  for (const char* command : {"softmax", "sdpa", "additive", "nw", "kreg", "demo"}) {
    const testing::CliResult r = dir.run({command, "--help"});
    EXPECT_EQ(r.code, 0) << command;
    EXPECT_NE(r.out.find("Example"), std::string::npos) << command;
    EXPECT_NE(r.out.find(std::string("  attn ") + command + " "), std::string::npos) << command;
    EXPECT_NE(r.out.find("Exit codes"), std::string::npos) << command;
  }
  const testing::CliResult top = dir.run({"--help"});
  EXPECT_EQ(top.code, 0);
  EXPECT_NE(top.out.find("2 bad usage"), std::string::npos);
}

}  // namespace
}  // namespace attn
