// What the ring and the all-to-all (Ulysses) attention share (attn/distributed.hpp): the
// communicator that turns MPI errors into attn::Error, the one collective check of every rank's
// arguments, the problem the ranks agreed on, and the mask of one block of the whole attention.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <type_traits>
#include <vector>

#include "attn/distributed.hpp"
#include "attn/error.hpp"
#include "core/view4.hpp"

namespace attn::distributed {

// A duplicate of the caller's communicator whose MPI errors return instead of aborting, so that
// check() can raise them as attn::Error; freed when the call ends.
class Comm {
 public:
  Comm(MPI_Comm comm, const char* op);
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  MPI_Comm get() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  // Throws attn::Error naming the operation, `what` and MPI's message when code is not MPI_SUCCESS.
  void check(int code, const char* what) const;

 private:
  const char* op_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
};

// An error this rank meets after the collective check, in the work wrapped by unless_failed (the
// ring's buffers, a block's kernel: attn's memory limit reached by its tensors or scratch, std::bad_alloc),
// held rather than thrown at once: thrown there, it left the other ranks waiting for this rank's
// messages for ever. The rank computes nothing more but takes its part in every exchange that
// follows, and settle() then raises it on every rank. (The all-to-all's exchange buffers are not
// wrapped: a rank that cannot allocate one still leaves the others waiting.)
class Failure {
 public:
  // Runs step() unless this rank has failed already, keeping what it throws.
  template <class Step>
  void unless_failed(const Step& step) {
    if (error_) return;
    try {
      step();
    } catch (...) {
      error_ = std::current_exception();
    }
  }
  // Collective (one MPI_Allreduce of an int when no rank failed). Where some rank failed, every rank
  // throws: a rank that failed its own exception again, the others attn::Error (MemoryError where
  // that rank ran out of memory) with the lowest such rank's message, naming it: "... (on rank r of P)".
  void settle(const Comm& comm) const;

 private:
  std::exception_ptr error_;
};

template <class T>
MPI_Datatype mpi_type() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
  return std::is_same_v<T, float> ? MPI_FLOAT : MPI_DOUBLE;
}

// Global rows [begin, end) of a sequence, stored from row `local` of a rank's shard.
struct Piece {
  index_t begin = 0, end = 0, local = 0;
  index_t size() const { return end - begin; }
};
std::vector<Piece> pieces(index_t length, int ranks, int rank, ShardLayout layout);

// The whole problem, as every rank agreed on it: shapes (4-D: a 3-D call has H = Hk = 1), the global
// lengths n and m, each rank's shard lengths, and what of the mask shapes the blocks.
struct Problem {
  const char* op = "";
  ShardLayout layout = ShardLayout::contiguous;
  int ranks = 1, rank = 0, tensor_rank = 4;
  index_t B = 0, H = 0, Hk = 0, d = 0, dv = 0;
  index_t n = 0, m = 0;                 // the whole sequences' lengths
  std::vector<index_t> n_of, m_of;      // each rank's shard lengths
  Causal causal = Causal::none;
  Align align = Align::top_left;        // where the queries sit (attn/mask.hpp)
  std::optional<Window> window;
  std::int64_t longest_valid = -1;      // the largest valid length, -1 without valid lengths

  // Whether any query of global rows q may attend to any key of global rows k: a block that fails
  // this is neither computed nor, where a whole ring step fails it, sent.
  bool may_attend(const Piece& q, const Piece& k) const;
  // Ring steps that some rank needs (a window can leave the furthest blocks unneeded); at least 1.
  int ring_steps() const;
};

// The local argument checks and then the one collective check. `local_check` throws attn::Error for
// this rank's bad arguments (shapes, unsupported mask parts); its message, or that the ranks
// disagree, reaches every rank, which all throw the same attn::Error. Returns the agreed problem.
template <class T>
Problem agree(const Comm& comm, const char* op, ShardLayout layout, const TensorView<const T>& queries,
              const TensorView<const T>& keys, const TensorView<const T>& values, const Mask<T>& mask,
              const SdpaOptions& options, const std::function<void()>& local_check);

// The mask of queries at global rows q against keys at global rows k, as one block call: the causal
// rule, the window and ALiBi in whole-sequence positions (Mask::query_start and key_start), valid
// lengths cut to the block (held by lens_block, which must outlive the mask).
template <class T>
Mask<T> block_mask(const Problem& p, const Mask<T>& mask, const Piece& q, const Piece& k,
                   std::vector<std::int64_t>& lens_block);

// The options of one block call: dropout keyed by the whole attention's rows, keys and heads
// (Dropout's offsets moved by where the block's queries and keys start and, for a call on heads
// [head_start, ...) of `heads`, by its first head; heads 0: the call has every head).
SdpaOptions block_options(const SdpaOptions& options, const Piece& q, const Piece& k, index_t head_start = 0,
                          index_t heads = 0);

// A (B, H, rows, C) view of rows [r0, r1) of x, or of (B, H, rows) when C is 0: an lse, kept as a
// View4 whose C of 0 says it has no column axis.
template <class T>
TensorView<T> rows_of(const View4<T>& x, index_t r0, index_t r1) {
  const index_t count = r1 - r0;
  T* data = x.B * x.H * count == 0 ? x.data : x.row(0, 0, r0);
  if (x.C == 0) return TensorView<T>(data, {x.B, x.H, count}, {x.sB, x.sH, x.sR});
  return TensorView<T>(data, {x.B, x.H, count, x.C}, {x.sB, x.sH, x.sR, 1});
}

}  // namespace attn::distributed

namespace attn::distributed {

// lse (B, H, R) or (B, R) as a View4 with no column axis (C = 0), for rows_of.
template <class T>
View4<T> lse_rows(const TensorView<T>& lse, index_t B, index_t H, index_t R) {
  if (lse.rank() == 2) return {lse.data(), B, 1, R, 0, lse.stride(0), 0, lse.stride(1)};
  return {lse.data(), B, H, R, 0, lse.stride(0), lse.stride(1), lse.stride(2)};
}

// The local checks of a forward's outputs: out (B, H, n_r, dv) required, lse (B, H, n_r) optional
// (3-D calls: (B, n_r, dv) and (B, n_r)).
template <class T>
void check_forward_outputs(const char* op, const TensorView<T>& out, const TensorView<T>& lse,
                           const TensorView<const T>& queries, const TensorView<const T>& values);

// The local checks of a backward's arguments: dout, out and lse required as the forward's outputs,
// each gradient empty or shaped as its input.
template <class T>
void check_backward_arguments(const char* op, const TensorView<T>& dqueries, const TensorView<T>& dkeys,
                              const TensorView<T>& dvalues, const TensorView<const T>& dout,
                              const TensorView<const T>& queries, const TensorView<const T>& keys,
                              const TensorView<const T>& values, const TensorView<const T>& out,
                              const TensorView<const T>& lse);

}  // namespace attn::distributed
