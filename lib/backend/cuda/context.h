#pragma once
// Per-process CUDA state shared by every op: the device's properties, one cuBLASLt handle with its
// 32 MiB workspace (SPEC-GPU §2: sm90/sm10x), one cuDNN handle. Created on first use (checked);
// all work runs on the default stream, in order. Creation fails with one line on a GPU older than
// sm_80 (BF16 tensor cores are the floor: backend/quantize.h kMinCudaSm).
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstddef>
#include <string>

#include "backend/quantize.h"

namespace pl::cuda {

struct Context {
  int device = 0;
  int sm = 0;                     // compute capability * 10 + minor, e.g. 80, 89, 90, 100, 103, 120
  int num_sms = 0;
  std::string name;               // e.g. "NVIDIA H100 80GB HBM3"
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;      // cuBLASLt workspace, 256-byte aligned
  size_t workspace_bytes = 0;
  cudnnHandle_t cudnn = nullptr;
  // Whether this GPU runs `f`'s GEMM natively in cuBLASLt (else the emulated path): the one rule,
  // backend/quantize.h quantized_gemm_native (FP8 on sm_89+, NVFP4/MXFP8 on sm_100/103).
  bool native(QuantFormat f) const { return quantized_gemm_native(f, sm); }
};

Context& context();

}  // namespace pl::cuda
