// The quantization op (backend/quantize.h) on every backend over the shared quantize cases
// (quant_test_util.h; Cpu/ and Cuda/Quantize.*): on the CPU each copy against an independent per-block
// loop over the shared numerics, on the GPU every buffer of every copy byte-exact with the CPU; the
// amaxes computed once and reused, on both. CPU only (OpsQuantize.*): the copies' relations (2D, RHT,
// transpose), stochastic rounding as a stream, errors. GPU only (Cuda*, skipped without a device): the
// production shapes and the GPU's errors. dequantize: test_dequantize.cpp; quant_stats and
// columnwise_source: test_quant_stats.cpp (the same cases).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/quantize.h"
#include "core/error.h"
#include "numerics/bf16.h"
#include "numerics/fp4.h"
#include "numerics/fp8.h"
#include "numerics/hadamard.h"
#include "numerics/nvfp4.h"
#include "numerics/swizzle.h"
#include "matrix_util.h"
#include "op_test_util.h"
#include <fmt/format.h>

#include "quant_test_util.h"
#include "test_util.h"

namespace pl {
namespace {

using optest::cpu_ctx;
using test::fast_bf16;
using test::Mat;
using test::transpose;

// Gaussian BF16 values with a few outliers, as activations look.
Mat random_bf16(int64_t r, int64_t c, uint32_t seed, float scale = 1.0f) { return test::random_bf16(r, c, seed, scale, 5); }

uint8_t code_at(const QuantizedCopy& c, int64_t r, int64_t k) {
  const uint8_t byte = c.data.u8()[r * (c.cols / 2) + k / 2];
  return (k & 1) ? (byte >> 4) : (byte & 0xF);
}

Mat dequant(const QuantizedCopy& c) {
  Mat out(c.rows, c.cols);
  dequantize(cpu_ctx(true), out.t(), c, c.format);
  return out;
}

// Independent reference of 1x16 RN quantization: tensor amax, then block by block.
void expect_nvfp4_1x16(const QuantizedCopy& c, const Mat& src) {
  float amax = 0.0f;
  for (float x : src.v) amax = std::fmax(amax, std::fabs(x));
  ASSERT_EQ(c.amax.f32()[0], amax);
  const float s_enc = num::nvfp4_global_encode_scale(amax), s_dec = num::nvfp4_global_decode_scale(s_enc);
  for (int64_t r = 0; r < src.rows; ++r)
    for (int64_t b = 0; b < src.cols / 16; ++b) {
      float bamax = 0.0f;
      for (int k = 0; k < 16; ++k) bamax = std::fmax(bamax, std::fabs(src.v[r * src.cols + b * 16 + k]));
      const uint8_t scale = num::nvfp4_block_scale(bamax, s_enc);
      ASSERT_EQ(c.scales.u8()[r * (src.cols / 16) + b], scale) << r << "," << b;
      const float enc = num::nvfp4_block_encode(scale, s_dec);
      for (int k = 0; k < 16; ++k)
        ASSERT_EQ(code_at(c, r, b * 16 + k), num::float_to_e2m1(src.v[r * src.cols + b * 16 + k] * enc))
            << r << "," << b * 16 + k;
    }
}

TEST(OpsQuantize, Nvfp4ColumnwiseIsTheQuantizedTransposeAndRhtIsAppliedAlongItsRows) {
  std::vector<Buffer> owner;
  Mat x = random_bf16(64, 32, 2);
  QuantizedTensor q = allocate_quantized(owner, Device::CPU, QuantFormat::NVFP4, 64, 32, false, true);
  QuantizeOptions o;
  o.rowwise = false;
  o.columnwise = true;
  quantize(cpu_ctx(true), q, x.t(), o);
  expect_nvfp4_1x16(q.columnwise, transpose(x));

  o.rht_columnwise = true;
  quantize(cpu_ctx(true), q, x.t(), o);
  EXPECT_TRUE(q.columnwise_rht);
  Mat rht = transpose(x);  // [32, 64]: RHT each 16-chunk of each row
  for (int64_t r = 0; r < rht.rows; ++r)
    for (int64_t c = 0; c < rht.cols; c += 16) {
      float in[16];
      std::copy_n(&rht.v[r * rht.cols + c], 16, in);
      num::rht16(in, &rht.v[r * rht.cols + c], num::kRhtSignMask);
    }
  expect_nvfp4_1x16(q.columnwise, rht);
  // columnwise_source materialises the same values.
  Mat src(32, 64);
  columnwise_source(cpu_ctx(true), src.t(), x.t(), true);
  EXPECT_EQ(src.v, rht.v);
}

TEST(OpsQuantize, Nvfp4TwoDimensionalBlocksGiveIdenticalValuesInBothCopies) {
  std::vector<Buffer> owner;
  Mat w = random_bf16(48, 64, 3, 0.02f);
  QuantizedTensor q = allocate_quantized(owner, Device::CPU, QuantFormat::NVFP4, 48, 64, true, true);
  QuantizeOptions o;
  o.columnwise = true;
  o.block_2d = true;
  quantize(cpu_ctx(true), q, w.t(), o);
  EXPECT_EQ(q.rowwise.amax.f32()[0], q.columnwise.amax.f32()[0]);
  const Mat row = dequant(q.rowwise), col = dequant(q.columnwise);
  EXPECT_EQ(transpose(row).v, col.v);
  // One scale per 16x16 tile, repeated on its 16 rows.
  for (int64_t r = 0; r < 48; ++r)
    for (int64_t b = 0; b < 4; ++b) ASSERT_EQ(q.rowwise.scales.u8()[r * 4 + b], q.rowwise.scales.u8()[(r / 16 * 16) * 4 + b]);
  // 1x16 blocks would in general not be transposes of each other.
  QuantizedTensor q1 = allocate_quantized(owner, Device::CPU, QuantFormat::NVFP4, 48, 64, true, true);
  o.block_2d = false;
  quantize(cpu_ctx(true), q1, w.t(), o);
  EXPECT_NE(transpose(dequant(q1.rowwise)).v, dequant(q1.columnwise).v);
}

TEST(OpsQuantize, StochasticRoundingIsAReproducibleUnbiasedStream) {
  std::vector<Buffer> owner;
  Mat x = random_bf16(16, 64, 4);
  QuantizedTensor a = allocate_quantized(owner, Device::CPU, QuantFormat::NVFP4, 16, 64, true, false);
  QuantizedTensor b = allocate_quantized(owner, Device::CPU, QuantFormat::NVFP4, 16, 64, true, false);
  QuantizeOptions o;
  o.stochastic = true;
  o.seed = 42;
  o.counter = 7;
  quantize(cpu_ctx(true), a, x.t(), o);
  quantize(cpu_ctx(true), b, x.t(), o);
  EXPECT_EQ(dequant(a.rowwise).v, dequant(b.rowwise).v) << "same seed, stream and counter: same bits";
  o.counter = 8;
  quantize(cpu_ctx(true), b, x.t(), o);
  EXPECT_NE(dequant(a.rowwise).v, dequant(b.rowwise).v) << "another counter draws other bits";
  // The mean over many counters approaches x; round-to-nearest has a fixed error.
  std::vector<double> mean(x.v.size(), 0.0);
  const int draws = 256;
  for (int d = 0; d < draws; ++d) {
    o.counter = static_cast<uint64_t>(100 + d);
    quantize(cpu_ctx(true), b, x.t(), o);
    const Mat m = dequant(b.rowwise);
    for (size_t i = 0; i < mean.size(); ++i) mean[i] += m.v[i] / draws;
  }
  QuantizedTensor rn = allocate_quantized(owner, Device::CPU, QuantFormat::NVFP4, 16, 64, true, false);
  quantize(cpu_ctx(true), rn, x.t(), QuantizeOptions{});
  const Mat r = dequant(rn.rowwise);
  double err_sr = 0.0, err_rn = 0.0;
  for (size_t i = 0; i < mean.size(); ++i) {
    err_sr += (mean[i] - x.v[i]) * (mean[i] - x.v[i]);
    err_rn += (r.v[i] - x.v[i]) * (r.v[i] - x.v[i]);
  }
  EXPECT_LT(err_sr, 0.1 * err_rn) << "mean of SR draws should be far closer to x than RN";
}

TEST(OpsQuantize, ShapesThatBreakBlockRulesAreOneLineErrors) {
  std::vector<Buffer> owner;
  test::expect_one_line_error([&] { allocate_quantized(owner, Device::CPU, QuantFormat::NVFP4, 16, 24, true, false); },
                              {"nvfp4", "24", "16"});
  test::expect_one_line_error([&] { allocate_quantized(owner, Device::CPU, QuantFormat::MXFP8, 16, 48, true, false); },
                              {"mxfp8", "48", "32"});
  QuantizedTensor q = allocate_quantized(owner, Device::CPU, QuantFormat::NVFP4, 16, 32, true, false);
  Mat x(16, 48);
  test::expect_one_line_error([&] { quantize(cpu_ctx(true), q, x.t(), QuantizeOptions{}); }, {"quantize", "[16, 48]"});
  QuantizeOptions bad;
  bad.format = QuantFormat::MXFP8;
  test::expect_one_line_error([&] { quantize(cpu_ctx(true), q, Mat(16, 32).t(), bad); }, {"mxfp8", "nvfp4"});
}

// cuBLASLt's FP8 GEMMs read scale_inv through A/B_SCALE_POINTER and, on sm_90 (cuBLASLt 13.1, the first
// H200 run), refuse one that is not 16-byte aligned: every copy's scale_inv, amax and spare slots sit on
// 16-byte boundaries of their allocation, apart from each other, for every format and both copies.
TEST(OpsQuantize, ScaleSlotsAreSixteenByteAlignedAndDistinct) {
  std::vector<Buffer> owner;
  for (QuantFormat f : {QuantFormat::NVFP4, QuantFormat::MXFP8, QuantFormat::FP8_E4M3, QuantFormat::FP8_E5M2}) {
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{32, 64}, {96, 160}, {160, 320}}) {
      const QuantizedTensor q = allocate_quantized(owner, Device::CPU, f, rows, cols, true, true);
      for (const QuantizedCopy* c : {&q.rowwise, &q.columnwise}) {
        SCOPED_TRACE(std::string(quant_format_name(f)) + " [" + std::to_string(c->rows) + ", " +
                     std::to_string(c->cols) + "]");
        const auto addr = [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data); };
        EXPECT_EQ(addr(c->scale_inv) % 16, 0u);
        EXPECT_EQ(addr(c->amax) % 16, 0u);
        EXPECT_EQ(addr(c->spare) % 16, 0u);
        EXPECT_GE(addr(c->amax), addr(c->scale_inv) + 4);
        EXPECT_GE(addr(c->spare), addr(c->amax) + 4);
        // The tail lies after the codes (and scales), inside the copy's allocation.
        EXPECT_GE(addr(c->scale_inv), addr(c->data) + static_cast<uintptr_t>(c->data.bytes()));
      }
    }
  }
}

// ---- the shared quantize cases on every backend (Cpu/ and Cuda/Quantize.*) ----------------------------
// Over the shared quantize cases (quant_test_util.h; test_dequantize.cpp and test_quant_stats.cpp run
// dequantize, quant_stats and columnwise_source on the same cases). On the CPU each copy is checked
// against a per-block reference; on the GPU each case quantizes one input on the CPU (host F32
// tensor) and on the GPU (BF16 device tensor, or F32 where stated) and compares, byte for byte, every
// buffer of every copy: codes, compact scales, swizzled scales (the GPU buffers are filled with junk
// first, so a padding byte left unwritten shows), amax and scale_inv.
namespace backends {

using namespace qtest;

// ---- the per-block reference of one copy (the CPU side of the shared cases) ---------------------------

// |y| clamped to 6 lies between two E2M1 magnitudes lo <= |y| <= hi.
std::pair<float, float> e2m1_neighbours(float y) {
  static const float grid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float a = std::fmin(std::fabs(y), 6.0f);
  int i = 0;
  while (i < 7 && grid[i + 1] <= a) ++i;
  return {grid[i], grid[i] == a ? a : grid[i + 1]};
}

// A copy against an independent loop over its source src [c.rows, c.cols] (x, or xᵀ / RHT(xᵀ)):
// amax = max |src| (NaN ignored, as fmax does); NVFP4 block (or 16x16 tile) scales from the block
// amax and codes from the block encode scale, RN, or with SR one of the two E2M1 neighbours of the
// scaled value; MXFP8 UE8M0 scales per 32 and E4M3 codes; FP8 current scaling; swizzled scales
// every compact scale at its §6.2 offset and zeros elsewhere.
void expect_block_reference(const QuantizedCopy& c, const std::vector<float>& src, const QuantizeOptions& o,
                            const std::string& what) {
  SCOPED_TRACE(what);
  const int64_t R = c.rows, C = c.cols;
  float amax = 0.0f;
  for (float v : src) amax = std::fmax(amax, std::fabs(v));
  if (c.format != QuantFormat::MXFP8) {
    ASSERT_EQ(num::float_bits(c.amax.f32()[0]), num::float_bits(amax)) << "amax";
  }
  auto at = [&](int64_t r, int64_t k) { return src[static_cast<size_t>(r * C + k)]; };
  if (c.format == QuantFormat::FP8_E4M3 || c.format == QuantFormat::FP8_E5M2) {
    const bool e4 = c.format == QuantFormat::FP8_E4M3;
    const float scale = num::fp8_current_scale(amax, e4 ? num::kE4M3Max : num::kE5M2Max);
    ASSERT_EQ(num::float_bits(c.scale_inv.f32()[0]), num::float_bits(1.0f / scale)) << "scale_inv";
    for (int64_t r = 0; r < R; ++r)
      for (int64_t k = 0; k < C; ++k)
        ASSERT_EQ(c.data.u8()[r * C + k], e4 ? num::float_to_e4m3(at(r, k) * scale) : num::float_to_e5m2(at(r, k) * scale))
            << r << "," << k;
    return;
  }
  const int64_t blk = quant_block_size(c.format), nb = C / blk;
  if (c.format == QuantFormat::MXFP8) {
    for (int64_t r = 0; r < R; ++r)
      for (int64_t b = 0; b < nb; ++b) {
        float bamax = 0.0f;
        for (int64_t k = b * 32; k < b * 32 + 32; ++k) bamax = std::fmax(bamax, std::fabs(at(r, k)));
        const uint8_t e = num::mxfp8_block_scale(bamax);
        ASSERT_EQ(c.scales.u8()[r * nb + b], e) << r << "," << b;
        for (int64_t k = b * 32; k < b * 32 + 32; ++k)
          ASSERT_EQ(c.data.u8()[r * C + k], num::float_to_e4m3(at(r, k) * num::mxfp8_element_scale(e))) << r << "," << k;
      }
  } else {
    const float s_enc = num::nvfp4_global_encode_scale(amax), s_dec = num::nvfp4_global_decode_scale(s_enc);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t b = 0; b < nb; ++b) {
        float bamax = 0.0f;
        const int64_t r0 = o.block_2d ? r / 16 * 16 : r, r1 = o.block_2d ? std::min(r0 + 16, R) : r + 1;
        for (int64_t rr = r0; rr < r1; ++rr)
          for (int64_t k = b * 16; k < b * 16 + 16; ++k) bamax = std::fmax(bamax, std::fabs(at(rr, k)));
        const uint8_t scale = num::nvfp4_block_scale(bamax, s_enc);
        ASSERT_EQ(c.scales.u8()[r * nb + b], scale) << r << "," << b;
        const float enc = num::nvfp4_block_encode(scale, s_dec);
        for (int64_t k = b * 16; k < b * 16 + 16; ++k) {
          const uint8_t byte = c.data.u8()[r * (C / 2) + k / 2];
          const uint8_t code = (k & 1) ? (byte >> 4) : (byte & 0xF);
          const float y = at(r, k) * enc;
          if (!o.stochastic || o.block_2d) {  // SR is ignored for 16x16 tiles
            ASSERT_EQ(code, num::float_to_e2m1(y)) << r << "," << k;
          } else if (std::isfinite(y)) {
            const float q = ref_e2m1(code);
            const auto [lo, hi] = e2m1_neighbours(y);
            ASSERT_TRUE((std::fabs(q) == lo || std::fabs(q) == hi) && (q == 0.0f || std::signbit(q) == std::signbit(y)))
                << r << "," << k << ": code " << int{code} << " (" << q << ") for " << y;
          }
        }
      }
  }
  const int64_t pc = num::padded_scale_cols(nb);
  std::vector<uint8_t> swz(static_cast<size_t>(num::padded_scale_rows(R) * pc), 0);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t k = 0; k < nb; ++k) swz[num::swizzled_scale_offset(r, k, pc)] = c.scales.u8()[r * nb + k];
  EXPECT_EQ(host_bytes(c.scales_swizzled), swz) << "swizzled scales";
}

// ---- the shared cases on every backend -----------------------------------------------------------------
// CPU: each copy against the per-block reference of its source (x, or the independent xᵀ / RHT(xᵀ)).
// GPU: every buffer of every copy byte-exact with the CPU's.
void check_quantize(QuantCase& qc, Device d) {
  SCOPED_TRACE(qc.name());
  Quantized cpu;
  quantize_case(cpu, qc, Device::CPU);
  if (d == Device::CPU) {
    EXPECT_EQ(cpu.q.columnwise_rht, qc.o.columnwise && qc.o.rht_columnwise);
    if (qc.o.rowwise) expect_block_reference(cpu.q.rowwise, qc.x.v, qc.o, "rowwise");
    if (qc.o.columnwise)
      expect_block_reference(cpu.q.columnwise, reference_columnwise_source(qc.x, qc.o.rht_columnwise).v, qc.o,
                             "columnwise");
    return;
  }
  Quantized gpu;
  quantize_case(gpu, qc, Device::CUDA);
  EXPECT_EQ(gpu.q.columnwise_rht, cpu.q.columnwise_rht);
  if (qc.o.rowwise) expect_same_copy(cpu.q.rowwise, gpu.q.rowwise, "rowwise");
  if (qc.o.columnwise) expect_same_copy(cpu.q.columnwise, gpu.q.columnwise, "columnwise");
}

class Quantize : public optest::OnBackend {
 protected:
  void check_group(const std::string& group) {
    std::vector<QuantCase> cases = quant_cases(group);
    ASSERT_FALSE(cases.empty()) << group;
    for (QuantCase& qc : cases) check_quantize(qc, GetParam());
  }
};

// ---- NVFP4 --------------------------------------------------------------------------------------------

// Full 64x64 tiles; partial tiles with scale padding in rows and columns; fewer rows than a tile.
TEST_P(Quantize, Nvfp4Rowwise1x16RoundToNearest) { check_group("nvfp4 rowwise"); }

// Both copies; both halves of the counter matter; another counter, other bits (on the GPU: the CPU's).
TEST_P(Quantize, Nvfp4Stochastic1x16InBothCopies) { check_group("nvfp4 sr"); }

// Stochastic rounding is asked for and ignored for 16x16 tiles.
TEST_P(Quantize, Nvfp4TwoDimensionalTiles) { check_group("nvfp4 2d"); }

// Columnwise alone, both copies from one pass, x's column count free (columnwise alone).
TEST_P(Quantize, Nvfp4ColumnwiseWithAndWithoutRht) { check_group("nvfp4 columnwise"); }

TEST_P(Quantize, Nvfp4SpecialValuesF32InputAndZeroTensors) { check_group("nvfp4 special"); }

// ---- MXFP8 and FP8 ------------------------------------------------------------------------------------

TEST_P(Quantize, Mxfp8BothCopies) { check_group("mxfp8"); }

TEST_P(Quantize, Fp8E4M3AndE5M2BothCopies) { check_group("fp8"); }

// ---- amaxes computed once, reused (QuantizeOptions::columnwise_amax / amax_given) -----------------

// The bytes of a tensor on either backend; every byte of it set to `b`; two copies' buffers equal.
std::vector<uint8_t> bytes_on(const Tensor& t) { return t.device == Device::CUDA ? device_bytes(t) : host_bytes(t); }
void fill_bytes(const Tensor& t, uint8_t b) {
  std::vector<uint8_t> v(t.bytes(), b);
  if (t.device == Device::CUDA)
    copy_from_host(t, v.data());
  else
    std::copy(v.begin(), v.end(), static_cast<uint8_t*>(t.data));
}
void expect_same_copy_on(const QuantizedCopy& a, const QuantizedCopy& b, const std::string& what) {
  for (auto [ta, tb, name] : {std::tuple<const Tensor*, const Tensor*, const char*>{&a.data, &b.data, " codes"},
                              {&a.scales, &b.scales, " compact scales"},
                              {&a.scales_swizzled, &b.scales_swizzled, " swizzled scales"},
                              {&a.amax, &b.amax, " amax"},
                              {&a.scale_inv, &b.scale_inv, " scale_inv"}})
    expect_same_bytes(bytes_on(*ta), bytes_on(*tb), what + name);
}

// A linear layer's sequence: forward quantizes x rowwise and only the amax of its columnwise copy;
// backward makes the columnwise copy with that amax given. On this backend, both copies must be
// bit-identical to quantizing them from scratch (on the GPU: and to the CPU's), the forward's
// columnwise amax must be the columnwise copy's, and the forward must leave the columnwise codes alone.
TEST_P(Quantize, ColumnwiseAmaxFromTheForwardReproducesTheBackwardCopyBitForBit) {
  const Device d = GetParam();
  struct Case {
    QuantFormat f;
    bool rht, sr;
  };
  Mat planted = random_bf16(96, 64, 501), other = test_input(128, 96, 71);
  planted.v[7] = 300.0f;  // the amax, so that a wrong amax changes the scales
  for (Mat* xp : {&planted, &other})
    for (const Case& c : {Case{QuantFormat::NVFP4, true, false}, Case{QuantFormat::NVFP4, false, false},
                          Case{QuantFormat::NVFP4, true, true}, Case{QuantFormat::MXFP8, false, false},
                          Case{QuantFormat::FP8_E4M3, false, false}, Case{QuantFormat::FP8_E5M2, false, false}}) {
      QuantizeOptions all = options(c.f, true, true);
      all.rht_columnwise = c.rht;
      all.stochastic = c.sr;
      all.stream_id = 3;
      Mat& x = *xp;
      QuantCase qc{"amax", x, all};
      SCOPED_TRACE(qc.name());
      Quantized fresh;
      quantize_case(fresh, qc, d);
      if (d == Device::CUDA) {
        Quantized cpu;
        quantize_case(cpu, qc, Device::CPU);
        expect_same_copy(cpu.q.rowwise, fresh.q.rowwise, "gpu vs cpu rowwise");
        expect_same_copy(cpu.q.columnwise, fresh.q.columnwise, "gpu vs cpu columnwise");
      }
      Quantized seq;
      QuantCase fwd_case = qc;
      fwd_case.o.columnwise = false;
      fwd_case.o.columnwise_amax = true;
      seq.q = allocate_quantized(seq.owner, d, c.f, x.rows, x.cols, true, true);
      fill_bytes(seq.q.columnwise.data, 0xA5);
      const OpContext ctx = d == Device::CUDA ? test::cuda_ctx() : cpu_ctx(true);
      const test::DeviceTensor xd = d == Device::CUDA ? test::to_device(x.v, {x.rows, x.cols}, DType::BF16)
                                                      : test::DeviceTensor{};
      const Tensor xt = d == Device::CUDA ? xd.t : x.t();
      quantize(ctx, seq.q, xt, fwd_case.o);
      expect_same_bytes(bytes_on(fresh.q.columnwise.amax), bytes_on(seq.q.columnwise.amax), "forward's columnwise amax");
      const std::vector<uint8_t> codes = bytes_on(seq.q.columnwise.data);
      EXPECT_TRUE(std::all_of(codes.begin(), codes.end(), [](uint8_t v) { return v == 0xA5; }))
          << "columnwise_amax must not make the copy";
      QuantizeOptions bwd = all;
      bwd.rowwise = false;
      bwd.amax_given = true;
      quantize(ctx, seq.q, xt, bwd);
      expect_same_copy_on(fresh.q.rowwise, seq.q.rowwise, "rowwise");
      expect_same_copy_on(fresh.q.columnwise, seq.q.columnwise, "columnwise");
    }
}

// amax_given really takes the slot's value (it does not recompute): a tripled amax (not a power of
// two, to which NVFP4's two-level scales are invariant) changes the NVFP4 and FP8 codes, the slot
// keeps it, and the true amax given back restores them. On the GPU the planted-amax copy is also the
// CPU's.
TEST_P(Quantize, AmaxGivenUsesTheSlotInsteadOfRecomputing) {
  const Device d = GetParam();
  for (QuantFormat f : {QuantFormat::NVFP4, QuantFormat::FP8_E4M3}) {
    SCOPED_TRACE(quant_format_name(f));
    QuantCase qc{"amax given", random_bf16(32, 64, 502), options(f, true, false)};
    Quantized a, b, cpu_planted;
    quantize_case(a, qc, d);
    const float amax = floats_of(a.q.rowwise.amax)[0], planted = 3.0f * amax;
    b.q = allocate_quantized(b.owner, d, f, 32, 64, true, false);
    auto run_given = [&](Quantized& q, Device dev, float given) {
      const OpContext c = dev == Device::CUDA ? test::cuda_ctx() : cpu_ctx(true);
      if (dev == Device::CUDA)
        copy_from_host(q.q.rowwise.amax, &given);
      else
        q.q.rowwise.amax.f32()[0] = given;
      QuantizeOptions o = qc.o;
      o.amax_given = true;
      const Tensor xt = dev == Device::CUDA ? a.x : qc.x.t();
      quantize(c, q.q, xt, o);
    };
    run_given(b, d, planted);
    EXPECT_EQ(floats_of(b.q.rowwise.amax)[0], planted);
    EXPECT_NE(bytes_on(a.q.rowwise.data), bytes_on(b.q.rowwise.data));
    if (d == Device::CUDA) {
      cpu_planted.q = allocate_quantized(cpu_planted.owner, Device::CPU, f, 32, 64, true, false);
      run_given(cpu_planted, Device::CPU, planted);
      expect_same_copy(cpu_planted.q.rowwise, b.q.rowwise, "rowwise with a planted amax (gpu vs cpu)");
    }
    run_given(b, d, amax);
    EXPECT_EQ(bytes_on(a.q.rowwise.data), bytes_on(b.q.rowwise.data));
  }
}

// transpose_quantized (issue 41, a frozen base's Wᵀ): the transpose of a weight's rowwise copy is, byte for byte, the
// columnwise copy quantize makes of the same weight (codes, compact and swizzled scales with their padding, amax,
// scale_inv), for NVFP4 with 16x16 blocks and FP8 per tensor, on shapes with partial 32x32 tiles and scale padding.
TEST_P(Quantize, TheTransposeOfAWeightsRowwiseCopyIsItsColumnwiseCopy) {
  const Device d = GetParam();
  for (const QuantFormat f : {QuantFormat::NVFP4, QuantFormat::FP8_E4M3, QuantFormat::FP8_E5M2})
    for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{48, 64}, {144, 80}, {32, 272}}) {
      SCOPED_TRACE(fmt::format("{} [{}, {}]", quant_format_name(f), rows, cols));
      QuantCase qc{"transpose", test_input(rows, cols, static_cast<uint32_t>(rows + cols)), options(f, true, true)};
      qc.o.block_2d = f == QuantFormat::NVFP4;
      Quantized q;
      quantize_case(q, qc, d);
      std::vector<Buffer> owner;
      const QuantizedCopy t = allocate_quantized(owner, d, f, rows, cols, false, true).columnwise;
      if (d == Device::CUDA) poison(t);
      transpose_quantized(d == Device::CUDA ? test::cuda_ctx() : cpu_ctx(true), t, q.q.rowwise);
      const auto bytes = [d](const Tensor& x) { return d == Device::CUDA ? device_bytes(x) : host_bytes(x); };
      for (const auto& [mine, theirs, what] :
           {std::tuple{&t.data, &q.q.columnwise.data, "codes"}, {&t.scales, &q.q.columnwise.scales, "compact scales"},
            {&t.scales_swizzled, &q.q.columnwise.scales_swizzled, "swizzled scales"},
            {&t.amax, &q.q.columnwise.amax, "amax"}, {&t.scale_inv, &q.q.columnwise.scale_inv, "scale_inv"}})
        expect_same_bytes(bytes(*theirs), bytes(*mine), what);
    }
}

PL_INSTANTIATE_BACKENDS(Quantize);

// The CPU reads its compact scales (GEMM emulation, dequantize, telemetry): it writes them whatever
// compact_scales says.
TEST(OpsQuantize, TheCpuAlwaysWritesCompactScales) {
  Mat x = random_bf16(32, 64, 503);
  std::vector<Buffer> owner;
  QuantizedTensor a = allocate_quantized(owner, Device::CPU, QuantFormat::NVFP4, 32, 64, true, true);
  QuantizedTensor b = allocate_quantized(owner, Device::CPU, QuantFormat::NVFP4, 32, 64, true, true);
  QuantizeOptions o;
  o.columnwise = true;
  quantize(cpu_ctx(true), a, x.t(), o);
  o.compact_scales = false;
  quantize(cpu_ctx(true), b, x.t(), o);
  expect_same_copy_on(a.rowwise, b.rowwise, "rowwise");
  expect_same_copy_on(a.columnwise, b.columnwise, "columnwise");
}

// ---- production shapes: Llama-3-8B, micro-batch 1, seq 4096 -------------------------------------------
// tokens 4096, hidden 4096, qkv out 6144, ffn 14336 (fc1 out 28672). The linear layer's sequences:
// forward x rowwise + the columnwise amax (columnwise_amax), backward x columnwise with that amax
// (amax_given); dy both copies (SR + RHT for NVFP4); W both copies (16x16 for NVFP4). The GPU skips
// the compact scales as LinearLayer asks (compact_scales = false): its compact buffers must still
// hold the poison afterwards, every other byte must equal the CPU's (which writes compact scales).

bool all_poison(const std::vector<uint8_t>& b) {
  return std::all_of(b.begin(), b.end(), [](uint8_t v) { return v == 0xA5; });
}

// Runs `steps` in order on one CPU and one GPU quantized tensor of x[R, C] (both copies allocated)
// and compares every copy a step made, byte for byte; gpu_compact: the GPU writes compact scales.
void check_quantize_sequence(const std::vector<float>& x, int64_t R, int64_t C, const std::vector<QuantizeOptions>& steps,
                             bool gpu_compact, const std::string& what) {
  SCOPED_TRACE(what);
  const QuantFormat f = steps.front().format;
  std::vector<Buffer> owner;
  QuantizedTensor cq = allocate_quantized(owner, Device::CPU, f, R, C, true, true);
  QuantizedTensor gq = allocate_quantized(owner, Device::CUDA, f, R, C, true, true);
  poison(gq.rowwise);
  poison(gq.columnwise);
  std::vector<float> xc = x;
  const Tensor xt(xc.data(), {R, C}, DType::F32, Device::CPU);
  const test::DeviceTensor xd = test::to_device(x, {R, C}, DType::BF16);
  bool made_row = false, made_col = false;
  for (QuantizeOptions o : steps) {
    quantize(cpu_ctx(true), cq, xt, o);
    o.compact_scales = gpu_compact;
    quantize(test::cuda_ctx(), gq, xd.t, o);
    made_row = made_row || o.rowwise;
    made_col = made_col || o.columnwise;
  }
  auto compare = [&](const QuantizedCopy& c, const QuantizedCopy& g, const std::string& name) {
    expect_same_bytes(host_bytes(c.data), device_bytes(g.data), name + " codes");
    expect_same_bytes(host_bytes(c.scales_swizzled), device_bytes(g.scales_swizzled), name + " swizzled scales");
    expect_same_bytes(host_bytes(c.amax), device_bytes(g.amax), name + " amax");
    expect_same_bytes(host_bytes(c.scale_inv), device_bytes(g.scale_inv), name + " scale_inv");
    if (quant_block_size(f) == 1) return;
    if (gpu_compact)
      expect_same_bytes(host_bytes(c.scales), device_bytes(g.scales), name + " compact scales");
    else
      EXPECT_TRUE(all_poison(device_bytes(g.scales))) << name << ": compact scales written though not asked for";
  };
  if (made_row) compare(cq.rowwise, gq.rowwise, "rowwise");
  if (made_col) compare(cq.columnwise, gq.columnwise, "columnwise");
}

// The linear layer's x sequence (forward, then backward) and the one-call equivalent.
std::vector<QuantizeOptions> x_forward_backward(QuantFormat f, bool rht) {
  QuantizeOptions fwd = options(f, true, false);
  fwd.columnwise_amax = true;
  fwd.rht_columnwise = rht;
  QuantizeOptions bwd = options(f, false, true);
  bwd.rht_columnwise = rht;
  bwd.amax_given = true;
  return {fwd, bwd};
}

constexpr int64_t kTok = 4096, kHidden = 4096, kQkv = 6144, kFfn = 14336, kFc1 = 2 * kFfn;

TEST(CudaQuantizeProduction, Nvfp4Llama8bOperandsAreByteExact) {
  PL_REQUIRE_CUDA_DEVICE();
  {  // fc2's input x [4096, 14336]: forward/backward with the RHT amax kept, and in one call
    const std::vector<float> x = fast_bf16(kTok * kFfn, 1.0f, 1);
    check_quantize_sequence(x, kTok, kFfn, x_forward_backward(QuantFormat::NVFP4, true), false, "nvfp4 x fc2 fwd/bwd");
    QuantizeOptions both = options(QuantFormat::NVFP4, true, true);
    both.rht_columnwise = true;
    check_quantize_sequence(x, kTok, kFfn, {both}, true, "nvfp4 x fc2 one call");
  }
  {  // fc1's output gradient dy [4096, 28672]: SR on both copies, RHT on the columnwise one
    const std::vector<float> dy = fast_bf16(kTok * kFc1, 1e-3f, 2);
    QuantizeOptions g = options(QuantFormat::NVFP4, true, true);
    g.rht_columnwise = g.stochastic = true;
    g.seed = 0x5EED;
    g.stream_id = 8;
    g.counter = 12345;
    check_quantize_sequence(dy, kTok, kFc1, {g}, false, "nvfp4 dy fc1");
  }
  {  // fc1's weight [28672, 4096] and qkv's [6144, 4096]: 16x16 tiles, both copies
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{kFc1, kHidden}, {kQkv, kHidden}}) {
      const std::vector<float> w = fast_bf16(rows * cols, 0.02f, 3);
      QuantizeOptions wo = options(QuantFormat::NVFP4, true, true);
      wo.block_2d = true;
      check_quantize_sequence(w, rows, cols, {wo}, false, "nvfp4 w [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
    }
  }
}

TEST(CudaQuantizeProduction, Mxfp8AndFp8Llama8bOperandsAreByteExact) {
  PL_REQUIRE_CUDA_DEVICE();
  const std::vector<float> x = fast_bf16(kTok * kFfn, 1.0f, 4);
  check_quantize_sequence(x, kTok, kFfn, x_forward_backward(QuantFormat::MXFP8, false), false, "mxfp8 x fc2 fwd/bwd");
  check_quantize_sequence(x, kTok, kFfn, {options(QuantFormat::MXFP8, true, true)}, true, "mxfp8 x fc2 one call");
  const std::vector<float> dy = fast_bf16(kTok * kQkv, 1e-3f, 5);
  check_quantize_sequence(dy, kTok, kQkv, {options(QuantFormat::MXFP8, true, true)}, false, "mxfp8 dy qkv");
  const std::vector<float> xh = fast_bf16(kTok * kHidden, 1.0f, 6);
  check_quantize_sequence(xh, kTok, kHidden, x_forward_backward(QuantFormat::FP8_E4M3, false), false,
                          "fp8 e4m3 x qkv fwd/bwd");
  const std::vector<float> dy1 = fast_bf16(kTok * kFc1, 1e-3f, 7);
  check_quantize_sequence(dy1, kTok, kFc1, {options(QuantFormat::FP8_E5M2, true, true)}, false, "fp8 e5m2 dy fc1");
}

// ---- the fast kernels against the reference kernels (--quantize-kernels) ---------------------------------
// Each case runs on both kernel sets, each compared with the CPU byte for byte: a failure names the set,
// so a first GPU run tells a wrong fast kernel (reference passes) from a wrong shared rule (both fail).

template <class Body>
void on_both_kernel_sets(Body body) {
#if defined(PL_WITH_CUDA)
  for (bool reference : {true, false}) {
    test::ReferenceQuantizeKernels guard(reference);
    SCOPED_TRACE(reference ? "reference kernels" : "fast kernels");
    body();
  }
#endif
}

TEST(CudaQuantizeKernels, FastAndReferenceEqualTheCpuOnEverySharedCase) {
  PL_REQUIRE_CUDA_DEVICE();
  on_both_kernel_sets([] {
    for (QuantCase& qc : quant_cases()) check_quantize(qc, Device::CUDA);
  });
}

// Column chunks the fast RHT rejects, mixed with ones it takes: 16-row chunks of one kind each, kinds
// chosen at random per (group, column): Gaussian; a wide span (1 next to 2^-45: off the grid
// 2^(e_max-39)); two lanes (1 next to 2^-30); tiny values (2^-110, below the fast path's range); an
// exact cancellation to zero in two lanes; an Inf or NaN; all zeros with signs.
std::vector<float> rht_adversarial(int64_t R, int64_t C, uint32_t seed, bool every_chunk_wide) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(R * C));
  for (int64_t g = 0; g < R / 16; ++g)
    for (int64_t c = 0; c < C; ++c) {
      const int kind = every_chunk_wide ? 1 : static_cast<int>(rng() % 7);
      for (int64_t k = 0; k < 16; ++k) {
        float v = num::round_bf16(nd(rng));
        if (kind == 1 && k % 5 == 2) v = num::round_bf16(v * 0x1p-45f);
        if (kind == 2 && k % 4 == 1) v = num::round_bf16(v * 0x1p-30f);
        if (kind == 3) v = num::round_bf16(v * 0x1p-110f);
        if (kind == 4) v = k == 0 ? 1.0f : (k == 1 ? -1.0f : (k == 2 ? 0x1p-30f : (k == 3 ? -0x1p-30f : 0.0f)));
        if (kind == 5 && k == 7) v = (rng() & 1) ? INFINITY : num::round_bf16(NAN);
        if (kind == 6) v = (rng() & 1) ? -0.0f : 0.0f;
        x[static_cast<size_t>((16 * g + k) * C + c)] = v;
      }
    }
  return x;
}

TEST(CudaQuantizeKernels, RhtChunksTheFastPathRejectsAreExactOnTheFallback) {
  PL_REQUIRE_CUDA_DEVICE();
  on_both_kernel_sets([] {
    for (auto [R, C] : {std::pair<int64_t, int64_t>{256, 80}, {112, 1040}}) {  // partial tiles both ways
      const std::string shape = " [" + std::to_string(R) + ", " + std::to_string(C) + "]";
      const std::vector<float> x = rht_adversarial(R, C, static_cast<uint32_t>(R + C), false);
      check_quantize_sequence(x, R, C, x_forward_backward(QuantFormat::NVFP4, true), false, "nvfp4 x fwd/bwd" + shape);
      QuantizeOptions g = options(QuantFormat::NVFP4, true, true);
      g.rht_columnwise = g.stochastic = true;
      g.seed = 0x5EED;
      g.counter = 77;
      check_quantize_sequence(x, R, C, {g}, true, "nvfp4 dy sr" + shape);
    }
    // More rejected chunks than the fallback list holds (65536): the fallback redoes the whole tensor.
    const int64_t R = 1024, C = 1104;  // 64 x 1104 = 70656 chunks, every one spanning > 39 binades
    const std::vector<float> x = rht_adversarial(R, C, 5, true);
    check_quantize_sequence(x, R, C, x_forward_backward(QuantFormat::NVFP4, true), false, "nvfp4 list overflow");
  });
}

// Delayed scaling's one-pass cast (fast set: the encode reduces the amax and the history record) against
// the reference's two passes and the CPU, on the linear layer's sequence.
TEST(CudaQuantizeKernels, DelayedScalingCastsInOnePassWithTheSameAmaxAndRecord) {
  PL_REQUIRE_CUDA_DEVICE();
  on_both_kernel_sets([] {
    const int64_t R = 200, C = 176;
    const std::vector<float> x = fast_bf16(R * C, 2.0f, 17);
    std::vector<Buffer> owner;
    std::vector<float> scale_host = {0.75f, 0.0f, 0.0f, 0.0f};
    const test::DeviceTensor scale_d = test::to_device(scale_host, {4}, DType::F32);
    for (QuantFormat f : {QuantFormat::FP8_E4M3, QuantFormat::FP8_E5M2}) {
      std::vector<float> rec_host(4, -1.0f);
      const test::DeviceTensor rec_d = test::to_device(rec_host, {4}, DType::F32);
      QuantizeOptions o = options(f, true, true);
      o.scale = scale_d.t.rows(0, 1);
      o.amax_record = rec_d.t.rows(0, 1);
      QuantizeOptions oc = o;  // the CPU's run reads the scale and writes the record on the host
      oc.scale = Tensor(scale_host.data(), {1}, DType::F32, Device::CPU);
      std::vector<float> xc = x;
      QuantizedTensor cq = allocate_quantized(owner, Device::CPU, f, R, C, true, true);
      QuantizedTensor gq = allocate_quantized(owner, Device::CUDA, f, R, C, true, true);
      std::vector<float> rec_cpu(1, -1.0f);
      oc.amax_record = Tensor(rec_cpu.data(), {1}, DType::F32, Device::CPU);
      quantize(cpu_ctx(true), cq, Tensor(xc.data(), {R, C}, DType::F32, Device::CPU), oc);
      const test::DeviceTensor xd = test::to_device(x, {R, C}, DType::BF16);
      o.compact_scales = false;
      quantize(test::cuda_ctx(), gq, xd.t, o);
      expect_same_copy(cq.rowwise, gq.rowwise, std::string(quant_format_name(f)) + " rowwise");
      expect_same_copy(cq.columnwise, gq.columnwise, std::string(quant_format_name(f)) + " columnwise");
      const std::vector<float> rec = test::to_host_floats(rec_d.t.rows(0, 1));
      EXPECT_EQ(num::float_bits(rec[0]), num::float_bits(rec_cpu[0])) << "the history record";
    }
  });
}

// ---- errors ----------------------------------------------------------------------------

TEST(CudaQuantize, BadArgumentsAreOneLineErrors) {
  PL_REQUIRE_CUDA_DEVICE();
  std::vector<Buffer> owner;
  QuantizedTensor q = allocate_quantized(owner, Device::CUDA, QuantFormat::NVFP4, 32, 64, true, false);
  test::DeviceTensor x = test::device_tensor({32, 64}, DType::BF16);
  test::DeviceTensor wrong = test::device_tensor({32, 48}, DType::BF16);
  QuantizeOptions o;
  test::expect_one_line_error([&] { quantize(test::cuda_ctx(), q, wrong.t, o); }, {"quantize", "rowwise copy"});
  o.format = QuantFormat::MXFP8;
  test::expect_one_line_error([&] { quantize(test::cuda_ctx(), q, x.t, o); }, {"quantize", "mxfp8", "nvfp4"});
  o.format = QuantFormat::NVFP4;
  o.block_2d = true;
  o.rht_columnwise = true;
  test::expect_one_line_error([&] { quantize(test::cuda_ctx(), q, x.t, o); }, {"quantize", "RHT"});
  std::vector<float> host(32 * 64, 0.0f);
  Tensor on_cpu(host.data(), {32, 64}, DType::F32, Device::CPU);
  test::expect_one_line_error([&] { quantize(test::cuda_ctx(), q, on_cpu, QuantizeOptions{}); }, {"quantize", "CUDA"});
  test::DeviceTensor out = test::device_tensor({32, 32}, DType::F32);
  test::expect_one_line_error([&] { dequantize(test::cuda_ctx(), out.t, q.rowwise, QuantFormat::NVFP4); },
                              {"dequantize", "[32, 64]"});
  test::expect_one_line_error([&] { columnwise_source(test::cuda_ctx(), out.t, wrong.t, false); },
                              {"columnwise_source", "transpose"});
}

}  // namespace backends
}  // namespace
}  // namespace pl
