// The `attn` command as a function (cli.cpp): main() (main.cpp) calls it, and so do the in-process
// fuzzer fuzz/cli_fuzz.cpp and its corpus replay, which build tools/attn without main.cpp.
#pragma once

namespace attn_cli {

// Parses argv (argv[0] the program's name) and runs the subcommand it names. Returns the exit code
// of exit_codes.hpp (0 success and --help, 1 a failed run, 2 bad usage); messages go to std::cout
// and std::cerr. Each call builds its own CLI::App: calls share no state.
int run(int argc, char** argv);

}  // namespace attn_cli
