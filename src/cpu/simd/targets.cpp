// The SIMD target the fused kernels run (cpu/simd/dispatch.hpp): the compiled targets this CPU
// supports, found once, the one chosen among them (an atomic, so that set_simd_target and the ops may
// run on different threads at once), and the probe of what ran.
#include "cpu/simd/dispatch.hpp"

#include <omp.h>

#include <hwy/targets.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <iostream>

#include "attn/config.hpp"
#include "attn/diagnostics.hpp"
#include "attn/error.hpp"
#include "core/switch_plan.hpp"

namespace attn {
namespace cpu::simd {
namespace {

std::string lower(const char* s) {
  std::string r(s);
  for (char& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

// Highway's position of a single target bit in the tables HWY_EXPORT builds, by its own rule
// (hwy/targets.h, ChosenTarget::GetIndex): a dynamic target's bit shifted into the table's range, or
// the last entry for the portable fallback; a build of one target (the fuzzers' library,
// HWY_COMPILE_ONLY_STATIC) has tables of that one entry. The tables of every file of the library
// have the same layout: they are compiled for the same targets (CMakeLists.txt).
std::size_t table_index(std::int64_t bit) {
  if constexpr ((HWY_TARGETS & (HWY_TARGETS - 1)) == 0) return 0;
  const std::int64_t mask = (HWY_CHOSEN_TARGET_SHIFT(bit) | HWY_CHOSEN_TARGET_MASK_SCALAR) & HWY_CHOSEN_TARGET_MASK_TARGETS;
  return hwy::Num0BitsBelowLS1Bit_Nonzero64(static_cast<std::uint64_t>(mask));
}

// The compiled targets this CPU supports, best (lowest bit) first; asked of Highway once.
std::int64_t available() {
  static const std::int64_t targets = hwy::SupportedTargets() & HWY_TARGETS;
  return targets;
}

std::int64_t best() { return available() & -available(); }

std::int64_t named(const std::string& want) {
  for (std::int64_t t = available(); t != 0; t &= t - 1)
    if (name(t & -t) == want) return t & -t;
  return 0;
}

std::string known() {
  std::string s;
  for (std::int64_t t = available(); t != 0; t &= t - 1) s += (s.empty() ? "" : ", ") + name(t & -t);
  return s;
}

// The default bit: ATTN_SIMD_TARGET's when it names an available target, else the best; read once.
std::int64_t default_bit() {
  static const std::int64_t bit = [] {
    const char* env = std::getenv("ATTN_SIMD_TARGET");
    if (env == nullptr || *env == '\0') return best();
    const std::int64_t b = named(lower(env));
    if (b != 0) return b;
    std::cerr << "attn: ATTN_SIMD_TARGET=" << env << " is not a target this build and CPU can run (" << known()
              << "); using the best\n";
    return best();
  }();
  return bit;
}

// A stored bit (core/switch_plan.hpp: 0 for the default) as the target's bit.
std::int64_t resolve(std::int64_t bit) { return bit != 0 ? bit : default_bit(); }

// The calling thread's bit now: its ScopedSimdTarget's, else the process's.
std::int64_t thread_bit() { return resolve(detail::simd_bit_now()); }

// name's bit, or an attn::Error naming `who` and the targets there are.
std::int64_t checked_bit(const char* who, const std::string& name) {
  const std::int64_t bit = name.empty() ? best() : named(name);
  if (bit == 0)
    detail::fail(who, ": target \"", name, "\" is not one this build and CPU can run; they are: ", known());
  return bit;
}

// One cache line per thread slot, so that threads recording at once do not share a line.
struct alignas(64) Probe {
  std::atomic<std::int64_t> bits{0};
  std::atomic<std::int64_t> tiles{0};
  std::atomic<std::int64_t> masked_tiles{0};
};
Probe probes[kProbeThreads];

}  // namespace

std::string name(std::int64_t bit) {
  if (bit == HWY_EMU128 || bit == HWY_SCALAR) return "scalar";
  return lower(hwy::TargetName(bit));
}

Target current() {
  const std::int64_t bit = thread_bit();
  return {bit, table_index(bit)};
}

Target target_of(const detail::Switches& switches) {
  const std::int64_t bit = resolve(switches.simd_bit);
  return {bit, table_index(bit)};
}

void note_ran(std::int64_t bit) {
  Probe& p = probes[std::min(omp_get_thread_num(), kProbeThreads - 1)];
  if ((p.bits.load(std::memory_order_relaxed) & bit) == 0) p.bits.fetch_or(bit, std::memory_order_relaxed);
}

std::int64_t ran(int thread) { return probes[std::clamp(thread, 0, kProbeThreads - 1)].bits.load(); }

void reset_ran() {
  for (Probe& p : probes) p.bits.store(0), p.tiles.store(0), p.masked_tiles.store(0);
}

void note_tiles(std::int64_t tiles, std::int64_t masked_tiles) {
  Probe& p = probes[std::min(omp_get_thread_num(), kProbeThreads - 1)];
  if (tiles != 0) p.tiles.fetch_add(tiles, std::memory_order_relaxed);
  if (masked_tiles != 0) p.masked_tiles.fetch_add(masked_tiles, std::memory_order_relaxed);
}

std::int64_t tiles() {
  std::int64_t total = 0;
  for (const Probe& p : probes) total += p.tiles.load();
  return total;
}

std::int64_t masked_tiles() {
  std::int64_t total = 0;
  for (const Probe& p : probes) total += p.masked_tiles.load();
  return total;
}

}  // namespace cpu::simd

std::vector<std::string> simd_targets() {
  std::vector<std::string> names;
  for (std::int64_t t = cpu::simd::available(); t != 0; t &= t - 1) names.push_back(cpu::simd::name(t & -t));
  return names;
}

std::string simd_target() { return cpu::simd::name(cpu::simd::thread_bit()); }

std::vector<std::string> simd_targets_ran(bool reset) {
  std::int64_t bits = 0;
  for (int t = 0; t < cpu::simd::kProbeThreads; ++t) bits |= cpu::simd::ran(t);
  if (reset) cpu::simd::reset_ran();
  std::vector<std::string> names;
  for (; bits != 0; bits &= bits - 1) names.push_back(cpu::simd::name(bits & -bits));
  return names;
}

void set_simd_target(const std::string& name) {
  detail::set_process_simd_bit(cpu::simd::checked_bit("set_simd_target", name));
}

ScopedSimdTarget::ScopedSimdTarget(const std::string& name) : saved_(detail::thread_simd_override()) {
  detail::set_thread_simd_override(cpu::simd::checked_bit("ScopedSimdTarget", name));
}
ScopedSimdTarget::~ScopedSimdTarget() { detail::set_thread_simd_override(saved_); }

}  // namespace attn
