// CPU dequantize: the exact values of one copy (quantize_common.h dequantized_value).
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/quantize_common.h"

namespace pl::cpu {

void dequantize(const OpContext&, const Tensor& out, const QuantizedCopy& c, QuantFormat) {
  float* o = out.f32();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t k = 0; k < c.cols; ++k) o[r * c.cols + k] = dequantized_value(c, r, k);
}

}  // namespace pl::cpu
