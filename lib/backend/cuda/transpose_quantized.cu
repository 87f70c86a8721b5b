// CUDA transpose_quantized (op_list.h; CPU twin backend/cpu/transpose_quantized.cpp): a frozen weight's Wᵀ made
// for dgrad into per-layer scratch.
//   codes: 32x32-element tiles through shared memory (threads 32 x 8, 4 elements each), coalesced reads of src's
//          rows and writes of dst's rows; NVFP4 nibbles unpacked into the tile and two packed per written byte.
//   scales (NVFP4): one thread per dst block scale, read from src's swizzled scales (the GPU's quantizer writes
//          only those), written compact and swizzled (the swizzled padding zeroed first).
// Bandwidth: the codes are read and written once (an 8B fc1 weight, NVFP4: 2 x 58.7 MB); byte-wide accesses keep a
// 32x32 tiled transpose near 50-60% of HBM on Hopper (~40 µs for that weight on an H200), well under its dgrad
// GEMM. Compiled, not run on a GPU yet (docs/GPU_RESULTS.md).
#include <cuda_runtime.h>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/op_util.cuh"
#include "numerics/swizzle.h"

namespace pl::cuda {

namespace {

constexpr int kTile = 32, kRowsPerPass = 8;

// src [R, C] codes -> dst [C, R]; kNvfp4: 4-bit codes, two per byte (element 2j in the low nibble).
template <bool kNvfp4>
__global__ void transpose_codes_kernel(uint8_t* dst, const uint8_t* src, int64_t R, int64_t C) {
  __shared__ uint8_t tile[kTile][kTile + 1];
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile, c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  for (int k = threadIdx.y; k < kTile; k += kRowsPerPass) {
    const int64_t r = r0 + k, c = c0 + threadIdx.x;
    uint8_t v = 0;
    if (r < R && c < C) v = kNvfp4 ? (src[r * (C / 2) + c / 2] >> (4 * (c & 1))) & 0xF : src[r * C + c];
    tile[k][threadIdx.x] = v;
  }
  __syncthreads();
  for (int k = threadIdx.y; k < kTile; k += kRowsPerPass) {
    const int64_t c = c0 + k;
    if (c >= C) continue;
    if (kNvfp4) {
      const int64_t r = r0 + 2 * threadIdx.x;
      if (threadIdx.x < kTile / 2 && r < R)
        dst[c * (R / 2) + r / 2] = static_cast<uint8_t>(tile[2 * threadIdx.x][k] | (tile[2 * threadIdx.x + 1][k] << 4));
    } else {
      const int64_t r = r0 + threadIdx.x;
      if (r < R) dst[c * R + r] = tile[threadIdx.x][k];
    }
  }
}

// dst's block scale (c, rb) = src's 2D block (rb, c/16): compact [C, R/16] and swizzled.
__global__ void transpose_scales_kernel(uint8_t* dst_compact, uint8_t* dst_swizzled, const uint8_t* src_swizzled,
                                        int64_t R, int64_t C) {
  const int64_t dst_blocks = R / 16, n = C * dst_blocks;
  const int64_t src_padded = num::padded_scale_cols(C / 16), dst_padded = num::padded_scale_cols(dst_blocks);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = i / dst_blocks, rb = i % dst_blocks;
    const uint8_t v = src_swizzled[num::swizzled_scale_offset(rb * 16, c / 16, src_padded)];
    dst_compact[i] = v;
    dst_swizzled[num::swizzled_scale_offset(c, rb, dst_padded)] = v;
  }
}

}  // namespace

void transpose_quantized(const OpContext& ctx, const QuantizedCopy& dst, const QuantizedCopy& src) {
  constexpr const char* op = "transpose_quantized";
  const int64_t R = src.rows, C = src.cols;
  const std::string shape = "src [" + std::to_string(R) + ", " + std::to_string(C) + "]";
  cudaStream_t stream = ctx.gpu->stream;
  const dim3 grid(static_cast<unsigned>((C + kTile - 1) / kTile), static_cast<unsigned>((R + kTile - 1) / kTile));
  const dim3 block(kTile, kRowsPerPass);
  const auto* s = static_cast<const uint8_t*>(src.data.data);
  auto* d = static_cast<uint8_t*>(dst.data.data);
  if (src.format == QuantFormat::NVFP4) {
    transpose_codes_kernel<true><<<grid, block, 0, stream>>>(d, s, R, C);
    check_launch(*ctx.gpu, op, shape);
    check(cudaMemsetAsync(dst.scales_swizzled.data, 0, dst.scales_swizzled.bytes(), stream), op, shape);
    const int64_t n = C * (R / 16);
    transpose_scales_kernel<<<grid_capped(n, 256), 256, 0, stream>>>(
        static_cast<uint8_t*>(dst.scales.data), static_cast<uint8_t*>(dst.scales_swizzled.data),
        static_cast<const uint8_t*>(src.scales_swizzled.data), R, C);
    check_launch(*ctx.gpu, op, shape);
  } else {
    transpose_codes_kernel<false><<<grid, block, 0, stream>>>(d, s, R, C);
    check_launch(*ctx.gpu, op, shape);
  }
  check(cudaMemcpyAsync(dst.amax.data, src.amax.data, sizeof(float), cudaMemcpyDeviceToDevice, stream), op, shape);
  check(cudaMemcpyAsync(dst.scale_inv.data, src.scale_inv.data, sizeof(float), cudaMemcpyDeviceToDevice, stream), op,
        shape);
}

}  // namespace pl::cuda
