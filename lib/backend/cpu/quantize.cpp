// CPU quantize: whole-tensor schedules around the shared per-block numerics (lib/numerics/). The amax
// pass and the quantize pass both read x through a Source view (quantize_common.h), so no scratch
// memory is needed.
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/quantize_common.h"
#include "numerics/philox.h"
#include "numerics/swizzle.h"

namespace pl::cpu {
namespace {
// fmaxf(m, |v|) for a non-NaN m, without a libm call: a NaN v is ignored, Inf is kept.
inline float max_abs(float m, float v) {
  const float a = std::fabs(v);
  return a > m ? a : m;
}

// max |v| ignoring NaN (fmaxf semantics, as nvte_compute_amax), over the whole copy.
float source_amax(const Source& s, int64_t rows, int64_t cols) {
  float amax = 0.0f;
  const bool blocked = s.rht;  // RHT values only exist per 16-chunk
#pragma omp parallel for reduction(max : amax) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float m = 0.0f;
    if (blocked) {
      float v[16];
      for (int64_t c = 0; c < cols; c += 16) {
        s.load16(r, c, v);
        for (float e : v) m = max_abs(m, e);
      }
    } else {
      for (int64_t c = 0; c < cols; ++c) m = max_abs(m, s.at(r, c));
    }
    amax = m > amax ? m : amax;
  }
  return amax;
}

void swizzle_scales(const QuantizedCopy& c) {
  const int64_t sc = c.scales.dim(1);
  const int64_t pc = num::padded_scale_cols(sc);
  uint8_t* out = c.scales_swizzled.u8();
  std::memset(out, 0, static_cast<size_t>(c.scales_swizzled.numel()));
  const uint8_t* in = c.scales.u8();
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t k = 0; k < sc; ++k) out[num::swizzled_scale_offset(r, k, pc)] = in[r * sc + k];
}

// ---- NVFP4 ---------------------------------------------------------------------------------------

void pack_codes(uint8_t* dst, const uint8_t code[16]) {
  for (int k = 0; k < 8; ++k) dst[k] = num::pack_e2m1_pair(code[2 * k], code[2 * k + 1]);
}

void quantize_nvfp4_copy(const QuantizedCopy& c, const Source& src, const QuantizeOptions& opt, uint32_t stream) {
  const int64_t R = c.rows, C = c.cols, nb = C / 16;
  const float amax = opt.amax_given ? c.amax.f32()[0] : source_amax(src, R, C);
  const float s_enc = num::nvfp4_global_encode_scale(amax);
  uint8_t* data = c.data.u8();
  uint8_t* scales = c.scales.u8();
  if (opt.block_2d) {
    // One scale per 16x16 tile (tile amax over 16 rows), written to all 16 rows (TE #2298); the
    // codes then use the block encode scale of their tile. Weights: RN, no RHT.
    const float s_dec = num::nvfp4_global_decode_scale(s_enc);
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t tr = 0; tr < R / 16; ++tr)
      for (int64_t b = 0; b < nb; ++b) {
        float tile_amax = 0.0f;
        float v[16];
        for (int64_t r = tr * 16; r < tr * 16 + 16; ++r) {
          src.load16(r, b * 16, v);
          tile_amax = std::fmax(tile_amax, num::nvfp4_abs_max(v, 16));
        }
        const uint8_t sb = num::nvfp4_block_scale(tile_amax, s_enc);
        const float enc = num::nvfp4_block_encode(sb, s_dec);
        for (int64_t r = tr * 16; r < tr * 16 + 16; ++r) {
          src.load16(r, b * 16, v);
          uint8_t code[16];
          for (int k = 0; k < 16; ++k) code[k] = num::nvfp4_encode(v[k], enc);
          pack_codes(data + r * (C / 2) + b * 8, code);
          scales[r * nb + b] = sb;
        }
      }
  } else {
    // 1x16 blocks: scale and codes of a block in one pass over its 16 source values.
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < R; ++r) {
      float v[16];
      uint8_t code[16], rb[16];
      for (int64_t b = 0; b < nb; ++b) {
        src.load16(r, b * 16, v);
        if (opt.stochastic) {
          num::sr_random_bytes16(opt.seed, stream, opt.counter, static_cast<uint64_t>(r * nb + b), rb);
          num::nvfp4_quantize_block16_sr(v, s_enc, rb, &scales[r * nb + b], code);
        } else {
          num::nvfp4_quantize_block16(v, s_enc, &scales[r * nb + b], code);
        }
        pack_codes(data + r * (C / 2) + b * 8, code);
      }
    }
  }
  c.amax.f32()[0] = amax;
  c.scale_inv.f32()[0] = num::nvfp4_global_decode_scale(s_enc);
  swizzle_scales(c);
}

// ---- MXFP8 ---------------------------------------------------------------------------------------

void quantize_mxfp8_copy(const QuantizedCopy& c, const Source& src, const QuantizeOptions& opt) {
  const int64_t R = c.rows, C = c.cols, nb = C / 32;
  uint8_t* data = c.data.u8();
  uint8_t* scales = c.scales.u8();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; ++r)
    for (int64_t b = 0; b < nb; ++b) {
      float bamax = 0.0f;
      for (int64_t k = 0; k < 32; ++k) bamax = std::fmax(bamax, std::fabs(src.at(r, b * 32 + k)));
      const uint8_t e = num::mxfp8_block_scale(bamax);
      const float s = num::mxfp8_element_scale(e);
      scales[r * nb + b] = e;
      for (int64_t k = 0; k < 32; ++k) data[r * C + b * 32 + k] = num::float_to_e4m3(src.at(r, b * 32 + k) * s);
    }
  if (!opt.amax_given) c.amax.f32()[0] = source_amax(src, R, C);
  c.scale_inv.f32()[0] = 1.0f;
  swizzle_scales(c);
}

// ---- FP8 per-tensor (current scaling) ------------------------------------------------------------

void quantize_fp8_copy(const QuantizedCopy& c, const Source& src, QuantFormat f, const QuantizeOptions& opt) {
  const int64_t R = c.rows, C = c.cols;
  const bool e4m3 = f == QuantFormat::FP8_E4M3;
  const float amax = opt.amax_given ? c.amax.f32()[0] : source_amax(src, R, C);
  const float scale = num::fp8_current_scale(amax, e4m3 ? num::kE4M3Max : num::kE5M2Max);
  uint8_t* data = c.data.u8();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; ++r)
    for (int64_t k = 0; k < C; ++k) {
      const float v = src.at(r, k) * scale;
      data[r * C + k] = e4m3 ? num::float_to_e4m3(v) : num::float_to_e5m2(v);
    }
  c.amax.f32()[0] = amax;
  c.scale_inv.f32()[0] = 1.0f / scale;  // TE: __frcp_rn(scale)
}

void quantize_copy(const QuantizedCopy& c, QuantFormat f, const Source& src, const QuantizeOptions& opt,
                   uint32_t stream) {
  switch (f) {
    case QuantFormat::NVFP4: return quantize_nvfp4_copy(c, src, opt, stream);
    case QuantFormat::MXFP8: return quantize_mxfp8_copy(c, src, opt);
    case QuantFormat::FP8_E4M3:
    case QuantFormat::FP8_E5M2: return quantize_fp8_copy(c, src, f, opt);
  }
}

}  // namespace

void quantize(const OpContext&, QuantizedTensor& q, const Tensor& x, const QuantizeOptions& opt) {
  const int64_t rows = x.dim(0), cols = x.dim(1);
  if (opt.rowwise) quantize_copy(q.rowwise, opt.format, Source{x.f32(), cols, false, false}, opt, opt.stream_id);
  if (opt.columnwise) {
    quantize_copy(q.columnwise, opt.format, Source{x.f32(), cols, true, opt.rht_columnwise}, opt,
                  opt.stream_id + 1);
  } else if (opt.columnwise_amax) {
    // Only the amax the columnwise copy of this x will need (opt.amax_given in a later call).
    q.columnwise.amax.f32()[0] = source_amax(Source{x.f32(), cols, true, opt.rht_columnwise}, cols, rows);
  }
  if (opt.columnwise) q.columnwise_rht = opt.rht_columnwise;  // a rowwise-only call leaves the flag alone
}

}  // namespace pl::cpu
