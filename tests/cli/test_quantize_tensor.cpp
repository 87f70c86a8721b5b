// The quantize_tensor tool: its outputs equal, bit for bit, what the library's quantize(),
// dequantize() and quant_stats() give in-process for the same BF16-rounded input; the swizzled
// scales are the SPEC-NVFP4 §6.2 permutation; --rht equals a per-row 16-chunk RHT followed by 1x16
// quantization; --stochastic is reproducible per seed; every bad input or flag is one stderr line,
// a non-zero exit and no PREFIX.* file left behind.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "backend/quantize.h"
#include "io/npy.h"
#include "core/tensor.h"
#include "numerics/bf16.h"
#include "numerics/hadamard.h"
#include "numerics/swizzle.h"
#include "test_util.h"

namespace pl {
namespace {

using test::ProcessResult;
using test::TempDir;
using test::FileSizeLimit;
using test::ScopedEnv;

const std::string kQuantizeTensorTool = PL_QUANTIZE_TENSOR_PATH;
// The same program with FileSet's test hook installed from the environment (tests/tools/publish_test_hooks.cpp).
const std::string kToolWithTestHooks = PL_QUANTIZE_TENSOR_TEST_HOOKS_PATH;
constexpr int64_t kRows = 256, kCols = 512;

ProcessResult run_tool(const std::vector<std::string>& args, const std::string& tool = kQuantizeTensorTool) {
  return test::run_process(tool, args, 120.0);
}

std::string cmdline(const std::vector<std::string>& args) {
  std::string s = "quantize_tensor";
  for (const auto& a : args) s += " " + a;
  return s;
}

// Standard normal values from a fixed seed (Box-Muller on mt19937_64 bits: the same on every platform).
std::vector<float> gaussian(int64_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  auto uniform = [&] { return (static_cast<double>(gen() >> 11) + 0.5) * 0x1.0p-53; };
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<float>(std::sqrt(-2.0 * std::log(uniform())) * std::cos(6.283185307179586 * uniform()));
  return v;
}

std::vector<float> to_bf16(std::vector<float> v) {
  for (float& x : v) x = num::round_bf16(x);
  return v;
}

std::string write_f32(const TempDir& dir, const std::string& name, const std::vector<int64_t>& shape,
                      const std::vector<float>& v) {
  const std::string p = (dir.path() / name).string();
  write_npy(p, "<f4", shape, v.data(), v.size() * sizeof(float));
  return p;
}

// The library's result for x (already BF16 values) [rows, cols], quantized rowwise.
struct LibResult {
  std::vector<Buffer> owner;
  QuantizedTensor q;
  std::vector<float> dequant;
  QuantStats stats;
  const QuantizedCopy& copy() const { return q.rowwise; }
};

LibResult lib_quantize(const std::vector<float>& x, int64_t rows, int64_t cols, QuantizeOptions opt) {
  LibResult r;
  const OpContext ctx{Device::CPU, true};
  r.owner.emplace_back(x.size() * sizeof(float), Device::CPU);
  const Tensor xt = r.owner.back().as({rows, cols}, DType::F32);
  std::memcpy(xt.f32(), x.data(), xt.bytes());
  r.q = allocate_quantized(r.owner, Device::CPU, opt.format, rows, cols, true, false);
  opt.rowwise = true;
  opt.columnwise = false;
  quantize(ctx, r.q, xt, opt);
  r.owner.emplace_back(xt.bytes(), Device::CPU);
  const Tensor dq = r.owner.back().as({rows, cols}, DType::F32);
  dequantize(ctx, dq, r.q.rowwise, opt.format);
  r.dequant.assign(dq.f32(), dq.f32() + rows * cols);
  r.stats = quant_stats(ctx, r.q.rowwise, opt.format, xt);
  return r;
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.data);
  return std::vector<uint8_t>(p, p + t.bytes());
}

std::vector<uint8_t> bytes_of(const std::vector<float>& v) {
  const auto* p = reinterpret_cast<const uint8_t*>(v.data());
  return std::vector<uint8_t>(p, p + v.size() * sizeof(float));
}

float first_f32(const NpyArray& a) {
  float f;
  std::memcpy(&f, a.bytes.data(), sizeof f);
  return f;
}

struct Telemetry {
  std::string format, layout, rht, sr;
  int64_t rows = 0, cols = 0;
  double amax = 0, saturated = 0, underflow = 0, rel_error = 0;
};

// The last stdout line, which must be the telemetry line.
Telemetry parse_telemetry(const std::string& out) {
  const auto lines = test::split_lines(out);
  Telemetry t;
  if (lines.empty()) {
    ADD_FAILURE() << "no stdout";
    return t;
  }
  static const std::regex re(
      R"(^quantize_tensor: (\S+) (\S+) rht=(on|off) sr=(on|off) \| shape (\d+)x(\d+) \| amax (\S+) \| )"
      R"(saturated ([0-9.]+) \| underflow_blocks ([0-9.]+) \| rel_error ([0-9.]+|nan)$)");
  std::smatch m;
  if (!std::regex_match(lines.back(), m, re)) {
    ADD_FAILURE() << "not a telemetry line: " << lines.back();
    return t;
  }
  t.format = m[1];
  t.layout = m[2];
  t.rht = m[3];
  t.sr = m[4];
  t.rows = std::stoll(m[5]);
  t.cols = std::stoll(m[6]);
  t.amax = std::stod(m[7]);
  t.saturated = std::stod(m[8]);
  t.underflow = std::stod(m[9]);
  t.rel_error = std::stod(m[10]);
  return t;
}

// SPEC-NVFP4 §6.2, written out here independently of the library.
int64_t spec_swizzle_offset(int64_t r, int64_t c, int64_t padded_cols) {
  return ((r / 128) * (padded_cols / 4) + (c / 4)) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + (c % 4);
}

// scales [rows, sc] compact -> the zero-padded swizzled array.
std::vector<uint8_t> expected_swizzle(const std::vector<uint8_t>& scales, int64_t rows, int64_t sc) {
  const int64_t pr = (rows + 127) / 128 * 128, pc = (sc + 3) / 4 * 4;
  std::vector<uint8_t> out(static_cast<size_t>(pr * pc), 0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < sc; ++c) {
      const int64_t off = num::swizzled_scale_offset(r, c, pc);
      EXPECT_EQ(off, spec_swizzle_offset(r, c, pc));
      out[static_cast<size_t>(off)] = scales[static_cast<size_t>(r * sc + c)];
    }
  return out;
}

// Every file the tool wrote for `prefix` (PREFIX.* and PREFIX.*.tmp).
std::vector<std::string> files_with_prefix(const TempDir& dir, const std::string& stem) {
  std::vector<std::string> found;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    const std::string name = e.path().filename().string();
    if (name.rfind(stem + ".", 0) == 0) found.push_back(name);
  }
  return found;
}

// Runs the tool, expects success, and checks every output against the library's in-process result
// for `x_bf16` quantized with `opt` (rowwise). Returns the telemetry.
Telemetry expect_matches_library(const std::vector<std::string>& args, const std::string& prefix,
                                 const std::vector<float>& x_bf16, int64_t rows, int64_t cols,
                                 const QuantizeOptions& opt) {
  SCOPED_TRACE(cmdline(args));
  const ProcessResult r = run_tool(args);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  const LibResult lib = lib_quantize(x_bf16, rows, cols, opt);
  const QuantizedCopy& c = lib.copy();
  const int64_t blk = quant_block_size(opt.format);

  const NpyArray codes = read_npy(prefix + ".codes.npy");
  EXPECT_EQ(codes.dtype, "|u1");
  EXPECT_EQ(codes.shape, (std::vector<int64_t>{rows, opt.format == QuantFormat::NVFP4 ? cols / 2 : cols}));
  EXPECT_TRUE(codes.bytes == bytes_of(c.data)) << "codes differ from the library's";

  const NpyArray scales = read_npy(prefix + ".scales.npy");
  if (blk > 1) {
    EXPECT_EQ(scales.dtype, "|u1");
    EXPECT_EQ(scales.shape, (std::vector<int64_t>{rows, cols / blk}));
    EXPECT_TRUE(scales.bytes == bytes_of(c.scales)) << "scales differ from the library's";
    const NpyArray swz = read_npy(prefix + ".scales_swizzled.npy");
    EXPECT_EQ(swz.dtype, "|u1");
    EXPECT_EQ(swz.shape.size(), 1u);
    EXPECT_EQ(swz.shape.back(), (rows + 127) / 128 * 128 * ((cols / blk + 3) / 4 * 4));
    EXPECT_TRUE(swz.bytes == expected_swizzle(scales.bytes, rows, cols / blk)) << "not the §6.2 permutation";
    EXPECT_TRUE(swz.bytes == bytes_of(c.scales_swizzled));
  } else {
    EXPECT_EQ(scales.dtype, "<f4");
    EXPECT_EQ(scales.shape, (std::vector<int64_t>{1}));
    EXPECT_EQ(first_f32(scales), c.scale_inv.f32()[0]);
    EXPECT_FALSE(std::filesystem::exists(prefix + ".scales_swizzled.npy"));
  }

  const NpyArray amax = read_npy(prefix + ".amax.npy");
  EXPECT_EQ(amax.dtype, "<f4");
  EXPECT_EQ(amax.shape, (std::vector<int64_t>{1}));
  EXPECT_EQ(first_f32(amax), c.amax.f32()[0]);

  const NpyArray dq = read_npy(prefix + ".dequant.npy");
  EXPECT_EQ(dq.dtype, "<f4");
  EXPECT_EQ(dq.shape, (std::vector<int64_t>{rows, cols}));
  EXPECT_TRUE(dq.bytes == bytes_of(lib.dequant)) << "dequant differs from the library's dequantize()";

  const Telemetry t = parse_telemetry(r.out);
  EXPECT_EQ(t.format, quant_format_name(opt.format));
  EXPECT_EQ(t.rows, rows);
  EXPECT_EQ(t.cols, cols);
  EXPECT_EQ(static_cast<float>(t.amax), static_cast<float>(lib.stats.amax));
  EXPECT_NEAR(t.saturated, lib.stats.saturated_fraction, 1e-6);
  EXPECT_NEAR(t.underflow, lib.stats.underflow_fraction, 1e-6);
  EXPECT_NEAR(t.rel_error, lib.stats.relative_error, 1e-6);
  EXPECT_FALSE(std::filesystem::exists(prefix + ".codes.npy.tmp"));
  return t;
}

QuantizeOptions options(QuantFormat f) {
  QuantizeOptions o;
  o.format = f;
  return o;
}

TEST(QuantizeTensor, Nvfp4MatchesLibrary) {
  TempDir dir;
  const std::vector<float> x = gaussian(kRows * kCols, 1);
  const std::string in = write_f32(dir, "x.npy", {kRows, kCols}, x);
  const std::string out = (dir.path() / "q").string();
  const Telemetry t = expect_matches_library({in, "--format", "nvfp4", "--out", out}, out, to_bf16(x), kRows, kCols,
                                             options(QuantFormat::NVFP4));
  EXPECT_EQ(t.layout, "1x16");
  EXPECT_EQ(t.rht, "off");
  EXPECT_EQ(t.sr, "off");
  EXPECT_LT(t.rel_error, 0.15);
  EXPECT_GT(t.rel_error, 0.0);
  // The amax is that of the BF16-rounded input.
  float amax = 0;
  for (float v : to_bf16(x)) amax = std::fmax(amax, std::fabs(v));
  EXPECT_EQ(static_cast<float>(t.amax), amax);
}

TEST(QuantizeTensor, Nvfp4Block16x16MatchesLibrary) {
  TempDir dir;
  const std::vector<float> x = gaussian(kRows * kCols, 2);
  const std::string in = write_f32(dir, "w.npy", {kRows, kCols}, x);
  const std::string out = (dir.path() / "w16").string();
  QuantizeOptions opt = options(QuantFormat::NVFP4);
  opt.block_2d = true;
  const Telemetry t = expect_matches_library({in, "--format", "nvfp4", "--block", "16x16", "--out", out, "--quiet"},
                                             out, to_bf16(x), kRows, kCols, opt);
  EXPECT_EQ(t.layout, "16x16");
  EXPECT_LT(t.rel_error, 0.15);
  // Every 16x16 tile shares one scale: rows 16k..16k+15 of the scale array are equal.
  const NpyArray s = read_npy(out + ".scales.npy");
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t b = 0; b < kCols / 16; ++b)
      ASSERT_EQ(s.bytes[r * (kCols / 16) + b], s.bytes[(r / 16 * 16) * (kCols / 16) + b]) << r << "," << b;
}

TEST(QuantizeTensor, Mxfp8MatchesLibrary) {
  TempDir dir;
  const std::vector<float> x = gaussian(kRows * kCols, 3);
  const std::string in = write_f32(dir, "x.npy", {kRows, kCols}, x);
  const std::string out = (dir.path() / "m").string();
  const Telemetry t = expect_matches_library({in, "--format", "mxfp8", "--out", out}, out, to_bf16(x), kRows, kCols,
                                             options(QuantFormat::MXFP8));
  EXPECT_EQ(t.layout, "1x32");
  EXPECT_LT(t.rel_error, 0.05);
}

TEST(QuantizeTensor, Fp8E4M3MatchesLibrary) {
  TempDir dir;
  const std::vector<float> x = gaussian(kRows * kCols, 4);
  const std::string in = write_f32(dir, "x.npy", {kRows, kCols}, x);
  const std::string out = (dir.path() / "e4").string();
  const Telemetry t = expect_matches_library({in, "--format", "fp8_e4m3", "--out", out}, out, to_bf16(x), kRows,
                                             kCols, options(QuantFormat::FP8_E4M3));
  EXPECT_EQ(t.layout, "per-tensor");
  EXPECT_LT(t.rel_error, 0.05);
  // scales.npy holds scale_inv: dequant = E4M3 value * scale_inv, and scale_inv = amax / 448 up to rounding.
  const float scale_inv = first_f32(read_npy(out + ".scales.npy"));
  EXPECT_NEAR(scale_inv, t.amax / 448.0, 1e-6 * t.amax / 448.0);
}

// E5M2 has 2 mantissa bits: on Gaussian data the RMS relative error is about 0.053 (an RNE grid
// with relative half-spacing 2^-3..2^-4), so the bound here is 0.07, not the 0.05 of E4M3.
TEST(QuantizeTensor, Fp8E5M2MatchesLibrary) {
  TempDir dir;
  const std::vector<float> x = gaussian(kRows * kCols, 5);
  const std::string in = write_f32(dir, "x.npy", {kRows, kCols}, x);
  const std::string out = (dir.path() / "e5").string();
  const Telemetry t = expect_matches_library({in, "--format", "fp8_e5m2", "--out", out}, out, to_bf16(x), kRows,
                                             kCols, options(QuantFormat::FP8_E5M2));
  EXPECT_LT(t.rel_error, 0.07);
}

// A '<u2' file of BF16 bits gives the same outputs as the float32 file of the same values, and a
// float32 input is rounded to BF16 (RNE) first.
TEST(QuantizeTensor, Bf16InputEqualsRoundedFloatInput) {
  TempDir dir;
  const std::vector<float> x = gaussian(64 * 128, 6);
  std::vector<uint16_t> bits(x.size());
  for (size_t i = 0; i < x.size(); ++i) bits[i] = num::float_to_bf16_bits(x[i]);
  const std::string in16 = (dir.path() / "x16.npy").string();
  write_npy(in16, "<u2", {64, 128}, bits.data(), bits.size() * 2);
  const std::string in32 = write_f32(dir, "x32.npy", {64, 128}, x);
  for (const char* f : {"nvfp4", "mxfp8", "fp8_e4m3"}) {
    SCOPED_TRACE(f);
    const std::string a = (dir.path() / (std::string("a_") + f)).string();
    const std::string b = (dir.path() / (std::string("b_") + f)).string();
    ASSERT_EQ(run_tool({in16, "--format", f, "--out", a, "--quiet"}).exit_code, 0);
    ASSERT_EQ(run_tool({in32, "--format", f, "--out", b, "--quiet"}).exit_code, 0);
    for (const char* s : {".codes.npy", ".scales.npy", ".amax.npy", ".dequant.npy"})
      EXPECT_TRUE(read_npy(a + s).bytes == read_npy(b + s).bytes) << s;
  }
  const std::string out = (dir.path() / "q16").string();
  expect_matches_library({in16, "--format", "nvfp4", "--out", out}, out, to_bf16(x), 64, 128,
                         options(QuantFormat::NVFP4));
}

// 1-D input [n] is quantized as [1, n].
TEST(QuantizeTensor, OneDimensionalInput) {
  TempDir dir;
  const std::vector<float> x = gaussian(96, 7);
  const std::string in = write_f32(dir, "v.npy", {96}, x);
  const std::string out = (dir.path() / "v").string();
  const Telemetry t = expect_matches_library({in, "--format", "mxfp8", "--out", out}, out, to_bf16(x), 1, 96,
                                             options(QuantFormat::MXFP8));
  EXPECT_EQ(t.rows, 1);
  EXPECT_EQ(t.cols, 96);
}

// --rht: each row of X, cut into 16-element chunks, goes through the 16-point RHT (BF16 output),
// and the result is quantized in 1x16 blocks: the same bytes as the library quantizing
// rht16(rows of X) rowwise.
TEST(QuantizeTensor, RhtEqualsPerRowTransformThenQuantize) {
  TempDir dir;
  const int64_t rows = 48, cols = 256;  // rows deliberately not a multiple of 128 or of 16 * 16
  const std::vector<float> x = gaussian(rows * cols, 8);
  const std::string in = write_f32(dir, "dy.npy", {rows, cols}, x);
  const std::vector<float> xb = to_bf16(x);
  std::vector<float> y(xb.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; c += 16) num::rht16(&xb[r * cols + c], &y[r * cols + c], num::kRhtSignMask);
  const std::string out = (dir.path() / "dy").string();
  const Telemetry t =
      expect_matches_library({in, "--format", "nvfp4", "--rht", "--out", out}, out, y, rows, cols,
                             options(QuantFormat::NVFP4));
  EXPECT_EQ(t.rht, "on");
  EXPECT_LT(t.rel_error, 0.15);
  // The amax is the post-RHT one, which differs from the input's.
  float in_amax = 0;
  for (float v : xb) in_amax = std::fmax(in_amax, std::fabs(v));
  EXPECT_NE(static_cast<float>(t.amax), in_amax);
  // And it differs from the plain quantization of X.
  const std::string plain = (dir.path() / "plain").string();
  ASSERT_EQ(run_tool({in, "--format", "nvfp4", "--out", plain, "--quiet"}).exit_code, 0);
  EXPECT_FALSE(read_npy(plain + ".codes.npy").bytes == read_npy(out + ".codes.npy").bytes);
}

// --stochastic: the same seed gives the same codes, another seed other codes, both unlike RN; the
// codes are the library's SR codes for (seed, stream 0, counter 0).
TEST(QuantizeTensor, StochasticIsReproduciblePerSeed) {
  TempDir dir;
  const std::vector<float> x = gaussian(kRows * kCols, 9);
  const std::string in = write_f32(dir, "g.npy", {kRows, kCols}, x);
  const std::string a = (dir.path() / "a").string(), b = (dir.path() / "b").string();
  const std::string c = (dir.path() / "c").string(), rn = (dir.path() / "rn").string();
  QuantizeOptions opt = options(QuantFormat::NVFP4);
  opt.stochastic = true;
  opt.seed = 7;
  const Telemetry t = expect_matches_library({in, "--format", "nvfp4", "--stochastic", "--seed", "7", "--out", a},
                                             a, to_bf16(x), kRows, kCols, opt);
  EXPECT_EQ(t.sr, "on");
  EXPECT_LT(t.rel_error, 0.25);
  ASSERT_EQ(run_tool({in, "--format", "nvfp4", "--stochastic", "--seed", "7", "--out", b, "-q"}).exit_code, 0);
  ASSERT_EQ(run_tool({in, "--format", "nvfp4", "--stochastic", "--seed", "8", "--out", c, "-q"}).exit_code, 0);
  ASSERT_EQ(run_tool({in, "--format", "nvfp4", "--out", rn, "-q"}).exit_code, 0);
  const auto ca = read_npy(a + ".codes.npy").bytes, cb = read_npy(b + ".codes.npy").bytes;
  const auto cc = read_npy(c + ".codes.npy").bytes, crn = read_npy(rn + ".codes.npy").bytes;
  EXPECT_TRUE(ca == cb);
  EXPECT_FALSE(ca == cc);
  EXPECT_FALSE(ca == crn);
  // SR changes codes, not scales or amax.
  EXPECT_TRUE(read_npy(a + ".scales.npy").bytes == read_npy(rn + ".scales.npy").bytes);
  EXPECT_TRUE(read_npy(a + ".amax.npy").bytes == read_npy(rn + ".amax.npy").bytes);

  // With --rht too: reproducible per seed.
  const std::string d = (dir.path() / "d").string(), e = (dir.path() / "e").string();
  ASSERT_EQ(run_tool({in, "--format", "nvfp4", "--rht", "--stochastic", "--seed", "7", "--out", d, "-q"}).exit_code, 0);
  ASSERT_EQ(run_tool({in, "--format", "nvfp4", "--rht", "--stochastic", "--seed", "7", "--out", e, "-q"}).exit_code, 0);
  EXPECT_TRUE(read_npy(d + ".codes.npy").bytes == read_npy(e + ".codes.npy").bytes);
}

// NaN and Inf inputs are allowed, with one warning line each on stderr; NVFP4 codes NaN as +6.
TEST(QuantizeTensor, NanAndInfWarn) {
  TempDir dir;
  std::vector<float> x = gaussian(16 * 64, 10);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  x[3] = nan;
  x[100] = nan;
  x[777] = -nan;
  const std::string in = write_f32(dir, "n.npy", {16, 64}, x);
  const std::string out = (dir.path() / "n").string();
  ProcessResult r = run_tool({in, "--format", "nvfp4", "--out", out, "-q"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  auto lines = test::split_lines(r.err);
  ASSERT_EQ(lines.size(), 1u) << r.err;
  EXPECT_NE(lines[0].find("warning"), std::string::npos);
  EXPECT_NE(lines[0].find("3 NaN"), std::string::npos) << lines[0];
  const NpyArray codes = read_npy(out + ".codes.npy");
  for (int64_t i : {3, 100, 777}) {
    const uint8_t byte = codes.bytes[static_cast<size_t>(i / 2)];
    EXPECT_EQ((i & 1) ? (byte >> 4) : (byte & 0xF), 7) << i;  // +6
  }
  // The amax ignores NaN.
  EXPECT_FALSE(std::isnan(first_f32(read_npy(out + ".amax.npy"))));

  x[5] = std::numeric_limits<float>::infinity();
  const std::string in2 = write_f32(dir, "i.npy", {16, 64}, x);
  r = run_tool({in2, "--format", "fp8_e4m3", "--out", out, "-q"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  lines = test::split_lines(r.err);
  ASSERT_EQ(lines.size(), 2u) << r.err;
  EXPECT_NE(lines[1].find("1 Inf"), std::string::npos) << lines[1];
}

TEST(QuantizeTensor, HelpExitsZero) {
  const ProcessResult r = run_tool({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  for (const char* needle : {"--format", "--out", "--block", "--rht", "--stochastic", "--seed", "--quiet",
                             "rounded to BF16", "round-to-nearest-even", "scales_swizzled", "rel_error"})
    EXPECT_NE(r.out.find(needle), std::string::npos) << needle;
}

// One failing run: non-zero exit (`code`), one stderr line with the needles, no PREFIX.* files.
void expect_failure(const TempDir& dir, const std::vector<std::string>& args, int code,
                    const std::vector<std::string>& needles) {
  SCOPED_TRACE(cmdline(args));
  const ProcessResult r = run_tool(args);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, code) << "stdout:\n" << r.out;
  const auto lines = test::split_lines(r.err);
  ASSERT_EQ(lines.size(), 1u) << "stderr:\n" << r.err;
  EXPECT_EQ(lines[0].rfind("quantize_tensor: error: ", 0), 0u) << lines[0];
  EXPECT_EQ(r.err.back(), '\n');
  for (const std::string& n : needles) EXPECT_NE(lines[0].find(n), std::string::npos) << "'" << n << "' not in: " << lines[0];
  EXPECT_EQ(r.out, "");
  EXPECT_TRUE(files_with_prefix(dir, "out").empty()) << "left behind: " << files_with_prefix(dir, "out")[0];
}

TEST(QuantizeTensor, Errors) {
  TempDir dir;
  const std::string out = (dir.path() / "out").string();
  const std::string good = write_f32(dir, "good.npy", {32, 64}, gaussian(32 * 64, 11));
  const std::string missing = (dir.path() / "missing.npy").string();
  expect_failure(dir, {missing, "--format", "nvfp4", "--out", out}, 1, {missing, "no such file"});
  const std::string garbage = dir.write("garbage.npy", "this is not a numpy file at all");
  expect_failure(dir, {garbage, "--format", "nvfp4", "--out", out}, 1, {garbage, "bad magic"});
  const std::string three_d = (dir.path() / "cube.npy").string();
  const std::vector<float> cube(2 * 16 * 16, 1.0f);
  write_npy(three_d, "<f4", {2, 16, 16}, cube.data(), cube.size() * 4);
  expect_failure(dir, {three_d, "--format", "nvfp4", "--out", out}, 1, {three_d, "3-D"});
  const std::string u8 = (dir.path() / "u8.npy").string();
  const std::vector<uint8_t> bytes(32 * 32, 1);
  write_npy(u8, "|u1", {32, 32}, bytes.data(), bytes.size());
  expect_failure(dir, {u8, "--format", "nvfp4", "--out", out}, 1, {u8, "'|u1'"});
  const std::string narrow = write_f32(dir, "narrow.npy", {32, 40}, gaussian(32 * 40, 12));
  expect_failure(dir, {narrow, "--format", "nvfp4", "--out", out}, 1, {"columns", "16", "40"});
  const std::string w48 = write_f32(dir, "w48.npy", {32, 48}, gaussian(32 * 48, 13));
  expect_failure(dir, {w48, "--format", "mxfp8", "--out", out}, 1, {"columns", "32", "48"});
  const std::string r20 = write_f32(dir, "r20.npy", {20, 32}, gaussian(20 * 32, 14));
  expect_failure(dir, {r20, "--format", "nvfp4", "--block", "16x16", "--out", out}, 1, {"rows", "16", "20"});
  expect_failure(dir, {good, "--format", "mxfp8", "--rht", "--out", out}, 1, {"--rht", "mxfp8"});
  expect_failure(dir, {good, "--format", "fp8_e4m3", "--stochastic", "--seed", "1", "--out", out}, 1,
                 {"--stochastic", "fp8_e4m3"});
  expect_failure(dir, {good, "--format", "mxfp8", "--block", "1x16", "--out", out}, 1, {"--block", "mxfp8"});
  expect_failure(dir, {good, "--format", "nvfp4", "--rht", "--block", "16x16", "--out", out}, 1,
                 {"--rht", "16x16"});
  expect_failure(dir, {good, "--format", "nvfp4", "--stochastic", "--out", out}, 1, {"--stochastic", "--seed"});
  expect_failure(dir, {good, "--format", "nvfp4", "--seed", "3", "--out", out}, 1, {"--seed", "--stochastic"});
  const std::string no_dir = (dir.path() / "no_such_dir" / "out").string();
  expect_failure(dir, {good, "--format", "nvfp4", "--out", no_dir}, 1, {"--out", "does not exist"});
  // A failure while writing (the last output's name is taken by a directory) removes the outputs
  // already written: only that directory remains.
  std::filesystem::create_directory(out + ".dequant.npy");
  {
    const ProcessResult r = run_tool({good, "--format", "nvfp4", "--out", out});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(test::split_lines(r.err).size(), 1u) << r.err;
    EXPECT_NE(r.err.find(out + ".dequant.npy"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("not a regular file"), std::string::npos) << r.err;
    EXPECT_EQ(files_with_prefix(dir, "out"), (std::vector<std::string>{"out.dequant.npy"}));
  }
  std::filesystem::remove(out + ".dequant.npy");
  // Command-line errors: exit 2.
  expect_failure(dir, {good, "--format", "nvfp5", "--out", out}, 2, {"--format", "nvfp5"});
  expect_failure(dir, {good, "--format", "nvfp4", "--block", "32x32", "--out", out}, 2, {"--block", "32x32"});
  expect_failure(dir, {good, "--format", "nvfp4"}, 2, {"--out"});
  expect_failure(dir, {good, "--out", out}, 2, {"--format"});
  expect_failure(dir, {good, "--format", "nvfp4", "--out", out, "--bogus"}, 2, {"--bogus"});
  expect_failure(dir, {good, "--format", "nvfp4", "--stochastic", "--seed", "abc", "--out", out}, 2, {"abc"});
}

// The outputs are published as one set (io/atomic_file.h FileSet): a failed or killed run never
// loses or mixes the previous outputs.

std::map<std::string, std::string> outputs_of(const TempDir& dir, const std::string& stem) {
  std::map<std::string, std::string> out;
  for (const std::string& name : files_with_prefix(dir, stem))
    out[name] = test::read_text_file((dir.path() / name).string());
  return out;
}

void expect_one_line_error_exit(const ProcessResult& r, const std::vector<std::string>& needles) {
  EXPECT_EQ(r.exit_code, 1) << r.err;
  const auto lines = test::split_lines(r.err);
  ASSERT_EQ(lines.size(), 1u) << r.err;
  EXPECT_EQ(lines[0].rfind("quantize_tensor: error: ", 0), 0u) << lines[0];
  for (const std::string& n : needles) EXPECT_NE(lines[0].find(n), std::string::npos) << n << " not in " << lines[0];
}

TEST(QuantizeTensor, AFailedRunLeavesThePreviousOutputsByteIdentical) {
  TempDir dir;
  const std::string out = (dir.path() / "out").string();
  const std::string x = write_f32(dir, "x.npy", {kRows, kCols}, gaussian(kRows * kCols, 21));
  const std::string y = write_f32(dir, "y.npy", {kRows, kCols}, gaussian(kRows * kCols, 22));
  ASSERT_EQ(run_tool({x, "--format", "nvfp4", "--out", out}).exit_code, 0);
  const auto before = outputs_of(dir, "out");
  ASSERT_EQ(before.size(), 5u);
  for (const char* point : {"0", "3", "5"}) {
    SCOPED_TRACE(point);
    ProcessResult r;
    {
      ScopedEnv fail("PL_TEST_PUBLISH_FAIL_AT", point);
      r = run_tool({y, "--format", "mxfp8", "--out", out}, kToolWithTestHooks);
    }
    expect_one_line_error_exit(r, {"forced failure", "rolled back"});
    EXPECT_EQ(outputs_of(dir, "out"), before);
  }
  {
    // A full disk: the 128 KB codes.npy cannot be written (files limited to 64 KB).
    ProcessResult r;
    {
      FileSizeLimit full(64 << 10);
      r = run_tool({y, "--format", "mxfp8", "--out", out});
    }
    expect_one_line_error_exit(r, {out + ".codes.npy.tmp-", "File too large"});
    EXPECT_EQ(outputs_of(dir, "out"), before);
  }
}

TEST(QuantizeTensor, AKilledRunIsRecoveredByTheNextAndNoOldOutputIsLeftBesideNewOnes) {
  TempDir dir;
  const std::string out = (dir.path() / "out").string();
  const std::string x = write_f32(dir, "x.npy", {kRows, kCols}, gaussian(kRows * kCols, 31));
  ASSERT_EQ(run_tool({x, "--format", "nvfp4", "--out", out}).exit_code, 0);
  const auto nvfp4 = outputs_of(dir, "out");
  {
    // fp8_e4m3 writes no scales_swizzled.npy: the old one is removed in the same publish. Killed
    // after two of its files are renamed.
    ScopedEnv kill("PL_TEST_PUBLISH_KILL_AT", "2");
    EXPECT_EQ(run_tool({x, "--format", "fp8_e4m3", "--out", out}, kToolWithTestHooks).exit_code, 128 + SIGKILL);
  }
  EXPECT_TRUE(std::filesystem::exists(out + ".publish-journal"));
  const ProcessResult r = run_tool({x, "--format", "fp8_e4m3", "--out", out, "--quiet"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto err = test::split_lines(r.err);
  ASSERT_EQ(err.size(), 1u) << r.err;
  EXPECT_EQ(err[0].rfind("quantize_tensor: " + out + ".publish-journal: completed the interrupted publish", 0), 0u)
      << err[0];
  EXPECT_EQ(files_with_prefix(dir, "out").size(), 4u);  // codes, scales, amax, dequant: nothing else
  EXPECT_FALSE(std::filesystem::exists(out + ".scales_swizzled.npy"));
  EXPECT_NE(outputs_of(dir, "out").at("out.codes.npy"), nvfp4.at("out.codes.npy"));
  EXPECT_EQ(read_npy(out + ".scales.npy").dtype, "<f4");
}

}  // namespace
}  // namespace pl
