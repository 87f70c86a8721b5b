#pragma once
// The CPU attention's BF16-GEMM path (attention_bf16.cpp): taken by attention.cpp when the activations are
// BF16 values (ctx.round_bf16) and the CPU GEMM engine is oneDNN BF16; the FP32 path in attention.cpp
// otherwise.
#include "backend/ops.h"

namespace pl::cpu {

// True when attention_forward / attention_backward take the BF16-GEMM path for this context.
bool attention_bf16_path(const OpContext& ctx);

// attention_forward's contract (backend/op_list.h) on that path.
void attention_forward_bf16(const Tensor& out, const Tensor& lse, const Tensor& qkv, const AttentionShape& s);

// attention_backward's contract on that path, given D [B, nq, S] = dO_i·O_i (computed by attention.cpp).
void attention_backward_bf16(const Tensor& dqkv, const Tensor& dout, const Tensor& lse, const Tensor& qkv,
                             const AttentionShape& s, const float* D);

}  // namespace pl::cpu
