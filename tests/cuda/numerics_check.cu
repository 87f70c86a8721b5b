// Compiles every shared numerics header as device code for every configured architecture, so a
// header that is not valid __device__ code breaks the build here, not on a GPU machine. The
// kernel is launched by the GPU conformance tests (tests/cuda/) to compare against the host.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <stdexcept>

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

}  // namespace pl::cuda
