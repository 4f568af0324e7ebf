// `attn demo`: every example of the d2l chapter, run without input files, printed with the Python line it
// reproduces so that a newcomer can follow the chapter with the C++ library beside it.
#pragma once

#include <ostream>
#include <string>

namespace CLI {
class App;
}

namespace attn_cli {

// Registers the `demo` subcommand on `app`; its callback calls run_demo(std::cout, --out-dir).
void add_demo_command(CLI::App& app);

// Runs the examples (deterministic: fixed seeds) and prints them to `os`; with an `out_dir`, also
// draws the chapter's pictures there (demo_figures.hpp). Library errors propagate as attn::Error.
void run_demo(std::ostream& os, const std::string& out_dir = "");

}  // namespace attn_cli
