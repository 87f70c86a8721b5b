#pragma once
// Internal to the CUDA GEMMs (linear.cu, gemm.cpp): one checked cuBLASLt matmul with a cached
// algorithm, and the device scalars it needs. Plain C++ over the CUDA headers, so nvcc includes it.
//
// cuBLASLt is column-major: D[m,n] = alpha · op(A)[m,k] · op(B)[k,n] + beta · C, C = D here. A
// row-major matrix R[rows, cols] is the column-major matrix Rᵀ[cols, rows] with ld = cols, which
// gives the SPEC-GPU §2 mapping of our row-major GEMMs:
//   Y[M,N] = X[M,K] · W[N,K]ᵀ   ->  TN: A = W (T, k x m = K x N, ld K), B = X (N, K x M, ld K),
//                                       D = Y (N x M, ld N); m = N, n = M, k = K
//   dX[T,in] = dY[T,out] · W[out,in]   ->  NN: A = W (in x out, ld in), B = dY (out x T, ld out)
//   dW[out,in] += dY[T,out]ᵀ · X[T,in] ->  NT: A = X (in x T, ld in), B = dY (T, out x T, ld out)
#include <cublasLt.h>
#include <library_types.h>

#include <cstdint>
#include <string>

#include "backend/cuda/device_state.h"

namespace pl::cuda {

struct LtMatmul {
  const char* op = "";  // the op, for error messages
  std::string what;     // its row-major shapes, for error messages
  cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
  int64_t m = 0, n = 0, k = 0;  // column-major D[m, n], reduction k
  const void* A = nullptr;
  cudaDataType_t a_type = CUDA_R_16BF;
  int64_t lda = 0;
  const void* B = nullptr;
  cudaDataType_t b_type = CUDA_R_16BF;
  int64_t ldb = 0;
  void* D = nullptr;  // also C (read when accumulate)
  cudaDataType_t d_type = CUDA_R_16BF;
  int64_t ldd = 0;
  bool accumulate = false;  // beta = 1 (else 0)
  // Scales of cuBLAS's A and B: SCALAR_32F with a_scale/b_scale = device float* (FP8 per tensor,
  // nullptr = 1), or VEC16_UE4M3 / VEC32_UE8M0 with the swizzled block-scale bytes.
  cublasLtMatmulMatrixScale_t scale_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  const void* a_scale = nullptr;
  const void* b_scale = nullptr;
  bool quantized_inputs = false;  // FP8/FP4 operands: FAST_ACCUM is written (fast_accum, else 0)
  bool fast_accum = false;        // CUBLASLT_MATMUL_DESC_FAST_ACCUM = 1 (FP8 operands only)
  // alpha: a device float (then POINTER_MODE_DEVICE, and beta comes from the device constants
  // below) or, when nullptr, the host value alpha_host (POINTER_MODE_HOST).
  const float* alpha_device = nullptr;
  float alpha_host = 1.0f;
};

// Runs it on state.stream with state.workspace. The matmul descriptor, the three layouts
// and the algorithm (cublasLtMatmulAlgoGetHeuristic) are made once per (shape, types, layouts,
// transposes, scale mode, pointer mode, FAST_ACCUM, operand alignments) and cached in state.plans;
// a later call with that key only writes its scale pointers into the cached descriptor (host
// memory) and launches: no descriptor is created or destroyed in steady state. Every cuBLASLt call
// is checked (op, shapes, status); the message is built only on failure.
void lt_matmul(DeviceState& state, const LtMatmul& g);


// "bf16", "e4m3", "e2m1", ... for messages.
const char* lt_type_name(cudaDataType_t t);

}  // namespace pl::cuda
