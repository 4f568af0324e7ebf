// Memory: the cpu kernels' scratch (cpu/scratch.hpp) and the API's refusal of outputs that share
// memory (api/checks.hpp, require_no_aliasing).
//   - Scratch frames nest: a callee's frame lies above its caller's, an arena that grew is merged
//     back into one chunk, and a repeated call allocates nothing.
//   - No result depends on what scratch memory held before: every op whose kernels take scratch,
//     with the memory of every frame filled with 0x00, 0xFF (NaN) and 0x7F (huge) bytes, gives
//     bit-identical results, the SDPA backward that runs the forward inside its own call included.
//   - Tensors and working buffers start on a cache line; those of 32 MiB and more on a 2 MiB page,
//     advised into huge pages (attn/memory.hpp).
//   - Outputs that broadcast, overlap themselves through their strides, or share any element with an
//     input or another output are refused with the names of both; interleaved slices of one buffer
//     that share no element are accepted; tensors without elements never conflict.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "attn/additive.hpp"
#include "attn/bmm.hpp"
#include "attn/half.hpp"
#include "attn/nadaraya_watson.hpp"
#include "attn/sdpa.hpp"
#include "attn/softmax.hpp"
#include "core/buffer.hpp"
#include "cpu/scratch.hpp"
#include "support/testing.hpp"

namespace attn {
namespace {

using cpu::Carve;
using cpu::ScratchFrame;
using testing::expect_error;
using testing::random_tensor;

// ---- scratch frames -----------------------------------------------------------------------------

TEST(ScratchFrame, NestedFramesNeverShareMemory) {
  ScratchFrame::release();
  ScratchFrame outer(1000);
  auto* a = static_cast<unsigned char*>(outer.data());
  std::memset(a, 0xAB, 1000);
  {
    // Bigger than anything the arena holds: it must grow without moving the outer frame.
    ScratchFrame inner(1 << 20);
    auto* b = static_cast<unsigned char*>(inner.data());
    EXPECT_TRUE(b + (1 << 20) <= a || a + 1000 <= b) << "the inner frame overlaps the outer one";
    std::memset(b, 0xCD, 1 << 20);
    {
      ScratchFrame innermost(64);
      auto* c = static_cast<unsigned char*>(innermost.data());
      EXPECT_TRUE(c + 64 <= b || b + (1 << 20) <= c) << "the innermost frame overlaps the inner one";
      EXPECT_TRUE(c + 64 <= a || a + 1000 <= c) << "the innermost frame overlaps the outer one";
    }
  }
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(a[i], 0xAB) << "byte " << i << " of the outer frame changed";
}

TEST(ScratchFrame, FramesAreAlignedAndStackedOneAfterAnother) {
  ScratchFrame::release();
  auto frames = [] {
    ScratchFrame f(100);
    ScratchFrame g(3);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(f.data()) % Carve::kAlign, 0u);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(g.data()) % Carve::kAlign, 0u);
    return std::pair{f.data(), g.data()};
  };
  frames();  // the first round grows the arena and merges it into one chunk
  const auto [f, g] = frames();
  EXPECT_EQ(static_cast<char*>(g), static_cast<char*>(f) + 2 * Carve::kAlign);  // 100 bytes take 128
  const auto [f2, g2] = frames();
  EXPECT_EQ(f2, f) << "a frame that ended is not reused";
  EXPECT_EQ(g2, g);
}

// A Tensor's elements and the kernels' working buffers start on a cache line, whatever their type
// and size, after a copy too: the decode's 512-bit loads of a row never straddle two lines.
template <class T>
void expect_tensors_on_a_cache_line() {
  for (const index_t n : {1, 3, 17, 1000, 1 << 20}) {
    const Tensor<T> t({n});
    const Tensor<T> copy = t;
    for (const T* p : {t.data(), copy.data()})
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % detail::kCacheLineBytes, 0u)
          << n << " elements of " << sizeof(T) << " bytes";
  }
}
TEST(CacheLineMemory, TensorsAndWorkingBuffersStartOnOne) {
  expect_tensors_on_a_cache_line<float>();
  expect_tensors_on_a_cache_line<double>();
  expect_tensors_on_a_cache_line<bfloat16>();
  expect_tensors_on_a_cache_line<std::int8_t>();
  expect_tensors_on_a_cache_line<bool>();
  for (const std::size_t n : {1, 100, 65536}) {
    detail::Buffer<std::uint8_t> bytes(n);
    detail::Buffer<float> floats(n);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(bytes.data()) % detail::kCacheLineBytes, 0u) << n;
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(floats.data()) % detail::kCacheLineBytes, 0u) << n;
  }
}

// Buffers of kHugePagesFrom bytes and more start on a 2 MiB page and are advised into huge pages
// (the "hg" flag of their mapping in /proc/self/smaps, where the kernel has transparent huge pages);
// smaller ones start on a cache line; both hold what is written into them.
// Whether the mapping holding p has the "hg" flag; nothing where smaps shows no flags (a sandbox's).
std::optional<bool> advised_huge(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find(' ')) {
      inside = lo <= at && at < hi;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line.find(" hg") != std::string::npos;
    }
  }
  return std::nullopt;
}
TEST(CacheLineMemory, LargeBuffersAreAdvisedIntoHugePages) {
  for (const std::size_t bytes : {std::size_t{1} << 20, detail::kHugePagesFrom - 64, detail::kHugePagesFrom,
                                  detail::kHugePagesFrom + 12345}) {
    auto* p = static_cast<unsigned char*>(detail::allocate_aligned(bytes));
    const auto address = reinterpret_cast<std::uintptr_t>(p);
    const bool huge = bytes >= detail::kHugePagesFrom;
    EXPECT_EQ(address % (huge ? std::size_t{2} << 20 : detail::kCacheLineBytes), 0u) << bytes;
    std::memset(p, 0x5A, bytes);
    EXPECT_EQ(p[0], 0x5A);
    EXPECT_EQ(p[bytes - 1], 0x5A);
    const std::optional<bool> advised = huge ? advised_huge(p) : std::nullopt;
    if (huge && std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled").good() && advised) {
      EXPECT_TRUE(*advised) << bytes;
    } else if (huge) {
      std::printf("[ SKIPPED  ] no transparent huge pages, or no VmFlags in /proc/self/smaps: the advice is not checked\n");
    }
    detail::free_aligned(p, bytes);
  }
}

TEST(ScratchFrame, AnArenaThatGrewIsMergedSoTheSameCallsAllocateNothing) {
  ScratchFrame::release();
  auto nested_calls = [] {
    ScratchFrame a(4096);
    ScratchFrame b(1 << 16);
    ScratchFrame c(1 << 18);
  };
  nested_calls();  // grows the arena chunk by chunk, then merges the chunks into one
  const std::size_t held = ScratchFrame::held();
  EXPECT_GE(held, std::size_t(4096 + (1 << 16) + (1 << 18)));
  void* bottom = nullptr;
  {
    ScratchFrame probe(1);
    bottom = probe.data();
  }
  nested_calls();
  EXPECT_EQ(ScratchFrame::held(), held) << "the second round allocated";
  ScratchFrame probe(1);
  EXPECT_EQ(probe.data(), bottom) << "the merged chunk moved";
}

TEST(ScratchFrame, ReleaseRefusesWhileAFrameIsOpen) {
  ScratchFrame open(16);
  expect_error([] { ScratchFrame::release(); }, {"a frame of this thread is still open"});
}

TEST(ScratchFrame, LayoutsMeasureWhatTheyTake) {
  struct Layout {
    float* a;
    double* b;
    bool* c;
    Layout(Carve& carve, std::size_t n) : a(carve.take<float>(n)), b(carve.take<double>(3)), c(carve.take<bool>(n)) {}
  };
  EXPECT_EQ(cpu::layout_bytes<Layout>(std::size_t(16)), 64u * 3);  // 64, 24 and 16 bytes, each in a 64-byte slot
  EXPECT_EQ(cpu::layout_bytes<Layout>(std::size_t(17)), 64u * 4);  // 68 bytes take two slots
  cpu::Scratch<Layout> s(std::size_t(17));
  EXPECT_EQ(reinterpret_cast<char*>(s->b) - reinterpret_cast<char*>(s->a), 128);
  EXPECT_EQ(reinterpret_cast<char*>(s->c) - reinterpret_cast<char*>(s->b), 64);
  Carve measure;
  expect_error([&] { measure.take<double>(SIZE_MAX / 4); }, {"overflow the address space"});
}

// ---- results do not depend on what scratch held ---------------------------------------------------

// Runs `run` (returning std::vector<Tensor<float>>) with every scratch frame filled with 0x00, 0xFF
// and 0x7F bytes, at 1 and 2 threads, and expects the same bits every time.
template <class Run>
void expect_independent_of_scratch(const Run& run) {
  ScopedBackend cpu(Backend::cpu);
  std::vector<Tensor<float>> first;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (int fill : {0x00, 0xFF, 0x7F}) {
      SCOPED_TRACE(::testing::Message() << threads << " threads, scratch filled with " << fill);
      ScratchFrame::set_fill(fill);
      const std::vector<Tensor<float>> got = run();
      ScratchFrame::set_fill(-1);
      if (first.empty()) {
        first = got;
        continue;
      }
      ASSERT_EQ(got.size(), first.size());
      for (std::size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].values(), first[i].values()) << "result " << i;
    }
  }
  set_num_threads(0);
}

// SDPA forward and backward (without out and lse: the backward runs the forward inside its own
// frame), on the decode path (n = 3) and the tiled one (n = 70), with valid lengths.
TEST(ScratchContents, SdpaResultsDoNotDependOnThem) {
  for (index_t n : {3, 70}) {
    SCOPED_TRACE(::testing::Message() << "n = " << n);
    const index_t B = 2, H = 2, m = 600, d = 16, v = 300;
    const Tensor<float> q = random_tensor<float>({B, H, n, d}, 1), k = random_tensor<float>({B, H, m, d}, 2);
    const Tensor<float> vals = random_tensor<float>({B, H, m, v}, 3), g = random_tensor<float>({B, H, n, v}, 4);
    const Tensor<std::int64_t> lens({B}, {m, 301});
    Mask<float> mask;
    mask.valid_lens = lens.view();
    expect_independent_of_scratch([&] {
      Tensor<float> out({B, H, n, v}), lse({B, H, n}), dq(q.shape()), dk(k.shape()), dv(vals.shape());
      sdpa_forward<float>(out.view(), lse.view(), {}, q.view(), k.view(), vals.view(), mask);
      sdpa_backward<float>(dq.view(), dk.view(), dv.view(), g.view(), q.view(), k.view(), vals.view(), {}, {}, mask);
      return std::vector<Tensor<float>>{out, lse, dq, dk, dv};
    });
  }
}

TEST(ScratchContents, AdditiveResultsDoNotDependOnThem) {
  const index_t B = 2, n = 70, m = 130, q = 5, k = 3, h = 8, v = 7;
  const Tensor<float> qs = random_tensor<float>({B, n, q}, 5), ks = random_tensor<float>({B, m, k}, 6);
  const Tensor<float> vals = random_tensor<float>({B, m, v}, 7), g = random_tensor<float>({B, n, v}, 8);
  const Tensor<float> w_q = random_tensor<float>({h, q}, 9), w_k = random_tensor<float>({h, k}, 10);
  const Tensor<float> w_v = random_tensor<float>({h}, 11);
  const AdditiveParams<float> params{w_q.view(), w_k.view(), w_v.view()};
  const Tensor<std::int64_t> lens({B}, {m, 40});
  Mask<float> mask;
  mask.valid_lens = lens.view();
  expect_independent_of_scratch([&] {
    Tensor<float> out({B, n, v}), dq(qs.shape()), dk(ks.shape()), dv(vals.shape()), dwq(w_q.shape()), dwk(w_k.shape()),
        dwv(w_v.shape());
    additive_attention_forward<float>(out.view(), {}, qs.view(), ks.view(), vals.view(), params, mask);
    additive_attention_backward<float>(dq.view(), dk.view(), dv.view(), {dwq.view(), dwk.view(), dwv.view()}, g.view(),
                                       qs.view(), ks.view(), vals.view(), params, mask);
    return std::vector<Tensor<float>>{out, dq, dk, dv, dwq, dwk, dwv};
  });
}

// Nadaraya-Watson with 1-D keys: the windowed path, whose sorted keys and per-query arrays are scratch.
TEST(ScratchContents, NadarayaWatsonResultsDoNotDependOnThem) {
  const index_t B = 2, n = 300, m = 400, v = 3;
  const Tensor<float> q = random_tensor<float>({B, n, 1}, 12, 0, 4), k = random_tensor<float>({B, m, 1}, 13, 0, 4);
  const Tensor<float> vals = random_tensor<float>({B, m, v}, 14), g = random_tensor<float>({B, n, v}, 15);
  for (Kernel kernel : {Kernel::gaussian, Kernel::epanechnikov}) {
    SCOPED_TRACE(kernel_name(kernel));
    expect_independent_of_scratch([&] {
      Tensor<float> out({B, n, v}), dq(q.shape()), dk(k.shape()), dv(vals.shape()), dsigma({1});
      nadaraya_watson_forward<float>(out.view(), {}, q.view(), k.view(), vals.view(), kernel, 0.3f);
      nadaraya_watson_backward<float>(dq.view(), dk.view(), dv.view(), &dsigma[0], g.view(), q.view(), k.view(),
                                      vals.view(), kernel, 0.3f);
      return std::vector<Tensor<float>>{out, dq, dk, dv, dsigma};
    });
  }
}

// ---- outputs that share memory ------------------------------------------------------------------

struct Qkv {
  Tensor<float> q = random_tensor<float>({2, 3, 4}, 20), k = random_tensor<float>({2, 5, 4}, 21);
  Tensor<float> v = random_tensor<float>({2, 5, 6}, 22), g = random_tensor<float>({2, 3, 6}, 23);
};

TEST(OutputMemory, BroadcastOutputsAreRefusedByEveryOp) {
  Qkv c;
  Tensor<float> buf({2, 3, 6});
  const TensorView<float> broadcast(buf.data(), {2, 3, 6}, {0, 6, 1});  // both batches write one (3, 6) block
  expect_error([&] { sdpa_forward<float>(broadcast, {}, {}, c.q.view(), c.k.view(), c.v.view()); },
               {"sdpa_forward: out has stride 0 in dimension 0; an output must not broadcast"});
  Tensor<float> lse_buf({3});
  const TensorView<float> lse(lse_buf.data(), {2, 3}, {0, 1});
  Tensor<float> out({2, 3, 6});
  expect_error([&] { sdpa_forward<float>(out.view(), lse, {}, c.q.view(), c.k.view(), c.v.view()); },
               {"lse has stride 0 in dimension 0"});
  Tensor<float> dk_buf({5, 4});
  const TensorView<float> dk(dk_buf.data(), {2, 5, 4}, {0, 4, 1});
  expect_error([&] { sdpa_backward<float>({}, dk, {}, c.g.view(), c.q.view(), c.k.view(), c.v.view(), {}, {}); },
               {"sdpa_backward: dkeys has stride 0 in dimension 0"});
  const Tensor<float> w_q = random_tensor<float>({3, 4}, 24), w_k = random_tensor<float>({3, 4}, 25);
  const Tensor<float> w_v = random_tensor<float>({3}, 26);
  expect_error([&] { additive_attention_forward<float>(broadcast, {}, c.q.view(), c.k.view(), c.v.view(),
                                                        {w_q.view(), w_k.view(), w_v.view()}); },
               {"additive_attention_forward: out has stride 0 in dimension 0"});
  const Tensor<float> scores = random_tensor<float>({2, 3, 6}, 27);
  expect_error([&] { masked_softmax_forward<float>(broadcast, scores.view()); },
               {"masked_softmax_forward: weights has stride 0 in dimension 0"});
  const Tensor<float> a = random_tensor<float>({2, 3, 4}, 28), b = random_tensor<float>({2, 4, 6}, 29);
  expect_error([&] { bmm_forward<float>(broadcast, a.view(), b.view()); },
               {"bmm_forward: out has stride 0 in dimension 0"});
}

TEST(OutputMemory, StridesThatFoldRowsOntoEachOtherAreRefused) {
  Qkv c;
  Tensor<float> buf({64});
  // (2, 3, 6) with row stride 2: row i's elements 2..5 are row i + 1's 0..3.
  const TensorView<float> folded(buf.data(), {2, 3, 6}, {18, 2, 1});
  expect_error([&] { sdpa_forward<float>(folded, {}, {}, c.q.view(), c.k.view(), c.v.view()); },
               {"sdpa_forward: out has shape (2,3,6) and strides (18,2,1)", "two of its elements share memory"});
}

TEST(OutputMemory, PartialOverlapWithAnInputIsRefused) {
  Qkv c;
  // values (2, 5, 6) in a buffer; out (2, 3, 6) starting 7 elements in: not the same base pointer,
  // but it covers values' elements 7 .. 42.
  Tensor<float> buf({2 * 5 * 6});
  std::copy(c.v.data(), c.v.data() + c.v.numel(), buf.data());
  const TensorView<const float> values(buf.data(), {2, 5, 6});
  const TensorView<float> out(buf.data() + 7, {2, 3, 6}, {18, 6, 1});
  expect_error([&] { sdpa_forward<float>(out, {}, {}, c.q.view(), c.k.view(), values); },
               {"sdpa_forward: out and values share memory"});
  // bmm's gradient da overlapping b.
  const Tensor<float> a = random_tensor<float>({2, 3, 4}, 30);
  Tensor<float> bbuf({2 * 4 * 6 + 5});
  const TensorView<const float> b(bbuf.data(), {2, 4, 6});
  const TensorView<float> da(bbuf.data() + 20, {2, 3, 4});
  expect_error([&] { bmm_backward<float>(da, {}, c.g.view(), a.view(), b); }, {"bmm_backward: da and b share memory"});
  // Two outputs overlapping each other.
  Tensor<float> grads({2 * 3 * 4 + 2 * 5 * 4});
  const TensorView<float> dq(grads.data(), {2, 3, 4});
  const TensorView<float> dk(grads.data() + 20, {2, 5, 4});
  expect_error([&] { sdpa_backward<float>(dq, dk, {}, c.g.view(), c.q.view(), c.k.view(), c.v.view(), {}, {}); },
               {"dqueries and dkeys share memory"});
  // Softmax: the very same view works in place; any other overlap is refused.
  Tensor<float> s = random_tensor<float>({2, 3, 6}, 31);
  const Tensor<float> expected = masked_softmax<float>(s.view());
  masked_softmax_forward<float>(s.view(), s.view());
  EXPECT_EQ(s.values(), expected.values());
  const TensorView<float> shifted(s.data() + 1, {2, 3, 5}, {18, 6, 1});
  const TensorView<const float> scores(s.data(), {2, 3, 5}, {18, 6, 1});
  expect_error([&] { masked_softmax_forward<float>(shifted, scores); },
               {"masked_softmax_forward: weights and scores share memory"});
}

TEST(OutputMemory, InterleavedSlicesThatShareNoElementAreAccepted) {
  // One (B, n, 2 v) buffer holding values in its first v columns and out in its last v: the byte
  // ranges interleave, the elements do not.
  const index_t B = 2, n = 5, v = 6;
  Qkv c;
  Tensor<float> keys = random_tensor<float>({B, n, 4}, 32);
  Tensor<float> buf = random_tensor<float>({B, n, 2 * v}, 33);
  const TensorView<const float> values(buf.data(), {B, n, v}, {n * 2 * v, 2 * v, 1});
  const TensorView<float> out(buf.data() + v, {B, 3, v}, {n * 2 * v, 2 * v, 1});
  const Tensor<float> values_copy = [&] {
    Tensor<float> t({B, n, v});
    for (index_t b = 0; b < B; ++b)
      for (index_t i = 0; i < n; ++i)
        for (index_t j = 0; j < v; ++j) t(b, i, j) = values(b, i, j);
    return t;
  }();
  sdpa_forward<float>(out, {}, {}, c.q.view(), keys.view(), values);
  const Tensor<float> want = scaled_dot_product_attention<float>(c.q.view(), keys.view(), values_copy.view());
  for (index_t b = 0; b < B; ++b)
    for (index_t i = 0; i < 3; ++i)
      for (index_t j = 0; j < v; ++j) EXPECT_EQ(out(b, i, j), want(b, i, j));
}

TEST(OutputMemory, TensorsWithoutElementsNeverConflict) {
  // Nadaraya-Watson with no queries: (B, 0, C) outputs and gradients (no data) are legal.
  const Tensor<float> q({2, 0, 1}), k = random_tensor<float>({2, 4, 1}, 34), v = random_tensor<float>({2, 4, 3}, 35);
  Tensor<float> out({2, 0, 3}), dq({2, 0, 1}), dk({2, 4, 1}), dv({2, 4, 3});
  const Tensor<float> g({2, 0, 3});
  nadaraya_watson_forward<float>(out.view(), {}, q.view(), k.view(), v.view(), Kernel::gaussian, 1.0f);
  nadaraya_watson_backward<float>(dq.view(), dk.view(), dv.view(), nullptr, g.view(), q.view(), k.view(), v.view(),
                                  Kernel::gaussian, 1.0f);
  for (index_t i = 0; i < dk.numel(); ++i) EXPECT_EQ(dk[i], 0.0f);
  for (index_t i = 0; i < dv.numel(); ++i) EXPECT_EQ(dv[i], 0.0f);
  // The same for SDPA with no queries.
  Tensor<float> sq({2, 0, 4}), sk = random_tensor<float>({2, 5, 4}, 36), sv = random_tensor<float>({2, 5, 6}, 37);
  Tensor<float> sout({2, 0, 6}), sdq({2, 0, 4}), sdk({2, 5, 4}), sdv({2, 5, 6});
  const Tensor<float> sg({2, 0, 6});
  sdpa_forward<float>(sout.view(), {}, {}, sq.view(), sk.view(), sv.view());
  sdpa_backward<float>(sdq.view(), sdk.view(), sdv.view(), sg.view(), sq.view(), sk.view(), sv.view(), {}, {});
  for (index_t i = 0; i < sdk.numel(); ++i) EXPECT_EQ(sdk[i], 0.0f);
}

}  // namespace
}  // namespace attn
