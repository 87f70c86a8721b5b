// The CPU GEMM engine (backend/cpu/onednn_gemm.h) on each of its paths — the engine this CPU picks (oneDNN
// BF16 where it has BF16 dot products), the FP32 SGEMM fallback, and oneDNN with any implementation (so a CI
// AVX-512 machine without BF16 instructions still runs the oneDNN code, on its reference kernels; an AVX2-only
// one has no oneDNN BF16 matmul) — each forced by the test-only switch: the linear layer's three GEMMs and the
// quantized GEMMs against double-precision sums, on odd shapes; the MXFP8 fallback for scales below BF16's
// normal range; the same bits for the same thread count (and, on oneDNN, for any thread count); the banner.
//
// Tolerance, per output element, for a sum of K exact products (BF16 x BF16 and every expanded quantized
// value are exact in FP32) accumulated in FP32 in any order: |fp32 − exact| <= (K − 1)·2^-24·Σ|a·b| (the
// classic recursive-summation bound γ_{K−1}; blocked or pairwise orders are tighter), plus one rounding of the
// result, 2^-24·|exact|, per FP32 operation after it (alpha, the += of an accumulation), plus 2^-8·|exact| when
// the output is rounded to BF16. Bounds are doubled: the check guards against wrong layouts, transposes or
// scales (errors of order Σ|a·b|), not against the last bit.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "backend/cpu/onednn_gemm.h"
#include "backend/device_info.h"
#include "backend/quantize.h"
#include "matrix_util.h"
#include "op_test_util.h"

namespace pl::optest {
namespace {

using test::Mat;

// Expects |got − ref| <= 2·((K − 1)·2^-24·mag + out_rel·|ref|) element by element; ref and mag in double.
void expect_sum_close(const std::vector<float>& got, const std::vector<double>& ref, const std::vector<double>& mag,
                      int64_t K, double out_rel, const std::string& what) {
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i) {
    const double tol = 2.0 * (static_cast<double>(K - 1) * 0x1p-24 * mag[i] + out_rel * std::fabs(ref[i]));
    if (std::fabs(got[i] - ref[i]) > tol) {
      ++bad;
      ADD_FAILURE() << what << ": element " << i << " = " << got[i] << ", exact " << ref[i] << ", bound " << tol;
    }
  }
}

// ref[i][j] = Σ_k a[i][k]·b[j][k] (+ y0) and mag = Σ|a·b| (+ |y0|), in double; a [M,K], b [N,K] row-major.
void exact_nt(const std::vector<float>& a, const std::vector<float>& b, int64_t M, int64_t N, int64_t K,
              std::vector<double>& ref, std::vector<double>& mag, const std::vector<float>* y0 = nullptr) {
  ref.assign(static_cast<size_t>(M * N), 0.0);
  mag.assign(ref.size(), 0.0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = y0 ? (*y0)[i * N + j] : 0.0, m = std::fabs(s);
      for (int64_t k = 0; k < K; ++k) {
        const double p = static_cast<double>(a[i * K + k]) * b[j * K + k];
        s += p;
        m += std::fabs(p);
      }
      ref[i * N + j] = s;
      mag[i * N + j] = m;
    }
}

class CpuGemmEngine : public ::testing::TestWithParam<GemmEngineOverride> {
 protected:
  void SetUp() override {
    if (GetParam() == GemmEngineOverride::OneDnnAnyImpl && !cpu::onednn_bf16_matmul_exists())
      GTEST_SKIP() << (cpu::onednn_version().empty()
                           ? "this build has no oneDNN (-DPL_ONEDNN=OFF or libdnnl-dev missing)"
                           : "oneDNN has no BF16 matmul on this CPU (ISA " + cpu::cpu_gemm_engine().isa + ")");
  }
};

INSTANTIATE_TEST_SUITE_P(Paths, CpuGemmEngine,
                         ::testing::Values(GemmEngineOverride::Auto, GemmEngineOverride::Fp32Blas,
                                           GemmEngineOverride::OneDnnAnyImpl),
                         [](const auto& info) {
                           return info.param == GemmEngineOverride::Auto       ? std::string("Auto")
                                  : info.param == GemmEngineOverride::Fp32Blas ? std::string("Fp32Blas")
                                                                               : std::string("OneDnnAnyImpl");
                         });

// Odd shapes (T, in, out): no dimension a multiple of 16.
constexpr int64_t kOddShapes[][3] = {{37, 53, 29}, {5, 131, 67}, {70, 19, 3}};

TEST_P(CpuGemmEngine, LinearGemmsMatchExactSumsOnOddShapes) {
  EngineScope scope(GetParam());
  for (const auto& s : kOddShapes) {
    const int64_t T = s[0], in = s[1], out = s[2];
    const std::string what = "T=" + std::to_string(T) + " in=" + std::to_string(in) + " out=" + std::to_string(out);
    Mat x = test::random_bf16(T, in, 1), w = test::random_bf16(out, in, 2, 0.1f), dy = test::random_bf16(T, out, 3);
    std::vector<double> ref, mag;
    // forward y[T,out] = x · wᵀ, rounded to BF16
    Mat y(T, out);
    linear_forward(cpu_ctx(true), y.t(), x.t(), w.t());
    exact_nt(x.v, w.v, T, out, in, ref, mag);
    expect_sum_close(y.v, ref, mag, in, 0x1p-8, "forward " + what);
    // dgrad dx[T,in] = dy · w, rounded to BF16
    Mat dx(T, in);
    linear_backward_input(cpu_ctx(true), dx.t(), dy.t(), w.t());
    exact_nt(dy.v, test::transpose(w).v, T, in, out, ref, mag);
    expect_sum_close(dx.v, ref, mag, out, 0x1p-8, "dgrad " + what);
    // wgrad dw[out,in] += dyᵀ · x onto an FP32 prefill, twice
    Mat dw = test::random_bf16(out, in, 4, 3.0f);
    const std::vector<float> dw0 = dw.v;
    linear_backward_weight(cpu_ctx(true), dw.t(), dy.t(), x.t());
    exact_nt(test::transpose(dy).v, test::transpose(x).v, out, in, T, ref, mag, &dw0);
    expect_sum_close(dw.v, ref, mag, T + 1, 0x1p-24, "wgrad " + what);
  }
}

// quantized_gemm against the double sum of the exact dequantized products, plain and accumulating.
TEST_P(CpuGemmEngine, QuantizedGemmsMatchExactSumsOfDequantizedProducts) {
  EngineScope scope(GetParam());
  const int64_t M = 40, N = 24, K = 96;  // M, N odd multiples of 8; K a multiple of 32 (MXFP8 blocks)
  Mat a = test::random_bf16(M, K, 6, 1.0f, 3), b = test::random_bf16(N, K, 7, 0.05f);
  std::vector<float> sa(static_cast<size_t>(M * K)), sb(static_cast<size_t>(N * K));
  const Tensor ta(sa.data(), {M * K}, DType::F32), tb(sb.data(), {N * K}, DType::F32);
  for (auto [fa, fb] : {std::pair{QuantFormat::NVFP4, QuantFormat::NVFP4}, std::pair{QuantFormat::MXFP8, QuantFormat::MXFP8},
                        std::pair{QuantFormat::FP8_E5M2, QuantFormat::FP8_E4M3}}) {
    const std::string what = quant_format_name(fa);
    std::vector<Buffer> owner;
    QuantizedTensor qa = allocate_quantized(owner, Device::CPU, fa, M, K, true, false);
    QuantizedTensor qb = allocate_quantized(owner, Device::CPU, fb, N, K, true, false);
    quantize(cpu_ctx(false), qa, a.t(), QuantizeOptions{fa});
    quantize(cpu_ctx(false), qb, b.t(), QuantizeOptions{fb});
    Mat da(M, K), db(N, K);  // the exact dequantized values (global scales included)
    dequantize(cpu_ctx(false), da.t(), qa.rowwise, fa);
    dequantize(cpu_ctx(false), db.t(), qb.rowwise, fb);
    std::vector<double> ref, mag;
    exact_nt(da.v, db.v, M, N, K, ref, mag);
    Mat y(M, N);
    quantized_gemm(cpu_ctx(false), y.t(), qa.rowwise, qb.rowwise, fa, false, ta, tb);
    // the global scales enter as alpha once: one more FP32 rounding than the sum
    expect_sum_close(y.v, ref, mag, K, 0x1p-23, what);
    const std::vector<float> y0 = y.v;
    quantized_gemm(cpu_ctx(false), y.t(), qa.rowwise, qb.rowwise, fa, true, ta, tb);
    for (size_t i = 0; i < ref.size(); ++i) {
      ref[i] += y0[i];
      mag[i] += std::fabs(y0[i]);
    }
    expect_sum_close(y.v, ref, mag, K + 1, 0x1p-22, what + " accumulated");
  }
}

// An MXFP8 copy with block scales below 2^-117 holds values under BF16's smallest normal, which BF16 dot
// products would flush: it runs on the FP32 path, bit for bit what the forced fallback computes.
TEST(CpuGemmEngineMxfp8, TinyBlockScalesTakeTheFp32Path) {
  const int64_t M = 16, N = 8, K = 64;
  Mat a = test::random_bf16(M, K, 8, 1e-34f), b = test::random_bf16(N, K, 9);
  std::vector<float> sa(static_cast<size_t>(M * K)), sb(static_cast<size_t>(N * K));
  const Tensor ta(sa.data(), {M * K}, DType::F32), tb(sb.data(), {N * K}, DType::F32);
  std::vector<Buffer> owner;
  QuantizedTensor qa = allocate_quantized(owner, Device::CPU, QuantFormat::MXFP8, M, K, true, false);
  QuantizedTensor qb = allocate_quantized(owner, Device::CPU, QuantFormat::MXFP8, N, K, true, false);
  quantize(cpu_ctx(false), qa, a.t(), QuantizeOptions{QuantFormat::MXFP8});
  quantize(cpu_ctx(false), qb, b.t(), QuantizeOptions{QuantFormat::MXFP8});
  const uint8_t* s = qa.rowwise.scales.u8();
  ASSERT_LT(*std::min_element(s, s + qa.rowwise.scales.numel()), 10) << "the test needs scales below 2^-117";
  Mat y(M, N), y_fp32(M, N);
  quantized_gemm(cpu_ctx(false), y.t(), qa.rowwise, qb.rowwise, QuantFormat::MXFP8, false, ta, tb);
  {
    EngineScope fp32(GemmEngineOverride::Fp32Blas);
    quantized_gemm(cpu_ctx(false), y_fp32.t(), qa.rowwise, qb.rowwise, QuantFormat::MXFP8, false, ta, tb);
  }
  EXPECT_TRUE(bitwise_equal(y.v, y_fp32.v));
  EXPECT_GT(std::count_if(y.v.begin(), y.v.end(), [](float v) { return v != 0.0f; }), 0) << "nothing was flushed";
}

// The linear layer's three GEMMs on a llama_tiny-like layer's shapes, on `threads` OpenMP threads: y, dx, dw.
std::vector<float> linear_gemms_on(int threads) {
  const int64_t T = 128, in = 64, out = 192;
  Mat x = test::random_bf16(T, in, 11), w = test::random_bf16(out, in, 12), dy = test::random_bf16(T, out, 13);
  ScopedThreads scoped(threads);
  Mat y(T, out), dx(T, in), dw(out, in);
  linear_forward(cpu_ctx(true), y.t(), x.t(), w.t());
  linear_backward_input(cpu_ctx(true), dx.t(), dy.t(), w.t());
  linear_backward_weight(cpu_ctx(true), dw.t(), dy.t(), x.t());
  std::vector<float> all = y.v;
  all.insert(all.end(), dx.v.begin(), dx.v.end());
  all.insert(all.end(), dw.v.begin(), dw.v.end());
  return all;
}

// README's promise, on whichever engine this CPU runs: bit-reproducible for a given thread count.
TEST(CpuGemmEngineThreads, LinearGemmsRepeatBitForBitOnTheSameThreadCount) {
  for (int threads = 1; threads <= 3; ++threads)
    EXPECT_TRUE(bitwise_equal(linear_gemms_on(threads), linear_gemms_on(threads))) << threads << " threads";
}

// oneDNN 2.6's brgemm splits M and N over threads, never K, for these shapes: the same bits on 1, 2 and 3
// threads. OpenBLAS's SGEMM does not (0.3.21 on an AVX2 Zen: other bits on 2 threads than on 1), which is why
// README promises no more than a given thread count.
TEST(CpuGemmEngineThreads, OneDnnLinearGemmsIndependentOfThreadCount) {
  if (!cpu::cpu_gemm_engine().onednn_bf16) GTEST_SKIP() << "this CPU runs " << cpu::cpu_gemm_engine().description;
  const std::vector<float> one = linear_gemms_on(1);
  EXPECT_TRUE(bitwise_equal(one, linear_gemms_on(2)));
  EXPECT_TRUE(bitwise_equal(one, linear_gemms_on(3)));
}

TEST(CpuGemmEngineChoice, TheBannerSaysWhichEngineRuns) {
  const cpu::CpuGemmEngine e = cpu::cpu_gemm_engine();  // a copy: the override below re-decides the engine
  if (e.onednn_bf16) {
    EXPECT_EQ(e.description, "oneDNN bf16 (" + e.isa + ")");
    EXPECT_TRUE(e.isa == "avx512_core_bf16" || e.isa == "avx512_core_amx") << e.isa;
  } else {
    EXPECT_EQ(e.description.rfind("FP32 BLAS, BF16 operands emulated", 0), 0u) << e.description;
  }
  const std::vector<std::string> lines = gemm_banner_lines(OpContext{}, {});
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], "cpu GEMMs: " + e.description);
  {
    EngineScope fp32(GemmEngineOverride::Fp32Blas);
    EXPECT_FALSE(cpu::cpu_gemm_engine().onednn_bf16);
    EXPECT_EQ(cpu::cpu_gemm_engine().description.rfind("FP32 BLAS, BF16 operands emulated", 0), 0u);
  }
  EXPECT_EQ(cpu::cpu_gemm_engine().description, e.description) << "the automatic choice is restored";
}


// The operand conversion gives num::float_to_bf16_bits' bits for every kind of input (ties to even, NaN,
// infinities, subnormals, the overflow to infinity), rows of a strided source.
TEST(CpuGemmEngineConvert, ToBf16RowsRoundsAsTheSharedHeader) {
  const std::vector<float> special = {0.0f, -0.0f, 1.0f, num::bits_float(0x3F808000u), num::bits_float(0x3F818000u),
                                      num::bits_float(0x7F7FFFFFu), -num::bits_float(0x7F7FFFFFu), INFINITY, -INFINITY,
                                      NAN, num::bits_float(0xFFC12345u), num::bits_float(0x00000001u),
                                      num::bits_float(0x807FFFFFu), 3.14159f, -2.71828e-20f, 65504.0f};
  const int64_t rows = 3, cols = static_cast<int64_t>(special.size()), ld = cols + 5;
  std::vector<float> src(static_cast<size_t>(rows * ld), 7.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < cols; ++k) src[r * ld + k] = special[k] * (r == 1 ? -1.0f : 1.0f);
  std::vector<uint16_t> dst(static_cast<size_t>(rows * cols));
  cpu::to_bf16_rows(dst.data(), src.data(), rows, cols, ld);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < cols; ++k)
      EXPECT_EQ(dst[r * cols + k], num::float_to_bf16_bits(src[r * ld + k])) << "row " << r << " col " << k;
  EXPECT_EQ(num::float_to_bf16_bits(NAN), 0x7FFF);
  EXPECT_EQ(num::float_to_bf16_bits(num::bits_float(0x3F808000u)), 0x3F80) << "a tie rounds to even (down)";
  EXPECT_EQ(num::float_to_bf16_bits(num::bits_float(0x3F818000u)), 0x3F82) << "a tie rounds to even (up)";
  EXPECT_EQ(num::float_to_bf16_bits(num::bits_float(0x7F7FFFFFu)), 0x7F80) << "overflow rounds to infinity";
}

}  // namespace
}  // namespace pl::optest
