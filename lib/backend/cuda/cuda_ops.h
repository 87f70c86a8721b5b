#pragma once
// CUDA implementations of the ops in backend/ops.h (same signatures; see there for shapes and
// semantics). One .cu per op family under backend/cuda/, the kernel and its launcher together.
// Storage on the GPU: "bf16 activation" tensors and the weights are DType::BF16; fp32 accumulators,
// rstd, lse, losses, master weights and moments are F32; token ids I32.
#include "backend/ops.h"
#include "backend/quantize.h"

namespace pl::cuda {

void linear_forward(const OpContext& ctx, const Tensor& y, const Tensor& x, const Tensor& w);
void linear_backward_input(const OpContext& ctx, const Tensor& dx, const Tensor& dy, const Tensor& w);
void linear_backward_weight(const OpContext& ctx, const Tensor& dw, const Tensor& dy, const Tensor& x);
void embedding_forward(const OpContext& ctx, const Tensor& out, const Tensor& tokens, const Tensor& table);
void embedding_backward(const OpContext& ctx, const Tensor& dtable, const Tensor& dout, const Tensor& tokens);
void rmsnorm_forward(const OpContext& ctx, const Tensor& out, const Tensor& rstd, const Tensor& x,
                     const Tensor& w, float eps);
void rmsnorm_backward(const OpContext& ctx, const Tensor& dx, const Tensor& dw, const Tensor& dout,
                      const Tensor& x, const Tensor& w, const Tensor& rstd);
void rope_forward(const OpContext& ctx, const Tensor& qkv, const Tensor& cos, const Tensor& sin,
                  int64_t seq_len, int64_t rotated_heads, int64_t head_dim);
void rope_backward(const OpContext& ctx, const Tensor& dqkv, const Tensor& cos, const Tensor& sin,
                   int64_t seq_len, int64_t rotated_heads, int64_t head_dim);
void attention_forward(const OpContext& ctx, const Tensor& out, const Tensor& lse, const Tensor& qkv,
                       const AttentionShape& s);
void attention_backward(const OpContext& ctx, const Tensor& dqkv, const Tensor& dout, const Tensor& out,
                        const Tensor& lse, const Tensor& qkv, const AttentionShape& s);
void swiglu_forward(const OpContext& ctx, const Tensor& out, const Tensor& fc1);
void swiglu_backward(const OpContext& ctx, const Tensor& dfc1, const Tensor& dout, const Tensor& fc1);
void add(const OpContext& ctx, const Tensor& out, const Tensor& a, const Tensor& b);
void fill_zero(const OpContext& ctx, const Tensor& x);
void cross_entropy_forward_backward(const OpContext& ctx, const Tensor& losses, const Tensor& logits,
                                    const Tensor& targets, float grad_scale);
double sum_of_squares(const OpContext& ctx, const Tensor& x);
void adamw_update(const OpContext& ctx, const Tensor& param, const Tensor& master, const Tensor& grad,
                  const Tensor& m, const Tensor& v, const AdamWStep& step);
void copy_master_to_param(const OpContext& ctx, const Tensor& param, const Tensor& master);

// backend/quantize.h
void quantize(const OpContext& ctx, QuantizedTensor& q, const Tensor& x, const QuantizeOptions& opt);
void dequantize(const OpContext& ctx, const Tensor& out, const QuantizedCopy& c, QuantFormat format);
void quantized_gemm(const OpContext& ctx, const Tensor& y, const QuantizedCopy& a, const QuantizedCopy& b,
                    QuantFormat format, bool accumulate, const Tensor& scratch_a, const Tensor& scratch_b);
QuantStats quant_stats(const OpContext& ctx, const QuantizedCopy& c, QuantFormat format, const Tensor& reference);
void columnwise_source(const OpContext& ctx, const Tensor& out, const Tensor& x, bool rht);

}  // namespace pl::cuda
