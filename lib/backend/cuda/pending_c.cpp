// PENDING: failing placeholders for CUDA ops not written yet. Each definition is removed when its
// real implementation lands in a .cu file; this file is deleted when it is empty.
#include "backend/cuda/cuda_ops.h"
#include "core/error.h"

#pragma GCC diagnostic ignored "-Wunused-parameter"

namespace pl::cuda {

void attention_forward(const OpContext&, const Tensor& out, const Tensor& lse, const Tensor& qkv, const AttentionShape& s) {
  fail("op attention_forward is not implemented on the CUDA backend yet");
}

void attention_backward(const OpContext&, const Tensor& dqkv, const Tensor& dout, const Tensor& out, const Tensor& lse, const Tensor& qkv, const AttentionShape& s) {
  fail("op attention_backward is not implemented on the CUDA backend yet");
}

}  // namespace pl::cuda
