// CUDA fused softmax cross-entropy (see backend/ops.h; CPU twin backend/cpu/cross_entropy.cpp).
//
// grid: T blocks, one per row; block: kThreads threads striding over the V logits (bf16 in place;
// no fp32 copy of the row; kThreads / 8 threads moving 8 bf16 per access when V is a multiple of 8 and
// the logits are 16-byte aligned, op_util.cuh). Three passes over the row (it stays in L2 between them):
//   1. m = max (fp32; exact in any order), CUB BlockReduce;
//   2. Σ exp(x - m), each exp fp32, summed in fp32 in the CPU's schedule (numerics/reduce.h: thread k
//      is lane k of num::lane_sum with kCrossEntropyLanes lanes, num::block_tree_sum combines them);
//      losses[t] = log(Σ) - (x[target] - m), x[target] read before any write;
//   3. unless grad_scale == 0: x = bf16(grad_scale * (exp(x - m) * (1/Σ) - onehot)), the exponentials
//      recomputed (same inputs, same num::exp_f32, so the same values as in pass 2).
// The expressions, the exponential (num::exp_f32 of numerics/exp.h: the CPU's FP32 operations, compiled
// with --fmad=false, so the same bits; until issue 25 this kernel called CUDA's expf, up to 2 ulp from
// glibc's) and the summation order are the CPU's; the one difference left is logf (CUDA's within 1 ulp,
// glibc's nearly always correctly rounded), once per row, in the loss only. No FP64.
// A target of -1 is ignored (a masked position, --eod-mask-loss; op_list.h): loss 0 and, unless grad_scale = 0,
// a row of zeros as its gradient (ignored_row).
// Targets are validated on the host before they are uploaded (LlamaModel checks every label), so
// there is no device index flag and no host round trip here; a target outside [0, V) that reaches the
// kernel anyway leaves its row untouched and gets a NaN loss (never an out-of-bounds access).
#include <cub/cub.cuh>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/op_util.cuh"
#include "numerics/exp.h"
#include "numerics/reduce.h"

namespace pl::cuda {

namespace {

constexpr int kThreads = num::kCrossEntropyLanes;  // one thread per lane of the exp sum

// The CPU's max expression (a NaN never replaces the running max).
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return b > a ? b : a; }
};

// The row of an ignored target (-1): loss 0, its dlogits 0 (bf16 zero bits) unless grad_scale == 0. Threads
// stride by the block size; no barrier (the caller returns uniformly over the block).
__device__ __forceinline__ void ignored_row(float* losses, uint16_t* logits, int64_t t, int64_t V, float grad_scale) {
  if (threadIdx.x == 0) losses[t] = 0.0f;
  if (grad_scale == 0.0f) return;
  uint16_t* row = logits + t * V;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) row[j] = 0;
}

// losses[T] f32, logits[T,V] bf16 (overwritten with dlogits unless grad_scale == 0), targets[T] i32
__global__ void cross_entropy_kernel(float* losses, uint16_t* logits, const int32_t* targets, int64_t V,
                                     float grad_scale) {
  __shared__ typename cub::BlockReduce<float, kThreads>::TempStorage max_temp;
  __shared__ float lanes[kThreads];
  __shared__ float m_shared;
  const int64_t t = blockIdx.x;
  const int32_t y = targets[t];
  if (y == -1) {  // uniform over the block, before any barrier
    ignored_row(losses, logits, t, V, grad_scale);
    return;
  }
  if (y < 0 || y >= V) {  // uniform over the block: every thread returns before any barrier
    if (threadIdx.x == 0) losses[t] = __int_as_float(0x7FC00000);  // NaN (the host validates targets)
    return;
  }
  uint16_t* row = logits + t * V;

  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < V; j += kThreads) m = MaxOp()(m, load_bf16(row, j));
  m = cub::BlockReduce<float, kThreads>(max_temp).Reduce(m, MaxOp());
  if (threadIdx.x == 0) m_shared = m;
  __syncthreads();
  m = m_shared;

  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < V; j += kThreads) s = s + num::exp_f32(load_bf16(row, j) - m);
  const float sum = num::block_tree_sum<kThreads>(s, lanes);
  if (threadIdx.x == 0) losses[t] = logf(sum) - (load_bf16(row, y) - m);
  __syncthreads();  // row[y] has been read; the row may be overwritten from here on
  if (grad_scale == 0.0f) return;
  const float inv = 1.0f / sum;
  for (int64_t j = threadIdx.x; j < V; j += kThreads) {
    const float p = num::exp_f32(load_bf16(row, j) - m) * inv;
    store_bf16(row, j, grad_scale * (j == y ? p - 1.0f : p));
  }
}

// The 16-byte form (V a multiple of 8, logits aligned): kVecThreads = 512 / 8 threads a row, thread k
// holding lanes 8k..8k+7 (element m*512 + 8k + j in lane 8k + j: the scalar kernel's lane j % 512, in
// increasing m), combined by the same tree (vec_lane_tree_sum); the same three passes and expressions.
constexpr int kVecThreads = kThreads / kVec;

__global__ void cross_entropy_vec_kernel(float* losses, uint16_t* logits, const int32_t* targets, int64_t V,
                                         float grad_scale) {
  __shared__ typename cub::BlockReduce<float, kVecThreads>::TempStorage max_temp;
  __shared__ float lanes[kThreads];
  __shared__ float m_shared;
  const int64_t t = blockIdx.x;
  const int32_t y = targets[t];
  if (y == -1) {  // uniform over the block, before any barrier
    ignored_row(losses, logits, t, V, grad_scale);
    return;
  }
  if (y < 0 || y >= V) {
    if (threadIdx.x == 0) losses[t] = __int_as_float(0x7FC00000);
    return;
  }
  uint16_t* row = logits + t * V;
  const int64_t first = static_cast<int64_t>(threadIdx.x) * kVec;
  float x[kVec];
  float m = -INFINITY;
  for (int64_t j = first; j < V; j += kThreads) {
    load8_bf16(row + j, x);
#pragma unroll
    for (int e = 0; e < kVec; ++e) m = MaxOp()(m, x[e]);
  }
  m = cub::BlockReduce<float, kVecThreads>(max_temp).Reduce(m, MaxOp());
  if (threadIdx.x == 0) m_shared = m;
  __syncthreads();
  m = m_shared;

  float acc[kVec] = {};
  for (int64_t j = first; j < V; j += kThreads) {
    load8_bf16(row + j, x);
#pragma unroll
    for (int e = 0; e < kVec; ++e) acc[e] = acc[e] + num::exp_f32(x[e] - m);
  }
  const float sum = vec_lane_tree_sum<kThreads, true>(acc, lanes);
  if (threadIdx.x == 0) losses[t] = logf(sum) - (load_bf16(row, y) - m);
  __syncthreads();  // row[y] has been read; the row may be overwritten from here on
  if (grad_scale == 0.0f) return;
  const float inv = 1.0f / sum;
  for (int64_t j = first; j < V; j += kThreads) {
    load8_bf16(row + j, x);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const float p = num::exp_f32(x[e] - m) * inv;
      x[e] = grad_scale * (j + e == y ? p - 1.0f : p);
    }
    store8_bf16(row + j, x);
  }
}

}  // namespace

void cross_entropy_forward_backward(const OpContext& ctx, const Tensor& losses, const Tensor& logits,
                                    const Tensor& targets, float grad_scale) {
  constexpr const char* op = "cross_entropy_forward_backward";
  const int64_t T = logits.dim(0), V = logits.dim(1);
  if (T == 0) return;
  if (rows_aligned16(logits.data, V))
    cross_entropy_vec_kernel<<<static_cast<unsigned>(T), kVecThreads, 0, ctx.gpu->stream>>>(
        f32_out(losses), bf16_out(logits), i32_in(targets), V, grad_scale);
  else
    cross_entropy_kernel<<<static_cast<unsigned>(T), kThreads, 0, ctx.gpu->stream>>>(
        f32_out(losses), bf16_out(logits), i32_in(targets), V, grad_scale);
  check_launch(*ctx.gpu, op, "logits " + dims(T, V));
}

}  // namespace pl::cuda
