// Quantized-tensor allocation (device-agnostic) and the format rules; the quantization ops are
// dispatched with the others (backend/ops.cpp).
#include "backend/quantize.h"

#include "core/error.h"
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
  return f == QuantFormat::NVFP4 ? 16 : (f == QuantFormat::MXFP8 ? 32 : 1);
}

namespace {

// Byte layout of one copy's single allocation: codes, compact scales, swizzled scales, then a 256-byte
// tail of floats; each part 256-byte aligned (TE's allocator gives 256). In the tail, scale_inv comes
// first, at the tail's 256-byte boundary: cuBLASLt's FP8 kernels read it as A/B_SCALE_POINTER and
// refuse one that is only 4-byte aligned (CUBLAS_STATUS_NOT_SUPPORTED from cublasLtMatmul after the
// heuristic chose an algorithm: cuBLASLt 13.1 on the first H200 run, 2026-11-28, docs/GPU_RESULTS.md).
// The amax and the owner's two spare floats follow, each 16-byte aligned.
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
  const size_t tail = l.data + l.scales + l.swz;
  c.scale_inv = b.as({1}, DType::F32, tail);
  c.amax = b.as({1}, DType::F32, tail + 16);
  c.spare = b.as({2}, DType::F32, tail + 32);
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
  q.has_rowwise = rowwise;
  q.has_columnwise = columnwise;
  if (rowwise) q.rowwise = allocate_copy(owner, device, format, rows, cols);
  if (columnwise) q.columnwise = allocate_copy(owner, device, format, cols, rows);
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

}  // namespace pl
