// CUDA stream_triad: a = b + s·c, the STREAM benchmark's triad (McCalpin; CPU twin
// backend/cpu/stream_triad.cpp), the machine probe's bandwidth kernel (roofline/machine_ceilings.cpp).
// A grid-stride loop on the compute stream; when a, b and c are 16-byte aligned it moves float4s (one
// 16-byte load per operand per thread, the widest a thread issues), the n % 4 tail elements then go
// through the scalar kernel. Bit-identical to the CPU: one FP32 multiply and one add per element
// (--fmad=false, lib/CMakeLists.txt; the CPU builds with -ffp-contract=off).
#include <cstdint>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/op_util.cuh"

namespace pl::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void stream_triad_kernel(float* a, const float* b, const float* c, float s, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    a[i] = b[i] + s * c[i];
}

// n4 float4 vectors of each operand
__global__ void stream_triad_vec4_kernel(float4* a, const float4* b, const float4* c, float s, int64_t n4) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n4;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float4 x = b[i], y = c[i];
    a[i] = make_float4(x.x + s * y.x, x.y + s * y.y, x.z + s * y.z, x.w + s * y.w);
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

void stream_triad(const OpContext& ctx, const Tensor& a, const Tensor& b, const Tensor& c, float s) {
  constexpr const char* op = "stream_triad";
  const int64_t n = a.numel();
  if (n == 0) return;
  float* ap = f32_out(a);
  const float* bp = f32_in(b);
  const float* cp = f32_in(c);
  int64_t done = 0;
  if (aligned16(ap) && aligned16(bp) && aligned16(cp) && n >= 4) {
    const int64_t n4 = n / 4;
    stream_triad_vec4_kernel<<<grid_capped(n4, kThreads), kThreads, 0, ctx.gpu->stream>>>(
        reinterpret_cast<float4*>(ap), reinterpret_cast<const float4*>(bp), reinterpret_cast<const float4*>(cp), s,
        n4);
    check_launch(*ctx.gpu, op, "a " + a.shape_str());
    done = n4 * 4;
  }
  if (done < n) {
    stream_triad_kernel<<<grid_capped(n - done, kThreads), kThreads, 0, ctx.gpu->stream>>>(ap + done, bp + done,
                                                                                          cp + done, s, n - done);
    check_launch(*ctx.gpu, op, "a " + a.shape_str());
  }
}

}  // namespace pl::cuda
