// Dispatch of every op to its backend. A backend that lacks an op fails loudly, naming it.
// Each op is bracketed by an OpTimer of its category (core/timers.h: --timing-log-level); with
// timing off that is one load and one branch per op.
#include "backend/ops.h"

#include "backend/cpu/cpu_ops.h"
#include "core/error.h"
#include "core/timers.h"

#if defined(PL_WITH_CUDA)
#include "backend/cuda/cuda_ops.h"
#endif

namespace pl {

namespace {
[[maybe_unused]] [[noreturn]] void no_cuda_op(const char* op) {
  fail("op {} needs the CUDA backend, which this build does not have (configure with nvcc present)", op);
}
}  // namespace

void linear_forward(const OpContext& ctx, const Tensor& y, const Tensor& x, const Tensor& w) {
  OpTimer timer(TimerId::GemmBf16);
  if (ctx.device == Device::CPU) return cpu::linear_forward(ctx, y, x, w);
#if defined(PL_WITH_CUDA)
  return cuda::linear_forward(ctx, y, x, w);
#else
  no_cuda_op("linear_forward");
#endif
}

void linear_backward_input(const OpContext& ctx, const Tensor& dx, const Tensor& dy, const Tensor& w) {
  OpTimer timer(TimerId::GemmBf16);
  if (ctx.device == Device::CPU) return cpu::linear_backward_input(ctx, dx, dy, w);
#if defined(PL_WITH_CUDA)
  return cuda::linear_backward_input(ctx, dx, dy, w);
#else
  no_cuda_op("linear_backward_input");
#endif
}

void linear_backward_weight(const OpContext& ctx, const Tensor& dw, const Tensor& dy, const Tensor& x) {
  OpTimer timer(TimerId::GemmBf16);
  if (ctx.device == Device::CPU) return cpu::linear_backward_weight(ctx, dw, dy, x);
#if defined(PL_WITH_CUDA)
  return cuda::linear_backward_weight(ctx, dw, dy, x);
#else
  no_cuda_op("linear_backward_weight");
#endif
}

void embedding_forward(const OpContext& ctx, const Tensor& out, const Tensor& tokens, const Tensor& table) {
  OpTimer timer(TimerId::Embedding);
  if (ctx.device == Device::CPU) return cpu::embedding_forward(ctx, out, tokens, table);
#if defined(PL_WITH_CUDA)
  return cuda::embedding_forward(ctx, out, tokens, table);
#else
  no_cuda_op("embedding_forward");
#endif
}

void embedding_backward(const OpContext& ctx, const Tensor& dtable, const Tensor& dout, const Tensor& tokens) {
  OpTimer timer(TimerId::Embedding);
  if (ctx.device == Device::CPU) return cpu::embedding_backward(ctx, dtable, dout, tokens);
#if defined(PL_WITH_CUDA)
  return cuda::embedding_backward(ctx, dtable, dout, tokens);
#else
  no_cuda_op("embedding_backward");
#endif
}

void rmsnorm_forward(const OpContext& ctx, const Tensor& out, const Tensor& rstd, const Tensor& x,
                     const Tensor& w, float eps) {
  OpTimer timer(TimerId::RmsNorm);
  if (ctx.device == Device::CPU) return cpu::rmsnorm_forward(ctx, out, rstd, x, w, eps);
#if defined(PL_WITH_CUDA)
  return cuda::rmsnorm_forward(ctx, out, rstd, x, w, eps);
#else
  no_cuda_op("rmsnorm_forward");
#endif
}

void rmsnorm_backward(const OpContext& ctx, const Tensor& dx, const Tensor& dw, const Tensor& dout,
                      const Tensor& x, const Tensor& w, const Tensor& rstd) {
  OpTimer timer(TimerId::RmsNorm);
  if (ctx.device == Device::CPU) return cpu::rmsnorm_backward(ctx, dx, dw, dout, x, w, rstd);
#if defined(PL_WITH_CUDA)
  return cuda::rmsnorm_backward(ctx, dx, dw, dout, x, w, rstd);
#else
  no_cuda_op("rmsnorm_backward");
#endif
}

void rope_forward(const OpContext& ctx, const Tensor& qkv, const Tensor& cos, const Tensor& sin,
                  int64_t seq_len, int64_t rotated_heads, int64_t head_dim) {
  OpTimer timer(TimerId::Rope);
  if (ctx.device == Device::CPU) return cpu::rope_forward(ctx, qkv, cos, sin, seq_len, rotated_heads, head_dim);
#if defined(PL_WITH_CUDA)
  return cuda::rope_forward(ctx, qkv, cos, sin, seq_len, rotated_heads, head_dim);
#else
  no_cuda_op("rope_forward");
#endif
}

void rope_backward(const OpContext& ctx, const Tensor& dqkv, const Tensor& cos, const Tensor& sin,
                   int64_t seq_len, int64_t rotated_heads, int64_t head_dim) {
  OpTimer timer(TimerId::Rope);
  if (ctx.device == Device::CPU) return cpu::rope_backward(ctx, dqkv, cos, sin, seq_len, rotated_heads, head_dim);
#if defined(PL_WITH_CUDA)
  return cuda::rope_backward(ctx, dqkv, cos, sin, seq_len, rotated_heads, head_dim);
#else
  no_cuda_op("rope_backward");
#endif
}

void attention_forward(const OpContext& ctx, const Tensor& out, const Tensor& lse, const Tensor& qkv,
                       const AttentionShape& s) {
  OpTimer timer(TimerId::Attention);
  if (ctx.device == Device::CPU) return cpu::attention_forward(ctx, out, lse, qkv, s);
#if defined(PL_WITH_CUDA)
  return cuda::attention_forward(ctx, out, lse, qkv, s);
#else
  no_cuda_op("attention_forward");
#endif
}

void attention_backward(const OpContext& ctx, const Tensor& dqkv, const Tensor& dout, const Tensor& out,
                        const Tensor& lse, const Tensor& qkv, const AttentionShape& s) {
  OpTimer timer(TimerId::Attention);
  if (ctx.device == Device::CPU) return cpu::attention_backward(ctx, dqkv, dout, out, lse, qkv, s);
#if defined(PL_WITH_CUDA)
  return cuda::attention_backward(ctx, dqkv, dout, out, lse, qkv, s);
#else
  no_cuda_op("attention_backward");
#endif
}

void swiglu_forward(const OpContext& ctx, const Tensor& out, const Tensor& fc1) {
  OpTimer timer(TimerId::Swiglu);
  if (ctx.device == Device::CPU) return cpu::swiglu_forward(ctx, out, fc1);
#if defined(PL_WITH_CUDA)
  return cuda::swiglu_forward(ctx, out, fc1);
#else
  no_cuda_op("swiglu_forward");
#endif
}

void swiglu_backward(const OpContext& ctx, const Tensor& dfc1, const Tensor& dout, const Tensor& fc1) {
  OpTimer timer(TimerId::Swiglu);
  if (ctx.device == Device::CPU) return cpu::swiglu_backward(ctx, dfc1, dout, fc1);
#if defined(PL_WITH_CUDA)
  return cuda::swiglu_backward(ctx, dfc1, dout, fc1);
#else
  no_cuda_op("swiglu_backward");
#endif
}

void add(const OpContext& ctx, const Tensor& out, const Tensor& a, const Tensor& b) {
  OpTimer timer(TimerId::Elementwise);
  if (ctx.device == Device::CPU) return cpu::add(ctx, out, a, b);
#if defined(PL_WITH_CUDA)
  return cuda::add(ctx, out, a, b);
#else
  no_cuda_op("add");
#endif
}

void fill_zero(const OpContext& ctx, const Tensor& x) {
  OpTimer timer(TimerId::Elementwise);
  if (ctx.device == Device::CPU) return cpu::fill_zero(ctx, x);
#if defined(PL_WITH_CUDA)
  return cuda::fill_zero(ctx, x);
#else
  no_cuda_op("fill_zero");
#endif
}

void cross_entropy_forward_backward(const OpContext& ctx, const Tensor& losses, const Tensor& logits,
                                    const Tensor& targets, float grad_scale) {
  {
    OpTimer timer(TimerId::CrossEntropy);
    if (ctx.device == Device::CPU) {
      cpu::cross_entropy_forward_backward(ctx, losses, logits, targets, grad_scale);
    } else {
#if defined(PL_WITH_CUDA)
      cuda::cross_entropy_forward_backward(ctx, losses, logits, targets, grad_scale);
#else
      no_cuda_op("cross_entropy_forward_backward");
#endif
    }
  }
  // The loss ends the micro-batch's forward (forward-compute -> backward-compute at level 2).
  if (Timers* t = active_timers()) t->mark_loss_computed();
}

double sum_of_squares(const OpContext& ctx, const Tensor& x) {
  OpTimer timer(TimerId::OptimizerClipMainGrad);
  if (ctx.device == Device::CPU) return cpu::sum_of_squares(ctx, x);
#if defined(PL_WITH_CUDA)
  return cuda::sum_of_squares(ctx, x);
#else
  no_cuda_op("sum_of_squares");
#endif
}

// The per-tensor step is the multi-tensor one with no no-decay ranges (step.weight_decay everywhere).
void adamw_update(const OpContext& ctx, const Tensor& param, const Tensor& master, const Tensor& grad,
                  const Tensor& m, const Tensor& v, const AdamWStep& step) {
  adamw_update_multi(ctx, param, master, grad, m, v, ElementRanges{}, step);
}

void adamw_update_multi(const OpContext& ctx, const Tensor& param, const Tensor& master, const Tensor& grad,
                        const Tensor& m, const Tensor& v, const ElementRanges& no_decay, const AdamWStep& step) {
  OpTimer timer(TimerId::OptimizerInnerStep);
  // The range table, checked once for both backends on its host copy (the device copy is the same
  // table, uploaded once by its owner).
  const int64_t n = master.numel();
  PL_CHECK(no_decay.count == 0 || (no_decay.host != nullptr && (ctx.device == Device::CPU || no_decay.device != nullptr)),
           "adamw_update_multi: {} no-decay ranges need the host table{}", no_decay.count,
           ctx.device == Device::CPU ? "" : " and the device table");
  for (int64_t r = 0; r < no_decay.count; ++r) {
    const int64_t b = no_decay.host[2 * r], e = no_decay.host[2 * r + 1];
    const int64_t prev_end = r > 0 ? no_decay.host[2 * r - 1] : 0;
    PL_CHECK(b >= prev_end && b <= e && e <= n,
             "adamw_update_multi: no-decay range {} = [{}, {}) is not sorted, disjoint and inside the {} elements", r,
             b, e, n);
  }
  if (ctx.device == Device::CPU) return cpu::adamw_update_multi(ctx, param, master, grad, m, v, no_decay, step);
#if defined(PL_WITH_CUDA)
  return cuda::adamw_update_multi(ctx, param, master, grad, m, v, no_decay, step);
#else
  no_cuda_op("adamw_update_multi");
#endif
}

void copy_master_to_param(const OpContext& ctx, const Tensor& param, const Tensor& master) {
  OpTimer timer(TimerId::Elementwise);
  if (ctx.device == Device::CPU) return cpu::copy_master_to_param(ctx, param, master);
#if defined(PL_WITH_CUDA)
  return cuda::copy_master_to_param(ctx, param, master);
#else
  no_cuda_op("copy_master_to_param");
#endif
}

}  // namespace pl
