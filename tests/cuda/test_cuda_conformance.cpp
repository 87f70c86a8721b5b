// GPU conformance: each CUDA kernel against the CPU backend on fresh random inputs. Elementwise
// results come from the shared numerics headers, so equality is exact, except that NaN results are
// compared as "any NaN equals any NaN": NaN payloads differ between x86 (which propagates an operand's
// payload) and the GPU (which returns its canonical NaN). Compiled always; every test skips with the
// reason when this build or this machine has no usable CUDA device.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "cuda/cuda_test_util.h"
#include "core/tensor.h"
#include "numerics/adamw.h"
#include "numerics/bf16.h"

#if defined(PL_WITH_CUDA)
#include <cuda_runtime_api.h>

#include "cuda/numerics_check.h"
#endif

namespace pl {
namespace {


// Float bits equal, or both NaN (whatever their payloads).
bool same_float(uint32_t a, uint32_t b) {
  const bool a_nan = (a & 0x7FFFFFFFu) > 0x7F800000u, b_nan = (b & 0x7FFFFFFFu) > 0x7F800000u;
  return a == b || (a_nan && b_nan);
}

TEST(CudaConformance, NanCanonicalizingComparison) {  // runs without a device: the comparison itself
  EXPECT_TRUE(same_float(0x7FC00000u, 0x7FFFFFFFu));   // quiet NaNs, different payloads
  EXPECT_TRUE(same_float(0xFFC00001u, 0x7F800001u));   // signs and signalling bits do not matter
  EXPECT_FALSE(same_float(0x7F800000u, 0x7FC00000u));  // Inf is not NaN
  EXPECT_FALSE(same_float(0x00000000u, 0x80000000u));  // +0 and -0 differ
  EXPECT_FALSE(same_float(0x3F800000u, 0x3F800001u));
  EXPECT_TRUE(same_float(0x3F800000u, 0x3F800000u));
}

#if defined(PL_WITH_CUDA)
uint32_t le_u32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}

// A device copy of a host vector, freed at scope exit.
template <class T>
struct DeviceVec {
  Buffer buf;
  explicit DeviceVec(const std::vector<T>& host) : buf(host.size() * sizeof(T), Device::CUDA) {
    copy_from_host(tensor(), host.data());
  }
  // The bytes, as bytes: the copies move them whatever T is (float, uint16_t, uint8_t).
  Tensor tensor() const { return Tensor(buf.data(), {static_cast<int64_t>(buf.bytes())}, DType::U8, Device::CUDA); }
  T* ptr() const { return static_cast<T*>(buf.data()); }
  std::vector<T> to_host() const {
    std::vector<T> h(buf.bytes() / sizeof(T));
    copy_to_host(h.data(), tensor());
    return h;
  }
};
#endif

TEST(CudaConformance, Bf16RoundingIsBitExactWithTheHost) {
  PL_REQUIRE_CUDA_DEVICE();
#if defined(PL_WITH_CUDA)
  std::mt19937 rng(3);
  std::vector<float> x(1 << 20);
  for (float& v : x) v = num::bits_float(rng());  // every bit pattern, including NaN/Inf/subnormals
  DeviceVec<float> dx(x);
  DeviceVec<uint16_t> dbits(std::vector<uint16_t>(x.size() + (x.size() & 1)));
  DeviceVec<float> drounded(std::vector<float>(x.size()));
  cuda::bf16_round_on_device(dx.ptr(), dbits.ptr(), drounded.ptr(), static_cast<int64_t>(x.size()));
  const std::vector<uint16_t> bits = dbits.to_host();
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(bits[i], num::float_to_bf16_bits(x[i])) << "element " << i;
  // The rounded floats: bit-exact, NaN canonicalized (BF16 NaN is 0x7FFF on both, but compare as values).
  const std::vector<float> rounded = drounded.to_host();
  for (size_t i = 0; i < x.size(); ++i)
    ASSERT_TRUE(same_float(num::float_bits(rounded[i]), num::float_bits(num::round_bf16(x[i])))) << "element " << i;
#endif
}

TEST(CudaConformance, AdamWElementIsBitExactWithTheHost) {
  PL_REQUIRE_CUDA_DEVICE();
#if defined(PL_WITH_CUDA)
  const size_t n = 1 << 18;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> master(n), m(n), v(n), g(n);
  for (size_t i = 0; i < n; ++i) {
    master[i] = 0.02f * nd(rng);
    m[i] = 1e-3f * nd(rng);
    v[i] = 1e-6f * std::abs(nd(rng));
    g[i] = 1e-2f * nd(rng);
  }
  const num::AdamWHyper h{3e-4f, 0.9f, 0.95f, 1e-8f, 0.033f, 1.0f - 0.9f * 0.9f * 0.9f, 1.0f - 0.95f * 0.95f * 0.95f,
                          0.7f};
  DeviceVec<float> dmaster(master), dm(m), dv(v), dg(g);
  cuda::adamw_on_device(dmaster.ptr(), dm.ptr(), dv.ptr(), dg.ptr(), static_cast<int64_t>(n), h);
  for (size_t i = 0; i < n; ++i) num::adamw_element(master[i], m[i], v[i], g[i], h);
  const std::vector<float> gm = dmaster.to_host(), gmm = dm.to_host(), gv = dv.to_host();
  for (size_t i = 0; i < n; ++i) {
    ASSERT_TRUE(same_float(num::float_bits(gm[i]), num::float_bits(master[i]))) << "master " << i;
    ASSERT_TRUE(same_float(num::float_bits(gmm[i]), num::float_bits(m[i]))) << "m " << i;
    ASSERT_TRUE(same_float(num::float_bits(gv[i]), num::float_bits(v[i]))) << "v " << i;
  }
#endif
}

TEST(CudaConformance, RecipeNumericsAreBitExactWithTheHost) {
  PL_REQUIRE_CUDA_DEVICE();
#if defined(PL_WITH_CUDA)
  // Every FP8/FP4/MXFP8/NVFP4/Philox/RHT/swizzle function once per item (numerics_check.h), on
  // random bit patterns mixed with ordinary Gaussian values.
  const int64_t n = 1 << 14;
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> x(static_cast<size_t>(16 * n));
  for (size_t i = 0; i < x.size(); ++i) x[i] = (i % 5 == 0) ? num::bits_float(rng()) : nd(rng);
  DeviceVec<float> dx(x);
  DeviceVec<uint8_t> dout(std::vector<uint8_t>(static_cast<size_t>(n * cuda::kQuantCheckOutBytes + 4)));
  cuda::quant_numerics_on_device(dx.ptr(), dout.ptr(), n, 1234);
  const std::vector<uint8_t> got = dout.to_host();
  // The float fields of an item (numerics_check.h's layout): 8..40 (nine floats) and the 16 RHT outputs
  // at 82..145 are compared as floats with NaN canonicalized; every other byte (codes, scales, the
  // Philox words at 146..161, which are integers) exactly.
  std::vector<bool> float_field(static_cast<size_t>(cuda::kQuantCheckOutBytes), false);
  for (int64_t k = 8; k < 44; k += 4) float_field[static_cast<size_t>(k)] = true;
  for (int64_t k = 82; k < 146; k += 4) float_field[static_cast<size_t>(k)] = true;
  std::vector<uint8_t> want(static_cast<size_t>(cuda::kQuantCheckOutBytes));
  int64_t nan_fields = 0;
  for (int64_t i = 0; i < n; ++i) {
    cuda::quant_numerics_item(&x[static_cast<size_t>(16 * i)], i, 1234, want.data());
    const uint8_t* g = &got[static_cast<size_t>(i * cuda::kQuantCheckOutBytes)];
    for (int64_t k = 0; k < cuda::kQuantCheckOutBytes; ++k) {
      if (float_field[static_cast<size_t>(k)]) {
        const uint32_t a = le_u32(g + k), b = le_u32(&want[static_cast<size_t>(k)]);
        ASSERT_TRUE(same_float(a, b)) << "item " << i << " float at byte " << k << ": gpu 0x" << std::hex << a
                                      << " host 0x" << b;
        nan_fields += (b & 0x7FFFFFFFu) > 0x7F800000u ? 1 : 0;
        k += 3;
        continue;
      }
      ASSERT_EQ(g[k], want[static_cast<size_t>(k)]) << "item " << i << " byte " << k;
    }
  }
  EXPECT_GT(nan_fields, 0) << "the random bit patterns should produce NaN results somewhere";
#endif
}

// stream_triad (the machine probe's STREAM triad) on the GPU against the host loop, bit for bit: the
// float4 path (aligned arrays, n with a tail of 3) and the scalar path (views 1 and 2 floats in), on an
// array larger than the grid cap's one pass (grid-stride loop).
TEST(CudaConformance, StreamTriadIsBitExactWithTheHost) {
  PL_REQUIRE_CUDA_DEVICE();
#if defined(PL_WITH_CUDA)
  static cuda::DeviceState* const state = open_device_state(Device::CUDA).release();  // kept to process exit
  OpContext ctx;
  ctx.device = Device::CUDA;
  ctx.gpu = state;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> d(-100.0f, 100.0f);
  const int64_t n = (int64_t{1} << 22) + 3;
  std::vector<float> b(n), c(n);
  for (int64_t i = 0; i < n; ++i) b[i] = d(rng), c[i] = d(rng);
  const float s = 1.7f;
  DeviceVec<float> da(std::vector<float>(n, 0.0f)), db(b), dc(c);
  for (int64_t offset : {0, 1, 2}) {
    const auto view = [&](const DeviceVec<float>& v) {
      return Tensor(v.ptr() + offset, {n - offset}, DType::F32, Device::CUDA);
    };
    stream_triad(ctx, view(da), view(db), view(dc), s);
    const std::vector<float> got = da.to_host();
    for (int64_t i = offset; i < n; ++i) {
      const float want = b[i] + s * c[i];
      ASSERT_EQ(num::float_bits(got[i]), num::float_bits(want)) << "offset " << offset << " i " << i;
    }
  }
#endif
}

}  // namespace
}  // namespace pl
