#pragma once
// Helpers shared by the hand-written CUDA ops (embedding, rmsnorm, rope, swiglu, elementwise,
// cross_entropy, optimizer): bf16 loads/stores through the shared numerics (so rounding is the CPU's
// num::round_bf16), typed pointers, launch shapes. (Arguments arrive checked: backend/op_checks.cpp;
// scratch and the stream come from the device state: device_state.h.)
// Plain C++17 + CUDA (no fmt, no core/error.h): included by .cu files only.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstddef>
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

// ---- 16-byte accesses ------------------------------------------------------------------------------
// The elementwise kernels move 8 bf16 (or 2 x 4 f32) per load/store instruction when every pointer
// they access that way is 16-byte aligned, rows included (a row length that is a multiple of 8); each
// launcher checks that and otherwise runs its scalar kernel, so results never depend on alignment.
// The float operations per element are the scalar kernels', in the same order (the lane sums keep
// their lanes: element i still goes to lane i % L). Little-endian: element 0 is the low half-word.
constexpr int kVec = 8;  // bf16 elements of one 16-byte access

inline bool is_aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
// Rows of `cols` elements from p are all 16-byte aligned and whole vectors.
inline bool rows_aligned16(const void* p, int64_t cols) { return is_aligned16(p) && cols % kVec == 0; }

__device__ __forceinline__ void load8_bf16(const uint16_t* p, float v[kVec]) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    v[2 * k] = num::bf16_bits_to_float(static_cast<uint16_t>(w[k] & 0xFFFFu));
    v[2 * k + 1] = num::bf16_bits_to_float(static_cast<uint16_t>(w[k] >> 16));
  }
}

// Rounds each value with the shared numerics (as store_bf16).
__device__ __forceinline__ void store8_bf16(uint16_t* p, const float v[kVec]) {
  uint32_t w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k)
    w[k] = static_cast<uint32_t>(num::float_to_bf16_bits(v[2 * k])) |
           (static_cast<uint32_t>(num::float_to_bf16_bits(v[2 * k + 1])) << 16);
  *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
}

__device__ __forceinline__ void load8_f32(const float* p, float v[kVec]) {
  const float4 lo = *reinterpret_cast<const float4*>(p), hi = *reinterpret_cast<const float4*>(p + 4);
  v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w, v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
}

__device__ __forceinline__ void store8_f32(float* p, const float v[kVec]) {
  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  *reinterpret_cast<float4*>(p + 4) = make_float4(v[4], v[5], v[6], v[7]);
}

// num::tree_sum over L lanes held kVec per thread by the L / kVec threads of one group (thread k: lanes
// k*kVec .. k*kVec+7), `lanes` the group's L floats of shared memory: the stride tree's additions, pair
// for pair (s = L/2 .. 32 in shared memory, 16 .. 1 by shuffles, as num::block_tree_sum). Block: the
// group is the whole block (__syncthreads), else one warp (L = 256). Returns the sum in every thread.
template <int L, bool Block>
__device__ __forceinline__ float vec_lane_tree_sum(const float acc[kVec], float* lanes) {
  static_assert(L >= 64 && (L & (L - 1)) == 0, "vec_lane_tree_sum: L must be a power of two >= 64");
  constexpr int kThreads = L / kVec;
  static_assert(Block || kThreads == 32, "vec_lane_tree_sum: a warp holds 256 lanes");
  const int k = static_cast<int>(threadIdx.x) % kThreads;
#pragma unroll
  for (int j = 0; j < kVec; ++j) lanes[k * kVec + j] = acc[j];
  if (Block) __syncthreads(); else __syncwarp();
#pragma unroll
  for (int s = L / 2; s >= 32; s >>= 1) {
    for (int i = k; i < s; i += kThreads) lanes[i] = lanes[i] + lanes[i + s];
    if (Block) __syncthreads(); else __syncwarp();
  }
  float a = 0.0f;
  if (k < 32) {
    a = lanes[k];
#pragma unroll
    for (int s = 16; s >= 1; s >>= 1) a = a + __shfl_down_sync(0xFFFFFFFFu, a, s);
    if (k == 0) lanes[0] = a;
  }
  if (Block) __syncthreads(); else __syncwarp();
  const float sum = lanes[0];
  if (Block) __syncthreads(); else __syncwarp();  // lanes may be reused after this
  return sum;
}

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
