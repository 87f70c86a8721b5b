// PENDING: failing placeholders for CUDA ops not written yet. Each definition is removed when its
// real implementation lands in a .cu file; this file is deleted when it is empty.
#include "backend/cuda/cuda_ops.h"
#include "core/error.h"

#pragma GCC diagnostic ignored "-Wunused-parameter"

namespace pl::cuda {

void embedding_forward(const OpContext&, const Tensor& out, const Tensor& tokens, const Tensor& table) {
  fail("op embedding_forward is not implemented on the CUDA backend yet");
}

void embedding_backward(const OpContext&, const Tensor& dtable, const Tensor& dout, const Tensor& tokens) {
  fail("op embedding_backward is not implemented on the CUDA backend yet");
}

void rmsnorm_forward(const OpContext&, const Tensor& out, const Tensor& rstd, const Tensor& x, const Tensor& w, float eps) {
  fail("op rmsnorm_forward is not implemented on the CUDA backend yet");
}

void rmsnorm_backward(const OpContext&, const Tensor& dx, const Tensor& dw, const Tensor& dout, const Tensor& x, const Tensor& w, const Tensor& rstd) {
  fail("op rmsnorm_backward is not implemented on the CUDA backend yet");
}

void rope_forward(const OpContext&, const Tensor& qkv, const Tensor& cos, const Tensor& sin, int64_t seq_len, int64_t rotated_heads, int64_t head_dim) {
  fail("op rope_forward is not implemented on the CUDA backend yet");
}

void rope_backward(const OpContext&, const Tensor& dqkv, const Tensor& cos, const Tensor& sin, int64_t seq_len, int64_t rotated_heads, int64_t head_dim) {
  fail("op rope_backward is not implemented on the CUDA backend yet");
}

void swiglu_forward(const OpContext&, const Tensor& out, const Tensor& fc1) {
  fail("op swiglu_forward is not implemented on the CUDA backend yet");
}

void swiglu_backward(const OpContext&, const Tensor& dfc1, const Tensor& dout, const Tensor& fc1) {
  fail("op swiglu_backward is not implemented on the CUDA backend yet");
}

void add(const OpContext&, const Tensor& out, const Tensor& a, const Tensor& b) {
  fail("op add is not implemented on the CUDA backend yet");
}

void fill_zero(const OpContext&, const Tensor& x) {
  fail("op fill_zero is not implemented on the CUDA backend yet");
}

void cross_entropy_forward_backward(const OpContext&, const Tensor& losses, const Tensor& logits, const Tensor& targets, float grad_scale) {
  fail("op cross_entropy_forward_backward is not implemented on the CUDA backend yet");
}

double sum_of_squares(const OpContext&, const Tensor& x) {
  fail("op sum_of_squares is not implemented on the CUDA backend yet");
}

void adamw_update(const OpContext&, const Tensor& param, const Tensor& master, const Tensor& grad, const Tensor& m, const Tensor& v, const AdamWStep& step) {
  fail("op adamw_update is not implemented on the CUDA backend yet");
}

void copy_master_to_param(const OpContext&, const Tensor& param, const Tensor& master) {
  fail("op copy_master_to_param is not implemented on the CUDA backend yet");
}

}  // namespace pl::cuda
