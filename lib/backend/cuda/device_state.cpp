#include "backend/cuda/device_state.h"

#include <dlfcn.h>
#include <fmt/format.h>

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
  s->workspace_bytes = kGemmWorkspaceBytes;
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

// What the loaded libraries report, which is what ran, whatever their file names say. NCCL and NVRTC are
// looked up with dlopen (the library does not link them); "not loadable" when the library path lacks them.
std::vector<std::string> library_version_lines() {
  const auto dotted = [](long long v) { return fmt::format("{}.{}", v / 1000, v / 10 % 100); };
  std::vector<std::string> lines;
  int rt = 0, drv = 0;
  const cudaError_t rt_err = cudaRuntimeGetVersion(&rt), drv_err = cudaDriverGetVersion(&drv);
  lines.push_back(fmt::format("CUDA runtime {} | CUDA driver API {}",
                              rt_err == cudaSuccess ? dotted(rt) : cudaGetErrorString(rt_err),
                              drv_err == cudaSuccess ? (drv ? dotted(drv) : "none (no driver)")
                                                     : cudaGetErrorString(drv_err)));
  int devices = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess) {
    lines.push_back(fmt::format("devices: none ({})", cudaGetErrorString(e)));
  } else {
    for (int d = 0; d < devices; ++d) {
      cudaDeviceProp p{};
      if (cudaGetDeviceProperties(&p, d) == cudaSuccess)
        lines.push_back(fmt::format("device {}: {}, sm_{}{}, {:.1f} GiB", d, p.name, p.major, p.minor,
                                    static_cast<double>(p.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0)));
    }
  }
  const size_t lt = cublasLtGetVersion();  // major*10000 + minor*100 + patch
  lines.push_back(fmt::format("cuBLASLt {}.{}.{}", lt / 10000, lt / 100 % 100, lt % 100));
  const size_t dnn = cudnnGetVersion();  // cuDNN 9: major*10000 + minor*100 + patch
  lines.push_back(fmt::format("cuDNN {}.{}.{} (built against {}.{}.{})", dnn / 10000, dnn / 100 % 100, dnn % 100,
                              CUDNN_MAJOR, CUDNN_MINOR, CUDNN_PATCHLEVEL));
  if (void* h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL)) {
    int v = 0;
    using Fn = int (*)(int*);
    if (auto fn = reinterpret_cast<Fn>(dlsym(h, "ncclGetVersion")); fn && fn(&v) == 0)  // major*10000+minor*100+patch
      lines.push_back(fmt::format("NCCL {}.{}.{}", v / 10000, v / 100 % 100, v % 100));
  } else {
    lines.push_back("NCCL not loadable (libnccl.so.2)");
  }
  void* nvrtc = nullptr;
  for (const char* name : {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"})
    if ((nvrtc = dlopen(name, RTLD_NOW | RTLD_LOCAL))) break;
  int nv_major = 0, nv_minor = 0;
  using NvrtcVersion = int (*)(int*, int*);
  const auto nvrtc_fn = nvrtc ? reinterpret_cast<NvrtcVersion>(dlsym(nvrtc, "nvrtcVersion")) : nullptr;
  lines.push_back(nvrtc_fn && nvrtc_fn(&nv_major, &nv_minor) == 0 ? fmt::format("NVRTC {}.{}", nv_major, nv_minor)
                                                                  : "NVRTC not loadable (libnvrtc.so.13)");
  return lines;
}

}  // namespace pl::cuda
