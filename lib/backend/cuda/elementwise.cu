// CUDA elementwise ops (see backend/ops.h; CPU twin backend/cpu/elementwise.cpp).
// add: out = bf16(a + b), one element per thread (grid-stride); out may alias a or b since each
// element is read before it is written by the same thread. The fp32 add and the shared rounding
// make it bit-identical to the CPU. accumulate_bf16: acc = bf16(acc + delta) with an fp32 delta, the same
// way. fill_zero: cudaMemsetAsync on the compute stream (all-zero bytes
// are 0 in every dtype).
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/op_util.cuh"

namespace pl::cuda {

namespace {

constexpr int kThreads = 256;

// out, a, b: [n] bf16
__global__ void add_kernel(uint16_t* out, const uint16_t* a, const uint16_t* b, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    store_bf16(out, i, load_bf16(a, i) + load_bf16(b, i));
}

// acc [n] bf16 += delta [n] f32, rounded once
__global__ void accumulate_bf16_kernel(uint16_t* acc, const float* delta, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    store_bf16(acc, i, load_bf16(acc, i) + delta[i]);
}

}  // namespace

void accumulate_bf16(const OpContext& ctx, const Tensor& acc, const Tensor& delta) {
  constexpr const char* op = "accumulate_bf16";
  const int64_t n = acc.numel();
  if (n == 0) return;
  accumulate_bf16_kernel<<<grid_capped(n, kThreads), kThreads, 0, ctx.gpu->stream>>>(bf16_out(acc), f32_in(delta), n);
  check_launch(*ctx.gpu, op, "acc " + acc.shape_str());
}

void add(const OpContext& ctx, const Tensor& out, const Tensor& a, const Tensor& b) {
  constexpr const char* op = "add";
  const int64_t n = out.numel();
  if (n == 0) return;
  add_kernel<<<grid_capped(n, kThreads), kThreads, 0, ctx.gpu->stream>>>(bf16_out(out), bf16_in(a), bf16_in(b), n);
  check_launch(*ctx.gpu, op, "out " + out.shape_str());
}

void fill_zero(const OpContext& ctx, const Tensor& x) {
  constexpr const char* op = "fill_zero";
  if (x.numel() == 0) return;
  check(cudaMemsetAsync(x.data, 0, x.bytes(), ctx.gpu->stream), op, "x " + x.shape_str());
}

}  // namespace pl::cuda
