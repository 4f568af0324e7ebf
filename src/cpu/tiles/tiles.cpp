// AMX tile products (tiles.hpp). The functions that use the tiles carry the target attribute; none
// runs unless bf16_available() or int8_available().
#include "cpu/tiles/tiles.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#define ATTN_HAS_TILES 1
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace attn::cpu::tiles {
namespace {

constexpr index_t kTile = 16;   // rows of a tile; also its words a row (64 bytes) and its 32-bit columns
constexpr index_t kLanes = 64;  // columns of B and c: a block's queries or a tile's keys
constexpr index_t kWord = 4;    // bytes of a word: a bfloat16 pair or four bytes

enum class Kind { bf16, int8 };

// The CPUID bits of AMX (leaf 7, EDX) that the products need, and whether the system granted the
// tiles' state to this process (asked once).
struct Amx {
  bool tile = false, bf16 = false, int8 = false;
};
Amx amx() {
  static const Amx found = [] {
    Amx a;
#if ATTN_HAS_TILES
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0 || ((edx >> 24) & 1u) == 0) return a;
    constexpr long kRequestPermission = 0x1023;  // ARCH_REQ_XCOMP_PERM
    constexpr long kTileData = 18;               // XFEATURE_XTILEDATA
    if (syscall(SYS_arch_prctl, kRequestPermission, kTileData) != 0) return a;
    a.tile = true, a.bf16 = (edx >> 22) & 1u, a.int8 = (edx >> 25) & 1u;
#endif
    return a;
  }();
  return found;
}

#if ATTN_HAS_TILES
#define ATTN_TILES_TARGET __attribute__((target("amx-tile,amx-bf16,amx-int8")))

// ldtilecfg's 64 bytes: palette 1, then each tile's bytes a row and rows.
struct alignas(64) TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t bytes_per_row[16] = {};
  std::uint8_t rows[16] = {};
};

// ldtilecfg written out with the whole configuration as its operand: GCC 12's _tile_loadconfig names
// only its first 8 bytes, and the compiler dropped the stores of the rest (a fault on the load).
ATTN_TILES_TARGET void configure() {
  TileConfig config;
  for (int t = 0; t < 8; ++t) config.bytes_per_row[t] = kTile * kWord, config.rows[t] = kTile;
  __asm__ volatile("ldtilecfg %0" ::"m"(config));
}

ATTN_TILES_TARGET void release() { _tile_release(); }

// The asm of the tile intrinsics names no memory: the compiler must not move other loads and
// stores across them.
inline void compiler_fence() { __asm__ volatile("" ::: "memory"); }

// Tile c += tile x times tile y, of the kind's instruction (tile numbers are immediates).
#define ATTN_TILE_DOT(kind, c, x, y) \
  do {                               \
    if constexpr (kind == Kind::bf16) \
      _tile_dpbf16ps(c, x, y);       \
    else                             \
      _tile_dpbsud(c, x, y);         \
  } while (0)

// c (R, 64) (+)= A B over whole tiles (R and P multiples of 16; A's rows a_stride bytes apart, its
// words contiguous): blocks of 32 x 32 of c in four tiles (0 to 3), two tiles of A (4, 5) and two of
// B (6, 7) a step of 16 words of depth.
template <Kind kKind>
ATTN_TILES_TARGET void whole_tiles(const std::uint8_t* a, index_t a_stride, index_t R, index_t P, const std::uint32_t* b,
                                   std::uint8_t* c, bool accumulate) {
  compiler_fence();
  const long b_stride = kLanes * kWord, c_stride = kLanes * kWord;
  for (index_t r = 0; r < R; r += 2 * kTile) {
    const bool two = r + kTile < R;  // a second tile of rows
    for (index_t i = 0; i < kLanes; i += 2 * kTile) {
      std::uint8_t* c0 = c + (r * kLanes + i) * kWord;
      std::uint8_t* c1 = c0 + kTile * c_stride;
      if (accumulate) {
        _tile_loadd(0, c0, c_stride);
        _tile_loadd(1, c0 + kTile * kWord, c_stride);
        if (two) {
          _tile_loadd(2, c1, c_stride);
          _tile_loadd(3, c1 + kTile * kWord, c_stride);
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
        _tile_loadd(4, a + r * a_stride + p * kWord, a_stride);
        ATTN_TILE_DOT(kKind, 0, 4, 6);
        ATTN_TILE_DOT(kKind, 1, 4, 7);
        if (two) {
          _tile_loadd(5, a + (r + kTile) * a_stride + p * kWord, a_stride);
          ATTN_TILE_DOT(kKind, 2, 5, 6);
          ATTN_TILE_DOT(kKind, 3, 5, 7);
        }
      }
      _tile_stored(0, c0, c_stride);
      _tile_stored(1, c0 + kTile * kWord, c_stride);
      if (two) {
        _tile_stored(2, c1, c_stride);
        _tile_stored(3, c1 + kTile * kWord, c_stride);
      }
    }
  }
  compiler_fence();
}
#undef ATTN_TILE_DOT

index_t whole(index_t x) { return (x + kTile - 1) / kTile * kTile; }

// c (rows, 64) (+)= A B, rows >= 1 and depth >= 1 words, c's 32-bit elements (float or int32) as
// bytes: A's word (r, p) at a + r a_r + p a_k bytes (read through memcpy: int8 rows need not be
// aligned). Operands that do not fill whole tiles, or an A not in rows, go through zero-padded
// copies (per thread, kept for the next call).
template <Kind kKind>
void padded_product(const std::uint8_t* a, index_t a_r, index_t a_k, index_t rows, index_t depth, const std::uint32_t* b,
                    void* c, bool accumulate) {
  thread_local std::vector<std::uint32_t> a_pad, b_pad, c_pad;
  const index_t R = whole(rows), P = whole(depth);
  const std::uint8_t* A = a;
  index_t a_stride = a_r;
  if (a_k != kWord || R != rows || P != depth) {
    a_pad.assign(static_cast<std::size_t>(R * P), 0u);
    for (index_t r = 0; r < rows; ++r)
      for (index_t p = 0; p < depth; ++p) std::memcpy(&a_pad[r * P + p], a + r * a_r + p * a_k, kWord);
    A = reinterpret_cast<const std::uint8_t*>(a_pad.data()), a_stride = P * kWord;
  }
  const std::uint32_t* B = b;
  if (P != depth) {
    b_pad.assign(static_cast<std::size_t>(P * kLanes), 0u);
    std::copy(b, b + depth * kLanes, b_pad.begin());
    B = b_pad.data();
  }
  const std::size_t c_bytes = static_cast<std::size_t>(rows * kLanes * kWord);
  void* C = c;
  if (R != rows) {
    c_pad.assign(static_cast<std::size_t>(R * kLanes), 0u);
    if (accumulate) std::memcpy(c_pad.data(), c, c_bytes);
    C = c_pad.data();
  }
  whole_tiles<kKind>(A, a_stride, R, P, B, static_cast<std::uint8_t*>(C), accumulate);
  if (C != c) std::memcpy(c, C, c_bytes);
}
#endif

}  // namespace

bool bf16_available() { return amx().bf16; }
bool int8_available() { return amx().int8; }

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

void product_bf16(const std::uint32_t* a, index_t a_r, index_t a_k, index_t rows, index_t pairs, const std::uint32_t* b,
                  float* c, bool accumulate) {
  if (rows == 0) return;
  if (pairs == 0) {
    if (!accumulate) std::fill(c, c + rows * kLanes, 0.0f);
    return;
  }
#if ATTN_HAS_TILES
  padded_product<Kind::bf16>(reinterpret_cast<const std::uint8_t*>(a), a_r * kWord, a_k * kWord, rows, pairs, b, c,
                             accumulate);
#else
  (void)a, (void)a_r, (void)a_k, (void)b;
#endif
}

void product_int8(const std::int8_t* a, index_t a_r, index_t rows, index_t quads, const std::uint32_t* b, std::int32_t* c) {
  if (rows == 0) return;
  if (quads == 0) {
    std::fill(c, c + rows * kLanes, 0);
    return;
  }
#if ATTN_HAS_TILES
  padded_product<Kind::int8>(reinterpret_cast<const std::uint8_t*>(a), a_r, kWord, rows, quads, b, c, false);
#else
  (void)a, (void)a_r, (void)b;
#endif
}

}  // namespace attn::cpu::tiles
