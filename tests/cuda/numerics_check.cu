// Compiles every shared numerics header as device code for every configured architecture, so a
// header that is not valid __device__ code breaks the build here, not on a GPU machine. The
// kernel is launched by the GPU conformance tests (tests/cuda/) to compare against the host.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <stdexcept>

#include "backend/cuda/quantize_common.cuh"
#include "cuda/numerics_check.h"
#include "numerics/adamw.h"
#include "numerics/bf16.h"

namespace pl::cuda {

namespace {

// in: n floats -> bf16 bits and rounded values; one element per thread.
__global__ void bf16_round_kernel(const float* in, uint16_t* bits, float* rounded, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  bits[i] = num::float_to_bf16_bits(in[i]);
  rounded[i] = num::round_bf16(in[i]);
}

// One AdamW element per thread over flat fp32 buffers.
__global__ void adamw_kernel(float* master, float* m, float* v, const float* grad, int64_t n,
                             num::AdamWHyper h) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  num::adamw_element(master[i], m[i], v[i], grad[i], h);
}

// Every quantization numerics function once per thread (quant_numerics_item, numerics_check.h).
__global__ void quant_numerics_kernel(const float* in, uint8_t* out, int64_t n, uint64_t seed) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  quant_numerics_item(in + 16 * i, i, seed, out + kQuantCheckOutBytes * i);
}

// Grid-stride over the bit patterns [begin, end): per-thread counts, one atomic per block and counter.
template <int kFormat>
__global__ void conversion_check_kernel(uint64_t begin, uint64_t end, ConversionCheck* r) {
  __shared__ unsigned long long block_counts[3];
  if (threadIdx.x < 3) block_counts[threadIdx.x] = 0;
  __syncthreads();
  unsigned long long used = 0, raw = 0, raw_non_nan = 0;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t u = begin + blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; u < end; u += stride) {
    const float lo = num::bits_float(static_cast<uint32_t>(u));
    const float hi = num::bits_float(static_cast<uint32_t>(u) ^ kConversionPairMask);
    uint32_t got, bare, want;
    if constexpr (kFormat == static_cast<int>(ConversionFormat::E2M1)) {
      got = qk::cvt_e2m1x2(lo, hi);
      bare = qk::cvt_e2m1x2_raw(lo, hi);
      want = num::pack_e2m1_pair(num::float_to_e2m1(lo), num::float_to_e2m1(hi));
    } else {
      constexpr bool kE4M3 = kFormat == static_cast<int>(ConversionFormat::E4M3);
      got = qk::cvt_fp8x2<kE4M3>(lo, hi);
      bare = qk::cvt_fp8x2_raw<kE4M3>(lo, hi);
      want = kE4M3 ? (num::float_to_e4m3(lo) | (num::float_to_e4m3(hi) << 8))
                   : (num::float_to_e5m2(lo) | (num::float_to_e5m2(hi) << 8));
    }
    if (bare != want) {
      ++raw;
      if (!qk::is_nan(lo) && !qk::is_nan(hi)) ++raw_non_nan;
    }
    if (got != want) {
      ++used;
      if (*static_cast<volatile int*>(&r->recorded) < kConversionFirstMismatches) {
        const int k = atomicAdd(&r->recorded, 1);
        if (k < kConversionFirstMismatches) {
          r->input[k] = static_cast<uint32_t>(u);
          r->got[k] = got;
          r->want[k] = want;
        }
      }
    }
  }
  if (used != 0) atomicAdd(&block_counts[0], used);
  if (raw != 0) atomicAdd(&block_counts[1], raw);
  if (raw_non_nan != 0) atomicAdd(&block_counts[2], raw_non_nan);
  __syncthreads();
  if (threadIdx.x == 0) {
    if (block_counts[0] != 0) atomicAdd(&r->mismatches, block_counts[0]);
    if (block_counts[1] != 0) atomicAdd(&r->raw_mismatches, block_counts[1]);
    if (block_counts[2] != 0) atomicAdd(&r->raw_non_nan_mismatches, block_counts[2]);
    if (blockIdx.x == 0) {
      r->hw_paths = qk::hw_cvt_paths();
#if defined(__CUDA_ARCH__)
      r->cuda_arch = __CUDA_ARCH__;
#endif
    }
  }
}

void check(cudaError_t st, const char* what, int64_t n) {
  if (st != cudaSuccess)
    throw std::runtime_error(std::string(what) + " (n=" + std::to_string(n) + ") failed: " + cudaGetErrorString(st));
}

}  // namespace

void bf16_round_on_device(const float* in, uint16_t* bits, float* rounded, int64_t n) {
  const int threads = 256;
  const int64_t blocks = (n + threads - 1) / threads;
  bf16_round_kernel<<<static_cast<unsigned>(blocks), threads>>>(in, bits, rounded, n);
  check(cudaGetLastError(), "bf16_round_kernel launch", n);
  check(cudaDeviceSynchronize(), "bf16_round_kernel", n);
}

void adamw_on_device(float* master, float* m, float* v, const float* grad, int64_t n,
                     const num::AdamWHyper& h) {
  const int threads = 256;
  const int64_t blocks = (n + threads - 1) / threads;
  adamw_kernel<<<static_cast<unsigned>(blocks), threads>>>(master, m, v, grad, n, h);
  check(cudaGetLastError(), "adamw_kernel launch", n);
  check(cudaDeviceSynchronize(), "adamw_kernel", n);
}

void quant_numerics_on_device(const float* in, uint8_t* out, int64_t n, uint64_t seed) {
  const int threads = 128;
  const int64_t blocks = (n + threads - 1) / threads;
  quant_numerics_kernel<<<static_cast<unsigned>(blocks), threads>>>(in, out, n, seed);
  check(cudaGetLastError(), "quant_numerics_kernel launch", n);
  check(cudaDeviceSynchronize(), "quant_numerics_kernel", n);
}

ConversionCheck conversion_check_on_device(ConversionFormat format, uint64_t begin, uint64_t end) {
  const int64_t n = static_cast<int64_t>(end - begin);
  ConversionCheck* d = nullptr;
  check(cudaMalloc(&d, sizeof(ConversionCheck)), "conversion_check: cudaMalloc", n);
  ConversionCheck r;
  cudaError_t st = cudaMemcpy(d, &r, sizeof r, cudaMemcpyHostToDevice);
  if (st == cudaSuccess) {
    int sms = 0;
    (void)cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    const unsigned blocks = static_cast<unsigned>((sms > 0 ? sms : 132) * 16);
    switch (format) {
      case ConversionFormat::E4M3: conversion_check_kernel<0><<<blocks, 256>>>(begin, end, d); break;
      case ConversionFormat::E5M2: conversion_check_kernel<1><<<blocks, 256>>>(begin, end, d); break;
      case ConversionFormat::E2M1: conversion_check_kernel<2><<<blocks, 256>>>(begin, end, d); break;
    }
    st = cudaGetLastError();
    if (st == cudaSuccess) st = cudaDeviceSynchronize();
    if (st == cudaSuccess) st = cudaMemcpy(&r, d, sizeof r, cudaMemcpyDeviceToHost);
  }
  (void)cudaFree(d);
  check(st, "conversion_check_kernel", n);
  return r;
}

}  // namespace pl::cuda
