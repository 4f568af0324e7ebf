// The `attn` command line.
#include <CLI/CLI.hpp>

int main(int argc, char** argv) {
  CLI::App app{"attn: attention scoring functions"};
  app.require_subcommand(1);
  app.add_subcommand("demo", "run the seeds' examples");
  CLI11_PARSE(app, argc, argv);
  return 0;
}
