// Dispatch of every op to its backend. A backend that lacks an op fails loudly, naming it.
#include "backend/ops.h"

#include "backend/cpu/cpu_ops.h"
#include "core/error.h"

namespace pl {

namespace {
[[noreturn]] void no_cuda_op(const char* op) {
  fail("op {} is not implemented on the CUDA backend yet (run with --device cpu)", op);
}
}  // namespace

void linear_forward(const OpContext& ctx, const Tensor& y, const Tensor& x, const Tensor& w) {
  if (ctx.device == Device::CPU) return cpu::linear_forward(ctx, y, x, w);
  no_cuda_op("linear_forward");
}

void linear_backward_input(const OpContext& ctx, const Tensor& dx, const Tensor& dy, const Tensor& w) {
  if (ctx.device == Device::CPU) return cpu::linear_backward_input(ctx, dx, dy, w);
  no_cuda_op("linear_backward_input");
}

void linear_backward_weight(const OpContext& ctx, const Tensor& dw, const Tensor& dy, const Tensor& x) {
  if (ctx.device == Device::CPU) return cpu::linear_backward_weight(ctx, dw, dy, x);
  no_cuda_op("linear_backward_weight");
}

void embedding_forward(const OpContext& ctx, const Tensor& out, const Tensor& tokens, const Tensor& table) {
  if (ctx.device == Device::CPU) return cpu::embedding_forward(ctx, out, tokens, table);
  no_cuda_op("embedding_forward");
}

void embedding_backward(const OpContext& ctx, const Tensor& dtable, const Tensor& dout, const Tensor& tokens) {
  if (ctx.device == Device::CPU) return cpu::embedding_backward(ctx, dtable, dout, tokens);
  no_cuda_op("embedding_backward");
}

void rmsnorm_forward(const OpContext& ctx, const Tensor& out, const Tensor& rstd, const Tensor& x,
                     const Tensor& w, float eps) {
  if (ctx.device == Device::CPU) return cpu::rmsnorm_forward(ctx, out, rstd, x, w, eps);
  no_cuda_op("rmsnorm_forward");
}

void rmsnorm_backward(const OpContext& ctx, const Tensor& dx, const Tensor& dw, const Tensor& dout,
                      const Tensor& x, const Tensor& w, const Tensor& rstd) {
  if (ctx.device == Device::CPU) return cpu::rmsnorm_backward(ctx, dx, dw, dout, x, w, rstd);
  no_cuda_op("rmsnorm_backward");
}

void rope_forward(const OpContext& ctx, const Tensor& qkv, const Tensor& cos, const Tensor& sin,
                  int64_t seq_len, int64_t rotated_heads, int64_t head_dim) {
  if (ctx.device == Device::CPU) return cpu::rope_forward(ctx, qkv, cos, sin, seq_len, rotated_heads, head_dim);
  no_cuda_op("rope_forward");
}

void rope_backward(const OpContext& ctx, const Tensor& dqkv, const Tensor& cos, const Tensor& sin,
                   int64_t seq_len, int64_t rotated_heads, int64_t head_dim) {
  if (ctx.device == Device::CPU) return cpu::rope_backward(ctx, dqkv, cos, sin, seq_len, rotated_heads, head_dim);
  no_cuda_op("rope_backward");
}

void attention_forward(const OpContext& ctx, const Tensor& out, const Tensor& lse, const Tensor& qkv,
                       const AttentionShape& s) {
  if (ctx.device == Device::CPU) return cpu::attention_forward(ctx, out, lse, qkv, s);
  no_cuda_op("attention_forward");
}

void attention_backward(const OpContext& ctx, const Tensor& dqkv, const Tensor& dout, const Tensor& out,
                        const Tensor& lse, const Tensor& qkv, const AttentionShape& s) {
  if (ctx.device == Device::CPU) return cpu::attention_backward(ctx, dqkv, dout, out, lse, qkv, s);
  no_cuda_op("attention_backward");
}

void swiglu_forward(const OpContext& ctx, const Tensor& out, const Tensor& fc1) {
  if (ctx.device == Device::CPU) return cpu::swiglu_forward(ctx, out, fc1);
  no_cuda_op("swiglu_forward");
}

void swiglu_backward(const OpContext& ctx, const Tensor& dfc1, const Tensor& dout, const Tensor& fc1) {
  if (ctx.device == Device::CPU) return cpu::swiglu_backward(ctx, dfc1, dout, fc1);
  no_cuda_op("swiglu_backward");
}

void add(const OpContext& ctx, const Tensor& out, const Tensor& a, const Tensor& b) {
  if (ctx.device == Device::CPU) return cpu::add(ctx, out, a, b);
  no_cuda_op("add");
}

void fill_zero(const OpContext& ctx, const Tensor& x) {
  if (ctx.device == Device::CPU) return cpu::fill_zero(ctx, x);
  no_cuda_op("fill_zero");
}

void cross_entropy_forward_backward(const OpContext& ctx, const Tensor& losses, const Tensor& logits,
                                    const Tensor& targets, float grad_scale) {
  if (ctx.device == Device::CPU) return cpu::cross_entropy_forward_backward(ctx, losses, logits, targets, grad_scale);
  no_cuda_op("cross_entropy_forward_backward");
}

double sum_of_squares(const OpContext& ctx, const Tensor& x) {
  if (ctx.device == Device::CPU) return cpu::sum_of_squares(ctx, x);
  no_cuda_op("sum_of_squares");
}

void adamw_update(const OpContext& ctx, const Tensor& param, const Tensor& master, const Tensor& grad,
                  const Tensor& m, const Tensor& v, const AdamWStep& step) {
  if (ctx.device == Device::CPU) return cpu::adamw_update(ctx, param, master, grad, m, v, step);
  no_cuda_op("adamw_update");
}

void copy_master_to_param(const OpContext& ctx, const Tensor& param, const Tensor& master) {
  if (ctx.device == Device::CPU) return cpu::copy_master_to_param(ctx, param, master);
  no_cuda_op("copy_master_to_param");
}

}  // namespace pl
