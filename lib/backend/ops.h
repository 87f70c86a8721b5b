#pragma once
// The op interface. The model is written once against these functions; each is listed once, with its
// shapes and semantics, in backend/op_list.h, checked once (backend/op_checks.cpp) and dispatched on
// ctx.device to backend/cpu/<op>.cpp or backend/cuda/<op>.cu (backend/ops.cpp). Tensors are row-major.
#include <cstdint>
#include <memory>

#include "core/op_cost.h"
#include "backend/device_memory.h"
#include "core/tensor.h"

namespace pl {

namespace cuda {
struct DeviceState;  // backend/cuda/device_state.h
}
class Timers;  // core/timers.h

// What an op may use. Cheap to copy; points at state it does not own.
struct OpContext {
  Device device = Device::CPU;
  bool round_bf16 = true;  // round bf16-activation outputs (backend/op_list.h: storage convention)
  // The CUDA backend's per-device state (compute stream, cuBLASLt and cuDNN handles, GEMM plans,
  // attention graphs, device scalars, scratch, test switches): required when device is CUDA, unused
  // (nullptr) on the CPU. Owned by a DeviceStateHandle (below) that outlives every context pointing at it.
  cuda::DeviceState* gpu = nullptr;
  // --timing-log-level: the Timers each op reports its category to (backend/ops.cpp); null: untimed. The
  // trainer sets its own on the model's context for the training loop, none for evaluation.
  Timers* timers = nullptr;
  // Which linear layer and GEMM pass the op serves (the roofline report's row; core/op_cost.h). Set by
  // the model; no op reads it.
  OpTag tag{};
};
// ctx with the tag's linear layer / pass set.
inline OpContext with_linear(OpContext ctx, LinearKind k) {
  ctx.tag.linear = k;
  return ctx;
}
inline OpContext with_pass(OpContext ctx, GemmPass p) {
  ctx.tag.pass = p;
  return ctx;
}
// Inside a two-phase op (core/op_cost.h OpCost): the backend marks where its first phase ends.
void op_next_phase(const OpContext& ctx);

// The owner of a device's state: the application (or a test helper) opens it once, before the model,
// and lets every OpContext of that device point at it (ctx.gpu = handle.get()).
struct DeviceStateDeleter {
  void operator()(cuda::DeviceState* s) const;
};
using DeviceStateHandle = std::unique_ptr<cuda::DeviceState, DeviceStateDeleter>;
// CPU: an empty handle. CUDA: opens the current GPU (its properties, library handles, workspace,
// device scalars; one line of error on a GPU older than kMinCudaSm, on one this build has no device
// code for, or without a CUDA backend). Nothing it creates is allocated again in the training loop.
DeviceStateHandle open_device_state(Device device);
// The compute capability (major*10 + minor) of ctx's GPU, or 0 on the CPU / without a device state.
int device_sm(const OpContext& ctx);

// Document-aware attention (Megatron's --reset-attention-mask, issue 27): the micro-batch's T = batch*seq
// tokens, flattened sample by sample, form `count` documents; document i is the tokens
// [offsets[i], offsets[i+1]) with offsets[0] = 0 and offsets[count] = T. Every sample boundary is also a
// document boundary (a document lies inside one sample, so it is at most seq tokens long) and no document
// is empty. Attention is causal within each document and nothing crosses a boundary (block-diagonal).
// count == 0: no boundaries, causal over each sample (the default).
// `host` always holds the count+1 offsets (the CPU reads them; the CUDA backend buckets its graphs by
// count); `device` holds the same values in memory of the CUDA device (uploaded by the model with the
// micro-batch; unused on the CPU). The pointers are the caller's and outlive the op's call.
struct DocumentBoundaries {
  const int32_t* host = nullptr;
  const int32_t* device = nullptr;
  int64_t count = 0;
};
// Per-token RoPE positions (Megatron's --reset-position-ids, issue 27): position of token t of the flattened
// T = batch*seq tokens, in [0, seq). `host` (always, when given: the CPU reads it, the checks validate it) and
// `device` (the same T values on the CUDA device, uploaded by the model with the micro-batch). Both null: t % seq
// (the default). The pointers are the caller's and outlive the op's call.
struct TokenPositions {
  const int32_t* host = nullptr;
  const int32_t* device = nullptr;
};
struct AttentionShape {
  int64_t batch, seq, q_heads, kv_heads, head_dim;
  DocumentBoundaries docs{};
};
struct AdamWStep {
  float lr, beta1, beta2, eps, weight_decay;
  int64_t step;      // 1-based optimizer step (bias correction)
  float grad_scale;  // clip coefficient
};
// Sorted, disjoint [begin, end) element ranges of a flat buffer (begin0, end0, begin1, end1, ...):
// `host` always (the CPU backend reads it, every backend validates against it); `device` the same
// 2*count int64 values in memory of the CUDA device, uploaded once by the caller (train/optimizer.cpp at
// construction), read by the CUDA kernel; unused on the CPU.
struct ElementRanges {
  const int64_t* host = nullptr;
  const int64_t* device = nullptr;
  int64_t count = 0;
};

#define PL_OP(name, ret, timer, params, args) ret name params;
#define PL_QUANT_OP(name, ret, timer, params, args)
#include "backend/op_list.h"

// One AdamW step over a flat range: adamw_update_multi without no-decay ranges (step.weight_decay everywhere).
void adamw_update(const OpContext& ctx, const Tensor& param, const Tensor& master, const Tensor& grad,
                  const Tensor& m, const Tensor& v, const AdamWStep& step);

}  // namespace pl
