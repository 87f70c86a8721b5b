// quantized_gemm: on the CPU the emulated block-scaled GEMM against the double product of the
// dequantized operands, and the rule of native GEMMs per architecture. On the GPU (Cuda*, skipped
// without a device; gemm_test_util.h): operands quantized on the CPU, their buffers copied to device
// copies, CUDA quantized_gemm vs CPU quantized_gemm for the three GEMMs of a linear layer as
// LinearLayer issues them, on the path the GPU takes and again forced onto the emulated path, so one
// GPU checks both; the cuBLASLt plan cache; Llama-3-8B production shapes; the path descriptions.
#include "backend/quantize.h"
#include "gemm_test_util.h"
#include "matrix_util.h"
#include "op_test_util.h"

namespace pl::optest {
namespace {

using test::Mat;

// Gaussian BF16 values with a few outliers, as activations look.
Mat random_bf16(int64_t r, int64_t c, uint32_t seed, float scale = 1.0f) { return test::random_bf16(r, c, seed, scale, 5); }

// The exact dequantized values of a CPU copy (global scale included).
Mat gemm_dequant(const QuantizedCopy& c) {
  Mat out(c.rows, c.cols);
  dequantize(cpu_ctx(true), out.t(), c, c.format);
  return out;
}

Mat gemm_reference(const Mat& a, const Mat& b) { return test::matmul_nt(a, b); }
void quantized_gemm_expect_close(const Mat& got, const Mat& want, double rel) { EXPECT_LT(test::rel_diff(got, want), rel); }

TEST(OpsQuantizedGemm, EmulatedEqualsTheDoubleProductOfDequantizedOperands) {
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
    const Mat ref = gemm_reference(gemm_dequant(qa.rowwise), gemm_dequant(qb.rowwise));
    quantized_gemm_expect_close(y, ref, 1e-6);
    // accumulate adds onto y
    Mat y2 = y;
    quantized_gemm(exact, y2.t(), qa.rowwise, qb.rowwise, cs.fa, true, ta, tb);
    for (size_t i = 0; i < y.v.size(); ++i) ASSERT_NEAR(y2.v[i], 2.0f * y.v[i], 1e-5f * (1.0f + std::fabs(y.v[i])));
    // and the quantized product is close to the exact one
    quantized_gemm_expect_close(y, gemm_reference(a, b), cs.fa == QuantFormat::NVFP4 ? 0.2 : 0.08);
  }
}

// The one rule of native quantized GEMMs (backend/quantize.h), per architecture.
TEST(OpsQuantizedGemm, NativePerArchitecture) {
  for (int sm : {80, 86, 89, 90, 100, 103, 120, 121})
    for (QuantFormat f : {QuantFormat::FP8_E4M3, QuantFormat::FP8_E5M2})
      EXPECT_EQ(quantized_gemm_native(f, sm), sm >= 89) << "fp8 sm_" << sm;
  for (int sm : {80, 89, 90, 100, 103, 120, 121})
    for (QuantFormat f : {QuantFormat::NVFP4, QuantFormat::MXFP8})
      EXPECT_EQ(quantized_gemm_native(f, sm), sm == 100 || sm == 103) << quant_format_name(f) << " sm_" << sm;
  EXPECT_EQ(kMinCudaSm, 80);
  EXPECT_FALSE(quantized_gemm_native(QuantFormat::NVFP4, kPlanDefaultSm));  // the dry run plans the emulation
}

// ---- CUDA: the same op on the GPU against the CPU backend ---------------------------------------

// A device QuantizedTensor holding the same bytes as a CPU one (codes, compact and swizzled scales,
// amax, scale_inv of every copy present).
QuantizedTensor to_device_quantized(std::vector<Buffer>& owner, const QuantizedTensor& h, int64_t rows,
                                    int64_t cols) {
  QuantizedTensor d = allocate_quantized(owner, Device::CUDA, h.format, rows, cols, h.has_rowwise, h.has_columnwise);
  d.columnwise_rht = h.columnwise_rht;
  auto copy = [](QuantizedCopy& dc, const QuantizedCopy& hc) {
    copy_from_host(dc.data, hc.data.data);
    if (quant_block_size(hc.format) > 1) {
      copy_from_host(dc.scales, hc.scales.data);
      copy_from_host(dc.scales_swizzled, hc.scales_swizzled.data);
    }
    copy_from_host(dc.amax, hc.amax.data);
    copy_from_host(dc.scale_inv, hc.scale_inv.data);
  };
  if (h.has_rowwise) copy(d.rowwise, h.rowwise);
  if (h.has_columnwise) copy(d.columnwise, h.columnwise);
  return d;
}

// One quantized_gemm on both backends: y[M,N] (+)= a · bᵀ with y bf16 (fresh) or f32 (accumulating
// into random y0), compared within the tolerance above.
void check_quantized_gemm(const QuantizedCopy& ha, const QuantizedCopy& hb, const QuantizedCopy& da,
                          const QuantizedCopy& db, bool accumulate, const std::string& what) {
  const int64_t M = ha.rows, N = hb.rows, K = ha.cols;
  std::vector<float> y0(static_cast<size_t>(M * N), 0.0f);
  if (accumulate) {
    std::mt19937 rng(77);
    std::normal_distribution<float> nd(0.0f, 2.0f);
    for (float& v : y0) v = nd(rng);
  }
  std::vector<float> y = y0;
  std::vector<float> sa(static_cast<size_t>(M * K)), sb(static_cast<size_t>(N * K));
  quantized_gemm(cpu_ctx(true), host_view(y, {M, N}), ha, hb, ha.format, accumulate, host_view(sa, {M * K}),
                 host_view(sb, {N * K}));

  DeviceTensor dy = to_device(y0, {M, N}, accumulate ? DType::F32 : DType::BF16);
  DeviceTensor dsa = device_tensor({M * K}, DType::F32);
  DeviceTensor dsb = device_tensor({N * K}, DType::F32);
  quantized_gemm(cuda_ctx(), dy.t, da, db, da.format, accumulate, dsa.t, dsb.t);
  expect_gemm_close(to_host_floats(dy.t), y, abs_products(gemm_dequant(ha).v, gemm_dequant(hb).v, M, N, K, accumulate ? &y0 : nullptr),
                    accumulate ? kF32OutRel : kBf16OutRel, kQuantAccRel, what);
}

struct QuantCase {
  QuantFormat x_format, dy_format;
  bool nvfp4_recipe;  // 2D weight blocks, RHT on the wgrad copies, stochastic rounding of dy
};

// A linear layer's operands w[out,in], x[T,in], dy[T,out] quantized on the CPU with both copies, as
// LinearLayer quantizes them, and their device copies (owned by `owner`).
struct LinearOperands {
  QuantizedTensor wq, xq, dyq;     // CPU
  QuantizedTensor dwq, dxq, ddyq;  // the same bytes on the GPU
};
LinearOperands quantize_linear_operands(std::vector<Buffer>& owner, const QuantCase& qc, std::vector<float>& w,
                                        std::vector<float>& x, std::vector<float>& dy, int64_t T, int64_t in,
                                        int64_t out) {
  LinearOperands o;
  o.wq = allocate_quantized(owner, Device::CPU, qc.x_format, out, in, true, true);
  o.xq = allocate_quantized(owner, Device::CPU, qc.x_format, T, in, true, true);
  o.dyq = allocate_quantized(owner, Device::CPU, qc.dy_format, T, out, true, true);
  QuantizeOptions wo;
  wo.format = qc.x_format;
  wo.rowwise = wo.columnwise = true;
  wo.block_2d = qc.nvfp4_recipe;
  quantize(cpu_ctx(true), o.wq, host_view(w, {out, in}), wo);
  QuantizeOptions xo;
  xo.format = qc.x_format;
  xo.rowwise = xo.columnwise = true;
  xo.rht_columnwise = qc.nvfp4_recipe;
  quantize(cpu_ctx(true), o.xq, host_view(x, {T, in}), xo);
  QuantizeOptions go;
  go.format = qc.dy_format;
  go.rowwise = go.columnwise = true;
  go.rht_columnwise = go.stochastic = qc.nvfp4_recipe;
  go.seed = 0x5EED;
  go.stream_id = 7;
  go.counter = 3;
  quantize(cpu_ctx(true), o.dyq, host_view(dy, {T, out}), go);
  o.dwq = to_device_quantized(owner, o.wq, out, in);
  o.dxq = to_device_quantized(owner, o.xq, T, in);
  o.ddyq = to_device_quantized(owner, o.dyq, T, out);
  return o;
}

// The three GEMMs of a linear layer, as LinearLayer (lib/model/linear_layer.cpp) issues them:
//   fprop  y[T,out]   = x rowwise · w rowwise ᵀ               bf16, overwrite
//   dgrad  dx[T,in]   = dy rowwise · w columnwise ᵀ           bf16, overwrite
//   wgrad  dw[out,in] += dy columnwise · x columnwise ᵀ        f32, accumulate
void check_linear_layer_gemms(const QuantCase& qc, int64_t T, int64_t in, int64_t out, const std::string& label) {
  std::vector<float> x = randn_bf16(static_cast<size_t>(T * in), 1.0f, 41);
  std::vector<float> w = randn_bf16(static_cast<size_t>(out * in), 0.05f, 42);
  std::vector<float> dy = randn_bf16(static_cast<size_t>(T * out), 1e-3f, 43);
  // A few outliers, so that block scales differ widely across the tensors.
  x[5] = 40.0f;
  dy[static_cast<size_t>(T * out) - 3] = -0.5f;

  std::vector<Buffer> owner;
  const auto [wq, xq, dyq, dwq, dxq, ddyq] = quantize_linear_operands(owner, qc, w, x, dy, T, in, out);

  const std::string shape = " T=" + std::to_string(T) + " in=" + std::to_string(in) + " out=" + std::to_string(out);
  check_quantized_gemm(xq.rowwise, wq.rowwise, dxq.rowwise, dwq.rowwise, false, label + " fprop" + shape);
  check_quantized_gemm(dyq.rowwise, wq.columnwise, ddyq.rowwise, dwq.columnwise, false, label + " dgrad" + shape);
  check_quantized_gemm(dyq.columnwise, xq.columnwise, ddyq.columnwise, dxq.columnwise, true, label + " wgrad" + shape);
}

// Runs `body` on the path the GPU takes by default, then once more forced onto the emulated path
// (ForceEmulated, cuda_test_util.h).
template <class Body>
void on_both_paths(Body body) {
#if defined(PL_WITH_CUDA)
  for (bool force : {false, true}) {
    ForceEmulated guard(force);
    body(force ? " [forced emulated]" : "");
  }
#else
  body("");
#endif
}

const int64_t kQuantShapes[][3] = {{128, 256, 192}, {96, 160, 64}};  // T, in, out: scale tiles padded (192, 96, 160, 64)

TEST(CudaQuantizedGemm, Nvfp4MatchesCpu) {
  PL_REQUIRE_CUDA_DEVICE();
#if defined(PL_WITH_CUDA)
  const uint64_t inexact0 = cuda::emulated_gemm_inexact_elements(*cuda_ctx().gpu);
#endif
  on_both_paths([](const std::string& path) {
    for (const auto& s : kQuantShapes) {
      check_linear_layer_gemms({QuantFormat::NVFP4, QuantFormat::NVFP4, true}, s[0], s[1], s[2], "nvfp4" + path);
      check_linear_layer_gemms({QuantFormat::NVFP4, QuantFormat::NVFP4, false}, s[0], s[1], s[2],
                               "nvfp4 (1D, no RHT/SR)" + path);
    }
  });
#if defined(PL_WITH_CUDA)
  // E2M1 x E4M3 is always exact in BF16.
  EXPECT_EQ(cuda::emulated_gemm_inexact_elements(*cuda_ctx().gpu), inexact0);
#endif
}

TEST(CudaQuantizedGemm, Mxfp8MatchesCpu) {
  PL_REQUIRE_CUDA_DEVICE();
#if defined(PL_WITH_CUDA)
  const uint64_t inexact0 = cuda::emulated_gemm_inexact_elements(*cuda_ctx().gpu);
#endif
  on_both_paths([](const std::string& path) {
    for (const auto& s : kQuantShapes)
      check_linear_layer_gemms({QuantFormat::MXFP8, QuantFormat::MXFP8, false}, s[0], s[1], s[2], "mxfp8" + path);
  });
#if defined(PL_WITH_CUDA)
  // Ordinary data keeps every E4M3 x 2^k value far above BF16's subnormal range.
  EXPECT_EQ(cuda::emulated_gemm_inexact_elements(*cuda_ctx().gpu), inexact0);
#endif
}

TEST(CudaQuantizedGemm, Fp8PerTensorMatchesCpu) {
  PL_REQUIRE_CUDA_DEVICE();
  on_both_paths([](const std::string& path) {
    for (const auto& s : kQuantShapes) {
      // Megatron's hybrid (E4M3 x/w, E5M2 dy): fprop E4M3xE4M3, dgrad E5M2xE4M3, wgrad E5M2xE4M3.
      check_linear_layer_gemms({QuantFormat::FP8_E4M3, QuantFormat::FP8_E5M2, false}, s[0], s[1], s[2],
                               "fp8 hybrid" + path);
      // All E4M3.
      check_linear_layer_gemms({QuantFormat::FP8_E4M3, QuantFormat::FP8_E4M3, false}, s[0], s[1], s[2],
                               "fp8 e4m3" + path);
    }
  });
}

// The emulated path's expand kernels, fast (the default) against the reference set (--quantize-kernels
// reference): the BF16 operands they write into the scratch buffers, the GEMM's output and the count of
// inexact elements, bit for bit, for the three GEMMs of a linear layer.
void expect_same_expansion(const QuantizedCopy& da, const QuantizedCopy& db, bool accumulate, const std::string& what) {
#if defined(PL_WITH_CUDA)
  SCOPED_TRACE(what);
  const int64_t M = da.rows, N = db.rows, K = da.cols;
  std::vector<uint8_t> got[2][3];
  uint64_t inexact[2] = {0, 0};
  for (int reference : {1, 0}) {
    ReferenceQuantizeKernels kernels(reference == 1);
    ForceEmulated emulated(true);
    DeviceTensor y = to_device(std::vector<float>(static_cast<size_t>(M * N), 0.5f), {M, N},
                               accumulate ? DType::F32 : DType::BF16);
    DeviceTensor sa = to_device(std::vector<float>(static_cast<size_t>((M * K + 1) / 2), 0.0f), {(M * K + 1) / 2}, DType::F32);
    DeviceTensor sb = to_device(std::vector<float>(static_cast<size_t>((N * K + 1) / 2), 0.0f), {(N * K + 1) / 2}, DType::F32);
    const uint64_t before = cuda::emulated_gemm_inexact_elements(*cuda_ctx().gpu);
    quantized_gemm(cuda_ctx(), y.t, da, db, da.format, accumulate, sa.t, sb.t);
    inexact[reference] = cuda::emulated_gemm_inexact_elements(*cuda_ctx().gpu) - before;
    got[reference][0] = to_host_bytes(sa.t);
    got[reference][1] = to_host_bytes(sb.t);
    got[reference][2] = to_host_bytes(y.t);
  }
  const char* names[3] = {"a's BF16 values", "b's BF16 values", "y"};
  for (int k = 0; k < 3; ++k) {
    size_t bad = 0;
    for (size_t i = 0; i < got[0][k].size(); ++i) bad += got[0][k][i] != got[1][k][i] ? 1 : 0;
    EXPECT_EQ(bad, 0u) << names[k] << ": " << bad << " of " << got[0][k].size() << " bytes differ (fast vs reference)";
  }
  EXPECT_EQ(inexact[0], inexact[1]) << "inexact elements: fast " << inexact[0] << ", reference " << inexact[1];
#else
  (void)da, (void)db, (void)accumulate, (void)what;
#endif
}

TEST(CudaQuantizedGemm, FastExpandEqualsTheReferenceBitForBit) {
  PL_REQUIRE_CUDA_DEVICE();
  const QuantCase cases[] = {{QuantFormat::NVFP4, QuantFormat::NVFP4, true},
                             {QuantFormat::MXFP8, QuantFormat::MXFP8, false},
                             {QuantFormat::FP8_E4M3, QuantFormat::FP8_E5M2, false}};
  for (const QuantCase& qc : cases)
    for (const auto& sh : kQuantShapes) {
      const int64_t T = sh[0], in = sh[1], out = sh[2];
      std::vector<float> x = randn_bf16(static_cast<size_t>(T * in), 1.0f, 61);
      std::vector<float> w = randn_bf16(static_cast<size_t>(out * in), 0.05f, 62);
      std::vector<float> dy = randn_bf16(static_cast<size_t>(T * out), 1e-3f, 63);
      // A block of tiny values: MXFP8's scale byte falls below 3, where the expand counts inexact products.
      for (int64_t k = 0; k < 32; ++k) x[static_cast<size_t>(in + k)] = num::round_bf16(x[static_cast<size_t>(in + k)] * 0x1p-124f);
      x[7] = num::round_bf16(NAN);  // NaN codes expand to BF16's canonical NaN on both sets
      std::vector<Buffer> owner;
      const auto [wq, xq, dyq, dwq, dxq, ddyq] = quantize_linear_operands(owner, qc, w, x, dy, T, in, out);
      const std::string label = std::string(quant_format_name(qc.x_format)) + " T=" + std::to_string(T);
      expect_same_expansion(dxq.rowwise, dwq.rowwise, false, label + " fprop");
      expect_same_expansion(ddyq.rowwise, dwq.columnwise, false, label + " dgrad");
      expect_same_expansion(ddyq.columnwise, dxq.columnwise, true, label + " wgrad");
    }
}

TEST(CudaQuantizedGemm, Fp8E4M3TimesE5M2MatchesCpu) {
  PL_REQUIRE_CUDA_DEVICE();
  const int64_t M = 48, N = 80, K = 96;
  std::vector<float> a = randn_bf16(static_cast<size_t>(M * K), 1.0f, 51);
  std::vector<float> b = randn_bf16(static_cast<size_t>(N * K), 1e-2f, 52);
  std::vector<Buffer> owner;
  QuantizedTensor qa = allocate_quantized(owner, Device::CPU, QuantFormat::FP8_E4M3, M, K, true, false);
  QuantizedTensor qb = allocate_quantized(owner, Device::CPU, QuantFormat::FP8_E5M2, N, K, true, false);
  quantize(cpu_ctx(true), qa, host_view(a, {M, K}), QuantizeOptions{QuantFormat::FP8_E4M3, true, false});
  quantize(cpu_ctx(true), qb, host_view(b, {N, K}), QuantizeOptions{QuantFormat::FP8_E5M2, true, false});
  const QuantizedTensor da = to_device_quantized(owner, qa, M, K);
  const QuantizedTensor db = to_device_quantized(owner, qb, N, K);
  on_both_paths([&](const std::string& path) {
    check_quantized_gemm(qa.rowwise, qb.rowwise, da.rowwise, db.rowwise, false, "fp8 e4m3 x e5m2, bf16 out" + path);
    check_quantized_gemm(qa.rowwise, qb.rowwise, da.rowwise, db.rowwise, true,
                         "fp8 e4m3 x e5m2, f32 accumulate" + path);
  });
}

// Device copies of random data for the rejection tests.
QuantizedTensor device_copy_of_random(std::vector<Buffer>& owner, QuantFormat f, int64_t rows, int64_t cols,
                                      uint32_t seed) {
  std::vector<float> v = randn_bf16(static_cast<size_t>(rows * cols), 1.0f, seed);
  QuantizedTensor q = allocate_quantized(owner, Device::CPU, f, rows, cols, true, false);
  quantize(cpu_ctx(true), q, host_view(v, {rows, cols}), QuantizeOptions{f, true, false});
  return to_device_quantized(owner, q, rows, cols);
}

void expect_quantized_gemm_error(const QuantizedTensor& a, const QuantizedTensor& b, DType ydtype,
                                 const std::string& needle) {
  const int64_t M = a.rowwise.rows, N = b.rowwise.rows, K = a.rowwise.cols;
  DeviceTensor y = device_tensor({M, N}, ydtype);
  DeviceTensor sa = device_tensor({M * K}, DType::F32);
  DeviceTensor sb = device_tensor({N * K}, DType::F32);
  try {
    quantized_gemm(cuda_ctx(), y.t, a.rowwise, b.rowwise, a.format, ydtype == DType::F32, sa.t, sb.t);
    ADD_FAILURE() << "expected an error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "one-line errors: " << e.what();
  }
}

TEST(CudaQuantizedGemm, QuantizedRejectsUnsupportedCombinationsAndShapes) {
  PL_REQUIRE_CUDA_DEVICE();
  std::vector<Buffer> owner;
  // E5M2 x E5M2: no cuBLASLt kernel.
  expect_quantized_gemm_error(device_copy_of_random(owner, QuantFormat::FP8_E5M2, 32, 64, 61),
                              device_copy_of_random(owner, QuantFormat::FP8_E5M2, 32, 64, 62), DType::BF16,
                              "E5M2 x E5M2");
  // NVFP4 with K = 48: rows of 24 bytes.
  expect_quantized_gemm_error(device_copy_of_random(owner, QuantFormat::NVFP4, 32, 48, 63),
                              device_copy_of_random(owner, QuantFormat::NVFP4, 32, 48, 64), DType::BF16, "K % 32");
  // FP8 with K = 40.
  expect_quantized_gemm_error(device_copy_of_random(owner, QuantFormat::FP8_E4M3, 32, 40, 65),
                              device_copy_of_random(owner, QuantFormat::FP8_E4M3, 32, 40, 66), DType::BF16, "K % 16");
  // BF16 output rows of 12 elements = 24 bytes.
  expect_quantized_gemm_error(device_copy_of_random(owner, QuantFormat::FP8_E4M3, 32, 64, 67),
                              device_copy_of_random(owner, QuantFormat::FP8_E4M3, 12, 64, 68), DType::BF16,
                              "multiple of 16 bytes");
  // Mixed block formats.
  expect_quantized_gemm_error(device_copy_of_random(owner, QuantFormat::MXFP8, 32, 64, 69),
                              device_copy_of_random(owner, QuantFormat::NVFP4, 32, 64, 70), DType::BF16,
                              "cannot multiply");
}

// ---- the cuBLASLt plan cache ---------------------------------------------------------------------------

// A GEMM whose (shape, types, alignment) key was seen makes no new descriptor, layout or heuristic
// query, and gives bit-identical results from other buffers of the same key.
TEST(CudaQuantizedGemm, RepeatedShapesReuseTheirCuBlasLtPlans) {
  PL_REQUIRE_CUDA_DEVICE();
#if defined(PL_WITH_CUDA)
  for (QuantFormat f : {QuantFormat::NVFP4, QuantFormat::FP8_E4M3}) {
    std::vector<Buffer> owner;
    const QuantizedTensor a = device_copy_of_random(owner, f, 64, 128, 81);
    const QuantizedTensor b = device_copy_of_random(owner, f, 96, 128, 82);
    auto run = [&](bool fast) {
      DeviceTensor y = device_tensor({64, 96}, DType::BF16);
      DeviceTensor sa = device_tensor({64 * 128}, DType::F32), sb = device_tensor({96 * 128}, DType::F32);
      quantized_gemm(cuda_ctx(), y.t, a.rowwise, b.rowwise, f, false, sa.t, sb.t, fast);
      return to_host_floats(y.t);
    };
    DeviceTensor bx = to_device(randn_bf16(64 * 128, 1.0f, 83), {64, 128}, DType::BF16);
    DeviceTensor bw = to_device(randn_bf16(96 * 128, 0.05f, 84), {96, 128}, DType::BF16);
    auto run_bf16 = [&] {
      DeviceTensor y = device_tensor({64, 96}, DType::BF16);
      linear_forward(cuda_ctx(), y.t, bx.t, bw.t);
      return to_host_floats(y.t);
    };
    on_both_paths([&](const std::string& path) {
      for (bool fast : {false, true}) {
        const std::vector<float> first = run(fast);
        const std::vector<float> bf_first = run_bf16();
        const size_t plans = cuda::lt_plan_count(*cuda_ctx().gpu);
        EXPECT_EQ(run(fast), first) << quant_format_name(f) << path;
        EXPECT_EQ(run_bf16(), bf_first) << path;
        EXPECT_EQ(cuda::lt_plan_count(*cuda_ctx().gpu), plans) << quant_format_name(f) << path << ": a repeated GEMM made a plan";
      }
    });
  }
#endif
}

// ---- production shapes: Llama-3-8B linears, micro-batch 1, seq 4096 ------------------------------------
// tokens 4096, hidden 4096, qkv out 6144, ffn 14336 (fc1 out 28672). Operands quantized on the CPU
// as LinearLayer does (x 1x16/1x32/per tensor, w 16x16 for NVFP4, dy with SR; RHT on the wgrad
// copies), the full GEMM on the GPU (native path and forced emulated), checked against the CPU on
// 32 output rows across a 128-row scale-tile boundary (16 on each side; every column tile of B and
// every K block takes part). The CPU side of a check is 2 GEMMs of 32 x N x K (the product and the
// Σ|a·b| bound): 126 GFLOP for the 7 linears x 3 passes below, where 128 rows took 502 GFLOP (issue
// 26: the conformance step must fit its time limit on the GPU host). The tolerance is the small-shape one with the summation
// term scaled for K: any FP32 order is within K·2^-24·Σ|ab| of exact, and Hopper's FP8 accumulators
// (FAST_ACCUM in fprop, as TE) lose ~2^-14 per promotion interval, so acc_rel = 2^-8·max(1, K/512).

double quant_acc_rel(int64_t K) { return kQuantAccRel * std::max(1.0, static_cast<double>(K) / 512.0); }

// Rows [r0, r0+n) of a CPU copy as a copy of its own: codes and compact scales (what the CPU GEMM reads).
QuantizedCopy row_slice(const QuantizedCopy& c, int64_t r0, int64_t n) {
  QuantizedCopy s = c;
  s.rows = n;
  s.data = c.data.rows(r0, n);
  if (quant_block_size(c.format) > 1) s.scales = c.scales.rows(r0, n);
  return s;
}

// y[M,N] (+)= a·bᵀ on the GPU (both paths), rows [r0, r0+n) against the CPU.
void check_quantized_gemm_rows(const QuantizedCopy& ha, const QuantizedCopy& hb, const QuantizedCopy& da,
                               const QuantizedCopy& db, bool accumulate, bool fast_accum, const std::string& what) {
  const int64_t M = ha.rows, N = hb.rows, K = ha.cols, n = 32, r0 = M - 144;  // rows [M-144, M-112): across M-128
  ASSERT_GE(r0, 0) << what;
  // y0 (accumulating GEMMs): values of magnitude ~1, cheap to make.
  std::vector<float> y0(accumulate ? static_cast<size_t>(M * N) : 0);
  for (size_t i = 0; i < y0.size(); ++i) y0[i] = static_cast<float>(static_cast<int>((i * 2654435761u) % 2001u) - 1000) / 500.0f;
  // CPU: the row slice of a times all of b.
  const QuantizedCopy as = row_slice(ha, r0, n);
  std::vector<float> ycpu(static_cast<size_t>(n * N), 0.0f);
  if (accumulate) std::copy(y0.begin() + r0 * N, y0.begin() + (r0 + n) * N, ycpu.begin());
  const std::vector<float> ycpu0 = ycpu;
  {
    std::vector<float> sa(static_cast<size_t>(n * K)), sb(static_cast<size_t>(N * K));
    quantized_gemm(cpu_ctx(true), host_view(ycpu, {n, N}), as, hb, ha.format, accumulate,
                   host_view(sa, {n * K}), host_view(sb, {N * K}));
  }
  // Σ|a·b| per output (+|y0|) by an FP32 GEMM of the absolute dequantized values.
  std::vector<double> mag(static_cast<size_t>(n * N));
  {
    std::vector<float> aa = gemm_dequant(as).v, bb = gemm_dequant(hb).v, m(static_cast<size_t>(n * N));
    for (float& v : aa) v = std::fabs(v);
    for (float& v : bb) v = std::fabs(v);
    OpContext f32;
    f32.round_bf16 = false;
    linear_forward(f32, host_view(m, {n, N}), host_view(aa, {n, K}), host_view(bb, {N, K}));
    for (size_t i = 0; i < mag.size(); ++i) mag[i] = static_cast<double>(m[i]) + std::fabs(ycpu0[i]);
  }
  on_both_paths([&](const std::string& path) {
    DeviceTensor y = accumulate ? to_device(y0, {M, N}, DType::F32) : device_tensor({M, N}, DType::BF16);
    DeviceTensor sa = device_tensor({(M * K + 1) / 2}, DType::F32);  // BF16 operands of the emulation
    DeviceTensor sb = device_tensor({(N * K + 1) / 2}, DType::F32);
    quantized_gemm(cuda_ctx(), y.t, da, db, da.format, accumulate, sa.t, sb.t, fast_accum);
    expect_gemm_close(to_host_floats(y.t.rows(r0, n)), ycpu, mag, accumulate ? kF32OutRel : kBf16OutRel, quant_acc_rel(K),
                 what + path + " rows [" + std::to_string(r0) + ", " + std::to_string(r0 + n) + ")");
  });
}

void check_production_linear(const QuantCase& qc, int64_t in, int64_t out, const std::string& label) {
  const int64_t T = 4096;
  const std::string shape = " T=" + std::to_string(T) + " in=" + std::to_string(in) + " out=" + std::to_string(out);
  SCOPED_TRACE(label + shape);
  std::vector<float> x = fast_bf16(T * in, 1.0f, 91), w = fast_bf16(out * in, 0.02f, 92), dy = fast_bf16(T * out, 1e-3f, 93);
  std::vector<Buffer> owner;
  const auto [wq, xq, dyq, dwq, dxq, ddyq] = quantize_linear_operands(owner, qc, w, x, dy, T, in, out);
  check_quantized_gemm_rows(xq.rowwise, wq.rowwise, dxq.rowwise, dwq.rowwise, false, true, label + " fprop" + shape);
  check_quantized_gemm_rows(dyq.rowwise, wq.columnwise, ddyq.rowwise, dwq.columnwise, false, false,
                            label + " dgrad" + shape);
  check_quantized_gemm_rows(dyq.columnwise, xq.columnwise, ddyq.columnwise, dxq.columnwise, true, false,
                            label + " wgrad" + shape);
}

constexpr int64_t kQuantizedGemmHidden = 4096, kQkvOut = 6144, kQuantizedGemmFfn = 14336;

TEST(CudaQuantizedGemmProduction, Nvfp4Llama8bLinears) {
  PL_REQUIRE_CUDA_DEVICE();
  const QuantCase qc{QuantFormat::NVFP4, QuantFormat::NVFP4, true};
  check_production_linear(qc, kQuantizedGemmHidden, kQkvOut, "nvfp4 qkv");
  check_production_linear(qc, kQuantizedGemmHidden, 2 * kQuantizedGemmFfn, "nvfp4 fc1");
  check_production_linear(qc, kQuantizedGemmFfn, kQuantizedGemmHidden, "nvfp4 fc2");
}

TEST(CudaQuantizedGemmProduction, Mxfp8Llama8bLinears) {
  PL_REQUIRE_CUDA_DEVICE();
  const QuantCase qc{QuantFormat::MXFP8, QuantFormat::MXFP8, false};
  check_production_linear(qc, kQuantizedGemmHidden, kQkvOut, "mxfp8 qkv");
  check_production_linear(qc, kQuantizedGemmFfn, kQuantizedGemmHidden, "mxfp8 fc2");
}

TEST(CudaQuantizedGemmProduction, Fp8HybridLlama8bLinears) {
  PL_REQUIRE_CUDA_DEVICE();
  const QuantCase qc{QuantFormat::FP8_E4M3, QuantFormat::FP8_E5M2, false};
  check_production_linear(qc, kQuantizedGemmHidden, kQkvOut, "fp8 hybrid qkv");
  check_production_linear(qc, kQuantizedGemmFfn, kQuantizedGemmHidden, "fp8 hybrid fc2");
}

// ---- what runs (pure; runs without a device) ----------------------------------------------------------

TEST(CudaQuantizedGemmDescription, NamesNativeAndEmulatedPaths) {
#if defined(PL_WITH_CUDA)
  using cuda::GemmExecution;
  EXPECT_EQ(cuda::gemm_backend_description(QuantFormat::NVFP4, 100),
            "NVFP4 GEMMs: native on sm_100 (cuBLASLt, E2M1 with VEC16_UE4M3 block scales)");
  EXPECT_EQ(cuda::gemm_backend_description(QuantFormat::NVFP4, 90),
            "NVFP4 GEMMs: emulated on sm_90 (exact dequantize to BF16 + BF16 GEMM)");
  EXPECT_EQ(cuda::gemm_backend_description(QuantFormat::MXFP8, 103),
            "MXFP8 GEMMs: native on sm_103 (cuBLASLt, E4M3 with VEC32_UE8M0 block scales)");
  EXPECT_EQ(cuda::gemm_backend_description(QuantFormat::FP8_E5M2, 90),
            "FP8 GEMMs: native on sm_90 (cuBLASLt, per-tensor FP32 scales)");
  EXPECT_EQ(cuda::gemm_backend_description(QuantFormat::FP8_E4M3, 80),
            "FP8 GEMMs: emulated on sm_80 (exact dequantize to BF16 + BF16 GEMM)");
  EXPECT_EQ(cuda::gemm_backend_description(90),
            "GEMMs on sm_90: BF16 native (cuBLASLt); FP8 native (cuBLASLt); MXFP8 emulated (exact dequantize to BF16 "
            "+ BF16 GEMM); NVFP4 emulated (exact dequantize to BF16 + BF16 GEMM)");
  // The banner: BF16 first, then one line per format the plan uses (E4M3 and E5M2 share "FP8").
  const std::vector<std::string> lines =
      cuda::gemm_backend_lines({QuantFormat::FP8_E4M3, QuantFormat::FP8_E5M2, QuantFormat::NVFP4}, 120);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "BF16 GEMMs: native on sm_120 (cuBLASLt, FP32 accumulation)");
  EXPECT_EQ(lines[1], "FP8 GEMMs: native on sm_120 (cuBLASLt, per-tensor FP32 scales)");
  EXPECT_EQ(lines[2], "NVFP4 GEMMs: emulated on sm_120 (exact dequantize to BF16 + BF16 GEMM)");
  EXPECT_EQ(cuda::gemm_backend_lines({}, 90).size(), 1u);
  for (int sm : {100, 103}) {
    EXPECT_EQ(cuda::quantized_gemm_execution(QuantFormat::NVFP4, sm), GemmExecution::Native);
    EXPECT_EQ(cuda::quantized_gemm_execution(QuantFormat::MXFP8, sm), GemmExecution::Native);
  }
  for (int sm : {80, 89, 90, 120, 121}) {
    EXPECT_EQ(cuda::quantized_gemm_execution(QuantFormat::NVFP4, sm), GemmExecution::Emulated);
    EXPECT_EQ(cuda::quantized_gemm_execution(QuantFormat::MXFP8, sm), GemmExecution::Emulated);
  }
  for (int sm : {89, 90, 100, 103, 120})
    EXPECT_EQ(cuda::quantized_gemm_execution(QuantFormat::FP8_E4M3, sm), GemmExecution::Native);
  EXPECT_EQ(cuda::quantized_gemm_execution(QuantFormat::FP8_E4M3, 80), GemmExecution::Emulated);
  EXPECT_EQ(cuda::quantized_gemm_execution(QuantFormat::FP8_E5M2, 86), GemmExecution::Emulated);
  EXPECT_NE(cuda::gemm_backend_description(OpContext{}).find("emulated"), std::string::npos);
#else
  GTEST_SKIP() << "this build has no CUDA backend";
#endif
}

// The device the tests run on is one the build has code for, and the context accepted it.
TEST(CudaQuantizedGemmDescription, TheCurrentGpuIsSupported) {
  PL_REQUIRE_CUDA_DEVICE();
#if defined(PL_WITH_CUDA)
  EXPECT_NO_THROW(cuda_ctx());
  EXPECT_GE(device_sm(cuda_ctx()), kMinCudaSm);
  const std::vector<std::string> lines = cuda::gemm_backend_lines(*cuda_ctx().gpu, {QuantFormat::NVFP4});
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[1].find("sm_" + std::to_string(device_sm(cuda_ctx()))), std::string::npos) << lines[1];
#endif
}

}  // namespace
}  // namespace pl::optest
