// attn.KVCache: the C++ KvCache (attn/kv_cache.hpp) for decoders written in NumPy. Keys, values and
// queries are float32 (float16 arrays are widened, and float16 queries get float16 out, as every
// float16 call does; float64 is refused: the cache computes in float32).
#include <mutex>
#include <optional>
#include <string>
#include <tuple>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "attn/kv_cache.hpp"
#include "bindings.hpp"
#include "call.hpp"

namespace attn_py {
namespace {

attn::KvDtype kv_dtype(Call& call, py::handle obj) {
  const std::string name = call.text(obj, "dtype");
  if (name == "float32") return attn::KvDtype::float32;
  if (name == "bfloat16") return attn::KvDtype::bfloat16;
  if (name == "float16") return attn::KvDtype::float16;
  if (name == "int8") return attn::KvDtype::int8;
  if (name == "float8_e4m3") return attn::KvDtype::float8_e4m3;
  if (name == "float8_e5m2") return attn::KvDtype::float8_e5m2;
  if (name == "int4") return attn::KvDtype::int4;
  if (name == "int4_kivi") return attn::KvDtype::int4_kivi;
  call.value_error("dtype is '" + name + "'; it must be 'float32', 'bfloat16', 'float16', 'int8', 'float8_e4m3', "
                   "'float8_e5m2', 'int4' or 'int4_kivi'");
}

const char* kv_dtype_name(attn::KvDtype t) {
  switch (t) {
    case attn::KvDtype::float32: return "float32";
    case attn::KvDtype::bfloat16: return "bfloat16";
    case attn::KvDtype::float16: return "float16";
    case attn::KvDtype::int8: return "int8";
    case attn::KvDtype::float8_e4m3: return "float8_e4m3";
    case attn::KvDtype::float8_e5m2: return "float8_e5m2";
    case attn::KvDtype::int4: return "int4";
    case attn::KvDtype::int4_kivi: return "int4_kivi";
  }
  return "?";
}

// Whether obj is a torch tensor; and its values as a NumPy array (detached, contiguous; bfloat16,
// which NumPy lacks, as float32; a tensor off the CPU refused), anything else as given.
bool is_torch(py::handle obj) {
  const std::string module = py::str(py::type::handle_of(obj).attr("__module__"));
  return module.rfind("torch", 0) == 0 && py::hasattr(obj, "numpy");
}
py::object numpy_of_torch(Call& call, py::handle obj, const char* name) {
  if (!is_torch(obj)) return py::reinterpret_borrow<py::object>(obj);
  py::object t = obj.attr("detach")();
  const std::string device = py::str(t.attr("device").attr("type"));
  if (device != "cpu") call.type_error(std::string(name) + " is a torch tensor on " + device + "; the cache takes CPU tensors");
  if (std::string(py::str(t.attr("dtype"))) == "torch.bfloat16") t = t.attr("float")();
  return t.attr("contiguous")().attr("numpy")();
}

// A float32 array of the caller's (float16 widened; anything but float16 and float32 refused).
// torch CPU tensors are taken as their NumPy arrays (numpy_of_torch).
py::array float32_array(Call& call, py::handle given_obj, const char* name) {
  const py::object converted = numpy_of_torch(call, given_obj, name);
  const py::handle obj = converted;
  const std::string takes = "; the cache stores and computes in float32 and takes float32 or float16 arrays (convert "
                            "it with .astype(numpy.float32))";
  if (py::isinstance<py::array>(obj)) {  // named by its own dtype, not by Call's float16-to-float64 rule
    const auto given = py::reinterpret_borrow<py::array>(obj);
    if (given.dtype().kind() != 'f' || (given.itemsize() != 2 && given.itemsize() != 4))
      call.type_error(std::string(name) + " has dtype " + std::string(py::str(given.dtype())) + takes);
  }
  call.allow_float16();
  const py::array a = call.floating(obj, name);
  if (call.dtype() == DType::f64)  // a list or other sequence of Python floats
    call.type_error(std::string(name) + " is not an array and NumPy reads it as float64" + takes);
  return widened(call, a);
}

// out as a torch tensor of `dtype` (attend's result for torch queries).
py::object torch_out(const py::array& out, const py::object& dtype) {
  return py::module_::import("torch").attr("from_numpy")(out).attr("to")(dtype);
}

// causal as attend takes it: "bottom_right" or True (default), False or None, "top_left" (which the
// cache refuses, naming it); a bool, NumPy's among them, as scaled_dot_product_attention takes it.
attn::Causal causal_from(Call& call, py::handle causal) {
  const bool flag = py::isinstance<py::bool_>(causal) || py::isinstance(causal, py::module_::import("numpy").attr("bool_"));
  if (causal.is_none() || (flag && PyObject_IsTrue(causal.ptr()) == 0)) return attn::Causal::none;
  if (flag || call.text(causal, "causal") == "bottom_right") return attn::Causal::bottom_right;
  if (call.text(causal, "causal") == "top_left") return attn::Causal::top_left;
  call.value_error("causal is '" + call.text(causal, "causal") + "'; it must be 'bottom_right' (the default), 'top_left', True or False");
}

// The scores' options of attend and attend_batch into `options`; the arrays their views read.
struct ScoreArrays {
  py::array slopes = no_array(), sinks = no_array();
};
ScoreArrays read_scores(Call& call, attn::KvAttendOptions& options, py::handle alibi_slopes, py::handle softcap,
                        py::handle scale, py::handle sinks) {
  ScoreArrays kept;
  // Numbers as float32, others named (found by probing: ['a'] raised NumPy's bare ValueError).
  if (!alibi_slopes.is_none()) kept.slopes = call.same_dtype(alibi_slopes, "alibi_slopes"), options.alibi_slopes = cview<float>(kept.slopes);
  if (!sinks.is_none()) kept.sinks = call.same_dtype(sinks, "sinks"), options.sinks = cview<float>(kept.sinks);
  if (!softcap.is_none()) options.softcap = call.number(softcap, "softcap");
  if (!scale.is_none()) options.scale = call.number(scale, "scale");
  return kept;
}

// An array of integers (any integer dtype, or a list) as int32, each in int32's range.
py::array int32_array(Call& call, py::handle obj, const char* name) {
  const py::module_ np = py::module_::import("numpy");
  const py::array a = np.attr("asarray")(obj);
  if (!holds_integers(obj, a))
    call.type_error(std::string(name) + " has dtype " + std::string(py::str(a.dtype())) + "; it must hold integers");
  // Compared as Python integers: a uint64 entry past int64's range is named, not a failed cast.
  if (a.size() > 0) {
    const py::object lowest = np.attr("min")(a).attr("item")(), highest = np.attr("max")(a).attr("item")();
    if (PyObject_RichCompareBool(lowest.ptr(), py::int_(INT32_MIN).ptr(), Py_LT) == 1 ||
        PyObject_RichCompareBool(highest.ptr(), py::int_(INT32_MAX).ptr(), Py_GT) == 1)
      call.value_error(std::string(name) + " has an entry outside int32's range");
  }
  // In its own shape: ascontiguousarray makes a 0-d array 1-d (found by probing: commit_tree(seq, 3)
  // kept draft 3 where its rank check should have refused a number).
  return np.attr("ascontiguousarray")(a, py::arg("dtype") = "int32").attr("reshape")(a.attr("shape"));
}

// A float8 cache's scale: a number (every head), or one per key head (a list or 1-D array).
std::vector<float> scales(Call& call, py::handle obj, const char* name) {
  if (py::isinstance<py::float_>(obj) || py::isinstance<py::int_>(obj)) return {static_cast<float>(call.number(obj, name))};
  const py::array a = py::module_::import("numpy").attr("asarray")(obj);
  if (a.dtype().kind() != 'f' && a.dtype().kind() != 'i' && a.dtype().kind() != 'u')
    call.type_error(std::string(name) + " has dtype " + std::string(py::str(a.dtype())) + "; it must be a number or one per key head");
  if (a.ndim() > 1) call.value_error(std::string(name) + " has " + std::to_string(a.ndim()) + " dimensions; it must be a number or one per key head");
  const py::array f = py::module_::import("numpy").attr("ascontiguousarray")(a, py::arg("dtype") = "float32").attr("reshape")(-1);
  const auto v = cview<float>(f);
  return std::vector<float>(v.data(), v.data() + v.dim(0));
}

// attend's result as the queries were given: float16 out for float16 queries, a torch tensor of their
// dtype for torch ones, else float32.
py::object as_queries(Call& call, const py::array_t<float>& out, py::handle queries) {
  if (is_torch(queries)) return torch_out(out, queries.attr("dtype"));
  if (call.dtype() == DType::f16) return to_float16(out);
  return out;
}

class KVCache {
 public:
  KVCache(py::object batch, py::object kv_heads, py::object head_dim, py::object dtype, py::object block_size,
          py::object capacity, bool grow, py::object rotary_cos, py::object rotary_sin, bool rotary_interleaved,
          py::object k_scale, py::object v_scale) {
    Call call("KVCache", {});
    attn::KvCacheOptions options;
    options.dtype = kv_dtype(call, dtype);
    options.block_size = call.integer(block_size, "block_size");
    options.capacity = call.integer(capacity, "capacity");
    options.grow = grow;
    options.k_scale = scales(call, k_scale, "k_scale"), options.v_scale = scales(call, v_scale, "v_scale");
    const index_t b = call.integer(batch, "batch"), h = call.integer(kv_heads, "kv_heads"), d = call.integer(head_dim, "head_dim");
    // Rotary tables as float32 copies the cache keeps (its C++ options hold views of them): changing
    // the caller's arrays afterwards changes nothing.
    if (!rotary_cos.is_none() || !rotary_sin.is_none()) {
      if (rotary_cos.is_none() || rotary_sin.is_none()) call.value_error("rotary_cos and rotary_sin must be given together");
      for (auto [obj, kept, name] : {std::tuple{&rotary_cos, &cos_, "rotary_cos"}, std::tuple{&rotary_sin, &sin_, "rotary_sin"}}) {
        const py::array a = py::module_::import("numpy").attr("asarray")(*obj);
        if (a.dtype().kind() != 'f') call.type_error(std::string(name) + " has dtype " + std::string(py::str(a.dtype())) + "; it must hold floats");
        *kept = py::module_::import("numpy").attr("array")(a, py::arg("dtype") = "float32", py::arg("order") = "C",
                                                           py::arg("copy") = true);
      }
      options.rotary.cos = cview<float>(cos_), options.rotary.sin = cview<float>(sin_);
      options.rotary.interleaved = rotary_interleaved;
    }
    call.run([&] { cache_ = std::make_unique<attn::KvCache>(b, h, d, options); });
  }

  void append(py::object keys_obj, py::object values_obj, py::object seq) {
    Call call("KVCache.append", {});
    const py::array k = float32_array(call, keys_obj, "keys");
    const py::array v = float32_array(call, values_obj, "values");
    const auto kv = cview<float>(k), vv = cview<float>(v);
    if (seq.is_none()) {
      locked(call, [&] { cache_->append(kv, vv); });
    } else {
      const index_t s = call.integer(seq, "seq");
      locked(call, [&] { cache_->append(s, kv, vv); });
    }
  }

  py::object attend(py::object queries_obj, py::object seq, py::object causal, py::object window, py::object alibi_slopes,
                   py::object softcap, py::object scale, py::object sinks, py::object tree_parents) {
    Call call("KVCache.attend", {{"alibi_slopes", "alibi_slopes"}, {"softcap", "softcap"},
                                 {"scale", "scale"}});
    const py::array q = float32_array(call, queries_obj, "queries");
    const py::array parents = tree_parents.is_none() ? no_array() : call.integers(tree_parents, "tree_parents", "[-1, t)");
    if (parents && seq.is_none()) call.value_error("tree_parents is given without seq; a draft tree belongs to one sequence");
    // torch queries: a torch tensor of their dtype out.
    attn::KvAttendOptions options;
    options.causal = causal_from(call, causal);
    options.window = window_from(call, window);
    if (parents) options.tree_parents = cview<std::int64_t>(parents);
    const ScoreArrays kept = read_scores(call, options, alibi_slopes, softcap, scale, sinks);
    py::array_t<float> out = call.new_array<float>(dims(q));
    const auto o = view_of<float>(out);
    const auto qv = cview<float>(q);
    if (seq.is_none()) {
      locked(call, [&] { cache_->attend(o, qv, options); });
    } else {
      const index_t s = call.integer(seq, "seq");
      locked(call, [&] { cache_->attend(o, s, qv, options); });
    }
    return as_queries(call, out, queries_obj);
  }

  py::object attend_batch(py::object queries_obj, py::object cu_seqlens_q, py::object seqs, py::object causal, py::object window,
                          py::object alibi_slopes, py::object softcap, py::object scale, py::object sinks,
                          py::object tree_parents) {
    Call call("KVCache.attend_batch", {{"alibi_slopes", "alibi_slopes"}, {"softcap", "softcap"}, {"scale", "scale"}});
    const py::array q = float32_array(call, queries_obj, "queries");
    const py::array cu = int32_array(call, cu_seqlens_q, "cu_seqlens_q");
    const py::array which = seqs.is_none() ? no_array() : int32_array(call, seqs, "seqs");
    attn::KvAttendOptions options;
    options.causal = causal_from(call, causal);
    options.window = window_from(call, window);
    const ScoreArrays kept = read_scores(call, options, alibi_slopes, softcap, scale, sinks);
    const py::array parents = tree_parents.is_none() ? no_array() : call.integers(tree_parents, "tree_parents", "[-1, t)");
    if (parents) options.tree_parents = cview<std::int64_t>(parents);
    py::array_t<float> out = call.new_array<float>(dims(q));
    const auto o = view_of<float>(out);
    const auto qv = cview<float>(q);
    const auto cuv = cview<std::int32_t>(cu);
    const auto seqv = which ? cview<std::int32_t>(which) : attn::TensorView<const std::int32_t>();
    locked(call, [&] { cache_->attend_batch(o, qv, cuv, seqv, options); });
    return as_queries(call, out, queries_obj);
  }

  void commit_tree(py::object seq, py::object accepted) {
    Call call("KVCache.commit_tree", {});
    const index_t s = call.integer(seq, "seq");
    // An empty list (no draft accepted) reads as float64 in NumPy: taken as no integers.
    const py::array given = py::module_::import("numpy").attr("asarray")(accepted);
    std::vector<index_t> drafts;
    if (given.size() > 0 || given.ndim() != 1) {
      const py::array a = int32_array(call, given, "accepted");
      const auto v = cview<std::int32_t>(a);
      if (v.rank() != 1) call.value_error("accepted has " + std::to_string(v.rank()) + " dimensions; it must be a list of draft indices");
      drafts.assign(v.data(), v.data() + v.dim(0));
    }
    locked(call, [&] { cache_->commit_tree(s, drafts); });
  }

  void reset(py::object seq) {
    Call call("KVCache.reset", {});
    const index_t s = call.integer(seq, "seq");
    locked(call, [&] { cache_->reset(s); });
  }
  void truncate(py::object seq, py::object length) {
    Call call("KVCache.truncate", {});
    const index_t s = call.integer(seq, "seq"), n = call.integer(length, "length");
    locked(call, [&] { cache_->truncate(s, n); });
  }
  index_t length(py::object seq) {
    Call call("KVCache.length", {});
    const index_t s = call.integer(seq, "seq");
    index_t n = 0;
    locked(call, [&] { n = cache_->length(s); });
    return n;
  }
  // The stored keys or values of a sequence, as float32 (kv_heads, length, head_dim).
  py::array stored(py::object seq, bool values) {
    Call call(values ? "KVCache.values" : "KVCache.keys", {});
    const index_t s = call.integer(seq, "seq");
    attn::Tensor<float> t;
    locked(call, [&] { t = values ? cache_->values(s) : cache_->keys(s); });
    py::array_t<float> out = call.new_array<float>(t.shape());
    std::copy(t.data(), t.data() + t.numel(), out.mutable_data());
    return out;
  }
  const attn::KvCache& cache() const { return *cache_; }
  std::size_t bytes() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return cache_->bytes();
  }

 private:
  // body (a call of cache_) with the GIL released and the cache's lock held: the calls of one cache
  // from several Python threads run one at a time (an append while another thread attends would
  // otherwise move blocks under it). The lock is taken after the GIL is released, and released
  // before it is taken back, so a thread waiting for it never holds the GIL.
  template <class F>
  void locked(Call& call, F&& body) {
    call.run([&] {
      const std::lock_guard<std::mutex> lock(mutex_);
      body();
    });
  }

  std::unique_ptr<attn::KvCache> cache_;
  mutable std::mutex mutex_;
  py::array cos_ = no_array(), sin_ = no_array();  // the rotary tables cache_ reads, or null
};

}  // namespace

void bind_kv_cache(py::module_& m) {
  using py::arg;
  py::class_<KVCache>(m, "KVCache", R"(A KV cache for decoding (attn::KvCache): keys and values of `batch` sequences in
blocks of block_size tokens (a block table per sequence), so sequences of different lengths grow
without copying.

KVCache(batch, kv_heads, head_dim, *, dtype="float32", block_size=256, capacity=0, grow=True,
        rotary_cos=None, rotary_sin=None, rotary_interleaved=False, k_scale=1.0, v_scale=1.0)
rotary_cos, rotary_sin: (max_pos, rotary_dim / 2) tables (kept as float32 by the cache): append stores
  keys rotated at their positions and attend rotates the queries at theirs (query i of n at
  length - n + i), as attn.apply_rotary would (interleaved: rotary_interleaved).
dtype: "float32", "bfloat16", "float16" (rounded to nearest even) or "int8" (one float32 scale per
  32 values, ggml's q8_0: within max|x|/254 of the value appended, plus at most 2^-143 where
  max|x| < 1.5e-36 and the scale is subnormal; head_dim a multiple of 32; attend rounds each query
  row to 16-bit integers times max|q|/32767 for its products with the int8 keys, moving a score by at
  most max|q|/65534 * sum|k| up to float32's rounding, as kv_cache.hpp states), "float8_e4m3" or
  "float8_e5m2" (8-bit floats as torch.float8_e4m3fn and torch.float8_e5m2: x / k_scale or x / v_scale
  rounded to nearest even, within 2^-4 or 2^-3 relatively, or scale 2^-10 or scale 2^-17 for the
  smallest; a value over its scale beyond 448 or 57344 raises ValueError), "int4" (ggml's q4_1: each 32
  values of a row as 4-bit codes with a float32 scale s = (max - min) / 15 and min, within s / 2 of
  the value appended; head_dim a multiple of 32) or "int4_kivi" (KIVI: keys per channel in groups of
  32 tokens, values per token as int4; a sequence's newest length % 32 tokens kept in bfloat16 until
  their group fills; block_size a multiple of 32). 4-bit caches refuse values beyond 2^126 in
  magnitude (ValueError).
k_scale, v_scale: float8 caches' scales (vLLM's): a number for every head, or one per key head; the
  keys' scale multiplies the queries of its heads, the values' the output. At most FLT_MAX / 448
  (e4m3) or FLT_MAX / 57344 (e5m2), so that the largest value is a float32.
A cache's calls from several Python threads run one at a time (each holds the cache's lock, with the
GIL released).
capacity: tokens per sequence allocated up front (0: as sequences grow); with grow=False an append
  past them raises ValueError (capacity=0 with grow=False is refused). An append to every sequence
  stores nothing if any sequence's tokens are refused.
Arrays are float32 (float16 is widened, and float16 queries get float16 out; float64 raises TypeError).
torch CPU tensors are taken as well (float32, float16, bfloat16 read as float32); attend returns a
torch tensor of the queries' dtype for torch queries.)")
      .def(py::init<py::object, py::object, py::object, py::object, py::object, py::object, bool, py::object, py::object,
                    bool, py::object, py::object>(),
           arg("batch"),
           arg("kv_heads"), arg("head_dim"), py::kw_only(), arg("dtype") = "float32", arg("block_size") = 256,
           arg("capacity") = 0, arg("grow") = true, arg("rotary_cos") = py::none(), arg("rotary_sin") = py::none(),
           arg("rotary_interleaved") = false, arg("k_scale") = 1.0, arg("v_scale") = 1.0, "An empty cache of `batch` sequences (see the class).")
      .def("append", &KVCache::append, arg("keys"), arg("values"), arg("seq") = py::none(),
           R"(Appends keys and values (kv_heads, t, head_dim) to sequence seq, or (batch, kv_heads, t, head_dim) to every
sequence when seq is None.)")
      .def("attend", &KVCache::attend, arg("queries"), arg("seq") = py::none(), py::kw_only(), arg("causal") = "bottom_right",
           arg("window") = py::none(), arg("alibi_slopes") = py::none(), arg("softcap") = py::none(), arg("scale") = py::none(),
           arg("sinks") = py::none(), arg("tree_parents") = py::none(),
           R"(Attention of new queries over the cache: queries (heads, n, head_dim) or (1, heads, n, head_dim) for
sequence seq, or (batch, heads, n, head_dim) for every sequence when seq is None (each over its own
length). heads a multiple of kv_heads (grouped-query attention). Returns an array shaped like queries,
of their dtype (float32 or float16).
The queries are the sequence's newest n tokens: query i sits at position length - n + i, with or
without a causal mask, for the causal rule, the window and ALiBi (the bottom-right alignment, as
flash_attn_with_kvcache places them). n may pass the length, as there: a query at a negative
position sees no key under the causal rule or a window, and its row is 0 (attend_batch refuses it).
causal: "bottom_right" or True (default: query i sees the keys up to its position), or False (every
  key; a window still ends at the query's position); "top_left" is refused.
window, softcap, scale, sinks: as scaled_dot_product_attention. alibi_slopes: (heads,), or (batch,
  heads) when seq is None (row b for sequence b).
tree_parents: (t,) integers, with seq: the sequence's last t tokens are draft tokens of a tree
  (speculative decoding), tree_parents[i] = -1 for a child of the last accepted token, else the index
  (< i) of its parent among the drafts; the queries are the t drafts, and draft i attends every
  accepted token, its ancestors and itself (a window and ALiBi measure positions by depth in the
  tree). commit_tree then keeps the accepted path.)")
      .def("attend_batch", &KVCache::attend_batch, arg("queries"), arg("cu_seqlens_q"), arg("seqs") = py::none(), py::kw_only(),
           arg("causal") = "bottom_right", arg("window") = py::none(), arg("alibi_slopes") = py::none(),
           arg("softcap") = py::none(), arg("scale") = py::none(), arg("sinks") = py::none(),
           arg("tree_parents") = py::none(),
           R"(Attention of a mixed batch (decodes and prompt chunks) over the cache in one call: queries
(total_q, heads, head_dim) packed as FlashAttention's varlen layout; cu_seqlens_q (B + 1,) integers
from 0, non-decreasing, ending at total_q; entry b's rows cu_seqlens_q[b]:cu_seqlens_q[b+1] are the
newest tokens (appended already) of sequence seqs[b] (default b; distinct sequences), aligned
bottom-right in it as attend aligns them. alibi_slopes (heads,) or (B, heads), row b for entry b;
the other options as attend. Entries of up to four queries (no window, no ALiBi) run as one decode
call per query count over the blocks in place. Returns (total_q, heads, head_dim), of the queries'
dtype.
tree_parents: (total_q,) integers: every entry is its sequence's draft tree, its parents at its rows
  in the entry's own indices (-1 for a child of the last accepted token; a decode is [-1], a prompt
  chunk the chain [-1, 0, 1, ...]), as attend(queries, seq, tree_parents=...) takes one; then
  commit_tree(seq, accepted) for each (an entry of no rows is a tree of no drafts: commit_tree(seq,
  []) keeps its sequence as it is).)")
      .def("commit_tree", &KVCache::commit_tree, arg("seq"), arg("accepted"),
           R"(After attend with tree_parents: keeps sequence seq's accepted tokens followed by the drafts listed in
accepted (a path from a root: accepted[0]'s parent is -1, each next one the child of the one before),
dropping the other drafts; only draft rows move.)")
      .def("reset", &KVCache::reset, arg("seq"), "Empties sequence seq (its blocks are reused).")
      .def("truncate", &KVCache::truncate, arg("seq"), arg("length"), "Cuts sequence seq to its first `length` tokens.")
      .def("length", &KVCache::length, arg("seq"), "Tokens sequence seq holds.")
      .def("keys", [](KVCache& c, py::object seq) { return c.stored(seq, false); }, arg("seq"),
           "Sequence seq's keys as stored, widened to float32: (kv_heads, length, head_dim).")
      .def("values", [](KVCache& c, py::object seq) { return c.stored(seq, true); }, arg("seq"),
           "Sequence seq's values as stored, widened to float32.")
      .def_property_readonly("batch", [](const KVCache& c) { return c.cache().batch(); },
                             "Sequences the cache holds.")
      .def_property_readonly("kv_heads", [](const KVCache& c) { return c.cache().kv_heads(); },
                             "Key and value heads per token.")
      .def_property_readonly("head_dim", [](const KVCache& c) { return c.cache().head_dim(); },
                             "Width of a key or value row.")
      .def_property_readonly("block_size", [](const KVCache& c) { return c.cache().block_size(); },
                             "Tokens per block of storage.")
      .def_property_readonly("dtype", [](const KVCache& c) { return kv_dtype_name(c.cache().dtype()); },
                             "How keys and values are stored: \"float32\", \"float16\", \"bfloat16\", \"int8\", "
                             "\"float8_e4m3\", \"float8_e5m2\", \"int4\" or \"int4_kivi\".")
      .def_property_readonly("nbytes", [](const KVCache& c) { return c.bytes(); },
                             "Bytes of the blocks allocated (keys, values, and the int8 and int4 scales and minima).");
}

}  // namespace attn_py
