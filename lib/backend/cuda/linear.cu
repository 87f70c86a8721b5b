// CUDA GEMMs: the three BF16 linear-layer GEMMs (backend/ops.h) and quantized_gemm
// (backend/quantize.h) for NVFP4, MXFP8 and FP8 per-tensor, all through cuBLASLt (gemm.cpp), plus
// the two small kernels they need: the NVFP4 alpha on the device and the exact dequantization into
// BF16 of the emulated path.
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
//                    computed on the device into a slot, beta = device constant 0 or 1
//     MXFP8  native  A/B e4m3, VEC32_UE8M0, swizzled UE8M0 scales of b / a, alpha 1 (host), beta 0/1
//     FP8    native  A/B e4m3 or e5m2 (never both e5m2), SCALAR_32F, A/B_SCALE_POINTER = scale_inv of
//                    b / a (device F32), alpha 1 (host), beta 0/1
//     emulated: where Context::native(format) is false (backend/quantize.h quantized_gemm_native:
//                    NVFP4/MXFP8 off sm_100/103, FP8 below sm_89), and every format under
//                    set_force_emulated_gemm(true) (gemm.h, a test hook): each copy is dequantized
//                    (block scale from the swizzled array, global scale not) into BF16 in the scratch
//                    buffers, then TN BF16 x BF16 with the same alpha as a device pointer (NVFP4: the
//                    amax formula; FP8: scale_inv_a·scale_inv_b; MXFP8: the device constant 1).
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
// to nearest (an absolute error <= 2^-134 per element). The kernel counts such elements (emulated_gemm_inexact_elements(), gemm.h) instead of
// failing. FP8 E4M3 and E5M2 values are always exact in BF16.
//
// Shape rules of quantized_gemm (cuBLASLt's 16-byte rules for FP8/FP4 operands, SPEC-GPU §2, applied
// on every GPU so that a configuration that runs emulated on sm_90 also runs natively on sm_100):
// K % 32 == 0 for NVFP4 (½-byte elements), K % 16 == 0 for the 1-byte formats, N·sizeof(y) % 16 == 0
// and y 16-byte aligned (the output rows). M (tokens) is free.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <cstdint>
#include <string>

#include "backend/cuda/context.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/gemm_lt.h"
#include "core/error.h"
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
__global__ void gemm_alpha_kernel(const float* a, const float* b, bool nvfp4, float* alpha) {
  alpha[0] = nvfp4 ? num::nvfp4_gemm_alpha(a[0], b[0]) : a[0] * b[0];
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
                                             uint32_t* out, unsigned long long* inexact) {
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
                                           int64_t cols, uint16_t* out, unsigned long long* inexact) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * cols) return;
  float v = e5m2 ? num::e5m2_to_float(codes[i]) : num::e4m3_to_float(codes[i]);
  if (swz != nullptr) {
    const int64_t r = i / cols, k = i % cols;
    v = v * num::ue8m0_to_float(swz[num::swizzled_scale_offset(r, k / 32, num::padded_scale_cols(cols / 32))]);
  }
  out[i] = to_bf16_counted(v, inexact);
}

// ---- argument checks -------------------------------------------------------------------------------

void check_cuda_matrix(const char* op, const char* name, const Tensor& t, DType dtype) {
  PL_CHECK(t.device == Device::CUDA && t.dtype == dtype && t.ndim == 2,
           "{}: {} {} ({}) must be a 2-D {} cuda tensor", op, name, t.shape_str(), device_name(t.device),
           dtype_name(dtype));
}

bool is_fp8(QuantFormat f) { return f == QuantFormat::FP8_E4M3 || f == QuantFormat::FP8_E5M2; }

void check_copy(const char* op, const char* name, const QuantizedCopy& c, QuantFormat f) {
  PL_CHECK(c.format == f, "{}: copy {} holds {} codes, not {}", op, name, quant_format_name(c.format),
           quant_format_name(f));
  const int64_t blk = quant_block_size(f);
  PL_CHECK(c.rows > 0 && c.cols > 0 && c.cols % blk == 0, "{}: copy {} [{}, {}] is not a valid {} copy", op, name,
           c.rows, c.cols, quant_format_name(f));
  const int64_t data_cols = f == QuantFormat::NVFP4 ? c.cols / 2 : c.cols;
  PL_CHECK(c.data.device == Device::CUDA && c.data.dtype == DType::U8 && c.data.numel() == c.rows * data_cols,
           "{}: copy {} [{}, {}] has codes {} ({}), expected [{}, {}] u8 on cuda", op, name, c.rows, c.cols,
           c.data.shape_str(), device_name(c.data.device), c.rows, data_cols);
  if (blk > 1) {
    const int64_t sc = c.cols / blk;
    PL_CHECK(c.scales.device == Device::CUDA && c.scales.numel() == c.rows * sc,
             "{}: copy {} [{}, {}] has scales {} ({}), expected [{}, {}] u8 on cuda", op, name, c.rows, c.cols,
             c.scales.shape_str(), device_name(c.scales.device), c.rows, sc);
    const int64_t swz = num::padded_scale_rows(c.rows) * num::padded_scale_cols(sc);
    PL_CHECK(c.scales_swizzled.device == Device::CUDA && c.scales_swizzled.numel() == swz &&
                 reinterpret_cast<uintptr_t>(c.scales_swizzled.data) % 16 == 0,
             "{}: copy {} [{}, {}] has swizzled scales {} ({}), expected {} bytes on cuda, 16-byte aligned", op, name,
             c.rows, c.cols, c.scales_swizzled.shape_str(), device_name(c.scales_swizzled.device), swz);
  }
  const bool need_amax = f == QuantFormat::NVFP4, need_scale_inv = is_fp8(f);
  PL_CHECK(!need_amax || (c.amax.device == Device::CUDA && c.amax.dtype == DType::F32 && c.amax.numel() == 1),
           "{}: copy {} needs its amax as a cuda f32 [1] tensor, got {}", op, name, c.amax.shape_str());
  PL_CHECK(!need_scale_inv ||
               (c.scale_inv.device == Device::CUDA && c.scale_inv.dtype == DType::F32 && c.scale_inv.numel() == 1),
           "{}: copy {} needs its scale_inv as a cuda f32 [1] tensor, got {}", op, name, c.scale_inv.shape_str());
}

void zero_output(const char* op, const Tensor& t) {
  check(cudaMemsetAsync(t.data, 0, t.bytes(), 0), op, "cudaMemsetAsync of " + t.shape_str() + " (empty reduction)");
}

cudaDataType_t lt_code_type(QuantFormat f) {
  switch (f) {
    case QuantFormat::NVFP4: return CUDA_R_4F_E2M1;
    case QuantFormat::FP8_E5M2: return CUDA_R_8F_E5M2;
    default: return CUDA_R_8F_E4M3;  // MXFP8 and FP8_E4M3
  }
}

// Writes the exact block values of copy c as BF16 into out (rows*cols elements).
void dequantize_to_bf16(const char* op, const QuantizedCopy& c, void* out) {
  const GemmScalars& s = gemm_scalars();
  const int64_t n = c.rows * c.cols;
  const std::string what = fmt::format("dequantize {} copy [{}, {}] to bf16", quant_format_name(c.format), c.rows,
                                       c.cols);
  if (c.format == QuantFormat::NVFP4) {
    dequantize_nvfp4_bf16_kernel<<<grid_for(n / 2, kThreads), kThreads>>>(
        c.data.ptr<const uint8_t>(), c.scales_swizzled.ptr<const uint8_t>(), c.rows, c.cols,
        static_cast<uint32_t*>(out), s.inexact);
  } else {
    const uint8_t* scales = c.format == QuantFormat::MXFP8 ? c.scales_swizzled.ptr<const uint8_t>() : nullptr;
    dequantize_fp8_bf16_kernel<<<grid_for(n, kThreads), kThreads>>>(c.data.ptr<const uint8_t>(), scales,
                                                                     c.format == QuantFormat::FP8_E5M2, c.rows,
                                                                     c.cols, static_cast<uint16_t*>(out), s.inexact);
  }
  check_launch(op, what);
}

}  // namespace

// ---- the build's device code against the GPU -----------------------------------------------------

#define PL_STRINGIFY2(...) #__VA_ARGS__
#define PL_STRINGIFY(...) PL_STRINGIFY2(__VA_ARGS__)

void check_kernel_image() {
  const Context& dev = context();
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

// ---- BF16 linear layers ------------------------------------------------------------------------------

void linear_forward(const OpContext& ctx, const Tensor& y, const Tensor& x, const Tensor& w) {
  (void)ctx;  // round_bf16: cuBLASLt rounds the BF16 output (see the top of this file)
  constexpr const char* op = "linear_forward";
  check_cuda_matrix(op, "y", y, DType::BF16);
  check_cuda_matrix(op, "x", x, DType::BF16);
  check_cuda_matrix(op, "w", w, DType::BF16);
  PL_CHECK(x.dim(1) == w.dim(1), "{}: x {} does not match w {}", op, x.shape_str(), w.shape_str());
  PL_CHECK(y.dim(0) == x.dim(0) && y.dim(1) == w.dim(0),
           "{}: y {} does not match x {} and w {} (expected [{}, {}])", op, y.shape_str(), x.shape_str(),
           w.shape_str(), x.dim(0), w.dim(0));
  const int64_t T = x.dim(0), in = x.dim(1), out = w.dim(0);
  if (T == 0 || out == 0) return;
  if (in == 0) return zero_output(op, y);
  // y[T,out] = x[T,in] · w[out,in]ᵀ  ->  TN, m = out, n = T, k = in
  LtMatmul g;
  g.op = op;
  g.what = fmt::format("y {} = x {} · w {}ᵀ", y.shape_str(), x.shape_str(), w.shape_str());
  g.transa = CUBLAS_OP_T;
  g.transb = CUBLAS_OP_N;
  g.m = out;
  g.n = T;
  g.k = in;
  g.A = w.data;
  g.lda = in;
  g.B = x.data;
  g.ldb = in;
  g.D = y.data;
  g.ldd = out;
  lt_matmul(g);
}

void linear_backward_input(const OpContext& ctx, const Tensor& dx, const Tensor& dy, const Tensor& w) {
  (void)ctx;  // round_bf16: cuBLASLt rounds the BF16 output
  constexpr const char* op = "linear_backward_input";
  check_cuda_matrix(op, "dx", dx, DType::BF16);
  check_cuda_matrix(op, "dy", dy, DType::BF16);
  check_cuda_matrix(op, "w", w, DType::BF16);
  PL_CHECK(dy.dim(1) == w.dim(0), "{}: dy {} does not match w {}", op, dy.shape_str(), w.shape_str());
  PL_CHECK(dx.dim(0) == dy.dim(0) && dx.dim(1) == w.dim(1),
           "{}: dx {} does not match dy {} and w {} (expected [{}, {}])", op, dx.shape_str(), dy.shape_str(),
           w.shape_str(), dy.dim(0), w.dim(1));
  const int64_t T = dy.dim(0), out = w.dim(0), in = w.dim(1);
  if (T == 0 || in == 0) return;
  if (out == 0) return zero_output(op, dx);
  // dx[T,in] = dy[T,out] · w[out,in]  ->  column-major dxᵀ[in,T] = wᵀ[in,out] · dyᵀ[out,T]: NN,
  // m = in, n = T, k = out; w is column-major in x out (ld in), dy column-major out x T (ld out).
  LtMatmul g;
  g.op = op;
  g.what = fmt::format("dx {} = dy {} · w {}", dx.shape_str(), dy.shape_str(), w.shape_str());
  g.transa = CUBLAS_OP_N;
  g.transb = CUBLAS_OP_N;
  g.m = in;
  g.n = T;
  g.k = out;
  g.A = w.data;
  g.lda = in;
  g.B = dy.data;
  g.ldb = out;
  g.D = dx.data;
  g.ldd = in;
  lt_matmul(g);
}

void linear_backward_weight(const OpContext& ctx, const Tensor& dw, const Tensor& dy, const Tensor& x) {
  (void)ctx;  // dw is an FP32 accumulator: never rounded
  constexpr const char* op = "linear_backward_weight";
  check_cuda_matrix(op, "dw", dw, DType::F32);
  check_cuda_matrix(op, "dy", dy, DType::BF16);
  check_cuda_matrix(op, "x", x, DType::BF16);
  PL_CHECK(dy.dim(0) == x.dim(0), "{}: dy {} does not match x {}", op, dy.shape_str(), x.shape_str());
  PL_CHECK(dw.dim(0) == dy.dim(1) && dw.dim(1) == x.dim(1),
           "{}: dw {} does not match dy {} and x {} (expected [{}, {}])", op, dw.shape_str(), dy.shape_str(),
           x.shape_str(), dy.dim(1), x.dim(1));
  const int64_t T = x.dim(0), out = dy.dim(1), in = x.dim(1);
  if (T == 0 || out == 0 || in == 0) return;
  // dw[out,in] += dy[T,out]ᵀ · x[T,in]  ->  column-major dwᵀ[in,out] += xᵀ[in,T] · dy[T,out]: NT,
  // m = in, n = out, k = T; x is column-major in x T (ld in), dy column-major out x T (ld out, op T).
  LtMatmul g;
  g.op = op;
  g.what = fmt::format("dw {} += dy {}ᵀ · x {}", dw.shape_str(), dy.shape_str(), x.shape_str());
  g.transa = CUBLAS_OP_N;
  g.transb = CUBLAS_OP_T;
  g.m = in;
  g.n = out;
  g.k = T;
  g.A = x.data;
  g.lda = in;
  g.B = dy.data;
  g.ldb = out;
  g.D = dw.data;
  g.d_type = CUDA_R_32F;
  g.ldd = in;
  g.accumulate = true;
  lt_matmul(g);
}

// ---- quantized GEMM ------------------------------------------------------------------------------------

void quantized_gemm(const OpContext& ctx, const Tensor& y, const QuantizedCopy& a, const QuantizedCopy& b,
                    QuantFormat f, bool accumulate, const Tensor& scratch_a, const Tensor& scratch_b,
                    bool fast_accumulation) {
  (void)ctx;  // round_bf16: a BF16 y is rounded by cuBLASLt
  constexpr const char* op = "quantized_gemm";
  check_copy(op, "a", a, f);
  check_copy(op, "b", b, b.format);
  PL_CHECK(a.format == b.format || (is_fp8(a.format) && is_fp8(b.format)), "{}: cannot multiply {} by {}", op,
           quant_format_name(a.format), quant_format_name(b.format));
  PL_CHECK(!(a.format == QuantFormat::FP8_E5M2 && b.format == QuantFormat::FP8_E5M2),
           "{}: E5M2 x E5M2 is not supported (cuBLASLt)", op);
  PL_CHECK(a.cols == b.cols, "{}: A [{}, {}] and B [{}, {}] disagree on the reduction dim", op, a.rows, a.cols,
           b.rows, b.cols);
  PL_CHECK(y.device == Device::CUDA && (y.dtype == DType::BF16 || y.dtype == DType::F32) && y.ndim == 2,
           "{}: y {} ({}) must be a 2-D bf16 or f32 cuda tensor", op, y.shape_str(), device_name(y.device));
  PL_CHECK(y.dim(0) == a.rows && y.dim(1) == b.rows, "{}: y {} is not [{}, {}]", op, y.shape_str(), a.rows, b.rows);
  const int64_t M = a.rows, N = b.rows, K = a.cols;
  const std::string what = fmt::format("y {} {}= a [{}, {}] {} · b [{}, {}]ᵀ {}", y.shape_str(), accumulate ? "+" : "",
                                       M, K, quant_format_name(a.format), N, K, quant_format_name(b.format));
  // cuBLASLt's 16-byte rules for FP8/FP4 operands (see the top of this file).
  if (f == QuantFormat::NVFP4)
    PL_CHECK(K % 32 == 0, "{}: {}: nvfp4 GEMMs need K % 32 == 0 (16-byte rows of E2M1), K = {}", op, what, K);
  else
    PL_CHECK(K % 16 == 0, "{}: {}: {} GEMMs need K % 16 == 0 (16-byte rows), K = {}", op, what, quant_format_name(f),
             K);
  PL_CHECK(N * static_cast<int64_t>(dtype_size(y.dtype)) % 16 == 0,
           "{}: {}: the output rows must be a multiple of 16 bytes (N % {} == 0 for {}), N = {}", op, what,
           16 / dtype_size(y.dtype), dtype_name(y.dtype), N);
  PL_CHECK(reinterpret_cast<uintptr_t>(y.data) % 16 == 0, "{}: {}: y must be 16-byte aligned", op, what);

  const Context& dev = context();
  const GemmScalars& s = gemm_scalars();
  const bool native = dev.native(f) && !force_emulated_gemm();

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
      gemm_alpha_kernel<<<1, 1>>>(a.amax.ptr<const float>(), b.amax.ptr<const float>(), true, s.alpha);
      check_launch(op, "nvfp4 alpha kernel: " + what);
      g.alpha_device = s.alpha;
    } else if (f == QuantFormat::MXFP8) {
      g.scale_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0;
      g.a_scale = b.scales_swizzled.data;
      g.b_scale = a.scales_swizzled.data;
    } else {  // FP8 per tensor: the dequantization scales
      g.a_scale = b.scale_inv.data;
      g.b_scale = a.scale_inv.data;
    }
    return lt_matmul(g);
  }

  // Emulated: exact BF16 block values in the scratch buffers (cuda tensors of any dtype with room for
  // rows*cols BF16 values), then a BF16 GEMM with the same alpha.
  PL_CHECK(scratch_a.device == Device::CUDA && scratch_b.device == Device::CUDA && scratch_a.data != nullptr &&
               scratch_b.data != nullptr && scratch_a.bytes() >= static_cast<size_t>(M * K) * 2 &&
               scratch_b.bytes() >= static_cast<size_t>(N * K) * 2,
           "{}: {}: the emulated path needs cuda scratch of at least {} / {} bytes (A [{}, {}], B [{}, {}] as bf16), "
           "got {} / {}",
           op, what, M * K * 2, N * K * 2, M, K, N, K, scratch_a.shape_str(), scratch_b.shape_str());
  {
    const auto pa = reinterpret_cast<uintptr_t>(scratch_a.data), pb = reinterpret_cast<uintptr_t>(scratch_b.data);
    const auto ea = pa + static_cast<uintptr_t>(M * K) * 2, eb = pb + static_cast<uintptr_t>(N * K) * 2;
    PL_CHECK(ea <= pb || eb <= pa, "{}: {}: scratch_a and scratch_b overlap", op, what);
    PL_CHECK(pa % 4 == 0 && pb % 4 == 0, "{}: {}: scratch buffers must be 4-byte aligned", op, what);
  }
  dequantize_to_bf16(op, a, scratch_a.data);
  dequantize_to_bf16(op, b, scratch_b.data);
  g.what = what + " [emulated: bf16 block values]";
  g.A = scratch_b.data;
  g.B = scratch_a.data;
  g.a_type = CUDA_R_16BF;
  g.b_type = CUDA_R_16BF;
  if (f == QuantFormat::MXFP8) {
    g.alpha_device = s.one;
  } else {
    const bool nvfp4 = f == QuantFormat::NVFP4;
    const Tensor& pa = nvfp4 ? a.amax : a.scale_inv;
    const Tensor& pb = nvfp4 ? b.amax : b.scale_inv;
    gemm_alpha_kernel<<<1, 1>>>(pa.ptr<const float>(), pb.ptr<const float>(), nvfp4, s.alpha);
    check_launch(op, std::string(nvfp4 ? "nvfp4" : "fp8") + " alpha kernel: " + what);
    g.alpha_device = s.alpha;
  }
  lt_matmul(g);
}

}  // namespace pl::cuda
