// PENDING: failing placeholders for CUDA ops not written yet. Each definition is removed when its
// real implementation lands in a .cu file; this file is deleted when it is empty.
#include "backend/cuda/cuda_ops.h"
#include "core/error.h"

#pragma GCC diagnostic ignored "-Wunused-parameter"

namespace pl::cuda {

void quantize(const OpContext&, QuantizedTensor& q, const Tensor& x, const QuantizeOptions& opt) {
  fail("op quantize is not implemented on the CUDA backend yet");
}

void dequantize(const OpContext&, const Tensor& out, const QuantizedCopy& c, QuantFormat format) {
  fail("op dequantize is not implemented on the CUDA backend yet");
}

QuantStats quant_stats(const OpContext&, const QuantizedCopy& c, QuantFormat format, const Tensor& reference) {
  fail("op quant_stats is not implemented on the CUDA backend yet");
}

void columnwise_source(const OpContext&, const Tensor& out, const Tensor& x, bool rht) {
  fail("op columnwise_source is not implemented on the CUDA backend yet");
}

}  // namespace pl::cuda
