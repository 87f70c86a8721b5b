// CUDA delayed_scaling_update (backend/quantize.h): FP8 delayed scaling's amax history and scales, one
// thread per tensor over the shared numerics (num::delayed_scaling_update_one), the CPU's bits.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_state.h"
#include "numerics/delayed_scaling.h"

namespace pl::cuda {

namespace {
constexpr int kThreads = 256;
}  // namespace

__global__ void __launch_bounds__(kThreads)
    delayed_scaling_update_kernel(float* history, float* scale, int64_t len, int64_t n, DelayedScalingRule rule) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= n) return;
  num::delayed_scaling_update_one(history, len, n, j, scale + j, rule.most_recent,
                                  j < rule.num_forward ? rule.forward_scaled_max : rule.backward_scaled_max);
}

void delayed_scaling_update(const OpContext& ctx, const Tensor& history, const Tensor& scale,
                            const DelayedScalingRule& rule) {
  const int64_t len = history.dim(0), n = history.dim(1);
  if (n == 0) return;
  const DeviceState& st = *ctx.gpu;
  const unsigned blocks = static_cast<unsigned>((n + kThreads - 1) / kThreads);
  delayed_scaling_update_kernel<<<blocks, kThreads, 0, st.stream>>>(history.ptr<float>(), scale.ptr<float>(), len, n,
                                                                    rule);
  check_launch(st, "delayed_scaling_update: delayed_scaling_update_kernel", "history " + history.shape_str());
}

}  // namespace pl::cuda
