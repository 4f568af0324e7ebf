// The shards, the communicator and the collective argument check of the distributed attention
// (distributed/common.hpp).
#include "distributed/common.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <string>

#include "api/checks.hpp"

namespace attn {

std::vector<std::pair<index_t, index_t>> shard_rows(index_t length, int ranks, int rank, ShardLayout layout) {
  if (ranks < 1 || rank < 0 || rank >= ranks)
    detail::fail("shard_rows: rank ", rank, " of ", ranks, " ranks; it must lie in [0, ranks) with ranks >= 1");
  if (length < 0) detail::fail("shard_rows: length is ", length, "; it must not be negative");
  // floor(c L / parts) without forming c L (which may pass 2^63 for a long sequence on many ranks).
  const auto cut = [length](index_t c, index_t parts) { return c * (length / parts) + c * (length % parts) / parts; };
  if (layout == ShardLayout::contiguous) return {{cut(rank, ranks), cut(rank + 1, ranks)}};
  const index_t chunks = 2 * static_cast<index_t>(ranks), mirror = chunks - 1 - rank;
  return {{cut(rank, chunks), cut(rank + 1, chunks)}, {cut(mirror, chunks), cut(mirror + 1, chunks)}};
}

index_t shard_length(index_t length, int ranks, int rank, ShardLayout layout) {
  index_t rows = 0;
  for (const auto& [begin, end] : shard_rows(length, ranks, rank, layout)) rows += end - begin;
  return rows;
}

namespace distributed {

Comm::Comm(MPI_Comm comm, const char* op) : op_(op) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) detail::fail(op, ": MPI is not initialized (call MPI_Init first) or already finalized");
  if (comm == MPI_COMM_NULL) detail::fail(op, ": comm is MPI_COMM_NULL");
  // The caller's communicator keeps its error handler; errors on the duplicate return to check().
  check(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
  check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
}

Comm::~Comm() {
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void Comm::check(int code, const char* what) const {
  if (code == MPI_SUCCESS) return;
  char message[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(code, message, &length);
  detail::fail(op_, ": ", what, " failed on rank ", rank_, ": ", std::string(message, static_cast<std::size_t>(length)));
}

void Failure::settle(const Comm& comm) const {
  struct Report {
    std::int32_t kind = 0;  // 0: none, 1: attn::Error or another exception, 2: out of memory
    char message[500] = {};
  };
  Report mine;
  if (error_) {
    const auto keep = [&mine](std::int32_t kind, const char* what) {
      mine.kind = kind;
      std::strncpy(mine.message, what, sizeof mine.message - 1);
    };
    try {
      std::rethrow_exception(error_);
    } catch (const MemoryError& e) {
      keep(2, e.what());
    } catch (const std::bad_alloc&) {
      keep(2, "out of memory (std::bad_alloc)");
    } catch (const std::exception& e) {
      keep(1, e.what());
    } catch (...) {
      keep(1, "an exception that is not a std::exception");
    }
  }
  int failed = mine.kind != 0, any = 0;
  comm.check(MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, comm.get()), "MPI_Allreduce");
  if (!any) return;
  std::vector<Report> all(static_cast<std::size_t>(comm.size()));
  comm.check(MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, comm.get()), "MPI_Allgather");
  if (error_) std::rethrow_exception(error_);
  for (int r = 0; r < comm.size(); ++r) {
    const Report& report = all[static_cast<std::size_t>(r)];
    if (report.kind == 0) continue;
    const std::string message = detail::cat(report.message, " (on rank ", r, " of ", comm.size(), ")");
    if (report.kind == 2) throw MemoryError(message);
    throw Error(message);
  }
}

std::vector<Piece> pieces(index_t length, int ranks, int rank, ShardLayout layout) {
  std::vector<Piece> out;
  index_t local = 0;
  for (const auto& [begin, end] : shard_rows(length, ranks, rank, layout)) {
    out.push_back({begin, end, local});
    local += end - begin;
  }
  return out;
}

bool Problem::may_attend(const Piece& q, const Piece& k) const {
  if (q.size() <= 0 || k.size() <= 0) return false;
  const index_t shift = align == Align::bottom_right ? m - n : 0;  // position p(i) = i + shift
  const index_t first = q.begin + shift, last = q.end - 1 + shift;
  index_t hi = std::numeric_limits<index_t>::max(), lo = std::numeric_limits<index_t>::min();
  if (causal != Causal::none) hi = last;
  if (window && window->right >= 0) hi = std::min(hi, last + window->right);
  if (window && window->left >= 0) lo = first - window->left;
  if (longest_valid >= 0) hi = std::min<index_t>(hi, longest_valid - 1);
  return k.begin <= hi && k.end - 1 >= lo;
}

int Problem::ring_steps() const {
  int steps = 1;
  for (int r = 0; r < ranks; ++r) {
    const std::vector<Piece> queries = pieces(n, ranks, r, layout);
    for (int s = steps; s < ranks; ++s) {  // steps below the current count are needed anyway
      const std::vector<Piece> keys = pieces(m, ranks, (r - s + ranks) % ranks, layout);
      for (const Piece& q : queries)
        for (const Piece& k : keys)
          if (may_attend(q, k)) steps = s + 1;
    }
  }
  return steps;
}

namespace {

// What one rank passes, gathered from every rank by one MPI_Allgather. error: this rank's argument
// error, "" when none (then every field is meaningful).
struct Descriptor {
  char error[512];
  char function[64];  // op: the algorithm and the pass
  std::int64_t layout;
  std::int64_t field[24];
  double scale, softcap, dropout;
};

// Fields below kQueryRows must be equal on every rank; the rest are the rank's own: its rows, and
// the smallest and largest of its per-query valid lengths (0 and -1 without them).
constexpr const char* kFieldNames[24] = {
    "the element size", "the rank of queries", "B (batch)", "H (query heads)", "Hk (key/value heads)", "d (query size)",
    "dv (value size)", "the causal mask and alignment", "the window", "the window's left bound", "the window's right bound",
    "the number of valid lengths", "the valid lengths", "the number of ALiBi slopes", "the ALiBi slopes and sinks",
    "the dropout seed", "dropout's row_start", "dropout's key_start", "dropout's head_start", "dropout's heads",
    "the queries' rows", "the keys' rows", "the smallest valid length", "the largest valid length"};
constexpr int kLengthCount = 11, kQueryRows = 20, kKeyRows = 21, kLowestLength = 22, kLongestLength = 23;

// The valid lengths a rank passes, from its kLengthCount field: -1 none, -2 per query, else (B,).
std::string lengths_kind(std::int64_t count) {
  return count == -1 ? "no valid lengths" : count == -2 ? "per-query valid lengths (B, n_r)" : "valid lengths (B,)";
}

// Field f's value as a message shows it: names for codes, "none" for a count of -1. The fields
// that hold a hash of values (hashed(f)) are named, not shown.
constexpr int kCausalCode = 7, kHasWindow = 8, kLengthsHash = 12, kSlopeCount = 13, kSlopesAndSinksHash = 14;
bool hashed(int f) { return f == kLengthsHash || f == kSlopesAndSinksHash; }
std::string shown(int f, std::int64_t value) {
  if (f == kCausalCode) {
    const char* causal[] = {"none", "top_left", "bottom_right"};
    return detail::cat("causal ", causal[std::clamp<std::int64_t>(value / 2, 0, 2)], ", align ",
                       value % 2 == 0 ? "top_left" : "bottom_right");
  }
  if (f == kHasWindow) return value != 0 ? "a window" : "no window";
  if (f == kSlopeCount && value == -1) return "none";
  return std::to_string(value);
}

template <class V>
std::int64_t hash_of(const TensorView<const V>& t) {  // FNV-1a over the elements' bytes, in index order
  std::uint64_t h = 1469598103934665603ull;
  const index_t count = t.empty() ? 0 : t.numel();
  for (index_t e = 0; e < count; ++e) {
    index_t offset = 0, rest = e;
    for (int i = t.rank() - 1; i >= 0; --i) offset += (rest % t.dim(i)) * t.stride(i), rest /= t.dim(i);
    unsigned char bytes[sizeof(V)];
    std::memcpy(bytes, t.data() + offset, sizeof(V));
    for (unsigned char byte : bytes) h = (h ^ byte) * 1099511628211ull;
  }
  return static_cast<std::int64_t>(h);
}

}  // namespace

template <class T>
Problem agree(const Comm& comm, const char* op, ShardLayout layout, const TensorView<const T>& queries,
              const TensorView<const T>& keys, const TensorView<const T>& values, const Mask<T>& mask,
              const SdpaOptions& options, const std::function<void()>& local_check) {
  Descriptor mine{};
  try {
    const View4<const T> q = detail::require_tensor(queries, op, "queries", 0);
    const int rank = queries.rank();
    const View4<const T> k = detail::require_tensor(keys, op, "keys", rank);
    const View4<const T> v = detail::require_tensor(values, op, "values", rank);
    if (k.B != q.B || v.B != q.B || v.H != k.H || v.R != k.R)
      detail::fail(op, ": queries ", queries.shape_string(), ", keys ", keys.shape_string(), " and values ",
                   values.shape_string(), " must share B, keys and values their heads and rows");
    if (k.C != q.C)
      detail::fail(op, ": keys has shape ", keys.shape_string(), " but queries has last dimension ", q.C, "; they must match");
    if (k.H == 0 ? q.H != 0 : q.H % k.H != 0)
      detail::fail(op, ": queries has ", q.H, " heads and keys ", k.H, "; the query heads must be a multiple of the key heads");
    if (!mask.keep.empty() || !mask.additive.empty() || !mask.segment_ids_q.empty() || !mask.segment_ids_k.empty())
      detail::fail(op, ": keep masks, additive masks and segment ids are not supported across ranks yet");
    if (mask.fill != MaskedFill::exclude) detail::fail(op, ": MaskedFill::d2l_minus_1e6 is not supported across ranks");
    if (mask.query_start != 0 || mask.key_start != 0)
      detail::fail(op, ": Mask::query_start and key_start must be 0: the ranks' shards place the rows");
    if (mask.align && mask.causal != Causal::none && mask.alignment() != (mask.causal == Causal::bottom_right ? Align::bottom_right : Align::top_left))
      detail::fail(op, ": causal and align contradict each other; a causal mask is aligned as the queries are");
    if (!mask.sinks.empty()) {
      if (mask.sinks.rank() != 1 || mask.sinks.dim(0) != q.H)
        detail::fail(op, ": sinks has shape ", mask.sinks.shape_string(), "; it must be (H,) = (", q.H, ",)");
      for (index_t h = 0; h < q.H; ++h)
        if (!std::isfinite(mask.sinks.data()[h * mask.sinks.stride(0)]))
          detail::fail(op, ": sinks holds a non-finite logit for head ", h, "; every sink logit must be finite");
    }
    const TensorView<const std::int64_t>& lens = mask.valid_lens;
    const bool per_query = lens.rank() == 2;
    if (!lens.empty() && !((lens.rank() == 1 && lens.dim(0) == q.B) || (per_query && lens.dim(0) == q.B && lens.dim(1) == q.R)))
      detail::fail(op, ": valid_lens has shape ", lens.shape_string(), " but must be (", q.B,
                   ",), one key length of the whole sequence per batch element and the same on every rank, or (", q.B,
                   ", ", q.R, "), one per query row this rank holds");
    if (!(options.dropout.p >= 0 && options.dropout.p < 1))
      detail::fail(op, ": dropout p is ", options.dropout.p, "; it must lie in [0, 1)");
    if (options.scale && !std::isfinite(*options.scale)) detail::fail(op, ": scale is ", *options.scale, "; it must be finite");
    if (options.softcap && !detail::softcap_fits<T>(*options.softcap))  // before the ring, as every check here
      detail::fail(op, ": softcap is ", *options.softcap, "; it must be positive and finite in the computation's type, and "
                   "so must its inverse");
    // The slopes here, before any message between the ranks (the block kernels' own check would come
    // after the ring's first exchange was posted).
    if (const TensorView<const T>& a = mask.alibi_slopes; !a.empty()) {
      if (!((a.rank() == 1 && a.dim(0) == q.H) || (a.rank() == 2 && a.dim(0) == q.B && a.dim(1) == q.H)))
        detail::fail(op, ": alibi_slopes has shape ", a.shape_string(), "; it must be (H,) = (", q.H, ",) or (B, H) = (",
                     q.B, ",", q.H, ")");
      for (index_t b = 0; b < (a.rank() == 2 ? q.B : 1); ++b)
        for (index_t h = 0; h < q.H; ++h)
          if (const T x = a.data()[(a.rank() == 2 ? b * a.stride(0) : 0) + h * a.stride(a.rank() - 1)]; !std::isfinite(x))
            detail::fail(op, ": alibi_slopes holds ", x, " for batch ", b, ", head ", h, "; every slope must be finite");
    }
    local_check();
    const Dropout& drop = options.dropout;
    std::int64_t lowest = 0, longest = -1;  // of this rank's per-query lengths
    if (per_query)
      for (index_t b = 0; b < lens.dim(0); ++b)
        for (index_t i = 0; i < lens.dim(1); ++i) {
          const std::int64_t len = lens.data()[b * lens.stride(0) + i * lens.stride(1)];
          lowest = std::min(lowest, len), longest = std::max(longest, len);
        }
    const std::int64_t fields[24] = {static_cast<std::int64_t>(sizeof(T)), rank, q.B, q.H, k.H, q.C, v.C,
                                     static_cast<std::int64_t>(mask.causal) * 2 +
                                         static_cast<std::int64_t>(mask.alignment()),
                                     mask.window.has_value(),
                                     mask.window ? mask.window->left : 0, mask.window ? mask.window->right : 0,
                                     lens.empty() ? -1 : per_query ? -2 : lens.numel(), per_query ? 0 : hash_of(lens),
                                     mask.alibi_slopes.empty() ? -1 : mask.alibi_slopes.numel(),
                                     hash_of(mask.alibi_slopes) ^ (hash_of(mask.sinks) * 31 + !mask.sinks.empty()),
                                     static_cast<std::int64_t>(drop.seed), drop.row_start,
                                     drop.key_start, drop.head_start, drop.heads, q.R, k.R, lowest, longest};
    std::copy(std::begin(fields), std::end(fields), mine.field);
    mine.scale = options.scale ? *options.scale : std::nan("");
    mine.softcap = options.softcap ? *options.softcap : 0;
    mine.dropout = options.dropout.p;
  } catch (const Error& e) {
    std::strncpy(mine.error, e.what(), sizeof mine.error - 1);
  }
  std::strncpy(mine.function, op, sizeof mine.function - 1);
  mine.layout = static_cast<std::int64_t>(layout);
  std::vector<Descriptor> all(static_cast<std::size_t>(comm.size()));
  comm.check(MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, comm.get()), "MPI_Allgather");
  for (int r = 0; r < comm.size(); ++r)
    if (all[r].error[0] != '\0') throw Error(detail::cat(all[r].error, " (on rank ", r, " of ", comm.size(), ")"));
  const Descriptor& first = all[0];
  const auto layout_name = [](std::int64_t l) { return l == static_cast<std::int64_t>(ShardLayout::contiguous) ? "contiguous" : "zigzag"; };
  const auto scale_name = [](double x) { return std::isnan(x) ? std::string("the default 1/sqrt(d)") : detail::cat(x); };
  for (int r = 1; r < comm.size(); ++r) {
    if (std::strcmp(all[r].function, first.function) != 0)
      detail::fail(first.function, ": rank ", r, " calls ", all[r].function, " but rank 0 calls ", first.function,
                   "; every rank must make the same call (the same algorithm, forward or backward)");
    if (all[r].layout != first.layout)
      detail::fail(op, ": rank ", r, " passes the ", layout_name(all[r].layout), " layout but rank 0 passes ",
                   layout_name(first.layout), "; every rank must pass the same layout");
    for (int f = 0; f < kQueryRows; ++f)
      if (f == kLengthCount && all[r].field[f] != first.field[f] && (all[r].field[f] == -2 || first.field[f] == -2))
        detail::fail(op, ": rank ", r, " passes ", lengths_kind(all[r].field[f]), " but rank 0 passes ",
                     lengths_kind(first.field[f]), "; every rank must pass the same kind");
      else if (all[r].field[f] != first.field[f] && hashed(f))
        detail::fail(op, ": rank ", r, " passes ", kFieldNames[f], " other than rank 0's; every rank must pass the same values");
      else if (all[r].field[f] != first.field[f])
        detail::fail(op, ": rank ", r, " passes ", kFieldNames[f], " = ", shown(f, all[r].field[f]), " but rank 0 passes ",
                     shown(f, first.field[f]), "; every rank must pass the same shapes, dtypes, masks and options");
    const bool same_scale = std::isnan(all[r].scale) ? std::isnan(first.scale) : all[r].scale == first.scale;
    if (!same_scale || all[r].softcap != first.softcap || all[r].dropout != first.dropout)
      detail::fail(op, ": rank ", r, " passes scale ", scale_name(all[r].scale), ", softcap ", all[r].softcap, " and dropout ",
                   all[r].dropout, " but rank 0 ", scale_name(first.scale), ", ", first.softcap, " and ", first.dropout,
                   "; every rank must pass the same options");
  }
  Problem p;
  p.op = op, p.layout = layout, p.ranks = comm.size(), p.rank = comm.rank();
  p.tensor_rank = static_cast<int>(first.field[1]);
  p.B = first.field[2], p.H = first.field[3], p.Hk = first.field[4], p.d = first.field[5], p.dv = first.field[6];
  for (const Descriptor& one : all) {
    p.n_of.push_back(one.field[kQueryRows]), p.m_of.push_back(one.field[kKeyRows]);
    p.n += one.field[kQueryRows], p.m += one.field[kKeyRows];
  }
  for (int r = 0; r < comm.size(); ++r)
    for (const auto& [name, rows, total] : {std::tuple{"queries", p.n_of[r], p.n}, std::tuple{"keys", p.m_of[r], p.m}})
      if (rows != shard_length(total, comm.size(), r, layout))
        detail::fail(op, ": rank ", r, " holds ", rows, " rows of ", name, " but the ", layout_name(first.layout), " layout gives rank ",
                     r, " of ", comm.size(), " ", shard_length(total, comm.size(), r, layout), " of the ", total,
                     " rows (shard_rows in attn/distributed.hpp)");
  p.causal = mask.causal;
  p.align = mask.alignment();
  p.window = mask.window;
  if (mask.valid_lens.rank() == 2) {  // per-query lengths: every rank checks every rank's, so all raise alike
    for (int r = 0; r < comm.size(); ++r) {
      const std::int64_t lowest = all[r].field[kLowestLength], longest = all[r].field[kLongestLength];
      if (lowest < 0 || longest > p.m)
        detail::fail(op, ": rank ", r, " passes a valid length of ", lowest < 0 ? lowest : longest,
                     "; each must lie in [0, ", p.m, "], the keys of the whole sequence");
      p.longest_valid = std::max<std::int64_t>(p.longest_valid, longest);
    }
  } else if (!mask.valid_lens.empty()) {
    for (index_t b = 0; b < p.B; ++b) {
      const std::int64_t len = mask.valid_lens.data()[b * mask.valid_lens.stride(0)];
      if (len < 0 || len > p.m)
        detail::fail(op, ": valid_lens[", b, "] is ", len, "; it must lie in [0, ", p.m, "], the keys of the whole sequence");
      p.longest_valid = std::max<std::int64_t>(p.longest_valid, len);
    }
  }
  return p;
}

template <class T>
Mask<T> block_mask(const Problem& p, const Mask<T>& mask, const Piece& q, const Piece& k,
                   std::vector<std::int64_t>& lens_block) {
  Mask<T> block;
  block.causal = p.causal == Causal::none ? Causal::none : Causal::top_left;
  block.window = p.window;
  block.alibi_slopes = mask.alibi_slopes;
  // Only the difference of the starts matters (p(i) - j); both are moved to be non-negative.
  index_t query_start = q.begin + (p.align == Align::bottom_right ? p.m - p.n : 0), key_start = k.begin;
  const index_t low = std::min(query_start, key_start);
  if (low < 0) query_start -= low, key_start -= low;
  block.query_start = query_start, block.key_start = key_start;
  const TensorView<const std::int64_t>& lens = mask.valid_lens;
  if (lens.rank() == 1) {
    lens_block.resize(static_cast<std::size_t>(p.B));
    for (index_t b = 0; b < p.B; ++b)
      lens_block[b] = std::clamp<std::int64_t>(lens.data()[b * lens.stride(0)] - k.begin, 0, k.size());
    block.valid_lens = TensorView<const std::int64_t>(lens_block.data(), {p.B});
  } else if (lens.rank() == 2) {  // this rank's rows of (B, n): the piece's from row q.local
    lens_block.resize(static_cast<std::size_t>(p.B * q.size()));
    for (index_t b = 0; b < p.B; ++b)
      for (index_t i = 0; i < q.size(); ++i)
        lens_block[b * q.size() + i] = std::clamp<std::int64_t>(
            lens.data()[b * lens.stride(0) + (q.local + i) * lens.stride(1)] - k.begin, 0, k.size());
    block.valid_lens = TensorView<const std::int64_t>(lens_block.data(), {p.B, q.size()});
  }
  return block;
}

SdpaOptions block_options(const SdpaOptions& options, const Piece& q, const Piece& k, index_t head_start, index_t heads) {
  SdpaOptions block = options;
  Dropout& d = block.dropout;
  d.row_start += q.begin, d.key_start += k.begin;
  if (heads != 0) d.head_start += head_start, d.heads = d.heads != 0 ? d.heads : heads;
  return block;
}

#define ATTN_INSTANTIATE(T)                                                                                         \
  template Problem agree<T>(const Comm&, const char*, ShardLayout, const TensorView<const T>&,                       \
                            const TensorView<const T>&, const TensorView<const T>&, const Mask<T>&, const SdpaOptions&, \
                            const std::function<void()>&);                                                          \
  template Mask<T> block_mask<T>(const Problem&, const Mask<T>&, const Piece&, const Piece&, std::vector<std::int64_t>&);
ATTN_INSTANTIATE(float)
ATTN_INSTANTIATE(double)
#undef ATTN_INSTANTIATE

}  // namespace distributed
}  // namespace attn

namespace attn::distributed {

namespace {

std::vector<index_t> lse_dims(int rank, index_t B, index_t H, index_t R) {
  if (rank == 4) return {B, H, R};
  return {B, R};
}

}  // namespace

template <class T>
void check_forward_outputs(const char* op, const TensorView<T>& out, const TensorView<T>& lse,
                           const TensorView<const T>& queries, const TensorView<const T>& values) {
  const View4<const T> q = detail::to_view4(queries, op, "queries"), v = detail::to_view4(values, op, "values");
  const int rank = queries.rank();
  detail::require_tensor(out, op, "out", rank);
  detail::require_shape(out, detail::caller_dims(rank, q.B, q.H, q.R, v.C), op, "out",
                        "a row of values' size per query of this rank");
  if (!lse.empty()) {
    detail::require_shape(lse, lse_dims(rank, q.B, q.H, q.R), op, "lse", "one entry per query of this rank");
    detail::to_view4(lse, op, "lse", 2, 3, true);
  }
}

template <class T>
void check_backward_arguments(const char* op, const TensorView<T>& dqueries, const TensorView<T>& dkeys,
                              const TensorView<T>& dvalues, const TensorView<const T>& dout,
                              const TensorView<const T>& queries, const TensorView<const T>& keys,
                              const TensorView<const T>& values, const TensorView<const T>& out,
                              const TensorView<const T>& lse) {
  const View4<const T> q = detail::to_view4(queries, op, "queries"), v = detail::to_view4(values, op, "values");
  const int rank = queries.rank();
  const auto out_dims = detail::caller_dims(rank, q.B, q.H, q.R, v.C);
  for (const auto& [name, t] : {std::pair{"dout", dout}, std::pair{"out", out}}) {
    detail::require_tensor(t, op, name, rank);
    detail::require_shape(t, out_dims, op, name, "the forward's out of this rank's queries");
  }
  if (lse.empty()) detail::fail(op, ": lse is required: the forward's log-sum-exp of this rank's queries");
  detail::require_shape(lse, lse_dims(rank, q.B, q.H, q.R), op, "lse", "one entry per query of this rank");
  detail::to_view4(lse, op, "lse", 2, 3, true);
  for (const auto& [name, grad, input] : {std::tuple{"dqueries", dqueries, queries}, std::tuple{"dkeys", dkeys, keys},
                                          std::tuple{"dvalues", dvalues, values}})
    if (!grad.empty()) {
      detail::require_tensor(grad, op, name, rank);
      detail::require_shape(grad, {input.shape().begin(), input.shape().end()}, op, name, "the shape of its input");
    }
}

#define ATTN_INSTANTIATE(T)                                                                                            \
  template void check_forward_outputs<T>(const char*, const TensorView<T>&, const TensorView<T>&,                      \
                                         const TensorView<const T>&, const TensorView<const T>&);                     \
  template void check_backward_arguments<T>(const char*, const TensorView<T>&, const TensorView<T>&,                   \
                                            const TensorView<T>&, const TensorView<const T>&, const TensorView<const T>&, \
                                            const TensorView<const T>&, const TensorView<const T>&,                   \
                                            const TensorView<const T>&, const TensorView<const T>&);
ATTN_INSTANTIATE(float)
ATTN_INSTANTIATE(double)
#undef ATTN_INSTANTIATE

}  // namespace attn::distributed
