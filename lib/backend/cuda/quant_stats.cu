// CUDA quant_stats and columnwise_source (the telemetry of a copy and the values it was made from;
// backend/op_list.h). Per-element values use the shared lib/numerics/ functions in the CPU's order
// (quantize_common.cuh: dequantized_value), so columnwise_source is bit-exact;
// quant_stats counts are exact integers and its error sums are doubles reduced in a fixed order
// (per-block tree, then one block over the per-block partials): deterministic, equal to the CPU's
// OpenMP sums up to rounding of the summation order.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "backend/cuda/device_state.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/quantize_common.cuh"
#include "numerics/fp4.h"
#include "numerics/fp8.h"
#include "numerics/hadamard.h"
#include "numerics/nvfp4.h"
#include "numerics/swizzle.h"

namespace pl::cuda {

namespace {

using qk::kThreads;
using qk::kTile;
using qk::kTileLd;
using qk::CopyView;
using qk::copy_view;
using qk::dequantized_value;
using qk::kNvfp4;
using qk::block_scale;

// |code| of element (r, k) (the CPU's code_magnitude).
__device__ __forceinline__ uint8_t code_magnitude(const CopyView& c, int64_t r, int64_t k) {
  if (c.format == kNvfp4) {
    const uint8_t byte = c.data[r * (c.cols / 2) + k / 2];
    return static_cast<uint8_t>(((k & 1) ? (byte >> 4) : byte) & 0x7);
  }
  return static_cast<uint8_t>(c.data[r * c.cols + k] & 0x7F);
}

// ---- quant_stats -----------------------------------------------------------------------------------
struct StatsSums {
  double err2, ref2;
  unsigned long long saturated, underflow, counted;
};

struct StatsResult {
  StatsSums sums;
  float amax;
};

__device__ __forceinline__ void add_to(StatsSums& a, const StatsSums& b) {
  a.err2 += b.err2;
  a.ref2 += b.ref2;
  a.saturated += b.saturated;
  a.underflow += b.underflow;
  a.counted += b.counted;
}

// Tree sum over the block (kThreads threads) in a fixed order; the result is valid in thread 0.
__device__ StatsSums block_sum(const StatsSums& mine) {
  __shared__ StatsSums sh[kThreads];
  sh[threadIdx.x] = mine;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (static_cast<int>(threadIdx.x) < s) add_to(sh[threadIdx.x], sh[threadIdx.x + s]);
    __syncthreads();
  }
  return sh[0];
}

// Items are the quantization blocks (r, k0) of the copy (one element each for per-tensor FP8), as in
// the CPU's loop; one StatsSums per thread block into partial[blockIdx.x].
template <typename T>
__global__ void __launch_bounds__(kThreads)
    quant_stats_kernel(CopyView c, const T* __restrict__ ref, int blk, uint8_t max_mag, StatsSums* partial) {
  const int64_t per_row = c.cols / blk, items = c.rows * per_row;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  StatsSums acc{0.0, 0.0, 0ull, 0ull, 0ull};
  for (int64_t it = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; it < items; it += stride) {
    const int64_t r = it / per_row, k0 = it % per_row * blk;
    float bamax = 0.0f;
    bool all_zero = true;
    for (int64_t k = k0; k < k0 + blk; ++k) {
      const float v = dequantized_value(c, r, k);
      acc.saturated += code_magnitude(c, r, k) == max_mag ? 1ull : 0ull;
      const float x = qk::load_elem(ref, r * c.cols + k);
      const double d = static_cast<double>(v) - static_cast<double>(x);
      acc.err2 += d * d;
      acc.ref2 += static_cast<double>(x) * static_cast<double>(x);
      bamax = qk::max_abs(bamax, x);
      all_zero = all_zero && v == 0.0f;
    }
    if (bamax > 0.0f) {
      ++acc.counted;
      const bool under = blk > 1 ? block_scale(c, r, k0 / blk) == 0 : all_zero;
      acc.underflow += under ? 1ull : 0ull;
    }
  }
  const StatsSums total = block_sum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

// One block: partial[0..n) in a fixed order, plus the copy's amax.
__global__ void __launch_bounds__(kThreads)
    quant_stats_final_kernel(const StatsSums* partial, int n, const float* amax, StatsResult* out) {
  StatsSums acc{0.0, 0.0, 0ull, 0ull, 0ull};
  for (int i = static_cast<int>(threadIdx.x); i < n; i += kThreads) add_to(acc, partial[i]);
  const StatsSums total = block_sum(acc);
  if (threadIdx.x == 0) {
    out->sums = total;
    out->amax = *amax;
  }
}

// ---- columnwise_source -----------------------------------------------------------------------------
// out[C, R] = xᵀ (or RHT along out's rows, 16 consecutive x rows of one column at a time). One block
// per 64x64 tile of x; thread t writes 16 consecutive out elements of tile column t/4.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    columnwise_source_kernel(const T* __restrict__ x, int64_t R, int64_t C, int64_t tiles_c, bool rht,
                             float* __restrict__ out) {
  __shared__ float s[kTile][kTileLd];
  const int64_t tile = blockIdx.x;
  const int64_t r0 = tile / tiles_c * kTile, c0 = tile % tiles_c * kTile;
  qk::load_tile(s, x, R, C, r0, c0);
  __syncthreads();
  const int t = static_cast<int>(threadIdx.x);
  const int q = t / 4, seg = t % 4;
  const int64_t c = c0 + q, r = r0 + 16 * seg;
  if (c >= C || r >= R) return;
  float v[16];
  for (int k = 0; k < 16; ++k) v[k] = s[16 * seg + k][q];
  if (rht) num::rht16(v, v, num::kRhtSignMask);  // R % 16 == 0: the chunk is whole
  float* dst = out + c * R + r;
  if (r + 16 <= R && qk::aligned_to(dst, 16)) {
    for (int k = 0; k < 4; ++k)
      reinterpret_cast<float4*>(dst)[k] = make_float4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
  } else {
    const int n = R - r < 16 ? static_cast<int>(R - r) : 16;
    for (int k = 0; k < n; ++k) dst[k] = v[k];
  }
}

uint8_t max_code_magnitude(QuantFormat f) {
  return f == QuantFormat::NVFP4 ? 0x7 : (f == QuantFormat::FP8_E5M2 ? 0x7B : 0x7E);
}

}  // namespace

QuantStats quant_stats(const OpContext& ctx, const QuantizedCopy& c, QuantFormat f, const Tensor& ref) {
  DeviceState& st = *ctx.gpu;
  const CopyView v = copy_view(c, f);
  const int64_t blk = quant_block_size(f);
  const int64_t items = c.rows * (c.cols / blk);
  const int sms = st.num_sms;
  const unsigned grid = qk::grid_stride_blocks(items, kThreads, sms);
  // Sized for the largest grid this device ever uses, so the scratch is allocated on the first call only.
  const unsigned max_grid = qk::grid_stride_blocks(int64_t{1} << 40, kThreads, sms);
  const size_t partial_bytes = (static_cast<size_t>(max_grid) * sizeof(StatsSums) + 255) / 256 * 256;
  char* scratch = static_cast<char*>(st.scratch.quant_stats.get(partial_bytes + sizeof(StatsResult)));
  auto* partial = reinterpret_cast<StatsSums*>(scratch);
  auto* result = reinterpret_cast<StatsResult*>(scratch + partial_bytes);
  const std::string what = std::string(quant_format_name(f)) + " copy " + dims(c.rows, c.cols) + ", reference " +
                           ref.shape_str();
  if (ref.dtype == DType::BF16)
    quant_stats_kernel<uint16_t><<<grid, kThreads, 0, st.stream>>>(v, ref.ptr<const uint16_t>(), static_cast<int>(blk),
                                                     max_code_magnitude(f), partial);
  else
    quant_stats_kernel<float><<<grid, kThreads, 0, st.stream>>>(v, ref.ptr<const float>(), static_cast<int>(blk),
                                                  max_code_magnitude(f), partial);
  check_launch(st, "quant_stats: quant_stats_kernel", what);
  quant_stats_final_kernel<<<1, kThreads, 0, st.stream>>>(partial, static_cast<int>(grid), v.amax, result);
  check_launch(st, "quant_stats: quant_stats_final_kernel", what);
  StatsResult h{};
  check(cudaMemcpyAsync(&h, result, sizeof h, cudaMemcpyDeviceToHost, st.stream), "quant_stats: cudaMemcpyAsync", what);
  check(cudaStreamSynchronize(st.stream), "quant_stats: cudaStreamSynchronize", what);
  QuantStats s;
  s.amax = h.amax;
  s.saturated_fraction = static_cast<double>(h.sums.saturated) / static_cast<double>(c.rows * c.cols);
  s.underflow_fraction =
      h.sums.counted ? static_cast<double>(h.sums.underflow) / static_cast<double>(h.sums.counted) : 0.0;
  s.relative_error = h.sums.ref2 > 0.0 ? std::sqrt(h.sums.err2 / h.sums.ref2) : 0.0;
  return s;
}

void columnwise_source(const OpContext& ctx, const Tensor& out, const Tensor& x, bool rht) {
  DeviceState& st = *ctx.gpu;
  const int64_t rows = x.dim(0), cols = x.dim(1);
  const int64_t tiles_c = (cols + kTile - 1) / kTile;
  const int64_t tiles = (rows + kTile - 1) / kTile * tiles_c;
  const std::string what = "x " + x.shape_str() + (rht ? " rht" : "");
  if (x.dtype == DType::BF16)
    columnwise_source_kernel<uint16_t><<<static_cast<unsigned>(tiles), kThreads, 0, st.stream>>>(
        x.ptr<const uint16_t>(), rows, cols, tiles_c, rht, out.ptr<float>());
  else
    columnwise_source_kernel<float><<<static_cast<unsigned>(tiles), kThreads, 0, st.stream>>>(
        x.ptr<const float>(), rows, cols, tiles_c, rht, out.ptr<float>());
  check_launch(st, "columnwise_source: columnwise_source_kernel", what);
}

}  // namespace pl::cuda
