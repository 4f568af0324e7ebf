// Parity with PyTorch: every op of attn, run in float32 on the cpu backend, against the d2l chapter's
// PyTorch code (d2l's masked_softmax, DotProductAttention, AdditiveAttention) and the torch versions
// of bilinear attention and Nadaraya-Watson, under the rule of STYLE.md: for every output and gradient,
//   max |attn float32 - torch float64| <= 2 * max |torch float32 - torch float64| + 1e-6.
//
// tests/torch/make_cases.py writes the cases (inputs, parameters, the loss weights G and torch's
// results in both precisions) under the directory named by ATTN_TORCH_CASES; the CTest fixture of
// tests/torch_parity.cmake runs it first. Without ATTN_TORCH_CASES every test is skipped.
// The masks are the d2l chapter's valid lengths with MaskedFill::d2l_minus_1e6, so a valid length of 0
// gives the d2l chapter's uniform row rather than attn's default empty row.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "attn/npy.hpp"
#include "support/testing.hpp"

namespace attn {
namespace {

namespace fs = std::filesystem;

// The cases make_cases.py writes, in its order (TorchCaseList keeps the two in step).
// Their names are fixed here so that CTest can list them before the cases exist.
const std::vector<std::string> kCases = {
    "masked_softmax_d2l_lens_b", "masked_softmax_d2l_lens_q", "masked_softmax_odd_lens_q",
    "masked_softmax_zero_len",     "sdpa_d2l_example",          "sdpa_odd_lens_b",
    "sdpa_odd_lens_q",             "sdpa_no_mask",                "sdpa_zero_len",
    "sdpa_zero_len_q",             "sdpa_large_scores",           "sdpa_heads",
    "additive_d2l_example",      "additive_odd_lens_b",         "additive_zero_len_q",
    "additive_no_mask",            "bilinear_odd_lens_b",         "bilinear_zero_len_q",
    "bilinear_no_mask",            "nw_gaussian_d2l_1d",        "nw_boxcar_d2l_1d",
    "nw_epanechnikov_d2l_1d",    "nw_constant_d2l_1d",        "nw_gaussian_odd",
    "nw_boxcar_odd",               "nw_epanechnikov_odd",         "nw_constant_odd",
};

// The directory of the cases, or "" when ATTN_TORCH_CASES is not set.
std::string cases_root() {
  const char* root = std::getenv("ATTN_TORCH_CASES");
  return root ? root : "";
}

#define ATTN_SKIP_WITHOUT_CASES()                                                                        \
  if (cases_root().empty())                                                                              \
  GTEST_SKIP() << "ATTN_TORCH_CASES is not set. Generate the cases with\n"                               \
                  "  /usr/bin/python3 tests/torch/make_cases.py DIR\n"                                   \
                  "and run with ATTN_TORCH_CASES=DIR, or run `ctest -R torch`, whose fixture does both."

// One case directory: inputs as <name>.npy, torch's results as <name>.f32.npy and <name>.f64.npy,
// flags in meta.json.
class TorchCase {
 public:
  explicit TorchCase(const std::string& name) : name_(name), dir_(fs::path(cases_root()) / name) {
    std::ifstream in(dir_ / "meta.json");
    if (!in) throw std::runtime_error("cannot open " + (dir_ / "meta.json").string());
    std::stringstream ss;
    ss << in.rdbuf();
    meta_ = ss.str();
  }

  const std::string& name() const { return name_; }

  // A string flag of meta.json ("op", "valid_lens", "fill", "kernel"); "" when absent. meta.json is
  // written by make_cases.py with json.dump, so a flat `"key": "value"` search is enough.
  std::string flag(const std::string& key) const {
    const std::string pattern = "\"" + key + "\": \"";
    const auto at = meta_.find(pattern);
    if (at == std::string::npos) return "";
    const auto start = at + pattern.size();
    return meta_.substr(start, meta_.find('"', start) - start);
  }

  bool has(const std::string& input) const { return fs::exists(dir_ / (input + ".npy")); }

  template <class T>
  Tensor<T> input(const std::string& input) const {
    return read<T>(input + ".npy");
  }
  Tensor<float> torch32(const std::string& result) const { return read<float>(result + ".f32.npy"); }
  Tensor<double> torch64(const std::string& result) const { return read<double>(result + ".f64.npy"); }

 private:
  template <class T>
  Tensor<T> read(const std::string& file) const {
    const std::string path = (dir_ / file).string();
    return io::read_npy(path).to_tensor<T>(path);
  }

  std::string name_;
  fs::path dir_;
  std::string meta_;
};

// "(1,2,3)" for the flat index `i` of a C-order tensor of `shape`.
std::string index_string(const std::vector<index_t>& shape, index_t i) {
  std::vector<index_t> ix(shape.size());
  for (std::size_t k = shape.size(); k-- > 0;) {
    ix[k] = i % shape[k];
    i /= shape[k];
  }
  return detail::dims_string(ix);
}

// Checks one output or gradient of attn against torch under the 2x rule, and prints the numbers.
void expect_matches_torch(const TorchCase& c, const std::string& result, const Tensor<float>& got) {
  const Tensor<float> t32 = c.torch32(result);
  const Tensor<double> t64 = c.torch64(result);
  ASSERT_EQ(got.shape(), t64.shape()) << c.name() << ": " << result << " has shape " << got.shape_string()
                                      << " in attn but " << t64.shape_string() << " in torch";
  double err = 0, ref_err = 0;
  index_t worst = 0;
  for (index_t i = 0; i < got.numel(); ++i) {
    const double e = std::abs(static_cast<double>(got[i]) - t64[i]);
    if (!(e <= err)) {  // NaN counts as the worst
      err = std::isnan(e) ? INFINITY : e;
      worst = i;
    }
    ref_err = std::max(ref_err, std::abs(static_cast<double>(t32[i]) - t64[i]));
  }
  const double budget = 2.0 * ref_err + 1e-6;
  std::printf("  %-28s %-9s attn error %-10.3g budget %-10.3g (torch float32 error %.3g)\n", c.name().c_str(),
              result.c_str(), err, budget, ref_err);
  EXPECT_TRUE(testing::within_error_budget(got, t32, t64))
      << c.name() << ": " << result << " of shape " << got.shape_string() << "; worst at "
      << index_string(got.shape(), worst) << ": attn " << got[worst] << ", torch float32 " << t32[worst]
      << ", torch float64 " << t64[worst];
}

// The d2l chapter's masks: valid lengths (B,) or (B, n) when the case has them, masked scores set to -1e6.
Mask<float> d2l_mask(const TorchCase& c, const Tensor<std::int64_t>& lens) {
  Mask<float> mask;
  if (c.has("valid_lens")) mask.valid_lens = lens.view();
  EXPECT_EQ(c.flag("fill"), "d2l_minus_1e6");
  mask.fill = MaskedFill::d2l_minus_1e6;
  return mask;
}

Tensor<std::int64_t> valid_lens_of(const TorchCase& c) {
  return c.has("valid_lens") ? c.input<std::int64_t>("valid_lens") : Tensor<std::int64_t>{};
}

// A tensor of the shape of `like` (used for outputs and gradients).
template <class T>
Tensor<float> like(const Tensor<T>& t) {
  return Tensor<float>(std::span<const index_t>(t.shape()));
}

// Output shape (..., n, v) from queries (..., n, d) and values (..., m, v).
Tensor<float> out_like(const Tensor<float>& queries, const Tensor<float>& values) {
  std::vector<index_t> shape = queries.shape();
  shape.back() = values.shape().back();
  return Tensor<float>(std::span<const index_t>(shape));
}

// Weights shape (..., n, m).
Tensor<float> weights_like(const Tensor<float>& queries, const Tensor<float>& keys) {
  std::vector<index_t> shape = queries.shape();
  shape.back() = keys.dim(-2);
  return Tensor<float>(std::span<const index_t>(shape));
}

void check_masked_softmax(const TorchCase& c) {
  const Tensor<float> scores = c.input<float>("scores"), g = c.input<float>("G");
  const Tensor<std::int64_t> lens = valid_lens_of(c);
  const Mask<float> mask = d2l_mask(c, lens);
  Tensor<float> weights = like(scores), dscores = like(scores);
  masked_softmax_forward<float>(weights.view(), scores.cview(), mask);
  masked_softmax_backward<float>(dscores.view(), g.cview(), weights.cview(), mask);
  expect_matches_torch(c, "weights", weights);
  expect_matches_torch(c, "dscores", dscores);
}

void check_sdpa(const TorchCase& c) {
  const Tensor<float> q = c.input<float>("queries"), k = c.input<float>("keys"), v = c.input<float>("values");
  const Tensor<float> g = c.input<float>("G");
  const Tensor<std::int64_t> lens = valid_lens_of(c);
  const Mask<float> mask = d2l_mask(c, lens);
  Tensor<float> out = out_like(q, v), weights = weights_like(q, k);
  std::vector<index_t> lse_shape = q.shape();
  lse_shape.pop_back();
  Tensor<float> lse{std::span<const index_t>(lse_shape)};
  sdpa_forward<float>(out.view(), lse.view(), weights.view(), q.cview(), k.cview(), v.cview(), mask);
  Tensor<float> dq = like(q), dk = like(k), dv = like(v);
  sdpa_backward<float>(dq.view(), dk.view(), dv.view(), g.cview(), q.cview(), k.cview(), v.cview(), out.cview(),
                       lse.cview(), mask);
  expect_matches_torch(c, "out", out);
  expect_matches_torch(c, "weights", weights);
  expect_matches_torch(c, "dqueries", dq);
  expect_matches_torch(c, "dkeys", dk);
  expect_matches_torch(c, "dvalues", dv);
}

void check_additive(const TorchCase& c) {
  const Tensor<float> q = c.input<float>("queries"), k = c.input<float>("keys"), v = c.input<float>("values");
  const Tensor<float> g = c.input<float>("G");
  const Tensor<float> w_q = c.input<float>("W_q"), w_k = c.input<float>("W_k"), w_v = c.input<float>("w_v");
  const Tensor<std::int64_t> lens = valid_lens_of(c);
  const Mask<float> mask = d2l_mask(c, lens);
  const AdditiveParams<float> params{w_q.view(), w_k.view(), w_v.view()};
  Tensor<float> out = out_like(q, v), weights = weights_like(q, k);
  additive_attention_forward<float>(out.view(), weights.view(), q.cview(), k.cview(), v.cview(), params, mask);
  Tensor<float> dq = like(q), dk = like(k), dv = like(v), dw_q = like(w_q), dw_k = like(w_k), dw_v = like(w_v);
  const AdditiveGrads<float> grads{dw_q.view(), dw_k.view(), dw_v.view()};
  additive_attention_backward<float>(dq.view(), dk.view(), dv.view(), grads, g.cview(), q.cview(), k.cview(),
                                     v.cview(), params, mask);
  expect_matches_torch(c, "out", out);
  expect_matches_torch(c, "weights", weights);
  expect_matches_torch(c, "dqueries", dq);
  expect_matches_torch(c, "dkeys", dk);
  expect_matches_torch(c, "dvalues", dv);
  expect_matches_torch(c, "dW_q", dw_q);
  expect_matches_torch(c, "dW_k", dw_k);
  expect_matches_torch(c, "dw_v", dw_v);
}

void check_bilinear(const TorchCase& c) {
  const Tensor<float> q = c.input<float>("queries"), k = c.input<float>("keys"), v = c.input<float>("values");
  const Tensor<float> g = c.input<float>("G"), w = c.input<float>("W");
  const Tensor<std::int64_t> lens = valid_lens_of(c);
  const Mask<float> mask = d2l_mask(c, lens);
  Tensor<float> out = out_like(q, v), weights = weights_like(q, k);
  bilinear_attention_forward<float>(out.view(), weights.view(), q.cview(), k.cview(), v.cview(), w.cview(), mask);
  Tensor<float> dq = like(q), dk = like(k), dv = like(v), dw = like(w);
  bilinear_attention_backward<float>(dq.view(), dk.view(), dv.view(), dw.view(), g.cview(), q.cview(), k.cview(),
                                     v.cview(), w.cview(), mask);
  expect_matches_torch(c, "out", out);
  expect_matches_torch(c, "weights", weights);
  expect_matches_torch(c, "dqueries", dq);
  expect_matches_torch(c, "dkeys", dk);
  expect_matches_torch(c, "dvalues", dv);
  expect_matches_torch(c, "dW", dw);
}

void check_nadaraya_watson(const TorchCase& c) {
  const Tensor<float> q = c.input<float>("queries"), k = c.input<float>("keys"), v = c.input<float>("values");
  const Tensor<float> g = c.input<float>("G"), sigma = c.input<float>("sigma");  // sigma: shape ()
  const Kernel kernel = kernel_from_name(c.flag("kernel"));
  Tensor<float> out = out_like(q, v), weights = weights_like(q, k);
  nadaraya_watson_forward<float>(out.view(), weights.view(), q.cview(), k.cview(), v.cview(), kernel, sigma[0]);
  Tensor<float> dq = like(q), dk = like(k), dv = like(v), dsigma = like(sigma);
  nadaraya_watson_backward<float>(dq.view(), dk.view(), dv.view(), dsigma.data(), g.cview(), q.cview(), k.cview(),
                                  v.cview(), kernel, sigma[0]);
  expect_matches_torch(c, "out", out);
  expect_matches_torch(c, "weights", weights);
  expect_matches_torch(c, "dqueries", dq);
  expect_matches_torch(c, "dkeys", dk);
  expect_matches_torch(c, "dvalues", dv);
  expect_matches_torch(c, "dsigma", dsigma);
}

// A case name, printed bare: CTest names each test torch/TorchParity.Within2xTorchFloat32Error/<case>.
struct CaseName {
  std::string name;
};
void PrintTo(const CaseName& c, std::ostream* os) { *os << c.name; }

class TorchParity : public ::testing::TestWithParam<CaseName> {};

// The cpu backend, the one users run, in float32 as the d2l chapter's code runs.
TEST_P(TorchParity, Within2xTorchFloat32Error) {
  ATTN_SKIP_WITHOUT_CASES();
  ScopedBackend cpu(Backend::cpu);
  const TorchCase c(GetParam().name);
  const std::string op = c.flag("op");
  std::printf("%s: op %s, valid_lens %s%s%s\n", c.name().c_str(), op.c_str(), c.flag("valid_lens").c_str(),
              c.flag("kernel").empty() ? "" : ", kernel ", c.flag("kernel").c_str());
  if (op == "masked_softmax") check_masked_softmax(c);
  else if (op == "sdpa") check_sdpa(c);
  else if (op == "additive") check_additive(c);
  else if (op == "bilinear") check_bilinear(c);
  else if (op == "nw") check_nadaraya_watson(c);
  else FAIL() << c.name() << ": meta.json names the unknown op '" << op << "'";
}

std::vector<CaseName> all_cases() {
  std::vector<CaseName> cs;
  for (const std::string& name : kCases) cs.push_back({name});
  return cs;
}

// "torch/" starts every test name, so that `ctest -R torch` selects them with their fixture.
INSTANTIATE_TEST_SUITE_P(torch, TorchParity, ::testing::ValuesIn(all_cases()));

// make_cases.py lists what it wrote in cases.txt; a case added there must be added to kCases too.
// (A one-value parameterised test only to give it the "torch/" prefix.)
class TorchCaseList : public ::testing::TestWithParam<int> {};

TEST_P(TorchCaseList, MatchesTheGenerator) {
  ATTN_SKIP_WITHOUT_CASES();
  std::ifstream in(fs::path(cases_root()) / "cases.txt");
  ASSERT_TRUE(in) << "cannot open " << (fs::path(cases_root()) / "cases.txt") << "; run make_cases.py";
  std::vector<std::string> written;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) written.push_back(line);
  EXPECT_EQ(written, kCases);
}

INSTANTIATE_TEST_SUITE_P(torch, TorchCaseList, ::testing::Values(0));

}  // namespace
}  // namespace attn
