#include "backend/cuda/context.h"

#include <string>

#include "backend/cuda/cuda_check.h"

namespace pl::cuda {

namespace {
Context make_context() {
  Context c;
  check(cudaGetDevice(&c.device), "cudaGetDevice", "");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, c.device), "cudaGetDeviceProperties", "device " + std::to_string(c.device));
  c.sm = prop.major * 10 + prop.minor;
  c.num_sms = prop.multiProcessorCount;
  check(cublasLtCreate(&c.lt), "cublasLtCreate", "");
  c.workspace_bytes = size_t{32} << 20;
  check(cudaMalloc(&c.workspace, c.workspace_bytes), "cudaMalloc", "cuBLASLt workspace 32 MiB");
  check(cudnnCreate(&c.cudnn), "cudnnCreate", "");
  return c;
}
}  // namespace

Context& context() {
  static Context c = make_context();
  return c;
}

}  // namespace pl::cuda
