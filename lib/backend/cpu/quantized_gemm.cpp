// CPU quantized_gemm: an emulation of the block-scaled GEMM, exact in its operands. Every code is expanded
// with its block scale into the scratch buffers and the product runs as a BF16 GEMM with FP32 accumulation
// (onednn_gemm.h), the per-tensor scales (FP8's scale product, NVFP4's amax-derived alpha) applied once to
// the FP32 result as cuBLASLt's alpha; without a native BF16 matmul the same values go to FP32 SGEMM
// (gemm_nt_fp32, linear.cpp). The two paths multiply the same exact values and differ only in FP32 summation order.
//
// Why the values are exact in BF16 (8 significant bits, FP32's exponent range):
//   NVFP4  E2M1 (<= 2 significant bits, |v| in {0.5 .. 6}) x E4M3 scale (<= 4 bits, 2^-9 .. 448):
//          <= 6 bits, magnitudes 2^-10 .. 2688: normal in BF16;
//   FP8    E4M3 (<= 4 bits, 2^-9 .. 448) or E5M2 (<= 3 bits, 2^-16 .. 57344), no block scale: normal;
//   MXFP8  E4M3 x 2^(e-127) (UE8M0 e): <= 4 bits, but the smallest code 2^-9 times a small scale can fall
//          below BF16's smallest normal 2^-126, and BF16 dot-product instructions flush subnormal inputs to
//          zero. A copy holding a scale byte e < 10 (2^-9 · 2^(e-127) < 2^-126) therefore takes the FP32
//          path, where those values are exact. (e > 246 overflows FP32 exactly as it overflows BF16.)
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/onednn_gemm.h"
#include "backend/cpu/quantize_common.h"
#include "numerics/bf16.h"

namespace pl::cpu {

namespace {

// The smallest UE8M0 scale byte whose block values are all normal in BF16 (see above).
constexpr uint8_t kMinBf16SafeMxScale = 10;

// The value of code byte i of copy c (without its block scale).
float code_value(QuantFormat f, uint8_t b) {
  return f == QuantFormat::NVFP4 ? num::e2m1_to_float(b) : f == QuantFormat::FP8_E5M2 ? num::e5m2_to_float(b)
                                                                                        : num::e4m3_to_float(b);
}

// Stores v into out[i]: as FP32, or as its BF16 bits (exact: the values above are BF16 numbers).
inline void store(float* out, int64_t i, float v) { out[i] = v; }
inline void store(uint16_t* out, int64_t i, float v) { out[i] = num::float_to_bf16_bits(v); }

// Every element's block_value (code x block scale), row by row, into out[rows*cols] (the GEMM operand).
template <class Out>
void block_values(const QuantizedCopy& c, Out* out) {
  const int64_t R = c.rows, C = c.cols;
  const uint8_t* data = c.data.u8();
  const uint8_t* scales = c.format == QuantFormat::NVFP4 || c.format == QuantFormat::MXFP8 ? c.scales.u8() : nullptr;
  float lut[256];
  for (int i = 0; i < 256; ++i) lut[i] = code_value(c.format, static_cast<uint8_t>(i));
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    Out* o = out + r * C;
    if (c.format == QuantFormat::NVFP4) {
      const uint8_t* d = data + r * (C / 2);
      for (int64_t b = 0; b < C / 16; ++b) {
        const float s = num::e4m3_to_float(scales[r * (C / 16) + b]);
        for (int k = 0; k < 8; ++k) {
          const uint8_t byte = d[b * 8 + k];
          store(o, b * 16 + 2 * k, lut[byte & 0xF] * s);
          store(o, b * 16 + 2 * k + 1, lut[byte >> 4] * s);
        }
      }
    } else if (c.format == QuantFormat::MXFP8) {
      for (int64_t b = 0; b < C / 32; ++b) {
        const float s = num::ue8m0_to_float(scales[r * (C / 32) + b]);
        for (int k = 0; k < 32; ++k) store(o, b * 32 + k, lut[data[r * C + b * 32 + k]] * s);
      }
    } else {
      for (int64_t k = 0; k < C; ++k) store(o, k, lut[data[r * C + k]]);
    }
  }
}

// Whether every block value of c is a normal BF16 number (only MXFP8's small scales can break it).
bool bf16_dot_safe(const QuantizedCopy& c) {
  if (c.format != QuantFormat::MXFP8) return true;
  const uint8_t* s = c.scales.u8();
  const int64_t n = c.scales.numel();
  uint8_t lowest = 255;
  for (int64_t i = 0; i < n; ++i) lowest = s[i] < lowest ? s[i] : lowest;
  return lowest >= kMinBf16SafeMxScale;
}

// The expanded operands as BF16 GEMM: true when oneDNN ran it.
bool bf16_quantized_gemm(const OpContext& ctx, const Tensor& y, const QuantizedCopy& a, const QuantizedCopy& b,
                         float alpha, bool accumulate, const Tensor& scratch_a, const Tensor& scratch_b) {
  if (!cpu_gemm_engine().onednn_bf16 || !bf16_dot_safe(a) || !bf16_dot_safe(b)) return false;
  // The FP32 scratch holds twice as many BF16 values as it has floats: room for rows*cols of each.
  auto* a16 = reinterpret_cast<uint16_t*>(scratch_a.data);
  auto* b16 = reinterpret_cast<uint16_t*>(scratch_b.data);
  block_values(a, a16);
  block_values(b, b16);
  op_next_phase(ctx);  // the expansion ends, the GEMM begins (two rows of a roofline report)
  // y[M,N] = alpha · A[M,K] · B[N,K]ᵀ
  if (!onednn_bf16_matmul("quantized_gemm", a16, row_major(a.rows, a.cols, a.cols), b16,
                          transposed(b.rows, b.cols, b.cols), y.f32(), y.dim(1), alpha, accumulate))
    return false;
  if (ctx.round_bf16 && !accumulate) round_rows_bf16(y.f32(), y.dim(0), y.dim(1));
  return true;
}

}  // namespace

void quantized_gemm(const OpContext& ctx, const Tensor& y, const QuantizedCopy& a, const QuantizedCopy& b,
                    QuantFormat f, bool accumulate, const Tensor& scratch_a, const Tensor& scratch_b,
                    bool fast_accumulation) {
  (void)fast_accumulation;  // a cuBLASLt FP8 kernel option: the CPU always accumulates in FP32
  float alpha = 1.0f;       // MXFP8: the block scales are all there is
  if (f == QuantFormat::NVFP4) alpha = num::nvfp4_gemm_alpha(a.amax.f32()[0], b.amax.f32()[0]);
  if (f == QuantFormat::FP8_E4M3 || f == QuantFormat::FP8_E5M2) alpha = a.scale_inv.f32()[0] * b.scale_inv.f32()[0];
  if (bf16_quantized_gemm(ctx, y, a, b, alpha, accumulate, scratch_a, scratch_b)) return;
  // FP32 path: exact block-scaled values (E2M1·E4M3 and E4M3·UE8M0 products are exact in FP32).
  const Tensor da = scratch_a.leading(a.rows, a.cols);
  const Tensor db = scratch_b.leading(b.rows, b.cols);
  block_values(a, da.f32());
  block_values(b, db.f32());
  op_next_phase(ctx);
  gemm_nt_fp32(ctx, y, da, db, alpha, accumulate);
}

}  // namespace pl::cpu
