#pragma once
// The packed-layout copies of CUDA attention (attention_pack.cu, used by attention.cpp when cuDNN
// refuses the graph on strided views of the qkv rows). Plain C++ (nvcc and g++ include it).
//
// Shapes (bf16 elements; T = batch · seq tokens, W = (nq + 2 nkv) d the qkv row width):
//   qkv rows  [T, W]        row t = Q heads (nq d) | K heads (nkv d) | V heads (nkv d), as the QKV GEMM writes it
//   packed    Q [T, nq, d] at packed, K [T, nkv, d] at packed + T nq d, V [T, nkv, d] at packed + T (nq + nkv) d
// i.e. three contiguous token-major tensors, T·W elements in all: the layout cuDNN's SDPA calls BSHD
// (strides {S H d, d, H d, 1} for dims {B, H, S, d}), and the one packed-sequence (THD) attention with
// document masking needs, which can reuse these kernels.
#include <cstdint>

namespace pl::cuda {

struct DeviceState;  // device_state.h

// qkv rows -> packed Q, K, V. Both pointers 16-byte aligned (checked), d a multiple of 8.
void attention_pack_qkv(const DeviceState& state, const void* qkv, void* packed, int64_t tokens, int64_t q_heads,
                        int64_t kv_heads, int64_t head_dim);
// packed dQ, dK, dV -> dqkv rows (every element of dqkv is written).
void attention_unpack_dqkv(const DeviceState& state, const void* packed, void* dqkv, int64_t tokens,
                           int64_t q_heads, int64_t kv_heads, int64_t head_dim);

// ---- document-aware attention (issue 27): the tensors cuDNN's packed-sequence (THD) graphs read ----------
// For a graph of `bucket` documents (attention_document_bucket), in one grow-only scratch reserved at
// attention_prepare for the largest bucket: four ragged-offset arrays of bucket + 1 INT64 values (Q and
// dQ, K/V and dK/dV, O and dO, Stats), each the documents' first tokens times the elements per token of
// its tensor, then bucket INT32 document lengths. Entries past `count` are Transformer Engine's padding:
// length 0, offset at the end (T · unit). Each array starts 16-byte aligned (as TE aligns its offsets).
struct RaggedUnits {
  int64_t q = 0, kv = 0, o = 0, stats = 0;  // elements per token of Q, K/V, O, Stats
};
struct DocumentScratch {
  int64_t* off_q = nullptr;
  int64_t* off_kv = nullptr;
  int64_t* off_o = nullptr;
  int64_t* off_stats = nullptr;
  int32_t* seq_len = nullptr;
};
inline int64_t document_offsets_bytes(int64_t bucket) { return ((bucket + 1) * 8 + 15) / 16 * 16; }
inline DocumentScratch document_scratch_at(void* base, int64_t bucket) {
  auto* p = static_cast<char*>(base);
  const int64_t a = document_offsets_bytes(bucket);
  return DocumentScratch{reinterpret_cast<int64_t*>(p), reinterpret_cast<int64_t*>(p + a),
                         reinterpret_cast<int64_t*>(p + 2 * a), reinterpret_cast<int64_t*>(p + 3 * a),
                         reinterpret_cast<int32_t*>(p + 4 * a)};
}
// From the count + 1 document offsets on the device (DocumentBoundaries::device, tokens), one small
// kernel on the state's stream fills `out` for `bucket` >= count graphs.
void attention_document_offsets(const DeviceState& state, const int32_t* doc_offsets, int64_t count, int64_t bucket,
                                 RaggedUnits units, const DocumentScratch& out);

}  // namespace pl::cuda
