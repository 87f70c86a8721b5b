// The quantizers' FP8/FP4 round-to-nearest encodes (backend/cuda/quantize_common.cuh: the cvt.rn.satfinite
// instructions where the architecture has them, the shared numerics elsewhere) against the shared numerics
// (lib/numerics/fp8.h, fp4.h: what the CPU backend uses), exhaustively: all 2^32 float bit patterns, each
// in the low and in the high element of a pair, for E4M3, E5M2 and E2M1, on the GPU this runs on (the
// build's code for its architecture decides which encodes are hardware ones; the test prints which).
// Zero mismatches are required of the encode the kernels use; the bare instruction (no software NaN
// choice) must also agree on every pair without a NaN, which is the premise of the hardware path
// (quantize_common.cuh); its NaN disagreements are printed, not failed. A few seconds of GPU time at most
// (about 4.3e9 pairs per format, integer work only). Compiled always; skips without a device.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "backend/ops.h"
#include "cuda/cuda_test_util.h"

#if defined(PL_WITH_CUDA)
#include "cuda/numerics_check.h"
#endif

namespace pl {
namespace {


#if defined(PL_WITH_CUDA)
const char* format_name(cuda::ConversionFormat f) {
  switch (f) {
    case cuda::ConversionFormat::E4M3: return "E4M3";
    case cuda::ConversionFormat::E5M2: return "E5M2";
    case cuda::ConversionFormat::E2M1: return "E2M1";
  }
  return "?";
}

std::string first_mismatches(const cuda::ConversionCheck& r) {
  std::string s;
  const int n = r.recorded < cuda::kConversionFirstMismatches ? r.recorded : cuda::kConversionFirstMismatches;
  char line[160];
  for (int k = 0; k < n; ++k) {
    std::snprintf(line, sizeof line, "\n  input 0x%08x (pair with 0x%08x): got 0x%04x, shared numerics 0x%04x",
                  r.input[k], r.input[k] ^ cuda::kConversionPairMask, r.got[k], r.want[k]);
    s += line;
  }
  return s;
}

void check_every_float(cuda::ConversionFormat f) {
  const cuda::ConversionCheck r = cuda::conversion_check_on_device(f, 0, uint64_t{1} << 32);
  const bool hw = f == cuda::ConversionFormat::E2M1 ? (r.hw_paths & 2) != 0 : (r.hw_paths & 1) != 0;
  std::printf("[conversion] %s on code for __CUDA_ARCH__ %d: %s; mismatches %llu, bare instruction %llu (%llu "
              "without NaN)\n",
              format_name(f), r.cuda_arch, hw ? "cvt.rn.satfinite instruction" : "shared numerics in software",
              r.mismatches, r.raw_mismatches, r.raw_non_nan_mismatches);
  EXPECT_EQ(r.mismatches, 0ull) << format_name(f) << ": the kernels' encode differs from the shared numerics"
                                << first_mismatches(r);
  EXPECT_EQ(r.raw_non_nan_mismatches, 0ull)
      << format_name(f) << ": the bare instruction differs from the shared numerics on non-NaN inputs";
  // The hardware path is taken where the build says it is: FP8 by cvt on every sm_89+ compilation.
  if (f != cuda::ConversionFormat::E2M1) {
    EXPECT_EQ(hw, r.cuda_arch >= 890) << "__CUDA_ARCH__ " << r.cuda_arch;
  }
}
#endif

TEST(CudaConversion, E4M3EncodeOfEveryFloatMatchesTheSharedNumerics) {
  PL_REQUIRE_CUDA_DEVICE();
#if defined(PL_WITH_CUDA)
  check_every_float(cuda::ConversionFormat::E4M3);
#endif
}

TEST(CudaConversion, E5M2EncodeOfEveryFloatMatchesTheSharedNumerics) {
  PL_REQUIRE_CUDA_DEVICE();
#if defined(PL_WITH_CUDA)
  check_every_float(cuda::ConversionFormat::E5M2);
#endif
}

TEST(CudaConversion, E2M1EncodeOfEveryFloatMatchesTheSharedNumerics) {
  PL_REQUIRE_CUDA_DEVICE();
#if defined(PL_WITH_CUDA)
  check_every_float(cuda::ConversionFormat::E2M1);
#endif
}

}  // namespace
}  // namespace pl
