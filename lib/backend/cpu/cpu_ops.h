#pragma once
// CPU reference implementations of the ops in backend/ops.h and backend/quantize.h (same
// signatures; see there for shapes and semantics). One file per op family under backend/cpu/.
#include "backend/ops.h"
#include "backend/quantize.h"

namespace pl::cpu {
#include "backend/backend_ops.inc"

// y[M,N] = alpha · a[M,K] · b[N,K]ᵀ (+ y when accumulate) through BLAS; y rounded to BF16 values
// when ctx.round_bf16 and not accumulating. (backend/cpu/linear.cpp)
void gemm_nt(const OpContext& ctx, const Tensor& y, const Tensor& a, const Tensor& b, float alpha, bool accumulate);
}  // namespace pl::cpu
