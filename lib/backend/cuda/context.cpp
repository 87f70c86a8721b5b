#include "backend/cuda/context.h"

#include <atomic>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm.h"

namespace pl::cuda {

namespace {

std::atomic<int> g_opened_sm{0};

Context make_context() {
  Context c;
  check(cudaGetDevice(&c.device), "cudaGetDevice", "");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, c.device), "cudaGetDeviceProperties", "device " + std::to_string(c.device));
  c.sm = prop.major * 10 + prop.minor;
  c.num_sms = prop.multiProcessorCount;
  c.name = prop.name;
  if (c.sm < kMinCudaSm)
    throw_error("GPU " + std::to_string(c.device) + " (" + c.name + ") has compute capability " +
                std::to_string(prop.major) + "." + std::to_string(prop.minor) +
                "; the CUDA backend needs sm_80 or newer (BF16 tensor cores): use --device cpu");
  check(cublasLtCreate(&c.lt), "cublasLtCreate", "");
  c.workspace_bytes = size_t{32} << 20;
  check(cudaMalloc(&c.workspace, c.workspace_bytes), "cudaMalloc", "cuBLASLt workspace 32 MiB");
  check(cudnnCreate(&c.cudnn), "cudnnCreate", "");
  g_opened_sm.store(c.sm);
  return c;
}

}  // namespace

Context& context() {
  static Context c = make_context();
  return c;
}

int opened_context_sm() { return g_opened_sm.load(); }

int current_context_sm() { return context().sm; }

}  // namespace pl::cuda
