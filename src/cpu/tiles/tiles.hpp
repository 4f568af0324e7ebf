// Products on Intel AMX's tile registers (Sapphire Rapids and later Xeons), for the bfloat16 kernel
// (bf16/dot_bf16.hpp) and the int8 forward's Q K^T (int8/dot_int8.hpp). A tile holds 16 rows of 64
// bytes; one instruction multiplies a 16 x 64-byte tile of A by a tile of B held in words along the
// depth (the layouts the vector kernels already use) into a 16 x 16 tile of 32-bit sums:
//   AMX-BF16 tdpbf16ps: words of two bfloat16, the pairs' products added in float: 8,192 products
//                       an instruction, against vdpbf16ps's 32;
//   AMX-INT8 tdpbsud:   words of four bytes, A signed and B unsigned, added in int32 (exact): the
//                       sums vpdpbusd forms with the operands' roles swapped, so the same integers.
// On the 2-core Intel Xeon the project is measured on, one core ran 1.3-1.8 TFLOP/s of bfloat16
// tile products (64 x 64 x 128 blocks), against 171 GFLOP/s of float32 FMA. Like vdpbf16ps, the
// bfloat16 products read no MXCSR: subnormal inputs count as 0, sums round to nearest even.
//
// Linux hands the tiles' state to a process only when it asks (arch_prctl ARCH_REQ_XCOMP_PERM;
// the first *_available() call asks, once), and each thread configures the tiles before it uses
// them: a Scope does, for the products of one kernel task, and releases them at its end, so that no
// other code of the process (PyTorch's oneDNN uses the tiles too) finds them configured for attn.
#pragma once

#include <cstdint>

#include "attn/tensor.hpp"

namespace attn::cpu::tiles {

// Whether this CPU has AMX-TILE and AMX-BF16 (AMX-INT8), and the system lets this process use them.
bool bf16_available();
bool int8_available();

// The tiles configured on this thread (eight of 16 rows of 64 bytes) while the scope lasts, when
// active; every product runs inside one.
class Scope {
 public:
  explicit Scope(bool active);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  bool active_;
};

// c (rows, 64) (+)= A B in float: A (rows, pairs) words, word (r, p) = (a[r][2p], a[r][2p + 1]) of
// bfloat16 at a[r a_r + p a_k], and B (pairs, 64) words, word [p][i] = (b[2p][i], b[2p + 1][i])
// (dot_bf16.hpp's B pairs).
void product_bf16(const std::uint32_t* a, index_t a_r, index_t a_k, index_t rows, index_t pairs, const std::uint32_t* b,
                  float* c, bool accumulate);

// c (rows, 64) = A B in int32: A (rows, quads) words of four signed bytes, row r at a + r a_r bytes
// (a[r][4p .. 4p + 3]), and B (quads, 64) words of four unsigned bytes, word [p][i] = (b[4p][i] ..
// b[4p + 3][i]) (dot_int8.hpp's q quads).
void product_int8(const std::int8_t* a, index_t a_r, index_t rows, index_t quads, const std::uint32_t* b, std::int32_t* c);

// Both: rows and depths that do not fill whole tiles (16 of each), and an A not in rows
// (a_k != 1), are copied into zero-padded tiles first; the rows of c past `rows` are not written.

}  // namespace attn::cpu::tiles
