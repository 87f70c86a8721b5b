#include "train/checkpoint_state.h"

#include <cstring>

#include "backend/device_memory.h"
#include "core/error.h"
#include "numerics/bf16.h"

namespace pl::checkpoint_state {

// Elements [e, e + cnt) of b (tensor-relative) into host memory, in the tensor's dtype.
void state_to_host(const StateBuffer& b, void* dst, int64_t e, int64_t cnt) {
  if (b.from_master) return b.from_master->weights_to_host(e, cnt, dst);
  copy_to_host(dst, b.tensor.rows(e, cnt));
}

namespace {
StateBuffer moment_buffer(const std::string& stem, const Tensor& t, int64_t first) {
  return {stem + (t.dtype == DType::BF16 ? "_bf16.bin" : "_fp32.bin"), t, t.dtype, first};
}
}  // namespace

std::vector<StateBuffer> state_buffers(const LlamaModel& model, const AdamW& opt) {
  auto& m = const_cast<LlamaModel&>(model);  // views only; nothing is modified through them
  const bool bf16_weights = model.context().round_bf16;
  const int64_t first = model.shard().begin;  // 0 unless the optimizer state is sharded
  const bool primary = model.fp8_primary_weights();
  const Tensor weights = primary ? Tensor(nullptr, {model.num_params()}, m.weights().flat.dtype, m.weights().flat.device)
                                 : m.weights().flat;
  return {
      {"master_fp32.bin", m.master().flat, DType::F32, first},
      {bf16_weights ? "weights_bf16.bin" : "weights_fp32.bin", weights, bf16_weights ? DType::BF16 : DType::F32, 0,
       primary ? &model : nullptr},
      moment_buffer("adam_m", opt.moment1_tensor(), first),
      moment_buffer("adam_v", opt.moment2_tensor(), first),
  };
}

void tensor_to_file_dtype(const void* src, DType from, void* dst, DType to, size_t count) {
  if (from == to) {
    if (src != dst) std::memcpy(dst, src, count * dtype_size(to));
    return;
  }
  PL_CHECK(from == DType::F32 && to == DType::BF16, "internal: no conversion {} -> {}", dtype_name(from),
           dtype_name(to));
  const auto* s = static_cast<const float*>(src);
  auto* d = static_cast<uint16_t*>(dst);
  for (size_t i = 0; i < count; ++i) d[i] = num::float_to_bf16_bits(s[i]);
}

void file_to_tensor_dtype(const void* src, DType from, void* dst, DType to, size_t count) {
  if (from == to) {
    if (src != dst) std::memcpy(dst, src, count * dtype_size(to));
    return;
  }
  if (from == DType::F32 && to == DType::BF16) {  // an fp32 moment into a bf16 one: round to nearest even
    const auto* s = static_cast<const float*>(src);
    auto* d = static_cast<uint16_t*>(dst);
    for (size_t i = 0; i < count; ++i) d[i] = num::float_to_bf16_bits(s[i]);  // forwards: in place is safe
    return;
  }
  PL_CHECK(from == DType::BF16 && to == DType::F32, "internal: no conversion {} -> {}", dtype_name(from),
           dtype_name(to));
  const auto* s = static_cast<const uint16_t*>(src);
  auto* d = static_cast<float*>(dst);
  for (size_t i = count; i-- > 0;) d[i] = num::bf16_bits_to_float(s[i]);  // backwards: in place is safe
}

}  // namespace pl::checkpoint_state
