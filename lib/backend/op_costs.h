#pragma once
// cost::<op>: what each op of backend/op_list.h costs (core/op_cost.h): its FLOPs (the op's own
// arithmetic; a GEMM counts 2·M·N·K only) and its minimal bytes (each input read once, each output
// written once, at the tensors' storage types: FP32 on the CPU, BF16 activations on the GPU), from the
// same arguments the op gets. The dispatcher (backend/ops.cpp) calls it only while a roofline report
// is measuring (Timers::op_rows_active), so it costs nothing otherwise. One table, in op_costs.cpp,
// each formula with its comment; the report (roofline/) judges each row by its kind and format.
#include "backend/ops.h"
#include "backend/quantize.h"
#include "core/op_cost.h"

namespace pl::cost {
#define PL_OP(name, ret, timer, params, args) OpCosts name params;
#define PL_QUANT_OP PL_OP
#include "backend/op_list.h"

// The format name a report row shows for a quantized format: "fp8" (E4M3 and E5M2 alike), "mxfp8", "nvfp4".
const char* format_row_name(QuantFormat f);
// The format a row that is not a quantized GEMM shows: its main tensor's storage, named as the formats are
// ("fp32", "bf16"; core/tensor.h dtype_name spells them for error messages: "f32").
const char* dtype_row_name(DType t);
// A collective over `ranks` on buffer `t` (data parallelism's gradient reduction and weight all-gather,
// which are not ops of op_list.h): NCCL-tests' "bus bytes" (what each rank sends, and receives, over the
// ring: (ranks-1)/ranks of the buffer per pass, 2 passes for an all-reduce, 1 for a reduce-scatter or an
// all-gather), the reduction's adds for a reducing collective. Its row shows the time the step waits for it
// (with overlap, the rest runs under the backward or the next forward).
OpCosts collective(const Tensor& t, int64_t ranks, double passes, bool reduces);
}  // namespace pl::cost
