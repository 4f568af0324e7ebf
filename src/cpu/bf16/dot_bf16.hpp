// The bfloat16 products of the SDPA kernels (simd/sdpa_forward.cpp's ForwardBlockBf16, the int8
// forward's P V, the bfloat16 backward), on one of two units:
//   vectors: vdpbf16ps multiplies 32 bfloat16 pairs and adds them into 16 float lanes (acc[i] +=
//            a[2i] b[2i] + a[2i+1] b[2i+1]), twice float32 FMA's work per instruction (AVX512-BF16);
//   tiles:   AMX's tdpbf16ps, the same pairs 16 x 16 x 32 at a time (tiles/tiles.hpp).
// Highway 1.0.3 emits neither: these functions carry their own target attributes and are called only
// when the CPU has the unit (has_avx512_bf16, tiles::bf16_available) and the chosen SIMD target is
// AVX-512. Each function's `tiles` says which unit runs it; the tiles' products run inside a
// tiles::Scope of the calling task.
//
// Layouts, for a block of kBlockQ = 64 queries and a tile of up to kBlockK = 64 keys, each as 32-bit
// words holding a bfloat16 pair (the element of the lower index in the low half):
//   q pairs  (ceil(d / 2), 64):   word [c][i] = (q[i][2c], q[i][2c + 1])
//   P pairs  (ceil(cnt / 2), 64): word [j][i] = (P[2j][i], P[2j + 1][i]), P the tile's weights
//   V pairs  (ceil(cnt / 2), dv): word [j][c] = (v[2j][c], v[2j + 1][c])      (vectors)
//   V^T pairs (dv, kBlockK / 2):  word [c][j] = (v[2j][c], v[2j + 1][c])      (tiles: A of V^T P^T)
// with zeros past d, cnt and the block's rows.
#pragma once

#include <cstdint>

#include "attn/config.hpp"
#include "attn/tensor.hpp"
#include "cpu/tiles/tiles.hpp"

namespace attn::cpu::bf16 {

// Whether this CPU runs AVX512-BF16 (and the AVX-512 it builds on).
bool has_avx512_bf16();
// Whether the vectors beat the portable path here: on AMD's AVX512-BF16 cores (Zen 4 and 5)
// vdpbf16ps runs at about twice float32 FMA's rate (927 against 501 GFLOP/s on a 2-core Zen 5, 465
// against 232 on a 2-core Zen 4, where the kernel ran the (1,4096,4096,128) forward 1.6x faster than
// float32); on Intel's (measured on an Emerald Rapids Xeon) the vectors took 67 to 77 ms for
// (1,4096,4096,128) where float32 took 43 to 47 and the portable bfloat16 path 47 to 48 (Intel's
// AVX512-BF16 Xeons have AMX's tiles, which automatic takes instead). A fixed rule, so that one
// machine always takes one path (a timing could flip between runs, and so would the results' bits).
bool dot_pays();
// The unit a bfloat16 call under the setting `choice` runs its products on (given the AVX-512
// target): automatic takes the tiles where the CPU has them, else the vectors where they pay; on
// takes the vectors, tiles the tiles, each where the CPU has it; none: the portable path.
enum class Unit { none, vectors, tiles };
Unit unit_chosen(Bf16Kernel choice);
// Whether such a call runs the kernel at all (on either unit).
inline bool dot_chosen(Bf16Kernel choice) { return unit_chosen(choice) != Unit::none; }

// qp = the q pairs of `rows` query rows (row stride qs elements) of d elements.
void pack_queries(const std::uint16_t* q, index_t qs, index_t rows, index_t d, std::uint32_t* qp);
// s (cnt, 64) = K_tile Q^T: s[j][i] = sum_c k[j][c] q[i][c], for cnt key rows (stride ks) of d
// elements.
void scores(const std::uint16_t* k, index_t ks, index_t cnt, index_t d, const std::uint32_t* qp, float* s, bool tiles);
// pp = the P pairs of weights w (cnt, 64) rounded to bfloat16 (nearest even).
void pack_weights(const float* w, index_t cnt, std::uint32_t* pp);
// vp = the V pairs of cnt value rows (stride vs) of dv elements, or (tiles) their V^T pairs: both
// kBlockK / 2 x dv words for a whole tile.
void pack_values(const std::uint16_t* v, index_t vs, index_t cnt, index_t dv, std::uint32_t* vp, bool tiles);
// ot (dv, 64) = ot alpha + V_tile^T P^T: ot[c][i] = ot[c][i] alpha[i] + sum_j v[j][c] P[j][i], cnt >= 1. The
// online softmax's rescale of the rows (alpha, 64 floats) is applied as the accumulators are loaded,
// not in a pass of its own over ot (which took a tenth of the (1,4096,4096,128) forward on a Zen 5).
void accumulate(const std::uint32_t* vp, const std::uint32_t* pp, index_t cnt, index_t dv, const float* alpha,
                float* ot, bool tiles);

// ---- the backward's products (simd/sdpa_backward.cpp, the bfloat16 backward) ----------------------
// Each of the backward's five products has the form C (rows, 64) (+)= A (rows, depth) B (depth, 64)
// with 64 lanes of queries or keys; in pairs along the depth:
//   a word  A(r, p) = (a[r][2p], a[r][2p+1]) at a[r a_r + p a_k]   (broadcast)
//   B pairs (ceil(depth / 2), 64): word [p][i] = (b[2p][i], b[2p+1][i])
// Floats are rounded to bfloat16 as they are packed (nearest even; exact for values that are
// bfloat16 already, as the backward's Q, K, V and dout are), zeros past the depth.

// out (ceil(rows / 2), cols) words = rows of x (stride xs floats) in pairs of rows: word [p][c] =
// (x[2p][c], x[2p + 1][c]). pack_weights(w, cnt, pp) is pack_row_pairs(w, 64, cnt, 64, pp).
void pack_row_pairs(const float* x, index_t xs, index_t rows, index_t cols, std::uint32_t* out);
// out (rows, ceil(cols / 2)) words = each row of x (stride xs floats) in pairs of its elements:
// word [r][p] = (x[r][2p], x[r][2p + 1]).
void pack_pairs_in_rows(const float* x, index_t xs, index_t rows, index_t cols, std::uint32_t* out);
// out (cols, kBlockK / 2) words = the columns of rows <= kBlockK rows of x (stride xs floats) in pairs
// of rows, zeros past `rows`: word [c][p] = (x[2p][c], x[2p + 1][c]) (a key tile's K^T for the tiles).
void pack_column_pairs(const float* x, index_t xs, index_t rows, index_t cols, std::uint32_t* out);
// c (rows, 64) = (accumulate ? c : 0) + sum over p < pairs of A(r, p) B[p][.], in float.
void products(const std::uint32_t* a, index_t a_r, index_t a_k, index_t rows, index_t pairs, const std::uint32_t* b,
              float* c, bool accumulate, bool tiles);

}  // namespace attn::cpu::bf16
