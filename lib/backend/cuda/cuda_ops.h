#pragma once
// CUDA implementations of every op of backend/op_list.h (same signatures; shapes and semantics there).
// One .cu per op family under backend/cuda/, the kernel and its launcher together. Arguments arrive
// checked (backend/op_checks.cpp). Storage on the GPU: "bf16 activation" tensors and the weights are
// DType::BF16; fp32 accumulators, rstd, lse, losses, master weights and moments are F32; token ids I32.
// Each op runs on ctx.gpu's compute stream with ctx.gpu's handles and scratch (device_state.h).
#include "backend/ops.h"
#include "backend/quantize.h"

namespace pl::cuda {
#define PL_OP(name, ret, timer, params, args) ret name params;
#define PL_QUANT_OP PL_OP
#include "backend/op_list.h"
}  // namespace pl::cuda
