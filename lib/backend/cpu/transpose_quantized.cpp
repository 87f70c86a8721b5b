// CPU transpose_quantized (op_list.h): a weight's quantized copy transposed code by code, its NVFP4 block scales
// moved to the transposed blocks (compact and swizzled), amax and scale_inv copied. The CUDA twin is
// backend/cuda/transpose_quantized.cu.
#include <cstring>

#include "backend/cpu/cpu_ops.h"
#include "numerics/swizzle.h"

namespace pl::cpu {

void transpose_quantized(const OpContext&, const QuantizedCopy& dst, const QuantizedCopy& src) {
  const int64_t R = src.rows, C = src.cols;  // dst is [C, R]
  const uint8_t* s = src.data.u8();
  uint8_t* d = dst.data.u8();
  if (src.format == QuantFormat::NVFP4) {
    const auto code = [&](int64_t r, int64_t c) { return (s[r * (C / 2) + c / 2] >> (4 * (c & 1))) & 0xF; };
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t r = 0; r < R; r += 2)
        d[c * (R / 2) + r / 2] = static_cast<uint8_t>(code(r, c) | (code(r + 1, c) << 4));
    // Scales: dst's block (c, rb) is src's 2D block (rb, c/16), whose scale every row of it holds.
    const int64_t src_blocks = C / 16, dst_blocks = R / 16, padded = num::padded_scale_cols(dst_blocks);
    const uint8_t* ss = src.scales.u8();
    uint8_t* ds = dst.scales.u8();
    uint8_t* dz = dst.scales_swizzled.u8();
    std::memset(dz, 0, static_cast<size_t>(dst.scales_swizzled.numel()));
    for (int64_t c = 0; c < C; ++c)
      for (int64_t rb = 0; rb < dst_blocks; ++rb) {
        const uint8_t v = ss[rb * 16 * src_blocks + c / 16];
        ds[c * dst_blocks + rb] = v;
        dz[num::swizzled_scale_offset(c, rb, padded)] = v;
      }
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t r = 0; r < R; ++r) d[c * R + r] = s[r * C + c];
  }
  *dst.amax.f32() = *src.amax.f32();
  *dst.scale_inv.f32() = *src.scale_inv.f32();
}

}  // namespace pl::cpu
