#pragma once
// Fixed-order FP32 sums shared by both backends (RMSNorm, cross-entropy, the gradient norm), so that a
// CUDA block and a CPU loop perform the same FP32 additions in the same order and get the same bits
// whenever the summed terms are the same. No FP64 (GPU kernels use these; GB300-class GPUs have almost
// none). The schedule is part of each op's definition: do not tune L without changing both backends.
//
//   lane sum over n terms t(0..n-1) with L lanes: term i goes to lane i % L; each lane starts at +0.0f
//     and adds its terms in increasing i, one FP32 addition each (lane += t(i)); the L lane values are
//     then combined by tree_sum. On the GPU lane k is thread k of an L-thread block (a strided loop),
//     and the tree is block_tree_sum below.
//   tree_sum(a, n): the pairwise tree in "stride" form: with P the smallest power of two >= n, for
//     s = P/2, P/4, ..., 1: a[k] = a[k] + a[k + s] for every k < s with k + s < n; the result is a[0].
//   group_tree_sum(a, n): a sum of any number of partials in levels of kTreeGroup: each level replaces
//     groups of kTreeGroup consecutive values (the last one possibly short, padded with +0.0f) by their
//     tree_sum over kTreeGroup slots, until one value is left (n == 1: a[0] itself). On the GPU one
//     block of kTreeGroup threads per group and one launch per level.
// Error: a lane sum of n terms is within about (n/L + log2 L) * 2^-24 relative of the exact sum of
// |terms| (FP32 recursive summation in each lane, then log2 L pairwise levels), e.g. ~2^-18 for an
// RMSNorm row of 4096 (L = 256) or a 128k-vocabulary cross-entropy row (L = 512).
#include <cstdint>

#include "numerics/hd.h"

namespace pl::num {

constexpr int kTreeGroup = 256;

// The schedules of the ops that use these sums (part of their results' definitions, both backends).
constexpr int kRmsNormLanes = 256;         // RMSNorm Σx² (forward) and Σ (g·w)·x (backward dx) per row
constexpr int64_t kRmsNormDwChunk = 128;   // RMSNorm dw: tokens per sequential FP32 chunk, chunks by tree_sum
constexpr int kCrossEntropyLanes = 512;    // cross-entropy Σ exp(x - max) per row
constexpr int64_t kSumSquaresChunk = 65536;  // gradient norm: elements per chunk (lane sum, kTreeGroup
                                             // lanes), chunk partials by group_tree_sum

// In place over a[0..n), n >= 1 (see the top of the file); a may be strided (element k at a[k * stride]).
PL_HD float tree_sum(float* a, int64_t n, int64_t stride = 1) {
  int64_t p = 1;
  while (p < n) p <<= 1;
  for (int64_t s = p >> 1; s >= 1; s >>= 1)
    for (int64_t k = 0; k < s && k + s < n; ++k) a[k * stride] = a[k * stride] + a[(k + s) * stride];
  return a[0];
}

#if !defined(__CUDA_ARCH__)
// Host: Σ t(i) for i < n with L lanes (see the top of the file). t is called once per term, in order.
template <int L, class Term>
inline float lane_sum(int64_t n, Term&& t) {
  float lane[L] = {};
  int64_t i = 0;
  for (; i + L <= n; i += L)
    for (int k = 0; k < L; ++k) lane[k] = lane[k] + t(i + k);
  for (int k = 0; i < n; ++i, ++k) lane[k] = lane[k] + t(i);
  return tree_sum(lane, L);
}

// Host: the group tree over v[0..n), n >= 1, in place (v is overwritten).
inline float group_tree_sum(float* v, int64_t n) {
  while (n > 1) {
    const int64_t groups = (n + kTreeGroup - 1) / kTreeGroup;
    for (int64_t g = 0; g < groups; ++g) {
      float slot[kTreeGroup];
      const int64_t base = g * kTreeGroup;
      for (int k = 0; k < kTreeGroup; ++k) slot[k] = base + k < n ? v[base + k] : 0.0f;
      v[g] = tree_sum(slot, kTreeGroup);
    }
    n = groups;
  }
  return v[0];
}
#endif

#if defined(__CUDACC__)
// Device: thread k (< L = blockDim.x, a power of two >= 64) contributes v; every thread gets
// tree_sum(lanes, L) with lane k = thread k's v, i.e. the same additions in the same order: the levels
// s >= 32 through shared memory (smem: L floats), the levels 16..1 by shuffles inside warp 0 (lane k adds
// lane k + s, which holds the previous level's a[k + s] for every k < s). All threads must call it.
template <int L>
__device__ __forceinline__ float block_tree_sum(float v, float* smem) {
  static_assert(L >= 64 && (L & (L - 1)) == 0, "block_tree_sum: L must be a power of two >= 64");
  const int k = static_cast<int>(threadIdx.x);
  smem[k] = v;
  __syncthreads();
#pragma unroll
  for (int s = L / 2; s >= 32; s >>= 1) {
    if (k < s) smem[k] = smem[k] + smem[k + s];
    __syncthreads();
  }
  if (k < 32) {
    float a = smem[k];
#pragma unroll
    for (int s = 16; s >= 1; s >>= 1) a = a + __shfl_down_sync(0xFFFFFFFFu, a, s);
    if (k == 0) smem[0] = a;
  }
  __syncthreads();
  const float r = smem[0];
  __syncthreads();  // smem may be reused by the caller after this
  return r;
}
#endif

}  // namespace pl::num
