// The subcommands of `attn`, one file each; cli.cpp registers them all on its CLI::App.
// (demo.hpp declares add_demo_command, with the demo's own entry point.)
#pragma once

namespace CLI {
class App;
}

namespace attn_cli {

void add_softmax_command(CLI::App& app);   // softmax.cpp
void add_sdpa_command(CLI::App& app);      // sdpa.cpp
void add_additive_command(CLI::App& app);  // additive.cpp
void add_nw_command(CLI::App& app);        // nw.cpp
void add_kreg_command(CLI::App& app);      // kreg.cpp

}  // namespace attn_cli
