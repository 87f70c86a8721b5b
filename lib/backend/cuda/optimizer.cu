// CUDA optimizer ops (see backend/ops.h; CPU twin backend/cpu/optimizer.cpp).
//
// sum_of_squares: the CPU's fp32 summation schedule (numerics/reduce.h), so the result is bit-identical
// and no FP64 is used on the device: chunks of kSumSquaresChunk elements, one block of kTreeGroup
// threads per chunk, thread k summing x_i² for i = k, k + 256, ... of the chunk in order (lane k of
// num::lane_sum), the lanes combined by num::block_tree_sum; then the chunk partials combined by
// num::group_tree_sum: one launch per level, one block per group of kTreeGroup partials (a 8B-parameter
// model: ~122k chunks, 3 levels). The single float result is read back (the one blocking host read of
// the norm per iteration) and returned as double. Partials live in the device state's grow-only scratch.
// adamw_update_multi / copy_master_to_param: one element per thread calling the shared
// num::adamw_element_stored (grads and moments f32 or bf16) and num::float_to_bf16_bits; the hyper-parameters are built on the host exactly as the CPU builds
// them (bias corrections in double, then float), so master, m, v and param are bit-identical.
#include <cmath>
#include <type_traits>
#include <utility>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/op_util.cuh"
#include "numerics/adamw.h"
#include "numerics/reduce.h"

namespace pl::cuda {

namespace {

constexpr int kSumThreads = num::kTreeGroup;  // one thread per lane of a chunk / slot of a tree group
constexpr int kThreads = 256;

// partial[chunk] f32 = lane sum of x² over chunk `blockIdx.x` of x[n] (the CPU's schedule); X: f32, or
// bf16 bits (BF16 main grads, widened exactly: the CPU sums the same values from FP32 storage)
template <class X>
__global__ void sum_of_squares_chunks_kernel(float* partial, const X* x, int64_t n) {
  __shared__ float lanes[kSumThreads];
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * num::kSumSquaresChunk;
  const int64_t i1 = i0 + num::kSumSquaresChunk < n ? i0 + num::kSumSquaresChunk : n;
  float acc = 0.0f;
  for (int64_t i = i0 + threadIdx.x; i < i1; i += kSumThreads) {
    const float v = num::state_load(x[i]);
    acc = acc + v * v;
  }
  acc = num::block_tree_sum<kSumThreads>(acc, lanes);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// One level of num::group_tree_sum: out[g] = tree sum of in[g*256 .. g*256+255] (+0.0f past m)
__global__ void sum_of_squares_level_kernel(float* out, const float* in, int64_t m) {
  __shared__ float slots[kSumThreads];
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kSumThreads + threadIdx.x;
  const float v = num::block_tree_sum<kSumThreads>(i < m ? in[i] : 0.0f, slots);
  if (threadIdx.x == 0) out[blockIdx.x] = v;
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

// One AdamW element per thread over the whole flat buffers (grid-stride): elements inside the no-decay
// ranges use `plain` (weight decay 0), all others `decay`; param is bf16 bits (PARAM = uint16_t) or f32, or
// null (FP8 primary weights: not written);
// the moments M, V are f32 or bf16 bits (the precision-aware optimizer), through the shared
// num::adamw_element_stored (load to FP32, FP32 math, RNE store), as the CPU.
template <class PARAM, class G, class M, class V>
__global__ void adamw_multi_kernel(PARAM* param, float* master, M* m, V* v, const G* grad, int64_t n,
                                   const int64_t* no_decay, int64_t ranges, num::AdamWHyper decay,
                                   num::AdamWHyper plain, bool round) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const num::AdamWHyper& h = in_ranges(no_decay, ranges, i) ? plain : decay;
    float p = master[i];
    M m1 = m[i];
    V m2 = v[i];
    num::adamw_element_stored(p, m1, m2, num::state_load(grad[i]), h);
    master[i] = p;
    m[i] = m1;
    v[i] = m2;
    if (param == nullptr) continue;  // FP8 primary weights: no BF16 weights here (uniform over the grid)
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

}  // namespace

double sum_of_squares(const OpContext& ctx, const Tensor& x) {
  constexpr const char* op = "sum_of_squares";
  const int64_t n = x.numel();
  if (n == 0) return 0.0;
  const int64_t chunks = (n + num::kSumSquaresChunk - 1) / num::kSumSquaresChunk;
  const std::string what = "x " + x.shape_str() + " (" + std::to_string(chunks) + " chunks)";
  // [chunk partials | level buffer]: the levels ping-pong between the two regions.
  const int64_t level_slots = (chunks + kSumThreads - 1) / kSumThreads;
  DeviceScratch& scratch = ctx.gpu->scratch.sum_of_squares;
  auto* a = static_cast<float*>(scratch.get(sizeof(float) * static_cast<size_t>(chunks + level_slots)));
  float* b = a + chunks;
  with_float_storage(x.dtype, [&](auto* type) {
    using X = std::remove_pointer_t<decltype(type)>;
    sum_of_squares_chunks_kernel<X>
        <<<static_cast<unsigned>(chunks), kSumThreads, 0, ctx.gpu->stream>>>(a, static_cast<const X*>(x.data), n);
  });
  check_launch(*ctx.gpu, op, what);
  for (int64_t m = chunks; m > 1; m = (m + kSumThreads - 1) / kSumThreads) {
    const int64_t groups = (m + kSumThreads - 1) / kSumThreads;
    sum_of_squares_level_kernel<<<static_cast<unsigned>(groups), kSumThreads, 0, ctx.gpu->stream>>>(b, a, m);
    check_launch(*ctx.gpu, op, what + " (tree level of " + std::to_string(m) + " partials)");
    std::swap(a, b);
  }
  float result = 0.0f;
  check(cudaMemcpy(&result, a, sizeof result, cudaMemcpyDeviceToHost), op, what + " (read result)");
  return static_cast<double>(result);
}

void sum_of_squares_chunks(const OpContext& ctx, const Tensor& partials, const Tensor& x) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const int64_t chunks = partials.numel();
  with_float_storage(x.dtype, [&](auto* type) {
    using X = std::remove_pointer_t<decltype(type)>;
    sum_of_squares_chunks_kernel<X><<<static_cast<unsigned>(chunks), kSumThreads, 0, ctx.gpu->stream>>>(
        partials.f32(), static_cast<const X*>(x.data), n);
  });
  check_launch(*ctx.gpu, "sum_of_squares_chunks", "x " + x.shape_str() + " (" + std::to_string(chunks) + " chunks)");
}

void adamw_update_multi(const OpContext& ctx, const Tensor& param, const Tensor& master, const Tensor& grad,
                        const Tensor& m, const Tensor& v, const ElementRanges& no_decay, const AdamWStep& step) {
  constexpr const char* op = "adamw_update_multi";
  const int64_t n = master.numel();
  const num::AdamWHyper decay =
      num::adamw_hyper(step.lr, step.beta1, step.beta2, step.eps, step.weight_decay, step.step, step.grad_scale);
  const num::AdamWHyper plain =
      num::adamw_hyper(step.lr, step.beta1, step.beta2, step.eps, 0.0f, step.step, step.grad_scale);
  if (n == 0) return;
  const unsigned grid = grid_capped(n, kThreads);
  const std::string what = "master " + master.shape_str() + " param " + param.shape_str() + " grad " +
                           dtype_name(grad.dtype) + " m " + dtype_name(m.dtype) + " v " + dtype_name(v.dtype) + " (" +
                           std::to_string(no_decay.count) + " no-decay ranges)";
  // One instantiation per storage combination (param, grad, m, v each FP32 or bf16 bits).
  with_float_storage(param.dtype, [&](auto* p) {
    with_float_storage(grad.dtype, [&](auto* g) {
      with_float_storage(m.dtype, [&](auto* m1) {
        with_float_storage(v.dtype, [&](auto* m2) {
          using P = std::remove_pointer_t<decltype(p)>;
          using G = std::remove_pointer_t<decltype(g)>;
          using M = std::remove_pointer_t<decltype(m1)>;
          using V = std::remove_pointer_t<decltype(m2)>;
          adamw_multi_kernel<P, G, M, V><<<grid, kThreads, 0, ctx.gpu->stream>>>(
              param.numel() == 0 ? nullptr : static_cast<P*>(param.data), f32_out(master), static_cast<M*>(m.data), static_cast<V*>(v.data),
              static_cast<const G*>(grad.data), n, no_decay.device, no_decay.count, decay, plain, ctx.round_bf16);
        });
      });
    });
  });
  check_launch(*ctx.gpu, op, what);
}

void copy_master_to_param(const OpContext& ctx, const Tensor& param, const Tensor& master) {
  constexpr const char* op = "copy_master_to_param";
  const int64_t n = master.numel();
  if (n == 0) return;
  const unsigned grid = grid_capped(n, kThreads);
  if (param.dtype == DType::BF16)
    copy_master_kernel<uint16_t>
        <<<grid, kThreads, 0, ctx.gpu->stream>>>(bf16_out(param), f32_in(master), n, ctx.round_bf16);
  else
    copy_master_kernel<float>
        <<<grid, kThreads, 0, ctx.gpu->stream>>>(f32_out(param), f32_in(master), n, ctx.round_bf16);
  check_launch(*ctx.gpu, op, "master " + master.shape_str() + " param " + param.shape_str());
}

}  // namespace pl::cuda
