// Reading the command line's .npy inputs by role (see npy_inputs.hpp).
#include "npy_inputs.hpp"

#include <functional>
#include <new>
#include <stdexcept>
#include <string>

#include "exit_codes.hpp"

namespace attn_cli {

using attn::io::DType;
using attn::io::dtype_name;

NpyInput read_input(const std::string& flag, const std::string& path) {
  NpyInput input{flag, path, {}};
  try {
    input.array = attn::io::read_npy(path);
  } catch (const attn::Error& e) {
    // The reader's messages start with the path; name the flag too: "--keys K.npy: ...".
    const std::string message = e.what(), prefix = path + ": ";
    throw UsageError(input.where() + ": " +
                     (message.compare(0, prefix.size(), prefix) == 0 ? message.substr(prefix.size()) : message));
  }
  return input;
}

DType common_float_type(std::initializer_list<const NpyInput*> inputs, const std::string& accepted) {
  const NpyInput* first = nullptr;
  for (const NpyInput* input : inputs) {
    const DType dtype = input->array.dtype;
    if (dtype != DType::float32 && dtype != DType::float64)
      throw UsageError(input->where() + ": holds " + dtype_name(dtype) + "; it must hold " + accepted);
    // No silent conversion: mixing float32 and float64 is more likely a mistake than a wish.
    if (first && dtype != first->array.dtype)
      throw UsageError(input->where() + " holds " + dtype_name(dtype) + " but " + first->where() + " holds " +
                       dtype_name(first->array.dtype) + "; the float inputs must share one type (the outputs keep it)");
    if (!first) first = input;
  }
  return first ? first->array.dtype : DType::float32;
}

template <class T>
attn::Tensor<T> to_tensor(const NpyInput& input) {
  // to_tensor's messages start with the name given: the flag and the path.
  return as_usage([&] { return input.array.to_tensor<T>(input.where()); });
}

template attn::Tensor<float> to_tensor<float>(const NpyInput&);
template attn::Tensor<double> to_tensor<double>(const NpyInput&);
template attn::Tensor<std::int32_t> to_tensor<std::int32_t>(const NpyInput&);
template attn::Tensor<std::int64_t> to_tensor<std::int64_t>(const NpyInput&);
template attn::Tensor<bool> to_tensor<bool>(const NpyInput&);
template attn::Tensor<attn::float16> to_tensor<attn::float16>(const NpyInput&);

namespace {

// Valid lengths as int64, from a file of int32 or int64.
attn::Tensor<std::int64_t> read_lengths(const std::string& path) {
  const NpyInput input = read_input("--valid-lens", path);
  // numpy's default integer on Linux is int64; int32 (np.int32, torch.int32) is widened.
  if (input.array.dtype == DType::int64) return to_tensor<std::int64_t>(input);
  if (input.array.dtype != DType::int32)
    throw UsageError(input.where() + ": holds " + dtype_name(input.array.dtype) +
                     "; valid lengths must be integers, int32 or int64 (in numpy: np.array([2, 6]))");
  const attn::Tensor<std::int32_t> narrow = to_tensor<std::int32_t>(input);
  attn::Tensor<std::int64_t> wide(narrow.shape());
  for (attn::index_t i = 0; i < narrow.numel(); ++i) wide[i] = narrow[i];
  return wide;
}

}  // namespace

MaskInputs MaskInputs::read(const std::string& valid_lens_path, const std::string& keep_path, bool causal) {
  MaskInputs inputs;
  inputs.causal = causal;
  if (!valid_lens_path.empty()) inputs.valid_lens = read_lengths(valid_lens_path);
  if (!keep_path.empty()) {
    const NpyInput input = read_input("--mask", keep_path);
    if (input.array.dtype != DType::boolean)
      throw UsageError(input.where() + ": holds " + dtype_name(input.array.dtype) +
                       "; the mask must be bool, true where a query may attend to a key");
    inputs.keep = to_tensor<bool>(input);
  }
  return inputs;
}

void naming_flag(const char* flag, const std::function<void()>& write) {
  try {
    write();
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception& e) {  // the message starts with the path
    throw std::runtime_error(std::string(flag) + " " + e.what());
  }
}

template <class T>
void write_output(const char* flag, const std::string& path, const attn::Tensor<T>& tensor,
                  std::span<const attn::index_t> shape) {
  naming_flag(flag, [&] {
    if (shape.empty())
      attn::io::write_npy(path, tensor);
    else
      attn::io::write_npy(path, attn::io::dtype_of<T>(), shape, tensor.data());
  });
}

template void write_output<float>(const char*, const std::string&, const attn::Tensor<float>&, std::span<const attn::index_t>);
template void write_output<double>(const char*, const std::string&, const attn::Tensor<double>&, std::span<const attn::index_t>);
template void write_output<attn::float16>(const char*, const std::string&, const attn::Tensor<attn::float16>&,
                                          std::span<const attn::index_t>);

}  // namespace attn_cli
