// Progress lines on stderr (see progress.hpp). A ticker thread wakes a few times a second and,
// once the command has run past the delay, rewrites the line with the stage and the elapsed time.
#include "progress.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace attn_cli {
namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

Progress::Progress(std::string command) : command_(std::move(command)), start_(Clock::now()) {
  const char* mode = std::getenv("ATTN_PROGRESS");
  const std::string setting = mode ? mode : "";
  terminal_ = isatty(STDERR_FILENO) == 1;
  enabled_ = setting == "always" || (setting != "never" && terminal_);
  delay_ = setting == "always" ? Clock::duration::zero() : std::chrono::duration_cast<Clock::duration>(std::chrono::seconds(1));
  if (enabled_) ticker_ = std::thread([this] { run(); });
}

Progress::~Progress() {
  if (!enabled_) return;
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  ticker_.join();
  // An exception is on its way to main, which prints it: leave it a clean line.
  if (shown_ && terminal_) std::fputs("\r\033[K", stderr);
}

void Progress::stage(const std::string& name) {
  if (!enabled_) return;
  std::unique_lock lock(mutex_);
  stage_ = name;
  // Once due, a new stage is shown at once (the ticker keeps a terminal's line up to date).
  if (Clock::now() - start_ >= delay_) show(lock);
}

void Progress::done() {
  if (!enabled_) return;
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  ticker_.join();
  if (shown_) std::fprintf(stderr, "%sattn %s: done in %.1f s\n", terminal_ ? "\r\033[K" : "", command_.c_str(), seconds(Clock::now() - start_));
  enabled_ = false;  // the destructor has nothing left to do
}

void Progress::run() {
  std::unique_lock lock(mutex_);
  while (!stop_) {
    wake_.wait_for(lock, std::chrono::milliseconds(250));
    if (!stop_ && terminal_ && Clock::now() - start_ >= delay_) show(lock);
  }
}

void Progress::show(std::unique_lock<std::mutex>&) {
  if (stage_.empty()) return;
  const double elapsed = seconds(Clock::now() - start_);
  if (terminal_)
    std::fprintf(stderr, "\r\033[Kattn %s: %s ... %.1f s", command_.c_str(), stage_.c_str(), elapsed);
  else
    std::fprintf(stderr, "attn %s: %s (%.1f s)\n", command_.c_str(), stage_.c_str(), elapsed);
  std::fflush(stderr);
  shown_ = true;
}

}  // namespace attn_cli
