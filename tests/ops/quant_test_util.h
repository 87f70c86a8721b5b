#pragma once
// The quantize cases shared by tests/ops/test_quantize.cpp, test_dequantize.cpp and
// test_quant_stats.cpp (one table, so the three ops run the same cases on every backend), the inputs
// they are made of, an independent per-element decoder of a copy (the reference of dequantize and
// quant_stats), and the byte/float comparisons of a CPU copy with a GPU one.
// Inputs: BF16 Gaussians with outliers, an all-zero 32x32 corner (all-zero 1x16, 16x16 and 1x32
// blocks in both copies) and a region scaled by 1e-7 (block scales that underflow to zero); plain
// FP32 values; NaN/±Inf/-0/subnormal/huge values sprinkled over the BF16 input; all-zero tensors.
// Shapes are odd on purpose (partial 64x64 tiles, scale padding, fewer rows than a tile).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/quantize.h"
#include "matrix_util.h"
#include "numerics/bf16.h"
#include "numerics/hadamard.h"
#include "op_test_util.h"

namespace pl::qtest {

using optest::cpu_ctx;
using test::Mat;

// BF16 Gaussians with outliers, a zero corner and a tiny region (see the file comment).
inline Mat test_input(int64_t rows, int64_t cols, uint32_t seed) {
  Mat m = test::random_bf16(rows, cols, seed, 1.0f, 8);
  for (int64_t r = 0; r < std::min<int64_t>(rows, 32); ++r)
    for (int64_t c = 0; c < std::min<int64_t>(cols, 32); ++c) m.v[r * cols + c] = 0.0f;
  for (int64_t r = 32; r < std::min<int64_t>(rows, 48); ++r)
    for (int64_t c = 32; c < std::min<int64_t>(cols, 64); ++c)
      m.v[r * cols + c] = num::round_bf16(m.v[r * cols + c] * 1e-7f);
  return m;
}

// Plain FP32 values (not BF16-representable), for the F32-input path.
inline Mat f32_input(int64_t rows, int64_t cols, uint32_t seed) {
  Mat m(rows, cols);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& x : m.v) x = nd(rng);
  m.v[static_cast<size_t>(rng() % m.v.size())] = 57.0f;
  return m;
}

// NaN, +-Inf, -0, BF16 subnormals and huge values sprinkled over a BF16 input (all BF16 values, NaN
// as the canonical BF16 NaN the device holds).
inline Mat special_input(int64_t rows, int64_t cols, uint32_t seed) {
  Mat m = test_input(rows, cols, seed);
  const float specials[] = {num::round_bf16(NAN), INFINITY, -INFINITY, -0.0f, 1e-39f, -3e-40f, 3.0e38f, -2.5e38f};
  std::mt19937 rng(seed + 1);
  for (int i = 0; i < 24; ++i) m.v[rng() % m.v.size()] = num::round_bf16(specials[i % 8]);
  // one whole 16-run of -0 in row 40 (codes 8)
  if (rows > 40 && cols >= 16)
    for (int64_t c = 0; c < 16; ++c) m.v[40 * cols + c] = -0.0f;
  return m;
}

inline QuantizeOptions options(QuantFormat f, bool rowwise, bool columnwise) {
  QuantizeOptions o;
  o.format = f;
  o.rowwise = rowwise;
  o.columnwise = columnwise;
  return o;
}

// One quantize case: the input, the options, and the dtype the GPU holds the input in (the CPU
// always takes the same values as F32).
struct QuantCase {
  std::string group;  // the quantize test that owns the case (its GPU byte-exactness check)
  Mat x;
  QuantizeOptions o;
  DType dtype = DType::BF16;
  std::string name() const {
    return group + ": " + quant_format_name(o.format) + " x[" + std::to_string(x.rows) + ", " +
           std::to_string(x.cols) + "] " + dtype_name(dtype) + (o.rowwise ? " rowwise" : "") +
           (o.columnwise ? " columnwise" : "") + (o.block_2d ? " 2d" : "") + (o.rht_columnwise ? " rht" : "") +
           (o.stochastic ? " sr counter " + std::to_string(o.counter) : "");
  }
};

// Every case, grouped by the quantize test that owns it.
inline std::vector<QuantCase> quant_cases() {
  std::vector<QuantCase> all;
  auto add = [&](const char* g, const Mat& x, const QuantizeOptions& o, DType dt = DType::BF16) {
    all.push_back(QuantCase{g, x, o, dt});
  };
  using F = QuantFormat;
  // NVFP4 1x16 RN: full 64x64 tiles; partial tiles with scale padding in rows and columns; fewer rows
  // than a tile.
  for (auto [r, c] : {std::pair<int64_t, int64_t>{256, 128}, {96, 160}, {7, 64}, {130, 208}})
    add("nvfp4 rowwise", test_input(r, c, static_cast<uint32_t>(r * 1000 + c)), options(F::NVFP4, true, false));
  // NVFP4 stochastic rounding in both copies; both halves of the counter matter.
  for (bool rht : {false, true}) {
    QuantizeOptions o = options(F::NVFP4, true, true);
    o.stochastic = true;
    o.rht_columnwise = rht;
    o.seed = 0x0123456789ABCDEFull;
    o.stream_id = 5;
    o.counter = (1ull << 33) + 7;
    add("nvfp4 sr", test_input(96, 160, 11), o);
    o.counter = 8;
    add("nvfp4 sr", test_input(96, 160, 11), o);
  }
  // NVFP4 16x16 tiles (stochastic is ignored for them, as on the CPU).
  for (auto [r, c] : {std::pair<int64_t, int64_t>{80, 96}, {128, 256}, {48, 16}})
    for (auto [row, col] : {std::pair<bool, bool>{true, true}, {true, false}, {false, true}}) {
      QuantizeOptions o = options(F::NVFP4, row, col);
      o.block_2d = true;
      o.stochastic = true;
      add("nvfp4 2d", test_input(r, c, static_cast<uint32_t>(r + c)), o);
    }
  // NVFP4 columnwise with and without RHT: alone, with the rowwise copy, x's column count free.
  for (bool rht : {false, true}) {
    QuantizeOptions o = options(F::NVFP4, false, true);
    o.rht_columnwise = rht;
    add("nvfp4 columnwise", test_input(112, 48, 21), o);
    o.rowwise = true;
    add("nvfp4 columnwise", test_input(112, 48, 21), o);
    QuantizeOptions oc = options(F::NVFP4, false, true);
    oc.rht_columnwise = rht;
    add("nvfp4 columnwise", test_input(64, 37, 22), oc);
    add("nvfp4 columnwise", test_input(256, 192, 23), o);
  }
  {  // NVFP4 special values, F32 inputs, zeros
    QuantizeOptions o = options(F::NVFP4, true, true);
    o.rht_columnwise = true;
    add("nvfp4 special", special_input(96, 160, 31), o);
    o.stochastic = true;
    add("nvfp4 special", special_input(96, 160, 31), o);
    add("nvfp4 special", f32_input(64, 96, 32), o, DType::F32);
    o.rht_columnwise = false;
    o.stochastic = false;
    add("nvfp4 special", f32_input(64, 96, 32), o, DType::F32);
    o.block_2d = true;
    add("nvfp4 special", f32_input(64, 96, 32), o, DType::F32);
    add("nvfp4 special", Mat(32, 64, 0.0f), options(F::NVFP4, true, true));
  }
  // MXFP8 both copies; rows need not be a multiple of 32 without the columnwise copy.
  for (auto [r, c] : {std::pair<int64_t, int64_t>{96, 160}, {64, 64}, {32, 96}, {256, 320}})
    add("mxfp8", test_input(r, c, static_cast<uint32_t>(7 * r + c)), options(F::MXFP8, true, true));
  add("mxfp8", test_input(40, 64, 41), options(F::MXFP8, true, false));
  add("mxfp8", test_input(64, 40, 42), options(F::MXFP8, false, true));
  add("mxfp8", special_input(64, 96, 43), options(F::MXFP8, true, true));
  add("mxfp8", f32_input(64, 96, 44), options(F::MXFP8, true, true), DType::F32);
  // FP8 per tensor, E4M3 and E5M2; an all-zero tensor (amax 0: scale 1).
  for (F fmt : {F::FP8_E4M3, F::FP8_E5M2}) {
    for (auto [r, c] : {std::pair<int64_t, int64_t>{37, 53}, {128, 192}, {1, 1}, {200, 72}})
      add("fp8", test_input(r, c, static_cast<uint32_t>(r * 3 + c)), options(fmt, true, true));
    add("fp8", test_input(65, 130, 51), options(fmt, true, false));
    add("fp8", test_input(65, 130, 51), options(fmt, false, true));
    add("fp8", special_input(64, 80, 52), options(fmt, true, true));
    add("fp8", f32_input(48, 80, 53), options(fmt, true, true), DType::F32);
    add("fp8", Mat(16, 16, 0.0f), options(fmt, true, true));
  }
  return all;
}

inline std::vector<QuantCase> quant_cases(const std::string& group) {
  std::vector<QuantCase> all = quant_cases(), some;
  for (QuantCase& c : all)
    if (c.group == group) some.push_back(std::move(c));
  return some;
}

// ---- a case quantized on one backend -----------------------------------------------------------------

// The case's quantized tensor on `device` (the GPU's buffers poisoned first, so that anything its
// kernels leave unwritten shows), its input there, and the values each copy was quantized from:
// x, and xᵀ or RHT(xᵀ) (columnwise_source on that backend).
struct Quantized {
  std::vector<Buffer> owner;
  QuantizedTensor q;
  test::DeviceTensor x_dev, col_src_dev;  // the GPU's input and columnwise source
  Mat col_src{0, 0};                      // the CPU's columnwise source
  Tensor x, src_col;                      // the input and columnwise source on the backend
  const Tensor& source(bool columnwise) const { return columnwise ? src_col : x; }
};

// Junk in every byte of a GPU copy, so that anything the kernels fail to write shows up.
inline void poison(const QuantizedCopy& c) {
  for (const Tensor* t : {&c.data, &c.scales, &c.scales_swizzled, &c.amax, &c.scale_inv}) {
    if (t->data == nullptr) continue;
    std::vector<uint8_t> junk(t->bytes(), 0xA5);
    copy_from_host(*t, junk.data());
  }
}

inline void quantize_case(Quantized& out, QuantCase& qc, Device device) {
  const QuantizeOptions& o = qc.o;
  out.q = allocate_quantized(out.owner, device, o.format, qc.x.rows, qc.x.cols, o.rowwise, o.columnwise);
  if (device == Device::CUDA) {
    if (o.rowwise) poison(out.q.rowwise);
    if (o.columnwise) poison(out.q.columnwise);
    out.x_dev = test::to_device(qc.x.v, {qc.x.rows, qc.x.cols}, qc.dtype);
    out.x = out.x_dev.t;
    quantize(test::cuda_ctx(), out.q, out.x, o);
    if (!o.columnwise) return;
    out.col_src_dev = test::device_tensor({qc.x.cols, qc.x.rows}, DType::F32);
    out.src_col = out.col_src_dev.t;
    columnwise_source(test::cuda_ctx(), out.src_col, out.x, out.q.columnwise_rht);
  } else {
    out.x = qc.x.t();
    quantize(cpu_ctx(true), out.q, out.x, o);
    if (!o.columnwise) return;
    out.col_src = Mat(qc.x.cols, qc.x.rows);
    out.src_col = out.col_src.t();
    columnwise_source(cpu_ctx(true), out.src_col, out.x, out.q.columnwise_rht);
  }
}

// The copies the case made: {copy, is columnwise, name}.
inline std::vector<std::pair<const QuantizedCopy*, bool>> made_copies(const Quantized& q, const QuantizeOptions& o) {
  std::vector<std::pair<const QuantizedCopy*, bool>> r;
  if (o.rowwise) r.emplace_back(&q.q.rowwise, false);
  if (o.columnwise) r.emplace_back(&q.q.columnwise, true);
  return r;
}

// Host floats of a tensor on either backend.
inline std::vector<float> floats_of(const Tensor& t) {
  if (t.device == Device::CUDA) return test::to_host_floats(t);
  const float* p = t.f32();
  return std::vector<float>(p, p + t.numel());
}

// ---- an independent decoder of a copy ----------------------------------------------------------------
// Straight from the format definitions (SPEC-NVFP4 §1-§3), not through lib/numerics' decoders.

inline float ref_e2m1(uint8_t code) {
  static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float v = mag[code & 7];
  return (code & 8) ? -v : v;
}
inline float ref_e4m3(uint8_t b) {  // bias 7, no infinities, S.1111.111 is NaN
  const int e = (b >> 3) & 0xF, m = b & 7;
  if (e == 0xF && m == 7) return NAN;
  const float v = e == 0 ? std::ldexp(static_cast<float>(m), -9) : std::ldexp(1.0f + m / 8.0f, e - 7);
  return (b & 0x80) ? -v : v;
}
inline float ref_e5m2(uint8_t b) {  // bias 15, IEEE-like
  const int e = (b >> 2) & 0x1F, m = b & 3;
  float v;
  if (e == 0x1F)
    v = m ? NAN : INFINITY;
  else
    v = e == 0 ? std::ldexp(static_cast<float>(m), -16) : std::ldexp(1.0f + m / 4.0f, e - 15);
  return (b & 0x80) ? -v : v;
}
inline float ref_ue8m0(uint8_t e) { return e == 0xFF ? NAN : std::ldexp(1.0f, e - 127); }  // 2^-127 for 0

// The element's code, decoded without any scale.
inline float ref_code_value(const QuantizedCopy& c, int64_t r, int64_t k) {
  if (c.format == QuantFormat::NVFP4) {
    const uint8_t byte = c.data.u8()[r * (c.cols / 2) + k / 2];
    return ref_e2m1((k & 1) ? (byte >> 4) : (byte & 0xF));
  }
  const uint8_t b = c.data.u8()[r * c.cols + k];
  return c.format == QuantFormat::FP8_E5M2 ? ref_e5m2(b) : ref_e4m3(b);
}
// The largest code magnitude of the format.
inline float ref_code_max(QuantFormat f) {
  return f == QuantFormat::NVFP4 ? 6.0f : (f == QuantFormat::FP8_E5M2 ? 57344.0f : 448.0f);
}
inline uint8_t block_scale_byte(const QuantizedCopy& c, int64_t r, int64_t k) {
  const int64_t blk = quant_block_size(c.format);
  return c.scales.u8()[r * (c.cols / blk) + k / blk];
}

// The exact dequantized values of a CPU copy, block by block: NVFP4 code · (f32(E4M3 scale · amax) ·
// f32(1/2688)) (TE's dequantize), MXFP8 code · 2^(e-127), FP8 code · scale_inv.
inline std::vector<float> reference_dequantize(const QuantizedCopy& c) {
  std::vector<float> out(static_cast<size_t>(c.rows * c.cols));
  const int64_t blk = quant_block_size(c.format);
  const float rcp2688 = 1.0f / 2688.0f;
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t k0 = 0; k0 < c.cols; k0 += blk) {
      float factor = 0.0f;
      switch (c.format) {
        case QuantFormat::NVFP4: factor = (ref_e4m3(block_scale_byte(c, r, k0)) * c.amax.f32()[0]) * rcp2688; break;
        case QuantFormat::MXFP8: factor = ref_ue8m0(block_scale_byte(c, r, k0)); break;
        default: factor = c.scale_inv.f32()[0];
      }
      for (int64_t k = k0; k < k0 + blk; ++k) out[r * c.cols + k] = ref_code_value(c, r, k) * factor;
    }
  return out;
}

// ---- comparisons --------------------------------------------------------------------------------------

inline std::vector<uint8_t> host_bytes(const Tensor& t) {
  if (t.data == nullptr) return {};
  const auto* p = static_cast<const uint8_t*>(t.data);
  return std::vector<uint8_t>(p, p + t.bytes());
}

inline std::vector<uint8_t> device_bytes(const Tensor& t) {
  if (t.data == nullptr) return {};
  return test::to_host_bytes(t);
}

inline void expect_same_bytes(const std::vector<uint8_t>& cpu, const std::vector<uint8_t>& gpu, const std::string& what) {
  ASSERT_EQ(cpu.size(), gpu.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < cpu.size(); ++i)
    if (cpu[i] != gpu[i] && bad++ == 0) first = i;
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << cpu.size() << " bytes differ, first at " << first
                     << " (cpu 0x" << std::hex << int{cpu[first]} << ", gpu 0x" << int{gpu[first]} << ")";
}

inline void expect_same_copy(const QuantizedCopy& cpu, const QuantizedCopy& gpu, const std::string& what) {
  expect_same_bytes(host_bytes(cpu.data), device_bytes(gpu.data), what + " codes");
  expect_same_bytes(host_bytes(cpu.scales), device_bytes(gpu.scales), what + " compact scales");
  expect_same_bytes(host_bytes(cpu.scales_swizzled), device_bytes(gpu.scales_swizzled), what + " swizzled scales");
  expect_same_bytes(host_bytes(cpu.amax), device_bytes(gpu.amax), what + " amax");
  expect_same_bytes(host_bytes(cpu.scale_inv), device_bytes(gpu.scale_inv), what + " scale_inv");
}

// Equal bits, or both NaN (NaN payloads differ between host and device arithmetic).
inline void expect_same_floats(const std::vector<float>& cpu, const std::vector<float>& gpu, const std::string& what) {
  ASSERT_EQ(cpu.size(), gpu.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const bool same = num::float_bits(cpu[i]) == num::float_bits(gpu[i]) || (std::isnan(cpu[i]) && std::isnan(gpu[i]));
    if (!same && bad++ == 0) first = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << cpu.size() << " values differ, first at " << first << " (cpu "
                     << cpu[first] << ", gpu " << gpu[first] << ")";
}

// The independent columnwise source of x [rows, cols]: xᵀ, each 16-chunk of its rows RHT'd when rht.
inline Mat reference_columnwise_source(const Mat& x, bool rht) {
  Mat t = test::transpose(x);
  if (rht)
    for (int64_t r = 0; r < t.rows; ++r)
      for (int64_t c = 0; c < t.cols; c += 16) {
        float in[16];
        std::copy_n(&t.v[r * t.cols + c], 16, in);
        num::rht16(in, &t.v[r * t.cols + c], num::kRhtSignMask);
      }
  return t;
}

}  // namespace pl::qtest
