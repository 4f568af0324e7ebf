// `attn demo`: every example of the seeds, run without input files, printed with the Python line it
// reproduces so that a newcomer can follow the chapter with the C++ library beside it.
#pragma once

#include <ostream>

namespace CLI {
class App;
}

namespace attn_cli {

// Registers the `demo` subcommand on `app`; its callback calls run_demo(std::cout).
void add_demo_command(CLI::App& app);

// Runs the examples (deterministic: fixed seeds) and prints them to `os`.
// Library errors propagate as attn::Error.
void run_demo(std::ostream& os);

}  // namespace attn_cli
