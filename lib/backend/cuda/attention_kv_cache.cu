// CUDA attention against a KV cache (backend/op_list.h attention_kv_cache; CPU twin backend/cpu/attention_kv_cache.cpp):
// the generate tool's decode step (n = 1) and its prompt (n = prompt length, past = 0). Two kernels:
//   1. the new rows' k and v heads into rows [past, past + n) of the caches (one thread per element);
//   2. one block of kWarps warps per (new row i, query head h): warp w takes the keys j = w, w + kWarps, ... of
//      0 .. past + i; a lane holds head dims lane, lane + 32, ... (head_dim / 32 rounded up, at most 8) of q, of
//      its running output and of each key and value it reads (coalesced 64-byte rows). Per key the lanes' partial
//      dot products are summed by shuffles; the warp keeps an online softmax (running max m, sum l, output acc
//      rescaled by exp(m_old - m_new): Milakov and Gimelshein 2018, the flash-decoding split over keys); then
//      warp 0 merges the kWarps (m, l, acc) and writes acc / l as bf16.
// Everything in fp32 with num::exp_f32. The order of additions is not the CPU's (keys split over warps, dims over
// lanes), so the conformance test compares within fp32 rounding after bf16, not bit for bit. Not tuned: the tool
// reads the whole cache once per token per layer, which is the floor for decoding one sequence anyway.
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/op_util.cuh"
#include "numerics/exp.h"

namespace pl::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kMaxPerLane = 8;  // head_dim <= 256 (op_checks)

__global__ void kv_cache_append_kernel(uint16_t* kc, uint16_t* vc, const uint16_t* qkv, int64_t n, int64_t past,
                                       int64_t width, int64_t q_cols, int64_t kv) {
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n * kv;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = idx / kv, c = idx - i * kv;
    kc[(past + i) * kv + c] = qkv[i * width + q_cols + c];
    vc[(past + i) * kv + c] = qkv[i * width + q_cols + kv + c];
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int s = 16; s >= 1; s >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, s);
  return v;
}

// grid (n, q_heads), block 32 * kWarps
__global__ void kv_attention_kernel(uint16_t* out, const uint16_t* qkv, const uint16_t* kc, const uint16_t* vc,
                                    int64_t past, int q_heads, int kv_heads, int d, int64_t width, float scale) {
  __shared__ float s_m[kWarps], s_l[kWarps], s_acc[kWarps][32 * kMaxPerLane];
  const int64_t i = blockIdx.x;
  const int h = blockIdx.y, g = h / (q_heads / kv_heads);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t kv = static_cast<int64_t>(kv_heads) * d, keys = past + i + 1;
  float q[kMaxPerLane], acc[kMaxPerLane];
#pragma unroll
  for (int u = 0; u < kMaxPerLane; ++u) {
    const int e = lane + 32 * u;
    q[u] = e < d ? load_bf16(qkv, i * width + static_cast<int64_t>(h) * d + e) : 0.0f;
    acc[u] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int64_t j = warp; j < keys; j += kWarps) {
    const uint16_t* k = kc + j * kv + static_cast<int64_t>(g) * d;
    const uint16_t* v = vc + j * kv + static_cast<int64_t>(g) * d;
    float part = 0.0f;
#pragma unroll
    for (int u = 0; u < kMaxPerLane; ++u) {
      const int e = lane + 32 * u;
      if (e < d) part += q[u] * load_bf16(k, e);
    }
    const float s = warp_sum(part) * scale;
    const float m_new = fmaxf(m, s);
    const float c = num::exp_f32(m - m_new), p = num::exp_f32(s - m_new);
    l = l * c + p;
#pragma unroll
    for (int u = 0; u < kMaxPerLane; ++u) {
      const int e = lane + 32 * u;
      if (e < d) acc[u] = acc[u] * c + p * load_bf16(v, e);
    }
    m = m_new;
  }
  if (lane == 0) {
    s_m[warp] = m;
    s_l[warp] = l;
  }
#pragma unroll
  for (int u = 0; u < kMaxPerLane; ++u) s_acc[warp][lane + 32 * u] = acc[u];
  __syncthreads();
  if (warp != 0) return;
  float mm = -INFINITY;
  for (int w = 0; w < kWarps; ++w) mm = fmaxf(mm, s_m[w]);
  float ll = 0.0f;
  float scale_w[kWarps];
  for (int w = 0; w < kWarps; ++w) {
    scale_w[w] = s_l[w] > 0.0f ? num::exp_f32(s_m[w] - mm) : 0.0f;  // a warp that saw no key adds nothing
    ll += s_l[w] * scale_w[w];
  }
#pragma unroll
  for (int u = 0; u < kMaxPerLane; ++u) {
    const int e = lane + 32 * u;
    if (e >= d) continue;
    float a = 0.0f;
    for (int w = 0; w < kWarps; ++w) a += s_acc[w][e] * scale_w[w];
    store_bf16(out, i * static_cast<int64_t>(q_heads) * d + static_cast<int64_t>(h) * d + e, a / ll);
  }
}

}  // namespace

void attention_kv_cache(const OpContext& ctx, const Tensor& out, const Tensor& k_cache, const Tensor& v_cache,
                        const Tensor& qkv, int64_t past, int64_t q_heads, int64_t kv_heads, int64_t head_dim) {
  constexpr const char* op = "attention_kv_cache";
  const int64_t n = qkv.dim(0), width = qkv.dim(1), kv = kv_heads * head_dim;
  constexpr int kThreads = 256;
  kv_cache_append_kernel<<<grid_capped(n * kv, kThreads), kThreads, 0, ctx.gpu->stream>>>(
      bf16_out(k_cache), bf16_out(v_cache), bf16_in(qkv), n, past, width, q_heads * head_dim, kv);
  check_launch(*ctx.gpu, op, "cache append of " + dims(n, kv) + " at row " + std::to_string(past));
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(q_heads));
  kv_attention_kernel<<<grid, 32 * kWarps, 0, ctx.gpu->stream>>>(
      bf16_out(out), bf16_in(qkv), bf16_in(k_cache), bf16_in(v_cache), past, static_cast<int>(q_heads),
      static_cast<int>(kv_heads), static_cast<int>(head_dim), width, 1.0f / sqrtf(static_cast<float>(head_dim)));
  check_launch(*ctx.gpu, op,
               std::to_string(n) + " new rows after " + std::to_string(past) + ", " + std::to_string(q_heads) +
                   " query / " + std::to_string(kv_heads) + " kv heads of dim " + std::to_string(head_dim));
}

}  // namespace pl::cuda
