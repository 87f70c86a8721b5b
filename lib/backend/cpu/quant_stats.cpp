// CPU quant_stats (telemetry of one copy against the values it was made from) and columnwise_source
// (those values: x, xᵀ or RHT(xᵀ)).
#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/quantize_common.h"

namespace pl::cpu {

QuantStats quant_stats(const OpContext&, const QuantizedCopy& c, QuantFormat f, const Tensor& ref) {
  const int64_t blk = quant_block_size(f);
  // The largest magnitude code of the format (±6, ±448, ±57344).
  const uint8_t max_mag = f == QuantFormat::NVFP4 ? 0x7 : (f == QuantFormat::FP8_E5M2 ? 0x7B : 0x7E);
  const float* x = ref.f32();
  double err2 = 0.0, ref2 = 0.0;
  int64_t saturated = 0, underflow = 0, counted_blocks = 0;
#pragma omp parallel for reduction(+ : err2, ref2, saturated, underflow, counted_blocks) schedule(static)
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t k0 = 0; k0 < c.cols; k0 += std::max<int64_t>(blk, 1)) {
      const int64_t k1 = k0 + std::max<int64_t>(blk, 1);
      float bamax = 0.0f;
      bool all_zero = true;
      for (int64_t k = k0; k < k1; ++k) {
        const float v = dequantized_value(c, r, k);
        const int mag = c.format == QuantFormat::NVFP4 ? nvfp4_code(c, r, k) & 0x7 : c.data.u8()[r * c.cols + k] & 0x7F;
        saturated += mag == max_mag;
        const double d = static_cast<double>(v) - x[r * c.cols + k];
        err2 += d * d;
        ref2 += static_cast<double>(x[r * c.cols + k]) * x[r * c.cols + k];
        bamax = std::fmax(bamax, std::fabs(x[r * c.cols + k]));
        all_zero = all_zero && v == 0.0f;
      }
      if (bamax > 0.0f) {
        ++counted_blocks;
        // Block formats: the stored scale is zero (NVFP4 E4M3 0x00; MXFP8 the floor 2^-127).
        // Per-tensor FP8 (blocks of one element): a nonzero element flushed to zero.
        if (blk > 1)
          underflow += c.scales.u8()[r * (c.cols / blk) + k0 / blk] == 0;
        else
          underflow += all_zero;
      }
    }
  QuantStats s;
  s.amax = c.amax.f32()[0];
  s.saturated_fraction = static_cast<double>(saturated) / static_cast<double>(c.rows * c.cols);
  s.underflow_fraction = counted_blocks ? static_cast<double>(underflow) / static_cast<double>(counted_blocks) : 0.0;
  s.relative_error = ref2 > 0.0 ? std::sqrt(err2 / ref2) : 0.0;
  return s;
}

void columnwise_source(const OpContext&, const Tensor& out, const Tensor& x, bool rht) {
  const int64_t rows = x.dim(0), cols = x.dim(1);
  const Source s{x.f32(), cols, true, rht};
  float* o = out.f32();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < cols; ++r) {
    if (rht) {
      for (int64_t c = 0; c < rows; c += 16) s.load16(r, c, o + r * rows + c);
    } else {
      for (int64_t c = 0; c < rows; ++c) o[r * rows + c] = s.at(r, c);
    }
  }
}

}  // namespace pl::cpu
