// Quantized-tensor allocation (device-agnostic) and dispatch of the quantization ops, each
// bracketed by an OpTimer of its category (core/timers.h).
#include "backend/quantize.h"

#include "backend/cpu/cpu_ops.h"
#include "core/error.h"
#include "core/timers.h"

#if defined(PL_WITH_CUDA)
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/gemm.h"
#endif
#include "numerics/swizzle.h"

namespace pl {

const char* quant_format_name(QuantFormat f) {
  switch (f) {
    case QuantFormat::NVFP4: return "nvfp4";
    case QuantFormat::MXFP8: return "mxfp8";
    case QuantFormat::FP8_E4M3: return "fp8_e4m3";
    case QuantFormat::FP8_E5M2: return "fp8_e5m2";
  }
  return "?";
}

int64_t quant_block_size(QuantFormat f) {
  switch (f) {
    case QuantFormat::NVFP4: return 16;
    case QuantFormat::MXFP8: return 32;
    default: return 1;
  }
}

namespace {

// Byte layout of one copy's single allocation: codes, compact scales, swizzled scales, then the
// amax and scale_inv floats; each part 256-byte aligned (cuBLASLt wants 16, TE's allocator gives 256).
struct CopyLayout {
  int64_t data_cols, scale_cols, swizzled;
  size_t data, scales, swz, total;
};

CopyLayout copy_layout(QuantFormat f, int64_t rows, int64_t cols) {
  const int64_t blk = quant_block_size(f);
  PL_CHECK(rows > 0 && cols > 0, "quantized tensor of shape [{}, {}]: dimensions must be positive", rows, cols);
  PL_CHECK(cols % blk == 0, "{}: the quantized dimension {} (of shape [{}, {}]) must be a multiple of {}",
           quant_format_name(f), cols, rows, cols, blk);
  auto align = [](int64_t b) { return static_cast<size_t>((b + 255) / 256 * 256); };
  CopyLayout l;
  l.data_cols = f == QuantFormat::NVFP4 ? cols / 2 : cols;
  l.scale_cols = blk > 1 ? cols / blk : 0;
  l.swizzled = blk > 1 ? num::padded_scale_rows(rows) * num::padded_scale_cols(l.scale_cols) : 0;
  l.data = align(rows * l.data_cols);
  l.scales = align(rows * l.scale_cols);
  l.swz = align(l.swizzled);
  l.total = l.data + l.scales + l.swz + 256;
  return l;
}

QuantizedCopy allocate_copy(std::vector<Buffer>& owner, Device device, QuantFormat f, int64_t rows, int64_t cols) {
  const CopyLayout l = copy_layout(f, rows, cols);
  QuantizedCopy c;
  c.format = f;
  c.rows = rows;
  c.cols = cols;
  owner.emplace_back(l.total, device);
  const Buffer& b = owner.back();
  c.data = b.as({rows, l.data_cols}, DType::U8, 0);
  if (l.scale_cols > 0) {
    c.scales = b.as({rows, l.scale_cols}, DType::U8, l.data);
    c.scales_swizzled = b.as({l.swizzled}, DType::U8, l.data + l.scales);
  }
  c.amax = b.as({1}, DType::F32, l.data + l.scales + l.swz);
  c.scale_inv = b.as({1}, DType::F32, l.data + l.scales + l.swz + 4);
  c.spare = b.as({2}, DType::F32, l.data + l.scales + l.swz + 8);
  return c;
}

}  // namespace

size_t quantized_tensor_bytes(QuantFormat format, int64_t rows, int64_t cols, bool rowwise, bool columnwise) {
  return (rowwise ? copy_layout(format, rows, cols).total : 0) + (columnwise ? copy_layout(format, cols, rows).total : 0);
}

QuantizedTensor allocate_quantized(std::vector<Buffer>& owner, Device device, QuantFormat format, int64_t rows,
                                   int64_t cols, bool rowwise, bool columnwise) {
  QuantizedTensor q;
  q.format = format;
  if (rowwise) {
    q.rowwise = allocate_copy(owner, device, format, rows, cols);
    q.has_rowwise = true;
  }
  if (columnwise) {
    q.columnwise = allocate_copy(owner, device, format, cols, rows);
    q.has_columnwise = true;
  }
  return q;
}

bool quantized_gemm_native(QuantFormat format, int sm) {
  switch (format) {
    case QuantFormat::NVFP4:
    case QuantFormat::MXFP8: return sm == 100 || sm == 103;
    case QuantFormat::FP8_E4M3:
    case QuantFormat::FP8_E5M2: return sm >= 89;
  }
  return false;
}

int opened_gpu_sm() {
#if defined(PL_WITH_CUDA)
  return cuda::opened_context_sm();
#else
  return 0;
#endif
}

int current_gpu_sm() {
#if defined(PL_WITH_CUDA)
  return cuda::current_context_sm();
#else
  fail("current_gpu_sm: this build has no CUDA backend (configure with nvcc present)");
#endif
}

namespace {
[[maybe_unused]] [[noreturn]] void no_cuda(const char* op) {
  fail("op {} needs the CUDA backend, which this build does not have (configure with nvcc present)", op);
}
// The timer category of a quantized GEMM (--timing-log-level 2): by A's format; FP8 E4M3 and E5M2
// (Megatron's "hybrid") are one category.
TimerId gemm_timer(QuantFormat f) {
  switch (f) {
    case QuantFormat::NVFP4: return TimerId::GemmNvfp4;
    case QuantFormat::MXFP8: return TimerId::GemmMxfp8;
    case QuantFormat::FP8_E4M3:
    case QuantFormat::FP8_E5M2: return TimerId::GemmFp8;
  }
  return TimerId::GemmFp8;
}
}  // namespace

void quantize(const OpContext& ctx, QuantizedTensor& q, const Tensor& x, const QuantizeOptions& opt) {
  OpTimer timer(TimerId::Quantization);
  if (ctx.device == Device::CPU) return cpu::quantize(ctx, q, x, opt);
#if defined(PL_WITH_CUDA)
  return cuda::quantize(ctx, q, x, opt);
#else
  no_cuda("quantize");
#endif
}

void dequantize(const OpContext& ctx, const Tensor& out, const QuantizedCopy& c, QuantFormat format) {
  OpTimer timer(TimerId::QuantStats);
  if (ctx.device == Device::CPU) return cpu::dequantize(ctx, out, c, format);
#if defined(PL_WITH_CUDA)
  return cuda::dequantize(ctx, out, c, format);
#else
  no_cuda("dequantize");
#endif
}

void quantized_gemm(const OpContext& ctx, const Tensor& y, const QuantizedCopy& a, const QuantizedCopy& b,
                    QuantFormat format, bool accumulate, const Tensor& scratch_a, const Tensor& scratch_b,
                    bool fast_accumulation) {
  OpTimer timer(gemm_timer(format));
  if (ctx.device == Device::CPU)
    return cpu::quantized_gemm(ctx, y, a, b, format, accumulate, scratch_a, scratch_b, fast_accumulation);
#if defined(PL_WITH_CUDA)
  return cuda::quantized_gemm(ctx, y, a, b, format, accumulate, scratch_a, scratch_b, fast_accumulation);
#else
  no_cuda("quantized_gemm");
#endif
}

QuantStats quant_stats(const OpContext& ctx, const QuantizedCopy& c, QuantFormat format, const Tensor& reference) {
  OpTimer timer(TimerId::QuantStats);
  if (ctx.device == Device::CPU) return cpu::quant_stats(ctx, c, format, reference);
#if defined(PL_WITH_CUDA)
  return cuda::quant_stats(ctx, c, format, reference);
#else
  no_cuda("quant_stats");
#endif
}

void columnwise_source(const OpContext& ctx, const Tensor& out, const Tensor& x, bool rht) {
  OpTimer timer(TimerId::QuantStats);
  if (ctx.device == Device::CPU) return cpu::columnwise_source(ctx, out, x, rht);
#if defined(PL_WITH_CUDA)
  return cuda::columnwise_source(ctx, out, x, rht);
#else
  no_cuda("columnwise_source");
#endif
}

}  // namespace pl
