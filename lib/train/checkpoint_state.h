#pragma once
// The flat state buffers a checkpoint saves and loads (train/checkpoint.cpp's, internal to it): which
// buffers, their files' names and dtypes, and the dtype conversions between a buffer and its file.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/llama.h"
#include "train/optimizer.h"

namespace pl::checkpoint_state {

// One flat state buffer and how it is stored.
struct StateBuffer {
  std::string name;
  Tensor tensor;  // flat [n] on the model's device (f32; the weights are bf16 on CUDA); with the distributed
                  // optimizer the master weights and moments are this rank's shard
  DType file_dtype;
  int64_t first = 0;  // the flat element tensor's element 0 holds (the shard's begin)
  // The weights with FP8 primary weights (tensor has no storage): saved through the model's weights_to_host,
  // not loaded (the master is, and the model makes its weights from it: the same bits).
  const LlamaModel* from_master = nullptr;
};

// Elements [e, e + cnt) of b (tensor-relative) into host memory, in the tensor's dtype.
void state_to_host(const StateBuffer& b, void* dst, int64_t e, int64_t cnt);

// The master weights, the weights and the two moments, in that order. The bf16 weights file holds 2-byte
// bf16; under --fp32-reference the weights are not bf16 values and are stored as f32. The moments in their
// own dtypes (the precision-aware optimizer's --exp-avg-dtype / --exp-avg-sq-dtype): adam_m_fp32.bin or
// adam_m_bf16.bin, the manifest's dtype f32 or bf16.
std::vector<StateBuffer> state_buffers(const LlamaModel& model, const AdamW& opt);

// FP8 delayed scaling's amax histories and scales (LlamaModel::delayed_scaling().all), saved whole by rank 0
// (the recipe runs on one data-parallel rank only), so a resume continues the same scales bit for bit.
inline constexpr const char* kFp8StateFile = "fp8_delayed_scaling_fp32.bin";

// Converts `count` elements of the tensor's dtype in `src` to the file's dtype in `dst` (in place
// allowed when the sizes match). Weights are bf16 values, so f32 -> bf16 is exact.
void tensor_to_file_dtype(const void* src, DType from, void* dst, DType to, size_t count);
// The other way; also an fp32 moment file into a bf16 moment (rounded to nearest even) and bf16 into f32.
void file_to_tensor_dtype(const void* src, DType from, void* dst, DType to, size_t count);

}  // namespace pl::checkpoint_state
