// The CPU quantizer's vectorized kernels (lib/backend/cpu/quantize_tile.cpp: blocks side by side in
// lanes of 16, branch-free twins of the numerics, Philox across lanes) against the plain per-element
// definition built from the shared numerics headers: every code byte, compact and swizzled scale byte,
// amax and scale_inv identical, for every format, with and without RHT and stochastic rounding (exact
// random bytes here, not just a neighbour), on 1, 2 and 3 threads. The shapes leave partial lane groups
// (copy rows or blocks per row not multiples of 16), and the input mixes BF16 values with FP32 values,
// zeros of both signs, NaN, subnormals and a chunk spanning 60 binades (RHT's non-FP32 paths).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/quantize.h"
#include "numerics/fp8.h"
#include "numerics/hadamard.h"
#include "numerics/nvfp4.h"
#include "numerics/philox.h"
#include "numerics/swizzle.h"
#include "matrix_util.h"
#include "op_test_util.h"
#include "quant_test_util.h"
#include "test_util.h"

namespace pl {
namespace {

using optest::cpu_ctx;
using qtest::host_bytes;
using test::Mat;

Mat lanes_input(int64_t rows, int64_t cols, uint32_t seed) {
  Mat x = test::random_bf16(rows, cols, seed, 1.0f, 5);
  const size_t n = x.v.size();
  x.v[3] = 0.0f;
  x.v[5] = -0.0f;
  x.v[n / 2] = std::nanf("");
  x.v[n / 3] = 1e-40f;                  // an FP32 subnormal
  x.v[n / 5] = 0.1f;                    // not a BF16 value
  x.v[n - 1] = 3.0e-18f;                // with its neighbours: a chunk spanning ~60 binades
  for (size_t i = 7 * n / 8; i < 7 * n / 8 + 40 && i < n; ++i) x.v[i] *= 1.0f + 0x1p-20f;  // FP32 values
  return x;
}

// Copy element (r, k): x[r][k], or xᵀ (k-th row of x) optionally RHT'd in 16-chunks along the copy row.
std::vector<float> copy_source(const Mat& x, bool columnwise, bool rht) {
  const int64_t R = columnwise ? x.cols : x.rows, C = columnwise ? x.rows : x.cols;
  std::vector<float> s(static_cast<size_t>(R * C));
  for (int64_t r = 0; r < R; ++r)
    for (int64_t k = 0; k < C; ++k) s[r * C + k] = columnwise ? x.v[k * x.cols + r] : x.v[r * x.cols + k];
  if (rht)
    for (size_t c = 0; c < s.size(); c += 16) num::rht16(&s[c], &s[c], num::kRhtSignMask);
  return s;
}

// Every byte of copy c against the per-element definition over its source s.
void expect_per_element(const QuantizedCopy& c, const std::vector<float>& s, const QuantizeOptions& o, uint32_t stream) {
  const int64_t R = c.rows, C = c.cols;
  float amax = 0.0f;
  for (float v : s) amax = std::fmax(amax, std::fabs(v));
  const bool per_tensor = o.format == QuantFormat::FP8_E4M3 || o.format == QuantFormat::FP8_E5M2;
  std::vector<uint8_t> data(c.data.bytes()), scales(per_tensor ? 0 : c.scales.bytes());
  if (per_tensor) {
    const bool e4 = o.format == QuantFormat::FP8_E4M3;
    const float scale = num::fp8_current_scale(amax, e4 ? num::kE4M3Max : num::kE5M2Max);
    for (int64_t i = 0; i < R * C; ++i) data[i] = e4 ? num::float_to_e4m3(s[i] * scale) : num::float_to_e5m2(s[i] * scale);
    EXPECT_EQ(num::float_bits(c.scale_inv.f32()[0]), num::float_bits(1.0f / scale));
  } else if (o.format == QuantFormat::MXFP8) {
    for (int64_t b = 0; b < R * C / 32; ++b) {
      scales[b] = num::mxfp8_block_scale(num::nvfp4_abs_max(&s[b * 32], 32));
      for (int i = 0; i < 32; ++i) data[b * 32 + i] = num::float_to_e4m3(s[b * 32 + i] * num::mxfp8_element_scale(scales[b]));
    }
  } else {
    const float s_enc = num::nvfp4_global_encode_scale(amax);
    for (int64_t b = 0; b < R * C / 16; ++b) {
      uint8_t code[16], rb[16];
      if (o.block_2d) {  // the 16x16 tile's amax (rows r0..r0+15 of block column b % nb)
        const int64_t nb = C / 16, r0 = b / nb / 16 * 16;
        float m = 0.0f;
        for (int64_t r = r0; r < r0 + 16; ++r) m = std::fmax(m, num::nvfp4_abs_max(&s[r * C + b % nb * 16], 16));
        scales[b] = num::nvfp4_block_scale(m, s_enc);
        const float enc = num::nvfp4_block_encode(scales[b], num::nvfp4_global_decode_scale(s_enc));
        for (int i = 0; i < 16; ++i) code[i] = num::nvfp4_encode(s[b * 16 + i], enc);
      } else if (o.stochastic) {
        num::sr_random_bytes16(o.seed, stream, o.counter, static_cast<uint64_t>(b), rb);
        num::nvfp4_quantize_block16_sr(&s[b * 16], s_enc, rb, &scales[b], code);
      } else {
        num::nvfp4_quantize_block16(&s[b * 16], s_enc, &scales[b], code);
      }
      for (int k = 0; k < 8; ++k) data[b * 8 + k] = num::pack_e2m1_pair(code[2 * k], code[2 * k + 1]);
    }
    EXPECT_EQ(num::float_bits(c.scale_inv.f32()[0]), num::float_bits(num::nvfp4_global_decode_scale(s_enc)));
  }
  if (o.format != QuantFormat::MXFP8) {
    EXPECT_EQ(num::float_bits(c.amax.f32()[0]), num::float_bits(amax)) << "amax";
  }
  EXPECT_EQ(host_bytes(c.data), data) << "codes";
  if (scales.empty()) return;
  EXPECT_EQ(host_bytes(c.scales), scales) << "compact scales";
  const int64_t nb = C / quant_block_size(o.format), pc = num::padded_scale_cols(nb);
  std::vector<uint8_t> swz(static_cast<size_t>(num::padded_scale_rows(R) * pc), 0);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t k = 0; k < nb; ++k) swz[num::swizzled_scale_offset(r, k, pc)] = scales[r * nb + k];
  EXPECT_EQ(host_bytes(c.scales_swizzled), swz) << "swizzled scales";
}

struct LaneCase {
  QuantFormat f;
  int64_t rows, cols;
  bool rowwise, columnwise, rht, sr, block_2d;
};

TEST(OpsQuantizeLanes, EveryByteEqualsThePerElementDefinitionOnEveryThreadCount) {
  const LaneCase cases[] = {
      {QuantFormat::NVFP4, 37, 80, true, false, false, false, false},   // 5 blocks per row
      {QuantFormat::NVFP4, 37, 80, true, false, false, true, false},
      {QuantFormat::NVFP4, 48, 88, false, true, false, false, false},   // 88 copy rows: 5 lane groups + 8
      {QuantFormat::NVFP4, 48, 88, false, true, true, false, false},
      {QuantFormat::NVFP4, 48, 88, false, true, true, true, false},
      {QuantFormat::NVFP4, 64, 400, true, true, true, true, false},     // 25 blocks per row: 16 + 9
      {QuantFormat::NVFP4, 48, 80, true, true, false, false, true},     // 16x16 tiles
      {QuantFormat::MXFP8, 37, 96, true, false, false, false, false},
      {QuantFormat::MXFP8, 64, 72, false, true, false, false, false},
      {QuantFormat::FP8_E4M3, 37, 72, true, true, false, false, false},
      {QuantFormat::FP8_E5M2, 37, 72, true, true, false, false, false},
  };
  for (const LaneCase& lc : cases) {
    Mat x = lanes_input(lc.rows, lc.cols, static_cast<uint32_t>(lc.rows * 7 + lc.cols));
    QuantizeOptions o;
    o.format = lc.f;
    o.rowwise = lc.rowwise;
    o.columnwise = lc.columnwise;
    o.rht_columnwise = lc.rht;
    o.stochastic = lc.sr;
    o.block_2d = lc.block_2d;
    o.seed = 0x123456789ABCull;
    o.stream_id = 5;
    o.counter = (uint64_t{3} << 32) | 11u;  // both halves of the counter
    for (int threads : {1, 2, 3}) {
      SCOPED_TRACE(std::string(quant_format_name(lc.f)) + " " + std::to_string(lc.rows) + "x" + std::to_string(lc.cols) +
                   (lc.rowwise ? " rowwise" : "") + (lc.columnwise ? " columnwise" : "") + (lc.rht ? " rht" : "") +
                   (lc.sr ? " sr" : "") + (lc.block_2d ? " 2d" : "") + ", threads " + std::to_string(threads));
      optest::ScopedThreads scoped(threads);
      std::vector<Buffer> owner;
      QuantizedTensor q = allocate_quantized(owner, Device::CPU, lc.f, lc.rows, lc.cols, lc.rowwise, lc.columnwise);
      quantize(cpu_ctx(true), q, x.t(), o);
      if (lc.rowwise) expect_per_element(q.rowwise, copy_source(x, false, false), o, o.stream_id);
      if (lc.columnwise) expect_per_element(q.columnwise, copy_source(x, true, lc.rht), o, o.stream_id + 1);
    }
  }
}

}  // namespace
}  // namespace pl
