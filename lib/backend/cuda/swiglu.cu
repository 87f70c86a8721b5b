// CUDA SwiGLU (see backend/ops.h; CPU twin backend/cpu/swiglu.cpp): fc1[T, 2f] = [gate | up],
// out = silu(gate) * up, silu(g) = g / (1 + exp(-g)). One thread per (t, i) (per 8 adjacent i with
// 16-byte accesses when f is a multiple of 8 and the rows are aligned, op_util.cuh), the CPU's float
// expressions in its order (FMA contraction off on both sides), bf16 outputs rounded with the
// shared numerics. The exponential is num::exp_f32 (numerics/exp.h), the same FP32 operations as the
// CPU's, so the results are the CPU's bit for bit (until issue 25 each side called its own expf, and a
// result could land on the neighbouring bf16 value). out_amax / dfc1_amax (op_list.h): each thread's max
// |stored value| reduced over the grid in the same launch (qk::reduce_out_amax).
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/op_util.cuh"
#include "backend/cuda/quantize_common.cuh"
#include "numerics/swiglu.h"

namespace pl::cuda {

namespace {

constexpr int kThreads = 256;

// The amax reduction of the four kernels (one set: they run in order on the compute stream).
__device__ qk::AmaxCombine g_swiglu_amax_combine;

// v stored as BF16 at p[i], and max |stored| folded into m.
__device__ __forceinline__ void store_bf16_amax(uint16_t* p, int64_t i, float v, float& m) {
  store_bf16(p, i, v);
  m = qk::max_abs(m, num::round_bf16(v));
}
// 8 values stored as BF16 at p (16-byte aligned), and their max |stored| folded into m.
__device__ __forceinline__ void store8_bf16_amax(uint16_t* p, const float (&v)[kVec], float& m) {
  store8_bf16(p, v);
#pragma unroll
  for (int j = 0; j < kVec; ++j) m = qk::max_abs(m, num::round_bf16(v[j]));
}

// out[T,f] bf16, fc1[T,2f] bf16
__global__ void swiglu_forward_kernel(uint16_t* out, const uint16_t* fc1, int64_t T, int64_t f, qk::OutAmax amax) {
  const int64_t n = T * f;
  float m = 0.0f;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / f, i = idx - t * f;
    const uint16_t* gate = fc1 + t * 2 * f;
    store_bf16_amax(out, idx, num::swiglu(load_bf16(gate, i), load_bf16(gate + f, i)), m);
  }
  if (amax.wanted()) qk::reduce_out_amax(g_swiglu_amax_combine, m, amax);
}

// dfc1[T,2f] bf16 (overwritten), dout[T,f] bf16, fc1[T,2f] bf16
__global__ void swiglu_backward_kernel(uint16_t* dfc1, const uint16_t* dout, const uint16_t* fc1, int64_t T,
                                       int64_t f, qk::OutAmax amax) {
  const int64_t n = T * f;
  float m = 0.0f;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / f, i = idx - t * f;
    const uint16_t* gate = fc1 + t * 2 * f;
    float dg, du;
    num::swiglu_backward(load_bf16(gate, i), load_bf16(gate + f, i), load_bf16(dout, idx), dg, du);
    uint16_t* dgate = dfc1 + t * 2 * f;
    store_bf16_amax(dgate, i, dg, m);
    store_bf16_amax(dgate + f, i, du, m);
  }
  if (amax.wanted()) qk::reduce_out_amax(g_swiglu_amax_combine, m, amax);
}

// The 16-byte forms (op_util.cuh; f a multiple of 8, rows aligned): one thread per 8 adjacent outputs
// of a row, grid-stride over the T*f/8 vectors; the same per-element expressions.
__global__ void swiglu_forward_vec_kernel(uint16_t* out, const uint16_t* fc1, int64_t T, int64_t f,
                                          qk::OutAmax amax) {
  const int64_t vectors = T * f / kVec;
  float m = 0.0f;
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < vectors;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t idx = v * kVec, t = idx / f, i = idx - t * f;
    const uint16_t* gate = fc1 + t * 2 * f + i;
    float g[kVec], u[kVec];
    load8_bf16(gate, g);
    load8_bf16(gate + f, u);
#pragma unroll
    for (int j = 0; j < kVec; ++j) g[j] = num::swiglu(g[j], u[j]);
    store8_bf16_amax(out + idx, g, m);
  }
  if (amax.wanted()) qk::reduce_out_amax(g_swiglu_amax_combine, m, amax);
}

__global__ void swiglu_backward_vec_kernel(uint16_t* dfc1, const uint16_t* dout, const uint16_t* fc1, int64_t T,
                                           int64_t f, qk::OutAmax amax) {
  const int64_t vectors = T * f / kVec;
  float m = 0.0f;
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
    store8_bf16_amax(dgate, dg, m);
    store8_bf16_amax(dgate + f, du, m);
  }
  if (amax.wanted()) qk::reduce_out_amax(g_swiglu_amax_combine, m, amax);
}

}  // namespace

void swiglu_forward(const OpContext& ctx, const Tensor& out, const Tensor& fc1, const Tensor& out_amax) {
  constexpr const char* op = "swiglu_forward";
  const int64_t T = out.dim(0), f = out.dim(1);
  if (T * f == 0) return qk::zero_out_amax(ctx.gpu->stream, out_amax, op);
  const qk::OutAmax amax = qk::out_amax_slots(out_amax);
  if (rows_aligned16(out.data, f) && is_aligned16(fc1.data))
    swiglu_forward_vec_kernel<<<grid_capped(T * f / kVec, kThreads), kThreads, 0, ctx.gpu->stream>>>(
        bf16_out(out), bf16_in(fc1), T, f, amax);
  else
    swiglu_forward_kernel<<<grid_capped(T * f, kThreads), kThreads, 0, ctx.gpu->stream>>>(bf16_out(out), bf16_in(fc1),
                                                                                          T, f, amax);
  check_launch(*ctx.gpu, op, "out " + dims(T, f));
}

void swiglu_backward(const OpContext& ctx, const Tensor& dfc1, const Tensor& dout, const Tensor& fc1,
                     const Tensor& dfc1_amax) {
  constexpr const char* op = "swiglu_backward";
  const int64_t T = dout.dim(0), f = dout.dim(1);
  if (T * f == 0) return qk::zero_out_amax(ctx.gpu->stream, dfc1_amax, op);
  const qk::OutAmax amax = qk::out_amax_slots(dfc1_amax);
  if (rows_aligned16(dout.data, f) && is_aligned16(dfc1.data) && is_aligned16(fc1.data))
    swiglu_backward_vec_kernel<<<grid_capped(T * f / kVec, kThreads), kThreads, 0, ctx.gpu->stream>>>(
        bf16_out(dfc1), bf16_in(dout), bf16_in(fc1), T, f, amax);
  else
    swiglu_backward_kernel<<<grid_capped(T * f, kThreads), kThreads, 0, ctx.gpu->stream>>>(
        bf16_out(dfc1), bf16_in(dout), bf16_in(fc1), T, f, amax);
  check_launch(*ctx.gpu, op, "dout " + dims(T, f));
}

}  // namespace pl::cuda
