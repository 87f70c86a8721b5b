#include "backend/cuda/device_state.h"

#include <cstring>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm.h"

namespace pl::cuda {

DeviceState::DeviceState() = default;

DeviceState::~DeviceState() {
  // Library objects first (the attention graphs and GEMM plans hold handles' resources), then the
  // handles and the memory. Statuses are ignored: nothing can be reported from a destructor.
  attention.reset();
  plans.reset();
  if (comm_done) cudaEventDestroy(comm_done);
  if (compute_ready) cudaEventDestroy(compute_ready);
  if (comm_stream) cudaStreamDestroy(comm_stream);
  if (cudnn) cudnnDestroy(cudnn);
  if (lt) cublasLtDestroy(lt);
  if (workspace) cudaFree(workspace);
  if (scalars.alpha) cudaFree(scalars.alpha);
}

DeviceState* open_device_state() {
  auto s = std::make_unique<DeviceState>();
  check(cudaGetDevice(&s->device), "cudaGetDevice", "");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, s->device), "cudaGetDeviceProperties", "device " + std::to_string(s->device));
  s->sm = prop.major * 10 + prop.minor;
  s->num_sms = prop.multiProcessorCount;
  s->name = prop.name;
  if (s->sm < kMinCudaSm)
    throw_error("GPU " + std::to_string(s->device) + " (" + s->name + ") has compute capability " +
                std::to_string(prop.major) + "." + std::to_string(prop.minor) +
                "; the CUDA backend needs sm_80 or newer (BF16 tensor cores): use --device cpu");
  check_kernel_image(*s);
  check(cublasLtCreate(&s->lt), "cublasLtCreate", "");
  s->workspace_bytes = size_t{32} << 20;
  check(cudaMalloc(&s->workspace, s->workspace_bytes), "cudaMalloc", "cuBLASLt workspace 32 MiB");
  check(cudnnCreate(&s->cudnn), "cudnnCreate", "");
  int least_priority = 0, greatest_priority = 0;  // see DeviceState::comm_stream
  check(cudaDeviceGetStreamPriorityRange(&least_priority, &greatest_priority), "cudaDeviceGetStreamPriorityRange", "");
  check(cudaStreamCreateWithPriority(&s->comm_stream, cudaStreamNonBlocking, greatest_priority),
        "cudaStreamCreateWithPriority", "communication stream");
  check(cudaEventCreateWithFlags(&s->compute_ready, cudaEventDisableTiming), "cudaEventCreateWithFlags",
        "communication: compute-ready event");
  check(cudaEventCreateWithFlags(&s->comm_done, cudaEventDisableTiming), "cudaEventCreateWithFlags",
        "communication: collectives-done event");
  s->plans = make_lt_plan_cache();
  s->attention = make_attention_graphs();
  // [0] alpha slot, [1] 0.0f, [2] 1.0f, [3] unused, then the 8-byte inexact counter at byte 16.
  void* p = nullptr;
  check(cudaMalloc(&p, 256), "cudaMalloc", "GEMM device scalars (256 bytes, once per device state)");
  s->scalars.alpha = static_cast<float*>(p);
  unsigned char init[24] = {};
  const float f[4] = {0.0f, 0.0f, 1.0f, 0.0f};
  static_assert(sizeof f == 16);
  std::memcpy(init, f, sizeof f);  // counter bytes stay 0
  check(cudaMemcpy(p, init, sizeof init, cudaMemcpyHostToDevice), "cudaMemcpy", "GEMM device scalars init");
  s->scalars.zero = s->scalars.alpha + 1;
  s->scalars.one = s->scalars.alpha + 2;
  s->scalars.inexact = reinterpret_cast<unsigned long long*>(static_cast<unsigned char*>(p) + 16);
  return s.release();
}

void close_device_state(DeviceState* state) { delete state; }

int device_sm(const DeviceState& state) { return state.sm; }

bool gemm_native(const DeviceState& state, QuantFormat f) {
  return quantized_gemm_native(f, state.sm) && !state.force_emulated_gemm;
}

}  // namespace pl::cuda
