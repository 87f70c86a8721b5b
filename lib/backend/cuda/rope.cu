// CUDA rotary position embedding, rotate-half (see backend/ops.h; CPU twin backend/cpu/rope.cpp).
// One thread per rotated pair (token t, head, i < d/2), in place on the bf16 qkv rows, at position
// positions[t] (TokenPositions' device copy, --reset-position-ids) or t % seq_len without them (per 8 adjacent
// pairs with 16-byte accesses when d/2 is a multiple of 8 and everything is aligned, op_util.cuh). The float
// expressions are the CPU's, in the same order (FMA contraction is off on both sides), and the
// rounding is num::float_to_bf16_bits, so the result is bit-identical to the CPU backend.
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/op_util.cuh"

namespace pl::cuda {

namespace {

constexpr int kThreads = 256;

// qkv[T, width] bf16 in place; cos/sin [>= S, half] f32. sign = +1 forward (angle θ), -1 backward (-θ).
// positions: i32 [T] on the device (values in [0, seq_len), checked on the host), or null: t % seq_len.
__device__ __forceinline__ int64_t token_position(const int32_t* positions, int64_t t, int64_t seq_len) {
  return positions != nullptr ? static_cast<int64_t>(positions[t]) : t % seq_len;
}

__global__ void rope_kernel(uint16_t* qkv, const float* cos_t, const float* sin_t, int64_t T, int64_t width,
                            const int32_t* positions, int64_t seq_len, int64_t rotated_heads, int64_t half,
                            float sign) {
  const int64_t n = T * rotated_heads * half;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = idx % half;
    const int64_t rest = idx / half;
    const int64_t hd = rest % rotated_heads;
    const int64_t t = rest / rotated_heads;
    const int64_t pos = token_position(positions, t, seq_len);
    const float c = cos_t[pos * half + i];
    const float sn = sign * sin_t[pos * half + i];
    uint16_t* x = qkv + t * width + hd * 2 * half;
    const float x1 = load_bf16(x, i), x2 = load_bf16(x, i + half);
    const float y1 = x1 * c - x2 * sn;
    const float y2 = x2 * c + x1 * sn;
    store_bf16(x, i, y1);
    store_bf16(x, i + half, y2);
  }
}

// The 16-byte form (op_util.cuh; half a multiple of 8, qkv rows and cos/sin aligned): one thread per 8
// adjacent pairs (t, head, i..i+7), the same expressions per pair.
__global__ void rope_vec_kernel(uint16_t* qkv, const float* cos_t, const float* sin_t, int64_t T, int64_t width,
                                const int32_t* positions, int64_t seq_len, int64_t rotated_heads, int64_t half,
                                float sign) {
  const int64_t groups = half / kVec, n = T * rotated_heads * groups;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = (idx % groups) * kVec;
    const int64_t rest = idx / groups;
    const int64_t hd = rest % rotated_heads;
    const int64_t t = rest / rotated_heads;
    const int64_t pos = token_position(positions, t, seq_len);
    float c[kVec], sn[kVec], x1[kVec], x2[kVec], y1[kVec], y2[kVec];
    load8_f32(cos_t + pos * half + i, c);
    load8_f32(sin_t + pos * half + i, sn);
    uint16_t* x = qkv + t * width + hd * 2 * half;
    load8_bf16(x + i, x1);
    load8_bf16(x + i + half, x2);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float s = sign * sn[j];
      y1[j] = x1[j] * c[j] - x2[j] * s;
      y2[j] = x2[j] * c[j] + x1[j] * s;
    }
    store8_bf16(x + i, y1);
    store8_bf16(x + i + half, y2);
  }
}

void rope(const OpContext& ctx, const char* op, const char* name, const Tensor& qkv, const Tensor& cos,
          const Tensor& sin, int64_t seq_len, int64_t rotated_heads, int64_t head_dim, const TokenPositions& positions,
          float sign) {
  const std::string n = name;
  const int64_t T = qkv.dim(0), width = qkv.dim(1), half = head_dim / 2;
  const int64_t pairs = T * rotated_heads * half;
  if (pairs == 0) return;
  if (rows_aligned16(qkv.data, width) && half % kVec == 0 && is_aligned16(cos.data) && is_aligned16(sin.data))
    rope_vec_kernel<<<grid_capped(pairs / kVec, kThreads), kThreads, 0, ctx.gpu->stream>>>(
        bf16_out(qkv), f32_in(cos), f32_in(sin), T, width, positions.device, seq_len, rotated_heads, half, sign);
  else
    rope_kernel<<<grid_capped(pairs, kThreads), kThreads, 0, ctx.gpu->stream>>>(
        bf16_out(qkv), f32_in(cos), f32_in(sin), T, width, positions.device, seq_len, rotated_heads, half, sign);
  check_launch(*ctx.gpu, op, n + " " + dims(T, width) + " seq_len " + std::to_string(seq_len) + " rotated heads " +
                       std::to_string(rotated_heads) + " head_dim " + std::to_string(head_dim) +
                       (positions.device != nullptr ? " with per-token positions" : ""));
}

}  // namespace

void rope_forward(const OpContext& ctx, const Tensor& qkv, const Tensor& cos, const Tensor& sin, int64_t seq_len,
                  int64_t rotated_heads, int64_t head_dim, const TokenPositions& positions) {
  rope(ctx, "rope_forward", "qkv", qkv, cos, sin, seq_len, rotated_heads, head_dim, positions, 1.0f);
}

void rope_backward(const OpContext& ctx, const Tensor& dqkv, const Tensor& cos, const Tensor& sin, int64_t seq_len,
                   int64_t rotated_heads, int64_t head_dim, const TokenPositions& positions) {
  rope(ctx, "rope_backward", "dqkv", dqkv, cos, sin, seq_len, rotated_heads, head_dim, positions, -1.0f);
}

}  // namespace pl::cuda
