#pragma once
// Helpers shared by the hand-written CUDA ops (embedding, rmsnorm, rope, swiglu, elementwise,
// cross_entropy, optimizer): bf16 loads/stores through the shared numerics (so rounding is the CPU's
// num::round_bf16), typed pointers, launch shapes. (Arguments arrive checked: backend/op_checks.cpp;
// scratch and the stream come from the device state: device_state.h.)
// Plain C++17 + CUDA (no fmt, no core/error.h): included by .cu files only.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_state.h"
#include "core/tensor.h"
#include "numerics/bf16.h"

namespace pl::cuda {

// ---- bf16 storage --------------------------------------------------------------------------------
// BF16 tensors hold raw bf16 bits (uint16_t); conversions are the shared numerics, bit-exact with
// the CPU backend's round_bf16.
__device__ __forceinline__ float load_bf16(const uint16_t* p, int64_t i) { return num::bf16_bits_to_float(p[i]); }
__device__ __forceinline__ void store_bf16(uint16_t* p, int64_t i, float v) { p[i] = num::float_to_bf16_bits(v); }

inline const uint16_t* bf16_in(const Tensor& t) { return static_cast<const uint16_t*>(t.data); }
inline uint16_t* bf16_out(const Tensor& t) { return static_cast<uint16_t*>(t.data); }
inline const float* f32_in(const Tensor& t) { return static_cast<const float*>(t.data); }
inline float* f32_out(const Tensor& t) { return static_cast<float*>(t.data); }
inline const int32_t* i32_in(const Tensor& t) { return static_cast<const int32_t*>(t.data); }

// ---- launch shapes ---------------------------------------------------------------------------------
// Elementwise kernels use grid-stride loops; the grid is capped so any n fits the grid limits.
inline unsigned grid_capped(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < (int64_t{1} << 20) ? blocks : (int64_t{1} << 20));
}

inline size_t align_up(size_t bytes, size_t alignment = 256) { return (bytes + alignment - 1) / alignment * alignment; }

}  // namespace pl::cuda
