// CUDA RMSNorm (see backend/ops.h; CPU twin backend/cpu/rmsnorm.cpp, whose expressions and FP32
// summation schedules (numerics/reduce.h) are used here operation for operation; FMA contraction is
// off on both sides, and there is no FP64). Results are bit-identical with the CPU backend: rstd, out,
// dx and dw.
//
// Forward: one block of kRmsNormLanes threads per row; thread k sums x_i² for i = k, k + L, ... in
// order (lane k of num::lane_sum), the lanes are combined by num::block_tree_sum (fixed order), then
// ms = Σ / h, rstd = 1/sqrt(ms + eps) (IEEE division and sqrt, correctly rounded on both sides) and
// out = bf16((x * rstd) * w).
// Backward, dx: one block per row, Σ (g·w)·x the same way, then the CPU's expression,
// dx = bf16(dx + (r (w g) - coef x)).
// Backward, dw[h] fp32 += Σ_t g (x r): deterministic two-pass reduction without atomics. Pass 1:
// grid (column tiles, token chunks of kRmsNormDwChunk), each thread one column, summing its chunk's
// tokens in order in fp32 into partial[chunk][c]; pass 2: one thread per column combines its chunk
// partials with num::tree_sum (in place, strided) and does dw[c] += sum.
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/op_util.cuh"
#include "numerics/reduce.h"

namespace pl::cuda {

namespace {

constexpr int kRowThreads = num::kRmsNormLanes;  // threads of a row block (forward, dx): one per lane
constexpr int kDwThreads = 256;                  // columns of a dw pass-1 block
constexpr int64_t kDwRows = num::kRmsNormDwChunk;  // tokens of a dw pass-1 block

// grid: T blocks (rows); out[T,h] bf16, rstd[T] f32, x[T,h] bf16, w[h] bf16
__global__ void rmsnorm_forward_kernel(uint16_t* out, float* rstd, const uint16_t* x, const uint16_t* w, int64_t h,
                                       float eps) {
  __shared__ float lanes[kRowThreads];
  const int64_t t = blockIdx.x;
  const uint16_t* xr = x + t * h;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < h; i += kRowThreads) {
    const float xi = load_bf16(xr, i);
    ss = ss + xi * xi;
  }
  ss = num::block_tree_sum<kRowThreads>(ss, lanes);
  const float ms = ss / static_cast<float>(h);
  const float r = 1.0f / sqrtf(ms + eps);
  if (threadIdx.x == 0) rstd[t] = r;
  uint16_t* o = out + t * h;
  for (int64_t i = threadIdx.x; i < h; i += kRowThreads) store_bf16(o, i, (load_bf16(xr, i) * r) * load_bf16(w, i));
}

// grid: T blocks (rows); dx[T,h] bf16 (+=, rounded), dout/x [T,h] bf16, w[h] bf16, rstd[T] f32
__global__ void rmsnorm_backward_dx_kernel(uint16_t* dx, const uint16_t* dout, const uint16_t* x, const uint16_t* w,
                                           const float* rstd, int64_t h) {
  __shared__ float lanes[kRowThreads];
  const int64_t t = blockIdx.x;
  const uint16_t* xr = x + t * h;
  const uint16_t* gr = dout + t * h;
  float dot = 0.0f;
  for (int64_t i = threadIdx.x; i < h; i += kRowThreads)
    dot = dot + (load_bf16(gr, i) * load_bf16(w, i)) * load_bf16(xr, i);
  dot = num::block_tree_sum<kRowThreads>(dot, lanes);
  const float r = rstd[t];
  const float coef = dot * (r * r * r) / static_cast<float>(h);
  uint16_t* d = dx + t * h;
  for (int64_t i = threadIdx.x; i < h; i += kRowThreads) {
    const float wi = load_bf16(w, i), gi = load_bf16(gr, i), xi = load_bf16(xr, i);
    store_bf16(d, i, load_bf16(d, i) + (r * (wi * gi) - coef * xi));
  }
}

// grid: (ceil(h/kDwThreads), chunks); partial[chunks, h] f32 = Σ over the chunk's tokens of g (x r), in order
__global__ void rmsnorm_backward_dw_partial_kernel(float* partial, const uint16_t* dout, const uint16_t* x,
                                                   const float* rstd, int64_t T, int64_t h) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(kDwThreads) + threadIdx.x;
  if (c >= h) return;
  const int64_t t0 = blockIdx.y * kDwRows;
  const int64_t t1 = t0 + kDwRows < T ? t0 + kDwRows : T;
  float acc = 0.0f;
  for (int64_t t = t0; t < t1; ++t) acc = acc + load_bf16(dout, t * h + c) * (load_bf16(x, t * h + c) * rstd[t]);
  partial[blockIdx.y * h + c] = acc;
}

// one thread per column: dw[c] += tree_sum over the chunk partials of column c (in place)
__global__ void rmsnorm_backward_dw_final_kernel(float* dw, float* partial, int64_t chunks, int64_t h) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= h) return;
  dw[c] += num::tree_sum(partial + c, chunks, h);
}

}  // namespace

void rmsnorm_forward(const OpContext& ctx, const Tensor& out, const Tensor& rstd, const Tensor& x, const Tensor& w,
                     float eps) {
  constexpr const char* op = "rmsnorm_forward";
  const int64_t T = x.dim(0), h = x.dim(1);
  if (T == 0) return;
  rmsnorm_forward_kernel<<<static_cast<unsigned>(T), kRowThreads, 0, ctx.gpu->stream>>>(bf16_out(out), f32_out(rstd),
                                                                                        bf16_in(x), bf16_in(w), h, eps);
  check_launch(*ctx.gpu, op, "x " + dims(T, h));
}

void rmsnorm_backward(const OpContext& ctx, const Tensor& dx, const Tensor& dw, const Tensor& dout, const Tensor& x,
                      const Tensor& w, const Tensor& rstd) {
  constexpr const char* op = "rmsnorm_backward";
  const int64_t T = x.dim(0), h = x.dim(1);
  if (T == 0) return;
  const std::string what = "x " + dims(T, h);

  rmsnorm_backward_dx_kernel<<<static_cast<unsigned>(T), kRowThreads, 0, ctx.gpu->stream>>>(
      bf16_out(dx), bf16_in(dout), bf16_in(x), bf16_in(w), f32_in(rstd), h);
  check_launch(*ctx.gpu, op, what + " (dx)");

  const int64_t chunks = (T + kDwRows - 1) / kDwRows;
  DeviceScratch& scratch = ctx.gpu->scratch.rmsnorm_dw;
  auto* partial = static_cast<float*>(scratch.get(sizeof(float) * static_cast<size_t>(chunks * h)));
  const dim3 grid(grid_for(h, kDwThreads), static_cast<unsigned>(chunks));
  rmsnorm_backward_dw_partial_kernel<<<grid, kDwThreads, 0, ctx.gpu->stream>>>(partial, bf16_in(dout), bf16_in(x),
                                                                               f32_in(rstd), T, h);
  check_launch(*ctx.gpu, op, what + " (dw partial sums)");
  rmsnorm_backward_dw_final_kernel<<<grid_for(h, kDwThreads), kDwThreads, 0, ctx.gpu->stream>>>(f32_out(dw), partial,
                                                                                                chunks, h);
  check_launch(*ctx.gpu, op, what + " (dw)");
}

}  // namespace pl::cuda
