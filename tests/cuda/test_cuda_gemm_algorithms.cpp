// cuBLASLt's algorithm choice on the GPU (backend/gemm_algorithms.h, issue 39): a plan made under the Timed
// policy records which of the heuristic's first candidates won and their times; the list survives its JSON
// and, installed again, gives the same bits; the GEMM still agrees with the CPU. Skipped without a device.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "backend/device_info.h"
#include "backend/gemm_algorithms.h"
#include "cuda_test_util.h"

namespace pl::test {
namespace {

TEST(CudaGemmAlgorithms, TheTimedChoiceIsRecordedAndReinstalledWithTheSameBits) {
  PL_REQUIRE_CUDA_DEVICE();
  const OpContext ctx = cuda_ctx();
  // A shape no other test uses, so its plan is made here, under the Timed policy.
  const int64_t T = 392, in = 520, out = 264;
  PL_SEEDED_RNG(rng);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(T * in)), w(static_cast<size_t>(out * in));
  for (float& v : x) v = num::round_bf16(nd(rng));
  for (float& v : w) v = num::round_bf16(0.05f * nd(rng));
  DeviceTensor dx = to_device(x, {T, in}, DType::BF16), dw = to_device(w, {out, in}, DType::BF16);
  DeviceTensor dy = device_tensor({T, out}, DType::BF16);
  set_gemm_algorithm_policy(ctx, GemmAlgorithmPolicy::Timed, 4);
  linear_forward(ctx, dy.t, dx.t, dw.t);  // the plan: timed (y written several times)
  set_gemm_algorithm_policy(ctx, GemmAlgorithmPolicy::Heuristic, 1);
  linear_forward(ctx, dy.t, dx.t, dw.t);
  const std::vector<float> first = to_host_floats(dy.t);

  const GemmAlgorithms all = gemm_algorithm_choices(ctx);
  EXPECT_NE(all.device.find("cuBLASLt"), std::string::npos) << all.device;
  const std::string shape = "TN m=264 n=392 k=520 ";
  const GemmAlgorithmChoice* mine = nullptr;
  for (const GemmAlgorithmChoice& c : all.choices)
    if (c.key.rfind(shape, 0) == 0) mine = &c;
  ASSERT_NE(mine, nullptr) << "no plan for " << shape;
  EXPECT_TRUE(mine->source == "timed" || (mine->source == "heuristic" && mine->candidates == 1)) << mine->source;
  EXPECT_LT(mine->chosen, mine->candidates);
  EXPECT_NE(mine->description.find("id "), std::string::npos) << mine->description;
  if (mine->source == "timed") EXPECT_GT(mine->chosen_ms, 0.0);
  std::printf("[          ] %s: %s (%s, %d of %d, %.4f ms; the heuristic's first %.4f ms)\n", mine->key.c_str(),
              mine->description.c_str(), mine->source.c_str(), mine->chosen + 1, mine->candidates, mine->chosen_ms,
              mine->heuristic_ms);

  // Through the checkpoint's JSON and back in: accepted, the same bits.
  const GemmAlgorithms back =
      gemm_algorithms_from_json(nlohmann::json::parse(gemm_algorithms_json(all)), "the list's JSON");
  EXPECT_EQ(back, all);
  EXPECT_TRUE(install_gemm_algorithms(ctx, back).empty());
  linear_forward(ctx, dy.t, dx.t, dw.t);
  expect_bits_equal(to_host_floats(dy.t), first, "the reinstalled algorithm's output");

  // And the GEMM is still the CPU's, up to the FP32 summation order and the BF16 rounding of y.
  std::vector<float> cpu_y(static_cast<size_t>(T * out));
  OpContext cpu{};
  linear_forward(cpu, Tensor(cpu_y.data(), {T, out}, DType::F32), Tensor(x.data(), {T, in}, DType::F32),
                 Tensor(w.data(), {out, in}, DType::F32));
  expect_close_to_cpu(first, cpu_y, 1e-2, 1e-3, 1.0, "timed algorithm vs the CPU");
}

}  // namespace
}  // namespace pl::test
