// CUDA quantized_gemm (backend/op_list.h) for NVFP4, MXFP8 and FP8 per-tensor through cuBLASLt
// (gemm.cpp), plus the two small kernels it needs: the NVFP4 alpha on the device and the exact
// dequantization into BF16 of the emulated path. The BF16 GEMMs are in linear.cu (their cuBLASLt
// configuration is listed here with the others).
//
// Storage: activations and weights BF16, weight gradients FP32 accumulators, quantized copies U8
// (codes, compact and swizzled scales) with F32 [1] amax / scale_inv, all on the device.
//
// ctx.round_bf16 plays no part here: on the GPU a BF16 output is a BF16 tensor, and cuBLASLt rounds
// the FP32 accumulator into it (round to nearest), which is what the CPU backend imitates with
// num::round_bf16 when round_bf16 is true. The FP32 accumulators (dw, accumulate=true) are never
// rounded, as on the CPU.
//
// cuBLASLt configuration (column-major view, gemm_lt.h; compute CUBLAS_COMPUTE_32F, scale type F32):
//   linear_forward         y[T,out] = x·wᵀ     TN  A = w  bf16, B = x  bf16, D = y  bf16, alpha 1, beta 0
//   linear_backward_input  dx[T,in] = dy·w     NN  A = w  bf16, B = dy bf16, D = dx bf16, alpha 1, beta 0
//   linear_backward_weight dw[out,in] += dyᵀ·x NT  A = x  bf16, B = dy bf16, C = D = dw f32, alpha 1, beta 1
//   quantized_gemm         y[M,N] = α·a[M,K]·b[N,K]ᵀ (+y), always TN with A = b, B = a (both K-major):
//     NVFP4  native  A/B e2m1, A/B_SCALE_MODE VEC16_UE4M3, A/B_SCALE_POINTER = the swizzled E4M3
//                    scales of b / a, POINTER_MODE_DEVICE: alpha = ((1·amax_a)·amax_b)·f32(1/7225344)
//                    computed on the device into a slot (a one-thread kernel: gemm_alpha_kernel says
//                    why), beta = device constant 0 or 1
//     MXFP8  native  A/B e4m3, VEC32_UE8M0, swizzled UE8M0 scales of b / a, alpha 1 (host), beta 0/1
//     FP8    native  A/B e4m3 or e5m2 (never both e5m2), SCALAR_32F, A/B_SCALE_POINTER = scale_inv of
//                    b / a (device F32), alpha 1 (host), beta 0/1
//     emulated: where gemm_native(state, format) is false (backend/quantize.h quantized_gemm_native:
//                    NVFP4/MXFP8 off sm_100/103, FP8 below sm_89), and every format under
//                    DeviceState::force_emulated_gemm (a test switch): each copy is dequantized
//                    (block scale from the swizzled array, global scale not) into BF16 in the scratch
//                    buffers, then TN BF16 x BF16 with the same alpha as a device pointer (NVFP4: the
//                    amax formula; FP8: scale_inv_a·scale_inv_b, both written by b's dequantize kernel;
//                    MXFP8: the device constant 1).
//     D (and C) = y: bf16 or f32 — LinearLayer passes bf16 with accumulate=false (y, dx) and f32 with
//     accumulate=true (dw); both dtypes work either way.
//   FAST_ACCUM = 1 for native FP8/MXFP8 fprop GEMMs (quantized_gemm's fast_accumulation, as TE), 0 for
//   every other quantized GEMM (written out).
//
// Exactness of the emulation (DESIGN "A quantized linear layer"): an E2M1 value (2 significant bits,
// 0.5..6) times an E4M3 scale (4 significant bits, 2^-9..448) has at most 6 significant bits and lies
// in [2^-10, 2688]: always exact in BF16 (8 significant bits, FP32's exponent range). An MXFP8
// element E4M3 (4 significant bits) times 2^(e-127) is exact in BF16 while the product is zero or at
// least 2^-130 in magnitude (BF16's subnormal spacing is 2^-133, so 4 significant bits need an
// exponent >= -130) and at most 1.875·2^127 (the largest E4M3 significand at the largest exponent
// fits; only larger products overflow, to Inf in FP32 on the CPU too). The smallest nonzero element
// of a block is 2^-9 (the least E4M3 code) times its scale, and the scale is at least bamax/448, so
// only blocks whose amax is below 448·2^-121 (~2^-112) can reach the inexact range; there BF16 rounds
// to nearest (an absolute error <= 2^-134 per element). The kernel counts such elements
// (emulated_gemm_inexact_elements(), gemm.h) instead of failing. FP8 E4M3 and E5M2 values are always exact in BF16.
//
// Shape rules of quantized_gemm (cuBLASLt's 16-byte rules for FP8/FP4 operands, SPEC-GPU §2, applied
// on every GPU so that a configuration that runs emulated on sm_90 also runs natively on sm_100;
// checked in backend/op_checks.cpp):
// K % 32 == 0 for NVFP4 (½-byte elements), K % 16 == 0 for the 1-byte formats, N·sizeof(y) % 16 == 0
// and y 16-byte aligned (the output rows). M (tokens) is free.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <cstdint>
#include <string>

#include "backend/cuda/device_state.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/gemm_lt.h"
#include "numerics/bf16.h"
#include "numerics/fp4.h"
#include "numerics/fp8.h"
#include "numerics/nvfp4.h"
#include "numerics/swizzle.h"

namespace pl::cuda {

namespace {

constexpr int kThreads = 256;

// ---- kernels ---------------------------------------------------------------------------------------

// alpha[0] of a GEMM from the two operands' per-tensor values: NVFP4 ((1·amax_a)·amax_b)·f32(1/7225344)
// (num::nvfp4_gemm_alpha, what the CPU backend and TE use), FP8 scale_inv_a·scale_inv_b.
__device__ __forceinline__ float gemm_alpha(const float* a, const float* b, bool nvfp4) {
  return nvfp4 ? num::nvfp4_gemm_alpha(a[0], b[0]) : a[0] * b[0];
}

// The native NVFP4 GEMM's alpha, alone: its two amaxes become final in two different quantize calls
// (LinearLayer's), and no kernel of ours runs between the later one and the GEMM. The emulated path
// computes it in its dequantize kernel instead (AlphaJob).
__global__ void gemm_alpha_kernel(const float* a, const float* b, bool nvfp4, float* alpha) {
  alpha[0] = gemm_alpha(a, b, nvfp4);
}

// An alpha for the dequantize kernel to write (thread 0 of block 0) besides its values: out == nullptr
// for none. Both operands are quantized before the GEMM is called, so their per-tensor values are final.
struct AlphaJob {
  const float* a = nullptr;
  const float* b = nullptr;
  bool nvfp4 = false;
  float* out = nullptr;
};

__device__ __forceinline__ void write_alpha(const AlphaJob& job) {
  if (job.out != nullptr && blockIdx.x == 0 && threadIdx.x == 0) job.out[0] = gemm_alpha(job.a, job.b, job.nvfp4);
}

// Counts a dequantized value that BF16 does not hold exactly (NaN propagates and is not counted).
__device__ __forceinline__ uint16_t to_bf16_counted(float v, unsigned long long* inexact) {
  const uint16_t h = num::float_to_bf16_bits(v);
  if (v == v && num::bf16_bits_to_float(h) != v) atomicAdd(inexact, 1ull);
  return h;
}

// The block scales are read from the swizzled array (the bytes the native GEMM reads; the compact
// copy is not written on the GPU's training path): scale[r][b] = swz[swizzled_scale_offset(r, b, pc)],
// pc = roundup(cols/block, 4).

// NVFP4: one thread per code byte (elements 2j, 2j+1 of a row share a 16-block), writing both BF16
// values as one 32-bit store. out[r*cols + k] = e2m1(code) · e4m3(scale[r][k/16]), as the CPU's
// block_values; the global scale stays in alpha.
__global__ void dequantize_nvfp4_bf16_kernel(const uint8_t* codes, const uint8_t* swz, int64_t rows, int64_t cols,
                                             uint32_t* out, unsigned long long* inexact, AlphaJob alpha) {
  write_alpha(alpha);
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t half = cols / 2;
  if (i >= rows * half) return;
  const int64_t r = i / half, k = 2 * (i % half);
  const float s = num::e4m3_to_float(swz[num::swizzled_scale_offset(r, k / 16, num::padded_scale_cols(cols / 16))]);
  const uint8_t byte = codes[i];
  const uint16_t lo = to_bf16_counted(num::e2m1_to_float(byte & 0xFu) * s, inexact);
  const uint16_t hi = to_bf16_counted(num::e2m1_to_float(static_cast<uint8_t>(byte >> 4)) * s, inexact);
  out[i] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);  // element 2j at the lower address
}

// MXFP8 (scales != nullptr: e4m3(code) · ue8m0(scale[r][k/32])) and FP8 per tensor (e4m3 or e5m2
// code alone; scale_inv stays in alpha). One thread per element.
__global__ void dequantize_fp8_bf16_kernel(const uint8_t* codes, const uint8_t* swz, bool e5m2, int64_t rows,
                                           int64_t cols, uint16_t* out, unsigned long long* inexact, AlphaJob alpha) {
  write_alpha(alpha);
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * cols) return;
  float v = e5m2 ? num::e5m2_to_float(codes[i]) : num::e4m3_to_float(codes[i]);
  if (swz != nullptr) {
    const int64_t r = i / cols, k = i % cols;
    v = v * num::ue8m0_to_float(swz[num::swizzled_scale_offset(r, k / 32, num::padded_scale_cols(cols / 32))]);
  }
  out[i] = to_bf16_counted(v, inexact);
}

// ---- the fast expand (the default; the two kernels above are the reference set) ----------------------
// Each thread: 16 bytes of codes in by one 16-byte load, their BF16 values out by 16-byte stores, one
// scale load per block, no division per element. Conversion: num::float_to_bf16_bits of the exact
// product (for exact values it is the FP32 value's upper half, NaN made canonical as the reference's).
// Should reach >= 75% of HBM bandwidth (memory-bound: NVFP4 reads 16 B and writes 64 B per thread).

__device__ __forceinline__ uint32_t bf16_pair(float lo, float hi) {
  return static_cast<uint32_t>(num::float_to_bf16_bits(lo)) | (static_cast<uint32_t>(num::float_to_bf16_bits(hi)) << 16);
}

// NVFP4: one thread per 32 elements of a row (16 code bytes = two 16-blocks; cols % 32 == 0). Exact
// always (the top of this file), so no exactness count.
__global__ void __launch_bounds__(kThreads) expand_nvfp4_bf16_kernel(const uint8_t* __restrict__ codes,
                                                                     const uint8_t* __restrict__ swz, int64_t rows,
                                                                     int64_t cols, uint4* __restrict__ out,
                                                                     AlphaJob alpha) {
  write_alpha(alpha);
  const int64_t per_row = cols / 32;
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * per_row) return;
  const int64_t r = i / per_row, j = i % per_row;
  const int64_t pc = num::padded_scale_cols(cols / 16);
  const float s0 = num::e4m3_to_float(swz[num::swizzled_scale_offset(r, 2 * j, pc)]);
  const float s1 = num::e4m3_to_float(swz[num::swizzled_scale_offset(r, 2 * j + 1, pc)]);
  const uint4 u = reinterpret_cast<const uint4*>(codes)[i];  // row r's bytes 16j.. (cols / 2 per row)
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
  uint32_t o[16];  // 32 BF16 values, element 2k at the lower half of o[k]
  for (int q = 0; q < 4; ++q) {
    const float s = q < 2 ? s0 : s1;  // words 0-1: block 2j, words 2-3: block 2j + 1
    for (int b = 0; b < 4; ++b) {
      const uint32_t byte = (w[q] >> (8 * b)) & 0xFFu;
      o[4 * q + b] = bf16_pair(num::e2m1_to_float(static_cast<uint8_t>(byte & 0xFu)) * s,
                               num::e2m1_to_float(static_cast<uint8_t>(byte >> 4)) * s);
    }
  }
  uint4* dst = out + 4 * i;  // 64 bytes per thread
  for (int k = 0; k < 4; ++k) dst[k] = make_uint4(o[4 * k], o[4 * k + 1], o[4 * k + 2], o[4 * k + 3]);
}

// MXFP8 (swz != nullptr) and FP8 per tensor: one thread per 16 codes (cols % 16 == 0; an MXFP8 thread's
// codes lie in one 32-block). FP8 values are exact in BF16; MXFP8 products only where the block's scale
// byte is below 3 (code lsb 2^-9 times 2^(e-127) >= 2^-133, BF16's subnormal spacing, from e = 3 on;
// products too large overflow to Inf in FP32 first, which BF16 holds): only those are counted.
__global__ void __launch_bounds__(kThreads) expand_fp8_bf16_kernel(const uint8_t* __restrict__ codes,
                                                                   const uint8_t* __restrict__ swz, bool e5m2,
                                                                   int64_t rows, int64_t cols, uint4* __restrict__ out,
                                                                   unsigned long long* inexact, AlphaJob alpha) {
  write_alpha(alpha);
  const int64_t per_row = cols / 16;
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * per_row) return;
  float s = 1.0f;
  bool check = false;
  if (swz != nullptr) {
    const int64_t r = i / per_row, j = i % per_row;
    const uint8_t e = swz[num::swizzled_scale_offset(r, j / 2, num::padded_scale_cols(cols / 32))];
    s = num::ue8m0_to_float(e);
    check = e < 3;
  }
  const uint4 u = reinterpret_cast<const uint4*>(codes)[i];
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
  uint32_t o[8];
  for (int q = 0; q < 4; ++q)
    for (int b = 0; b < 2; ++b) {
      const uint8_t c0 = static_cast<uint8_t>((w[q] >> (16 * b)) & 0xFFu), c1 = static_cast<uint8_t>((w[q] >> (16 * b + 8)) & 0xFFu);
      float v0 = e5m2 ? num::e5m2_to_float(c0) : num::e4m3_to_float(c0);
      float v1 = e5m2 ? num::e5m2_to_float(c1) : num::e4m3_to_float(c1);
      if (swz != nullptr) {
        v0 = v0 * s;
        v1 = v1 * s;
      }
      o[2 * q + b] = check ? static_cast<uint32_t>(to_bf16_counted(v0, inexact)) |
                                 (static_cast<uint32_t>(to_bf16_counted(v1, inexact)) << 16)
                           : bf16_pair(v0, v1);
    }
  out[2 * i] = make_uint4(o[0], o[1], o[2], o[3]);
  out[2 * i + 1] = make_uint4(o[4], o[5], o[6], o[7]);
}

cudaDataType_t lt_code_type(QuantFormat f) {
  switch (f) {
    case QuantFormat::NVFP4: return CUDA_R_4F_E2M1;
    case QuantFormat::FP8_E5M2: return CUDA_R_8F_E5M2;
    default: return CUDA_R_8F_E4M3;  // MXFP8 and FP8_E4M3
  }
}

// Writes the exact block values of copy c as BF16 into out (rows*cols elements), and alpha when asked.
void dequantize_to_bf16(const DeviceState& st, const char* op, const QuantizedCopy& c, void* out,
                        const AlphaJob& alpha = AlphaJob{}) {
  const GemmScalars& s = st.scalars;
  const int64_t n = c.rows * c.cols;
  const std::string what = fmt::format("dequantize {} copy [{}, {}] to bf16", quant_format_name(c.format), c.rows,
                                       c.cols);
  const bool aligned = ((reinterpret_cast<uintptr_t>(c.data.data) | reinterpret_cast<uintptr_t>(out)) & 15u) == 0;
  const int64_t per_thread = c.format == QuantFormat::NVFP4 ? 32 : 16;  // elements per thread of the fast expand
  if (!st.reference_quantize_kernels && aligned && c.cols % per_thread == 0) {  // the fast expand
    if (c.format == QuantFormat::NVFP4) {
      expand_nvfp4_bf16_kernel<<<grid_for(n / 32, kThreads), kThreads, 0, st.stream>>>(
          c.data.ptr<const uint8_t>(), c.scales_swizzled.ptr<const uint8_t>(), c.rows, c.cols, static_cast<uint4*>(out),
          alpha);
    } else {
      const uint8_t* scales = c.format == QuantFormat::MXFP8 ? c.scales_swizzled.ptr<const uint8_t>() : nullptr;
      expand_fp8_bf16_kernel<<<grid_for(n / 16, kThreads), kThreads, 0, st.stream>>>(
          c.data.ptr<const uint8_t>(), scales, c.format == QuantFormat::FP8_E5M2, c.rows, c.cols,
          static_cast<uint4*>(out), s.inexact, alpha);
    }
    check_launch(st, op, what + " [fast expand]");
    return;
  }
  if (c.format == QuantFormat::NVFP4) {
    dequantize_nvfp4_bf16_kernel<<<grid_for(n / 2, kThreads), kThreads, 0, st.stream>>>(
        c.data.ptr<const uint8_t>(), c.scales_swizzled.ptr<const uint8_t>(), c.rows, c.cols,
        static_cast<uint32_t*>(out), s.inexact, alpha);
  } else {
    const uint8_t* scales = c.format == QuantFormat::MXFP8 ? c.scales_swizzled.ptr<const uint8_t>() : nullptr;
    dequantize_fp8_bf16_kernel<<<grid_for(n, kThreads), kThreads, 0, st.stream>>>(c.data.ptr<const uint8_t>(), scales,
                                                                     c.format == QuantFormat::FP8_E5M2, c.rows,
                                                                     c.cols, static_cast<uint16_t*>(out), s.inexact, alpha);
  }
  check_launch(st, op, what);
}

}  // namespace

// ---- the build's device code against the GPU -----------------------------------------------------

#define PL_STRINGIFY2(...) #__VA_ARGS__
#define PL_STRINGIFY(...) PL_STRINGIFY2(__VA_ARGS__)

void check_kernel_image(const DeviceState& dev) {
  cudaFuncAttributes attr{};
  const cudaError_t st = cudaFuncGetAttributes(&attr, gemm_alpha_kernel);
  if (st == cudaSuccess) return;
  (void)cudaGetLastError();  // clear the sticky launch-less error
#if defined(__CUDA_ARCH_LIST__)
  const std::string built = PL_STRINGIFY(__CUDA_ARCH_LIST__);  // nvcc: e.g. "800,890,900,1000"
#else
  const std::string built = "unknown";
#endif
  if (st == cudaErrorNoKernelImageForDevice || st == cudaErrorInvalidDeviceFunction)
    throw_error(fmt::format("GPU {} ({}, sm_{}) has no device code in this build (compiled for __CUDA_ARCH_LIST__ "
                            "{}, no PTX it can JIT): rebuild with -DCMAKE_CUDA_ARCHITECTURES={}",
                            dev.device, dev.name, dev.sm, built, dev.sm));
  check(st, "check_kernel_image", fmt::format("cudaFuncGetAttributes on sm_{} (built for {})", dev.sm, built));
}

// ---- quantized GEMM ------------------------------------------------------------------------------------

void quantized_gemm(const OpContext& ctx, const Tensor& y, const QuantizedCopy& a, const QuantizedCopy& b,
                    QuantFormat f, bool accumulate, const Tensor& scratch_a, const Tensor& scratch_b,
                    bool fast_accumulation) {
  // round_bf16: a BF16 y is rounded by cuBLASLt. The shape rules: backend/op_checks.cpp.
  constexpr const char* op = "quantized_gemm";
  DeviceState& st = *ctx.gpu;
  const int64_t M = a.rows, N = b.rows, K = a.cols;
  const std::string what = fmt::format("y {} {}= a [{}, {}] {} · b [{}, {}]ᵀ {}", y.shape_str(), accumulate ? "+" : "",
                                       M, K, quant_format_name(a.format), N, K, quant_format_name(b.format));
  const GemmScalars& s = st.scalars;
  const bool native = gemm_native(st, f);

  LtMatmul g;
  g.op = op;
  g.transa = CUBLAS_OP_T;  // TN: A = b [N,K], B = a [M,K], both K-contiguous
  g.transb = CUBLAS_OP_N;
  g.m = N;
  g.n = M;
  g.k = K;
  g.lda = K;
  g.ldb = K;
  g.D = y.data;
  g.d_type = y.dtype == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F;
  g.ldd = N;
  g.accumulate = accumulate;

  if (native) {
    g.what = what + " [native]";
    g.A = b.data.data;
    g.B = a.data.data;
    g.a_type = lt_code_type(b.format);
    g.b_type = lt_code_type(a.format);
    g.quantized_inputs = true;
    // FAST_ACCUM as Transformer Engine sets it: on for FP8 operands (per tensor and MXFP8) in the
    // forward GEMM only (the caller's fast_accumulation, LinearLayer's fprop: TE's recipe
    // Float8CurrentScaling has fp8_gemm_fprop use_split_accumulator=False, dgrad/wgrad True; the
    // MXFP8 recipe takes module/base.py's _2X_ACC_FPROP=False, _2X_ACC_DGRAD=_2X_ACC_WGRAD=True), never
    // for FP4 (common/gemm/cublaslt_gemm.cu: fastAccuMode = use_split_accumulator ? 0 : use_fp8, "Fast
    // accumulation is only supported for FP8"). TransformerEngine commit d0067d0.
    g.fast_accum = fast_accumulation && f != QuantFormat::NVFP4;
    if (f == QuantFormat::NVFP4) {
      g.scale_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3;
      g.a_scale = b.scales_swizzled.data;
      g.b_scale = a.scales_swizzled.data;
      gemm_alpha_kernel<<<1, 1, 0, st.stream>>>(a.amax.ptr<const float>(), b.amax.ptr<const float>(), true, s.alpha);
      check_launch(st, op, "nvfp4 alpha kernel: " + what);
      g.alpha_device = s.alpha;
    } else if (f == QuantFormat::MXFP8) {
      g.scale_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0;
      g.a_scale = b.scales_swizzled.data;
      g.b_scale = a.scales_swizzled.data;
    } else {  // FP8 per tensor: the dequantization scales
      g.a_scale = b.scale_inv.data;
      g.b_scale = a.scale_inv.data;
    }
    return lt_matmul(st, g);
  }

  // Emulated: exact BF16 block values in the scratch buffers, then a BF16 GEMM with the same alpha, which
  // the dequantize kernel of b writes (NVFP4: the amax formula, FP8: scale_inv_a·scale_inv_b; MXFP8: 1).
  AlphaJob alpha;
  if (f != QuantFormat::MXFP8) {
    alpha.nvfp4 = f == QuantFormat::NVFP4;
    alpha.a = (alpha.nvfp4 ? a.amax : a.scale_inv).ptr<const float>();
    alpha.b = (alpha.nvfp4 ? b.amax : b.scale_inv).ptr<const float>();
    alpha.out = s.alpha;
  }
  dequantize_to_bf16(st, op, a, scratch_a.data);
  dequantize_to_bf16(st, op, b, scratch_b.data, alpha);
  op_next_phase(ctx);  // the expansion ends, the GEMM begins (two rows of a roofline report)
  g.what = what + " [emulated: bf16 block values]";
  g.A = scratch_b.data;
  g.B = scratch_a.data;
  g.a_type = CUDA_R_16BF;
  g.b_type = CUDA_R_16BF;
  g.alpha_device = f == QuantFormat::MXFP8 ? s.one : s.alpha;
  lt_matmul(st, g);
}

}  // namespace pl::cuda
