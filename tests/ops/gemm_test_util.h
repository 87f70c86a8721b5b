#pragma once
// The GPU GEMM conformance helpers shared by test_linear.cpp (BF16, cuBLASLt) and
// test_quantized_gemm.cpp (the quantized GEMMs): every CUDA GEMM against the CPU backend.
//
// Tolerance. The two backends compute the same products (BF16 values, or exactly dequantized block
// values) and differ in the FP32 summation order, so per output element
//   |gpu − cpu| <= out_rel · max(|gpu|, |cpu|) + acc_rel · Σ_k |a_k·b_k|  (+ |y0| when accumulating)
//   out_rel = 2^-7 for BF16 outputs: each side rounds its FP32 sum to BF16 once (<= 2^-8 relative);
//             2^-22 for FP32 outputs (the final rounding of each side).
//   acc_rel = 2^-12 for BF16 GEMMs: any FP32 summation order is within K·2^-24·Σ|ab| of the exact
//             sum, i.e. <= 2^-15 for K <= 512 on each side; 4x slack.
//           = 2^-8 for the quantized GEMMs: Hopper's FP8 tensor cores keep only ~14 accumulator bits
//             between FP32 promotions (DeepSeek-V3 §3.3.2), block-scaled kernels scale partial sums;
//             2^-8 covers that and TE's own NVFP4 GEMM test tolerance (8e-3), yet a wrong layout,
//             transposition, scale or alpha gives errors of order Σ|ab| itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "numerics/bf16.h"

namespace pl::test {

constexpr double kBf16OutRel = 0x1p-7;
constexpr double kF32OutRel = 0x1p-22;
constexpr double kBf16AccRel = 0x1p-12;
constexpr double kQuantAccRel = 0x1p-8;

// n normal values of standard deviation `scale`, rounded to BF16 (the values a BF16 tensor holds).
inline std::vector<float> randn_bf16(size_t n, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = num::round_bf16(nd(rng));
  return v;
}

inline std::vector<float> transpose(const std::vector<float>& m, int64_t rows, int64_t cols) {
  std::vector<float> t(m.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = m[r * cols + c];
  return t;
}

// mag[i][j] = Σ_k |a[i][k]·b[j][k]| (+ |y0[i][j]|): the scale of each output's rounding error.
inline std::vector<double> abs_products(const std::vector<float>& a, const std::vector<float>& b, int64_t M, int64_t N,
                                 int64_t K, const std::vector<float>* y0 = nullptr) {
  std::vector<double> mag(static_cast<size_t>(M * N));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = y0 ? std::fabs((*y0)[i * N + j]) : 0.0;
      for (int64_t k = 0; k < K; ++k) s += std::fabs(static_cast<double>(a[i * K + k]) * b[j * K + k]);
      mag[i * N + j] = s;
    }
  return mag;
}

inline void expect_gemm_close(const std::vector<float>& gpu, const std::vector<float>& cpu, const std::vector<double>& mag,
                       double out_rel, double acc_rel, const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  ASSERT_EQ(mag.size(), cpu.size()) << what;
  int bad = 0;
  double max_mag = 0.0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    max_mag = std::max(max_mag, mag[i]);
    const double g = gpu[i], c = cpu[i];
    const double tol = out_rel * std::max(std::fabs(g), std::fabs(c)) + acc_rel * mag[i];
    if (!(std::fabs(g - c) <= tol)) {
      if (++bad <= 5)
        ADD_FAILURE() << what << ": element " << i << " gpu " << g << " cpu " << c << " |diff| " << std::fabs(g - c)
                      << " > tol " << tol << " (Σ|ab| " << mag[i] << ")";
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << cpu.size() << " elements out of tolerance";
  EXPECT_GT(max_mag, 0.0) << what << ": degenerate test data (all products zero)";
}

}  // namespace pl::test
