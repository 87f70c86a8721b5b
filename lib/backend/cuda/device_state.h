#pragma once
// The CUDA backend's per-device state: everything an op on one GPU may use, reached only through
// OpContext::gpu (backend/ops.h). No op keeps device state anywhere else (no statics, no singletons).
// Opened once by open_device_state (pl::open_device_state, backend/ops.h; the app before its model through
// backend/device_info.h, tests through cuda_ctx()), which rejects GPUs older than sm_80 (BF16 tensor
// cores: kMinCudaSm) and builds without device code for the GPU, and closed by its owning handle. Plain
// C++ over the CUDA headers: nvcc and g++ include it (the apps ask backend/device_info.h instead).
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/quantize.h"
#include "backend/device_memory.h"

namespace pl::cuda {

struct LtPlanCache;      // gemm.cpp: the cuBLASLt plans, made once per GEMM key
struct AttentionGraphs;  // attention.cpp: the cuDNN SDPA graphs and their shared workspace

// Device scalars allocated once (no allocation per call): a slot the GEMM alpha is computed into
// (GEMMs are ordered on the compute stream, so one slot is enough), the constants 0 and 1 (beta in
// device pointer mode), and the emulated GEMM's inexact-element counter.
struct GemmScalars {
  float* alpha = nullptr;
  const float* zero = nullptr;
  const float* one = nullptr;
  unsigned long long* inexact = nullptr;
};

// A grow-only device buffer (arena-backed: Buffer(…, Device::CUDA)): it allocates only when a larger
// size is asked for, so after the first training step no allocation happens. Growing frees the old
// buffer first, so inside the device arena the new one can take the old space (the arena reuses freed
// blocks, core/tensor.h): safe with work still queued, as everything runs on the one compute stream.
class DeviceScratch {
 public:
  void* get(size_t bytes) {
    if (bytes > buf_.bytes()) {
      buf_ = Buffer();
      buf_ = Buffer(bytes, Device::CUDA);
    }
    return buf_.data();
  }

 private:
  Buffer buf_;
};

struct DeviceState {
  int device = 0;
  int sm = 0;  // compute capability * 10 + minor, e.g. 80, 89, 90, 100, 103, 120
  int num_sms = 0;
  std::string name;  // e.g. "NVIDIA H100 80GB HBM3"
  // The compute stream: every kernel launch, cuBLASLt, cuDNN and CUB call and async copy of an op runs
  // on it. It is the legacy default stream (0), deliberately: host<->device copies (core/tensor.h),
  // the arena's frees and the timers' events (core/timers.cpp) use that stream too, so everything is
  // ordered without events. A created stream means changing it here and giving those three the stream.
  cudaStream_t stream = nullptr;
  // Data parallelism's collectives (parallel/nccl_communicator.cpp) run on their own stream so a bucket's
  // reduce-scatter overlaps the rest of the backward. Non-blocking (cudaStreamNonBlocking): a stream
  // created with the default flag would synchronize with the legacy default stream above before and
  // after every operation, and nothing would overlap. Highest priority: NCCL's kernels start as soon as
  // SMs free up instead of queueing behind the compute kernels' blocks. Ordering is explicit, by events:
  // before each collective `compute_ready` is recorded on `stream` and waited for by `comm_stream`; the
  // communicator's wait() records `comm_done` on `comm_stream` and makes `stream` wait for it. Created
  // when the state is opened (also for one rank: a stream and two events cost nothing), destroyed with it.
  cudaStream_t comm_stream = nullptr;
  cudaEvent_t compute_ready = nullptr;
  cudaEvent_t comm_done = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;  // cuBLASLt workspace, 256-byte aligned (SPEC-GPU §2: 32 MiB on sm90/sm10x)
  size_t workspace_bytes = 0;
  cudnnHandle_t cudnn = nullptr;
  GemmScalars scalars;
  // Empty caches made when the state is opened (shared_ptr: their types are complete only in gemm.cpp
  // and attention.cpp, whose make_* functions below create them).
  std::shared_ptr<LtPlanCache> plans;
  std::shared_ptr<AttentionGraphs> attention;
  // Grow-only scratch, one per op that needs temporary device memory.
  struct {
    DeviceScratch embedding_sort, rmsnorm_dw, sum_of_squares, quant_stats;
  } scratch;
  // The backward attention's algorithm: false (the default) lets cuDNN pick its fastest, possibly
  // non-deterministic one, as Transformer Engine does; true asks for the deterministic one
  // (pretrain_llama --deterministic-mode). Read when a graph is built (both modes are cached).
  bool deterministic_attention = false;
  // Debug mode (pretrain_llama --cuda-sync-every-launch, the CUDA_LAUNCH_BLOCKING=1 idea as a program
  // switch): every launch waits for the device, so an asynchronous fault names its op and shapes.
  bool sync_every_launch = false;
  // pretrain_llama --quantize-kernels reference: the quantize kernels (amax and encode passes) and the
  // emulated GEMM's expand kernels as they were before issue 40 (the exact RHT inline, a separate amax
  // pass everywhere, one thread per byte in the expand), kept as the bit-for-bit reference of the fast
  // ones (the default, false): the GPU conformance suite compares the two, and a failing fast kernel can
  // be stepped around without blocking a training run.
  bool reference_quantize_kernels = false;
  // What tests use to take the emulated quantized-GEMM path on a GPU that has the native one, so one
  // GPU checks both (tests/cuda/cuda_test_util.h ForceEmulated). Never set by the application.
  bool force_emulated_gemm = false;
  // What tests use to run attention on the packed Q/K/V copies where cuDNN accepts the strided views
  // of the qkv rows, so one GPU checks both layouts (backend/cuda/attention.cpp). Never set by the
  // application.
  bool force_packed_attention = false;

  DeviceState();
  ~DeviceState();
  DeviceState(const DeviceState&) = delete;
  DeviceState& operator=(const DeviceState&) = delete;
};

std::shared_ptr<LtPlanCache> make_lt_plan_cache();          // gemm.cpp
std::shared_ptr<AttentionGraphs> make_attention_graphs();  // attention.cpp

// Opens the current GPU (see the top of this file); close_device_state releases what it holds.
DeviceState* open_device_state();
void close_device_state(DeviceState* state);
int device_sm(const DeviceState& state);
// Whether quantized_gemm runs `f` natively here: the one rule (quantized_gemm_native: FP8 on sm_89+,
// NVFP4/MXFP8 on sm_100/103), unless the test switch forces the emulated path.
bool gemm_native(const DeviceState& state, QuantFormat f);
// The loaded CUDA libraries' versions (pl::library_versions, backend/device_info.h). Needs no GPU.
std::vector<std::string> library_version_lines();

}  // namespace pl::cuda
