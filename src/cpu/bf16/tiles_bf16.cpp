// AMX tile products (tiles_bf16.hpp). The functions that use the tiles carry the target attribute;
// none runs unless available().
#include "cpu/bf16/tiles_bf16.hpp"

#include <algorithm>
#include <vector>

#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#define ATTN_HAS_TILES 1
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace attn::cpu::bf16::tiles {
namespace {

constexpr index_t kTile = 16;   // rows of a tile; also its pairs (64 bytes a row) and its float columns
constexpr index_t kLanes = 64;  // columns of B and c: a block's queries or a tile's keys

#if ATTN_HAS_TILES
#define ATTN_TILES_TARGET __attribute__((target("amx-tile,amx-bf16")))

// ldtilecfg's 64 bytes: palette 1, then each tile's bytes a row and rows.
struct alignas(64) TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t bytes_per_row[16] = {};
  std::uint8_t rows[16] = {};
};

// The asm of the tile intrinsics names no memory: the compiler must not move other loads and
// stores across them.
inline void compiler_fence() { __asm__ volatile("" ::: "memory"); }

// c (R, 64) (+)= A B over whole tiles (R and P multiples of 16; A's rows lda words apart): blocks
// of 32 x 32 of c in four tiles (0 to 3), two tiles of A (4, 5) and two of B (6, 7) a step of 16
// pairs.
ATTN_TILES_TARGET void whole_tiles(const std::uint32_t* a, index_t lda, index_t R, index_t P, const std::uint32_t* b,
                                   float* c, bool accumulate) {
  compiler_fence();
  const long a_stride = static_cast<long>(lda * 4), b_stride = kLanes * 4, c_stride = kLanes * 4;
  for (index_t r = 0; r < R; r += 2 * kTile) {
    const bool two = r + kTile < R;  // a second tile of rows
    for (index_t i = 0; i < kLanes; i += 2 * kTile) {
      float* c0 = c + r * kLanes + i;
      float* c1 = c0 + kTile * kLanes;
      if (accumulate) {
        _tile_loadd(0, c0, c_stride);
        _tile_loadd(1, c0 + kTile, c_stride);
        if (two) {
          _tile_loadd(2, c1, c_stride);
          _tile_loadd(3, c1 + kTile, c_stride);
        }
      } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
      }
      for (index_t p = 0; p < P; p += kTile) {
        const std::uint32_t* bp = b + p * kLanes + i;
        _tile_loadd(6, bp, b_stride);
        _tile_loadd(7, bp + kTile, b_stride);
        _tile_loadd(4, a + r * lda + p, a_stride);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        if (two) {
          _tile_loadd(5, a + (r + kTile) * lda + p, a_stride);
          _tile_dpbf16ps(2, 5, 6);
          _tile_dpbf16ps(3, 5, 7);
        }
      }
      _tile_stored(0, c0, c_stride);
      _tile_stored(1, c0 + kTile, c_stride);
      if (two) {
        _tile_stored(2, c1, c_stride);
        _tile_stored(3, c1 + kTile, c_stride);
      }
    }
  }
  compiler_fence();
}

// ldtilecfg written out with the whole configuration as its operand: GCC 12's _tile_loadconfig names
// only its first 8 bytes, and the compiler dropped the stores of the rest (a fault on the load).
ATTN_TILES_TARGET void configure() {
  TileConfig config;
  for (int t = 0; t < 8; ++t) config.bytes_per_row[t] = 64, config.rows[t] = kTile;
  __asm__ volatile("ldtilecfg %0" ::"m"(config));
}

ATTN_TILES_TARGET void release() { _tile_release(); }
#endif

index_t whole(index_t x) { return (x + kTile - 1) / kTile * kTile; }

}  // namespace

bool available() {
#if ATTN_HAS_TILES
  static const bool ok = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
    const bool amx_bf16 = (edx >> 22) & 1u, amx_tile = (edx >> 24) & 1u;
    if (!amx_bf16 || !amx_tile) return false;
    constexpr long kRequestPermission = 0x1023;  // ARCH_REQ_XCOMP_PERM
    constexpr long kTileData = 18;               // XFEATURE_XTILEDATA
    return syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
  }();
  return ok;
#else
  return false;
#endif
}

Scope::Scope(bool active) : active_(active) {
#if ATTN_HAS_TILES
  if (active_) configure();
#endif
}

Scope::~Scope() {
#if ATTN_HAS_TILES
  if (active_) release();
#endif
}

void product(const std::uint32_t* a, index_t a_r, index_t a_k, index_t rows, index_t pairs, const std::uint32_t* b,
             float* c, bool accumulate) {
  if (rows == 0) return;
  if (pairs == 0) {
    if (!accumulate) std::fill(c, c + rows * kLanes, 0.0f);
    return;
  }
#if ATTN_HAS_TILES
  // Padded copies (per thread, kept for the next call) where the operands do not fill whole tiles.
  thread_local std::vector<std::uint32_t> a_pad, b_pad;
  thread_local std::vector<float> c_pad;
  const index_t R = whole(rows), P = whole(pairs);
  const std::uint32_t* A = a;
  index_t lda = a_r;
  if (a_k != 1 || R != rows || P != pairs) {
    a_pad.assign(static_cast<std::size_t>(R * P), 0u);
    for (index_t r = 0; r < rows; ++r)
      for (index_t p = 0; p < pairs; ++p) a_pad[r * P + p] = a[r * a_r + p * a_k];
    A = a_pad.data(), lda = P;
  }
  const std::uint32_t* B = b;
  if (P != pairs) {
    b_pad.assign(static_cast<std::size_t>(P * kLanes), 0u);
    std::copy(b, b + pairs * kLanes, b_pad.begin());
    B = b_pad.data();
  }
  float* C = c;
  if (R != rows) {
    c_pad.assign(static_cast<std::size_t>(R * kLanes), 0.0f);
    if (accumulate) std::copy(c, c + rows * kLanes, c_pad.begin());
    C = c_pad.data();
  }
  whole_tiles(A, lda, R, P, B, C, accumulate);
  if (C != c) std::copy(C, C + rows * kLanes, c);
#else
  (void)a, (void)a_r, (void)a_k, (void)b, (void)c, (void)accumulate;
#endif
}

}  // namespace attn::cpu::bf16::tiles
