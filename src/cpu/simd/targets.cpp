// Which SIMD target the fused kernels run: Highway's run-time choice among the compiled targets,
// restricted by set_simd_target or ATTN_SIMD_TARGET (attn/config.hpp).
#include <hwy/highway.h>
#include <hwy/targets.h>

#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <mutex>

#include "attn/config.hpp"
#include "attn/error.hpp"
#include "cpu/simd/fused.hpp"

namespace attn {
namespace {

std::string lower(const char* name) {
  std::string s(name);
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Our name of a target: Highway's in lower case, except that the portable fallback (EMU128, or
// SCALAR where a compiler gets that one) is "scalar" whichever one this build has.
std::string target_name(std::int64_t bit) {
  if (bit == HWY_EMU128 || bit == HWY_SCALAR) return "scalar";
  return lower(hwy::TargetName(bit));
}

std::mutex& target_mutex() {
  static std::mutex m;
  return m;
}

std::int64_t& chosen() {  // the target set here (one bit), 0 for the best
  static std::int64_t t = 0;
  return t;
}

// Restricts dispatch to `target` (a single bit) and the targets below it, so it is the best left.
void restrict_to(std::int64_t target) {
  chosen() = target;
  hwy::DisableTargets(target == 0 ? 0 : target - 1);  // lower bits are better targets
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
}

// The compiled targets this CPU supports, whatever the restriction set here.
std::int64_t available() {
  hwy::DisableTargets(0);
  const std::int64_t t = hwy::SupportedTargets() & HWY_TARGETS;
  restrict_to(chosen());
  return t;
}

std::int64_t target_named(const std::string& name) {
  for (std::int64_t t = available(); t != 0; t &= t - 1) {
    const std::int64_t bit = t & -t;
    if (target_name(bit) == name) return bit;
  }
  return 0;
}

}  // namespace

std::vector<std::string> simd_targets() {
  cpu::fused::init_simd_target();
  std::lock_guard lock(target_mutex());
  std::vector<std::string> names;
  for (std::int64_t t = available(); t != 0; t &= t - 1) names.push_back(target_name(t & -t));
  return names;
}

std::string simd_target() {
  cpu::fused::init_simd_target();
  std::lock_guard lock(target_mutex());
  const std::int64_t t = hwy::SupportedTargets() & HWY_TARGETS;
  return target_name(t & -t);
}

void set_simd_target(const std::string& name) {
  cpu::fused::init_simd_target();
  std::lock_guard lock(target_mutex());
  if (name.empty()) return restrict_to(0);
  const std::int64_t bit = target_named(name);
  if (bit == 0) {
    std::string known;
    for (std::int64_t t = available(); t != 0; t &= t - 1) known += (known.empty() ? "" : ", ") + target_name(t & -t);
    detail::fail("set_simd_target: target \"", name, "\" is not one this build and CPU can run; they are: ", known);
  }
  restrict_to(bit);
}

namespace cpu::fused {

void init_simd_target() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* env = std::getenv("ATTN_SIMD_TARGET");
    if (env == nullptr || *env == '\0') return;
    std::lock_guard lock(target_mutex());
    const std::int64_t bit = target_named(lower(env));
    if (bit == 0) {
      std::cerr << "attn: ATTN_SIMD_TARGET=" << env << " is not a target this build and CPU can run; using the best\n";
      return;
    }
    restrict_to(bit);
  });
}

}  // namespace cpu::fused
}  // namespace attn
