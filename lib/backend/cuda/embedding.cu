// CUDA token embedding (see backend/ops.h; CPU twin backend/cpu/embedding.cpp).
//
// Forward: a gather, one block per token copying its row's bf16 bits (bit-exact with the CPU).
// Both directions move 8 bf16 per access (8 adjacent columns per thread in the backward) when h is a
// multiple of 8 and the tensors are 16-byte aligned (op_util.cuh), the scalar kernels otherwise.
// Backward: dtable[V,h] fp32 += scatter of dout[T,h]. Deterministic and bit-identical to the CPU
// without float atomics: the token ids are stably radix-sorted with their positions (CUB), so the
// positions of each id are contiguous and in token order; for each run of equal ids, one thread per
// column walks those positions in order, accumulating in a register from the current dtable value.
// Every dtable element thus receives (((d + g_t1) + g_t2) + ...) in token order, the CPU's exact
// sequence of fp32 additions.
// Token ids are validated on the host before they are uploaded (LlamaModel::upload_batch, and the
// data pipeline names the sample), so there is no device-side index check and no read-back: nothing
// here blocks the host. An id outside [0, V) is still never used as an address: the forward writes a
// zero row for it and the backward skips it.
#include <cub/cub.cuh>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/op_util.cuh"

namespace pl::cuda {

namespace {

constexpr int kGatherThreads = 256;
constexpr int kScatterThreads = 256;

// grid: T blocks (one per token), block: threads over the h columns.
// out[T,h] bf16 = table[tokens[t], :] (bf16 bits copied); tokens[T] i32; table[V,h] bf16
__global__ void embedding_forward_kernel(uint16_t* out, const int32_t* tokens, const uint16_t* table, int64_t h,
                                         int64_t V) {
  const int64_t t = blockIdx.x;
  const int32_t tok = tokens[t];
  uint16_t* dst = out + t * h;
  if (tok < 0 || tok >= V) {  // not reachable from the model (ids are checked on the host): no OOB read
    for (int64_t c = threadIdx.x; c < h; c += blockDim.x) dst[c] = 0;
    return;
  }
  const uint16_t* src = table + static_cast<int64_t>(tok) * h;
  for (int64_t c = threadIdx.x; c < h; c += blockDim.x) dst[c] = src[c];
}

// The 16-byte form (h a multiple of 8, out and table aligned): 8 bf16 (a uint4 of bits) per access.
__global__ void embedding_forward_vec_kernel(uint4* out, const int32_t* tokens, const uint4* table, int64_t h8,
                                             int64_t V) {
  const int64_t t = blockIdx.x;
  const int32_t tok = tokens[t];
  uint4* dst = out + t * h8;
  if (tok < 0 || tok >= V) {
    for (int64_t c = threadIdx.x; c < h8; c += blockDim.x) dst[c] = make_uint4(0, 0, 0, 0);
    return;
  }
  const uint4* src = table + static_cast<int64_t>(tok) * h8;
  for (int64_t c = threadIdx.x; c < h8; c += blockDim.x) dst[c] = src[c];
}

// positions[T] = 0..T-1 (the sort's values)
__global__ void embedding_positions_kernel(int32_t* positions, int64_t T) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= T) return;
  positions[t] = static_cast<int32_t>(t);
}

// grid: (T, ceil(h / kScatterThreads)): x = sorted slot (only the first slot of each run of equal ids
// works), y = tile of columns, one column per thread. ids[T] sorted (as unsigned, so invalid negative
// ids sort after every valid one); positions[T] the token index of each slot, increasing within a
// run. dtable[V,h] f32 +=, dout[T,h] bf16. Loads are batched kBatch at a time for memory-level
// parallelism; the additions stay in token order.
__global__ void embedding_backward_kernel(float* dtable, const uint16_t* dout, const uint32_t* ids,
                                          const int32_t* positions, int64_t T, int64_t h, int64_t V) {
  constexpr int kBatch = 8;
  const int64_t first = blockIdx.x;
  const uint32_t id = ids[first];
  if (first > 0 && ids[first - 1] == id) return;
  if (static_cast<int64_t>(id) >= V) return;  // invalid (cannot come from the model: checked on the host)
  const int64_t c = blockIdx.y * static_cast<int64_t>(kScatterThreads) + threadIdx.x;
  if (c >= h) return;
  int64_t end = first + 1;
  while (end < T && ids[end] == id) ++end;
  float* cell = dtable + static_cast<int64_t>(id) * h + c;
  float acc = *cell;
  int64_t j = first;
  for (; j + kBatch <= end; j += kBatch) {
    float g[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) g[k] = load_bf16(dout, static_cast<int64_t>(positions[j + k]) * h + c);
#pragma unroll
    for (int k = 0; k < kBatch; ++k) acc += g[k];
  }
  for (; j < end; ++j) acc += load_bf16(dout, static_cast<int64_t>(positions[j]) * h + c);
  *cell = acc;
}

// The 16-byte form (h a multiple of 8, dout and dtable aligned): one thread per 8 adjacent columns,
// each column's additions in token order as above; grid y over tiles of 8 * kScatterThreads columns.
__global__ void embedding_backward_vec_kernel(float* dtable, const uint16_t* dout, const uint32_t* ids,
                                              const int32_t* positions, int64_t T, int64_t h, int64_t V) {
  constexpr int kBatch = 4;
  const int64_t first = blockIdx.x;
  const uint32_t id = ids[first];
  if (first > 0 && ids[first - 1] == id) return;
  if (static_cast<int64_t>(id) >= V) return;
  const int64_t c = (blockIdx.y * static_cast<int64_t>(kScatterThreads) + threadIdx.x) * kVec;
  if (c >= h) return;
  int64_t end = first + 1;
  while (end < T && ids[end] == id) ++end;
  float* cell = dtable + static_cast<int64_t>(id) * h + c;
  float acc[kVec];
  load8_f32(cell, acc);
  int64_t j = first;
  for (; j + kBatch <= end; j += kBatch) {
    float g[kBatch][kVec];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) load8_bf16(dout + static_cast<int64_t>(positions[j + k]) * h + c, g[k]);
#pragma unroll
    for (int k = 0; k < kBatch; ++k)
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc[e] += g[k][e];
  }
  for (; j < end; ++j) {
    float g[kVec];
    load8_bf16(dout + static_cast<int64_t>(positions[j]) * h + c, g);
#pragma unroll
    for (int e = 0; e < kVec; ++e) acc[e] += g[e];
  }
  store8_f32(cell, acc);
}

}  // namespace

void embedding_forward(const OpContext& ctx, const Tensor& out, const Tensor& tokens, const Tensor& table) {
  constexpr const char* op = "embedding_forward";
  const int64_t T = out.dim(0), h = out.dim(1), V = table.dim(0);
  if (T * h == 0) return;
  const std::string what = "out " + dims(T, h) + " table " + dims(V, h);
  if (rows_aligned16(out.data, h) && is_aligned16(table.data))
    embedding_forward_vec_kernel<<<static_cast<unsigned>(T), kGatherThreads, 0, ctx.gpu->stream>>>(
        static_cast<uint4*>(out.data), i32_in(tokens), static_cast<const uint4*>(table.data), h / kVec, V);
  else
    embedding_forward_kernel<<<static_cast<unsigned>(T), kGatherThreads, 0, ctx.gpu->stream>>>(
        bf16_out(out), i32_in(tokens), bf16_in(table), h, V);
  check_launch(*ctx.gpu, op, what);
}

void embedding_backward(const OpContext& ctx, const Tensor& dtable, const Tensor& dout, const Tensor& tokens) {
  constexpr const char* op = "embedding_backward";
  const int64_t T = dout.dim(0), h = dout.dim(1), V = dtable.dim(0);
  if (T == 0 || h == 0) return;
  const std::string what = "dout " + dims(T, h) + " dtable " + dims(V, h);
  const int n = static_cast<int>(T);

  // Scratch: [sort temp | positions in | ids out | positions out], each 256-byte aligned.
  const auto* ids_in = reinterpret_cast<const uint32_t*>(tokens.data);
  size_t temp_bytes = 0;
  check(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, ids_in, static_cast<uint32_t*>(nullptr),
                                        static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), n),
        op, what + " (radix sort size query)");
  const size_t arr = align_up(sizeof(int32_t) * static_cast<size_t>(T));
  const size_t temp_aligned = align_up(temp_bytes);
  DeviceScratch& scratch = ctx.gpu->scratch.embedding_sort;
  char* base = static_cast<char*>(scratch.get(temp_aligned + 3 * arr));
  auto* pos_in = reinterpret_cast<int32_t*>(base + temp_aligned);
  auto* ids_out = reinterpret_cast<uint32_t*>(base + temp_aligned + arr);
  auto* pos_out = reinterpret_cast<int32_t*>(base + temp_aligned + 2 * arr);

  embedding_positions_kernel<<<grid_for(T, kScatterThreads), kScatterThreads, 0, ctx.gpu->stream>>>(pos_in, T);
  check_launch(*ctx.gpu, op, what + " (positions)");
  // Stable LSD radix sort over all 32 bits: equal ids keep token order.
  check(cub::DeviceRadixSort::SortPairs(base, temp_bytes, ids_in, ids_out, pos_in, pos_out, n, 0, 32, ctx.gpu->stream),
        op, what + " (radix sort of token ids)");
  if (rows_aligned16(dout.data, h) && is_aligned16(dtable.data)) {
    const dim3 grid(static_cast<unsigned>(T), grid_for(h / kVec, kScatterThreads));
    embedding_backward_vec_kernel<<<grid, kScatterThreads, 0, ctx.gpu->stream>>>(f32_out(dtable), bf16_in(dout),
                                                                                 ids_out, pos_out, T, h, V);
  } else {
    const dim3 grid(static_cast<unsigned>(T), grid_for(h, kScatterThreads));
    embedding_backward_kernel<<<grid, kScatterThreads, 0, ctx.gpu->stream>>>(f32_out(dtable), bf16_in(dout), ids_out,
                                                                             pos_out, T, h, V);
  }
  check_launch(*ctx.gpu, op, what);
}

}  // namespace pl::cuda
