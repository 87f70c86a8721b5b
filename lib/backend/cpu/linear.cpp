// CPU linear layers. Operands are FP32 storage holding BF16 values; every GEMM is BF16 products with FP32
// accumulation: through oneDNN's BF16 matmul where the CPU has BF16 dot products (onednn_gemm.h: the
// operands are first converted to 16-bit copies, exactly), else OpenBLAS SGEMM on the FP32 storage (the
// same products, exact in FP32; only the summation order differs). The bf16-activation outputs (y, dx) are
// then rounded with num::round_bf16 when ctx.round_bf16; the weight gradient is an FP32 accumulator
// (beta = 1) and is never rounded. ctx.round_bf16 = false (the plain-FP32 model of the finite-difference
// test) always takes SGEMM: its operands are not BF16 values.
#include <cblas.h>

#include <climits>
#include <cstring>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/onednn_gemm.h"
#include "core/error.h"
#include "numerics/bf16.h"

namespace pl::cpu {
namespace {
// BLAS takes int dimensions (an implementation limit of this backend, on top of the op's checked shapes).
void check_matrix(const char* op, const char* name, const Tensor& t) {
  PL_CHECK(t.dim(0) < INT_MAX && t.dim(1) < INT_MAX, "{}: {} {} is too large for BLAS", op, name,
           t.shape_str());
}

// BLAS dimensions as int (checked < INT_MAX above); they convert to blasint, whatever its width.
int bi(int64_t v) { return static_cast<int>(v); }
int ld(int64_t v) { return static_cast<int>(v > 1 ? v : 1); }

// A GEMM operand: row-major FP32 storage [rows, cols] holding BF16 values, read transposed when trans.
struct Operand {
  const float* data;
  int64_t rows, cols;
  bool trans;
  int64_t inner() const { return trans ? rows : cols; }  // the K it contributes
  MatLayout layout() const { return trans ? transposed(rows, cols, cols) : row_major(rows, cols, cols); }
};

// c[M,N] = alpha · op(a) · op(b) (+ c when accumulate): BF16 products, FP32 accumulation; through oneDNN when
// allowed (and the engine is oneDNN), else SGEMM.
void gemm_bf16_values(const OpContext& ctx, const char* op, float* c, int64_t M, int64_t N, const Operand& a,
                      const Operand& b, float alpha, bool accumulate, bool allow_onednn = true) {
  if (allow_onednn && ctx.round_bf16 && cpu_gemm_engine().onednn_bf16) {
    uint16_t* a16 = thread_bf16_scratch<0>(static_cast<size_t>(a.rows * a.cols));
    uint16_t* b16 = thread_bf16_scratch<1>(static_cast<size_t>(b.rows * b.cols));
    to_bf16_rows(a16, a.data, a.rows, a.cols, a.cols);
    to_bf16_rows(b16, b.data, b.rows, b.cols, b.cols);
    if (onednn_bf16_matmul(op, a16, a.layout(), b16, b.layout(), c, N, alpha, accumulate)) return;
  }
  const int64_t K = a.inner();
  cblas_sgemm(CblasRowMajor, a.trans ? CblasTrans : CblasNoTrans, b.trans ? CblasTrans : CblasNoTrans, bi(M), bi(N),
              bi(K), alpha, a.data, ld(a.cols), b.data, ld(b.cols), accumulate ? 1.0f : 0.0f, c, ld(N));
}

// y[M,N] = alpha · a[M,K] · b[N,K]ᵀ (+ y), rounded when a bf16 activation is written.
void gemm_nt(const OpContext& ctx, const char* op, const Tensor& y, const Tensor& a, const Tensor& b, float alpha,
             bool accumulate, bool allow_onednn) {
  check_matrix(op, "y", y);
  check_matrix(op, "a", a);
  check_matrix(op, "b", b);
  PL_CHECK(a.dim(1) == b.dim(1) && y.dim(0) == a.dim(0) && y.dim(1) == b.dim(0),
           "{}: y {} != a {} · b {}ᵀ", op, y.shape_str(), a.shape_str(), b.shape_str());
  const int64_t M = a.dim(0), K = a.dim(1), N = b.dim(0);
  if (M == 0 || N == 0) return;
  if (K == 0) {
    if (!accumulate) std::memset(y.data, 0, y.bytes());
    return;
  }
  // y[M,N] = alpha · a[M,K] · b[N,K]ᵀ (+ y)
  gemm_bf16_values(ctx, op, y.f32(), M, N, {a.f32(), M, K, false}, {b.f32(), N, K, true}, alpha, accumulate,
                   allow_onednn);
  if (ctx.round_bf16 && !accumulate) round_rows_bf16(y.f32(), M, N);
}

}  // namespace

void round_rows_bf16(float* p, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float* row = p + r * cols;
    for (int64_t c = 0; c < cols; ++c) row[c] = num::round_bf16(row[c]);
  }
}

void gemm_nt_fp32(const OpContext& ctx, const Tensor& y, const Tensor& a, const Tensor& b, float alpha,
                  bool accumulate) {
  gemm_nt(ctx, "quantized_gemm", y, a, b, alpha, accumulate, false);
}

void linear_forward(const OpContext& ctx, const Tensor& y, const Tensor& x, const Tensor& w) {
  // y[T,out] = x[T,in] · w[out,in]ᵀ
  gemm_nt(ctx, "linear_forward", y, x, w, 1.0f, false, true);
}

void linear_backward_input(const OpContext& ctx, const Tensor& dx, const Tensor& dy, const Tensor& w) {
  const int64_t T = dy.dim(0), out = w.dim(0), in = w.dim(1);
  if (T == 0 || in == 0) return;
  if (out == 0) {
    std::memset(dx.data, 0, dx.bytes());
    return;
  }
  // dx[T,in] = dy[T,out] · w[out,in]
  gemm_bf16_values(ctx, "linear_backward_input", dx.f32(), T, in, {dy.f32(), T, out, false}, {w.f32(), out, in, false},
                   1.0f, false);
  if (ctx.round_bf16) round_rows_bf16(dx.f32(), T, in);
}

void linear_backward_weight(const OpContext& ctx, const Tensor& dw, const Tensor& dy, const Tensor& x) {
  const int64_t T = x.dim(0), out = dy.dim(1), in = x.dim(1);
  if (T == 0 || out == 0 || in == 0) return;
  // dw[out,in] += dy[T,out]ᵀ · x[T,in]   (dw an FP32 accumulator, never rounded)
  gemm_bf16_values(ctx, "linear_backward_weight", dw.f32(), out, in, {dy.f32(), T, out, true}, {x.f32(), T, in, false},
                   1.0f, true);
}

}  // namespace pl::cpu
