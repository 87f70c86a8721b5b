#pragma once
// Per-process CUDA state shared by every op: the device's properties, one cuBLASLt handle with its
// 32 MiB workspace (SPEC-GPU §2: sm90/sm10x), one cuDNN handle. Created on first use (checked);
// all work runs on the default stream, in order.
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstddef>

namespace pl::cuda {

struct Context {
  int device = 0;
  int sm = 0;                     // compute capability * 10 + minor, e.g. 90, 100, 103
  int num_sms = 0;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;      // cuBLASLt workspace, 256-byte aligned
  size_t workspace_bytes = 0;
  cudnnHandle_t cudnn = nullptr;
  bool native_fp4() const { return sm == 100 || sm == 103; }  // NVFP4/MXFP8 block-scaled GEMMs
};

Context& context();

}  // namespace pl::cuda
