// CUDA RMSNorm (see backend/ops.h; CPU twin backend/cpu/rmsnorm.cpp, whose expressions are used
// here operation for operation; FMA contraction is off on both sides).
//
// Forward: one block per row. Σx² in double (CUB BlockReduce), then ms = float(Σ/h),
// rstd = 1/sqrt(ms + eps) and out = bf16((x * rstd) * w). Only the order of the double sum differs
// from the CPU's, so rstd and out agree with it except when float(Σ/h) lands on the other side of
// a rounding boundary (rare; 1 ulp of rstd, then at most 1 bf16 ulp of out).
// Backward, dx: one block per row, Σ (g·w)·x in double (BlockReduce), then the CPU's expression,
// dx = bf16(dx + (r (w g) - coef x)).
// Backward, dw[h] fp32 += Σ_t g (x r): deterministic two-pass reduction without atomics. Pass 1:
// grid (column tiles, token chunks of kDwRows), each thread one column, summing its chunk's tokens in
// order in double into partial[chunk][c]; pass 2: one thread per column adds the chunk partials in
// chunk order and does dw[c] += float(sum). The result depends on the data only.
#include <cub/cub.cuh>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/op_util.cuh"

namespace pl::cuda {

namespace {

constexpr int kRowThreads = 256;   // threads of a row block (forward, dx)
constexpr int kDwThreads = 256;    // columns of a dw pass-1 block
constexpr int64_t kDwRows = 128;   // tokens of a dw pass-1 block

using RowReduce = cub::BlockReduce<double, kRowThreads>;

// grid: T blocks (rows); out[T,h] bf16, rstd[T] f32, x[T,h] bf16, w[h] bf16
__global__ void rmsnorm_forward_kernel(uint16_t* out, float* rstd, const uint16_t* x, const uint16_t* w, int64_t h,
                                       float eps) {
  __shared__ typename RowReduce::TempStorage temp;
  __shared__ float r_shared;
  const int64_t t = blockIdx.x;
  const uint16_t* xr = x + t * h;
  double ss = 0.0;
  for (int64_t i = threadIdx.x; i < h; i += kRowThreads) {
    const float xi = load_bf16(xr, i);
    ss += static_cast<double>(xi) * xi;
  }
  ss = RowReduce(temp).Sum(ss);
  if (threadIdx.x == 0) {
    const float ms = static_cast<float>(ss / static_cast<double>(h));
    const float r = 1.0f / sqrtf(ms + eps);
    rstd[t] = r;
    r_shared = r;
  }
  __syncthreads();
  const float r = r_shared;
  uint16_t* o = out + t * h;
  for (int64_t i = threadIdx.x; i < h; i += kRowThreads) store_bf16(o, i, (load_bf16(xr, i) * r) * load_bf16(w, i));
}

// grid: T blocks (rows); dx[T,h] bf16 (+=, rounded), dout/x [T,h] bf16, w[h] bf16, rstd[T] f32
__global__ void rmsnorm_backward_dx_kernel(uint16_t* dx, const uint16_t* dout, const uint16_t* x, const uint16_t* w,
                                           const float* rstd, int64_t h) {
  __shared__ typename RowReduce::TempStorage temp;
  __shared__ float coef_shared;
  const int64_t t = blockIdx.x;
  const uint16_t* xr = x + t * h;
  const uint16_t* gr = dout + t * h;
  double dot = 0.0;
  for (int64_t i = threadIdx.x; i < h; i += kRowThreads)
    dot += static_cast<double>(load_bf16(gr, i) * load_bf16(w, i)) * load_bf16(xr, i);
  dot = RowReduce(temp).Sum(dot);
  const float r = rstd[t];
  if (threadIdx.x == 0) coef_shared = static_cast<float>(dot) * (r * r * r) / static_cast<float>(h);
  __syncthreads();
  const float coef = coef_shared;
  uint16_t* d = dx + t * h;
  for (int64_t i = threadIdx.x; i < h; i += kRowThreads) {
    const float wi = load_bf16(w, i), gi = load_bf16(gr, i), xi = load_bf16(xr, i);
    store_bf16(d, i, load_bf16(d, i) + (r * (wi * gi) - coef * xi));
  }
}

// grid: (ceil(h/kDwThreads), chunks); partial[chunks, h] f64 = Σ over the chunk's tokens of g (x r)
__global__ void rmsnorm_backward_dw_partial_kernel(double* partial, const uint16_t* dout, const uint16_t* x,
                                                   const float* rstd, int64_t T, int64_t h) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(kDwThreads) + threadIdx.x;
  if (c >= h) return;
  const int64_t t0 = blockIdx.y * kDwRows;
  const int64_t t1 = t0 + kDwRows < T ? t0 + kDwRows : T;
  double acc = 0.0;
  for (int64_t t = t0; t < t1; ++t)
    acc += static_cast<double>(load_bf16(dout, t * h + c) * (load_bf16(x, t * h + c) * rstd[t]));
  partial[blockIdx.y * h + c] = acc;
}

// one thread per column: dw[c] += float(Σ_chunk partial[chunk][c]) in chunk order
__global__ void rmsnorm_backward_dw_final_kernel(float* dw, const double* partial, int64_t chunks, int64_t h) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= h) return;
  double acc = 0.0;
  for (int64_t k = 0; k < chunks; ++k) acc += partial[k * h + c];
  dw[c] += static_cast<float>(acc);
}

}  // namespace

void rmsnorm_forward(const OpContext&, const Tensor& out, const Tensor& rstd, const Tensor& x, const Tensor& w,
                     float eps) {
  constexpr const char* op = "rmsnorm_forward";
  check_arg(op, "out", out, DType::BF16, 2);
  check_arg(op, "rstd", rstd, DType::F32, 1);
  check_arg(op, "x", x, DType::BF16, 2);
  check_arg(op, "w", w, DType::BF16, 1);
  require(x.dim(1) == w.dim(0) && x.dim(1) > 0, op, "x " + describe(x) + " does not match w " + describe(w));
  require(out.dim(0) == x.dim(0) && out.dim(1) == x.dim(1), op,
          "out " + describe(out) + " does not match x " + describe(x));
  require(rstd.dim(0) == x.dim(0), op, "rstd " + describe(rstd) + " does not match x " + describe(x));
  require(eps >= 0.0f, op, "eps = " + std::to_string(eps) + " must be >= 0");
  const int64_t T = x.dim(0), h = x.dim(1);
  require(T < (int64_t{1} << 31), op, "x " + describe(x) + " has more rows than a grid holds");
  if (T == 0) return;
  rmsnorm_forward_kernel<<<static_cast<unsigned>(T), kRowThreads>>>(bf16_out(out), f32_out(rstd), bf16_in(x),
                                                                    bf16_in(w), h, eps);
  check_launch(op, "x " + dims(T, h));
}

void rmsnorm_backward(const OpContext&, const Tensor& dx, const Tensor& dw, const Tensor& dout, const Tensor& x,
                      const Tensor& w, const Tensor& rstd) {
  constexpr const char* op = "rmsnorm_backward";
  check_arg(op, "dx", dx, DType::BF16, 2);
  check_arg(op, "dw", dw, DType::F32, 1);
  check_arg(op, "dout", dout, DType::BF16, 2);
  check_arg(op, "x", x, DType::BF16, 2);
  check_arg(op, "w", w, DType::BF16, 1);
  check_arg(op, "rstd", rstd, DType::F32, 1);
  require(x.dim(1) == w.dim(0) && x.dim(1) > 0, op, "x " + describe(x) + " does not match w " + describe(w));
  require(dw.dim(0) == w.dim(0), op, "dw " + describe(dw) + " does not match w " + describe(w));
  require(dout.dim(0) == x.dim(0) && dout.dim(1) == x.dim(1), op,
          "dout " + describe(dout) + " does not match x " + describe(x));
  require(dx.dim(0) == x.dim(0) && dx.dim(1) == x.dim(1), op,
          "dx " + describe(dx) + " does not match x " + describe(x));
  require(rstd.dim(0) == x.dim(0), op, "rstd " + describe(rstd) + " does not match x " + describe(x));
  const int64_t T = x.dim(0), h = x.dim(1);
  require(T < (int64_t{1} << 31), op, "x " + describe(x) + " has more rows than a grid holds");
  if (T == 0) return;
  const std::string what = "x " + dims(T, h);

  rmsnorm_backward_dx_kernel<<<static_cast<unsigned>(T), kRowThreads>>>(bf16_out(dx), bf16_in(dout), bf16_in(x),
                                                                         bf16_in(w), f32_in(rstd), h);
  check_launch(op, what + " (dx)");

  const int64_t chunks = (T + kDwRows - 1) / kDwRows;
  require(chunks <= 65535, op, what + " has more token chunks than a grid's y dimension holds");
  static DeviceScratch scratch;
  auto* partial = static_cast<double*>(scratch.get(sizeof(double) * static_cast<size_t>(chunks * h)));
  const dim3 grid(grid_for(h, kDwThreads), static_cast<unsigned>(chunks));
  rmsnorm_backward_dw_partial_kernel<<<grid, kDwThreads>>>(partial, bf16_in(dout), bf16_in(x), f32_in(rstd), T, h);
  check_launch(op, what + " (dw partial sums)");
  rmsnorm_backward_dw_final_kernel<<<grid_for(h, kDwThreads), kDwThreads>>>(f32_out(dw), partial, chunks, h);
  check_launch(op, what + " (dw)");
}

}  // namespace pl::cuda
