#include "backend/device_banner.h"

#include <fmt/format.h>

#include "core/error.h"

#if defined(PL_WITH_CUDA)
#include "backend/cuda/attention_graph.h"
#include "backend/cuda/device_state.h"
#include "backend/cuda/gemm.h"
#endif

namespace pl {

#if defined(PL_WITH_CUDA)

LibraryVersions library_versions() { return {true, cuda::library_version_lines()}; }

DeviceStateHandle open_gpu_for_training(OpContext& ctx, bool deterministic_attention, bool sync_every_launch) {
  PL_CHECK(cuda::attention_has_cudnn_frontend(),
           "this build's CUDA attention has no cudnn-frontend headers (run scripts/setup.sh, which installs "
           "nvidia-cudnn-frontend, then reconfigure), so it cannot train on the GPU; use --device cpu");
  DeviceStateHandle state = open_device_state(Device::CUDA);
  ctx.gpu = state.get();
  ctx.gpu->deterministic_attention = deterministic_attention;
  ctx.gpu->sync_every_launch = sync_every_launch;
  return state;
}

std::vector<std::string> gemm_banner_lines(const OpContext& ctx, const std::vector<QuantFormat>& used) {
  if (ctx.device != Device::CUDA) return {};
  return cuda::gemm_backend_lines(*ctx.gpu, used);
}

std::string prepare_attention(const OpContext& ctx, const AttentionShape& shape, double planned_workspace) {
  const cuda::AttentionPlan ap = cuda::attention_prepare(*ctx.gpu, shape);
  return fmt::format("attention: cuDNN SDPA, backward algorithm {}{}; workspace forward {:.1f} MiB, backward "
                     "{:.1f} MiB (planned {:.1f} MiB with cuBLASLt's 32 MiB)",
                     ap.deterministic_backward ? "deterministic" : "non-deterministic",
                     ap.deterministic_requested
                         ? (ap.deterministic_backward ? " (--deterministic-mode)"
                                                      : " (--deterministic-mode asked for the deterministic one; "
                                                        "cuDNN has none for this shape on this GPU)")
                         : " (the default, as Transformer Engine's; --deterministic-mode for the deterministic one)",
                     static_cast<double>(ap.forward_workspace) / 1048576.0,
                     static_cast<double>(ap.backward_workspace) / 1048576.0, planned_workspace / 1048576.0);
}

#else

LibraryVersions library_versions() { return {false, {"this build has no CUDA backend: no CUDA libraries to report"}}; }

DeviceStateHandle open_gpu_for_training(OpContext&, bool, bool) {
  return open_device_state(Device::CUDA);  // a one-line error: no CUDA backend
}

std::vector<std::string> gemm_banner_lines(const OpContext&, const std::vector<QuantFormat>&) { return {}; }

std::string prepare_attention(const OpContext&, const AttentionShape&, double) {
  fail("prepare_attention: this build has no CUDA backend");
}

#endif

}  // namespace pl
