#pragma once
// CPU reference implementations of every op of backend/op_list.h (same signatures; shapes and
// semantics there). One file per op family under backend/cpu/. Arguments arrive checked
// (backend/op_checks.cpp): every tensor on the CPU, floating tensors F32.
#include <vector>

#include "backend/ops.h"
#include "backend/quantize.h"

namespace pl::cpu {
#define PL_OP(name, ret, timer, params, args) ret name params;
#define PL_QUANT_OP PL_OP
#include "backend/op_list.h"

// y[M,N] = alpha · a[M,K] · b[N,K]ᵀ (+ y when accumulate) through FP32 SGEMM whatever the CPU GEMM engine;
// y rounded to BF16 values when ctx.round_bf16 and not accumulating. (backend/cpu/linear.cpp)
void gemm_nt_fp32(const OpContext& ctx, const Tensor& y, const Tensor& a, const Tensor& b, float alpha,
                  bool accumulate);
// p[rows, cols] (contiguous) rounded to BF16 values in place, rows threaded. (backend/cpu/linear.cpp)
void round_rows_bf16(float* p, int64_t rows, int64_t cols);

// Per-thread scratch of at least n floats that only grows, so steady-state calls do not allocate. One Tag
// per buffer: 0 and 1 attention (live at the same time), 2 the RMSNorm dw partials, 3 the Σx² partials.
template <int Tag>
float* thread_scratch(size_t n) {
  static thread_local std::vector<float> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

// An op's output amax (op_list.h, RMSNorm): m into every element of amax (f32 [1] or [2]); nothing when empty.
inline void store_out_amax(const Tensor& amax, float m) {
  if (amax.data == nullptr) return;
  for (int64_t i = 0; i < amax.numel(); ++i) amax.f32()[i] = m;
}

constexpr int64_t kColumnBlock = 64;  // columns a thread owns at a time (embedding and RMSNorm backward)
}  // namespace pl::cpu
