#pragma once
// CUDA implementations of the ops in backend/ops.h and backend/quantize.h (same signatures; see there
// for shapes and semantics). One .cu per op family under backend/cuda/, the kernel and its launcher
// together. Storage on the GPU: "bf16 activation" tensors and the weights are DType::BF16; fp32
// accumulators, rstd, lse, losses, master weights and moments are F32; token ids I32.
#include "backend/ops.h"
#include "backend/quantize.h"

namespace pl::cuda {
#include "backend/backend_ops.inc"
}  // namespace pl::cuda
