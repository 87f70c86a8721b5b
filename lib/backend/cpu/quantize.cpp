// CPU quantize: whole-tensor schedules around the per-block kernels of quantize_tile.h (the shared
// numerics of lib/numerics/, vectorized over blocks). The amax pass and the quantize pass both read x
// through a Source view (quantize_common.h), so no scratch memory is needed beyond a per-thread tile.
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/quantize_common.h"
#include "backend/cpu/quantize_tile.h"
#include "numerics/delayed_scaling.h"
#include "numerics/swizzle.h"

namespace pl::cpu {
namespace {
int lanes_left(int64_t n, int64_t i) { return static_cast<int>(n - i < kLanes ? n - i : kLanes); }

// A columnwise copy's rows are x's columns: a thread takes a strip of kStrip copy rows and walks down x
// through it, block by block, so each row of x gives it 4 adjacent cache lines (one per lane group) at a
// time rather than one line per 1 KB stride.
constexpr int64_t kStrip = 4 * kLanes;

// max |v| ignoring NaN (fmaxf semantics, as nvte_compute_amax), over the whole copy. Without RHT the
// copy's values are x's (transposed or not), so one contiguous pass over x; with RHT the 16-chunks
// along the copy's rows, a group of kLanes copy rows at a time.
float source_amax(const Source& s, int64_t rows, int64_t cols) {
  float amax = 0.0f;
  if (!s.rht) {
    const int64_t n = rows * cols, chunk = 1 << 14;
#pragma omp parallel for reduction(max : amax) schedule(static)
    for (int64_t i = 0; i < n; i += chunk) {
      const float m = contiguous_amax(s.x + i, n - i < chunk ? n - i : chunk);
      amax = m > amax ? m : amax;
    }
    return amax;
  }
  const int64_t strips = (rows + kStrip - 1) / kStrip;
#pragma omp parallel for reduction(max : amax) schedule(static)
  for (int64_t t = 0; t < strips; ++t)
    for (int64_t b = 0; b < cols / 16; ++b)
      for (int64_t r0 = t * kStrip; r0 < rows && r0 < (t + 1) * kStrip; r0 += kLanes) {
        const float m = group_amax(s.x, make_group(s, r0, b, lanes_left(rows, r0), true, 16), true);
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
  for (int64_t r = 0; r < c.rows; ++r) {
    // swizzled_scale_offset(r, k, pc) = offset(r, 0) + (k / 4) * 512 + k % 4.
    uint8_t* row = out + num::swizzled_scale_offset(r, 0, pc);
    for (int64_t k = 0; k < sc; ++k) row[(k >> 2) * 512 + (k & 3)] = in[r * sc + k];
  }
}

// Runs f(group) over the copy's blocks of `elems` elements, threaded: a columnwise copy (transposed
// source) in groups of kLanes copy rows (its blocks' 16-float rows of x are contiguous) within strips
// of kStrip, a rowwise one kLanes consecutive blocks of a row at a time.
template <class F>
void for_each_group(const Source& s, int64_t rows, int64_t cols, int elems, const F& f) {
  const int64_t nb = cols / elems;
  if (s.transposed) {
    const int64_t strips = (rows + kStrip - 1) / kStrip;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < strips; ++t)
      for (int64_t b = 0; b < nb; ++b)
        for (int64_t r0 = t * kStrip; r0 < rows && r0 < (t + 1) * kStrip; r0 += kLanes)
          f(make_group(s, r0, b, lanes_left(rows, r0), true, elems));
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t b = 0; b < nb; b += kLanes) f(make_group(s, r, b, lanes_left(nb, b), false, elems));
  }
}

// ---- NVFP4 ---------------------------------------------------------------------------------------

void quantize_nvfp4_copy(const QuantizedCopy& c, const Source& src, const QuantizeOptions& opt, uint32_t stream) {
  const int64_t R = c.rows, C = c.cols, nb = C / 16;
  const float amax = opt.amax_given ? c.amax.f32()[0] : source_amax(src, R, C);
  Nvfp4Params p;
  p.s_enc = num::nvfp4_global_encode_scale(amax);
  p.s_dec = num::nvfp4_global_decode_scale(p.s_enc);
  p.mult = num::nvfp4_block_scale_multiplier(p.s_enc);
  p.rht = src.rht;
  p.cols = C;
  uint8_t* data = c.data.u8();
  uint8_t* scales = c.scales.u8();
  if (opt.block_2d) {
    // One scale per 16x16 tile (tile amax over 16 rows), written to all 16 rows (TE #2298); the
    // codes then use the block encode scale of their tile. Weights: RN, no RHT.
    p.tile_2d = true;
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t tr = 0; tr < R / 16; ++tr)
      for (int64_t b = 0; b < nb; ++b) nvfp4_group(src.x, make_group(src, tr * 16, b, 16, true, 16), p, data, scales);
  } else {
    // 1x16 blocks: scale and codes of a block in one pass over its 16 source values.
    p.stochastic = opt.stochastic;
    p.seed = opt.seed;
    p.counter = opt.counter;
    p.stream = stream;
    for_each_group(src, R, C, 16, [&](const BlockGroup& g) { nvfp4_group(src.x, g, p, data, scales); });
  }
  c.amax.f32()[0] = amax;
  c.scale_inv.f32()[0] = p.s_dec;
  swizzle_scales(c);
}

// ---- MXFP8 ---------------------------------------------------------------------------------------

void quantize_mxfp8_copy(const QuantizedCopy& c, const Source& src, const QuantizeOptions& opt) {
  const int64_t R = c.rows, C = c.cols;
  uint8_t* data = c.data.u8();
  uint8_t* scales = c.scales.u8();
  for_each_group(src, R, C, 32, [&](const BlockGroup& g) { mxfp8_group(src.x, g, C, data, scales); });
  if (!opt.amax_given) c.amax.f32()[0] = source_amax(src, R, C);
  c.scale_inv.f32()[0] = 1.0f;
  swizzle_scales(c);
}

// ---- FP8 per-tensor (current scaling) ------------------------------------------------------------

void quantize_fp8_copy(const QuantizedCopy& c, const Source& src, QuantFormat f, const QuantizeOptions& opt) {
  const int64_t R = c.rows, C = c.cols;
  const bool e4m3 = f == QuantFormat::FP8_E4M3;
  const float amax = opt.amax_given ? c.amax.f32()[0] : source_amax(src, R, C);
  // Delayed scaling: the scale its history gave (opt.scale); current scaling: from this amax.
  const float scale = opt.scale.data != nullptr ? opt.scale.f32()[0]
                                             : num::fp8_current_scale(amax, e4m3 ? num::kE4M3Max : num::kE5M2Max);
  uint8_t* data = c.data.u8();
  const int64_t strips = (R + kLanes - 1) / kLanes;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < strips; ++t) fp8_rows(src, t * kLanes, lanes_left(R, t * kLanes), C, scale, e4m3, data);
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
  // Delayed scaling's record of this step's amax (the copies' amaxes are all max |x| for FP8 per tensor).
  if (opt.amax_record.data != nullptr && !opt.amax_given) {
    const QuantizedCopy& c = opt.rowwise ? q.rowwise : q.columnwise;
    if (opt.rowwise || opt.columnwise || opt.columnwise_amax) opt.amax_record.f32()[0] = c.amax.f32()[0];
  }
}

void delayed_scaling_update(const OpContext&, const Tensor& history, const Tensor& scale,
                            const DelayedScalingRule& rule) {
  const int64_t len = history.dim(0), n = history.dim(1);
  float* h = history.f32();
  float* s = scale.f32();
  for (int64_t j = 0; j < n; ++j)
    num::delayed_scaling_update_one(h, len, n, j, s + j, rule.most_recent,
                                    j < rule.num_forward ? rule.forward_scaled_max : rule.backward_scaled_max);
}

}  // namespace pl::cpu
