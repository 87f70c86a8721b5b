#pragma once
// What the device layer says about itself in the application's banner: the libraries this process
// loaded, how each GEMM format runs on the GPU, the attention algorithm cuDNN built. Lines come without
// the application's prefix. Dispatched like the ops (backend/ops.cpp): the CUDA backend answers in a
// CUDA build, a build without one says so.
#include <string>
#include <vector>

#include "backend/ops.h"
#include "backend/quantize.h"

namespace pl {

// --print-library-versions (scripts/gpu_check.sh): the CUDA runtime and driver, the devices, cuBLASLt,
// cuDNN, NCCL and NVRTC as the loaded libraries report them. Needs no GPU.
struct LibraryVersions {
  bool cuda_backend = false;  // false: this build has none (the one line says so)
  std::vector<std::string> lines;
};
LibraryVersions library_versions();

// The GPU of a training run: fails with one line when this build's CUDA attention has no cudnn-frontend,
// else opens the current GPU's state, points ctx.gpu at it with the run's switches and returns its owner.
DeviceStateHandle open_gpu_for_training(OpContext& ctx, bool deterministic_attention, bool sync_every_launch);
// How the BF16 GEMMs and each quantized format of `used` run on ctx's GPU (native or emulated); none on
// the CPU.
std::vector<std::string> gemm_banner_lines(const OpContext& ctx, const std::vector<QuantFormat>& used);
// Builds the cuDNN attention graphs of `shape` now (not in the first step) and allocates the workspace
// they ask for in the chosen mode; the line names the backward algorithm built and both workspaces next
// to the plan's estimate. Needs ctx's GPU.
std::string prepare_attention(const OpContext& ctx, const AttentionShape& shape, double planned_workspace);

}  // namespace pl
