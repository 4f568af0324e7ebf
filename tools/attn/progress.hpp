// Progress on stderr for a command that takes a while: which stage it is in and for how long.
//
// When stderr is a terminal and the command runs longer than a second, one line is shown and
// rewritten in place ("attn sdpa: computing ... 2.4 s"), then ended with "done in 3.1 s". Short
// runs, and runs whose stderr is a file or a pipe, print nothing, so scripts see only errors.
// ATTN_PROGRESS=always shows every stage from the start (one line each when stderr is not a
// terminal); ATTN_PROGRESS=never shows nothing.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace attn_cli {

class Progress {
 public:
  // `command` names the subcommand in the lines ("sdpa").
  explicit Progress(std::string command);
  // Clears a line left by a run that ends by an exception, so that its error starts a fresh line.
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // The stage the command enters now: "reading inputs", "computing", "writing W.npy".
  void stage(const std::string& name);
  // The command succeeded: ends the line with the total time, if anything was shown.
  void done();

 private:
  void run();                               // the ticker thread's loop
  void show(std::unique_lock<std::mutex>&);  // prints the current state; mutex held

  std::string command_;
  bool enabled_ = false, terminal_ = false, shown_ = false, stop_ = false;
  std::chrono::steady_clock::duration delay_;
  std::chrono::steady_clock::time_point start_;
  std::string stage_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::thread ticker_;
};

}  // namespace attn_cli
