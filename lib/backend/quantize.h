#pragma once
// Quantized tensors and the ops that make and consume them (NVFP4, MXFP8, FP8 per-tensor).
// The per-element and per-block math is in lib/numerics/ (shared with the CUDA backend); these ops
// are the whole-tensor schedules around it. See shared SPEC-NVFP4 §1-§6 for the formats.
//
// A matrix X[rows, cols] is quantized into up to two copies, each blocked along its own last dim
// (the GEMM reduction dim), as cuBLASLt's TN block-scaled GEMMs need:
//   rowwise    : X itself           [rows, cols], blocks along cols
//   columnwise : Xᵀ (transposed)   [cols, rows], blocks along rows; optionally RHT'd first
// Both are made from the high-precision input, never from each other.
#include <cstdint>
#include <vector>

#include "backend/ops.h"
#include "core/tensor.h"

namespace pl {

enum class QuantFormat : uint8_t {
  NVFP4,     // E2M1 codes, E4M3 scale per 16 elements (or per 16x16 tile), FP32 global scale from amax
  MXFP8,     // E4M3 codes, UE8M0 scale per 32 elements
  FP8_E4M3,  // E4M3 codes, one FP32 scale per tensor (current scaling: 448/amax)
  FP8_E5M2,  // E5M2 codes, one FP32 scale per tensor (57344/amax)
};
const char* quant_format_name(QuantFormat f);
int64_t quant_block_size(QuantFormat f);  // 16, 32, or 1 for per-tensor formats

// One copy: a [rows, cols] matrix of codes blocked along cols.
struct QuantizedCopy {
  QuantFormat format = QuantFormat::NVFP4;
  int64_t rows = 0, cols = 0;
  Tensor data;             // u8: NVFP4 [rows, cols/2] (element 2j in the low nibble); FP8/MXFP8 [rows, cols]
  Tensor scales;           // u8 compact [rows, cols/block] (E4M3 for NVFP4, UE8M0 for MXFP8); empty for FP8
  Tensor scales_swizzled;  // u8 [roundup(rows,128) * roundup(cols/block,4)] cuBLASLt 128x4 layout, zero padded
  Tensor amax;             // f32 [1]: amax of what was quantized (post-RHT for an RHT'd copy)
  Tensor scale_inv;        // f32 [1]: FP8 per-tensor dequantization scale (1/scale); unused otherwise
  Tensor spare;            // f32 [2] in the same allocation (its 256-byte tail), for the copy's owner:
                           // a linear layer keeps x's two amaxes in its weight's rowwise copy and
                           // dy's two in its columnwise copy
};

struct QuantizedTensor {
  QuantFormat format = QuantFormat::NVFP4;
  bool has_rowwise = false, has_columnwise = false;
  bool columnwise_rht = false;  // the columnwise copy holds RHT(Xᵀ)
  QuantizedCopy rowwise, columnwise;
};

struct QuantizeOptions {
  QuantFormat format = QuantFormat::NVFP4;
  bool rowwise = true;
  bool columnwise = false;
  bool block_2d = false;        // NVFP4 only: 16x16 tiles share one scale (weights)
  bool rht_columnwise = false;  // NVFP4 only: 16-point RHT on the columnwise copy (wgrad operands)
  bool stochastic = false;      // NVFP4 only: stochastic rounding of the E2M1 codes (gradients)
  // Stochastic-rounding stream: bits of element i of a copy come from Philox keyed by
  // (seed, stream_id, counter, i); the columnwise copy uses stream_id + 1.
  uint64_t seed = 0;
  uint32_t stream_id = 0;
  uint64_t counter = 0;
  // FP8 per tensor, delayed scaling (numerics/delayed_scaling.h): scale, when not empty, is an f32 [1]
  // slot holding the scale to quantize every requested copy with (instead of current scaling's
  // fp8_max / amax); each copy's scale_inv becomes 1/scale. The amax is still computed (unless
  // amax_given) and, when amax_record is not empty (f32 [1]: the tensor's entry in row 0 of its amax
  // history), also stored there: each quantization overwrites it with the amax of what it quantized.
  Tensor scale = {};
  Tensor amax_record = {};
  // amax_given: the amax slots of the requested copies already hold what this call would compute
  // (max |x|, or max |RHT(xᵀ)| for an RHT'd columnwise copy, of this same x), e.g. from an earlier
  // call with columnwise_amax: skip computing it. The codes are then bit-identical to a call without
  // it. NVFP4 and FP8 per tensor (MXFP8's amax is a by-product of its encode pass, recomputed).
  bool amax_given = false;
  // columnwise_amax: with columnwise == false, still compute the columnwise copy's amax into its slot
  // (of RHT(xᵀ) when rht_columnwise) in the same pass as the rowwise one, without making the copy: a
  // linear layer's forward keeps it for the backward's wgrad copy of the same x.
  bool columnwise_amax = false;
  // compact_scales: write the compact [rows, cols/block] scales. Every consumer on the CUDA backend
  // (the GEMMs, native or emulated, dequantize, quant_stats) reads the swizzled scales, so the CUDA
  // quantizer skips the compact ones when this is false (the copy's `scales` bytes are then stale).
  // The CPU backend reads the compact scales and always writes both.
  bool compact_scales = true;
};

// The columns of an amax history [len, n] (delayed_scaling_update): [0, num_forward) are forward tensors
// (inputs and weights: E4M3), the rest gradients (E5M2 under "hybrid"); scaled_max = fp8_max * 2^-margin.
struct DelayedScalingRule {
  int64_t num_forward = 0;
  float forward_scaled_max = 448.0f, backward_scaled_max = 57344.0f;
  bool most_recent = false;  // amax_compute_algo "most_recent" (else "max")
};

// Allocates the buffers of a quantized tensor for x[rows, cols] with the given copies (once,
// outside any step loop) and appends them to `owner`, which must outlive the returned views.
// Shapes must satisfy the format's block rules (one-line error otherwise).
QuantizedTensor allocate_quantized(std::vector<Buffer>& owner, Device device, QuantFormat format, int64_t rows,
                                   int64_t cols, bool rowwise, bool columnwise);

// The bytes allocate_quantized would take (for memory planning without allocating).
size_t quantized_tensor_bytes(QuantFormat format, int64_t rows, int64_t cols, bool rowwise, bool columnwise);

// ---- where the quantized GEMMs run natively (the one rule; pure, no device needed) ------------------
// A GPU of compute capability `sm` (major·10 + minor: 80, 89, 90, 100, 103, 120, ...) runs `format`'s
// GEMM natively in cuBLASLt, or else the CUDA backend emulates it (exact dequantization to BF16 + a
// BF16 cuBLASLt GEMM, the same numbers up to FP32 summation order):
//   FP8 per tensor (E4M3/E5M2)   sm_89 and newer (Ada, Hopper, Blackwell; cuBLASLt FP8 needs 8.9).
//   NVFP4, MXFP8 (block-scaled)  sm_100 and sm_103 (datacenter Blackwell). Not sm_120/121: cuBLAS
//                                documents the VEC16_UE4M3 / VEC32_UE8M0 scale modes for "Blackwell"
//                                without an architecture table, and Transformer Engine's support matrix
//                                (nvidia.github.io/TransformerEngine/support_matrix.html) lists MXFP8
//                                as "No" and NVFP4 as "Partial" on compute capability 12.0. Uncertain,
//                                so gated off (emulated) there until a GPU run shows otherwise.
// BF16 GEMMs are native on every supported GPU (sm_80 and newer); older GPUs are rejected.
bool quantized_gemm_native(QuantFormat format, int sm);
constexpr int kMinCudaSm = 80;
// The GPU the memory plan assumes when no GPU has been opened (--dry-run): Hopper (H100/H200), where
// NVFP4/MXFP8 are emulated, the larger plan of the two.
constexpr int kPlanDefaultSm = 90;

// Telemetry of one copy against the values it was quantized from (quant_stats, backend/op_list.h).
struct QuantStats {
  double amax = 0.0;
  double saturated_fraction = 0.0;   // elements whose code is ±max (E2M1 ±6, E4M3 ±448, E5M2 ±57344)
  double underflow_fraction = 0.0;   // blocks with a nonzero amax whose scale became zero
  double relative_error = 0.0;       // ‖x̂ − x‖ / ‖x‖ (0 when x is all zeros)
};

// quantize, dequantize, quantized_gemm, quant_stats, columnwise_source: documented in backend/op_list.h.
#define PL_OP(name, ret, timer, params, args)
#define PL_QUANT_OP(name, ret, timer, params, args) ret name params;
#include "backend/op_list.h"
// The one redeclaration: it gives fast_accumulation its default.
void quantized_gemm(const OpContext& ctx, const Tensor& y, const QuantizedCopy& a, const QuantizedCopy& b,
                    QuantFormat format, bool accumulate, const Tensor& scratch_a, const Tensor& scratch_b,
                    bool fast_accumulation = false);

}  // namespace pl
