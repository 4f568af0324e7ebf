// The bfloat16 kernels' products on Intel AMX's tile registers (AMX-TILE and AMX-BF16, Sapphire
// Rapids and later Xeons): tdpbf16ps multiplies a 16 x 32 bfloat16 tile by a 32 x 16 one, held in
// pairs along the depth as dot_bf16.hpp's B pairs, into a 16 x 16 float tile: 8,192 products an
// instruction, against vdpbf16ps's 32. On the Intel Xeon the project is measured on, one core ran
// 1.3-1.8 TFLOP/s of these products (64 x 64 x 128 blocks), against 171 GFLOP/s of float32 FMA.
// Like vdpbf16ps, the products read no MXCSR: subnormal inputs count as 0, sums round to nearest
// even, and the accumulation is in float.
//
// Linux hands the tile registers' state to a process only when it asks (arch_prctl
// ARCH_REQ_XCOMP_PERM; available() asks once), and each thread configures the tiles before it uses
// them: a Scope does, for the products of one kernel task, and releases them at its end, so that no
// other code of the process (PyTorch's oneDNN uses the tiles too) finds them configured for attn.
#pragma once

#include <cstdint>

#include "attn/tensor.hpp"

namespace attn::cpu::bf16::tiles {

// Whether this CPU has AMX-TILE and AMX-BF16 and the operating system lets this process use them.
bool available();

// The tiles configured on this thread (eight of 16 rows of 64 bytes) while the scope lasts, when
// active; every product() runs inside one.
class Scope {
 public:
  explicit Scope(bool active);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  bool active_;
};

// c (rows, 64) (+)= A B, in float: A (rows, pairs) words, word (r, p) = (a[r][2p], a[r][2p + 1]) at
// a[r a_r + p a_k], and B (pairs, 64) words, word [p][i] = (b[2p][i], b[2p + 1][i]) (dot_bf16.hpp's
// B pairs). Rows and pairs that do not fill whole tiles (16 of each), and an A not in rows (a_k != 1),
// are copied into zero-padded tiles first.
void product(const std::uint32_t* a, index_t a_r, index_t a_k, index_t rows, index_t pairs, const std::uint32_t* b,
             float* c, bool accumulate);

}  // namespace attn::cpu::bf16::tiles
