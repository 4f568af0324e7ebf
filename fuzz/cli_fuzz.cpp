// libFuzzer target for the command line's flag parsing, in process: the bytes become an argv of
// subcommands, flags and values from a dictionary (the flags of every command, small .npy inputs
// written once into a temporary directory, numbers, windows, kernel names) and of arbitrary tokens,
// run through attn_cli::run (tools/attn/cli.hpp). The promise checked: every argv ends with an exit
// code of exit_codes.hpp (0, 1 or 2), 2 when no command is named; a crash, a sanitizer report, an
// escaped exception or a hang (libFuzzer's -timeout) is a finding.
//
// Containment: each run happens with the temporary directory as the working directory, and no
// token holds a '/' except the dictionary's paths into that directory, so whatever a command
// writes lands there (and is removed after the run). `bench` and `demo`, which take seconds, only
// ever appear followed by --help. The inputs are a few elements each, so a run takes milliseconds.
//
// Build with -DATTN_FUZZ=ON and clang++ (CMakeLists.txt), then for example
//   build/fuzz/cli_fuzz -timeout=10 -max_total_time=600 new-corpus fuzz/corpus/cli
// (no -dict: the bytes index the dictionary above, so libFuzzer's own dictionaries would add nothing).
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "attn/half.hpp"
#include "attn/npy.hpp"
#include "cli.hpp"

namespace {

namespace fs = std::filesystem;
using attn::index_t;
using attn::io::DType;

std::string g_dir;                // the temporary working directory of every run
std::set<std::string> g_inputs;   // the names of the inputs written there, kept between runs
std::vector<std::string> g_words; // the dictionary argv is built from: the commands, the flags, values and files

// The commands (bench and demo always followed by --help: their runs take seconds) and every flag.
constexpr const char* kCommands[] = {"softmax", "sdpa", "additive", "nw", "kreg", "bench", "demo"};
constexpr const char* kFlags[] = {
    "--help", "-h", "--version", "--queries", "--keys", "--values", "--valid-lens", "--mask", "--causal",
    "--bottom-right", "--window", "--alibi", "--segment-ids", "--key-segment-ids", "--scale", "--softcap", "--dropout",
    "--seed", "--lse", "--compute", "--out", "--weights", "--heatmap", "--scores", "--wq", "--wk", "--wv", "--x-train",
    "--y-train", "--x-query", "--kernel", "--width", "--plot", "--out-dir", "--json", "--large", "--threads", "--filter",
    "--simd", "--seconds", "--distributed", "--", "--x", "--y", "--var-type", "--degree", "--bandwidth", "--slopes",
    "--band", "--level", "--band-method", "--replicates"};
constexpr std::size_t kNumCommands = std::size(kCommands), kNumFlags = std::size(kFlags);
long g_codes[3] = {0, 0, 0};      // runs that exited 0, 1 and 2 (printed at exit with FUZZ_STATS=1)

// Writes one input file of `dtype` with `count` elements of `shape` from `values` (cycled).
template <class T>
void write_input(const std::string& name, DType dtype, std::vector<index_t> shape, std::vector<T> values) {
  index_t count = 1;
  for (index_t s : shape) count *= s;
  std::vector<T> data(static_cast<std::size_t>(count));
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = values[i % values.size()];
  attn::io::write_npy(g_dir + "/" + name, dtype, shape, data.data());
  g_inputs.insert(name);
}

void write_inputs() {
  const std::vector<float> f = {0.5f, -1.25f, 2.0f, 0.0f, 3.5f, -0.75f, 1.0f};
  const std::vector<double> d = {0.25, -2.0, 1.5, 0.0, -0.5, 3.0};
  write_input("q.npy", DType::float32, {2, 3, 4}, f);
  write_input("k.npy", DType::float32, {2, 5, 4}, f);
  write_input("v.npy", DType::float32, {2, 5, 3}, f);
  write_input("kn.npy", DType::float32, {2, 3, 4}, f);  // n == m, for segment ids
  write_input("q4.npy", DType::float32, {1, 2, 3, 4}, f);
  write_input("k4.npy", DType::float32, {1, 2, 5, 4}, f);
  write_input("v4.npy", DType::float32, {1, 2, 5, 3}, f);
  write_input("qd.npy", DType::float64, {2, 3, 4}, d);
  write_input("kd.npy", DType::float64, {2, 5, 4}, d);
  write_input("vd.npy", DType::float64, {2, 5, 3}, d);
  std::vector<std::uint16_t> h;
  for (float x : f) h.push_back(attn::to_float16(x).bits);
  write_input("qh.npy", DType::float16, {2, 3, 4}, h);
  write_input("kh.npy", DType::float16, {2, 5, 4}, h);
  write_input("vh.npy", DType::float16, {2, 5, 3}, h);
  write_input("lens.npy", DType::int64, {2}, std::vector<std::int64_t>{2, 5});
  write_input("lensq.npy", DType::int32, {2, 3}, std::vector<std::int32_t>{0, 1, 5, 3, 2, 4});
  write_input("lensbad.npy", DType::int64, {2}, std::vector<std::int64_t>{7, -1});
  write_input("mask.npy", DType::boolean, {2, 3, 5}, std::vector<std::uint8_t>{1, 0, 1, 1});
  write_input("keypad.npy", DType::boolean, {2, 1, 5}, std::vector<std::uint8_t>{1, 1, 0});
  write_input("seg.npy", DType::int32, {2, 3}, std::vector<std::int32_t>{0, 0, 1});
  write_input("segk.npy", DType::int64, {2, 5}, std::vector<std::int64_t>{0, 1, 1, 2, 0});
  write_input("alibi.npy", DType::float32, {1}, std::vector<float>{0.5f});
  write_input("alibi2.npy", DType::float32, {2, 2}, std::vector<float>{0.5f, 0.25f});
  write_input("scores.npy", DType::float32, {2, 3, 5}, f);
  write_input("scoresd.npy", DType::float64, {1, 2, 3, 5}, d);
  write_input("wq.npy", DType::float32, {6, 4}, f);
  write_input("wk.npy", DType::float32, {6, 4}, f);
  write_input("wv.npy", DType::float32, {6}, f);
  write_input("x.npy", DType::float32, {8}, f);
  write_input("y.npy", DType::float32, {8}, f);
  write_input("xq.npy", DType::float32, {5}, f);
  write_input("x2.npy", DType::float64, {8, 2}, d);
  write_input("xq2.npy", DType::float64, {5, 2}, d);
  write_input("yd.npy", DType::float64, {8}, d);
  write_input("bw.npy", DType::float64, {2}, std::vector<double>{0.5, 0.25});
  write_input("empty.npy", DType::float32, {0, 3, 4}, f);
  for (const char* name : {"garbage.npy", "notes.txt"}) {
    std::FILE* file = std::fopen((g_dir + "/" + name).c_str(), "wb");
    std::fputs("\x93NUMPY\x01\x00{'descr': '<f4', 'shape': (9999999999, 2)}", file);
    std::fclose(file);
    g_inputs.insert(name);
  }
}

void make_dictionary() {
  for (const char* w : kCommands) g_words.push_back(w);
  for (const char* w : kFlags) g_words.push_back(w);
  for (const char* w : {"0", "1", "-1", "2", "0.5", "-0.1", "1.5", "1e308", "nan", "inf", "-inf", "1e-320", "7",
                        "18446744073709551615", "18446744073709551616", "2,0", "-1,-1", "0,0", "1,x", "3", "",
                        "auto", "gaussian", "boxcar", "epanechnikov", "constant", "bf16", "f16",
                        "tricube", "uniform", "cv_ls", "aic", "dpi", "c", "cc", "cu", "co", "asymptotic", "bootstrap",
                        "out.npy", "w.npy", "lse.npy", "heat.svg", "heat.png", "heat.jpg", "plot.svg", "plot.png"})
    g_words.push_back(w);
  for (const std::string& name : g_inputs) g_words.push_back(g_dir + "/" + name);
}

// Reads the fuzzer's bytes; past the end every read gives 0.
class Bytes {
 public:
  Bytes(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  std::uint8_t u8() { return pos_ < size_ ? data_[pos_++] : 0; }
  bool exhausted() const { return pos_ >= size_; }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

// A token of the bytes themselves: up to 15 of them, no NUL, no '/' (so a path stays in the directory).
std::string raw_token(Bytes& in) {
  std::string s;
  for (int n = in.u8() % 16; n > 0; --n) {
    char c = static_cast<char>(in.u8());
    s += c == '\0' || c == '/' ? '_' : c;
  }
  return s;
}

// The argv the bytes say: a command first (mostly), then tokens: dictionary words, `--flag=value`
// pairs and raw tokens. bench and demo are always followed by --help.
std::vector<std::string> make_argv(Bytes& in) {
  std::vector<std::string> argv = {"attn"};
  bool positional = false;  // after "--", a --help would be a positional, not help
  auto push = [&](std::string word) {
    const bool slow = word == "bench" || word == "demo";
    if (slow && positional) word = "x";
    positional = positional || word == "--";
    argv.push_back(std::move(word));
    if (slow && positional) return;
    if (slow) argv.push_back("--help");
  };
  const std::uint8_t first = in.u8();
  if (first < 224) push(g_words[first % kNumCommands]);
  while (!in.exhausted() && argv.size() < 32) {
    const std::uint8_t b = in.u8();
    if (b < 200) {
      push(g_words[in.u8() % g_words.size()]);
    } else if (b < 230) {
      std::string flag = g_words[kNumCommands + in.u8() % kNumFlags], value = g_words[in.u8() % g_words.size()];
      if (value == "bench" || value == "demo") value = "x";
      argv.push_back(flag + "=" + value);
    } else {
      std::string raw = raw_token(in);
      if (raw == "bench" || raw == "demo") raw = "x";
      argv.push_back(raw);
    }
  }
  return argv;
}

// Every file a run left in the directory, gone (the inputs stay).
void clean_directory() {
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(g_dir, ec))
    if (!g_inputs.contains(e.path().filename().string())) fs::remove_all(e.path(), ec);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  char dir[] = "/tmp/attn_cli_fuzz.XXXXXX";
  if (mkdtemp(dir) == nullptr) {
    std::perror("cli_fuzz: mkdtemp");
    std::abort();
  }
  g_dir = dir;
  setenv("ATTN_PROGRESS", "never", 1);
  if (std::freopen("/dev/null", "w", stdout) == nullptr) std::abort();  // printf of `attn nw --width auto`
  write_inputs();
  make_dictionary();
  // Removes the directory at exit (libFuzzer ends by exit(), a crash leaves it for inspection).
  std::atexit([] {
    std::error_code ec;
    fs::remove_all(g_dir, ec);
    if (std::getenv("FUZZ_STATS") != nullptr)
      std::fprintf(stderr, "cli_fuzz: exit codes 0: %ld, 1: %ld, 2: %ld\n", g_codes[0], g_codes[1], g_codes[2]);
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Bytes in(data, size);
  const std::vector<std::string> args = make_argv(in);
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  bool command = false, help = false;
  for (const std::string& a : args) {
    for (const char* c : kCommands) command = command || a == c;
    // --help=x and -hx ask for help too (CLI11 reads the flag before complaining about the rest).
    help = help || a.starts_with("--help") || a.starts_with("-h") || a.starts_with("--version");
  }

  // The run's messages are discarded; its files land in the directory.
  const fs::path cwd = fs::current_path();
  fs::current_path(g_dir);
  std::ostringstream sink;
  std::streambuf* out = std::cout.rdbuf(sink.rdbuf());
  std::streambuf* err = std::cerr.rdbuf(sink.rdbuf());
  int code = -1;
  try {
    code = attn_cli::run(static_cast<int>(args.size()), argv.data());
  } catch (const std::exception& e) {
    std::cerr.rdbuf(err);
    std::fprintf(stderr, "cli_fuzz: an exception escaped attn_cli::run: %s\n", e.what());
    std::abort();
  }
  std::cout.rdbuf(out), std::cerr.rdbuf(err);
  fs::current_path(cwd);
  clean_directory();

  if (code != 0 && code != 1 && code != 2) {
    std::fprintf(stderr, "cli_fuzz: attn exited with %d, not 0, 1 or 2\n", code);
    std::abort();
  }
  ++g_codes[code];
  if (!command && !help && code != 2) {
    std::fprintf(stderr, "cli_fuzz: attn without a command exited with %d, not 2 (bad usage)\n", code);
    std::abort();
  }
  return 0;
}
