#pragma once
// What the device layer says about itself: the libraries this process loaded, who the device is, how each GEMM
// format runs on it (as lines for a banner and as values for the run's records), the attention algorithm cuDNN
// built. Lines come without any application's prefix. Dispatched like the ops (backend/ops.cpp): the CUDA backend answers in a
// CUDA build, a build without one says so.
#include <string>
#include <vector>

#include "backend/gemm_algorithms.h"
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
// The library smoke test that --print-library-versions runs after the versions (scripts/gpu_check.sh runs
// it before anything else): on the current GPU, a cuDNN handle, the device state, a tiny cuDNN SDPA
// forward+backward graph built and run on training's packed QKV layout, a tiny cuBLASLt BF16 matmul and,
// where native (FP8 on sm_89+, NVFP4 on sm_100/103), an FP8 and an NVFP4 one, each against a host
// reference: one line each, "✓ ...", "✗ ..." with the library's status string, or "- ...: skipped: not
// native on sm_N". Then "loaded <library file>: <path>" for every NVIDIA library the process mapped,
// what cuDNN dlopened included. Without a device: one "✗ no CUDA device (...)" line. Without a CUDA
// backend: no lines. `passed`: every check passed or was skipped, and there was a device.
struct LibrarySmokeTest {
  bool passed = false;
  std::vector<std::string> lines;
};
LibrarySmokeTest library_smoke_test();

// Who ctx's device is: the machine probe's cache key and its first line (roofline/machine_ceilings.h).
// Cheap (no measurement). CPU: /proc/cpuinfo and /sys/devices/system/cpu/cpu0/cache (sysconf as the
// fallback), OpenMP's thread count, OpenBLAS's own description. CUDA: the device properties of ctx's GPU,
// the NVIDIA driver (/proc/driver/nvidia/version), cuBLASLt's version.
struct DeviceIdentity {
  std::string name;              // CPU: "model name" of /proc/cpuinfo; GPU: e.g. "NVIDIA H100 80GB HBM3"
  std::string driver;            // GPU: the NVIDIA driver version; "" on the CPU
  int threads = 0;               // CPU: OpenMP threads (omp_get_max_threads); GPU: SMs
  int sm = 0;                    // GPU: compute capability (major·10 + minor); 0 on the CPU
  double l2_bytes = 0.0;         // CPU: one CPU's share of cpu 0's L2 (its size / the CPUs sharing it); GPU: the
                                 //   whole L2; 0: unknown
  double l3_bytes = 0.0;         // CPU: the L3 cpu 0 is in (shared by its cores); 0 on the GPU or unknown
  std::string gemm_impl;         // CPU: "OpenBLAS <config> | core <corename>"; GPU: "cuBLASLt <v> on sm_<sm>"
  std::string library_versions;  // CPU: compiler and OpenMP; GPU: CUDA runtime, driver API, cuBLASLt, cuDNN
};
DeviceIdentity device_identity(const OpContext& ctx);
// How the CPU backend runs its BF16 GEMMs: "oneDNN bf16 (avx512_core_bf16)" or "FP32 BLAS, BF16 operands
// emulated (...)" (backend/cpu/onednn_gemm.h).
std::string cpu_gemm_engine_description();

// The GPU of a training run: fails with one line when this build's CUDA attention has no cudnn-frontend,
// else opens the current GPU's state, points ctx.gpu at it with the run's switches and returns its owner.
DeviceStateHandle open_gpu_for_training(OpContext& ctx, bool deterministic_attention, bool sync_every_launch);
// --quantize-kernels: the reference quantize and expand kernels (on) or the fast ones (off, the default)
// from now on (DeviceState::reference_quantize_kernels). No effect on the CPU.
void use_reference_quantize_kernels(const OpContext& ctx, bool on);
// How the BF16 GEMMs and each quantized format of `used` run on ctx's GPU (native or emulated); on the CPU
// one line, "cpu GEMMs: oneDNN bf16 (avx512_core_bf16)" or "cpu GEMMs: FP32 BLAS, BF16 operands emulated (...)".
std::vector<std::string> gemm_banner_lines(const OpContext& ctx, const std::vector<QuantFormat>& used);
// The same as values, for the run's records (--log-jsonl's start event): BF16 first, then each quantized format
// of `used` once (FP8_E4M3 and FP8_E5M2 are "fp8").
struct GemmPath {
  std::string format;       // "bf16", "fp8", "mxfp8", "nvfp4"
  bool native = false;      // false: emulated (the CPU's quantized GEMMs and its BF16 ones on FP32 BLAS, a GPU's
                            //   formats without native support, a GPU forced onto the emulated path)
  std::string description;  // e.g. "NVFP4 GEMMs: emulated on sm_90 (exact dequantize to BF16 + BF16 GEMM)"
};
std::vector<GemmPath> gemm_paths(const OpContext& ctx, const std::vector<QuantFormat>& used);
// The same for a GPU of compute capability `sm` (pure; a CUDA build's, else a one-line error). forced_emulated:
// the device state's test switch that sends every quantized GEMM down the emulated path.
std::vector<GemmPath> gpu_gemm_paths(const std::vector<QuantFormat>& used, int sm, bool forced_emulated = false);
// cuBLASLt's algorithm choice on ctx's GPU (backend/gemm_algorithms.h; the CPU has nothing to choose: the
// policy is ignored, the list empty, an install refuses nothing).
void set_gemm_algorithm_policy(const OpContext& ctx, GemmAlgorithmPolicy policy, int candidates);
GemmAlgorithms gemm_algorithm_choices(const OpContext& ctx);
std::vector<std::string> install_gemm_algorithms(const OpContext& ctx, const GemmAlgorithms& g);
// Builds the cuDNN attention graphs of `shape` now (not in the first step) and allocates the workspace
// they ask for in the chosen mode; the line names the backward algorithm built and both workspaces next
// to the plan's estimate. Needs ctx's GPU.
std::string prepare_attention(const OpContext& ctx, const AttentionShape& shape, double planned_workspace);

}  // namespace pl
