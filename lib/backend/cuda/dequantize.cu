// CUDA dequantize (backend/op_list.h): the exact values of one copy, element by element with the
// shared numerics in the CPU's order (quantize_common.cuh dequantized_value): bit-exact with the CPU.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_state.h"
#include "backend/cuda/quantize_common.cuh"

namespace pl::cuda {

namespace {

using qk::CopyView;
using qk::kThreads;

__global__ void __launch_bounds__(kThreads) dequantize_kernel(CopyView c, float* __restrict__ out) {
  const int64_t n = c.rows * c.cols;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = qk::dequantized_value(c, i / c.cols, i % c.cols);
}

}  // namespace

void dequantize(const OpContext& ctx, const Tensor& out, const QuantizedCopy& c, QuantFormat f) {
  DeviceState& st = *ctx.gpu;
  const CopyView v = qk::copy_view(c, f);
  const unsigned grid = qk::grid_stride_blocks(c.rows * c.cols, kThreads, st.num_sms);
  dequantize_kernel<<<grid, kThreads, 0, st.stream>>>(v, out.ptr<float>());
  check_launch(st, "dequantize: dequantize_kernel",
               std::string(quant_format_name(f)) + " copy " + dims(c.rows, c.cols));
}

}  // namespace pl::cuda
