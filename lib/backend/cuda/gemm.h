#pragma once
// What runs behind the CUDA backend's GEMMs (linear.cu, gemm.cpp), for the banner and for tests.
// Plain C++ (no CUDA header), so the device banner (backend/device_info.cpp) and tests include it; it
// exists only in CUDA builds (PL_WITH_CUDA).
//
//   BF16 linear GEMMs             cuBLASLt BF16 x BF16, FP32 accumulate, every GPU (sm_80 and newer)
//   FP8 per-tensor (E4M3/E5M2)    cuBLASLt FP8 (scalar FP32 scales), native on sm_89 and newer
//   MXFP8, NVFP4                  cuBLASLt block-scaled GEMMs, native on sm_100 / sm_103
//   (the rule: backend/quantize.h quantized_gemm_native, asked through gemm_native(DeviceState)); elsewhere
//   EMULATED: each operand is dequantized exactly into BF16 and multiplied by a BF16 cuBLASLt GEMM
//   with the same alpha — the numbers of the native path up to the FP32 summation order, slower.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/gemm_algorithms.h"
#include "backend/quantize.h"
#include "core/tensor.h"

namespace pl::cuda {

struct DeviceState;  // device_state.h

enum class GemmExecution : uint8_t { Native, Emulated };

// How quantized_gemm runs `format` on a GPU of compute capability `sm` (major*10 + minor, e.g. 90,
// 100, 103). FP8_E4M3 and FP8_E5M2 share one answer. Pure: no device needed.
GemmExecution quantized_gemm_execution(QuantFormat format, int sm);

// One line per format, e.g. "NVFP4 GEMMs: native on sm_100 (cuBLASLt, E2M1 with VEC16_UE4M3 block
// scales)" or "NVFP4 GEMMs: emulated on sm_90 (exact dequantize to BF16 + BF16 GEMM)". Pure.
std::string gemm_backend_description(QuantFormat format, int sm);
// The banner: "BF16 GEMMs: native on sm_N (...)" then one gemm_backend_description line per format
// in `used` (FP8_E4M3 and FP8_E5M2 give one "FP8" line). Pure.
std::vector<std::string> gemm_backend_lines(const std::vector<QuantFormat>& used, int sm);
// The same for the GPU of `state`, plus a line when its test switch forces the emulated path.
std::vector<std::string> gemm_backend_lines(const DeviceState& state, const std::vector<QuantFormat>& used);
// All formats in one line: "GEMMs on sm_90: BF16 native (cuBLASLt); FP8 native (cuBLASLt); MXFP8
// emulated (dequantize to BF16 + BF16 GEMM); NVFP4 emulated (dequantize to BF16 + BF16 GEMM)". Pure.
std::string gemm_backend_description(int sm);
// The same for a context: the CPU backend's emulation, or ctx.gpu's GPU.
std::string gemm_backend_description(const OpContext& ctx);

// Throws a one-line error naming the GPU's sm_ and this build's CUDA architectures when the build
// holds no kernel image (SASS or JIT-able PTX) for the GPU of `state` (open_device_state calls it).
void check_kernel_image(const DeviceState& state);

// For tests: the cuBLASLt plans (descriptor, layouts, algorithm) `state` has made so far; a GEMM whose
// key was seen before adds none (gemm_lt.h).
size_t lt_plan_count(const DeviceState& state);

// cuBLASLt's algorithm per GEMM (backend/gemm_algorithms.h): how plans made from now on choose theirs; the
// choices of the plans made so far (with the GPU and cuBLASLt version); and installing a list (by key: plans
// that exist switch to it, later ones start with it), returning the GEMMs whose listed algorithm cuBLASLt
// refuses here (cublasLtMatmulAlgoCheck), which keep theirs.
void set_gemm_algorithm_policy(DeviceState& state, GemmAlgorithmPolicy policy, int candidates);
GemmAlgorithms gemm_algorithm_choices(const DeviceState& state);
std::vector<std::string> install_gemm_algorithms(DeviceState& state, const GemmAlgorithms& g);

// Elements the emulated path has dequantized into BF16 inexactly on `state`'s GPU since it was opened
// (read from the device; synchronizes). NVFP4 (E2M1 x E4M3) is always exact; MXFP8 (E4M3 x 2^k) is exact
// unless a nonzero value falls below 2^-130, where BF16 is subnormal (see quantized_gemm.cu).
uint64_t emulated_gemm_inexact_elements(const DeviceState& state);

}  // namespace pl::cuda
