// Sequence-parallel attention over MPI (attn/distributed.hpp): the ring, forward and backward, and
// the all-to-all on heads (Ulysses). Every rank's arguments are checked once, collectively
// (distributed/common.hpp: agree); then each rank computes its blocks with the public fused calls
// (sdpa_forward, sdpa_merge, sdpa_backward_block), exactly as one process would over the whole
// sequences.
#include <algorithm>
#include <chrono>
#include <climits>
#include <limits>
#include <utility>
#include <vector>

#include "api/checks.hpp"
#include "api/sinks.hpp"
#include "attn/distributed.hpp"
#include "attn/memory.hpp"
#include "distributed/common.hpp"

namespace attn {
namespace distributed {
namespace {

constexpr int kTagBlock = 11, kTagGradients = 12, kTagHome = 13;

// A rank's elements in flight or gathered (blocks, gradients, heads over the whole sequence): cache-
// line aligned, in huge pages where large (attn/memory.hpp; their page faults had been a tenth of a
// rank's time in the ring's forward on a Zen 5 virtual machine).
template <class T>
using Elements = std::vector<T, detail::CacheLineAllocator<T>>;

// Elements of a block of `capacity`, rounded up to whole cache lines so that each of several blocks
// in one allocation starts on one.
template <class T>
std::size_t block_stride(std::size_t capacity) {
  constexpr std::size_t line = detail::kCacheLineBytes / sizeof(T);
  return (capacity + line - 1) / line * line;
}

thread_local DistributedTimes last_times;

// Adds the seconds from its construction to its destruction to one of last_times' fields.
class Stopwatch {
 public:
  explicit Stopwatch(double& into) : into_(into), start_(std::chrono::steady_clock::now()) {}
  ~Stopwatch() { into_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }
  Stopwatch(const Stopwatch&) = delete;
  Stopwatch& operator=(const Stopwatch&) = delete;

 private:
  double& into_;
  std::chrono::steady_clock::time_point start_;
};

// Failure::settle (distributed/common.hpp), its collective counted as communication.
void settle(const Failure& failure, const Comm& comm) {
  const Stopwatch waiting(last_times.communicate_seconds);
  failure.settle(comm);
}

// ---- the ring -------------------------------------------------------------------------------------

// One rank's keys and values packed as they travel: keys (B, Hk, rows, d), then values (B, Hk, rows, dv).
// The backward's gradients travel in the same layout (dK, then dV).
struct Packed {
  const Problem* p;
  index_t rows(int rank) const { return p->m_of[static_cast<std::size_t>(rank)]; }
  index_t count(int rank) const { return p->B * p->Hk * rows(rank) * (p->d + p->dv); }
  template <class T>
  View4<T> keys(T* block, int rank) const {
    return dense_view4(block, p->B, p->Hk, rows(rank), p->d);
  }
  template <class T>
  View4<T> values(T* block, int rank) const {
    return dense_view4(block + p->B * p->Hk * rows(rank) * p->d, p->B, p->Hk, rows(rank), p->dv);
  }
  // The largest block, checked against MPI's int counts (the same answer on every rank).
  index_t capacity() const {
    index_t most = 0;
    for (int r = 0; r < p->ranks; ++r) most = std::max(most, count(r));
    if (most > INT_MAX)
      detail::fail(p->op, ": a rank's keys and values hold ", most, " elements, more than MPI's int counts (", INT_MAX,
                   "): use more ranks");
    return most;
  }
};

template <class T>
void copy_rows(const View4<const T>& from, const View4<T>& to) {
  for (index_t b = 0; b < from.B; ++b)
    for (index_t h = 0; h < from.H; ++h)
      for (index_t r = 0; r < from.R; ++r) std::copy(from.row(b, h, r), from.row(b, h, r) + from.C, to.row(b, h, r));
}

template <class T>
void add_rows(const View4<const T>& from, const View4<T>& to) {
  for (index_t b = 0; b < from.B; ++b)
    for (index_t h = 0; h < from.H; ++h)
      for (index_t r = 0; r < from.R; ++r) {
        const T* x = from.row(b, h, r);
        T* y = to.row(b, h, r);
        for (index_t c = 0; c < from.C; ++c) y[c] += x[c];
      }
}

template <class T>
View4<T> rows4(const View4<T>& x, index_t r0, index_t r1) {
  View4<T> v = x;
  v.data = x.B * x.H * (r1 - r0) == 0 ? x.data : x.row(0, 0, r0);
  v.R = r1 - r0;
  return v;
}

// Non-blocking requests waited for together (MPI_REQUEST_NULL entries are ignored by MPI).
class Requests {
 public:
  explicit Requests(const Comm& comm) : comm_(comm) {}
  MPI_Request* add() { return &list_.emplace_back(MPI_REQUEST_NULL); }
  void wait() {
    const Stopwatch waiting(last_times.communicate_seconds);
    if (!list_.empty()) comm_.check(MPI_Waitall(static_cast<int>(list_.size()), list_.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
    list_.clear();
  }

 private:
  const Comm& comm_;
  std::vector<MPI_Request> list_;
};

// The ring's forward on the block of rank `src` in hand: each of this rank's query pieces against
// each of the block's key pieces that it may attend, merged into out and lse.
template <class T>
void forward_block(const Problem& p, const Mask<T>& mask, const SdpaOptions& options, const View4<const T>& q,
                   const View4<T>& out, const View4<T>& lse, int src, const T* block) {
  const Stopwatch computing(last_times.compute_seconds);
  const Packed packed{&p};
  const View4<const T> k = packed.keys(block, src), v = packed.values(block, src);
  for (const Piece& qp : pieces(p.n, p.ranks, p.rank, p.layout))
    for (const Piece& kp : pieces(p.m, p.ranks, src, p.layout)) {
      if (!p.may_attend(qp, kp)) continue;
      std::vector<std::int64_t> lens;
      const Mask<T> bm = block_mask(p, mask, qp, kp, lens);
      const index_t nq = qp.size();
      Tensor<T> part_out({p.B, p.H, nq, p.dv}), part_lse({p.B, p.H, nq});
      sdpa_forward<T>(part_out.view(), part_lse.view(), {}, rows_of(q, qp.local, qp.local + nq),
                      rows_of(k, kp.local, kp.local + kp.size()), rows_of(v, kp.local, kp.local + kp.size()), bm,
                      block_options(options, qp, kp));
      sdpa_merge<T>(rows_of(out, qp.local, qp.local + nq), rows_of(lse, qp.local, qp.local + nq), part_out.cview(),
                    part_lse.cview());
    }
}

// The ring's backward on the block of rank `src`: this rank's queries' share of the block's dK and
// dV added into grads (the block's layout), and the block's term of dQ into dq (when wanted).
template <class T>
void backward_block(const Problem& p, const Mask<T>& mask, const SdpaOptions& options, const View4<const T>& q,
                    const View4<const T>& dout, const View4<const T>& out, const View4<const T>& lse, const View4<T>& dq,
                    int src, const T* block, T* grads) {
  const Stopwatch computing(last_times.compute_seconds);
  const Packed packed{&p};
  const View4<const T> k = packed.keys(block, src), v = packed.values(block, src);
  const View4<T> dk = packed.keys(grads, src), dv = packed.values(grads, src);
  for (const Piece& qp : pieces(p.n, p.ranks, p.rank, p.layout))
    for (const Piece& kp : pieces(p.m, p.ranks, src, p.layout)) {
      if (!p.may_attend(qp, kp)) continue;
      std::vector<std::int64_t> lens;
      const Mask<T> bm = block_mask(p, mask, qp, kp, lens);
      const index_t nq = qp.size(), nk = kp.size(), q0 = qp.local, k0 = kp.local;
      const TensorView<const T> qv = rows_of(q, q0, q0 + nq), kv = rows_of(k, k0, k0 + nk), vv = rows_of(v, k0, k0 + nk);
      Tensor<T> block_dq({p.B, p.H, dq.empty() ? 0 : nq, p.d}), block_dk({p.B, p.Hk, nk, p.d}), block_dv({p.B, p.Hk, nk, p.dv});
      sdpa_backward_block<T>(dq.empty() ? TensorView<T>{} : block_dq.view(), block_dk.view(), block_dv.view(),
                             rows_of(dout, q0, q0 + nq), qv, kv, vv, rows_of(out, q0, q0 + nq), rows_of(lse, q0, q0 + nq),
                             bm, block_options(options, qp, kp));
      if (!dq.empty()) add_rows<T>(dense_view4(block_dq.data(), p.B, p.H, nq, p.d), rows4(dq, q0, q0 + nq));
      add_rows<T>(dense_view4(block_dk.data(), p.B, p.Hk, nk, p.d), rows4(dk, k0, k0 + nk));
      add_rows<T>(dense_view4(block_dv.data(), p.B, p.Hk, nk, p.dv), rows4(dv, k0, k0 + nk));
    }
}

// ---- the all-to-all on heads (Ulysses) ----------------------------------------------------------------

// The key/value heads [first, second) that rank t computes; its query heads are those times the group.
std::pair<index_t, index_t> kv_heads(const Problem& p, int t) {
  return {p.Hk * t / p.ranks, p.Hk * (t + 1) / p.ranks};
}

// Sequence shards <-> head shards for a tensor of `heads` heads (H: queries and their results, Hk:
// keys, values and their gradients) of row size C (0: an lse) over a sequence of `length` rows.
struct Heads {
  const Problem* p;
  index_t group;   // query heads per key/value head of this tensor: H / Hk, or 1
  index_t length;  // rows of the whole sequence (n or m)
  index_t C;

  index_t width() const { return std::max<index_t>(C, 1); }
  std::pair<index_t, index_t> of(int t) const {
    const auto [h0, h1] = kv_heads(*p, t);
    return {h0 * group, h1 * group};
  }
  index_t count(int t) const { return of(t).second - of(t).first; }
  index_t rows(int t) const { return shard_length(length, p->ranks, t, p->layout); }

  // Elements exchanged with rank t, as MPI's int counts and displacements.
  static std::vector<int> ints(const char* op, const std::vector<index_t>& xs) {
    std::vector<int> out;
    index_t total = 0;
    for (index_t x : xs) {
      total += x;
      if (total > INT_MAX)
        detail::fail(op, ": the all-to-all moves ", total, " elements to or from one rank, more than MPI's int counts (",
                     INT_MAX, "): use more ranks");
      out.push_back(static_cast<int>(x));
    }
    return out;
  }
  static std::vector<int> offsets(const std::vector<int>& counts) {
    std::vector<int> out(counts.size(), 0);
    for (std::size_t t = 1; t < counts.size(); ++t) out[t] = out[t - 1] + counts[t - 1];
    return out;
  }

  // This rank's rows of every head -> every row of this rank's heads, (B, count(rank), length, C) dense.
  template <class T>
  Elements<T> gather(const Comm& comm, const View4<const T>& x) const {
    const Stopwatch exchanging(last_times.communicate_seconds);
    const int P = p->ranks, me = p->rank;
    std::vector<index_t> send_n, recv_n;
    for (int t = 0; t < P; ++t) {
      send_n.push_back(p->B * count(t) * rows(me) * width());
      recv_n.push_back(p->B * count(me) * rows(t) * width());
    }
    const std::vector<int> sc = ints(p->op, send_n), rc = ints(p->op, recv_n), sd = offsets(sc), rd = offsets(rc);
    Elements<T> send(static_cast<std::size_t>(sd.back() + sc.back())), recv(static_cast<std::size_t>(rd.back() + rc.back()));
    T* s = send.data();
    for (int t = 0; t < P; ++t)
      for (index_t b = 0; b < p->B; ++b)
        for (index_t h = of(t).first; h < of(t).second; ++h)
          for (index_t i = 0; i < rows(me); ++i) s = std::copy(x.row(b, h, i), x.row(b, h, i) + width(), s);
    comm.check(MPI_Alltoallv(send.data(), sc.data(), sd.data(), mpi_type<T>(), recv.data(), rc.data(), rd.data(),
                             mpi_type<T>(), comm.get()),
               "MPI_Alltoallv");
    const index_t mine = count(me);
    Elements<T> full(static_cast<std::size_t>(p->B * mine * length * width()));
    const T* r = recv.data();
    for (int t = 0; t < P; ++t) {
      const std::vector<Piece> rows_of_t = pieces(length, P, t, p->layout);
      for (index_t b = 0; b < p->B; ++b)
        for (index_t h = 0; h < mine; ++h)
          for (const Piece& piece : rows_of_t)
            for (index_t g = piece.begin; g < piece.end; ++g, r += width())
              std::copy(r, r + width(), full.data() + ((b * mine + h) * length + g) * width());
    }
    return full;
  }

  // The inverse: every row of this rank's heads (B, count(rank), length, C) dense -> this rank's rows
  // of every head, written into x.
  template <class T>
  void scatter(const Comm& comm, const Elements<T>& full, const View4<T>& x) const {
    const Stopwatch exchanging(last_times.communicate_seconds);
    const int P = p->ranks, me = p->rank;
    std::vector<index_t> send_n, recv_n;
    for (int t = 0; t < P; ++t) {
      send_n.push_back(p->B * count(me) * rows(t) * width());
      recv_n.push_back(p->B * count(t) * rows(me) * width());
    }
    const std::vector<int> sc = ints(p->op, send_n), rc = ints(p->op, recv_n), sd = offsets(sc), rd = offsets(rc);
    Elements<T> send(static_cast<std::size_t>(sd.back() + sc.back())), recv(static_cast<std::size_t>(rd.back() + rc.back()));
    const index_t mine = count(me);
    T* s = send.data();
    for (int t = 0; t < P; ++t) {
      const std::vector<Piece> rows_of_t = pieces(length, P, t, p->layout);
      for (index_t b = 0; b < p->B; ++b)
        for (index_t h = 0; h < mine; ++h)
          for (const Piece& piece : rows_of_t)
            for (index_t g = piece.begin; g < piece.end; ++g) {
              const T* row = full.data() + ((b * mine + h) * length + g) * width();
              s = std::copy(row, row + width(), s);
            }
    }
    comm.check(MPI_Alltoallv(send.data(), sc.data(), sd.data(), mpi_type<T>(), recv.data(), rc.data(), rd.data(),
                             mpi_type<T>(), comm.get()),
               "MPI_Alltoallv");
    const T* r = recv.data();
    for (int t = 0; t < P; ++t)
      for (index_t b = 0; b < p->B; ++b)
        for (index_t h = of(t).first; h < of(t).second; ++h)
          for (index_t i = 0; i < rows(me); ++i, r += width())
            if (!x.empty()) std::copy(r, r + width(), x.row(b, h, i));
  }
};

// The user's mask for this rank's query heads over the whole sequences: ALiBi's slopes cut to them,
// and per-query valid lengths gathered from every rank's rows into the whole (B, n), held by `whole`.
// Collective: every rank calls it.
template <class T>
Mask<T> heads_mask(const Comm& comm, const Problem& p, const Mask<T>& mask, std::vector<std::int64_t>& whole) {
  Mask<T> local = mask;
  const index_t group = p.H / std::max<index_t>(p.Hk, 1);
  const auto [h0, h1] = kv_heads(p, p.rank);
  const TensorView<const T>& s = mask.alibi_slopes;
  if (s.rank() == 1) {
    local.alibi_slopes = TensorView<const T>(s.data() + h0 * group * s.stride(0), {(h1 - h0) * group}, {s.stride(0)});
  } else if (s.rank() == 2) {
    local.alibi_slopes =
        TensorView<const T>(s.data() + h0 * group * s.stride(1), {s.dim(0), (h1 - h0) * group}, {s.stride(0), s.stride(1)});
  }
  if (!mask.sinks.empty())  // this rank's query heads' sinks
    local.sinks = TensorView<const T>(mask.sinks.data() + h0 * group * mask.sinks.stride(0), {(h1 - h0) * group},
                                      {mask.sinks.stride(0)});
  const TensorView<const std::int64_t>& lens = mask.valid_lens;
  if (lens.rank() != 2) return local;
  const Stopwatch exchanging(last_times.communicate_seconds);
  const int P = p.ranks;
  const index_t n_r = p.n_of[static_cast<std::size_t>(p.rank)];
  std::vector<std::int64_t> mine(static_cast<std::size_t>(p.B * n_r));
  for (index_t b = 0; b < p.B; ++b)
    for (index_t i = 0; i < n_r; ++i) mine[b * n_r + i] = lens.data()[b * lens.stride(0) + i * lens.stride(1)];
  std::vector<index_t> sizes;
  for (int t = 0; t < P; ++t) sizes.push_back(p.B * p.n_of[static_cast<std::size_t>(t)]);
  const std::vector<int> counts = Heads::ints(p.op, sizes), displacements = Heads::offsets(counts);
  std::vector<std::int64_t> all(static_cast<std::size_t>(p.B * p.n));
  comm.check(MPI_Allgatherv(mine.data(), static_cast<int>(mine.size()), MPI_INT64_T, all.data(), counts.data(),
                            displacements.data(), MPI_INT64_T, comm.get()),
             "MPI_Allgatherv");
  whole.assign(all.size(), 0);
  for (int t = 0; t < P; ++t) {
    const index_t n_t = p.n_of[static_cast<std::size_t>(t)];
    const std::int64_t* from = all.data() + displacements[static_cast<std::size_t>(t)];
    for (index_t b = 0; b < p.B; ++b)
      for (const Piece& piece : pieces(p.n, P, t, p.layout))
        for (index_t g = piece.begin; g < piece.end; ++g) whole[b * p.n + g] = from[b * n_t + piece.local + g - piece.begin];
  }
  local.valid_lens = TensorView<const std::int64_t>(whole.data(), {p.B, p.n});
  return local;
}

// The options of this rank's heads over the whole sequences: dropout keyed by the global heads.
SdpaOptions heads_options(const Problem& p, const SdpaOptions& options) {
  const index_t group = p.H / std::max<index_t>(p.Hk, 1);
  return block_options(options, Piece{}, Piece{}, kv_heads(p, p.rank).first * group, p.H);
}

// agree (distributed/common.hpp), its collective counted as communication: the first step of every
// call, which starts last_times afresh.
template <class T>
Problem timed_agree(const Comm& comm, const char* op, ShardLayout layout, const TensorView<const T>& queries,
                    const TensorView<const T>& keys, const TensorView<const T>& values, const Mask<T>& mask,
                    const SdpaOptions& options, const std::function<void()>& local_check) {
  last_times = {};
  const Stopwatch checking(last_times.communicate_seconds);
  return agree<T>(comm, op, layout, queries, keys, values, mask, options, local_check);
}

}  // namespace
}  // namespace distributed

DistributedTimes last_distributed_times() { return distributed::last_times; }

using distributed::Comm;
using distributed::Problem;

template <class T>
void ring_sdpa_forward(MPI_Comm comm_in, TensorView<T> out, TensorView<T> lse, TensorView<const T> queries,
                       TensorView<const T> keys, TensorView<const T> values, const Mask<T>& mask,
                       const SdpaOptions& options, ShardLayout layout) {
  const char* op = "ring_sdpa_forward";
  const Comm comm(comm_in, op);
  const Problem p = distributed::timed_agree<T>(comm, op, layout, queries, keys, values, mask, options,
                             [&] { distributed::check_forward_outputs<T>(op, out, lse, queries, values); });
  const View4<const T> q = detail::to_view4(queries, op, "queries"), k = detail::to_view4(keys, op, "keys"),
                       v = detail::to_view4(values, op, "values");
  const View4<T> o = detail::to_view4(out, op, "out");
  const index_t n_r = p.n_of[static_cast<std::size_t>(p.rank)];
  const distributed::Packed packed{&p};
  const int P = p.ranks, me = p.rank, steps = p.ring_steps();
  // This rank's buffers, then whether every rank has its own: a rank without them cannot take part.
  distributed::Failure failure;
  Tensor<T> own_lse;
  View4<T> l;
  distributed::Elements<T> blocks;  // two, in one allocation (huge pages where large: attn/memory.hpp)
  T *cur = nullptr, *next = nullptr;
  failure.unless_failed([&] {
    own_lse = Tensor<T>({p.B, p.H, lse.empty() ? n_r : 0});
    l = distributed::lse_rows(lse.empty() ? own_lse.view() : lse, p.B, p.H, n_r);
    fill_zero(o);
    for (index_t b = 0; b < p.B; ++b)
      for (index_t h = 0; h < p.H; ++h)
        for (index_t i = 0; i < n_r; ++i) *l.row(b, h, i) = -std::numeric_limits<T>::infinity();
    const std::size_t stride = distributed::block_stride<T>(static_cast<std::size_t>(packed.capacity()));
    blocks.resize(2 * stride);
    cur = blocks.data(), next = cur + stride;
    distributed::copy_rows<T>(k, packed.keys(cur, me));
    distributed::copy_rows<T>(v, packed.values(cur, me));
  });
  distributed::settle(failure, comm);
  distributed::Requests requests(comm);
  for (int s = 0; s < steps; ++s) {
    const int src = (me - s + P) % P;
    if (s + 1 < steps) {  // the next block comes from the left while this one goes right
      const int next_src = (src - 1 + P) % P;
      comm.check(MPI_Irecv(next, static_cast<int>(packed.count(next_src)), distributed::mpi_type<T>(),
                           (me - 1 + P) % P, distributed::kTagBlock, comm.get(), requests.add()),
                 "MPI_Irecv");
      comm.check(MPI_Isend(cur, static_cast<int>(packed.count(src)), distributed::mpi_type<T>(), (me + 1) % P,
                           distributed::kTagBlock, comm.get(), requests.add()),
                 "MPI_Isend");
    }
    failure.unless_failed([&] { distributed::forward_block<T>(p, mask, options, q, o, l, src, cur); });
    requests.wait();
    std::swap(cur, next);
  }
  // Sinks once, on the rows merged over every block (the blocks' masks carry none).
  if (!mask.sinks.empty())
    failure.unless_failed([&] {
      detail::apply_sinks(o, l, View4<T>{}, [&](index_t h) { return mask.sinks.data()[h * mask.sinks.stride(0)]; });
    });
  distributed::settle(failure, comm);
}

template <class T>
void ring_sdpa_backward(MPI_Comm comm_in, TensorView<T> dqueries, TensorView<T> dkeys, TensorView<T> dvalues,
                        TensorView<const T> dout, TensorView<const T> queries, TensorView<const T> keys,
                        TensorView<const T> values, TensorView<const T> out, TensorView<const T> lse,
                        const Mask<T>& mask, const SdpaOptions& options, ShardLayout layout) {
  const char* op = "ring_sdpa_backward";
  const Comm comm(comm_in, op);
  const Problem p = distributed::timed_agree<T>(comm, op, layout, queries, keys, values, mask, options, [&] {
    distributed::check_backward_arguments<T>(op, dqueries, dkeys, dvalues, dout, queries, keys, values, out, lse);
  });
  const index_t n_r = p.n_of[static_cast<std::size_t>(p.rank)];
  const View4<const T> q = detail::to_view4(queries, op, "queries"), k = detail::to_view4(keys, op, "keys"),
                       v = detail::to_view4(values, op, "values"), g = detail::to_view4(dout, op, "dout"),
                       o = detail::to_view4(out, op, "out");
  const View4<const T> l = distributed::lse_rows(lse, p.B, p.H, n_r);
  const View4<T> dq = detail::to_view4(dqueries, op, "dqueries");

  // Keys and values travel right as in the forward; behind them, each block's gradients so far: at
  // step s this rank holds block me - s and receives its gradients from the left, where the block
  // was at step s - 1. After the last step the gradients go home to the block's rank.
  const distributed::Packed packed{&p};
  const int P = p.ranks, me = p.rank, steps = p.ring_steps();
  const std::size_t capacity = static_cast<std::size_t>(packed.capacity());
  // Two blocks in flight (cur, next), a block's gradients being summed (grads), two gradient blocks
  // in flight (incoming, outgoing); incoming, free after the last step, takes this rank's own home.
  // One allocation for the five (huge pages where large: attn/memory.hpp).
  // Allocated, and every rank's found, before the ring starts (ring_sdpa_forward).
  distributed::Failure failure;
  distributed::Elements<T> buffers;
  T *cur = nullptr, *next = nullptr, *grads = nullptr, *incoming = nullptr, *outgoing = nullptr;
  failure.unless_failed([&] {
    fill_zero(dq);
    const std::size_t stride = distributed::block_stride<T>(capacity);
    buffers.resize(5 * stride);
    T* at = buffers.data();
    for (T** buffer : {&cur, &next, &grads, &incoming, &outgoing}) *buffer = at, at += stride;
    distributed::copy_rows<T>(k, packed.keys(cur, me));
    distributed::copy_rows<T>(v, packed.values(cur, me));
  });
  distributed::settle(failure, comm);
  distributed::Requests blocks(comm), sent(comm);
  int src = me;
  for (int s = 0; s < steps; ++s) {
    src = (me - s + P) % P;
    const int left = (me - 1 + P) % P, right = (me + 1) % P, count = static_cast<int>(packed.count(src));
    if (s + 1 < steps) {
      const int next_src = (src - 1 + P) % P;
      comm.check(MPI_Irecv(next, static_cast<int>(packed.count(next_src)), distributed::mpi_type<T>(), left,
                           distributed::kTagBlock, comm.get(), blocks.add()),
                 "MPI_Irecv");
      comm.check(MPI_Isend(cur, count, distributed::mpi_type<T>(), right, distributed::kTagBlock, comm.get(),
                           blocks.add()),
                 "MPI_Isend");
    }
    distributed::Requests arriving(comm);
    if (s > 0)
      comm.check(MPI_Irecv(incoming, count, distributed::mpi_type<T>(), left, distributed::kTagGradients,
                           comm.get(), arriving.add()),
                 "MPI_Irecv");
    std::fill(grads, grads + count, T(0));
    failure.unless_failed([&] { distributed::backward_block<T>(p, mask, options, q, g, o, l, dq, src, cur, grads); });
    arriving.wait();
    if (s > 0)
      for (int e = 0; e < count; ++e) grads[e] += incoming[e];
    if (s + 1 < steps) {
      sent.wait();  // the previous step's gradients have left `outgoing`
      std::copy(grads, grads + count, outgoing);
      comm.check(MPI_Isend(outgoing, count, distributed::mpi_type<T>(), right, distributed::kTagGradients,
                           comm.get(), sent.add()),
                 "MPI_Isend");
    }
    blocks.wait();
    std::swap(cur, next);
  }
  sent.wait();
  // Home: the block held last (src) goes to its rank; this rank's own block comes from where it is.
  const int holder = (me + steps - 1) % P;
  T* home = incoming;
  if (src == me) {
    home = grads;
  } else {
    const distributed::Stopwatch returning(distributed::last_times.communicate_seconds);
    comm.check(MPI_Sendrecv(grads, static_cast<int>(packed.count(src)), distributed::mpi_type<T>(), src,
                            distributed::kTagHome, home, static_cast<int>(packed.count(me)),
                            distributed::mpi_type<T>(), holder, distributed::kTagHome, comm.get(), MPI_STATUS_IGNORE),
               "MPI_Sendrecv");
  }
  if (!dkeys.empty())
    distributed::copy_rows<T>(packed.keys(home, me), detail::to_view4(dkeys, op, "dkeys"));
  if (!dvalues.empty())
    distributed::copy_rows<T>(packed.values(home, me), detail::to_view4(dvalues, op, "dvalues"));
  distributed::settle(failure, comm);
}

template <class T>
void ulysses_sdpa_forward(MPI_Comm comm_in, TensorView<T> out, TensorView<T> lse, TensorView<const T> queries,
                          TensorView<const T> keys, TensorView<const T> values, const Mask<T>& mask,
                          const SdpaOptions& options, ShardLayout layout) {
  const char* op = "ulysses_sdpa_forward";
  const Comm comm(comm_in, op);
  const Problem p = distributed::timed_agree<T>(comm, op, layout, queries, keys, values, mask, options,
                             [&] { distributed::check_forward_outputs<T>(op, out, lse, queries, values); });
  const index_t group = p.H / std::max<index_t>(p.Hk, 1), n_r = p.n_of[static_cast<std::size_t>(p.rank)];
  const distributed::Heads qh{&p, group, p.n, p.d}, kh{&p, 1, p.m, p.d}, vh{&p, 1, p.m, p.dv}, oh{&p, group, p.n, p.dv},
      lh{&p, group, p.n, 0};
  const distributed::Elements<T> qf = qh.gather(comm, detail::to_view4(queries, op, "queries"));
  const distributed::Elements<T> kf = kh.gather(comm, detail::to_view4(keys, op, "keys"));
  const distributed::Elements<T> vf = vh.gather(comm, detail::to_view4(values, op, "values"));
  const index_t hq = qh.count(p.rank), hk = kh.count(p.rank);
  std::vector<std::int64_t> whole_lens;
  const Mask<T> local_mask = distributed::heads_mask(comm, p, mask, whole_lens);
  distributed::Elements<T> of(static_cast<std::size_t>(p.B * hq * p.n * p.dv)), lf(static_cast<std::size_t>(p.B * hq * p.n));
  // A failed kernel's error waits for the exchanges, which every rank takes part in (Failure).
  distributed::Failure failure;
  if (hk > 0) failure.unless_failed([&] {
    const distributed::Stopwatch computing(distributed::last_times.compute_seconds);
    sdpa_forward<T>(TensorView<T>(of.data(), {p.B, hq, p.n, p.dv}), TensorView<T>(lf.data(), {p.B, hq, p.n}), {},
                    TensorView<const T>(qf.data(), {p.B, hq, p.n, p.d}), TensorView<const T>(kf.data(), {p.B, hk, p.m, p.d}),
                    TensorView<const T>(vf.data(), {p.B, hk, p.m, p.dv}), local_mask, distributed::heads_options(p, options));
  });
  oh.scatter(comm, of, detail::to_view4(out, op, "out"));
  lh.scatter(comm, lf, lse.empty() ? View4<T>{} : distributed::lse_rows(lse, p.B, p.H, n_r));
  distributed::settle(failure, comm);
}

template <class T>
void ulysses_sdpa_backward(MPI_Comm comm_in, TensorView<T> dqueries, TensorView<T> dkeys, TensorView<T> dvalues,
                           TensorView<const T> dout, TensorView<const T> queries, TensorView<const T> keys,
                           TensorView<const T> values, TensorView<const T> out, TensorView<const T> lse,
                           const Mask<T>& mask, const SdpaOptions& options, ShardLayout layout) {
  const char* op = "ulysses_sdpa_backward";
  const Comm comm(comm_in, op);
  const Problem p = distributed::timed_agree<T>(comm, op, layout, queries, keys, values, mask, options, [&] {
    distributed::check_backward_arguments<T>(op, dqueries, dkeys, dvalues, dout, queries, keys, values, out, lse);
  });
  const index_t group = p.H / std::max<index_t>(p.Hk, 1), n_r = p.n_of[static_cast<std::size_t>(p.rank)];
  const distributed::Heads qh{&p, group, p.n, p.d}, kh{&p, 1, p.m, p.d}, vh{&p, 1, p.m, p.dv}, oh{&p, group, p.n, p.dv},
      lh{&p, group, p.n, 0};
  const distributed::Elements<T> qf = qh.gather(comm, detail::to_view4(queries, op, "queries"));
  const distributed::Elements<T> kf = kh.gather(comm, detail::to_view4(keys, op, "keys"));
  const distributed::Elements<T> vf = vh.gather(comm, detail::to_view4(values, op, "values"));
  const distributed::Elements<T> of = oh.gather(comm, detail::to_view4(out, op, "out"));
  const distributed::Elements<T> gf = oh.gather(comm, detail::to_view4(dout, op, "dout"));
  const distributed::Elements<T> lf = lh.gather(comm, distributed::lse_rows(lse, p.B, p.H, n_r));
  const index_t hq = qh.count(p.rank), hk = kh.count(p.rank);
  std::vector<std::int64_t> whole_lens;
  const Mask<T> local_mask = distributed::heads_mask(comm, p, mask, whole_lens);
  distributed::Elements<T> dqf(qf.size()), dkf(kf.size()), dvf(vf.size());
  distributed::Failure failure;  // as in the forward
  if (hk > 0) failure.unless_failed([&] {
    const distributed::Stopwatch computing(distributed::last_times.compute_seconds);
    sdpa_backward<T>(TensorView<T>(dqf.data(), {p.B, hq, p.n, p.d}), TensorView<T>(dkf.data(), {p.B, hk, p.m, p.d}),
                     TensorView<T>(dvf.data(), {p.B, hk, p.m, p.dv}), TensorView<const T>(gf.data(), {p.B, hq, p.n, p.dv}),
                     TensorView<const T>(qf.data(), {p.B, hq, p.n, p.d}), TensorView<const T>(kf.data(), {p.B, hk, p.m, p.d}),
                     TensorView<const T>(vf.data(), {p.B, hk, p.m, p.dv}), TensorView<const T>(of.data(), {p.B, hq, p.n, p.dv}),
                     TensorView<const T>(lf.data(), {p.B, hq, p.n}), local_mask, distributed::heads_options(p, options));
  });
  // Every rank takes part in each exchange, wanted here or not (an empty view receives nothing).
  qh.scatter(comm, dqf, detail::to_view4(dqueries, op, "dqueries"));
  kh.scatter(comm, dkf, detail::to_view4(dkeys, op, "dkeys"));
  vh.scatter(comm, dvf, detail::to_view4(dvalues, op, "dvalues"));
  distributed::settle(failure, comm);
}

#define ATTN_INSTANTIATE(T)                                                                                           \
  template void ring_sdpa_forward<T>(MPI_Comm, TensorView<T>, TensorView<T>, TensorView<const T>, TensorView<const T>, \
                                     TensorView<const T>, const Mask<T>&, const SdpaOptions&, ShardLayout);          \
  template void ring_sdpa_backward<T>(MPI_Comm, TensorView<T>, TensorView<T>, TensorView<T>, TensorView<const T>,     \
                                      TensorView<const T>, TensorView<const T>, TensorView<const T>,                  \
                                      TensorView<const T>, TensorView<const T>, const Mask<T>&, const SdpaOptions&,   \
                                      ShardLayout);                                                                   \
  template void ulysses_sdpa_forward<T>(MPI_Comm, TensorView<T>, TensorView<T>, TensorView<const T>,                  \
                                        TensorView<const T>, TensorView<const T>, const Mask<T>&, const SdpaOptions&, \
                                        ShardLayout);                                                                 \
  template void ulysses_sdpa_backward<T>(MPI_Comm, TensorView<T>, TensorView<T>, TensorView<T>, TensorView<const T>,  \
                                         TensorView<const T>, TensorView<const T>, TensorView<const T>,               \
                                         TensorView<const T>, TensorView<const T>, const Mask<T>&,                    \
                                         const SdpaOptions&, ShardLayout);
ATTN_INSTANTIATE(float)
ATTN_INSTANTIATE(double)
#undef ATTN_INSTANTIATE

}  // namespace attn
