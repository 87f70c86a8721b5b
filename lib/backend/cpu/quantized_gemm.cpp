// CPU quantized_gemm: every operand dequantized exactly (block scale included, global scale in alpha)
// into the scratch buffers and multiplied by BLAS (gemm_nt, linear.cpp) with FP32 accumulation: an
// emulation of the block-scaled GEMM, equal to it up to summation order.
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/quantize_common.h"

namespace pl::cpu {

namespace {

// Every element's block_value, row by row, into out[rows*cols] (the GEMM operand).
void block_values(const QuantizedCopy& c, float* out) {
  const int64_t R = c.rows, C = c.cols;
  const uint8_t* data = c.data.u8();
  const uint8_t* scales = c.format == QuantFormat::NVFP4 || c.format == QuantFormat::MXFP8 ? c.scales.u8() : nullptr;
  float lut[256];
  for (int i = 0; i < 256; ++i) {
    const auto b = static_cast<uint8_t>(i);
    lut[i] = c.format == QuantFormat::NVFP4      ? num::e2m1_to_float(b)
             : c.format == QuantFormat::FP8_E5M2 ? num::e5m2_to_float(b)
                                                 : num::e4m3_to_float(b);
  }
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    float* o = out + r * C;
    if (c.format == QuantFormat::NVFP4) {
      const uint8_t* d = data + r * (C / 2);
      for (int64_t b = 0; b < C / 16; ++b) {
        const float s = num::e4m3_to_float(scales[r * (C / 16) + b]);
        for (int k = 0; k < 8; ++k) {
          const uint8_t byte = d[b * 8 + k];
          o[b * 16 + 2 * k] = lut[byte & 0xF] * s;
          o[b * 16 + 2 * k + 1] = lut[byte >> 4] * s;
        }
      }
    } else if (c.format == QuantFormat::MXFP8) {
      for (int64_t b = 0; b < C / 32; ++b) {
        const float s = num::ue8m0_to_float(scales[r * (C / 32) + b]);
        for (int k = 0; k < 32; ++k) o[b * 32 + k] = lut[data[r * C + b * 32 + k]] * s;
      }
    } else {
      for (int64_t k = 0; k < C; ++k) o[k] = lut[data[r * C + k]];
    }
  }
}

}  // namespace

void quantized_gemm(const OpContext& ctx, const Tensor& y, const QuantizedCopy& a, const QuantizedCopy& b,
                    QuantFormat f, bool accumulate, const Tensor& scratch_a, const Tensor& scratch_b,
                    bool fast_accumulation) {
  (void)fast_accumulation;  // a cuBLASLt FP8 kernel option: the CPU always accumulates in FP32
  // Exact block-scaled values (E2M1·E4M3 and E4M3·UE8M0 products are exact in FP32).
  const Tensor da = scratch_a.view({scratch_a.numel()}).rows(0, a.rows * a.cols).view({a.rows, a.cols});
  const Tensor db = scratch_b.view({scratch_b.numel()}).rows(0, b.rows * b.cols).view({b.rows, b.cols});
  block_values(a, da.f32());
  block_values(b, db.f32());
  op_next_phase(ctx);  // the expansion ends, the GEMM begins (two rows of a roofline report)
  float alpha = 1.0f;  // MXFP8: the block scales are all there is
  if (f == QuantFormat::NVFP4) alpha = num::nvfp4_gemm_alpha(a.amax.f32()[0], b.amax.f32()[0]);
  if (f == QuantFormat::FP8_E4M3 || f == QuantFormat::FP8_E5M2) alpha = a.scale_inv.f32()[0] * b.scale_inv.f32()[0];
  gemm_nt(ctx, y, da, db, alpha, accumulate);
}

}  // namespace pl::cpu
