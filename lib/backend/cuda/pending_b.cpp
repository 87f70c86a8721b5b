// PENDING: failing placeholders for CUDA ops not written yet. Each definition is removed when its
// real implementation lands in a .cu file; this file is deleted when it is empty.
#include "backend/cuda/cuda_ops.h"
#include "core/error.h"

#pragma GCC diagnostic ignored "-Wunused-parameter"

namespace pl::cuda {

void linear_forward(const OpContext&, const Tensor& y, const Tensor& x, const Tensor& w) {
  fail("op linear_forward is not implemented on the CUDA backend yet");
}

void linear_backward_input(const OpContext&, const Tensor& dx, const Tensor& dy, const Tensor& w) {
  fail("op linear_backward_input is not implemented on the CUDA backend yet");
}

void linear_backward_weight(const OpContext&, const Tensor& dw, const Tensor& dy, const Tensor& x) {
  fail("op linear_backward_weight is not implemented on the CUDA backend yet");
}

void quantized_gemm(const OpContext&, const Tensor& y, const QuantizedCopy& a, const QuantizedCopy& b, QuantFormat format, bool accumulate, const Tensor& scratch_a, const Tensor& scratch_b) {
  fail("op quantized_gemm is not implemented on the CUDA backend yet");
}

}  // namespace pl::cuda
