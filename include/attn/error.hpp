// The one exception type of attn, and how its messages are written.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace attn {

// Every argument check of the library throws attn::Error. Its message names the function,
// the argument, its shape or value and the rule it broke, for example
//   "sdpa_forward: keys has shape (2,10,3) but queries has last dimension 2; they must match".
// It derives from std::invalid_argument so that code catching standard exceptions sees it too.
class Error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// A call that would need more memory than attn may use (attn/memory.hpp): thrown before the buffer
// is allocated, its message naming the bytes. An attn::Error, so one catch sees every refusal; the
// Python module raises it as MemoryError and the command line exits 1 (a failed run, not bad usage).
class MemoryError : public Error {
 public:
  using Error::Error;
};

namespace detail {

// Concatenates anything that can be streamed: cat("n = ", n, ", m = ", m).
template <class... Parts>
std::string cat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}

template <class... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  throw Error(cat(parts...));
}

}  // namespace detail
}  // namespace attn
