// How `attn` ends, a contract for the scripts that drive it:
//   0  success (and --help)
//   1  a failed run: the inputs were valid but the work or its writing failed (an output that
//      cannot be written, a picture that cannot be drawn, memory exhausted)
//   2  bad usage: the command line (a missing, unknown or malformed flag, a value out of range)
//      or the inputs (a file that is missing, unreadable, malformed, truncated, of the wrong
//      element type, or whose shape does not fit the others) — fix the call and run it again
// Messages go to stderr as "attn <command>: error: <message>"; each names the flag, the file and
// the problem.
#pragma once

#include <stdexcept>
#include <utility>

#include "attn/error.hpp"

namespace attn_cli {

enum ExitCode : int { kSuccess = 0, kFailedRun = 1, kBadUsage = 2 };

// An error in what the caller gave: exit code 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Runs `work` (a library call on inputs the caller gave) and returns its result, turning the
// library's argument errors (attn::Error: a shape or value the operation does not accept) into
// UsageError. Anything else (attn::MemoryError, std::bad_alloc, ...) passes through as a failed run.
template <class Work>
decltype(auto) as_usage(Work&& work) {
  try {
    return std::forward<Work>(work)();
  } catch (const attn::MemoryError&) {
    throw;  // valid inputs, too large for the memory attn may use: exit 1
  } catch (const attn::Error& e) {
    throw UsageError(e.what());
  }
}

}  // namespace attn_cli
