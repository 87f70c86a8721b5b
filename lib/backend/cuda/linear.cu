// CUDA BF16 linear-layer GEMMs (backend/op_list.h) through cuBLASLt (gemm.cpp); their cuBLASLt
// configuration (TN / NN / NT in the column-major view) is listed in quantized_gemm.cu with the
// quantized ones. ctx.round_bf16 plays no part: cuBLASLt rounds the FP32 accumulator into a BF16
// output (round to nearest), which the CPU imitates with num::round_bf16; dw (FP32) is never rounded.
#include <fmt/format.h>

#include <cstdint>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/device_state.h"
#include "backend/cuda/gemm_lt.h"

namespace pl::cuda {

namespace {
// An empty reduction (K = 0): y = 0.
void zero_output(const DeviceState& st, const char* op, const Tensor& t) {
  check(cudaMemsetAsync(t.data, 0, t.bytes(), st.stream), op,
        "cudaMemsetAsync of " + t.shape_str() + " (empty reduction)");
}
}  // namespace

void linear_forward(const OpContext& ctx, const Tensor& y, const Tensor& x, const Tensor& w) {
  // round_bf16: cuBLASLt rounds the BF16 output (see the top of this file)
  constexpr const char* op = "linear_forward";
  const int64_t T = x.dim(0), in = x.dim(1), out = w.dim(0);
  if (T == 0 || out == 0) return;
  if (in == 0) return zero_output(*ctx.gpu, op, y);
  // y[T,out] = x[T,in] · w[out,in]ᵀ  ->  TN, m = out, n = T, k = in
  LtMatmul g;
  g.op = op;
  g.what = fmt::format("y {} = x {} · w {}ᵀ", y.shape_str(), x.shape_str(), w.shape_str());
  g.transa = CUBLAS_OP_T;
  g.transb = CUBLAS_OP_N;
  g.m = out;
  g.n = T;
  g.k = in;
  g.A = w.data;
  g.lda = in;
  g.B = x.data;
  g.ldb = in;
  g.D = y.data;
  g.ldd = out;
  lt_matmul(*ctx.gpu, g);
}

void linear_backward_input(const OpContext& ctx, const Tensor& dx, const Tensor& dy, const Tensor& w) {
  // round_bf16: cuBLASLt rounds the BF16 output
  constexpr const char* op = "linear_backward_input";
  const int64_t T = dy.dim(0), out = w.dim(0), in = w.dim(1);
  if (T == 0 || in == 0) return;
  if (out == 0) return zero_output(*ctx.gpu, op, dx);
  // dx[T,in] = dy[T,out] · w[out,in]  ->  column-major dxᵀ[in,T] = wᵀ[in,out] · dyᵀ[out,T]: NN,
  // m = in, n = T, k = out; w is column-major in x out (ld in), dy column-major out x T (ld out).
  LtMatmul g;
  g.op = op;
  g.what = fmt::format("dx {} = dy {} · w {}", dx.shape_str(), dy.shape_str(), w.shape_str());
  g.transa = CUBLAS_OP_N;
  g.transb = CUBLAS_OP_N;
  g.m = in;
  g.n = T;
  g.k = out;
  g.A = w.data;
  g.lda = in;
  g.B = dy.data;
  g.ldb = out;
  g.D = dx.data;
  g.ldd = in;
  lt_matmul(*ctx.gpu, g);
}

void linear_backward_weight(const OpContext& ctx, const Tensor& dw, const Tensor& dy, const Tensor& x) {
  // dw is an FP32 accumulator: never rounded
  constexpr const char* op = "linear_backward_weight";
  const int64_t T = x.dim(0), out = dy.dim(1), in = x.dim(1);
  if (T == 0 || out == 0 || in == 0) return;
  // dw[out,in] += dy[T,out]ᵀ · x[T,in]  ->  column-major dwᵀ[in,out] += xᵀ[in,T] · dy[T,out]: NT,
  // m = in, n = out, k = T; x is column-major in x T (ld in), dy column-major out x T (ld out, op T).
  LtMatmul g;
  g.op = op;
  g.what = fmt::format("dw {} += dy {}ᵀ · x {}", dw.shape_str(), dy.shape_str(), x.shape_str());
  g.transa = CUBLAS_OP_N;
  g.transb = CUBLAS_OP_T;
  g.m = in;
  g.n = out;
  g.k = T;
  g.A = x.data;
  g.lda = in;
  g.B = dy.data;
  g.ldb = out;
  g.D = dw.data;
  g.d_type = CUDA_R_32F;
  g.ldd = in;
  g.accumulate = true;
  lt_matmul(*ctx.gpu, g);
}

}  // namespace pl::cuda
