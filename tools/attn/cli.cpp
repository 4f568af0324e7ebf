// The `attn` command line: one CLI::App, each subcommand registered by its own file
// (softmax.cpp, sdpa.cpp, additive.cpp, nw.cpp, kreg.cpp, demo.cpp, bench.cpp). The exit codes are a contract for the
// scripts that drive attn; exit_codes.hpp states it and this is where it is kept. attn_cli::run
// (cli.hpp) is the whole command: main() (main.cpp) only calls it, and the in-process fuzzer
// fuzz/cli_fuzz.cpp and its corpus replay call it themselves.
#include <CLI/CLI.hpp>

#include <exception>
#include <iostream>
#include <new>
#include <string>

#include "attn/error.hpp"
#include "attn/version.hpp"
#include "bench.hpp"
#include "cli.hpp"
#include "commands.hpp"
#include "demo.hpp"
#include "exit_codes.hpp"

namespace {

// "attn sdpa" when a subcommand was recognised, else "attn": how error messages start.
std::string who(const CLI::App& app) {
  const auto chosen = app.get_subcommands();
  return chosen.empty() ? "attn" : "attn " + chosen.front()->get_name();
}

}  // namespace

namespace attn_cli {

int run(int argc, char** argv) {
  CLI::App app{"attn: attention scoring functions on .npy files"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("attn ") + attn::version(), "Print attn's version and exit");
  add_softmax_command(app);
  add_sdpa_command(app);
  add_additive_command(app);
  add_nw_command(app);
  add_kreg_command(app);
  add_demo_command(app);
  add_bench_command(app);
  // An empty value ('--scale ""', '--valid-lens ""') is malformed: CLI11 reads it as 0 or as no file.
  const CLI::Validator non_empty([](std::string& value) { return value.empty() ? std::string("the value is empty") : std::string(); },
                                 "", "NONEMPTY");
  for (CLI::App* command : app.get_subcommands([](CLI::App*) { return true; }))
    for (CLI::Option* option : command->get_options())
      if (option->get_items_expected_max() > 0) option->check(non_empty);
  // Set after the subcommands: CLI11 copies a parent's footer into subcommands created after it.
  app.footer(
      "Run attn COMMAND --help for a command's flags and an example.\n"
      "Exit codes: 0 success; 2 bad usage: a missing, unknown or malformed flag, or an input file that is\n"
      "missing, unreadable, malformed, of the wrong type or shape; 1 a failed run: valid inputs, but the\n"
      "work or writing its outputs failed. Errors go to stderr, naming the flag, the file and the problem.");

  // Subcommand callbacks run inside parse(), so their exceptions arrive here too. CLI::ParseError
  // derives from std::exception: it must be caught first.
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help: CLI11 prints it
    std::cerr << who(app) << ": error: ";
    // CLI11 reports a misspelt command as a missing one; name the word it did not know.
    if (app.get_subcommands().empty() && argc > 1 && argv[1][0] != '-') {
      std::cerr << "unknown command \"" << argv[1] << "\"; the commands are";
      for (const CLI::App* command : app.get_subcommands([](CLI::App*) { return true; }))
        std::cerr << ' ' << command->get_name();
    } else {
      std::cerr << e.what();
    }
    std::cerr << "\nRun '" << who(app) << " --help' for the flags and an example.\n";
    return kBadUsage;
  } catch (const UsageError& e) {
    std::cerr << who(app) << ": error: " << e.what() << '\n';
    return kBadUsage;
  } catch (const std::bad_alloc&) {
    std::cerr << who(app) << ": error: out of memory\n";
    return kFailedRun;
  } catch (const std::exception& e) {
    std::cerr << who(app) << ": error: " << e.what() << '\n';
    return kFailedRun;
  }
  return kSuccess;
}

}  // namespace attn_cli
