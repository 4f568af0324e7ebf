// The command line's .npy inputs and outputs: files read once, checked for the element type their
// role needs, and turned into tensors; every problem a UsageError (exit code 2) that names the
// flag and the file: "--keys K.npy: K.npy: the header length 900 runs past the end of the file...".
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <functional>
#include <span>
#include <string>

#include "attn/mask.hpp"
#include "attn/npy.hpp"
#include "attn/tensor.hpp"

namespace attn_cli {

// One input file: the flag that named it, its path and its parsed content.
struct NpyInput {
  std::string flag, path;
  attn::io::NpyArray array;

  std::string where() const { return flag + " " + path; }  // how messages name it
};

// Reads and parses `path`, given with `flag`; UsageError with the reader's message otherwise.
NpyInput read_input(const std::string& flag, const std::string& path);

// The float type that every input shares: float32 or float64. UsageError naming the file when one
// is not a float array (`accepted`: the types the command reads, for the message), or naming two
// files whose float types differ.
attn::io::DType common_float_type(std::initializer_list<const NpyInput*> inputs,
                                  const std::string& accepted = "float32 or float64");

// The input as a tensor of T (float, double, int32, int64 or bool: the file's own dtype, which the
// caller has checked) with at most attn::kMaxRank dimensions; UsageError otherwise.
template <class T>
attn::Tensor<T> to_tensor(const NpyInput& input);

// Runs body.template operator()<float>() or <double>() for the float type: one code path for both.
template <class Body>
void with_float_type(attn::io::DType dtype, Body&& body) {
  if (dtype == attn::io::DType::float64)
    body.template operator()<double>();
  else
    body.template operator()<float>();
}

// The masks a command may be given: valid lengths (int32 or int64, converted to the int64 the
// library takes), a boolean keep-mask, causal. Owns the tensors that mask<T>() views.
struct MaskInputs {
  std::optional<attn::Tensor<std::int64_t>> valid_lens;
  std::optional<attn::Tensor<bool>> keep;
  bool causal = false;

  // Reads the files given (an empty path: that mask is not used).
  static MaskInputs read(const std::string& valid_lens_path, const std::string& keep_path, bool causal);

  template <class T>
  attn::Mask<T> mask() const {
    attn::Mask<T> m;
    if (valid_lens) m.valid_lens = valid_lens->cview();
    if (keep) m.keep = keep->cview();
    m.causal = causal ? attn::Causal::top_left : attn::Causal::none;
    return m;
  }
};

// Writes `tensor` to `path`, the value of `flag`, as .npy, with `shape` when not empty (a reshape of
// the same elements). Failures name the flag and the path ("--out /tmp: cannot open for writing:
// Is a directory"): a failed run (exit code 1).
template <class T>
void write_output(const char* flag, const std::string& path, const attn::Tensor<T>& tensor,
                  std::span<const attn::index_t> shape = {});
// The same for any writing of `path`: write() run with its failures named by the flag.
void naming_flag(const char* flag, const std::function<void()>& write);

}  // namespace attn_cli
