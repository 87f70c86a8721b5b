// The quantization ops (backend/quantize.h) on the CPU: each whole-tensor schedule against an
// independent per-block loop over the shared numerics, the copies' relations (2D, RHT, transpose),
// stochastic rounding as a stream, and the emulated block-scaled GEMM against double precision.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
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
#include "test_util.h"

namespace pl {
namespace {

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
  dequantize(OpContext{}, out.t(), c, c.format);
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

TEST(OpsQuantize, Nvfp4RowwiseMatchesTheBlockReferenceAndSwizzlesItsScales) {
  std::vector<Buffer> owner;
  Mat x = random_bf16(48, 96, 1);
  QuantizedTensor q = allocate_quantized(owner, Device::CPU, QuantFormat::NVFP4, 48, 96, true, false);
  quantize(OpContext{}, q, x.t(), QuantizeOptions{});
  expect_nvfp4_1x16(q.rowwise, x);
  // Swizzled: every compact scale at its §6.2 offset, zeros everywhere else.
  const int64_t sc = 96 / 16, pc = num::padded_scale_cols(sc);
  std::vector<uint8_t> expect(static_cast<size_t>(num::padded_scale_rows(48) * pc), 0);
  for (int64_t r = 0; r < 48; ++r)
    for (int64_t k = 0; k < sc; ++k) expect[num::swizzled_scale_offset(r, k, pc)] = q.rowwise.scales.u8()[r * sc + k];
  ASSERT_EQ(q.rowwise.scales_swizzled.numel(), static_cast<int64_t>(expect.size()));
  for (size_t i = 0; i < expect.size(); ++i) ASSERT_EQ(q.rowwise.scales_swizzled.u8()[i], expect[i]) << i;
}

TEST(OpsQuantize, Nvfp4ColumnwiseIsTheQuantizedTransposeAndRhtIsAppliedAlongItsRows) {
  std::vector<Buffer> owner;
  Mat x = random_bf16(64, 32, 2);
  QuantizedTensor q = allocate_quantized(owner, Device::CPU, QuantFormat::NVFP4, 64, 32, false, true);
  QuantizeOptions o;
  o.rowwise = false;
  o.columnwise = true;
  quantize(OpContext{}, q, x.t(), o);
  expect_nvfp4_1x16(q.columnwise, transpose(x));

  o.rht_columnwise = true;
  quantize(OpContext{}, q, x.t(), o);
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
  columnwise_source(OpContext{}, src.t(), x.t(), true);
  EXPECT_EQ(src.v, rht.v);
}

TEST(OpsQuantize, Nvfp4TwoDimensionalBlocksGiveIdenticalValuesInBothCopies) {
  std::vector<Buffer> owner;
  Mat w = random_bf16(48, 64, 3, 0.02f);
  QuantizedTensor q = allocate_quantized(owner, Device::CPU, QuantFormat::NVFP4, 48, 64, true, true);
  QuantizeOptions o;
  o.columnwise = true;
  o.block_2d = true;
  quantize(OpContext{}, q, w.t(), o);
  EXPECT_EQ(q.rowwise.amax.f32()[0], q.columnwise.amax.f32()[0]);
  const Mat row = dequant(q.rowwise), col = dequant(q.columnwise);
  EXPECT_EQ(transpose(row).v, col.v);
  // One scale per 16x16 tile, repeated on its 16 rows.
  for (int64_t r = 0; r < 48; ++r)
    for (int64_t b = 0; b < 4; ++b) ASSERT_EQ(q.rowwise.scales.u8()[r * 4 + b], q.rowwise.scales.u8()[(r / 16 * 16) * 4 + b]);
  // 1x16 blocks would in general not be transposes of each other.
  QuantizedTensor q1 = allocate_quantized(owner, Device::CPU, QuantFormat::NVFP4, 48, 64, true, true);
  o.block_2d = false;
  quantize(OpContext{}, q1, w.t(), o);
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
  quantize(OpContext{}, a, x.t(), o);
  quantize(OpContext{}, b, x.t(), o);
  EXPECT_EQ(dequant(a.rowwise).v, dequant(b.rowwise).v) << "same seed, stream and counter: same bits";
  o.counter = 8;
  quantize(OpContext{}, b, x.t(), o);
  EXPECT_NE(dequant(a.rowwise).v, dequant(b.rowwise).v) << "another counter draws other bits";
  // The mean over many counters approaches x; round-to-nearest has a fixed error.
  std::vector<double> mean(x.v.size(), 0.0);
  const int draws = 256;
  for (int d = 0; d < draws; ++d) {
    o.counter = static_cast<uint64_t>(100 + d);
    quantize(OpContext{}, b, x.t(), o);
    const Mat m = dequant(b.rowwise);
    for (size_t i = 0; i < mean.size(); ++i) mean[i] += m.v[i] / draws;
  }
  QuantizedTensor rn = allocate_quantized(owner, Device::CPU, QuantFormat::NVFP4, 16, 64, true, false);
  quantize(OpContext{}, rn, x.t(), QuantizeOptions{});
  const Mat r = dequant(rn.rowwise);
  double err_sr = 0.0, err_rn = 0.0;
  for (size_t i = 0; i < mean.size(); ++i) {
    err_sr += (mean[i] - x.v[i]) * (mean[i] - x.v[i]);
    err_rn += (r.v[i] - x.v[i]) * (r.v[i] - x.v[i]);
  }
  EXPECT_LT(err_sr, 0.1 * err_rn) << "mean of SR draws should be far closer to x than RN";
}

TEST(OpsQuantize, Fp8CurrentScalingAndMxfp8MatchTheirFormulas) {
  std::vector<Buffer> owner;
  Mat x = random_bf16(32, 64, 5);
  QuantizeOptions o;
  o.columnwise = true;
  for (QuantFormat f : {QuantFormat::FP8_E4M3, QuantFormat::FP8_E5M2}) {
    QuantizedTensor q = allocate_quantized(owner, Device::CPU, f, 32, 64, true, true);
    o.format = f;
    quantize(OpContext{}, q, x.t(), o);
    float amax = 0.0f;
    for (float v : x.v) amax = std::fmax(amax, std::fabs(v));
    const bool e4 = f == QuantFormat::FP8_E4M3;
    const float scale = num::fp8_current_scale(amax, e4 ? num::kE4M3Max : num::kE5M2Max);
    EXPECT_EQ(q.rowwise.scale_inv.f32()[0], 1.0f / scale);
    for (int64_t r = 0; r < 32; ++r)
      for (int64_t c = 0; c < 64; ++c) {
        const uint8_t expect = e4 ? num::float_to_e4m3(x.v[r * 64 + c] * scale) : num::float_to_e5m2(x.v[r * 64 + c] * scale);
        ASSERT_EQ(q.rowwise.data.u8()[r * 64 + c], expect);
        ASSERT_EQ(q.columnwise.data.u8()[c * 32 + r], expect) << "per-tensor: the transpose holds the same codes";
      }
  }
  QuantizedTensor m = allocate_quantized(owner, Device::CPU, QuantFormat::MXFP8, 32, 64, true, true);
  o.format = QuantFormat::MXFP8;
  quantize(OpContext{}, m, x.t(), o);
  for (int64_t r = 0; r < 32; ++r)
    for (int64_t b = 0; b < 2; ++b) {
      float bamax = 0.0f;
      for (int k = 0; k < 32; ++k) bamax = std::fmax(bamax, std::fabs(x.v[r * 64 + b * 32 + k]));
      const uint8_t e = num::mxfp8_block_scale(bamax);
      ASSERT_EQ(m.rowwise.scales.u8()[r * 2 + b], e);
      for (int k = 0; k < 32; ++k)
        ASSERT_EQ(m.rowwise.data.u8()[r * 64 + b * 32 + k],
                  num::float_to_e4m3(x.v[r * 64 + b * 32 + k] * num::mxfp8_element_scale(e)));
    }
  // Columnwise MXFP8 blocks run along x's rows: one scale per 32 rows of a column.
  float bamax = 0.0f;
  for (int r = 0; r < 32; ++r) bamax = std::fmax(bamax, std::fabs(x.v[r * 64 + 5]));
  EXPECT_EQ(m.columnwise.scales.u8()[5], num::mxfp8_block_scale(bamax));
}

Mat gemm_reference(const Mat& a, const Mat& b) { return test::matmul_nt(a, b); }
void expect_close(const Mat& got, const Mat& want, double rel) { EXPECT_LT(test::rel_diff(got, want), rel); }

TEST(OpsQuantize, EmulatedGemmEqualsTheDoubleProductOfDequantizedOperands) {
  const int64_t M = 32, N = 48, K = 64;
  Mat a = random_bf16(M, K, 6), b = random_bf16(N, K, 7, 0.05f);
  std::vector<float> sa(static_cast<size_t>(N * K)), sb(static_cast<size_t>(N * K));
  const Tensor ta(sa.data(), {N * K}, DType::F32), tb(sb.data(), {N * K}, DType::F32);
  OpContext exact;
  exact.round_bf16 = false;
  struct Case {
    QuantFormat fa, fb;
  };
  for (Case cs : {Case{QuantFormat::NVFP4, QuantFormat::NVFP4}, Case{QuantFormat::MXFP8, QuantFormat::MXFP8},
                  Case{QuantFormat::FP8_E5M2, QuantFormat::FP8_E4M3}}) {
    SCOPED_TRACE(quant_format_name(cs.fa));
    std::vector<Buffer> owner;
    QuantizedTensor qa = allocate_quantized(owner, Device::CPU, cs.fa, M, K, true, false);
    QuantizedTensor qb = allocate_quantized(owner, Device::CPU, cs.fb, N, K, true, false);
    quantize(exact, qa, a.t(), QuantizeOptions{cs.fa});
    quantize(exact, qb, b.t(), QuantizeOptions{cs.fb});
    Mat y(M, N);
    quantized_gemm(exact, y.t(), qa.rowwise, qb.rowwise, cs.fa, false, ta, tb);
    const Mat ref = gemm_reference(dequant(qa.rowwise), dequant(qb.rowwise));
    expect_close(y, ref, 1e-6);
    // accumulate adds onto y
    Mat y2 = y;
    quantized_gemm(exact, y2.t(), qa.rowwise, qb.rowwise, cs.fa, true, ta, tb);
    for (size_t i = 0; i < y.v.size(); ++i) ASSERT_NEAR(y2.v[i], 2.0f * y.v[i], 1e-5f * (1.0f + std::fabs(y.v[i])));
    // and the quantized product is close to the exact one
    expect_close(y, gemm_reference(a, b), cs.fa == QuantFormat::NVFP4 ? 0.2 : 0.08);
  }
}

TEST(OpsQuantize, ShapesThatBreakBlockRulesAreOneLineErrors) {
  std::vector<Buffer> owner;
  test::expect_one_line_error([&] { allocate_quantized(owner, Device::CPU, QuantFormat::NVFP4, 16, 24, true, false); },
                              {"nvfp4", "24", "16"});
  test::expect_one_line_error([&] { allocate_quantized(owner, Device::CPU, QuantFormat::MXFP8, 16, 48, true, false); },
                              {"mxfp8", "48", "32"});
  QuantizedTensor q = allocate_quantized(owner, Device::CPU, QuantFormat::NVFP4, 16, 32, true, false);
  Mat x(16, 48);
  test::expect_one_line_error([&] { quantize(OpContext{}, q, x.t(), QuantizeOptions{}); }, {"quantize", "[16, 48]"});
  QuantizeOptions bad;
  bad.format = QuantFormat::MXFP8;
  test::expect_one_line_error([&] { quantize(OpContext{}, q, Mat(16, 32).t(), bad); }, {"mxfp8", "nvfp4"});
}

// ---- amaxes computed once, reused (QuantizeOptions::columnwise_amax / amax_given) -----------------

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.data);
  return std::vector<uint8_t>(p, p + t.bytes());
}

void expect_same_copy_bytes(const QuantizedCopy& a, const QuantizedCopy& b, const std::string& what) {
  EXPECT_EQ(bytes_of(a.data), bytes_of(b.data)) << what << " codes";
  if (quant_block_size(a.format) > 1) {
    EXPECT_EQ(bytes_of(a.scales), bytes_of(b.scales)) << what << " compact scales";
    EXPECT_EQ(bytes_of(a.scales_swizzled), bytes_of(b.scales_swizzled)) << what << " swizzled scales";
  }
  EXPECT_EQ(bytes_of(a.amax), bytes_of(b.amax)) << what << " amax";
  EXPECT_EQ(bytes_of(a.scale_inv), bytes_of(b.scale_inv)) << what << " scale_inv";
}

// A linear layer's sequence: forward quantizes x rowwise and only the amax of its columnwise copy;
// backward makes the columnwise copy with that amax given. Both copies must be bit-identical to
// quantizing them from scratch, and the forward's columnwise amax must be the columnwise copy's.
TEST(OpsQuantize, ColumnwiseAmaxFromTheForwardReproducesTheBackwardCopyBitForBit) {
  struct Case {
    QuantFormat f;
    bool rht, sr;
  };
  for (const Case& c : {Case{QuantFormat::NVFP4, true, false}, Case{QuantFormat::NVFP4, false, false},
                        Case{QuantFormat::NVFP4, true, true}, Case{QuantFormat::MXFP8, false, false},
                        Case{QuantFormat::FP8_E4M3, false, false}, Case{QuantFormat::FP8_E5M2, false, false}}) {
    const std::string what = std::string(quant_format_name(c.f)) + (c.rht ? " rht" : "") + (c.sr ? " sr" : "");
    Mat x = random_bf16(96, 64, 501);
    x.v[7] = 300.0f;  // the amax, so that a wrong amax changes the scales
    std::vector<Buffer> owner;
    QuantizedTensor fresh = allocate_quantized(owner, Device::CPU, c.f, 96, 64, true, true);
    QuantizeOptions all;
    all.format = c.f;
    all.rowwise = all.columnwise = true;
    all.rht_columnwise = c.rht;
    all.stochastic = c.sr;
    all.stream_id = 3;
    quantize(OpContext{}, fresh, x.t(), all);

    QuantizedTensor seq = allocate_quantized(owner, Device::CPU, c.f, 96, 64, true, true);
    QuantizeOptions fwd = all;
    fwd.columnwise = false;
    fwd.columnwise_amax = true;
    quantize(OpContext{}, seq, x.t(), fwd);
    EXPECT_EQ(bytes_of(seq.columnwise.amax), bytes_of(fresh.columnwise.amax)) << what << ": forward's columnwise amax";
    EXPECT_EQ(bytes_of(seq.columnwise.data), std::vector<uint8_t>(seq.columnwise.data.bytes(), 0))
        << what << ": columnwise_amax must not make the copy";
    QuantizeOptions bwd = all;
    bwd.rowwise = false;
    bwd.amax_given = true;
    quantize(OpContext{}, seq, x.t(), bwd);
    expect_same_copy_bytes(seq.rowwise, fresh.rowwise, what + " rowwise");
    expect_same_copy_bytes(seq.columnwise, fresh.columnwise, what + " columnwise");
  }
}

// amax_given really takes the slot's value (it does not recompute): a tripled amax (not a power of
// two, to which NVFP4's two-level scales are invariant) changes the NVFP4 and FP8 codes.
TEST(OpsQuantize, AmaxGivenUsesTheSlotInsteadOfRecomputing) {
  for (QuantFormat f : {QuantFormat::NVFP4, QuantFormat::FP8_E4M3}) {
    Mat x = random_bf16(32, 64, 502);
    std::vector<Buffer> owner;
    QuantizedTensor a = allocate_quantized(owner, Device::CPU, f, 32, 64, true, false);
    QuantizedTensor b = allocate_quantized(owner, Device::CPU, f, 32, 64, true, false);
    QuantizeOptions o;
    o.format = f;
    quantize(OpContext{}, a, x.t(), o);
    b.rowwise.amax.f32()[0] = 3.0f * a.rowwise.amax.f32()[0];
    o.amax_given = true;
    quantize(OpContext{}, b, x.t(), o);
    EXPECT_EQ(b.rowwise.amax.f32()[0], 3.0f * a.rowwise.amax.f32()[0]) << quant_format_name(f);
    EXPECT_NE(bytes_of(a.rowwise.data), bytes_of(b.rowwise.data)) << quant_format_name(f);
    b.rowwise.amax.f32()[0] = a.rowwise.amax.f32()[0];
    quantize(OpContext{}, b, x.t(), o);
    EXPECT_EQ(bytes_of(a.rowwise.data), bytes_of(b.rowwise.data)) << quant_format_name(f);
  }
}

// The CPU reads its compact scales (GEMM emulation, dequantize, telemetry): it writes them whatever
// compact_scales says.
TEST(OpsQuantize, TheCpuAlwaysWritesCompactScales) {
  Mat x = random_bf16(32, 64, 503);
  std::vector<Buffer> owner;
  QuantizedTensor a = allocate_quantized(owner, Device::CPU, QuantFormat::NVFP4, 32, 64, true, true);
  QuantizedTensor b = allocate_quantized(owner, Device::CPU, QuantFormat::NVFP4, 32, 64, true, true);
  QuantizeOptions o;
  o.columnwise = true;
  quantize(OpContext{}, a, x.t(), o);
  o.compact_scales = false;
  quantize(OpContext{}, b, x.t(), o);
  expect_same_copy_bytes(a.rowwise, b.rowwise, "rowwise");
  expect_same_copy_bytes(a.columnwise, b.columnwise, "columnwise");
}

// The one rule of native quantized GEMMs (backend/quantize.h), per architecture.
TEST(OpsQuantize, NativeQuantizedGemmsPerArchitecture) {
  for (int sm : {80, 86, 89, 90, 100, 103, 120, 121})
    for (QuantFormat f : {QuantFormat::FP8_E4M3, QuantFormat::FP8_E5M2})
      EXPECT_EQ(quantized_gemm_native(f, sm), sm >= 89) << "fp8 sm_" << sm;
  for (int sm : {80, 89, 90, 100, 103, 120, 121})
    for (QuantFormat f : {QuantFormat::NVFP4, QuantFormat::MXFP8})
      EXPECT_EQ(quantized_gemm_native(f, sm), sm == 100 || sm == 103) << quant_format_name(f) << " sm_" << sm;
  EXPECT_EQ(kMinCudaSm, 80);
  EXPECT_FALSE(quantized_gemm_native(QuantFormat::NVFP4, kPlanDefaultSm));  // the dry run plans the emulation
}

}  // namespace
}  // namespace pl
