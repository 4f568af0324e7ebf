// Running the `attn` binary from a test: a scratch directory per test for the .npy files it reads
// and writes, and the exit code, stdout and stderr of each run. The binary's path comes from the
// ATTN_CLI definition that tests/cli.cmake gives the CLI test targets.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "attn/npy.hpp"

namespace attn::testing {

struct CliResult {
  int code = -1;
  std::string out, err;
};

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A test's own empty directory, removed with it; file(name) is a path inside it.
class ScratchDir {
 public:
  ScratchDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = "attn_cli_" + std::to_string(::getpid()) + "_" + info->test_suite_name() + "_" + info->name();
    std::replace(name.begin(), name.end(), '/', '_');  // typed suites are "Suite/0": one directory, not two
    dir_ = std::filesystem::path(::testing::TempDir()) / name;
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  ~ScratchDir() { std::filesystem::remove_all(dir_); }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  std::string file(const std::string& name) const { return (dir_ / name).string(); }

  // Writes `tensor` to file(name) and returns that path.
  template <class T>
  std::string npy(const std::string& name, const Tensor<T>& tensor) const {
    io::write_npy(file(name), tensor);
    return file(name);
  }

  // Runs `attn args...` with `env` (e.g. "ATTN_PROGRESS=always") before it; captures its output.
  CliResult run(const std::vector<std::string>& args, const std::string& env = "") const {
    // Appended piece by piece: "literal" + std::string trips g++ 12's false -Wrestrict warning.
    std::string command = env;
    command.append(" ").append(quote(ATTN_CLI));
    for (const std::string& a : args) command.append(" ").append(quote(a));
    return run_shell(command);
  }

  // Runs a sh command line; captures its output.
  CliResult run_shell(std::string command) const {
    command.append(" >").append(quote(file("stdout.txt"))).append(" 2>").append(quote(file("stderr.txt")));
    command.append(" </dev/null");
    const int status = std::system(command.c_str());
    CliResult r;
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    r.out = read_file(file("stdout.txt"));
    r.err = read_file(file("stderr.txt"));
    return r;
  }

  // The tensor in file(name), which must hold T.
  template <class T>
  Tensor<T> load(const std::string& name) const {
    return io::read_npy(file(name)).to_tensor<T>(name);
  }

 private:
  // `s` in single quotes for sh, with any single quote in it escaped.
  static std::string quote(const std::string& s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
  }

  std::filesystem::path dir_;
};

}  // namespace attn::testing
