// `attn sdpa`: scaled dot-product attention, softmax(Q K^T * scale) V, as the d2l chapter's
// DotProductAttention, through .npy files.
#include <CLI/CLI.hpp>

#include <memory>
#include <optional>
#include <string>

#include "attention_flags.hpp"
#include "attn/half.hpp"
#include "attn/sdpa.hpp"
#include "commands.hpp"
#include "exit_codes.hpp"

namespace attn_cli {
namespace {

struct SdpaArgs {
  QkvFlags qkv;
  MaskFlags mask;
  double scale = 0;
  bool has_scale = false;  // --scale was given; otherwise 1/sqrt(d)
  double softcap = 0;
  bool has_softcap = false;
  bool bottom_right = false;
  std::string window, alibi, segment_ids, key_segment_ids, lse, compute, align;
  DropoutFlags dropout;
  OutputFlags output;
};

// --window L,R: two integers, -1 for an unbounded side; a usage error otherwise.
attn::Window parse_window(const std::string& text) {
  const auto comma = text.find(',');
  auto side = [&](const std::string& part, const char* which) -> attn::index_t {
    std::size_t used = 0;
    long long value = 0;
    try {
      value = std::stoll(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != part.size())
      throw UsageError("--window " + text + ": the " + which + " bound \"" + part +
                       "\" is not an integer; give L,R as two integers (-1: unbounded), e.g. --window 256,0");
    return value < 0 ? -1 : static_cast<attn::index_t>(value);
  };
  if (comma == std::string::npos || text.find(',', comma + 1) != std::string::npos)
    throw UsageError("--window " + text + ": give L,R, two integers separated by a comma (-1: unbounded)");
  return {side(text.substr(0, comma), "left"), side(text.substr(comma + 1), "right")};
}

// Segment ids from a file of int32 or int64, kept in their type.
struct SegmentInput {
  std::optional<attn::Tensor<std::int32_t>> i32;
  std::optional<attn::Tensor<std::int64_t>> i64;
  attn::SegmentIds ids() const {
    if (i32) return i32->cview();
    if (i64) return i64->cview();
    return {};
  }
};
SegmentInput read_segments(const std::string& flag, const std::string& path) {
  SegmentInput s;
  if (path.empty()) return s;
  const NpyInput input = read_input(flag, path);
  if (input.array.dtype == attn::io::DType::int32) s.i32 = to_tensor<std::int32_t>(input);
  else if (input.array.dtype == attn::io::DType::int64) s.i64 = to_tensor<std::int64_t>(input);
  else
    throw UsageError(input.where() + ": holds " + attn::io::dtype_name(input.array.dtype) +
                     "; segment ids are int32 or int64");
  return s;
}

// The bfloat16 copy of float32 values (--compute bf16), and float32 values of float16 slopes.
attn::Tensor<attn::bfloat16> rounded_to_bf16(const attn::Tensor<float>& t) {
  attn::Tensor<attn::bfloat16> r(t.shape());
  attn::convert(std::span<const float>(t.data(), static_cast<std::size_t>(t.numel())),
                std::span<attn::bfloat16>(r.data(), static_cast<std::size_t>(r.numel())));
  return r;
}
attn::Tensor<float> widened(const attn::Tensor<attn::float16>& t) {
  attn::Tensor<float> r(t.shape());
  attn::convert(std::span<const attn::float16>(t.data(), static_cast<std::size_t>(t.numel())),
                std::span<float>(r.data(), static_cast<std::size_t>(r.numel())));
  return r;
}

void run_sdpa(const SdpaArgs& args) {
  Progress progress("sdpa");
  progress.stage("reading inputs");
  const QkvFlags::Inputs in = args.qkv.read();
  // Ranks first: out's shape is made from the queries', and the library would name out (found by
  // probing: 1-D queries were reported as "out has shape (24,)").
  for (const NpyInput* input : {&in.queries, &in.keys, &in.values})
    if (input->array.shape.size() != 3 && input->array.shape.size() != 4)
      throw UsageError(input->where() + " has shape " + attn::shape_string(input->array.shape) +
                       "; queries, keys and values must be 3-D (batch, rows, features) or 4-D (batch, heads, rows, features)");
  const MaskInputs masks = args.mask.read();
  const std::optional<attn::Window> window =
      args.window.empty() ? std::nullopt : std::optional<attn::Window>(parse_window(args.window));
  const SegmentInput seg_q = read_segments("--segment-ids", args.segment_ids);
  const SegmentInput seg_k = read_segments("--key-segment-ids", args.key_segment_ids);
  std::optional<NpyInput> alibi;
  if (!args.alibi.empty()) alibi = read_input("--alibi", args.alibi);
  // --scale overrides 1/sqrt(d); without --dropout, p = 0 and nothing is dropped.
  attn::SdpaOptions options;
  if (args.has_scale) options.scale = args.scale;
  if (args.has_softcap) options.softcap = args.softcap;
  options.dropout = args.dropout.dropout();
  // Every mask but the slopes (which take the computation's float type).
  auto mask_of = [&]<class T>() {
    attn::Mask<T> mask = masks.mask<T>();
    const bool bottom_right = args.bottom_right || args.align == "bottom_right";
    if (bottom_right && mask.causal == attn::Causal::top_left) mask.causal = attn::Causal::bottom_right;
    if (!args.align.empty()) mask.align = bottom_right ? attn::Align::bottom_right : attn::Align::top_left;
    mask.window = window;
    mask.segment_ids_q = seg_q.ids();
    mask.segment_ids_k = seg_k.ids();
    return mask;
  };
  std::vector<attn::index_t> out_shape(in.queries.array.shape), lse_shape(in.queries.array.shape);
  if (!out_shape.empty() && !in.values.array.shape.empty()) out_shape.back() = in.values.array.shape.back();
  if (!lse_shape.empty()) lse_shape.pop_back();
  auto write_lse = [&](const auto& lse) {
    if (args.lse.empty()) return;
    progress.stage("writing " + args.lse);
    write_output("--lse", args.lse, lse);
  };

  // 16-bit: float16 files, or float32 files through the bfloat16 kernels (--compute bf16); int8
  // products for float32 files (--compute int8).
  using attn::io::DType;
  const bool half = in.queries.array.dtype == DType::float16 || in.keys.array.dtype == DType::float16 ||
                    in.values.array.dtype == DType::float16;
  if (half || !args.compute.empty()) {
    if (half && !args.compute.empty())
      throw UsageError("--compute " + args.compute + " takes float32 queries, keys and values; float16 files run in float16");
    const DType want = half ? DType::float16 : DType::float32;
    for (const NpyInput* input : {&in.queries, &in.keys, &in.values})
      if (input->array.dtype != want)
        throw UsageError(input->where() + " holds " + attn::io::dtype_name(input->array.dtype) +
                         (half ? "; with float16 inputs all of queries, keys and values must be float16"
                               : "; --compute " + args.compute + " takes float32 queries, keys and values"));
    if (args.output.wants_weights())
      throw UsageError(std::string("--weights and --heatmap need float32 or float64 computation: ") +
                       (args.compute == "int8" ? "int8" : "16-bit") + " attention is fused and forms no weights");
    // Slopes in the inputs' type (float16 with float16 files, widened exactly) or float32.
    const bool half_slopes = alibi && half && alibi->array.dtype == DType::float16;
    const attn::Tensor<float> slopes = half_slopes ? widened(to_tensor<attn::float16>(*alibi))
                                       : alibi     ? to_tensor<float>(*alibi)
                                                   : attn::Tensor<float>();
    attn::Mask<float> mask = mask_of.template operator()<float>();
    if (alibi) mask.alibi_slopes = slopes.cview();
    attn::Tensor<float> lse(args.lse.empty() ? std::vector<attn::index_t>{0} : lse_shape);
    const attn::TensorView<float> lse_view = args.lse.empty() ? attn::TensorView<float>{} : lse.view();
    progress.stage("computing");
    if (half) {
      const auto q = to_tensor<attn::float16>(in.queries), k = to_tensor<attn::float16>(in.keys), v = to_tensor<attn::float16>(in.values);
      attn::Tensor<attn::float16> out(out_shape);
      as_usage([&] { attn::sdpa_forward<attn::float16>(out.view(), lse_view, q.cview(), k.cview(), v.cview(), mask, options); });
      progress.stage("writing " + args.output.out);
      write_output("--out", args.output.out, out);
    } else if (args.compute == "int8") {
      const auto q = to_tensor<float>(in.queries), k = to_tensor<float>(in.keys), v = to_tensor<float>(in.values);
      attn::Tensor<float> out(out_shape);
      as_usage([&] { attn::sdpa_forward_int8(out.view(), lse_view, q.cview(), k.cview(), v.cview(), mask, options); });
      progress.stage("writing " + args.output.out);
      write_output("--out", args.output.out, out);
    } else {
      const auto q = rounded_to_bf16(to_tensor<float>(in.queries)), k = rounded_to_bf16(to_tensor<float>(in.keys));
      const auto v = rounded_to_bf16(to_tensor<float>(in.values));
      attn::Tensor<float> out(out_shape);  // the float32 result, not rounded to bfloat16
      as_usage([&] { attn::sdpa_forward<attn::bfloat16>(out.view(), lse_view, q.cview(), k.cview(), v.cview(), mask, options); });
      progress.stage("writing " + args.output.out);
      write_output("--out", args.output.out, out);
    }
    write_lse(lse);
    progress.done();
    return;
  }

  std::initializer_list<const NpyInput*> floats = {&in.queries, &in.keys, &in.values};
  const std::string accepted = "float32, float64 or float16";  // float16 files took the 16-bit path above
  const DType dtype = alibi ? common_float_type({&in.queries, &in.keys, &in.values, &*alibi}, accepted)
                            : common_float_type(floats, accepted);
  with_float_type(dtype, [&]<class T>() {
    const attn::Tensor<T> q = to_tensor<T>(in.queries), k = to_tensor<T>(in.keys), v = to_tensor<T>(in.values);
    const attn::Tensor<T> slopes = alibi ? to_tensor<T>(*alibi) : attn::Tensor<T>();
    attn::Mask<T> mask = mask_of.template operator()<T>();
    if (alibi) mask.alibi_slopes = slopes.cview();
    progress.stage("computing");
    // The weights are only computed (and kept in memory) when they are written or drawn.
    const bool wants_weights = args.output.wants_weights();
    attn::Tensor<T> out(out_shape), lse(args.lse.empty() ? std::vector<attn::index_t>{0} : lse_shape), weights;
    if (wants_weights) {
      std::vector<attn::index_t> weights_shape(lse_shape);
      weights_shape.push_back(k.shape().size() >= 2 ? k.shape()[k.shape().size() - 2] : 0);
      weights = attn::Tensor<T>(weights_shape);
    }
    as_usage([&] {
      attn::sdpa_forward<T>(out.view(), args.lse.empty() ? attn::TensorView<T>{} : lse.view(),
                            wants_weights ? weights.view() : attn::TensorView<T>{}, q.cview(), k.cview(), v.cview(),
                            mask, options);
    });
    args.output.write(out, weights, progress);
    write_lse(lse);
  });
  progress.done();
}

}  // namespace

void add_sdpa_command(CLI::App& app) {
  auto args = std::make_shared<SdpaArgs>();
  CLI::App* command = app.add_subcommand("sdpa", "scaled dot-product attention softmax(Q K^T / sqrt(d)) V");
  args->qkv.add_to(*command, "d", "d", "float32, float64 or float16");
  args->mask.add_to(*command);
  CLI::Option* scale = command->add_option("--scale", args->scale, "the scores' factor S instead of 1/sqrt(d)");
  scale->type_name("S");
  CLI::Option* softcap = command->add_option(
      "--softcap", args->softcap, "soft-capping: scores become C tanh(score / C) (Gemma 2), C > 0");
  softcap->type_name("C");
  CLI::Option* bottom_right = command->add_flag("--bottom-right", args->bottom_right,
                                                "with --causal: the same as --align bottom_right");
  bottom_right->needs("--causal");
  command->add_option("--align", args->align,
                      "where query i sits among the keys for --causal, --window and --alibi together, causal or not: "
                      "top_left p(i) = i (the default) or bottom_right p(i) = i + m - n (the queries are the last n of "
                      "the m tokens, FlashAttention's convention)")
      ->check(CLI::IsMember({"top_left", "bottom_right"}))
      ->excludes(bottom_right)
      ->type_name("top_left|bottom_right");
  command->add_option("--window", args->window,
                      "sliding window: query i attends key j only when p(i) - L <= j <= p(i) + R, p(i) as --align "
                      "places it; -1 leaves a side unbounded")
      ->type_name("L,R");
  command->add_option("--alibi", args->alibi,
                      "ALiBi slopes (H,) or (B,H), the inputs' float type (float16 or float32 with float16 inputs): "
                      "score += -slope |p(i) - j|")
      ->type_name("SLOPES.npy");
  command->add_option("--segment-ids", args->segment_ids,
                      "packed sequences: segment ids (B,n), int32 or int64; a query attends only to keys of its "
                      "segment (the keys' ids too when n == m)")
      ->type_name("S.npy");
  command->add_option("--key-segment-ids", args->key_segment_ids, "the keys' segment ids (B,m) when n != m")
      ->type_name("SK.npy")
      ->needs("--segment-ids");
  command->add_option("--lse", args->lse,
                      "also write each query row's log-sum-exp (B,n) or (B,H,n) (-inf for a row with no key)")
      ->type_name("LSE.npy");
  command->add_option("--compute", args->compute,
                      "bf16: run float32 inputs through the bfloat16 kernels (rounded once on entry; out the float32 "
                      "result, not rounded to bfloat16). int8: Q K^T of float32 inputs in int8 (SageAttention's "
                      "scheme: queries and keys less their mean quantized with a scale a row; out and lse float32; "
                      "an approximation). "
                      "float16 (.npy '<f2') inputs always run in float16 (out float16, lse float32)")
      ->check(CLI::IsMember({"bf16", "int8"}))
      ->type_name("TYPE");
  args->dropout.add_to(*command);
  args->output.add_to(*command, "where to write the output (B,n,v) or (B,H,n,v), the inputs' float type");
  command->footer(
      "Exit codes: 0 success, 1 failed run, 2 bad usage (see attn --help).\n\n"
      "Example (the d2l chapter's DotProductAttention on queries (2,1,2), keys (2,10,2), values (2,10,4)):\n"
      "  python3 -c \"import numpy as np; np.save('Q.npy', np.random.randn(2, 1, 2).astype('f4')); \\\n"
      "    np.save('K.npy', np.ones((2, 10, 2), 'f4')); np.save('L.npy', np.array([2, 6])); \\\n"
      "    np.save('V.npy', np.tile(np.arange(40, dtype='f4').reshape(1, 10, 4), (2, 1, 1)))\"\n"
      "  attn sdpa --queries Q.npy --keys K.npy --values V.npy --valid-lens L.npy --out O.npy \\\n"
      "            --weights W.npy --heatmap W.png");
  // CLI11 fills a double whether or not the flag is given; count() tells them apart.
  command->callback([args, scale, softcap] {
    args->has_scale = scale->count() > 0;
    args->has_softcap = softcap->count() > 0;
    run_sdpa(*args);
  });
}

}  // namespace attn_cli
