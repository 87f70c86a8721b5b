#pragma once
// CUDA implementations of the ops in backend/ops.h and backend/quantize.h (same signatures; see there
// for shapes and semantics). One .cu per op family under backend/cuda/, the kernel and its launcher
// together. Storage on the GPU: "bf16 activation" tensors and the weights are DType::BF16; fp32
// accumulators, rstd, lse, losses, master weights and moments are F32; token ids I32.
#include "backend/ops.h"
#include "backend/quantize.h"

namespace pl::cuda {
#include "backend/backend_ops.inc"

// pretrain_llama --cuda-sync-every-launch: check_launch synchronizes after every launch so an
// asynchronous fault names its op (declared with its neighbours in cuda_check.h; repeated here for
// callers that do not include the CUDA headers).
void set_sync_every_launch(bool on);
}  // namespace pl::cuda
