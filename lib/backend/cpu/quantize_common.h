#pragma once
// What the CPU quantization ops share (quantize.cpp, dequantize.cpp, quantized_gemm.cpp,
// quant_stats.cpp): the source view of x a copy is made from, and the values a copy holds.
#include <cstdint>

#include "backend/quantize.h"
#include "numerics/fp4.h"
#include "numerics/fp8.h"
#include "numerics/hadamard.h"
#include "numerics/nvfp4.h"

namespace pl::cpu {

// A copy is described by a "source" view of x: rowwise reads x[r][c]; columnwise reads xᵀ, i.e.
// x[c][r], optionally through the 16-point RHT along the copy's rows (chunks of 16 consecutive
// tokens, aligned with the NVFP4 blocks). Nothing is materialised.
// Reads 16 consecutive source elements of copy row r starting at copy column c0.
struct Source {
  const float* x;
  int64_t x_cols;   // row stride of x
  bool transposed;  // copy = xᵀ
  bool rht;         // copy = RHT(xᵀ) along its rows
  void load16(int64_t r, int64_t c0, float out[16]) const {
    for (int i = 0; i < 16; ++i) out[i] = at(r, c0 + i);
    if (rht) num::rht16(out, out, num::kRhtSignMask);  // out may alias in
  }
  float at(int64_t r, int64_t c) const { return transposed ? x[c * x_cols + r] : x[r * x_cols + c]; }
};

// The E2M1 code (a nibble) of element (r, k) of an NVFP4 copy.
inline uint8_t nvfp4_code(const QuantizedCopy& c, int64_t r, int64_t k) {
  const uint8_t byte = c.data.u8()[r * (c.cols / 2) + k / 2];
  return (k & 1) ? (byte >> 4) : (byte & 0xF);
}

// Dequantized value of element (r, k) of a copy: code value times its block scale, without the
// NVFP4 global scale (which the GEMM applies through alpha).
inline float block_value(const QuantizedCopy& c, QuantFormat f, int64_t r, int64_t k) {
  switch (f) {
    case QuantFormat::NVFP4:
      return num::e2m1_to_float(nvfp4_code(c, r, k)) * num::e4m3_to_float(c.scales.u8()[r * (c.cols / 16) + k / 16]);
    case QuantFormat::MXFP8:
      return num::e4m3_to_float(c.data.u8()[r * c.cols + k]) *
             num::ue8m0_to_float(c.scales.u8()[r * (c.cols / 32) + k / 32]);
    case QuantFormat::FP8_E4M3: return num::e4m3_to_float(c.data.u8()[r * c.cols + k]);
    case QuantFormat::FP8_E5M2: return num::e5m2_to_float(c.data.u8()[r * c.cols + k]);
  }
  return 0.0f;
}

// The fully dequantized value of element (r, k), global scale included. NVFP4 follows TE's
// dequantize kernel: value · (f32(scale · amax) · f32(1/2688)).
inline float dequantized_value(const QuantizedCopy& c, int64_t r, int64_t k) {
  switch (c.format) {
    case QuantFormat::NVFP4:
      return num::e2m1_to_float(nvfp4_code(c, r, k)) *
             num::nvfp4_dequant_factor(c.scales.u8()[r * (c.cols / 16) + k / 16], c.amax.f32()[0]);
    case QuantFormat::MXFP8: return block_value(c, c.format, r, k);
    default: return block_value(c, c.format, r, k) * c.scale_inv.f32()[0];
  }
}

}  // namespace pl::cpu
