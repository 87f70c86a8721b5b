#pragma once
// The CPU attention's BF16-GEMM path (attention_bf16.cpp): taken by attention.cpp when the activations are
// BF16 values (ctx.round_bf16) and the CPU GEMM engine is oneDNN BF16; the FP32 path in attention.cpp
// otherwise.
#include "backend/ops.h"

namespace pl::cpu {

// AttentionShape::docs (--reset-attention-mask) as per-token spans in sample coordinates: query (b, i) attends
// to keys [lo(b, i), i] and key (b, j) is attended by queries [j, hi(b, j)), its document's first position and
// one past its last. Without documents: [0, i] and [j, S) (causal over the sample).
struct DocumentSpans {
  const int32_t* start = nullptr;  // [B*S]: the token's document's first position in its sample, or null
  const int32_t* end = nullptr;    // [B*S]: one past its last position, or null
  int64_t S = 0;
  int64_t lo(int64_t b, int64_t i) const { return start != nullptr ? start[b * S + i] : 0; }
  int64_t hi(int64_t b, int64_t j) const { return end != nullptr ? end[b * S + j] : S; }
};
// Expands s.docs (already checked against backend/ops.h's rules by the op's checks, op_checks.cpp) into the
// calling thread's scratch (grow-only), valid until its next call (attention.cpp).
DocumentSpans document_spans(const AttentionShape& s);

// True when attention_forward / attention_backward take the BF16-GEMM path for this context.
bool attention_bf16_path(const OpContext& ctx);

// attention_forward's contract (backend/op_list.h) on that path.
void attention_forward_bf16(const Tensor& out, const Tensor& lse, const Tensor& qkv, const AttentionShape& s,
                            const DocumentSpans& docs);

// attention_backward's contract on that path, given D [B, nq, S] = dO_i·O_i (computed by attention.cpp).
void attention_backward_bf16(const Tensor& dqkv, const Tensor& dout, const Tensor& lse, const Tensor& qkv,
                             const AttentionShape& s, const DocumentSpans& docs, const float* D);

}  // namespace pl::cpu
