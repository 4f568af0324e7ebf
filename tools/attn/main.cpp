// The `attn` program: the command (cli.cpp) run on the process's arguments.
#include "cli.hpp"

int main(int argc, char** argv) { return attn_cli::run(argc, argv); }
