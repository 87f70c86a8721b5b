// Copies between the qkv rows and token-major contiguous Q, K, V (attention_pack.h has the shapes),
// for the packed attention layout (attention.cpp). Pure data movement: 16-byte vectorized loads and
// stores (8 bf16 per thread and step), every vector inside one head because head_dim % 8 == 0, so
// both sides are read and written in full 16-byte words; a grid-stride loop covers any T.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "backend/cuda/attention_pack.h"
#include "backend/cuda/op_util.cuh"

namespace pl::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kVec = 8;  // bf16 per 16-byte vector

// One vector index v in [0, T·W/8) names one 16-byte piece of row t = v / (W/8) at column c (in bf16
// elements); its place in the packed tensors is found per part (Q, K or V). `to_packed` chooses the
// direction: rows -> packed (the pack) or packed -> rows (the unpack of dQ, dK, dV).
template <bool to_packed>
__global__ void qkv_repack_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst, int64_t T, int64_t qd,
                                  int64_t kvd) {
  const int64_t row_vecs = (qd + 2 * kvd) / kVec;
  const int64_t n = T * row_vecs;
  for (int64_t v = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; v < n; v += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = v / row_vecs;
    const int64_t c = (v - t * row_vecs) * kVec;
    int64_t p;  // element offset in the packed buffer
    if (c < qd)
      p = t * qd + c;
    else if (c < qd + kvd)
      p = T * qd + t * kvd + (c - qd);
    else
      p = T * (qd + kvd) + t * kvd + (c - qd - kvd);
    if (to_packed)
      dst[p / kVec] = src[v];
    else
      dst[v] = src[p / kVec];
  }
}

std::string what_of(int64_t T, int64_t nq, int64_t nkv, int64_t d) {
  return "tokens " + std::to_string(T) + " q_heads " + std::to_string(nq) + " kv_heads " + std::to_string(nkv) +
         " head_dim " + std::to_string(d);
}

template <bool to_packed>
void repack(const DeviceState& state, const char* op, const void* src, void* dst, int64_t T, int64_t nq,
            int64_t nkv, int64_t d) {
  const auto misaligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 != 0; };
  if (d % kVec != 0 || misaligned(src) || misaligned(dst))
    throw_error(std::string(op) + " " + what_of(T, nq, nkv, d) +
                ": needs head_dim a multiple of 8 and 16-byte aligned buffers");
  const int64_t n = T * (nq + 2 * nkv) * d / kVec;
  if (n == 0) return;
  qkv_repack_kernel<to_packed><<<grid_capped(n, kThreads), kThreads, 0, state.stream>>>(
      static_cast<const uint4*>(src), static_cast<uint4*>(dst), T, nq * d, nkv * d);
  check_launch(state, op, what_of(T, nq, nkv, d));
}

// One thread per graph sequence i in [0, bucket]: its offsets (i == bucket: the end) and, for i < bucket,
// its length; sequences past `count` are empty and start at the end.
__global__ void document_offsets_kernel(const int32_t* __restrict__ doc, int64_t count, int64_t bucket,
                                        RaggedUnits u, DocumentScratch out) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i > bucket) return;
  const int64_t first = doc[i < count ? i : count];
  out.off_q[i] = first * u.q;
  out.off_kv[i] = first * u.kv;
  out.off_o[i] = first * u.o;
  out.off_stats[i] = first * u.stats;
  if (i < bucket) out.seq_len[i] = i < count ? doc[i + 1] - doc[i] : 0;
}

}  // namespace

void attention_document_offsets(const DeviceState& state, const int32_t* doc_offsets, int64_t count, int64_t bucket,
                                 RaggedUnits units, const DocumentScratch& out) {
  const std::string what = "documents " + std::to_string(count) + " bucket " + std::to_string(bucket);
  if (doc_offsets == nullptr || count < 1 || bucket < count)
    throw_error("attention_document_offsets " + what + ": needs the device offsets and 1 <= count <= bucket");
  const int64_t n = bucket + 1;
  document_offsets_kernel<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, state.stream>>>(
      doc_offsets, count, bucket, units, out);
  check_launch(state, "attention_document_offsets", what);
}

void attention_pack_qkv(const DeviceState& state, const void* qkv, void* packed, int64_t tokens, int64_t q_heads,
                        int64_t kv_heads, int64_t head_dim) {
  repack<true>(state, "attention_pack_qkv", qkv, packed, tokens, q_heads, kv_heads, head_dim);
}

void attention_unpack_dqkv(const DeviceState& state, const void* packed, void* dqkv, int64_t tokens,
                           int64_t q_heads, int64_t kv_heads, int64_t head_dim) {
  repack<false>(state, "attention_unpack_dqkv", packed, dqkv, tokens, q_heads, kv_heads, head_dim);
}

}  // namespace pl::cuda
