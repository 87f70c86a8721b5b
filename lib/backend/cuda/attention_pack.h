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

}  // namespace pl::cuda
