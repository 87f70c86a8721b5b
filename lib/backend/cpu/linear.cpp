// CPU linear layers. The three GEMMs of a linear layer go through OpenBLAS SGEMM: operands are FP32
// storage holding BF16 values, accumulation is FP32 (BLAS order). The bf16-activation outputs (y, dx)
// are then rounded with num::round_bf16 when ctx.round_bf16; the weight gradient is an FP32
// accumulator (beta = 1) and is never rounded.
#include <cblas.h>

#include <climits>
#include <cstring>

#include "backend/cpu/cpu_ops.h"
#include "core/error.h"
#include "numerics/bf16.h"

namespace pl::cpu {
namespace {
// BLAS takes int dimensions (an implementation limit of this backend, on top of the op's checked shapes).
void check_matrix(const char* op, const char* name, const Tensor& t) {
  PL_CHECK(t.dim(0) < INT_MAX && t.dim(1) < INT_MAX, "{}: {} {} is too large for BLAS", op, name,
           t.shape_str());
}

void round_rows(float* p, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float* row = p + r * cols;
    for (int64_t c = 0; c < cols; ++c) row[c] = num::round_bf16(row[c]);
  }
}

// BLAS dimensions as int (checked < INT_MAX above); they convert to blasint, whatever its width.
int bi(int64_t v) { return static_cast<int>(v); }
int ld(int64_t v) { return static_cast<int>(v > 1 ? v : 1); }

}  // namespace

void gemm_nt(const OpContext& ctx, const Tensor& y, const Tensor& a, const Tensor& b, float alpha, bool accumulate) {
  constexpr const char* op = "gemm_nt";
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
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bi(M), bi(N), bi(K), alpha, a.f32(), ld(K), b.f32(), ld(K),
              accumulate ? 1.0f : 0.0f, y.f32(), ld(N));
  if (ctx.round_bf16 && !accumulate) round_rows(y.f32(), M, N);
}

void linear_forward(const OpContext& ctx, const Tensor& y, const Tensor& x, const Tensor& w) {
  // y[T,out] = x[T,in] · w[out,in]ᵀ
  gemm_nt(ctx, y, x, w, 1.0f, false);
}

void linear_backward_input(const OpContext& ctx, const Tensor& dx, const Tensor& dy, const Tensor& w) {
  const int64_t T = dy.dim(0), out = w.dim(0), in = w.dim(1);
  if (T == 0 || in == 0) return;
  if (out == 0) {
    std::memset(dx.data, 0, dx.bytes());
    return;
  }
  // dx[T,in] = dy[T,out] · w[out,in]
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, bi(T), bi(in), bi(out), 1.0f, dy.f32(), ld(out),
              w.f32(), ld(in), 0.0f, dx.f32(), ld(in));
  if (ctx.round_bf16) round_rows(dx.f32(), T, in);
}

void linear_backward_weight(const OpContext& ctx, const Tensor& dw, const Tensor& dy, const Tensor& x) {
  (void)ctx;  // dw is an FP32 accumulator: never rounded
  const int64_t T = x.dim(0), out = dy.dim(1), in = x.dim(1);
  if (T == 0 || out == 0 || in == 0) return;
  // dw[out,in] += dy[T,out]ᵀ · x[T,in]
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, bi(out), bi(in), bi(T), 1.0f, dy.f32(), ld(out),
              x.f32(), ld(in), 1.0f, dw.f32(), ld(in));
}

}  // namespace pl::cpu
