// Which SIMD target the fused kernels run (attn/config.hpp: simd_target, set_simd_target and, at
// start-up, ATTN_SIMD_TARGET), and a probe of the target that actually ran.
//
// attn does not dispatch through Highway's global choice (HWY_DYNAMIC_DISPATCH reads
// hwy::GetChosenTarget(), which every call of hwy::SupportedTargets() resets to all the targets the
// CPU has: one call of attn::simd_target() after set_simd_target("scalar") sent every kernel back to
// AVX-512). It keeps its own choice, which each call of an op reads once (simd::current) and hands
// to its kernels, which call the compiled function of that target from the table HWY_EXPORT made
// (ATTN_SIMD_CALL). So a call runs on one target from start to end, on every thread, even while
// another thread calls set_simd_target.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <hwy/highway.h>

namespace attn::detail {
struct Switches;
}

namespace attn::cpu::simd {

// A compiled target this CPU runs: Highway's bit (HWY_AVX3, ..., HWY_EMU128) and the position of its
// function in every HWY_EXPORT table of the library.
struct Target {
  std::int64_t bit = 0;
  std::size_t index = 0;
};

// The target chosen now on the calling thread: inside a call's kernels the call's pinned reading
// (core/switch_plan.hpp), else the best one unless set_simd_target, ScopedSimdTarget or
// ATTN_SIMD_TARGET chose another. For helpers not handed a call's target.
Target current();
// The target of a call's switches (core/switch_plan.hpp), read at the API boundary.
Target target_of(const detail::Switches& switches);

// Our name of a target bit: Highway's in lower case ("avx3", "avx2", "sse4"), and "scalar" for the
// portable fallback (EMU128, or SCALAR where a compiler gets that one).
std::string name(std::int64_t bit);

// The probe: every dispatched kernel calls note_ran(HWY_TARGET) as it starts, which records the
// target's bit for the calling OpenMP thread (omp_get_thread_num(), threads past kProbeThreads in
// the last slot). ran(t) is the union of the bits recorded for thread t since reset_ran().
inline constexpr int kProbeThreads = 8;
void note_ran(std::int64_t bit);
std::int64_t ran(int thread);
void reset_ran();

// The tile counter: the SDPA kernels count every (query block, key tile) pair they compute, so a test
// can prove that tiles a window or segment ids exclude are skipped, not only masked. tiles() is the
// count over all threads since reset_ran(). The forward also counts the tiles it masks (some key of
// some row masked, or a bias added): masked_tiles() proves that a tile a mask leaves whole takes the
// unmasked path. A block notes its counts once, after its tiles (a locked add a tile took 0.7% of
// the float16 forward (1,4096,4096,128) on a Zen 5).
void note_tiles(std::int64_t tiles, std::int64_t masked_tiles = 0);
std::int64_t tiles();
std::int64_t masked_tiles();

}  // namespace attn::cpu::simd

// The function FUNC (exported with HWY_EXPORT in the same file) compiled for `target`.
#define ATTN_SIMD_CALL(target, FUNC) (*HWY_DISPATCH_TABLE(FUNC)[(target).index])
