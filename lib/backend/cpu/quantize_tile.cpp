// The CPU quantizers' inner kernels (quantize_tile.h): each group is loaded into a structure-of-arrays
// tile T[element][lane] (the columnwise copies' blocks are columns of x, so their tile rows are
// contiguous reads of x: a cache-friendly transpose through 1-2 KB of stack), then every step is a
// branch-free loop over the lanes. The exported kernels are compiled twice (GCC target_clones): for
// baseline x86-64 and for x86-64-v4 (AVX-512), picked at load time by the CPU; both run the same IEEE
// FP32 and integer operations (-ffp-contract=off), so their bytes are the same.
#include "backend/cpu/quantize_tile.h"

#include <cstring>

#include "backend/cpu/quantize_simd.h"
#include "numerics/hadamard.h"
#include "numerics/philox.h"

#include "backend/cpu/vector_clones.h"
// The helpers are inlined into each clone, so they too are compiled for its instruction set.
#define PL_QUANT_INLINE inline __attribute__((always_inline))

namespace pl::cpu {
namespace {

template <int E>
using Tile = float[E][kLanes];

// T[i][j] = element i of lane j's block; lanes past g.lanes are zero (they change no max and are not
// stored).
template <int E>
PL_QUANT_INLINE void load_tile(Tile<E>& T, const float* x, const BlockGroup& g) {
  const float* base = x + g.x_off;
  if (g.lanes == kLanes && g.lane_stride == 1) {
    for (int i = 0; i < E; ++i)
      for (int j = 0; j < kLanes; ++j) T[i][j] = base[i * g.elem_stride + j];
    return;
  }
  if (g.lanes == kLanes && g.elem_stride == 1) {  // a transpose: the lanes' blocks are rows of x
    for (int i = 0; i < E; ++i)
      for (int j = 0; j < kLanes; ++j) T[i][j] = base[j * g.lane_stride + i];
    return;
  }
  for (int j = 0; j < kLanes; ++j) {
    const float* p = base + j * g.lane_stride;
    if (j < g.lanes) {
      for (int i = 0; i < E; ++i) T[i][j] = p[i * g.elem_stride];
    } else {
      for (int i = 0; i < E; ++i) T[i][j] = 0.0f;
    }
  }
}

// Lanes whose 16 values are BF16 numbers (low 16 bits zero), normal or zero, spanning at most 12
// binades below a largest exponent e_max with e_max + 5 <= 128: then W = e_max + 5 - lsb_min <= 24
// (a BF16 value's lowest set bit is at most 7 below its exponent), which is rht16_path's condition
// for its FP32 butterfly (hadamard.h), so num::rht16 runs exactly the butterfly below. Other lanes
// (FP32 inputs under --fp32-reference, wide spans, Inf/NaN, subnormals) go through num::rht16 itself.
PL_QUANT_INLINE uint32_t rht_fast_lanes(const Tile<16>& T) {
  int32_t emax[kLanes], emin[kLanes];
  uint32_t bad[kLanes];
  for (int j = 0; j < kLanes; ++j) emax[j] = 0, emin[j] = 255, bad[j] = 0;
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < kLanes; ++j) {
      const uint32_t a = simd::float_bits(T[i][j]) & 0x7FFFFFFFu;
      const int32_t e = static_cast<int32_t>(a >> 23);
      emax[j] = e > emax[j] ? e : emax[j];
      const int32_t e_nz = a != 0 ? e : 255;
      emin[j] = e_nz < emin[j] ? e_nz : emin[j];
      bad[j] |= (a & 0xFFFFu) | ((a != 0 && e == 0) ? 1u : 0u);
    }
  uint32_t ok = 0;
  for (int j = 0; j < kLanes; ++j)
    ok |= static_cast<uint32_t>(bad[j] == 0 && emax[j] <= 250 && emax[j] - emin[j] <= 12) << j;
  return ok;
}

// T's lanes := RHT16 of each lane (num::rht16 with TE's sign vector), in place.
PL_QUANT_INLINE void rht_tile(Tile<16>& T) {
  const uint32_t ok = rht_fast_lanes(T);
  float slow_in[kLanes][16];
  if (ok != 0xFFFFu)
    for (int j = 0; j < kLanes; ++j)
      for (int i = 0; i < 16; ++i) slow_in[j][i] = T[i][j];
  // rht_detail::rht16_fp32 across the lanes: signs, four butterfly stages, *0.25f, RN to BF16.
  for (int i = 0; i < 16; ++i)
    if ((num::kRhtSignMask >> i) & 1u)
      for (int j = 0; j < kLanes; ++j) T[i][j] = -T[i][j];
  for (int len = 1; len < 16; len <<= 1)
    for (int i0 = 0; i0 < 16; i0 += 2 * len)
      for (int k = i0; k < i0 + len; ++k)
        for (int j = 0; j < kLanes; ++j) {
          const float a = T[k][j], b = T[k + len][j];
          T[k][j] = a + b;
          T[k + len][j] = a - b;
        }
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < kLanes; ++j) T[i][j] = num::round_bf16(T[i][j] * 0.25f);
  if (ok == 0xFFFFu) return;
  for (int j = 0; j < kLanes; ++j) {
    if ((ok >> j) & 1u) continue;
    float out[16];
    num::rht16(slow_in[j], out, num::kRhtSignMask);
    for (int i = 0; i < 16; ++i) T[i][j] = out[i];
  }
}

template <int E>
PL_QUANT_INLINE void lane_amax_bits(const Tile<E>& T, uint32_t amax[kLanes]) {
  for (int j = 0; j < kLanes; ++j) amax[j] = 0;
  for (int i = 0; i < E; ++i)
    for (int j = 0; j < kLanes; ++j) {
      const uint32_t a = simd::abs_bits_nan0(T[i][j]);
      amax[j] = a > amax[j] ? a : amax[j];
    }
}

// num::sr_random_words for the lanes' block indices: Philox4x32-10 with the same counter and key per
// block, the lanes side by side. w[k][j] is word k of lane j.
PL_QUANT_INLINE void philox_lanes(const Nvfp4Params& p, const uint64_t block_index[kLanes], uint32_t w[4][kLanes]) {
  uint32_t c0[kLanes], c1[kLanes], c2[kLanes], c3[kLanes];
  for (int j = 0; j < kLanes; ++j) {
    c0[j] = static_cast<uint32_t>(block_index[j]);
    c1[j] = static_cast<uint32_t>(block_index[j] >> 32) ^ static_cast<uint32_t>(p.counter >> 32);
    c2[j] = p.stream;
    c3[j] = static_cast<uint32_t>(p.counter);
  }
  uint32_t k0 = static_cast<uint32_t>(p.seed), k1 = static_cast<uint32_t>(p.seed >> 32);
  for (int r = 0; r < 10; ++r) {
    if (r > 0) k0 += num::kPhiloxW0, k1 += num::kPhiloxW1;
    for (int j = 0; j < kLanes; ++j) {
      const uint64_t p0 = static_cast<uint64_t>(num::kPhiloxM0) * c0[j];
      const uint64_t p1 = static_cast<uint64_t>(num::kPhiloxM1) * c2[j];
      const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1[j] ^ k0;
      const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3[j] ^ k1;
      c1[j] = static_cast<uint32_t>(p1);
      c3[j] = static_cast<uint32_t>(p0);
      c0[j] = n0;
      c2[j] = n2;
    }
  }
  for (int j = 0; j < kLanes; ++j) w[0][j] = c0[j], w[1][j] = c1[j], w[2][j] = c2[j], w[3][j] = c3[j];
}

PL_QUANT_INLINE int64_t lane_row(const BlockGroup& g, int j) { return g.row0 + static_cast<int64_t>(j) * g.row_step; }
PL_QUANT_INLINE int64_t lane_block(const BlockGroup& g, int j) { return g.block0 + static_cast<int64_t>(j) * g.block_step; }

// E2M1 codes of the tile scaled by each lane's encode scale, RN or SR, packed: byte k of packed[j]
// holds elements 2k (low nibble) and 2k+1 of lane j, i.e. packed[j] is lane j's 8 storage bytes.
PL_QUANT_INLINE void nvfp4_codes(const Tile<16>& T, const float enc[kLanes], const BlockGroup& g, const Nvfp4Params& p,
                                 uint64_t packed[kLanes]) {
  uint32_t code[16][kLanes];
  if (p.stochastic && !p.tile_2d) {
    uint64_t block_index[kLanes];
    const int64_t nb = p.cols / 16;
    for (int j = 0; j < kLanes; ++j) block_index[j] = static_cast<uint64_t>(lane_row(g, j) * nb + lane_block(g, j));
    uint32_t w[4][kLanes];
    philox_lanes(p, block_index, w);
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < kLanes; ++j)
        code[i][j] = simd::float_to_e2m1_sr(T[i][j] * enc[j], (w[i / 4][j] >> (8 * (i % 4))) & 0xFFu);
  } else {
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < kLanes; ++j) code[i][j] = simd::float_to_e2m1(T[i][j] * enc[j]);
  }
  for (int j = 0; j < kLanes; ++j) packed[j] = 0;
  for (int k = 0; k < 8; ++k)
    for (int j = 0; j < kLanes; ++j)
      packed[j] |= static_cast<uint64_t>(code[2 * k][j] | (code[2 * k + 1][j] << 4)) << (8 * k);
}

}  // namespace

BlockGroup make_group(const Source& s, int64_t r0, int64_t b0, int lanes, bool along_rows, int elems) {
  const int64_t elem_stride = s.transposed ? s.x_cols : 1, row_stride = s.transposed ? 1 : s.x_cols;
  BlockGroup g;
  g.x_off = r0 * row_stride + b0 * elems * elem_stride;
  g.elem_stride = elem_stride;
  g.lane_stride = along_rows ? row_stride : elems * elem_stride;
  g.lanes = lanes;
  g.row0 = r0;
  g.block0 = b0;
  g.row_step = along_rows ? 1 : 0;
  g.block_step = along_rows ? 0 : 1;
  return g;
}

PL_VECTOR_CLONES float group_amax(const float* x, const BlockGroup& g, bool rht) {
  Tile<16> T;
  load_tile<16>(T, x, g);
  if (rht) rht_tile(T);
  uint32_t amax[kLanes];
  lane_amax_bits<16>(T, amax);
  uint32_t m = 0;
  for (int j = 0; j < kLanes; ++j) m = amax[j] > m ? amax[j] : m;
  return simd::bits_float(m);
}

PL_VECTOR_CLONES float contiguous_amax(const float* x, int64_t n) {
  uint32_t m[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      const uint32_t a = simd::abs_bits_nan0(x[i + j]);
      m[j] = a > m[j] ? a : m[j];
    }
  uint32_t r = 0;
  for (; i < n; ++i) {
    const uint32_t a = simd::abs_bits_nan0(x[i]);
    r = a > r ? a : r;
  }
  for (int j = 0; j < kLanes; ++j) r = m[j] > r ? m[j] : r;
  return simd::bits_float(r);
}

PL_VECTOR_CLONES void nvfp4_group(const float* x, const BlockGroup& g, const Nvfp4Params& p, uint8_t* data,
                                 uint8_t* scales) {
  Tile<16> T;
  load_tile<16>(T, x, g);
  if (p.rht) rht_tile(T);
  uint32_t amax[kLanes];
  lane_amax_bits<16>(T, amax);
  if (p.tile_2d) {  // the 16x16 tile's amax for every lane
    uint32_t m = 0;
    for (int j = 0; j < kLanes; ++j) m = amax[j] > m ? amax[j] : m;
    for (int j = 0; j < kLanes; ++j) amax[j] = m;
  }
  // nvfp4.h: nvfp4_block_scale and nvfp4_block_encode.
  uint32_t sb[kLanes];
  float enc[kLanes];
  for (int j = 0; j < kLanes; ++j) {
    sb[j] = simd::float_to_e4m3(simd::min_flt_max(simd::bits_float(amax[j]) * p.mult));
    enc[j] = simd::min_flt_max(1.0f / (simd::e4m3_to_float(sb[j]) * p.s_dec));
  }
  uint64_t packed[kLanes];
  nvfp4_codes(T, enc, g, p, packed);
  const int64_t nb = p.cols / 16;
  for (int j = 0; j < g.lanes; ++j) {
    const int64_t r = lane_row(g, j), b = lane_block(g, j);
    std::memcpy(data + r * (p.cols / 2) + b * 8, &packed[j], 8);  // little-endian: byte k = bits 8k..8k+7
    scales[r * nb + b] = static_cast<uint8_t>(sb[j]);
  }
}

PL_VECTOR_CLONES void mxfp8_group(const float* x, const BlockGroup& g, int64_t cols, uint8_t* data,
                                 uint8_t* scales) {
  Tile<32> T;
  load_tile<32>(T, x, g);
  uint32_t amax[kLanes];
  lane_amax_bits<32>(T, amax);
  uint32_t e[kLanes];
  float s[kLanes];
  for (int j = 0; j < kLanes; ++j) {  // fp8.h: mxfp8_block_scale, mxfp8_element_scale
    e[j] = simd::float_to_ue8m0_rp(simd::bits_float(amax[j]) * 0x1.24924ap-9f);
    s[j] = simd::mxfp8_element_scale(e[j]);
  }
  uint32_t code[32][kLanes];
  for (int i = 0; i < 32; ++i)
    for (int j = 0; j < kLanes; ++j) code[i][j] = simd::float_to_e4m3(T[i][j] * s[j]);
  const int64_t nb = cols / 32;
  for (int j = 0; j < g.lanes; ++j) {
    const int64_t r = lane_row(g, j), b = lane_block(g, j);
    uint8_t* dst = data + r * cols + b * 32;
    for (int i = 0; i < 32; ++i) dst[i] = static_cast<uint8_t>(code[i][j]);
    scales[r * nb + b] = static_cast<uint8_t>(e[j]);
  }
}

PL_VECTOR_CLONES void fp8_rows(const Source& s, int64_t r0, int rows, int64_t cols, float scale, bool e4m3,
                              uint8_t* data) {
  if (!s.transposed) {
    for (int j = 0; j < rows; ++j) {
      const float* src = s.x + (r0 + j) * s.x_cols;
      uint8_t* dst = data + (r0 + j) * cols;
      if (e4m3) {
        for (int64_t k = 0; k < cols; ++k) dst[k] = static_cast<uint8_t>(simd::float_to_e4m3(src[k] * scale));
      } else {
        for (int64_t k = 0; k < cols; ++k) dst[k] = static_cast<uint8_t>(simd::float_to_e5m2(src[k] * scale));
      }
    }
    return;
  }
  // Copy row r is column r of x: read x's rows r0 .. r0+rows-1 wide, write the copy rows' columns.
  for (int64_t k = 0; k < cols; ++k) {
    const float* src = s.x + k * s.x_cols + r0;
    if (e4m3) {
      for (int j = 0; j < rows; ++j) data[(r0 + j) * cols + k] = static_cast<uint8_t>(simd::float_to_e4m3(src[j] * scale));
    } else {
      for (int j = 0; j < rows; ++j) data[(r0 + j) * cols + k] = static_cast<uint8_t>(simd::float_to_e5m2(src[j] * scale));
    }
  }
}

}  // namespace pl::cpu
