#pragma once
// cuBLASLt's swizzled block-scale layout ("128x4" tiles) for NVFP4 (VEC16_UE4M3) and MXFP8
// (VEC32_UE8M0) operands (SPEC-NVFP4 §6.2; TE quantize_transpose_vector_blockwise_fp4.cu
// scale_factor_swizzled_offset; cuBLAS docs "1D Block Scaling Factors Layout").
// SF[R][C] (R = rows of the K-major operand, C = K/16 or K/32) is padded to R' = roundup(R, 128),
// C' = roundup(C, 4) with zeros; each 128x4 tile is 512 contiguous bytes, tiles ordered with the
// K-tile index fastest: view as [R'/128, 4, 32, C'/4, 4] and permute to (0, 3, 2, 1, 4).
#include <cstdint>

#include "numerics/hd.h"

namespace pl::num {

PL_HD int64_t padded_scale_rows(int64_t rows) { return (rows + 127) / 128 * 128; }
PL_HD int64_t padded_scale_cols(int64_t cols) { return (cols + 3) / 4 * 4; }

// Byte offset of SF[r][c] in the swizzled array; padded_cols = C' (a multiple of 4).
PL_HD int64_t swizzled_scale_offset(int64_t r, int64_t c, int64_t padded_cols) {
  return ((r / 128) * (padded_cols / 4) + (c / 4)) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + (c % 4);
}

}  // namespace pl::num
