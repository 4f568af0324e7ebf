// The `attn` command line: one CLI::App, each subcommand registered by its own file
// (demo.cpp: add_demo_command; softmax, sdpa, additive and nw come beside it).
//
// Exit codes: 0 success (and --help), 1 an error of the library or the system (attn::Error or any
// other std::exception, message on stderr), 2 a command line CLI11 could not parse.
#include <CLI/CLI.hpp>

#include <exception>
#include <iostream>

#include "attn/error.hpp"
#include "bench.hpp"
#include "demo.hpp"

int main(int argc, char** argv) {
  CLI::App app{"attn: attention scoring functions"};
  app.require_subcommand(1);
  attn_cli::add_demo_command(app);
  attn_cli::add_bench_command(app);

  // Subcommand callbacks run inside parse(), so their exceptions arrive here too. CLI::ParseError
  // derives from std::exception: it must be caught first.
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // app.exit prints the help text or the parse error; its code is 0 for --help.
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const attn::Error& e) {
    std::cerr << "attn: error: " << e.what() << '\n';
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "attn: " << e.what() << '\n';
    return 1;
  }
  return 0;
}
