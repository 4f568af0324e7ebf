// Exact attention over sequences split across the processes of an MPI communicator (context
// parallelism), for sequences whose keys and values outgrow one machine. Built when CMake finds MPI
// (the library attn_distributed; Debian's OpenMPI).
//
// Each of the P ranks of `comm` holds a shard of the queries, keys and values along the sequence
// axis: queries (B, H, n_r, d) or (B, n_r, d), keys (B, Hk, m_r, d), values (B, Hk, m_r, dv), and gets
// the rows of out and lse of its own queries, exactly as the single-process sdpa_forward would give
// them for the whole sequences (n = sum of n_r queries, m = sum of m_r keys).
//
// Layouts (shard_rows below says which rows a rank holds):
//   contiguous  rank r holds rows [floor(r L / P), floor((r + 1) L / P)) of a sequence of length L;
//   zigzag      the sequence is cut into 2P chunks, chunk c = [floor(c L / 2P), floor((c + 1) L / 2P)),
//               and rank r holds chunk r followed by chunk 2P - 1 - r: under a causal mask every rank
//               then has the same work (the ring's idle time vanishes).
// Queries and keys follow the same layout, each split by its own length.
//
// Algorithms:
//   ring     (Liu et al., 2023) the key/value shards travel around the ring of ranks with
//            non-blocking sends and receives, each overlapped with the fused kernel on the shard in
//            hand; the partial results merge exactly through their log-sum-exp (sdpa_merge). The
//            backward passes dK and dV around the ring with their shards (sdpa_backward_block). Blocks
//            that a causal mask or a window leaves no key of are not computed, and a window's ring
//            stops once no rank needs a further block (those are never sent).
//   ulysses  (DeepSpeed-Ulysses) an all-to-all turns the sequence shards into head shards (rank t
//            gets key/value heads [floor(t Hk / P), floor((t + 1) Hk / P)) and their query heads over
//            the whole sequence), the local fused kernel runs, and a second all-to-all returns the
//            rows. Needs Hk >= P for every rank to have work.
//
// Masks and options: causal (either alignment, in whole-sequence positions), valid lengths of shape
// (B,) (the same on every rank: key lengths of the whole sequence) or (B, n_r) (per query: this
// rank's rows of the whole (B, n), in its shard's order; lengths count keys of the whole sequence), a
// sliding window, ALiBi slopes, soft-capping, the scale and dropout (the weights one process drops
// with the same seed: every block call's draws are keyed by the whole attention's rows, keys and
// heads, Dropout's offsets), with grouped-query heads. Not yet: keep and additive masks, segment ids
// and MaskedFill::d2l_minus_1e6 (each raises attn::Error). float and double.
//
// Errors never hang: every rank first checks its own arguments, then one MPI_Allgather compares all
// ranks' shapes, dtypes and options; if any rank's check failed or the ranks disagree, every rank
// raises the same attn::Error (naming the rank and the argument). An error one rank meets later in
// the call (a block's kernel reaching attn's memory limit, attn/memory.hpp) is held until the call's
// exchanges are done, which that rank still takes part in, computing nothing more; then every rank
// raises: that rank its own exception, the others attn::Error with its message and "(on rank r of
// P)", a MemoryError where it ran out of memory. The outputs of such a call are unspecified. MPI
// errors (the calls run on a duplicate of comm that returns errors) become attn::Error too.
//
// Memory per rank, beside its shards: O((n + m) d H / P). The ring's forward adds its output, two
// key/value blocks in flight and a block's partial output; its backward five key/value-sized buffers
// (two blocks and two gradient blocks in flight, one being summed) and a block's
// gradients; the all-to-all its heads over the whole sequence, and in its backward the fused
// kernel's partial dQ of about 16 key chunks (16 n d). Measured by distributed.memory_ranks_P.
#pragma once

#include <mpi.h>

#include <utility>
#include <vector>

#include "attn/mask.hpp"
#include "attn/sdpa.hpp"
#include "attn/tensor.hpp"

namespace attn {

enum class ShardLayout { contiguous, zigzag };

// The rows [begin, end) of a sequence of `length` that rank `rank` of `ranks` holds, in the order
// they are stored in its shard (one range contiguous, two zigzag; empty ranges are kept).
std::vector<std::pair<index_t, index_t>> shard_rows(index_t length, int ranks, int rank, ShardLayout layout);

// The number of rows of that shard.
index_t shard_length(index_t length, int ranks, int rank, ShardLayout layout);

// out (B, H, n_r, dv) and lse (B, H, n_r) (or (B, n_r, dv), (B, n_r)) of this rank's queries; lse may
// be empty. Collective over comm.
template <class T>
void ring_sdpa_forward(MPI_Comm comm, TensorView<T> out, TensorView<T> lse, TensorView<const T> queries,
                       TensorView<const T> keys, TensorView<const T> values, const Mask<T>& mask = {},
                       const SdpaOptions& options = {}, ShardLayout layout = ShardLayout::contiguous);

// Attention sinks (Mask::sinks, (H,), the same on every rank) are applied once to the rows merged
// over every block (ring) or by each rank's heads (Ulysses); their gradient is a sum over every
// query row: sdpa_sinks_backward (attn/sdpa.hpp) on this rank's dout, out and lse, summed over the
// ranks (MPI_Allreduce). The alignment (Mask::align) places the whole sequences' queries.
// dqueries, dkeys, dvalues of this rank's shards from dout, given the forward's inputs, out and lse
// (both required: the whole attention's, as ring_sdpa_forward returned them). Any gradient may be
// empty. Collective over comm.
template <class T>
void ring_sdpa_backward(MPI_Comm comm, TensorView<T> dqueries, TensorView<T> dkeys, TensorView<T> dvalues,
                        TensorView<const T> dout, TensorView<const T> queries, TensorView<const T> keys,
                        TensorView<const T> values, TensorView<const T> out, TensorView<const T> lse,
                        const Mask<T>& mask = {}, const SdpaOptions& options = {},
                        ShardLayout layout = ShardLayout::contiguous);

// The same results by the all-to-all on heads.
template <class T>
void ulysses_sdpa_forward(MPI_Comm comm, TensorView<T> out, TensorView<T> lse, TensorView<const T> queries,
                          TensorView<const T> keys, TensorView<const T> values, const Mask<T>& mask = {},
                          const SdpaOptions& options = {}, ShardLayout layout = ShardLayout::contiguous);

/// The gradients of ulysses_sdpa_forward, as ring_sdpa_backward gives them.
template <class T>
void ulysses_sdpa_backward(MPI_Comm comm, TensorView<T> dqueries, TensorView<T> dkeys, TensorView<T> dvalues,
                           TensorView<const T> dout, TensorView<const T> queries, TensorView<const T> keys,
                           TensorView<const T> values, TensorView<const T> out, TensorView<const T> lse,
                           const Mask<T>& mask = {}, const SdpaOptions& options = {},
                           ShardLayout layout = ShardLayout::contiguous);

// How this rank spent its last distributed call (on the calling thread): in the fused kernels on its
// blocks (compute), and in MPI (the argument check, waiting for sends and receives, the all-to-alls
// with their packing). The ring hides communication when communicate stays near 0; a rank whose
// compute is short of the slowest rank's idles for the difference. `attn bench --distributed` reports it.
struct DistributedTimes {
  double compute_seconds = 0;
  double communicate_seconds = 0;
};
/// The calling thread's times of its last ring or all-to-all call.
DistributedTimes last_distributed_times();

}  // namespace attn
