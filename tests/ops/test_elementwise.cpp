// add (with aliasing and rounding), scale and dropout (LoRA's adapter ops), accumulate_bf16, fill_zero and
// stream_triad (the machine probe's STREAM triad).
// Cpu/Elementwise.* and Cuda/Elementwise.* run the same cases on each backend (the GPU also against
// the CPU backend, bit for bit); OpsElementwise.* are CPU-only (plain FP32, errors).
#include <limits>

#include "op_test_util.h"
#include "numerics/dropout.h"

namespace pl::optest {
namespace {

TEST(OpsElementwise, AddIsExactFp32Sum) {
  std::mt19937 rng(701);
  HostF32 a = random_f32({13, 29}, rng), b = random_f32({13, 29}, rng), out({13, 29});
  add(cpu_ctx(false), out.t(), a.t(), b.t());
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], static_cast<float>(double(a[i]) + double(b[i])));
  const HostF32 b0 = b;
  add(cpu_ctx(false), b.t(), a.t(), b.t());  // out aliases b
  for (size_t i = 0; i < b.size(); ++i) ASSERT_EQ(b[i], a[i] + b0[i]) << i;
}

TEST(OpsElementwise, ErrorsNameTheOp) {
  HostF32 a({4, 8}), b({8, 4}), out({4, 8});
  expect_error_naming("add", [&] { add(cpu_ctx(false), out.t(), a.t(), b.t()); });
  expect_error_naming("add", [&] { add(cpu_ctx(false), b.t(), a.t(), a.t()); });
  expect_error_naming("scale", [&] { scale(cpu_ctx(false), b.t(), a.t(), 2.0f); });
  expect_error_naming("scale", [&] { scale(cpu_ctx(false), a.t(), a.t(), std::numeric_limits<float>::infinity()); });
  expect_error_naming("dropout", [&] { dropout(cpu_ctx(false), b.t(), a.t(), 0.1f, 1, 0, 0); });
  expect_error_containing([&] { dropout(cpu_ctx(false), a.t(), a.t(), 1.0f, 1, 0, 0); }, {"dropout", "[0, 1)"});
  expect_error_containing([&] { dropout(cpu_ctx(false), a.t(), a.t(), -0.1f, 1, 0, 0); }, {"dropout", "[0, 1)"});
  HostF32 x({32}), y({32}), z({31}), m({4, 8});
  expect_error_naming("stream_triad", [&] { stream_triad(cpu_ctx(false), x.t(), y.t(), z.t(), 2.0f); });
  expect_error_naming("stream_triad", [&] { stream_triad(cpu_ctx(false), m.t(), m.t(), m.t(), 2.0f); });  // not 1-D
}

// ---- on every backend (Cpu/ and Cuda/Elementwise.*) -----------------------------------------------

class Elementwise : public OnBackend {};
PL_INSTANTIATE_BACKENDS(Elementwise);

// out = round_bf16(a + b), exact on every backend, also when out aliases a (the residual update).
TEST_P(Elementwise, AddRoundsAndMayAlias) {
  PL_SEEDED_RNG(rng);
  const int64_t R = 37, C = 29;
  std::vector<float> a = uniform_bf16(R * C, rng, -4.0f, 4.0f), b = uniform_bf16(R * C, rng, -4.0f, 4.0f);
  b[0] = -a[0];  // an exact zero
  for (bool alias : {false, true}) {
    const auto run = [&](Backend& k) {
      std::vector<float> x = a, out(R * C);
      const Tensor tx = k.put(x, {R, C}, DType::BF16);
      add(k.ctx(), alias ? tx : k.put(out, {R, C}, DType::BF16), tx, k.put(b, {R, C}, DType::BF16));
      return k.get(alias ? x : out);
    };
    const std::vector<float> out = run_exact(GetParam(), run, alias ? "add out aliasing a" : "add out");
    expect_bf16_representable(out, "a + b");
    for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], num::round_bf16(a[i] + b[i])) << i;
  }
  if (!on_cuda()) return;
  Backend gpu(Device::CUDA);
  std::vector<float> out(R * C);
  const Tensor f32 = gpu.put(a, {R, C}, DType::F32), o = gpu.put(out, {R, C}, DType::BF16);
  expect_error_containing([&] { add(gpu.ctx(), o, f32, gpu.put(b, {R, C}, DType::BF16)); },
                          {"add", "a [37, 29] f32", "bf16"});
}

// acc = round_bf16(acc + delta) with an fp32 delta (BF16 main grads), exact on every backend; deltas far
// below acc's ulp are lost by the rounding (what accumulating in BF16 costs), one equal to -acc gives 0.
TEST_P(Elementwise, AccumulateBf16AddsFp32DeltaRoundedOnce) {
  PL_SEEDED_RNG(rng);
  const int64_t n = 4099;
  std::vector<float> acc = uniform_bf16(n, rng, -2.0f, 2.0f), delta = uniform_f32(n, rng, -1e-2f, 1e-2f);
  delta[0] = -acc[0];
  acc[1] = 1.0f, delta[1] = 1e-4f;  // below half an ulp of 1.0 in bf16 (2^-8): lost
  const auto run = [&](Backend& k) {
    std::vector<float> a = acc;
    accumulate_bf16(k.ctx(), k.put(a, {n}, DType::BF16), k.put(delta, {n}, DType::F32));
    return k.get(a);
  };
  const std::vector<float> out = run_exact(GetParam(), run, "accumulate_bf16");
  expect_bf16_representable(out, "acc + delta");
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], num::round_bf16(acc[i] + delta[i])) << i;
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], 1.0f);
}

// Every byte zero: f32 (more than one 1 MiB chunk, with a tail), bf16 (the GPU's) and i32.
TEST_P(Elementwise, FillZero) {
  PL_SEEDED_RNG(rng);
  Backend k(GetParam());
  const int64_t n = (1 << 19) + 37;
  for (DType dt : {DType::F32, DType::BF16}) {
    std::vector<float> x = uniform_f32(n, rng, -1.0f, 1.0f);
    fill_zero(k.ctx(), k.put(x, {n}, dt));
    const std::vector<float> got = k.get(x);
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(num::float_bits(got[i]), 0u) << dtype_name(dt) << " " << i;
  }
  std::vector<int32_t> ids = uniform_ids(1237, rng, 1000);
  fill_zero(k.ctx(), k.put(ids, {1237}));
  for (int32_t v : k.get(ids)) ASSERT_EQ(v, 0) << "i32";
}

// out = round_bf16(s · x) on every backend, also in place, over a length with a tail after the 16-byte vectors.
TEST_P(Elementwise, ScaleRoundsOnceAndMayAlias) {
  PL_SEEDED_RNG(rng);
  const int64_t n = 4099;
  const std::vector<float> x = uniform_bf16(n, rng, -4.0f, 4.0f);
  for (float s : {1.0f, 2.0f, 0.3f, -1.7f}) {
    for (bool alias : {false, true}) {
      const auto run = [&](Backend& k) {
        std::vector<float> xx = x, out(n);
        const Tensor tx = k.put(xx, {n}, DType::BF16);
        scale(k.ctx(), alias ? tx : k.put(out, {n}, DType::BF16), tx, s);
        return k.get(alias ? xx : out);
      };
      const std::vector<float> got = run_exact(GetParam(), run, "scale");
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], num::round_bf16(s * x[i])) << "s " << s << " i " << i;
    }
  }
}

// Dropout keeps exactly the elements numerics/dropout.h's Philox words keep, scaled by 1/(1-p) and rounded
// once, on every backend (16-byte and scalar paths: views 0 and 1 elements in, a tail); the same arguments
// give the same mask (the backward regenerates it), another counter or stream another one; the kept share is
// 1 - p within 5 standard deviations; p = 0 keeps everything unchanged.
TEST_P(Elementwise, DropoutKeepsThePhiloxMaskScaledAndRegeneratesIt) {
  PL_SEEDED_RNG(rng);
  const int64_t n = 20011;
  const std::vector<float> x = uniform_bf16(n, rng, -4.0f, 4.0f);
  const uint64_t seed = 0x1234'5678'9ABCull;
  const auto run_with = [&](int64_t offset, float p, uint32_t stream, uint64_t counter) {
    const auto run = [&](Backend& k) {
      std::vector<float> xx = x, out(n, -7.0f);
      const Tensor tx = k.put(xx, {n}, DType::BF16), to = k.put(out, {n}, DType::BF16);
      dropout(k.ctx(), to.rows(offset, n - offset), tx.rows(offset, n - offset), p, seed, stream, counter);
      return k.get(out);
    };
    return run_exact(GetParam(), run, "dropout");
  };
  for (int64_t offset : {0, 1}) {
    const float p = 0.3f;
    const std::vector<float> got = run_with(offset, p, 5, (uint64_t{3} << 32) | 9);
    const uint32_t threshold = num::dropout_threshold(p);
    int64_t kept = 0;
    for (int64_t i = offset; i < n; ++i) {
      const bool keep = num::dropout_keeps(seed, 5, (uint64_t{3} << 32) | 9, static_cast<uint64_t>(i - offset), threshold);
      kept += keep ? 1 : 0;
      ASSERT_EQ(num::float_bits(got[i]), num::float_bits(num::round_bf16(x[i] * (keep ? 1.0f / 0.7f : 0.0f))))
          << "offset " << offset << " i " << i;
    }
    EXPECT_EQ(got[0], offset == 1 ? -7.0f : got[0]);
    const double m = static_cast<double>(n - offset), share = static_cast<double>(kept) / m;
    EXPECT_NEAR(share, 0.7, 5.0 * std::sqrt(0.7 * 0.3 / m));
  }
  EXPECT_EQ(run_with(0, 0.3f, 5, 9), run_with(0, 0.3f, 5, 9));
  EXPECT_NE(run_with(0, 0.3f, 5, 9), run_with(0, 0.3f, 5, 10));
  EXPECT_NE(run_with(0, 0.3f, 5, 9), run_with(0, 0.3f, 6, 9));
  EXPECT_EQ(run_with(0, 0.0f, 5, 9), x);
}

// a = b + s·c against the plain loop (McCalpin's STREAM triad), bit for bit (one FP32 multiply and one add,
// no contraction, on every backend), over all n elements and over views that start 1 and 2 floats in (the
// CUDA float4 path needs 16-byte alignment: those take its scalar path), n odd (a tail after the float4s);
// the elements before a view stay untouched. Also with a aliasing b (the probe never does; the op allows it).
TEST_P(Elementwise, StreamTriadIsTheStreamLoop) {
  PL_SEEDED_RNG(rng);
  const int64_t n = 4099;
  const float s = std::uniform_real_distribution<float>(-3.0f, 3.0f)(rng);
  const std::vector<float> b = uniform_f32(n, rng, -8.0f, 8.0f), c = uniform_f32(n, rng, -8.0f, 8.0f);
  for (int64_t offset : {0, 1, 2}) {
    for (bool alias : {false, true}) {
      const auto run = [&](Backend& k) {
        std::vector<float> a(n, -1.0f), bb = b, cc = c;
        const Tensor ta = k.put(a, {n}, DType::F32), tb = k.put(bb, {n}, DType::F32), tc = k.put(cc, {n}, DType::F32);
        const Tensor out = (alias ? tb : ta).rows(offset, n - offset);
        stream_triad(k.ctx(), out, tb.rows(offset, n - offset), tc.rows(offset, n - offset), s);
        return k.get(alias ? bb : a);
      };
      const std::vector<float> got = run_exact(GetParam(), run, "stream_triad");
      for (int64_t i = 0; i < n; ++i) {
        const float want = i < offset ? (alias ? b[i] : -1.0f) : b[i] + s * c[i];
        ASSERT_EQ(num::float_bits(got[i]), num::float_bits(want)) << "offset " << offset << " alias " << alias << " i " << i;
      }
    }
  }
}

}  // namespace
}  // namespace pl::optest
