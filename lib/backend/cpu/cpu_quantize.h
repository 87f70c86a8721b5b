#pragma once
// CPU implementations of the quantization ops in backend/quantize.h (same signatures).
#include "backend/quantize.h"

namespace pl::cpu {

// y[M,N] = alpha · a[M,K] · b[N,K]ᵀ (+ y when accumulate) through BLAS; y rounded to BF16 values
// when ctx.round_bf16 and not accumulating. (backend/cpu/linear.cpp)
void gemm_nt(const OpContext& ctx, const Tensor& y, const Tensor& a, const Tensor& b, float alpha, bool accumulate);

void quantize(const OpContext& ctx, QuantizedTensor& q, const Tensor& x, const QuantizeOptions& opt);
void dequantize(const OpContext& ctx, const Tensor& out, const QuantizedCopy& c, QuantFormat format);
void quantized_gemm(const OpContext& ctx, const Tensor& y, const QuantizedCopy& a, const QuantizedCopy& b,
                    QuantFormat format, bool accumulate, const Tensor& scratch_a, const Tensor& scratch_b);
QuantStats quant_stats(const OpContext& ctx, const QuantizedCopy& c, QuantFormat format, const Tensor& reference);
void columnwise_source(const OpContext& ctx, const Tensor& out, const Tensor& x, bool rht);

}  // namespace pl::cpu
