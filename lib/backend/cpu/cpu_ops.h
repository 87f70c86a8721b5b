#pragma once
// CPU reference implementations of every op of backend/op_list.h (same signatures; shapes and
// semantics there). One file per op family under backend/cpu/. Arguments arrive checked
// (backend/op_checks.cpp): every tensor on the CPU, floating tensors F32.
#include "backend/ops.h"
#include "backend/quantize.h"

namespace pl::cpu {
#define PL_OP(name, ret, timer, params, args) ret name params;
#define PL_QUANT_OP PL_OP
#include "backend/op_list.h"

// y[M,N] = alpha · a[M,K] · b[N,K]ᵀ (+ y when accumulate) through BLAS; y rounded to BF16 values
// when ctx.round_bf16 and not accumulating. (backend/cpu/linear.cpp)
void gemm_nt(const OpContext& ctx, const Tensor& y, const Tensor& a, const Tensor& b, float alpha, bool accumulate);
}  // namespace pl::cpu
