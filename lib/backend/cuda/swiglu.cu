// CUDA SwiGLU (see backend/ops.h; CPU twin backend/cpu/swiglu.cpp): fc1[T, 2f] = [gate | up],
// out = silu(gate) * up, silu(g) = g / (1 + exp(-g)). One thread per (t, i) (per 8 adjacent i with
// 16-byte accesses when f is a multiple of 8 and the rows are aligned, op_util.cuh), the CPU's float
// expressions in its order (FMA contraction off on both sides), bf16 outputs rounded with the
// shared numerics. The exponential is num::exp_f32 (numerics/exp.h), the same FP32 operations as the
// CPU's, so the results are the CPU's bit for bit (until issue 25 each side called its own expf, and a
// result could land on the neighbouring bf16 value).
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/op_util.cuh"
#include "numerics/swiglu.h"

namespace pl::cuda {

namespace {

constexpr int kThreads = 256;

// out[T,f] bf16, fc1[T,2f] bf16
__global__ void swiglu_forward_kernel(uint16_t* out, const uint16_t* fc1, int64_t T, int64_t f) {
  const int64_t n = T * f;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / f, i = idx - t * f;
    const uint16_t* gate = fc1 + t * 2 * f;
    store_bf16(out, idx, num::swiglu(load_bf16(gate, i), load_bf16(gate + f, i)));
  }
}

// dfc1[T,2f] bf16 (overwritten), dout[T,f] bf16, fc1[T,2f] bf16
__global__ void swiglu_backward_kernel(uint16_t* dfc1, const uint16_t* dout, const uint16_t* fc1, int64_t T,
                                       int64_t f) {
  const int64_t n = T * f;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / f, i = idx - t * f;
    const uint16_t* gate = fc1 + t * 2 * f;
    float dg, du;
    num::swiglu_backward(load_bf16(gate, i), load_bf16(gate + f, i), load_bf16(dout, idx), dg, du);
    uint16_t* dgate = dfc1 + t * 2 * f;
    store_bf16(dgate, i, dg);
    store_bf16(dgate + f, i, du);
  }
}

// The 16-byte forms (op_util.cuh; f a multiple of 8, rows aligned): one thread per 8 adjacent outputs
// of a row, grid-stride over the T*f/8 vectors; the same per-element expressions.
__global__ void swiglu_forward_vec_kernel(uint16_t* out, const uint16_t* fc1, int64_t T, int64_t f) {
  const int64_t vectors = T * f / kVec;
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < vectors;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t idx = v * kVec, t = idx / f, i = idx - t * f;
    const uint16_t* gate = fc1 + t * 2 * f + i;
    float g[kVec], u[kVec];
    load8_bf16(gate, g);
    load8_bf16(gate + f, u);
#pragma unroll
    for (int j = 0; j < kVec; ++j) g[j] = num::swiglu(g[j], u[j]);
    store8_bf16(out + idx, g);
  }
}

__global__ void swiglu_backward_vec_kernel(uint16_t* dfc1, const uint16_t* dout, const uint16_t* fc1, int64_t T,
                                           int64_t f) {
  const int64_t vectors = T * f / kVec;
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < vectors;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t idx = v * kVec, t = idx / f, i = idx - t * f;
    const uint16_t* gate = fc1 + t * 2 * f + i;
    float g[kVec], u[kVec], d[kVec], dg[kVec], du[kVec];
    load8_bf16(gate, g);
    load8_bf16(gate + f, u);
    load8_bf16(dout + idx, d);
#pragma unroll
    for (int j = 0; j < kVec; ++j) num::swiglu_backward(g[j], u[j], d[j], dg[j], du[j]);
    uint16_t* dgate = dfc1 + t * 2 * f + i;
    store8_bf16(dgate, dg);
    store8_bf16(dgate + f, du);
  }
}

}  // namespace

void swiglu_forward(const OpContext& ctx, const Tensor& out, const Tensor& fc1) {
  constexpr const char* op = "swiglu_forward";
  const int64_t T = out.dim(0), f = out.dim(1);
  if (T * f == 0) return;
  if (rows_aligned16(out.data, f) && is_aligned16(fc1.data))
    swiglu_forward_vec_kernel<<<grid_capped(T * f / kVec, kThreads), kThreads, 0, ctx.gpu->stream>>>(
        bf16_out(out), bf16_in(fc1), T, f);
  else
    swiglu_forward_kernel<<<grid_capped(T * f, kThreads), kThreads, 0, ctx.gpu->stream>>>(bf16_out(out), bf16_in(fc1),
                                                                                          T, f);
  check_launch(*ctx.gpu, op, "out " + dims(T, f));
}

void swiglu_backward(const OpContext& ctx, const Tensor& dfc1, const Tensor& dout, const Tensor& fc1) {
  constexpr const char* op = "swiglu_backward";
  const int64_t T = dout.dim(0), f = dout.dim(1);
  if (T * f == 0) return;
  if (rows_aligned16(dout.data, f) && is_aligned16(dfc1.data) && is_aligned16(fc1.data))
    swiglu_backward_vec_kernel<<<grid_capped(T * f / kVec, kThreads), kThreads, 0, ctx.gpu->stream>>>(
        bf16_out(dfc1), bf16_in(dout), bf16_in(fc1), T, f);
  else
    swiglu_backward_kernel<<<grid_capped(T * f, kThreads), kThreads, 0, ctx.gpu->stream>>>(
        bf16_out(dfc1), bf16_in(dout), bf16_in(fc1), T, f);
  check_launch(*ctx.gpu, op, "dout " + dims(T, f));
}

}  // namespace pl::cuda
