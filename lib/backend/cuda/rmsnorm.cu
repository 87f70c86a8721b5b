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
// add_rmsnorm_forward: the forward with resid = bf16(a + b) made first, in the same pass (its sum
// rounded as add rounds it, then normed); rmsnorm_backward_overwrite: dx = bf16(0 + increment).
// 16-byte paths (one warp per row, 8 bf16 per access) when every row is 16-byte aligned; see below.
// Backward, dw[h] fp32 += Σ_t g (x r): deterministic two-pass reduction without atomics. Pass 1:
// grid (column tiles, token chunks of kRmsNormDwChunk), each thread one column, summing its chunk's
// tokens in order in fp32 into partial[chunk][c]; pass 2: one thread per column combines its chunk
// partials with num::tree_sum (in place, strided) and does dw[c] += sum.
// The forwards' out_amax (op_list.h): each thread's max |stored out| reduced over the grid in the same launch
// (qk::reduce_out_amax), no extra pass over out.
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/op_util.cuh"
#include "backend/cuda/quantize_common.cuh"
#include "numerics/reduce.h"

namespace pl::cuda {

namespace {

constexpr int kRowThreads = num::kRmsNormLanes;  // threads of a row block (forward, dx): one per lane
constexpr int kDwThreads = 256;                  // columns of a dw pass-1 block
constexpr int64_t kDwRows = num::kRmsNormDwChunk;  // tokens of a dw pass-1 block

// The out_amax reduction of the forward kernels (one set: they run in order on the compute stream).
__device__ qk::AmaxCombine g_rmsnorm_amax_combine;

// grid: T blocks (rows); out[T,h] bf16, rstd[T] f32, x[T,h] bf16, w[h] bf16; amax: max |out| when wanted
__global__ void rmsnorm_forward_kernel(uint16_t* out, float* rstd, const uint16_t* x, const uint16_t* w, int64_t h,
                                       float eps, qk::OutAmax amax) {
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
  float m = 0.0f;
  for (int64_t i = threadIdx.x; i < h; i += kRowThreads) {
    const float v = (load_bf16(xr, i) * r) * load_bf16(w, i);
    store_bf16(o, i, v);
    m = qk::max_abs(m, num::round_bf16(v));
  }
  if (amax.wanted()) qk::reduce_out_amax(g_rmsnorm_amax_combine, m, amax);
}

// grid: T blocks (rows); dx[T,h] bf16 (+=, rounded; overwritten with bf16(0 + increment) unless
// Accumulate), dout/x [T,h] bf16, w[h] bf16, rstd[T] f32
template <bool Accumulate>
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
    store_bf16(d, i, (Accumulate ? load_bf16(d, i) : 0.0f) + (r * (wi * gi) - coef * xi));
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

// ---- 16-byte paths (op_util.cuh): rows 16-byte aligned, h a multiple of 8 --------------------------
// One warp per row, kWarpRows rows a block; lane j of the row's 256 is held by thread j / 8 of the warp
// (element i = m*256 + 8k + j goes to lane 8k + j, the scalar kernel's lane i % 256, in increasing m),
// the lanes combined by the same tree (vec_lane_tree_sum). Each access moves 8 bf16.
constexpr int kWarpRows = 4;
static_assert(kRowThreads == 32 * kVec, "a warp of 8-wide threads holds the row's lanes");

// Row t of the forward by its warp. Add: resid[T,h] = bf16(a + b) first (add_rmsnorm_forward; resid may be a
// or b), the norm of resid; else the norm of a (rmsnorm_forward). out[T,h] bf16, rstd[T] f32, w[h] bf16.
// Returns this thread's max |out| over the values it stored.
template <bool Add>
__device__ __forceinline__ float rmsnorm_forward_vec_row(uint16_t* resid, uint16_t* out, float* rstd,
                                                         const uint16_t* a, const uint16_t* b, const uint16_t* w,
                                                         int64_t t, int64_t h, float eps) {
  __shared__ float lanes[kWarpRows][kRowThreads];
  const int warp = static_cast<int>(threadIdx.x) / 32, k = static_cast<int>(threadIdx.x) % 32;
  const uint16_t* xr = Add ? resid + t * h : a + t * h;
  float acc[kVec] = {};
  for (int64_t i = kVec * k; i < h; i += kRowThreads) {
    float x[kVec];
    load8_bf16(a + t * h + i, x);
    if (Add) {
      float y[kVec];
      load8_bf16(b + t * h + i, y);
#pragma unroll
      for (int j = 0; j < kVec; ++j) x[j] = num::round_bf16(x[j] + y[j]);
      store8_bf16(resid + t * h + i, x);
    }
#pragma unroll
    for (int j = 0; j < kVec; ++j) acc[j] = acc[j] + x[j] * x[j];
  }
  const float ss = vec_lane_tree_sum<kRowThreads, false>(acc, lanes[warp]);
  const float ms = ss / static_cast<float>(h);
  const float r = 1.0f / sqrtf(ms + eps);
  if (k == 0) rstd[t] = r;
  float m = 0.0f;
  for (int64_t i = kVec * k; i < h; i += kRowThreads) {  // the row again (this thread's own stores, or L1/L2)
    float x[kVec], wv[kVec];
    load8_bf16(xr + i, x);
    load8_bf16(w + i, wv);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      x[j] = (x[j] * r) * wv[j];
      m = qk::max_abs(m, num::round_bf16(x[j]));
    }
    store8_bf16(out + t * h + i, x);
  }
  return m;
}

// grid: ceil(T / kWarpRows) blocks of kWarpRows warps, a warp per row (rmsnorm_forward_vec_row); amax: max
// |out| when wanted.
template <bool Add>
__global__ void rmsnorm_forward_vec_kernel(uint16_t* resid, uint16_t* out, float* rstd, const uint16_t* a,
                                           const uint16_t* b, const uint16_t* w, int64_t T, int64_t h, float eps,
                                           qk::OutAmax amax) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(kWarpRows) + static_cast<int>(threadIdx.x) / 32;
  // A warp past the last row has no row (the row is warp-synchronous) but joins the block's amax.
  const float m = t < T ? rmsnorm_forward_vec_row<Add>(resid, out, rstd, a, b, w, t, h, eps) : 0.0f;
  if (amax.wanted()) qk::reduce_out_amax(g_rmsnorm_amax_combine, m, amax);
}

// dx[T,h] bf16: Accumulate: bf16(dx + increment), else bf16(0 + increment); as the scalar kernel.
template <bool Accumulate>
__global__ void rmsnorm_backward_dx_vec_kernel(uint16_t* dx, const uint16_t* dout, const uint16_t* x,
                                               const uint16_t* w, const float* rstd, int64_t T, int64_t h) {
  __shared__ float lanes[kWarpRows][kRowThreads];
  const int warp = static_cast<int>(threadIdx.x) / 32, k = static_cast<int>(threadIdx.x) % 32;
  const int64_t t = blockIdx.x * static_cast<int64_t>(kWarpRows) + warp;
  if (t >= T) return;
  const uint16_t* xr = x + t * h;
  const uint16_t* gr = dout + t * h;
  float acc[kVec] = {};
  for (int64_t i = kVec * k; i < h; i += kRowThreads) {
    float g[kVec], wv[kVec], xv[kVec];
    load8_bf16(gr + i, g);
    load8_bf16(w + i, wv);
    load8_bf16(xr + i, xv);
#pragma unroll
    for (int j = 0; j < kVec; ++j) acc[j] = acc[j] + (g[j] * wv[j]) * xv[j];
  }
  const float dot = vec_lane_tree_sum<kRowThreads, false>(acc, lanes[warp]);
  const float r = rstd[t];
  const float coef = dot * (r * r * r) / static_cast<float>(h);
  uint16_t* d = dx + t * h;
  for (int64_t i = kVec * k; i < h; i += kRowThreads) {
    float g[kVec], wv[kVec], xv[kVec], dv[kVec] = {};
    load8_bf16(gr + i, g);
    load8_bf16(w + i, wv);
    load8_bf16(xr + i, xv);
    if (Accumulate) load8_bf16(d + i, dv);
#pragma unroll
    for (int j = 0; j < kVec; ++j) dv[j] = dv[j] + (r * (wv[j] * g[j]) - coef * xv[j]);
    store8_bf16(d + i, dv);
  }
}

// grid: (ceil(h/8 / kDwThreads), chunks); each thread 8 adjacent columns, each summed over the chunk's
// tokens in order (the scalar kernel's sums); partial[chunks, h] f32.
__global__ void rmsnorm_backward_dw_partial_vec_kernel(float* partial, const uint16_t* dout, const uint16_t* x,
                                                       const float* rstd, int64_t T, int64_t h) {
  const int64_t c = (blockIdx.x * static_cast<int64_t>(kDwThreads) + threadIdx.x) * kVec;
  if (c >= h) return;
  const int64_t t0 = blockIdx.y * kDwRows;
  const int64_t t1 = t0 + kDwRows < T ? t0 + kDwRows : T;
  float acc[kVec] = {};
  for (int64_t t = t0; t < t1; ++t) {
    float g[kVec], xv[kVec];
    load8_bf16(dout + t * h + c, g);
    load8_bf16(x + t * h + c, xv);
    const float r = rstd[t];
#pragma unroll
    for (int j = 0; j < kVec; ++j) acc[j] = acc[j] + g[j] * (xv[j] * r);
  }
  store8_f32(partial + blockIdx.y * h + c, acc);
}

// one thread per column: dw[c] += tree_sum over the chunk partials of column c (in place)
__global__ void rmsnorm_backward_dw_final_kernel(float* dw, float* partial, int64_t chunks, int64_t h) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= h) return;
  dw[c] += num::tree_sum(partial + c, chunks, h);
}

}  // namespace

void rmsnorm_forward(const OpContext& ctx, const Tensor& out, const Tensor& rstd, const Tensor& x, const Tensor& w,
                     float eps, const Tensor& out_amax) {
  constexpr const char* op = "rmsnorm_forward";
  const int64_t T = x.dim(0), h = x.dim(1);
  cudaStream_t s = ctx.gpu->stream;
  if (T == 0) return qk::zero_out_amax(s, out_amax, op);
  if (rows_aligned16(x.data, h) && is_aligned16(out.data) && is_aligned16(w.data)) {
    rmsnorm_forward_vec_kernel<false><<<grid_for(T, kWarpRows), kWarpRows * 32, 0, s>>>(
        nullptr, bf16_out(out), f32_out(rstd), bf16_in(x), nullptr, bf16_in(w), T, h, eps,
        qk::out_amax_slots(out_amax));
  } else {
    rmsnorm_forward_kernel<<<static_cast<unsigned>(T), kRowThreads, 0, s>>>(
        bf16_out(out), f32_out(rstd), bf16_in(x), bf16_in(w), h, eps, qk::out_amax_slots(out_amax));
  }
  check_launch(*ctx.gpu, op, "x " + dims(T, h));
}

// One pass when everything is 16-byte aligned; otherwise add then rmsnorm_forward (the same bits).
void add_rmsnorm_forward(const OpContext& ctx, const Tensor& resid_out, const Tensor& norm_out, const Tensor& rstd,
                         const Tensor& a, const Tensor& b, const Tensor& w, float eps, const Tensor& norm_out_amax) {
  constexpr const char* op = "add_rmsnorm_forward";
  const int64_t T = a.dim(0), h = a.dim(1);
  if (T == 0) return qk::zero_out_amax(ctx.gpu->stream, norm_out_amax, op);
  const bool vec = rows_aligned16(a.data, h) && is_aligned16(b.data) && is_aligned16(resid_out.data) &&
                   is_aligned16(norm_out.data) && is_aligned16(w.data);
  if (!vec) {
    cuda::add(ctx, resid_out, a, b);
    cuda::rmsnorm_forward(ctx, norm_out, rstd, resid_out, w, eps, norm_out_amax);
    return;
  }
  rmsnorm_forward_vec_kernel<true><<<grid_for(T, kWarpRows), kWarpRows * 32, 0, ctx.gpu->stream>>>(
      bf16_out(resid_out), bf16_out(norm_out), f32_out(rstd), bf16_in(a), bf16_in(b), bf16_in(w), T, h, eps,
      qk::out_amax_slots(norm_out_amax));
  check_launch(*ctx.gpu, op, "a " + dims(T, h));
}

namespace {
template <bool Accumulate>
void backward(const char* op, const OpContext& ctx, const Tensor& dx, const Tensor& dw, const Tensor& dout,
              const Tensor& x, const Tensor& w, const Tensor& rstd) {
  const int64_t T = x.dim(0), h = x.dim(1);
  if (T == 0) return;
  const std::string what = "x " + dims(T, h);
  cudaStream_t s = ctx.gpu->stream;
  const bool vec =
      rows_aligned16(x.data, h) && is_aligned16(dx.data) && is_aligned16(dout.data) && is_aligned16(w.data);
  if (vec) {
    rmsnorm_backward_dx_vec_kernel<Accumulate><<<grid_for(T, kWarpRows), kWarpRows * 32, 0, s>>>(
        bf16_out(dx), bf16_in(dout), bf16_in(x), bf16_in(w), f32_in(rstd), T, h);
  } else {
    rmsnorm_backward_dx_kernel<Accumulate><<<static_cast<unsigned>(T), kRowThreads, 0, s>>>(
        bf16_out(dx), bf16_in(dout), bf16_in(x), bf16_in(w), f32_in(rstd), h);
  }
  check_launch(*ctx.gpu, op, what + " (dx)");

  const int64_t chunks = (T + kDwRows - 1) / kDwRows;
  DeviceScratch& scratch = ctx.gpu->scratch.rmsnorm_dw;
  auto* partial = static_cast<float*>(scratch.get(sizeof(float) * static_cast<size_t>(chunks * h)));
  if (vec && is_aligned16(partial)) {
    const dim3 grid(grid_for(h / kVec, kDwThreads), static_cast<unsigned>(chunks));
    rmsnorm_backward_dw_partial_vec_kernel<<<grid, kDwThreads, 0, s>>>(partial, bf16_in(dout), bf16_in(x),
                                                                       f32_in(rstd), T, h);
  } else {
    const dim3 grid(grid_for(h, kDwThreads), static_cast<unsigned>(chunks));
    rmsnorm_backward_dw_partial_kernel<<<grid, kDwThreads, 0, s>>>(partial, bf16_in(dout), bf16_in(x), f32_in(rstd),
                                                                   T, h);
  }
  check_launch(*ctx.gpu, op, what + " (dw partial sums)");
  rmsnorm_backward_dw_final_kernel<<<grid_for(h, kDwThreads), kDwThreads, 0, s>>>(f32_out(dw), partial, chunks, h);
  check_launch(*ctx.gpu, op, what + " (dw)");
}
}  // namespace

void rmsnorm_backward(const OpContext& ctx, const Tensor& dx, const Tensor& dw, const Tensor& dout, const Tensor& x,
                      const Tensor& w, const Tensor& rstd) {
  backward<true>("rmsnorm_backward", ctx, dx, dw, dout, x, w, rstd);
}

void rmsnorm_backward_overwrite(const OpContext& ctx, const Tensor& dx, const Tensor& dw, const Tensor& dout,
                                const Tensor& x, const Tensor& w, const Tensor& rstd) {
  backward<false>("rmsnorm_backward_overwrite", ctx, dx, dw, dout, x, w, rstd);
}

}  // namespace pl::cuda
