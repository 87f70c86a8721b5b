// CUDA elementwise ops (see backend/ops.h; CPU twin backend/cpu/elementwise.cpp).
// add: out = bf16(a + b), one element per thread (grid-stride; 8 per thread with 16-byte accesses
// when the pointers are 16-byte aligned, op_util.cuh); out may alias a or b since each
// element is read before it is written by the same thread. The fp32 add and the shared rounding
// make it bit-identical to the CPU. accumulate_bf16: acc = bf16(acc + delta) with an fp32 delta, the same
// way. fill_zero: cudaMemsetAsync on the compute stream (all-zero bytes
// are 0 in every dtype).
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/op_util.cuh"
#include "numerics/dropout.h"

namespace pl::cuda {

namespace {

constexpr int kThreads = 256;

// out, a, b: [n] bf16
__global__ void add_kernel(uint16_t* out, const uint16_t* a, const uint16_t* b, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    store_bf16(out, i, load_bf16(a, i) + load_bf16(b, i));
}

// acc [n] bf16 += delta [n] f32, rounded once
__global__ void accumulate_bf16_kernel(uint16_t* acc, const float* delta, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    store_bf16(acc, i, load_bf16(acc, i) + delta[i]);
}

// The 16-byte forms (op_util.cuh): grid-stride over the n / 8 whole vectors, then the n % 8 tail
// elements one per thread; every pointer 16-byte aligned (checked at launch).
__global__ void add_vec_kernel(uint16_t* out, const uint16_t* a, const uint16_t* b, int64_t n) {
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t vectors = n / kVec, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t v = first; v < vectors; v += stride) {
    float x[kVec], y[kVec];
    load8_bf16(a + v * kVec, x);
    load8_bf16(b + v * kVec, y);
#pragma unroll
    for (int j = 0; j < kVec; ++j) x[j] = x[j] + y[j];
    store8_bf16(out + v * kVec, x);
  }
  const int64_t i = vectors * kVec + first;
  if (i < n) store_bf16(out, i, load_bf16(a, i) + load_bf16(b, i));
}

__global__ void accumulate_bf16_vec_kernel(uint16_t* acc, const float* delta, int64_t n) {
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t vectors = n / kVec, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t v = first; v < vectors; v += stride) {
    float x[kVec], d[kVec];
    load8_bf16(acc + v * kVec, x);
    load8_f32(delta + v * kVec, d);
#pragma unroll
    for (int j = 0; j < kVec; ++j) x[j] = x[j] + d[j];
    store8_bf16(acc + v * kVec, x);
  }
  const int64_t i = vectors * kVec + first;
  if (i < n) store_bf16(acc, i, load_bf16(acc, i) + delta[i]);
}

// out, x: [n] bf16; out = bf16(s * x)
__global__ void scale_kernel(uint16_t* out, const uint16_t* x, float s, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    store_bf16(out, i, s * load_bf16(x, i));
}

__global__ void scale_vec_kernel(uint16_t* out, const uint16_t* x, float s, int64_t n) {
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t vectors = n / kVec, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t v = first; v < vectors; v += stride) {
    float a[kVec];
    load8_bf16(x + v * kVec, a);
#pragma unroll
    for (int j = 0; j < kVec; ++j) a[j] = s * a[j];
    store8_bf16(out + v * kVec, a);
  }
  const int64_t i = vectors * kVec + first;
  if (i < n) store_bf16(out, i, s * load_bf16(x, i));
}

struct DropoutArgs {
  uint64_t seed, counter;
  uint32_t stream_id, threshold;
  float keep_scale;
};

// out, x: [n] bf16; one thread per 4 elements (one Philox call), grid-stride.
__global__ void dropout_kernel(uint16_t* out, const uint16_t* x, DropoutArgs d, int64_t n) {
  const int64_t quads = (n + 3) / 4;
  for (int64_t q = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; q < quads;
       q += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint32_t w[4];
    num::dropout_words(d.seed, d.stream_id, d.counter, static_cast<uint64_t>(q), w);
    for (int64_t k = 0, i = 4 * q; k < 4 && i < n; ++k, ++i)
      store_bf16(out, i, num::dropout_value(load_bf16(x, i), w[k] >= d.threshold, d.keep_scale));
  }
}

// The 16-byte form: 8 elements (two Philox calls) per vector; the tail (n % 8) by dropout_kernel's rule.
__global__ void dropout_vec_kernel(uint16_t* out, const uint16_t* x, DropoutArgs d, int64_t n) {
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t vectors = n / kVec, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t v = first; v < vectors; v += stride) {
    float a[kVec];
    uint32_t w[kVec];
    load8_bf16(x + v * kVec, a);
    num::dropout_words(d.seed, d.stream_id, d.counter, static_cast<uint64_t>(2 * v), w);
    num::dropout_words(d.seed, d.stream_id, d.counter, static_cast<uint64_t>(2 * v + 1), w + 4);
#pragma unroll
    for (int j = 0; j < kVec; ++j) a[j] = num::dropout_value(a[j], w[j] >= d.threshold, d.keep_scale);
    store8_bf16(out + v * kVec, a);
  }
  const int64_t i = vectors * kVec + first;
  if (i < n) {
    uint32_t w[4];
    num::dropout_words(d.seed, d.stream_id, d.counter, static_cast<uint64_t>(i / 4), w);
    store_bf16(out, i, num::dropout_value(load_bf16(x, i), w[i % 4] >= d.threshold, d.keep_scale));
  }
}

}  // namespace

void accumulate_bf16(const OpContext& ctx, const Tensor& acc, const Tensor& delta) {
  constexpr const char* op = "accumulate_bf16";
  const int64_t n = acc.numel();
  if (n == 0) return;
  if (is_aligned16(acc.data) && is_aligned16(delta.data))
    accumulate_bf16_vec_kernel<<<grid_capped(n / kVec + 1, kThreads), kThreads, 0, ctx.gpu->stream>>>(
        bf16_out(acc), f32_in(delta), n);
  else
    accumulate_bf16_kernel<<<grid_capped(n, kThreads), kThreads, 0, ctx.gpu->stream>>>(bf16_out(acc), f32_in(delta),
                                                                                       n);
  check_launch(*ctx.gpu, op, "acc " + acc.shape_str());
}

void add(const OpContext& ctx, const Tensor& out, const Tensor& a, const Tensor& b) {
  constexpr const char* op = "add";
  const int64_t n = out.numel();
  if (n == 0) return;
  if (is_aligned16(out.data) && is_aligned16(a.data) && is_aligned16(b.data))
    add_vec_kernel<<<grid_capped(n / kVec + 1, kThreads), kThreads, 0, ctx.gpu->stream>>>(bf16_out(out), bf16_in(a),
                                                                                         bf16_in(b), n);
  else
    add_kernel<<<grid_capped(n, kThreads), kThreads, 0, ctx.gpu->stream>>>(bf16_out(out), bf16_in(a), bf16_in(b), n);
  check_launch(*ctx.gpu, op, "out " + out.shape_str());
}

void scale(const OpContext& ctx, const Tensor& out, const Tensor& x, float s) {
  constexpr const char* op = "scale";
  const int64_t n = out.numel();
  if (n == 0) return;
  if (is_aligned16(out.data) && is_aligned16(x.data))
    scale_vec_kernel<<<grid_capped(n / kVec + 1, kThreads), kThreads, 0, ctx.gpu->stream>>>(bf16_out(out), bf16_in(x),
                                                                                           s, n);
  else
    scale_kernel<<<grid_capped(n, kThreads), kThreads, 0, ctx.gpu->stream>>>(bf16_out(out), bf16_in(x), s, n);
  check_launch(*ctx.gpu, op, "out " + out.shape_str());
}

void dropout(const OpContext& ctx, const Tensor& out, const Tensor& x, float p, uint64_t seed, uint32_t stream_id,
             uint64_t counter) {
  constexpr const char* op = "dropout";
  const int64_t n = out.numel();
  if (n == 0) return;
  const DropoutArgs d{seed, counter, stream_id, num::dropout_threshold(p), num::dropout_scale(p)};
  if (is_aligned16(out.data) && is_aligned16(x.data))
    dropout_vec_kernel<<<grid_capped(n / kVec + 1, kThreads), kThreads, 0, ctx.gpu->stream>>>(bf16_out(out),
                                                                                             bf16_in(x), d, n);
  else
    dropout_kernel<<<grid_capped((n + 3) / 4, kThreads), kThreads, 0, ctx.gpu->stream>>>(bf16_out(out), bf16_in(x),
                                                                                        d, n);
  check_launch(*ctx.gpu, op, "out " + out.shape_str());
}

void fill_zero(const OpContext& ctx, const Tensor& x) {
  constexpr const char* op = "fill_zero";
  if (x.numel() == 0) return;
  check(cudaMemsetAsync(x.data, 0, x.bytes(), ctx.gpu->stream), op, "x " + x.shape_str());
}

}  // namespace pl::cuda
