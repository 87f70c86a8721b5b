// CPU quantizers: whole-tensor schedules around the shared per-block numerics (lib/numerics/).
//
// A copy is described by a "source" view of x: rowwise reads x[r][c]; columnwise reads xᵀ, i.e.
// x[c][r], optionally through the 16-point RHT along the copy's rows (chunks of 16 consecutive
// tokens, aligned with the NVFP4 blocks). Nothing is materialised: the amax pass and the quantize
// pass both read through the view, so no scratch memory is needed.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/check.h"
#include "backend/cpu/cpu_ops.h"
#include "core/error.h"
#include "numerics/fp4.h"
#include "numerics/fp8.h"
#include "numerics/hadamard.h"
#include "numerics/nvfp4.h"
#include "numerics/philox.h"
#include "numerics/swizzle.h"

namespace pl::cpu {

namespace {

// Reads 16 consecutive source elements of copy row r starting at copy column c0.
struct Source {
  const float* x;
  int64_t x_cols;   // row stride of x
  bool transposed;  // copy = xᵀ
  bool rht;         // copy = RHT(xᵀ) along its rows
  void load16(int64_t r, int64_t c0, float out[16]) const {
    if (!transposed) {
      std::memcpy(out, x + r * x_cols + c0, 16 * sizeof(float));
      return;
    }
    float col[16];
    for (int i = 0; i < 16; ++i) col[i] = x[(c0 + i) * x_cols + r];
    if (rht)
      num::rht16(col, out, num::kRhtSignMask);
    else
      std::memcpy(out, col, sizeof col);
  }
  float at(int64_t r, int64_t c) const { return transposed ? x[c * x_cols + r] : x[r * x_cols + c]; }
};

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
    PL_CHECK(R % 16 == 0, "nvfp4 16x16 blocks: {} rows is not a multiple of 16", R);
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

// Dequantized value of element (r, k) of a copy: code value times its block scale, without the
// NVFP4 global scale (which the GEMM applies through alpha).
float block_value(const QuantizedCopy& c, QuantFormat f, int64_t r, int64_t k) {
  switch (f) {
    case QuantFormat::NVFP4: {
      const uint8_t byte = c.data.u8()[r * (c.cols / 2) + k / 2];
      const uint8_t code = (k & 1) ? (byte >> 4) : (byte & 0xF);
      return num::e2m1_to_float(code) * num::e4m3_to_float(c.scales.u8()[r * (c.cols / 16) + k / 16]);
    }
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
float dequantized_value(const QuantizedCopy& c, int64_t r, int64_t k) {
  switch (c.format) {
    case QuantFormat::NVFP4: {
      const uint8_t byte = c.data.u8()[r * (c.cols / 2) + k / 2];
      const uint8_t code = (k & 1) ? (byte >> 4) : (byte & 0xF);
      return num::e2m1_to_float(code) *
             num::nvfp4_dequant_factor(c.scales.u8()[r * (c.cols / 16) + k / 16], c.amax.f32()[0]);
    }
    case QuantFormat::MXFP8: return block_value(c, c.format, r, k);
    default: return block_value(c, c.format, r, k) * c.scale_inv.f32()[0];
  }
}

// |code| of element (r, k), and the largest magnitude code of the format (±6, ±448, ±57344).
uint8_t code_magnitude(const QuantizedCopy& c, int64_t r, int64_t k) {
  if (c.format == QuantFormat::NVFP4) {
    const uint8_t byte = c.data.u8()[r * (c.cols / 2) + k / 2];
    return ((k & 1) ? (byte >> 4) : byte) & 0x7;
  }
  return c.data.u8()[r * c.cols + k] & 0x7F;
}
uint8_t max_code_magnitude(QuantFormat f) {
  return f == QuantFormat::NVFP4 ? 0x7 : (f == QuantFormat::FP8_E5M2 ? 0x7B : 0x7E);
}

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

void check_copy(const char* op, const QuantizedCopy& c, QuantFormat f) {
  check_cpu(op, "codes", c.data, DType::U8, 2);
  PL_CHECK(c.format == f, "{}: the copy holds {} codes, not {}", op, quant_format_name(c.format), quant_format_name(f));
  PL_CHECK(c.rows > 0 && c.cols % quant_block_size(f) == 0, "{}: copy [{}, {}] is not a valid {} copy", op, c.rows,
           c.cols, quant_format_name(f));
}

}  // namespace

void quantize(const OpContext& ctx, QuantizedTensor& q, const Tensor& x, const QuantizeOptions& opt) {
  (void)ctx;
  constexpr const char* op = "quantize";
  check_cpu(op, "x", x, DType::F32, 2);
  const int64_t rows = x.dim(0), cols = x.dim(1);
  PL_CHECK(opt.format == q.format, "{}: options ask for {} but the tensor was allocated for {}", op,
           quant_format_name(opt.format), quant_format_name(q.format));
  const bool nvfp4 = opt.format == QuantFormat::NVFP4;
  PL_CHECK(nvfp4 || (!opt.block_2d && !opt.rht_columnwise && !opt.stochastic),
           "{}: 16x16 blocks, RHT and stochastic rounding are NVFP4 options, not {}", op, quant_format_name(opt.format));
  PL_CHECK(!(opt.block_2d && opt.rht_columnwise), "{}: RHT is not applied to 16x16-block (weight) tensors", op);
  if (opt.rowwise) {
    PL_CHECK(q.has_rowwise && q.rowwise.rows == rows && q.rowwise.cols == cols,
             "{}: x {} does not match the allocated rowwise copy [{}, {}]", op, x.shape_str(), q.rowwise.rows,
             q.rowwise.cols);
    quantize_copy(q.rowwise, opt.format, Source{x.f32(), cols, false, false}, opt, opt.stream_id);
  }
  if (opt.columnwise) {
    PL_CHECK(q.has_columnwise && q.columnwise.rows == cols && q.columnwise.cols == rows,
             "{}: x {} does not match the allocated columnwise copy [{}, {}] (the transpose)", op, x.shape_str(),
             q.columnwise.rows, q.columnwise.cols);
    quantize_copy(q.columnwise, opt.format, Source{x.f32(), cols, true, opt.rht_columnwise}, opt,
                  opt.stream_id + 1);
  } else if (opt.columnwise_amax) {
    // Only the amax the columnwise copy of this x will need (opt.amax_given in a later call).
    PL_CHECK(q.has_columnwise && q.columnwise.rows == cols && q.columnwise.cols == rows,
             "{}: x {} does not match the allocated columnwise copy [{}, {}] (the transpose)", op, x.shape_str(),
             q.columnwise.rows, q.columnwise.cols);
    PL_CHECK(!opt.rht_columnwise || rows % 16 == 0, "{}: RHT needs the row count of x {} to be a multiple of 16", op,
             x.shape_str());
    q.columnwise.amax.f32()[0] = source_amax(Source{x.f32(), cols, true, opt.rht_columnwise}, cols, rows);
  }
  if (opt.columnwise) q.columnwise_rht = opt.rht_columnwise;  // a rowwise-only call leaves the flag alone
}

void dequantize(const OpContext& ctx, const Tensor& out, const QuantizedCopy& c, QuantFormat f) {
  (void)ctx;
  check_copy("dequantize", c, f);
  check_cpu("dequantize", "out", out, DType::F32, 2);
  PL_CHECK(out.dim(0) == c.rows && out.dim(1) == c.cols, "dequantize: out {} does not match the copy [{}, {}]",
           out.shape_str(), c.rows, c.cols);
  float* o = out.f32();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t k = 0; k < c.cols; ++k) o[r * c.cols + k] = dequantized_value(c, r, k);
}

void quantized_gemm(const OpContext& ctx, const Tensor& y, const QuantizedCopy& a, const QuantizedCopy& b,
                    QuantFormat f, bool accumulate, const Tensor& scratch_a, const Tensor& scratch_b,
                    bool fast_accumulation) {
  (void)fast_accumulation;  // a cuBLASLt FP8 kernel option: the CPU always accumulates in FP32
  constexpr const char* op = "quantized_gemm";
  check_copy(op, a, f);
  check_copy(op, b, b.format);
  const bool fp8 = [](QuantFormat x) { return x == QuantFormat::FP8_E4M3 || x == QuantFormat::FP8_E5M2; }(f);
  PL_CHECK(a.format == b.format || (fp8 && (b.format == QuantFormat::FP8_E4M3 || b.format == QuantFormat::FP8_E5M2)),
           "{}: cannot multiply {} by {}", op, quant_format_name(a.format), quant_format_name(b.format));
  PL_CHECK(!(a.format == QuantFormat::FP8_E5M2 && b.format == QuantFormat::FP8_E5M2),
           "{}: E5M2 x E5M2 is not supported (cuBLASLt)", op);
  PL_CHECK(a.cols == b.cols, "{}: A [{}, {}] and B [{}, {}] disagree on the reduction dim", op, a.rows, a.cols,
           b.rows, b.cols);
  check_cpu(op, "y", y, DType::F32, 2);
  PL_CHECK(y.dim(0) == a.rows && y.dim(1) == b.rows, "{}: y {} is not [{}, {}]", op, y.shape_str(), a.rows, b.rows);
  PL_CHECK(scratch_a.numel() >= a.rows * a.cols && scratch_b.numel() >= b.rows * b.cols,
           "{}: scratch {} / {} too small for A [{}, {}] and B [{}, {}]", op, scratch_a.shape_str(),
           scratch_b.shape_str(), a.rows, a.cols, b.rows, b.cols);
  // Exact block-scaled values (E2M1·E4M3 and E4M3·UE8M0 products are exact in FP32).
  const Tensor da = scratch_a.view({scratch_a.numel()}).rows(0, a.rows * a.cols).view({a.rows, a.cols});
  const Tensor db = scratch_b.view({scratch_b.numel()}).rows(0, b.rows * b.cols).view({b.rows, b.cols});
  block_values(a, da.f32());
  block_values(b, db.f32());
  float alpha = 1.0f;
  if (f == QuantFormat::NVFP4) alpha = num::nvfp4_gemm_alpha(a.amax.f32()[0], b.amax.f32()[0]);
  if (fp8) alpha = a.scale_inv.f32()[0] * b.scale_inv.f32()[0];
  gemm_nt(ctx, y, da, db, alpha, accumulate);
}

QuantStats quant_stats(const OpContext& ctx, const QuantizedCopy& c, QuantFormat f, const Tensor& ref) {
  (void)ctx;
  check_copy("quant_stats", c, f);
  check_cpu("quant_stats", "reference", ref, DType::F32, 2);
  PL_CHECK(ref.dim(0) == c.rows && ref.dim(1) == c.cols, "quant_stats: reference {} does not match the copy [{}, {}]",
           ref.shape_str(), c.rows, c.cols);
  const int64_t blk = quant_block_size(f);
  const uint8_t max_mag = max_code_magnitude(f);
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
        saturated += code_magnitude(c, r, k) == max_mag;
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

void columnwise_source(const OpContext& ctx, const Tensor& out, const Tensor& x, bool rht) {
  (void)ctx;
  check_cpu("columnwise_source", "x", x, DType::F32, 2);
  check_cpu("columnwise_source", "out", out, DType::F32, 2);
  const int64_t rows = x.dim(0), cols = x.dim(1);
  PL_CHECK(out.dim(0) == cols && out.dim(1) == rows, "columnwise_source: out {} is not the transpose of x {}",
           out.shape_str(), x.shape_str());
  PL_CHECK(!rht || rows % 16 == 0, "columnwise_source: RHT needs rows % 16 == 0, x is {}", x.shape_str());
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
