// CUDA optimizer ops (see backend/ops.h; CPU twin backend/cpu/optimizer.cpp).
//
// sum_of_squares: the CPU's exact summation schedule, so the double result is bit-identical: fixed
// chunks of kSumChunk elements; within a chunk, element i goes to lane i % 8, each lane summed in
// element order in double, lanes combined as ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)); chunk sums added in
// chunk order. Pass 1: one thread per (chunk, lane), the 8 lanes of a chunk adjacent in a warp and
// combined by xor-shuffles 1, 2, 4 (IEEE addition is commutative, so lane k gets exactly the
// CPU's pair sums); pass 2: one thread adds the chunk sums in order (sequential by definition of the
// result; ~1e5 adds for a 8B-parameter model). Partials live in a grow-only function-static scratch.
// adamw_update / copy_master_to_param: one element per thread calling the shared num::adamw_element
// and num::float_to_bf16_bits; the hyper-parameters are built on the host exactly as the CPU builds
// them (bias corrections in double, then float), so master, m, v and param are bit-identical.
#include <cmath>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/op_util.cuh"
#include "numerics/adamw.h"

namespace pl::cuda {

namespace {

constexpr int64_t kSumChunk = 65536;  // as backend/cpu/optimizer.cpp: part of the result's definition
constexpr int kLanes = 8;
constexpr int kSumThreads = 256;      // 32 chunks per block
constexpr int kThreads = 256;

// partial[chunks] f64 = sum of squares of each chunk of x[n] f32 (the CPU's lane schedule)
__global__ void sum_of_squares_chunks_kernel(double* partial, const float* x, int64_t n, int64_t chunks) {
  const int64_t gid = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t chunk = gid / kLanes;
  const int lane = static_cast<int>(gid % kLanes);
  double acc = 0.0;
  if (chunk < chunks) {
    const int64_t i0 = chunk * kSumChunk;
    const int64_t i1 = i0 + kSumChunk < n ? i0 + kSumChunk : n;
    for (int64_t i = i0 + lane; i < i1; i += kLanes) acc += static_cast<double>(x[i]) * x[i];
  }
  // All 32 threads of the warp take part (kSumThreads is a multiple of 32; groups of 8 never straddle).
  acc = acc + __shfl_xor_sync(0xFFFFFFFFu, acc, 1);  // (l0+l1), (l2+l3), ...
  acc = acc + __shfl_xor_sync(0xFFFFFFFFu, acc, 2);  // (l0+l1)+(l2+l3), ...
  acc = acc + __shfl_xor_sync(0xFFFFFFFFu, acc, 4);  // (...) + (...)
  if (chunk < chunks && lane == 0) partial[chunk] = acc;
}

// *total = Σ partial[c] in chunk order (one thread)
__global__ void sum_of_squares_total_kernel(double* total, const double* partial, int64_t chunks) {
  double s = 0.0;
  for (int64_t c = 0; c < chunks; ++c) s += partial[c];
  *total = s;
}

// One AdamW element per thread; param is bf16 bits (PARAM = uint16_t) or f32 (PARAM = float).
template <class PARAM>
__global__ void adamw_kernel(PARAM* param, float* master, float* m, float* v, const float* grad, int64_t n,
                             num::AdamWHyper h, bool round) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float p = master[i], m1 = m[i], m2 = v[i];
    num::adamw_element(p, m1, m2, grad[i], h);
    master[i] = p;
    m[i] = m1;
    v[i] = m2;
    if constexpr (sizeof(PARAM) == 2)
      param[i] = num::float_to_bf16_bits(p);
    else
      param[i] = round ? num::round_bf16(p) : p;
  }
}

// Whether element i lies in one of the sorted, disjoint [begin, end) ranges rg[2*count]: binary search
// for the last range starting at or before i (the table is tiny, ~2 per layer, and stays in L1).
__device__ __forceinline__ bool in_ranges(const int64_t* rg, int64_t count, int64_t i) {
  int64_t lo = 0, hi = count;  // -> the first range whose begin is > i
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (rg[2 * mid] <= i)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo > 0 && i < rg[2 * (lo - 1) + 1];
}

// adamw_kernel over the whole flat buffers: elements inside the no-decay ranges use `plain` (weight
// decay 0), all others `decay`; otherwise the same per-element code.
template <class PARAM>
__global__ void adamw_multi_kernel(PARAM* param, float* master, float* m, float* v, const float* grad, int64_t n,
                                   const int64_t* no_decay, int64_t ranges, num::AdamWHyper decay,
                                   num::AdamWHyper plain, bool round) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const num::AdamWHyper& h = in_ranges(no_decay, ranges, i) ? plain : decay;
    float p = master[i], m1 = m[i], m2 = v[i];
    num::adamw_element(p, m1, m2, grad[i], h);
    master[i] = p;
    m[i] = m1;
    v[i] = m2;
    if constexpr (sizeof(PARAM) == 2)
      param[i] = num::float_to_bf16_bits(p);
    else
      param[i] = round ? num::round_bf16(p) : p;
  }
}

// param[n] = master[n] as bf16 bits (PARAM = uint16_t) or f32 (rounded to bf16 values when `round`)
template <class PARAM>
__global__ void copy_master_kernel(PARAM* param, const float* master, int64_t n, bool round) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if constexpr (sizeof(PARAM) == 2)
      param[i] = num::float_to_bf16_bits(master[i]);
    else
      param[i] = round ? num::round_bf16(master[i]) : master[i];
  }
}

void check_numel(const char* op, const char* name, const Tensor& t, const Tensor& master) {
  require(t.numel() == master.numel(), op,
          std::string(name) + " " + describe(t) + " does not match master " + describe(master) +
              " (element counts differ)");
}

}  // namespace

double sum_of_squares(const OpContext&, const Tensor& x) {
  constexpr const char* op = "sum_of_squares";
  check_arg(op, "x", x, DType::F32);
  const int64_t n = x.numel();
  if (n == 0) return 0.0;
  const int64_t chunks = (n + kSumChunk - 1) / kSumChunk;
  const std::string what = "x " + x.shape_str() + " (" + std::to_string(chunks) + " chunks)";
  static DeviceScratch scratch;  // [total | partial[chunks]]
  auto* total = static_cast<double*>(scratch.get(sizeof(double) * static_cast<size_t>(chunks + 1)));
  double* partial = total + 1;
  sum_of_squares_chunks_kernel<<<grid_for(chunks * kLanes, kSumThreads), kSumThreads>>>(partial, f32_in(x), n,
                                                                                        chunks);
  check_launch(op, what);
  sum_of_squares_total_kernel<<<1, 1>>>(total, partial, chunks);
  check_launch(op, what + " (chunk total)");
  double result = 0.0;
  check(cudaMemcpy(&result, total, sizeof result, cudaMemcpyDeviceToHost), op, what + " (read result)");
  return result;
}

void adamw_update(const OpContext& ctx, const Tensor& param, const Tensor& master, const Tensor& grad,
                  const Tensor& m, const Tensor& v, const AdamWStep& step) {
  constexpr const char* op = "adamw_update";
  check_arg2(op, "param", param, DType::BF16, DType::F32);
  check_arg(op, "master", master, DType::F32);
  check_arg(op, "grad", grad, DType::F32);
  check_arg(op, "m", m, DType::F32);
  check_arg(op, "v", v, DType::F32);
  check_numel(op, "param", param, master);
  check_numel(op, "grad", grad, master);
  check_numel(op, "m", m, master);
  check_numel(op, "v", v, master);
  require(step.step >= 1, op, "step = " + std::to_string(step.step) + " must be >= 1 (1-based)");
  const num::AdamWHyper h =
      num::adamw_hyper(step.lr, step.beta1, step.beta2, step.eps, step.weight_decay, step.step, step.grad_scale);
  const int64_t n = master.numel();
  if (n == 0) return;
  const unsigned grid = grid_capped(n, kThreads);
  if (param.dtype == DType::BF16)
    adamw_kernel<uint16_t><<<grid, kThreads>>>(bf16_out(param), f32_out(master), f32_out(m), f32_out(v), f32_in(grad),
                                               n, h, ctx.round_bf16);
  else
    adamw_kernel<float><<<grid, kThreads>>>(f32_out(param), f32_out(master), f32_out(m), f32_out(v), f32_in(grad), n,
                                            h, ctx.round_bf16);
  check_launch(op, "master " + master.shape_str() + " param " + param.shape_str());
}

void adamw_update_multi(const OpContext& ctx, const Tensor& param, const Tensor& master, const Tensor& grad,
                        const Tensor& m, const Tensor& v, const ElementRanges& no_decay, const AdamWStep& step) {
  constexpr const char* op = "adamw_update_multi";
  check_arg2(op, "param", param, DType::BF16, DType::F32);
  check_arg(op, "master", master, DType::F32);
  check_arg(op, "grad", grad, DType::F32);
  check_arg(op, "m", m, DType::F32);
  check_arg(op, "v", v, DType::F32);
  check_numel(op, "param", param, master);
  check_numel(op, "grad", grad, master);
  check_numel(op, "m", m, master);
  check_numel(op, "v", v, master);
  require(step.step >= 1, op, "step = " + std::to_string(step.step) + " must be >= 1 (1-based)");
  const int64_t n = master.numel();
  require(no_decay.count == 0 || (no_decay.host != nullptr && no_decay.device != nullptr), op,
          std::to_string(no_decay.count) + " no-decay ranges need both the host and the device table");
  // Validated on the host copy (the device copy is the same table, uploaded once by the caller).
  for (int64_t r = 0; r < no_decay.count; ++r) {
    const int64_t b = no_decay.host[2 * r], e = no_decay.host[2 * r + 1];
    const int64_t prev_end = r > 0 ? no_decay.host[2 * r - 1] : 0;
    require(b >= prev_end && b <= e && e <= n, op,
            "no-decay range " + std::to_string(r) + " = [" + std::to_string(b) + ", " + std::to_string(e) +
                ") is not sorted, disjoint and inside the " + std::to_string(n) + " elements");
  }
  const num::AdamWHyper decay =
      num::adamw_hyper(step.lr, step.beta1, step.beta2, step.eps, step.weight_decay, step.step, step.grad_scale);
  const num::AdamWHyper plain =
      num::adamw_hyper(step.lr, step.beta1, step.beta2, step.eps, 0.0f, step.step, step.grad_scale);
  if (n == 0) return;
  const unsigned grid = grid_capped(n, kThreads);
  const std::string what = "master " + master.shape_str() + " param " + param.shape_str() + " (" +
                           std::to_string(no_decay.count) + " no-decay ranges)";
  if (param.dtype == DType::BF16)
    adamw_multi_kernel<uint16_t><<<grid, kThreads>>>(bf16_out(param), f32_out(master), f32_out(m), f32_out(v),
                                                     f32_in(grad), n, no_decay.device, no_decay.count, decay, plain,
                                                     ctx.round_bf16);
  else
    adamw_multi_kernel<float><<<grid, kThreads>>>(f32_out(param), f32_out(master), f32_out(m), f32_out(v), f32_in(grad),
                                                  n, no_decay.device, no_decay.count, decay, plain, ctx.round_bf16);
  check_launch(op, what);
}

void copy_master_to_param(const OpContext& ctx, const Tensor& param, const Tensor& master) {
  constexpr const char* op = "copy_master_to_param";
  check_arg2(op, "param", param, DType::BF16, DType::F32);
  check_arg(op, "master", master, DType::F32);
  check_numel(op, "param", param, master);
  const int64_t n = master.numel();
  if (n == 0) return;
  const unsigned grid = grid_capped(n, kThreads);
  if (param.dtype == DType::BF16)
    copy_master_kernel<uint16_t><<<grid, kThreads>>>(bf16_out(param), f32_in(master), n, ctx.round_bf16);
  else
    copy_master_kernel<float><<<grid, kThreads>>>(f32_out(param), f32_in(master), n, ctx.round_bf16);
  check_launch(op, "master " + master.shape_str() + " param " + param.shape_str());
}

}  // namespace pl::cuda
