// Every way a call of `attn` can go wrong, with its exit code and message: 2 for bad usage (flags,
// and input files that are missing, corrupt, of the wrong type or shape), 1 for a failed run
// (valid inputs whose outputs cannot be written). Never a crash: a signal would show as a code
// above 128. Each message starts "attn <command>: error:" and names the flag and the file.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "attn/npy.hpp"
#include "support/cli_runner.hpp"
#include "support/testing.hpp"

namespace attn {
namespace {

using testing::random_tensor;

// The inputs of the cases: good files with the d2l chapter's shapes, and broken ones.
class CliErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_.npy("S.npy", random_tensor<double>({2, 2, 4}, 1));
    dir_.npy("Q.npy", random_tensor<float>({2, 1, 2}, 2));
    dir_.npy("Q64.npy", random_tensor<double>({2, 1, 2}, 2));
    dir_.npy("K.npy", random_tensor<float>({2, 10, 2}, 3));
    dir_.npy("K3.npy", random_tensor<float>({2, 10, 3}, 3));
    dir_.npy("V.npy", random_tensor<float>({2, 10, 4}, 4));
    dir_.npy("Q20.npy", random_tensor<float>({2, 1, 20}, 5));
    dir_.npy("WQ.npy", random_tensor<float>({8, 20}, 6));
    dir_.npy("WK.npy", random_tensor<float>({8, 2}, 7));
    dir_.npy("WV.npy", random_tensor<float>({8}, 8));
    dir_.npy("L.npy", Tensor<std::int64_t>({2}, {2, 3}));
    dir_.npy("L6.npy", Tensor<std::int64_t>({2}, {2, 6}));
    dir_.npy("Lf.npy", Tensor<double>({2}, {2, 3}));
    dir_.npy("M.npy", Tensor<bool>({2, 2, 4}));
    dir_.npy("Mi.npy", Tensor<std::int32_t>({2, 2, 4}));
    dir_.npy("I.npy", Tensor<std::int64_t>({2, 2, 4}));
    dir_.npy("R5.npy", Tensor<double>(std::vector<index_t>{1, 1, 1, 1, 1}));
    dir_.npy("X.npy", random_tensor<double>({50}, 9));
    dir_.npy("X2.npy", random_tensor<double>({50, 2}, 9));
    dir_.npy("Y.npy", random_tensor<double>({50}, 10));
    dir_.npy("Y49.npy", random_tensor<double>({49}, 10));
    dir_.npy("XQ.npy", random_tensor<double>({7}, 11));
    dir_.npy("XQ2.npy", random_tensor<double>({7, 2}, 11));
    // Broken files, from a good one: its bytes, cut or altered.
    const std::vector<std::byte> good = io::serialize_npy(io::DType::float64, std::vector<index_t>{2, 2, 4},
                                                          random_tensor<double>({2, 2, 4}, 1).data());
    write_bytes("empty.npy", {});
    write_bytes("junk.npy", {std::byte{'j'}, std::byte{'u'}, std::byte{'n'}, std::byte{'k'}});
    write_bytes("cut_header.npy", {good.begin(), good.begin() + 20});
    write_bytes("short_data.npy", {good.begin(), good.end() - 8});  // the header declares more data than it holds
    std::vector<std::byte> longer = good;
    longer.resize(good.size() + 3);
    write_bytes("long_data.npy", longer);
    std::vector<std::byte> altered = good;
    altered[6] = std::byte{4};  // format version 4.0
    write_bytes("v4.npy", altered);
    altered = good;
    std::memcpy(altered.data() + std::string_view(reinterpret_cast<const char*>(good.data()), good.size()).find("<f8"),
                ">f8", 3);
    write_bytes("big_endian.npy", altered);
    std::filesystem::create_directories(dir_.file("a_directory.npy"));
  }

  void write_bytes(const std::string& name, const std::vector<std::byte>& bytes) {
    std::ofstream(dir_.file(name), std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                                           static_cast<std::streamsize>(bytes.size()));
  }

  // Runs attn with `args`, in which a word ending in ".npy" (or .png/.svg/.jpg) that names no
  // directory is a file of the scratch directory, and expects `code` and every part in stderr.
  void expect(std::vector<std::string> args, int code, std::initializer_list<const char*> parts) {
    for (std::string& a : args)
      if (a.find('/') == std::string::npos &&
          (a.ends_with(".npy") || a.ends_with(".png") || a.ends_with(".svg") || a.ends_with(".jpg")))
        a = dir_.file(a);
    const testing::CliResult r = dir_.run(args);
    std::string call;
    for (const std::string& a : args) call += " " + a;
    EXPECT_EQ(r.code, code) << "attn" << call << "\nstderr: " << r.err;
    if (args.empty() || args[0] != "demo") {  // the demo prints as it goes
      EXPECT_EQ(r.out, "") << "attn" << call;
    }
    for (const char* p : parts) EXPECT_NE(r.err.find(p), std::string::npos) << "attn" << call << "\nstderr: " << r.err << "\nmissing: " << p;
  }

  testing::ScratchDir dir_;
};

const std::vector<std::string> kSdpa{"sdpa", "--queries", "Q.npy", "--keys", "K.npy", "--values", "V.npy"};

std::vector<std::string> operator+(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST_F(CliErrors, CommandLineMistakesAreBadUsage) {
  expect({}, 2, {"attn: error:", "A subcommand is required"});
  expect({"no-such-command"}, 2, {"attn: error: unknown command \"no-such-command\"; the commands are softmax sdpa"});
  expect({"softmax", "--out", "W.npy"}, 2, {"attn softmax: error:", "--scores is required", "attn softmax --help"});
  expect({"softmax", "--scores", "S.npy"}, 2, {"--out is required"});
  expect({"softmax", "--scores", "S.npy", "--out", "W.npy", "--bogus"}, 2, {"--bogus"});
  expect(kSdpa + std::vector<std::string>{"--out", "O.npy", "--dropout", "0.5"}, 2, {"--dropout requires --seed"});
  expect(kSdpa + std::vector<std::string>{"--out", "O.npy", "--seed", "3"}, 2, {"--seed requires --dropout"});
  expect(kSdpa + std::vector<std::string>{"--out", "O.npy", "--dropout", "half", "--seed", "3"}, 2, {"--dropout", "half"});
  expect(kSdpa + std::vector<std::string>{"--out", "O.npy", "--heatmap", "W.jpg"}, 2, {"--heatmap", "must end in .svg or .png"});
  expect({"nw", "--x-train", "X.npy", "--y-train", "Y.npy", "--x-query", "XQ.npy", "--kernel", "triangle", "--width",
          "1", "--out", "Y.npy"},
         2, {"--kernel", "triangle", "gaussian,boxcar,epanechnikov,constant"});
  // An empty value is malformed: it was read as 0 (a scale of 0, dropout p = 0) or as no file (the
  // valid lengths or the lse silently left out).
  expect(kSdpa + std::vector<std::string>{"--out", "O.npy", "--scale", ""}, 2, {"--scale: the value is empty"});
  expect(kSdpa + std::vector<std::string>{"--out", "O.npy", "--dropout", "", "--seed", "1"}, 2, {"--dropout: the value is empty"});
  expect(kSdpa + std::vector<std::string>{"--out", "O.npy", "--valid-lens", ""}, 2, {"--valid-lens: the value is empty"});
  expect(kSdpa + std::vector<std::string>{"--out", "O.npy", "--lse", ""}, 2, {"--lse: the value is empty"});
  expect({"softmax", "--scores", "S.npy", "--out", ""}, 2, {"--out: the value is empty"});
}

TEST_F(CliErrors, MissingAndCorruptFilesAreBadUsageNamingFlagAndFile) {
  const auto softmax = [](const std::string& scores) {
    return std::vector<std::string>{"softmax", "--scores", scores, "--out", "W.npy"};
  };
  expect(softmax("missing.npy"), 2, {"attn softmax: error: --scores ", "missing.npy: cannot open for reading"});
  expect(softmax("a_directory.npy"), 2, {"--scores ", "a_directory.npy: reading failed"});
  expect(softmax("empty.npy"), 2, {"--scores ", "empty.npy: the file is empty"});
  expect(softmax("junk.npy"), 2, {"junk.npy: not a .npy file"});
  expect(softmax("cut_header.npy"), 2, {"cut_header.npy: the header length", "runs past the end of the file"});
  expect(softmax("short_data.npy"), 2, {"short_data.npy: shape (2,2,4) of float64 needs 128 data bytes", "truncated"});
  expect(softmax("long_data.npy"), 2, {"long_data.npy: the file has 3 bytes after the 128 data bytes"});
  expect(softmax("v4.npy"), 2, {"v4.npy: .npy format version 4.0 is not supported"});
  expect(softmax("big_endian.npy"), 2, {"big_endian.npy: dtype '>f8' is big-endian"});
  expect(kSdpa + std::vector<std::string>{"--valid-lens", "junk.npy", "--out", "O.npy"}, 2, {"--valid-lens ", "junk.npy"});
  expect(kSdpa + std::vector<std::string>{"--mask", "missing.npy", "--out", "O.npy"}, 2, {"--mask ", "missing.npy"});
  // Nothing is written when an input is bad.
  EXPECT_FALSE(std::filesystem::exists(dir_.file("W.npy")));
  EXPECT_FALSE(std::filesystem::exists(dir_.file("O.npy")));
}

TEST_F(CliErrors, WrongElementTypesAreBadUsage) {
  expect({"softmax", "--scores", "I.npy", "--out", "W.npy"}, 2, {"--scores ", "I.npy: holds int64; it must hold float32 or float64"});
  expect({"softmax", "--scores", "S.npy", "--valid-lens", "Lf.npy", "--out", "W.npy"}, 2,
         {"--valid-lens ", "Lf.npy: holds float64; valid lengths must be integers, int32 or int64"});
  expect({"softmax", "--scores", "S.npy", "--mask", "Mi.npy", "--out", "W.npy"}, 2, {"--mask ", "Mi.npy: holds int32; the mask must be bool"});
  expect({"sdpa", "--queries", "Q64.npy", "--keys", "K.npy", "--values", "V.npy", "--out", "O.npy"}, 2,
         {"--keys ", "K.npy holds float32 but --queries ", "Q64.npy holds float64"});
  // sdpa reads float16 files too, and its message says so.
  expect({"sdpa", "--queries", "I.npy", "--keys", "K.npy", "--values", "V.npy", "--out", "O.npy"}, 2,
         {"--queries ", "I.npy: holds int64; it must hold float32, float64 or float16"});
  expect({"additive", "--queries", "Q20.npy", "--keys", "K.npy", "--values", "V.npy", "--wq", "WQ.npy", "--wk", "WK.npy",
          "--wv", "Y.npy", "--out", "O.npy"},
         2, {"--wv ", "Y.npy holds float64 but --queries "});
}

TEST_F(CliErrors, ShapesThatDoNotFitAreBadUsage) {
  expect({"softmax", "--scores", "R5.npy", "--out", "W.npy"}, 2, {"R5.npy: shape (1,1,1,1,1) has 5 dimensions"});
  expect({"softmax", "--scores", "S.npy", "--valid-lens", "L6.npy", "--out", "W.npy"}, 2,
         {"attn softmax: error: masked_softmax_forward: valid_lens[1] is 6", "[0, 4]"});
  expect({"sdpa", "--queries", "Q.npy", "--keys", "K3.npy", "--values", "V.npy", "--out", "O.npy"}, 2,
         {"attn sdpa: error: ", "keys has shape (2,10,3) but must be (2,10,2)"});
  // Queries of a rank sdpa does not take are named as the file they came from, not as the out made
  // from them.
  expect({"sdpa", "--queries", "Y49.npy", "--keys", "K.npy", "--values", "V.npy", "--out", "O.npy"}, 2,
         {"--queries ", "Y49.npy has shape (49,); queries, keys and values must be 3-D"});
  expect({"additive", "--queries", "Q20.npy", "--keys", "K.npy", "--values", "V.npy", "--wq", "WK.npy", "--wk", "WK.npy",
          "--wv", "WV.npy", "--out", "O.npy"},
         2, {"attn additive: error: ", "w_q has shape (8,2) but must be (8,20)"});
  expect({"additive", "--queries", "Q20.npy", "--keys", "WK.npy", "--values", "V.npy", "--wq", "WQ.npy", "--wk", "WK.npy",
          "--wv", "WV.npy", "--out", "O.npy"},
         2, {"have 3, 2 and 3 dimensions", "they must all be 3-D"});
  const std::vector<std::string> nw_tail{"--kernel", "gaussian", "--width", "1", "--out", "YH.npy"};
  expect(std::vector<std::string>{"nw", "--x-train", "X.npy", "--y-train", "Y49.npy", "--x-query", "XQ.npy"} + nw_tail, 2,
         {"--y-train ", "Y49.npy has shape (49,) but must be (50,)"});
  expect(std::vector<std::string>{"nw", "--x-train", "S.npy", "--y-train", "Y.npy", "--x-query", "XQ.npy"} + nw_tail, 2,
         {"--x-train ", "S.npy has shape (2,2,4); points must be (N,) or (N,p)"});
  expect(std::vector<std::string>{"nw", "--x-train", "X2.npy", "--y-train", "Y.npy", "--x-query", "XQ.npy"} + nw_tail, 2,
         {"--x-query ", "XQ.npy has points of dimension 1 but --x-train ", "has 2"});
  expect(std::vector<std::string>{"nw", "--x-train", "X2.npy", "--y-train", "Y.npy", "--x-query", "XQ2.npy", "--plot", "fit.png"} +
             nw_tail,
         2, {"--plot draws one-dimensional x only"});
}

TEST_F(CliErrors, ValuesOutOfRangeAreBadUsage) {
  expect(kSdpa + std::vector<std::string>{"--out", "O.npy", "--dropout", "1.5", "--seed", "1"}, 2, {"dropout p is 1.5", "[0, 1)"});
  expect(kSdpa + std::vector<std::string>{"--out", "O.npy", "--scale", "inf"}, 2, {"scale is inf; it must be finite"});
  expect({"nw", "--x-train", "X.npy", "--y-train", "Y.npy", "--x-query", "XQ.npy", "--kernel", "boxcar", "--width", "-1",
          "--out", "YH.npy"},
         2, {"attn nw: error: ", "width sigma is -1; it must be positive and finite"});
}

// The flags of the attention variants: a malformed window, slopes, soft-cap or segment ids.
TEST_F(CliErrors, AttentionVariantFlagsAreChecked) {
  const std::vector<std::string> out{"--out", "O.npy"};
  expect(kSdpa + out + std::vector<std::string>{"--window", "3"}, 2, {"--window 3: give L,R"});
  expect(kSdpa + out + std::vector<std::string>{"--window", "3,x"}, 2, {"--window 3,x: the right bound \"x\" is not an integer"});
  expect(kSdpa + out + std::vector<std::string>{"--window", "1,2,3"}, 2, {"--window 1,2,3: give L,R"});
  expect(kSdpa + out + std::vector<std::string>{"--softcap", "0"}, 2, {"softcap is 0; it must be positive and finite"});
  expect(kSdpa + out + std::vector<std::string>{"--softcap", "-2"}, 2, {"softcap is -2"});
  expect(kSdpa + out + std::vector<std::string>{"--alibi", "L.npy"}, 2, {"--alibi ", "L.npy: holds int64; it must hold float32, float64 or float16"});
  expect(kSdpa + out + std::vector<std::string>{"--alibi", "V.npy"}, 2, {"alibi_slopes has shape (2,10,4)", "(H,) = (1,)"});
  expect(kSdpa + out + std::vector<std::string>{"--segment-ids", "Lf.npy"}, 2, {"--segment-ids ", "Lf.npy: holds float64; segment ids are int32 or int64"});
  expect(kSdpa + out + std::vector<std::string>{"--segment-ids", "L.npy"}, 2, {"segment_ids (queries) has shape (2,); it must be (B, n) = (2,1)"});
  expect(kSdpa + out + std::vector<std::string>{"--key-segment-ids", "L.npy"}, 2, {"--key-segment-ids requires --segment-ids"});
  expect(kSdpa + out + std::vector<std::string>{"--bottom-right"}, 2, {"--bottom-right requires --causal"});
  expect(kSdpa + out + std::vector<std::string>{"--align", "diagonal"}, 2, {"--align", "diagonal"});
  expect(kSdpa + out + std::vector<std::string>{"--causal", "--bottom-right", "--align", "top_left"}, 2, {"excludes"});
}

TEST_F(CliErrors, OutputsThatCannotBeWrittenAreAFailedRun) {
  // Each names its flag and path.
  expect({"softmax", "--scores", "S.npy", "--valid-lens", "L.npy", "--out", "/nonexistent-dir/W.npy"}, 1,
         {"attn softmax: error: --out /nonexistent-dir/W.npy: cannot open for writing"});
  expect(kSdpa + std::vector<std::string>{"--out", "O.npy", "--weights", "/nonexistent-dir/W.npy"}, 1,
         {"--weights /nonexistent-dir/W.npy"});
  expect(kSdpa + std::vector<std::string>{"--out", "O.npy", "--lse", "/nonexistent-dir/L.npy"}, 1, {"--lse /nonexistent-dir/L.npy"});
  expect(kSdpa + std::vector<std::string>{"--out", "O.npy", "--heatmap", "/nonexistent-dir/W.png"}, 1,
         {"attn sdpa: error: --heatmap /nonexistent-dir/W.png: cannot write the PNG"});
  expect({"nw", "--x-train", "X.npy", "--y-train", "Y.npy", "--x-query", "XQ.npy", "--kernel", "gaussian", "--width",
          "1", "--out", "YH.npy", "--plot", "/nonexistent-dir/fit.svg"},
         1, {"--plot /nonexistent-dir/fit.svg: cannot open for writing"});
  // The demo's directory cannot be created under a regular file.
  expect({"demo", "--out-dir", dir_.file("S.npy") + "/pictures"}, 1, {"attn demo: error: ", "cannot create the directory"});
}

// More kinds of the README's catalogue of bad input ("Bad input: what each interface says"): each
// input that does not fit the others, by the rule the library states for it.
TEST_F(CliErrors, EveryInputMustFitTheOthers) {
  dir_.npy("V9.npy", random_tensor<float>({2, 9, 4}, 4));
  dir_.npy("K3b.npy", random_tensor<float>({3, 10, 2}, 3));
  dir_.npy("V3b.npy", random_tensor<float>({3, 10, 4}, 4));
  dir_.npy("QH3.npy", random_tensor<float>({2, 3, 1, 2}, 2));
  dir_.npy("KH2.npy", random_tensor<float>({2, 2, 10, 2}, 3));
  dir_.npy("VH2.npy", random_tensor<float>({2, 2, 10, 4}, 4));
  dir_.npy("Q0.npy", Tensor<float>({2, 1, 0}));
  dir_.npy("K0.npy", Tensor<float>({2, 10, 0}));
  dir_.npy("L3.npy", Tensor<std::int64_t>({3}, {1, 2, 3}));
  dir_.npy("M25.npy", Tensor<bool>({2, 2, 5}));
  dir_.npy("WK7.npy", random_tensor<float>({7, 2}, 7));
  dir_.npy("SEG.npy", Tensor<std::int64_t>({2, 1}));
  const std::vector<std::string> out{"--out", "O.npy"};
  expect({"sdpa", "--queries", "Q.npy", "--keys", "K.npy", "--values", "V9.npy", "--out", "O.npy"}, 2,
         {"attn sdpa: error: sdpa_forward: values has shape (2,9,4) but must be (2,10,4)", "number of keys m of keys (2,10,2)"});
  expect({"sdpa", "--queries", "Q.npy", "--keys", "K3b.npy", "--values", "V3b.npy", "--out", "O.npy"}, 2,
         {"keys has shape (3,10,2) but must be (2,10,2): keys must have the batch size"});
  expect({"sdpa", "--queries", "QH3.npy", "--keys", "KH2.npy", "--values", "VH2.npy", "--out", "O.npy"}, 2,
         {"keys has shape (2,2,10,2) with 2 heads but queries (2,3,1,2) has 3", "multiple of the key heads"});
  expect({"sdpa", "--queries", "Q0.npy", "--keys", "K0.npy", "--values", "V.npy", "--out", "O.npy"}, 2,
         {"queries has shape (2,1,0) with d = 0; the default scale 1/sqrt(d) needs d >= 1"});
  expect({"softmax", "--scores", "S.npy", "--valid-lens", "L3.npy", "--out", "W.npy"}, 2,
         {"valid_lens has shape (3,); it must be (B,) = (2,) or (B, n) = (2,2)"});
  expect({"softmax", "--scores", "S.npy", "--mask", "M25.npy", "--out", "W.npy"}, 2,
         {"mask has shape (2,2,5) which does not broadcast to the scores' shape (2,2,4)"});
  expect({"additive", "--queries", "Q20.npy", "--keys", "K.npy", "--values", "V.npy", "--wq", "WQ.npy", "--wk", "WK7.npy",
          "--wv", "WV.npy", "--out", "O.npy"},
         2, {"attn additive: error: ", "w_k has shape (7,2) but must be (8,2): W_k is (h, k) with h = 8 from w_q"});
  expect(kSdpa + out + std::vector<std::string>{"--segment-ids", "SEG.npy"}, 2,
         {"segment_ids of the queries are given without those of the keys, but n = 1 != m = 10"});
  EXPECT_FALSE(std::filesystem::exists(dir_.file("O.npy")));
  EXPECT_FALSE(std::filesystem::exists(dir_.file("W.npy")));
}

TEST_F(CliErrors, MoreValuesOutOfRangeAreBadUsage) {
  dir_.npy("Lneg.npy", Tensor<std::int64_t>({2}, {-1, 2}));
  dir_.npy("Anan.npy", Tensor<float>({1}, {std::numeric_limits<float>::quiet_NaN()}));
  const std::vector<std::string> out{"--out", "O.npy"};
  expect({"softmax", "--scores", "S.npy", "--valid-lens", "Lneg.npy", "--out", "W.npy"}, 2,
         {"masked_softmax_forward: valid_lens[0] is -1; valid lengths must lie in [0, m] = [0, 4]"});
  expect(kSdpa + out + std::vector<std::string>{"--dropout", "-0.1", "--seed", "1"}, 2, {"dropout p is -0.1; it must lie in [0, 1)"});
  expect({"additive", "--queries", "Q20.npy", "--keys", "K.npy", "--values", "V.npy", "--wq", "WQ.npy", "--wk", "WK.npy",
          "--wv", "WV.npy", "--dropout", "1", "--seed", "1", "--out", "O.npy"},
         2, {"attn additive: error: ", "dropout p is 1; it must lie in [0, 1)"});
  expect(kSdpa + out + std::vector<std::string>{"--scale", "nan"}, 2, {"scale is nan; it must be finite"});
  expect(kSdpa + out + std::vector<std::string>{"--alibi", "Anan.npy"}, 2,
         {"alibi_slopes holds nan for batch 0, head 0; every slope must be finite"});
  expect(kSdpa + out + std::vector<std::string>{"--dropout", "0.5", "--seed", "1.5"}, 2, {"--seed", "\"1.5\" must be a whole number"});
  expect(kSdpa + out + std::vector<std::string>{"--compute", "fp8"}, 2, {"--compute: fp8 not in {bf16,int8}"});
  for (const char* width : {"nan", "inf"})
    expect({"nw", "--x-train", "X.npy", "--y-train", "Y.npy", "--x-query", "XQ.npy", "--kernel", "gaussian", "--width",
            width, "--out", "YH.npy"},
           2, {"attn nw: error: nadaraya_watson_forward: width sigma is ", "; it must be positive and finite"});
  EXPECT_FALSE(std::filesystem::exists(dir_.file("O.npy")));
}

// Files a .npy reader must refuse beyond those above: each names the flag, the file and the problem.
TEST_F(CliErrors, MoreMalformedFilesAreBadUsage) {
  // A version 1.0 file of `dict` (padded as numpy pads it) followed by `data`.
  const auto npy_with_header = [](std::string dict, const std::string& data) {
    dict.append(64 - (10 + dict.size() + 1) % 64, ' ').append("\n");
    std::string file("\x93NUMPY\x01\x00", 8);
    file += static_cast<char>(dict.size() & 0xff);
    file += static_cast<char>(dict.size() >> 8);
    file += dict + data;
    std::vector<std::byte> bytes(file.size());
    std::memcpy(bytes.data(), file.data(), file.size());
    return bytes;
  };
  write_bytes("u8.npy", npy_with_header("{'descr': '|u1', 'fortran_order': False, 'shape': (2, 2, 4), }", std::string(16, '\1')));
  write_bytes("negative_dim.npy", npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3), }", ""));
  write_bytes("overflow.npy", npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", ""));
  write_bytes("huge.npy", npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (100000, 100000, 100000), }", ""));
  const std::vector<std::byte> good = io::serialize_npy(io::DType::float64, std::vector<index_t>{2, 2, 4},
                                                        random_tensor<double>({2, 2, 4}, 1).data());
  std::vector<std::byte> altered = good;
  const std::string_view text(reinterpret_cast<const char*>(good.data()), good.size());
  std::memcpy(altered.data() + text.find("'descr':"), "'descr' ", 8);
  write_bytes("bad_dict.npy", altered);
  const Tensor<bool> keep({2, 2, 4});
  altered = io::serialize_npy(io::DType::boolean, std::vector<index_t>{2, 2, 4}, keep.data());
  altered.back() = std::byte{2};
  write_bytes("bool_byte_2.npy", altered);
  Tensor<float16> half({2, 2, 4});
  dir_.npy("S16.npy", half);

  const auto softmax = [](const std::string& scores) {
    return std::vector<std::string>{"softmax", "--scores", scores, "--out", "W.npy"};
  };
  expect(softmax("u8.npy"), 2, {"--scores ", "u8.npy: dtype '|u1' is not supported; only little-endian float16"});
  expect(softmax("negative_dim.npy"), 2, {"negative_dim.npy: dimension 1 of the shape is -3; dimensions must be non-negative"});
  expect(softmax("overflow.npy"), 2, {"overflow.npy: shape (4294967296,4294967296) has more elements than a 64-bit integer can count"});
  expect(softmax("huge.npy"), 2, {"huge.npy: shape (100000,100000,100000) of float32 needs 4000000000000000 data bytes but the file has only 0"});
  expect(softmax("bad_dict.npy"), 2, {"bad_dict.npy: the header is not a valid .npy dict: expected ':' after the key 'descr'"});
  expect(softmax("S16.npy"), 2, {"--scores ", "S16.npy: holds float16; it must hold float32 or float64"});
  expect({"softmax", "--scores", "S.npy", "--mask", "bool_byte_2.npy", "--out", "W.npy"}, 2,
         {"--mask ", "bool_byte_2.npy: bool element 15 (in C order) has the byte value 2; only 0 (False) and 1 (True)"});
  EXPECT_FALSE(std::filesystem::exists(dir_.file("W.npy")));
}

// Found by the catalogue of bad input (README): CLI11 read --seed -1 as 2^64 - 1 and saturated larger
// numbers; bench's --simd and --threads were not checked as flags.
TEST_F(CliErrors, SeedsOutsideTheGeneratorsRangeAreBadUsage) {
  expect(kSdpa + std::vector<std::string>{"--out", "O.npy", "--dropout", "0.5", "--seed", "-1"}, 2, {"--seed", "-1"});
  expect(kSdpa + std::vector<std::string>{"--out", "O.npy", "--dropout", "0.5", "--seed", "18446744073709551616"}, 2,
         {"--seed", "18446744073709551616", "from 0 to 18446744073709551615"});
  EXPECT_FALSE(std::filesystem::exists(dir_.file("O.npy")));
}

TEST_F(CliErrors, BenchFlagsOutOfRangeAreBadUsage) {
  expect({"bench", "--simd", "avx9"}, 2, {"attn bench: error: set_simd_target: target \"avx9\" is not one this build and CPU can run"});
  expect({"bench", "--threads", "-1"}, 2, {"--threads: Value -1 not in range 0 to 4096"});
}

}  // namespace
}  // namespace attn
