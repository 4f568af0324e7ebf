// cpu backend, additive attention: the fused kernels (cpu/simd/additive.hpp) unless the caller asks
// for the (n, m) weights, which only the unfused path (cpu/unfused.hpp) forms. Memory beyond inputs
// and outputs: kp (B, H, m, h) and a block's work space per thread in the forward; the backward adds
// qp (B, H, n, h) stored as pass 1's transposed blocks, dqp and dkp, three floats per row and the
// per-chunk partials of dqp and dw_v. Nothing grows with n m or n m h.
#include <algorithm>
#include <cstddef>

#include "cpu/bias_classes.hpp"
#include "cpu/cpu.hpp"
#include "cpu/linear.hpp"
#include "cpu/key_padding.hpp"
#include "cpu/scratch.hpp"
#include "cpu/simd/additive.hpp"
#include "cpu/unfused.hpp"

namespace attn::cpu {
namespace {

// Below this many tanh evaluations (B H n m h) a call runs on the calling thread alone: starting an
// OpenMP team costs more than it saves.
constexpr double kParallelTerms = 1 << 18;

// kp (B, H, m, h) = keys W_k^T, in tasks of kBlockK keys of one (b, h).
template <class T>
void project_keys(T* kp, View4<const T> keys, View4<const T> w_k, std::size_t work, bool threads, simd::Target simd) {
  const index_t H = keys.H, tiles = (keys.R + fused::kBlockK - 1) / fused::kBlockK;
  run_tasks(keys.B * H * tiles, work, threads, [&](index_t t, void* w) {
    const index_t bh = t / tiles;
    fused::additive_project_keys<T>(kp, keys, w_k, bh / H, bh % H, (t % tiles) * fused::kBlockK, w, simd);
  });
}

// Every block of kBlockQ queries of every (b, h), dynamically scheduled (causal blocks differ in
// cost); each row is computed by one block in a fixed key order, whatever the thread count.
template <class T>
void forward_blocks(const fused::AdditiveForward<T>& p, std::size_t work, bool threads) {
  const index_t B = p.q.B, H = p.q.H, n = p.q.R;
  const index_t blocks = (n + fused::kBlockQ - 1) / fused::kBlockQ;
  run_tasks(B * H * blocks, work, threads, [&](index_t t, void* w) {
    const index_t bh = t / blocks;
    fused::additive_forward_block<T>(p, bh / H, bh % H, (t % blocks) * fused::kBlockQ, w);
  });
}

// The tanh evaluations of a forward, B H n m h: what decides whether a call is worth threads.
template <class T>
double terms(View4<const T> q, index_t m, index_t h) {
  return static_cast<double>(q.B) * static_cast<double>(q.H) * static_cast<double>(q.R) * static_cast<double>(m) *
         static_cast<double>(h);
}

// The forward's array shared by its threads: the projected keys of G = B H heads, m keys, hidden size h.
template <class T>
struct ForwardBuffers {
  T* kp;  // (G, m, h)
  ForwardBuffers(Carve& c, index_t G, index_t m, index_t h)
      : kp(c.take<T>(static_cast<std::size_t>(G) * static_cast<std::size_t>(m) * static_cast<std::size_t>(h))) {}
};

// The backward's arrays shared by its threads, for G = B H heads of n queries, m keys, hidden size
// h, `blocks` query blocks and `chunks` key chunks per head.
template <class T>
struct BackwardBuffers {
  T* kp;              // (G, m, h)
  T* dkp;             // (G, m, h)
  T* qpt;             // (G, blocks, h, kBlockQ): pass 1's projected query blocks, transposed
  T* row_max;         // (G, n)
  T* row_inv;         // (G, n)
  double* row_dot;    // (G, n)
  T* dqp_partial;     // (G, chunks, blocks, h, kBlockQ)
  T* dwv_partial;     // (G, chunks, h)
  T* dqp;             // (G, n, h)
  BackwardBuffers(Carve& c, index_t G, index_t n, index_t m, index_t h, index_t blocks, index_t chunks)
      : kp(c.take<T>(size(G, m, h))), dkp(c.take<T>(size(G, m, h))), qpt(c.take<T>(size(G, blocks, h, fused::kBlockQ))),
        row_max(c.take<T>(size(G, n))), row_inv(c.take<T>(size(G, n))), row_dot(c.take<double>(size(G, n))),
        dqp_partial(c.take<T>(size(G, chunks, blocks, h, fused::kBlockQ))), dwv_partial(c.take<T>(size(G, chunks, h))),
        dqp(c.take<T>(size(G, n, h))) {}
  template <class... I>
  static std::size_t size(I... dims) {
    return (static_cast<std::size_t>(dims) * ...);
  }
};

}  // namespace

template <class T>
void additive_forward(View4<T> out, View4<T> weights, View4<const T> queries, View4<const T> keys,
                      View4<const T> values, View4<const T> w_q, View4<const T> w_k, View4<const T> w_v,
                      const MaskPlan<T>& given_mask, const DropoutPlan& dropout) {
  if (!weights.empty() || keys.R > fused::kMaxKeys || given_mask.switches.backend == Backend::unfused)
    return unfused::additive_forward<T>(out, weights, queries, keys, values, w_q, w_k, w_v, given_mask, dropout);
  MaskPlan<T> mask = given_mask;
  const KeyPaddingAsLengths<T> lengths(mask);
  const BiasClassesFor<T> bias_classes(mask, fused::kBlockQ, fused::kBlockK);
  const simd::Target simd = simd::target_of(mask.switches);
  const index_t B = queries.B, H = queries.H, m = keys.R, h = w_q.R;
  const bool threads = terms<T>(queries, m, h) >= kParallelTerms;
  Scratch<ForwardBuffers<T>> buf(B * H, m, h);
  T* kp = buf->kp;  // (B, H, m, h)
  const std::size_t work = fused::additive_work_bytes<T>(h, queries.C, keys.C, values.C);
  project_keys<T>(kp, keys, w_k, work, threads, simd);
  const fused::AdditiveForward<T> p{out, queries, keys, values, w_q, w_v, kp, &mask, &dropout, simd, {}};
  forward_blocks<T>(p, work, threads);
}

// Backward: pass 1 (the forward per query block, keeping the row statistics and qpT), pass 2 (key
// chunks, simd/additive.hpp), then the chunks' partials of dqp and dw_v summed in chunk order and
// the projections' gradients. Chunks are sized from the shape alone (about 16 over all heads, for
// load balance), never from the thread count, so the results do not depend on it.
template <class T>
void additive_backward(View4<T> dqueries, View4<T> dkeys, View4<T> dvalues, View4<T> dw_q, View4<T> dw_k,
                       View4<T> dw_v, View4<const T> dout, View4<const T> queries, View4<const T> keys,
                       View4<const T> values, View4<const T> w_q, View4<const T> w_k, View4<const T> w_v,
                       const MaskPlan<T>& given_mask, const DropoutPlan& dropout) {
  if (keys.R > fused::kMaxKeys || given_mask.switches.backend == Backend::unfused)
    return unfused::additive_backward<T>(dqueries, dkeys, dvalues, dw_q, dw_k, dw_v, dout, queries, keys, values, w_q,
                                         w_k, w_v, given_mask, dropout);
  MaskPlan<T> mask = given_mask;
  const KeyPaddingAsLengths<T> lengths(mask);
  const BiasClassesFor<T> bias_classes(mask, fused::kBlockQ, fused::kBlockK);
  const simd::Target simd = simd::target_of(mask.switches);
  const index_t B = queries.B, H = queries.H, n = queries.R, m = keys.R, h = w_q.R;
  const index_t blocks = (n + fused::kBlockQ - 1) / fused::kBlockQ;
  const index_t tiles = std::max<index_t>(1, (m + fused::kBlockK - 1) / fused::kBlockK);
  const index_t want = fused::key_chunks(B * H, tiles);
  const index_t chunk_keys = (tiles + want - 1) / want * fused::kBlockK;
  const index_t chunks = std::max<index_t>(1, (m + chunk_keys - 1) / chunk_keys);
  const bool threads = terms<T>(queries, m, h) >= kParallelTerms;

  Scratch<BackwardBuffers<T>> buf(B * H, n, m, h, blocks, chunks);
  T *kp = buf->kp, *dkp = buf->dkp, *qpt = buf->qpt, *row_max = buf->row_max, *row_inv = buf->row_inv;
  T *dqp_partial = buf->dqp_partial, *dwv_partial = buf->dwv_partial, *dqp = buf->dqp;
  double* row_dot = buf->row_dot;

  const std::size_t work = fused::additive_work_bytes<T>(h, queries.C, keys.C, values.C);
  project_keys<T>(kp, keys, w_k, work, threads, simd);
  fused::AdditiveForward<T> f{{}, queries, keys, values, w_q, w_v, kp, &mask, &dropout, simd, dout};
  f.row_max = row_max, f.row_inv = row_inv, f.row_dot = row_dot, f.qpt = qpt;
  forward_blocks<T>(f, work, threads);

  const fused::AdditiveBackward<T> p{dvalues, dout,   queries, keys,    values,      w_v,         &mask,
                                     &dropout, kp,    qpt,     row_max, row_inv,     row_dot,     dkp,
                                     dqp_partial, dwv_partial, h, chunk_keys, chunks, simd};
  const index_t tasks = B * H * chunks;
  const auto chunk = [&](index_t t, void* w) {
    fused::additive_backward_chunk<T>(p, t / chunks / H, t / chunks % H, t % chunks, w);
  };
  // dqp (B, H, n, h) = the chunks' partials (transposed blocks) summed in chunk order.
  const auto sum_dqp = [&](index_t t, void*) {
    const index_t bh = t / blocks, blk = t % blocks, i0 = blk * fused::kBlockQ;
    fused::sum_chunk_partials<T>(dqp + (bh * n + i0) * h, h, dqp_partial, bh, blk, std::min(fused::kBlockQ, n - i0),
                                 chunks, blocks, h, T(1), simd);
  };
  run_phases(work, threads && tasks > 1, dynamic_phase(tasks, chunk), static_phase(B * H * blocks, sum_dqp));
  // dw_v: every (b, h)'s chunks in order.
  T* dwv = dw_v.row(0, 0, 0);
  std::fill(dwv, dwv + h, T(0));
  for (index_t c = 0; c < B * H * chunks; ++c)
    for (index_t q = 0; q < h; ++q) dwv[q] += dwv_partial[c * h + q];
  projections_backward<T>(dqueries, dkeys, dw_q, dw_k, dense_view4<T>(dqp, B, H, n, h), dense_view4<T>(dkp, B, H, m, h),
                          queries, keys, w_q, w_k);
}

// core/kernels.inc's additive kernels, for float and double.
ATTN_KERNELS_ADDITIVE(ATTN_INSTANTIATE_KERNEL)

}  // namespace attn::cpu
