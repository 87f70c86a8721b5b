// GPU conformance of the hand-written CUDA ops (backend/cuda/{embedding,rmsnorm,rope,swiglu,
// elementwise,cross_entropy,optimizer}.cu): each op against the CPU backend (ctx.device CPU,
// round_bf16 true, FP32 storage) on fresh random inputs — the seed comes from std::random_device, or
// from PL_TEST_SEED when set, and is printed with every failure. BF16 inputs are BF16-representable
// values, so both backends see the same numbers. Shapes are odd on purpose: T not a multiple of 32,
// widths not multiples of the block sizes, V not a multiple of the cross-entropy block stride.
// Compiled in every build; every test skips with the reason when there is no CUDA device.
//
// Exact (bit-for-bit) comparisons — the GPU runs the CPU's float operations in the CPU's order with
// FMA contraction off, through the shared numerics: add, rope (forward and backward), adamw_update and
// adamw_update_multi
// (master, m, v and param bits), copy_master_to_param, embedding forward (a copy), fill_zero, and also
// embedding backward (each dtable element gets the same fp32 additions in token order, see
// embedding.cu), sum_of_squares and rmsnorm forward/backward (rstd, out, dx, dw: the fp32 summation
// schedules of numerics/reduce.h, the same on both backends).
// Tolerance-based comparisons, each bound stated at its test: swiglu and cross-entropy (CUDA's
// expf/logf are within 1-2 ulp, not correctly rounded).
//
// "Adjacent bf16" bound used below: two bf16 roundings of fp32 values that differ by a few fp32 ulp are
// equal or neighbours, and neighbours differ by one bf16 ulp <= 2^-7 * max(|a|, |b|).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "core/error.h"
#include "core/tensor.h"
#include "cuda/cuda_test_util.h"
#include "numerics/bf16.h"

namespace pl {
namespace {

using test::cuda_ctx;
using test::DeviceTensor;
using test::host_view;
using test::to_device;
using test::to_device_i32;
using test::to_host_floats;

constexpr double kBf16Ulp = 0x1p-7;  // one bf16 ulp, relative to max(|a|, |b|)

OpContext cpu_ctx() { return OpContext{}; }  // device CPU, round_bf16 = true

// A fresh seed per test, reported with every failure of the test (SCOPED_TRACE at the call site).
uint32_t fresh_seed() {
  if (const char* s = std::getenv("PL_TEST_SEED")) return static_cast<uint32_t>(std::strtoul(s, nullptr, 10));
  return std::random_device{}();
}
#define PL_SEEDED_RNG(rng)                                                             \
  const uint32_t seed_ = fresh_seed();                                                 \
  SCOPED_TRACE("seed " + std::to_string(seed_) + " (rerun with PL_TEST_SEED=" +        \
               std::to_string(seed_) + ")");                                           \
  std::mt19937 rng(seed_)

std::vector<float> uniform_bf16(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = num::round_bf16(d(rng));
  return v;
}

std::vector<float> uniform_f32(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<int32_t> uniform_ids(size_t n, std::mt19937& rng, int32_t vocab) {
  std::uniform_int_distribution<int32_t> d(0, vocab - 1);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = d(rng);
  return v;
}

// Bit-for-bit equality of two float vectors (so -0 vs +0 and NaN payloads count).
void expect_bits_equal(const std::vector<float>& gpu, const std::vector<float>& cpu, const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < gpu.size(); ++i)
    if (num::float_bits(gpu[i]) != num::float_bits(cpu[i]) && bad++ == 0) first = i;
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << gpu.size() << " elements differ; first at " << first
                     << ": gpu " << gpu[first] << " cpu " << cpu[first];
}

// |gpu - cpu| <= rel * max(|gpu|, |cpu|) + abs_tol[i] for every element, and at most max_frac of the
// elements differ at all (the bounds allow a rounding to land on a neighbour; a systematic error
// that stays within them would still change many elements).
void expect_close(const std::vector<float>& gpu, const std::vector<float>& cpu, double rel,
                  const std::vector<double>& abs_tol, double max_frac, const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  ASSERT_EQ(abs_tol.size(), cpu.size()) << what;
  size_t differ = 0;
  for (size_t i = 0; i < gpu.size(); ++i) {
    const double a = gpu[i], b = cpu[i];
    if (num::float_bits(gpu[i]) != num::float_bits(cpu[i])) ++differ;
    const double tol = rel * std::max(std::abs(a), std::abs(b)) + abs_tol[i];
    if (!(std::abs(a - b) <= tol)) {
      ADD_FAILURE() << what << ": element " << i << ": gpu " << a << " cpu " << b << " (|diff| " << std::abs(a - b)
                    << " > tol " << tol << ")";
      return;
    }
  }
  EXPECT_LE(static_cast<double>(differ), max_frac * static_cast<double>(gpu.size()))
      << what << ": " << differ << " of " << gpu.size() << " elements differ";
}

void expect_close(const std::vector<float>& gpu, const std::vector<float>& cpu, double rel, double abs_tol,
                  double max_frac, const std::string& what) {
  expect_close(gpu, cpu, rel, std::vector<double>(cpu.size(), abs_tol), max_frac, what);
}

// Runs f, expects a pl::Error whose message contains every one of `parts`.
template <class F>
void expect_error(F&& f, std::initializer_list<const char*> parts) {
  try {
    f();
    ADD_FAILURE() << "expected an error containing '" << *parts.begin() << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const char* p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg;
  }
}

// ---- embedding -----------------------------------------------------------------------------------

TEST(CudaOps, EmbeddingForward) {
  PL_REQUIRE_CUDA_DEVICE();
  PL_SEEDED_RNG(rng);
  const int64_t T = 77, h = 45, V = 103;
  std::vector<float> table = uniform_bf16(V * h, rng, -1.0f, 1.0f);
  std::vector<int32_t> tokens = uniform_ids(T, rng, V);
  tokens[3] = tokens[50] = static_cast<int32_t>(V - 1);  // repeats and the last row
  std::vector<float> out(T * h);
  std::vector<int32_t> tok_host = tokens;
  embedding_forward(cpu_ctx(), host_view(out, {T, h}), Tensor(tok_host.data(), {T}, DType::I32), host_view(table, {V, h}));

  DeviceTensor d_out = test::device_tensor({T, h}, DType::BF16);
  DeviceTensor d_tok = to_device_i32(tokens, {T});
  DeviceTensor d_table = to_device(table, {V, h}, DType::BF16);
  embedding_forward(cuda_ctx(), d_out.t, d_tok.t, d_table.t);
  expect_bits_equal(to_host_floats(d_out.t), out, "embedding_forward out");

  // Ids are validated on the host (LlamaModel::upload_batch), not here: an out-of-range id is not an
  // error on the device, but it is never used as an address: its row comes out zero, the others exact.
  std::vector<int32_t> bad = tokens;
  bad[41] = static_cast<int32_t>(V);
  DeviceTensor d_bad = to_device_i32(bad, {T});
  embedding_forward(cuda_ctx(), d_out.t, d_bad.t, d_table.t);
  std::vector<float> expect = out;
  std::fill(expect.begin() + 41 * h, expect.begin() + 42 * h, 0.0f);
  expect_bits_equal(to_host_floats(d_out.t), expect, "embedding_forward out with an invalid id");
}

// Exact: every dtable element receives the CPU's fp32 additions in token order (stable sort of ids,
// one block per id walking its positions in order).
TEST(CudaOps, EmbeddingBackward) {
  PL_REQUIRE_CUDA_DEVICE();
  PL_SEEDED_RNG(rng);
  const int64_t T = 301, h = 333, V = 29;  // many repeats per id; h not a multiple of the block
  std::vector<int32_t> tokens = uniform_ids(T, rng, V);
  std::vector<float> dout = uniform_bf16(T * h, rng, -1.0f, 1.0f);
  std::vector<float> dtable = uniform_f32(V * h, rng, -0.5f, 0.5f);  // fp32 accumulator ("+=")
  std::vector<float> dtable_cpu = dtable;
  std::vector<int32_t> tok_host = tokens;
  embedding_backward(cpu_ctx(), host_view(dtable_cpu, {V, h}), host_view(dout, {T, h}),
                     Tensor(tok_host.data(), {T}, DType::I32));

  DeviceTensor d_dtable = to_device(dtable, {V, h}, DType::F32);
  DeviceTensor d_dout = to_device(dout, {T, h}, DType::BF16);
  DeviceTensor d_tok = to_device_i32(tokens, {T});
  embedding_backward(cuda_ctx(), d_dtable.t, d_dout.t, d_tok.t);
  expect_bits_equal(to_host_floats(d_dtable.t), dtable_cpu, "embedding_backward dtable");

  // Run twice more: still the CPU's result for the accumulated value (determinism across calls).
  embedding_backward(cpu_ctx(), host_view(dtable_cpu, {V, h}), host_view(dout, {T, h}),
                     Tensor(tok_host.data(), {T}, DType::I32));
  embedding_backward(cuda_ctx(), d_dtable.t, d_dout.t, d_tok.t);
  expect_bits_equal(to_host_floats(d_dtable.t), dtable_cpu, "embedding_backward dtable (second call)");

  // An invalid id (validated on the host in the model, not here) is skipped: its row adds nothing.
  std::vector<int32_t> bad = tokens;
  bad[7] = -3;
  DeviceTensor d_bad = to_device_i32(bad, {T});
  std::vector<float> dout_skip = dout;
  std::fill(dout_skip.begin() + 7 * h, dout_skip.begin() + 8 * h, 0.0f);  // token 7 contributes nothing
  std::vector<int32_t> tok_skip = tokens;  // any valid id: its contribution is zero
  embedding_backward(cpu_ctx(), host_view(dtable_cpu, {V, h}), host_view(dout_skip, {T, h}),
                     Tensor(tok_skip.data(), {T}, DType::I32));
  embedding_backward(cuda_ctx(), d_dtable.t, d_dout.t, d_bad.t);
  expect_bits_equal(to_host_floats(d_dtable.t), dtable_cpu, "embedding_backward dtable with an invalid id");
}

// ---- RMSNorm -------------------------------------------------------------------------------------

// Exact: Σx² in the CPU's fp32 lane/tree schedule (numerics/reduce.h), then the same correctly
// rounded division, sqrt and reciprocal, and the same elementwise expression.
TEST(CudaOps, RmsnormForward) {
  PL_REQUIRE_CUDA_DEVICE();
  PL_SEEDED_RNG(rng);
  const int64_t T = 67, h = 333;
  const float eps = 1e-5f;
  std::vector<float> x = uniform_bf16(T * h, rng, -2.0f, 2.0f);
  std::vector<float> w = uniform_bf16(h, rng, 0.5f, 1.5f);
  std::vector<float> out(T * h), rstd(T);
  rmsnorm_forward(cpu_ctx(), host_view(out, {T, h}), host_view(rstd, {T}), host_view(x, {T, h}), host_view(w, {h}), eps);

  DeviceTensor d_out = test::device_tensor({T, h}, DType::BF16);
  DeviceTensor d_rstd = test::device_tensor({T}, DType::F32);
  DeviceTensor d_x = to_device(x, {T, h}, DType::BF16);
  DeviceTensor d_w = to_device(w, {h}, DType::BF16);
  rmsnorm_forward(cuda_ctx(), d_out.t, d_rstd.t, d_x.t, d_w.t, eps);
  expect_bits_equal(to_host_floats(d_rstd.t), rstd, "rmsnorm_forward rstd");
  expect_bits_equal(to_host_floats(d_out.t), out, "rmsnorm_forward out");
}

// Exact: Σ (g w) x in the CPU's fp32 lane/tree schedule and the same dx expression; dw: the same
// sequential fp32 sums over token chunks of 128 and the same tree over the chunks.
TEST(CudaOps, RmsnormBackward) {
  PL_REQUIRE_CUDA_DEVICE();
  PL_SEEDED_RNG(rng);
  const int64_t T = 301, h = 333;  // 3 token chunks of the dw reduction (a 3-leaf tree), the last one partial
  std::vector<float> x = uniform_bf16(T * h, rng, -2.0f, 2.0f);
  std::vector<float> w = uniform_bf16(h, rng, 0.5f, 1.5f);
  std::vector<float> g = uniform_bf16(T * h, rng, -1.0f, 1.0f);
  std::vector<float> dx0 = uniform_bf16(T * h, rng, -1.0f, 1.0f);  // "+=": a residual gradient
  std::vector<float> dw0 = uniform_f32(h, rng, -1.0f, 1.0f);
  std::vector<float> out(T * h), rstd(T);
  rmsnorm_forward(cpu_ctx(), host_view(out, {T, h}), host_view(rstd, {T}), host_view(x, {T, h}), host_view(w, {h}),
                  1e-5f);
  std::vector<float> dx = dx0, dw = dw0;
  rmsnorm_backward(cpu_ctx(), host_view(dx, {T, h}), host_view(dw, {h}), host_view(g, {T, h}), host_view(x, {T, h}),
                   host_view(w, {h}), host_view(rstd, {T}));

  DeviceTensor d_dx = to_device(dx0, {T, h}, DType::BF16);
  DeviceTensor d_dw = to_device(dw0, {h}, DType::F32);
  DeviceTensor d_g = to_device(g, {T, h}, DType::BF16);
  DeviceTensor d_x = to_device(x, {T, h}, DType::BF16);
  DeviceTensor d_w = to_device(w, {h}, DType::BF16);
  DeviceTensor d_rstd = to_device(rstd, {T}, DType::F32);
  rmsnorm_backward(cuda_ctx(), d_dx.t, d_dw.t, d_g.t, d_x.t, d_w.t, d_rstd.t);
  expect_bits_equal(to_host_floats(d_dx.t), dx, "rmsnorm_backward dx");
  expect_bits_equal(to_host_floats(d_dw.t), dw, "rmsnorm_backward dw");
}

// ---- RoPE ----------------------------------------------------------------------------------------

struct RopeCase {
  int64_t B = 3, S = 37, nq = 3, nkv = 1, d = 10;  // half = 5 (odd); T = 111
  int64_t T() const { return B * S; }
  int64_t width() const { return (nq + 2 * nkv) * d; }
};

void rope_tables(const RopeCase& c, std::vector<float>& cos_t, std::vector<float>& sin_t) {
  const int64_t half = c.d / 2;
  cos_t.resize(c.S * half);
  sin_t.resize(c.S * half);
  for (int64_t p = 0; p < c.S; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const double a = p * std::pow(500000.0, -2.0 * i / c.d);
      cos_t[p * half + i] = static_cast<float>(std::cos(a));
      sin_t[p * half + i] = static_cast<float>(std::sin(a));
    }
}

void rope_case(bool forward) {
  PL_SEEDED_RNG(rng);
  const RopeCase c;
  const int64_t T = c.T(), W = c.width(), rotated = c.nq + c.nkv;
  std::vector<float> cos_t, sin_t;
  rope_tables(c, cos_t, sin_t);
  std::vector<float> qkv = uniform_bf16(T * W, rng, -3.0f, 3.0f);
  std::vector<float> cpu = qkv;
  DeviceTensor d_qkv = to_device(qkv, {T, W}, DType::BF16);
  DeviceTensor d_cos = to_device(cos_t, {c.S, c.d / 2}, DType::F32);
  DeviceTensor d_sin = to_device(sin_t, {c.S, c.d / 2}, DType::F32);
  if (forward) {
    rope_forward(cpu_ctx(), host_view(cpu, {T, W}), host_view(cos_t, {c.S, c.d / 2}), host_view(sin_t, {c.S, c.d / 2}),
                 c.S, rotated, c.d);
    rope_forward(cuda_ctx(), d_qkv.t, d_cos.t, d_sin.t, c.S, rotated, c.d);
  } else {
    rope_backward(cpu_ctx(), host_view(cpu, {T, W}), host_view(cos_t, {c.S, c.d / 2}),
                  host_view(sin_t, {c.S, c.d / 2}), c.S, rotated, c.d);
    rope_backward(cuda_ctx(), d_qkv.t, d_cos.t, d_sin.t, c.S, rotated, c.d);
  }
  // The whole row, so the v heads (not rotated) are checked to be untouched too.
  expect_bits_equal(to_host_floats(d_qkv.t), cpu, forward ? "rope_forward qkv" : "rope_backward dqkv");
}

TEST(CudaOps, RopeForward) {
  PL_REQUIRE_CUDA_DEVICE();
  rope_case(true);
}

TEST(CudaOps, RopeBackward) {
  PL_REQUIRE_CUDA_DEVICE();
  rope_case(false);
}

// ---- SwiGLU --------------------------------------------------------------------------------------

// Tolerance. The same fp32 expressions as the CPU except exp: CUDA's expf is within 2 ulp, glibc's
// within 0.5 ulp, so each fp32 result is within a few ulp of the CPU's and its bf16 rounding is the
// same or the adjacent value: |diff| <= 2^-7 max(|a|,|b|), at most 1% of the elements differing.
TEST(CudaOps, SwigluForward) {
  PL_REQUIRE_CUDA_DEVICE();
  PL_SEEDED_RNG(rng);
  const int64_t T = 57, f = 219;
  std::vector<float> fc1 = uniform_bf16(T * 2 * f, rng, -6.0f, 6.0f);
  std::vector<float> out(T * f);
  swiglu_forward(cpu_ctx(), host_view(out, {T, f}), host_view(fc1, {T, 2 * f}));
  DeviceTensor d_out = test::device_tensor({T, f}, DType::BF16);
  DeviceTensor d_fc1 = to_device(fc1, {T, 2 * f}, DType::BF16);
  swiglu_forward(cuda_ctx(), d_out.t, d_fc1.t);
  expect_close(to_host_floats(d_out.t), out, kBf16Ulp, 0.0, 0.01, "swiglu_forward out");
}

// Tolerance. As the forward, plus: d silu/dg = sig (1 + g (1 - sig)) cancels near g = -1.28, where a
// 2-ulp exp difference moves the factor by ~|g| 2^-22 absolute; times |dout·up| <= 2 that is < 1e-6.
// |diff| <= 2^-7 max(|a|,|b|) + 1e-6, at most 1% of the elements differing.
TEST(CudaOps, SwigluBackward) {
  PL_REQUIRE_CUDA_DEVICE();
  PL_SEEDED_RNG(rng);
  const int64_t T = 57, f = 219;
  std::vector<float> fc1 = uniform_bf16(T * 2 * f, rng, -6.0f, 6.0f);
  std::vector<float> dout = uniform_bf16(T * f, rng, -1.0f, 1.0f);
  std::vector<float> dfc1(T * 2 * f);
  swiglu_backward(cpu_ctx(), host_view(dfc1, {T, 2 * f}), host_view(dout, {T, f}), host_view(fc1, {T, 2 * f}));
  DeviceTensor d_dfc1 = test::device_tensor({T, 2 * f}, DType::BF16);
  DeviceTensor d_dout = to_device(dout, {T, f}, DType::BF16);
  DeviceTensor d_fc1 = to_device(fc1, {T, 2 * f}, DType::BF16);
  swiglu_backward(cuda_ctx(), d_dfc1.t, d_dout.t, d_fc1.t);
  expect_close(to_host_floats(d_dfc1.t), dfc1, kBf16Ulp, 1e-6, 0.01, "swiglu_backward dfc1");
}

// ---- elementwise ---------------------------------------------------------------------------------

TEST(CudaOps, Add) {
  PL_REQUIRE_CUDA_DEVICE();
  PL_SEEDED_RNG(rng);
  const int64_t R = 37, C = 29;
  std::vector<float> a = uniform_bf16(R * C, rng, -4.0f, 4.0f);
  std::vector<float> b = uniform_bf16(R * C, rng, -4.0f, 4.0f);
  b[0] = -a[0];  // an exact zero
  std::vector<float> out(R * C);
  add(cpu_ctx(), host_view(out, {R, C}), host_view(a, {R, C}), host_view(b, {R, C}));
  DeviceTensor d_out = test::device_tensor({R, C}, DType::BF16);
  DeviceTensor d_a = to_device(a, {R, C}, DType::BF16);
  DeviceTensor d_b = to_device(b, {R, C}, DType::BF16);
  add(cuda_ctx(), d_out.t, d_a.t, d_b.t);
  expect_bits_equal(to_host_floats(d_out.t), out, "add out");
  add(cuda_ctx(), d_a.t, d_a.t, d_b.t);  // out aliases a (the residual update)
  expect_bits_equal(to_host_floats(d_a.t), out, "add out aliasing a");

  DeviceTensor d_f32 = to_device(a, {R, C}, DType::F32);
  expect_error([&] { add(cuda_ctx(), d_out.t, d_f32.t, d_b.t); }, {"add", "a [37, 29] f32", "bf16"});
}

TEST(CudaOps, FillZero) {
  PL_REQUIRE_CUDA_DEVICE();
  PL_SEEDED_RNG(rng);
  const int64_t n = 1237;
  std::vector<float> ones(n, 1.5f);
  for (DType dt : {DType::F32, DType::BF16}) {
    DeviceTensor d = to_device(ones, {n}, dt);
    fill_zero(cuda_ctx(), d.t);
    for (uint8_t byte : test::to_host_bytes(d.t)) ASSERT_EQ(byte, 0) << dtype_name(dt);
  }
  std::vector<int32_t> ids = uniform_ids(n, rng, 1000);
  DeviceTensor di = to_device_i32(ids, {n});
  fill_zero(cuda_ctx(), di.t);
  for (uint8_t byte : test::to_host_bytes(di.t)) ASSERT_EQ(byte, 0) << "i32";
}

// ---- cross-entropy -------------------------------------------------------------------------------

// Tolerance. Both sides take the same fp32 max and exponentials of the same arguments, summed in the
// same fp32 lane/tree schedule: each CUDA expf is within 2 ulp of the value (glibc's within 0.5), so
// Σ agrees to ~3 ulp relative (plus the rare rounding of a lane sum to a neighbour), log(Σ) to 3·2^-24 absolute plus one ulp of CUDA's logf (<= 1 ulp) and of the final
// subtraction: |loss diff| <= 1e-5 max(1, |loss|) (about 10x slack). Gradients: p = e (1/Σ) within a
// few ulp on both sides, so bf16(grad_scale (p - onehot)) is the same or adjacent, except that p - 1
// cancels near p = 1 (absolute error a few 2^-24): |diff| <= 2^-7 max(|a|,|b|) + 1e-6 grad_scale, at
// most 1% of the elements differing.
void cross_entropy_case(int64_t T, int64_t V, float spread, std::mt19937& rng) {
  SCOPED_TRACE("T = " + std::to_string(T) + ", V = " + std::to_string(V));
  std::vector<float> logits = uniform_bf16(T * V, rng, -spread, spread);
  std::vector<int32_t> targets = uniform_ids(T, rng, static_cast<int32_t>(V));
  targets[0] = static_cast<int32_t>(V - 1);
  // One confident row (p(target) near 1) to exercise the p - 1 cancellation.
  logits[1 * V + targets[1]] = num::round_bf16(spread + 20.0f);
  const float grad_scale = 1.0f / static_cast<float>(2 * T);

  std::vector<float> cpu_logits = logits, cpu_losses(T);
  std::vector<int32_t> tgt_host = targets;
  cross_entropy_forward_backward(cpu_ctx(), host_view(cpu_losses, {T}), host_view(cpu_logits, {T, V}),
                                 Tensor(tgt_host.data(), {T}, DType::I32), grad_scale);

  DeviceTensor d_logits = to_device(logits, {T, V}, DType::BF16);
  DeviceTensor d_losses = test::device_tensor({T}, DType::F32);
  DeviceTensor d_targets = to_device_i32(targets, {T});
  cross_entropy_forward_backward(cuda_ctx(), d_losses.t, d_logits.t, d_targets.t, grad_scale);
  std::vector<double> loss_tol(T);
  for (int64_t t = 0; t < T; ++t) loss_tol[t] = 1e-5 * std::max(1.0, std::abs(static_cast<double>(cpu_losses[t])));
  const std::vector<float> gpu_losses = to_host_floats(d_losses.t);
  expect_close(gpu_losses, cpu_losses, 0.0, loss_tol, 1.0, "cross_entropy losses");
  expect_close(to_host_floats(d_logits.t), cpu_logits, kBf16Ulp, 1e-6 * grad_scale, 0.01, "cross_entropy dlogits");

  // grad_scale = 0: the same losses, logits left untouched.
  DeviceTensor d_logits0 = to_device(logits, {T, V}, DType::BF16);
  DeviceTensor d_losses0 = test::device_tensor({T}, DType::F32);
  cross_entropy_forward_backward(cuda_ctx(), d_losses0.t, d_logits0.t, d_targets.t, 0.0f);
  expect_bits_equal(to_host_floats(d_losses0.t), gpu_losses, "cross_entropy losses (grad_scale 0)");
  expect_bits_equal(to_host_floats(d_logits0.t), logits, "cross_entropy logits untouched (grad_scale 0)");
}

TEST(CudaOps, CrossEntropy) {
  PL_REQUIRE_CUDA_DEVICE();
  PL_SEEDED_RNG(rng);
  cross_entropy_case(37, 5003, 8.0f, rng);    // V not a multiple of the block stride (512)
  cross_entropy_case(3, 128256, 12.0f, rng);  // Llama 3 vocabulary

  // A target outside [0, V) (the host validates targets; nothing is read back here): its loss is NaN,
  // its row untouched, the other rows computed as usual.
  const int64_t T = 5, V = 11;
  std::vector<float> logits = uniform_bf16(T * V, rng, -1.0f, 1.0f);
  DeviceTensor d_logits = to_device(logits, {T, V}, DType::BF16);
  DeviceTensor d_losses = test::device_tensor({T}, DType::F32);
  DeviceTensor d_bad = to_device_i32({1, 2, 3, 11, 4}, {T});
  cross_entropy_forward_backward(cuda_ctx(), d_losses.t, d_logits.t, d_bad.t, 1.0f);
  const std::vector<float> losses = to_host_floats(d_losses.t), after = to_host_floats(d_logits.t);
  for (int64_t t = 0; t < T; ++t) {
    if (t == 3) {
      EXPECT_TRUE(std::isnan(losses[t]));
      for (int64_t j = 0; j < V; ++j) EXPECT_EQ(after[t * V + j], logits[t * V + j]) << j;
    } else {
      EXPECT_TRUE(std::isfinite(losses[t]) && losses[t] > 0.0f) << t << ": " << losses[t];
    }
  }
}

// ---- optimizer -----------------------------------------------------------------------------------

// Exact: the GPU follows the CPU's fp32 summation schedule (numerics/reduce.h: chunks of 65536, 256
// lanes, fixed lane tree, chunk partials by the group tree), so the result is bit-identical.
TEST(CudaOps, SumOfSquares) {
  PL_REQUIRE_CUDA_DEVICE();
  PL_SEEDED_RNG(rng);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ex(-3.0f, 3.0f);
  // a partial last chunk with a partial lane round; more than 256 chunks (two levels of the group tree)
  for (int64_t n : {int64_t{5}, int64_t{3 * 65536 + 12345}, int64_t{300 * 65536 + 77}}) {
    std::vector<float> x(n);
    for (float& v : x) v = nd(rng) * std::pow(10.0f, ex(rng));  // six decades: the summation order matters
    const double cpu = sum_of_squares(cpu_ctx(), host_view(x, {n}));
    DeviceTensor d = to_device(x, {n}, DType::F32);
    const double gpu = sum_of_squares(cuda_ctx(), d.t);
    EXPECT_EQ(gpu, cpu) << "n = " << n << ", difference " << gpu - cpu;
  }
}

// Exact: one num::adamw_element per thread with the hyper-parameters built as the CPU builds them.
TEST(CudaOps, AdamwUpdate) {
  PL_REQUIRE_CUDA_DEVICE();
  PL_SEEDED_RNG(rng);
  const int64_t n = 100003;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> master(n), m(n), v(n), grad(n);
  for (int64_t i = 0; i < n; ++i) {
    master[i] = 0.02f * nd(rng);
    m[i] = 1e-3f * nd(rng);
    v[i] = 1e-6f * std::abs(nd(rng));
    grad[i] = 1e-2f * nd(rng);
  }
  const AdamWStep step{3e-4f, 0.9f, 0.95f, 1e-8f, 0.033f, 7, 0.8f};
  std::vector<float> c_param(n), c_master = master, c_m = m, c_v = v;
  adamw_update(cpu_ctx(), host_view(c_param, {n}), host_view(c_master, {n}), host_view(grad, {n}),
               host_view(c_m, {n}), host_view(c_v, {n}), step);
  for (DType param_dtype : {DType::BF16, DType::F32}) {
    SCOPED_TRACE(std::string("param ") + dtype_name(param_dtype));
    DeviceTensor d_param = test::device_tensor({n}, param_dtype);
    DeviceTensor d_master = to_device(master, {n}, DType::F32);
    DeviceTensor d_m = to_device(m, {n}, DType::F32);
    DeviceTensor d_v = to_device(v, {n}, DType::F32);
    DeviceTensor d_grad = to_device(grad, {n}, DType::F32);
    adamw_update(cuda_ctx(), d_param.t, d_master.t, d_grad.t, d_m.t, d_v.t, step);
    expect_bits_equal(to_host_floats(d_master.t), c_master, "adamw master");
    expect_bits_equal(to_host_floats(d_m.t), c_m, "adamw m");
    expect_bits_equal(to_host_floats(d_v.t), c_v, "adamw v");
    expect_bits_equal(to_host_floats(d_param.t), c_param, "adamw param");
  }
}

// Exact: the multi-tensor step (one launch over the flat buffers, weight decay 0 inside the no-decay
// ranges read from a device table) against the CPU's multi-tensor step, which itself equals the
// per-tensor steps bit for bit (OpsOptimizer.AdamWMultiTensorEqualsPerTensorBitForBit). Ranges at the
// start, in the middle, one element long and at the end.
TEST(CudaOps, AdamwUpdateMulti) {
  PL_REQUIRE_CUDA_DEVICE();
  PL_SEEDED_RNG(rng);
  const int64_t n = (int64_t{1} << 20) + 4097;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> master(n), m(n), v(n), grad(n);
  for (int64_t i = 0; i < n; ++i) {
    master[i] = 0.02f * nd(rng);
    m[i] = 1e-3f * nd(rng);
    v[i] = 1e-6f * std::abs(nd(rng));
    grad[i] = 1e-2f * nd(rng);
  }
  const std::vector<int64_t> ranges = {0, 4096, 10000, 10001, 500000, 504096, n - 4096, n};
  DeviceTensor d_ranges = test::device_tensor({static_cast<int64_t>(ranges.size()) * 2}, DType::I32);
  copy_from_host(d_ranges.t, ranges.data());
  const ElementRanges host_ranges{ranges.data(), nullptr, 4};
  const ElementRanges dev_ranges{ranges.data(), static_cast<const int64_t*>(d_ranges.t.data), 4};
  const AdamWStep step{3e-4f, 0.9f, 0.95f, 1e-8f, 0.033f, 7, 0.8f};
  std::vector<float> c_param(n), c_master = master, c_m = m, c_v = v;
  adamw_update_multi(cpu_ctx(), host_view(c_param, {n}), host_view(c_master, {n}), host_view(grad, {n}),
                     host_view(c_m, {n}), host_view(c_v, {n}), host_ranges, step);
  for (DType param_dtype : {DType::BF16, DType::F32}) {
    SCOPED_TRACE(std::string("param ") + dtype_name(param_dtype));
    DeviceTensor d_param = test::device_tensor({n}, param_dtype);
    DeviceTensor d_master = to_device(master, {n}, DType::F32);
    DeviceTensor d_m = to_device(m, {n}, DType::F32);
    DeviceTensor d_v = to_device(v, {n}, DType::F32);
    DeviceTensor d_grad = to_device(grad, {n}, DType::F32);
    adamw_update_multi(cuda_ctx(), d_param.t, d_master.t, d_grad.t, d_m.t, d_v.t, dev_ranges, step);
    expect_bits_equal(to_host_floats(d_master.t), c_master, "adamw_multi master");
    expect_bits_equal(to_host_floats(d_m.t), c_m, "adamw_multi m");
    expect_bits_equal(to_host_floats(d_v.t), c_v, "adamw_multi v");
    expect_bits_equal(to_host_floats(d_param.t), c_param, "adamw_multi param");
  }
  // A missing device table is refused before any launch.
  DeviceTensor d_master = to_device(master, {n}, DType::F32);
  expect_error([&] {
    adamw_update_multi(cuda_ctx(), d_master.t, d_master.t, d_master.t, d_master.t, d_master.t, host_ranges, step);
  }, {"adamw_update_multi", "device table"});
}

// Exact, including Inf, NaN, subnormals and rounding ties; an F32 param also without rounding.
TEST(CudaOps, CopyMasterToParam) {
  PL_REQUIRE_CUDA_DEVICE();
  PL_SEEDED_RNG(rng);
  const int64_t n = 4099;
  std::vector<float> master = uniform_f32(n, rng, -2.0f, 2.0f);
  master[0] = std::numeric_limits<float>::infinity();
  master[1] = -std::numeric_limits<float>::infinity();
  master[2] = std::numeric_limits<float>::quiet_NaN();
  master[3] = 1e-40f;                    // subnormal
  master[4] = num::bits_float(0x3F808000u);  // a tie: rounds to even (down)
  master[5] = num::bits_float(0x3F818000u);  // a tie: rounds to even (up)
  master[6] = 3.4e38f;                   // rounds to +Inf in bf16
  DeviceTensor d_master = to_device(master, {n}, DType::F32);
  for (bool round : {true, false}) {
    OpContext cctx = cpu_ctx(), gctx = cuda_ctx();
    cctx.round_bf16 = gctx.round_bf16 = round;
    std::vector<float> cpu(n);
    copy_master_to_param(cctx, host_view(cpu, {n}), host_view(master, {n}));
    DeviceTensor d_f32 = test::device_tensor({n}, DType::F32);
    copy_master_to_param(gctx, d_f32.t, d_master.t);
    expect_bits_equal(to_host_floats(d_f32.t), cpu, round ? "f32 param, rounded" : "f32 param, not rounded");
    if (round) {
      DeviceTensor d_bf16 = test::device_tensor({n}, DType::BF16);
      copy_master_to_param(gctx, d_bf16.t, d_master.t);
      expect_bits_equal(to_host_floats(d_bf16.t), cpu, "bf16 param");
    }
  }
}

}  // namespace
}  // namespace pl
