// Megatron's OptimizerParamScheduler counted in samples (SPEC-MEGATRON §6), checked against the
// playbook values: max 3e-4, min 3e-5, warmup 2 iterations, 50 iterations, global batch 64.
#include <gtest/gtest.h>
#include <fmt/format.h>

#include <string>
#include <utility>
#include <vector>

#include "train/lr_schedule.h"

namespace {

using pl::LrSchedule;

LrSchedule playbook() { return LrSchedule::from_iterations(3e-4, 3e-5, /*warmup*/ 2, /*iters*/ 50, /*GBS*/ 64); }

TEST(LrSchedule, PlaybookValuesAsLogged) {
  const LrSchedule s = playbook();
  const std::vector<std::pair<int, std::string>> expected = {
      {1, "1.500000E-04"},  {2, "3.000000E-04"},  {3, "2.997110E-04"},  {10, "2.819134E-04"},
      {20, "2.166623E-04"}, {25, "1.738294E-04"}, {49, "3.028905E-05"}, {50, "3.000000E-05"}};
  for (const auto& [k, text] : expected) EXPECT_EQ(fmt::format("{:.6E}", s.lr_at(int64_t{k} * 64)), text) << "k=" << k;
}

TEST(LrSchedule, SamplesNotIterations) {
  const LrSchedule s = playbook();
  EXPECT_EQ(s.warmup_samples, 2 * 64);
  EXPECT_EQ(s.decay_samples, 50 * 64);
  // Mid-warmup, counted in samples: 32 of 128 warmup samples.
  EXPECT_DOUBLE_EQ(s.lr_at(32), 3e-4 * 32.0 / 128.0);
}

TEST(LrSchedule, FirstStepUsesZero) {
  EXPECT_EQ(playbook().lr_at(0), 0.0);
}

TEST(LrSchedule, PeakAtEndOfWarmupAndMinAfterDecay) {
  const LrSchedule s = playbook();
  EXPECT_DOUBLE_EQ(s.lr_at(128), 3e-4);
  EXPECT_DOUBLE_EQ(s.lr_at(50 * 64), 3e-5);
  EXPECT_DOUBLE_EQ(s.lr_at(51 * 64), 3e-5);
  EXPECT_DOUBLE_EQ(s.lr_at(1000 * 64), 3e-5);
}

TEST(LrSchedule, CosineIsMonotoneAfterWarmup) {
  const LrSchedule s = playbook();
  for (int64_t n = 128; n < 50 * 64; n += 64) EXPECT_GT(s.lr_at(n), s.lr_at(n + 64)) << "n=" << n;
}

TEST(LrSchedule, WarmupNotBelowTrainItersIsCapped) {
  // warmup >= decay iterations is capped to decay - 1 (Bridge config.py).
  for (int64_t warmup : {50, 51, 1000}) {
    const LrSchedule s = LrSchedule::from_iterations(3e-4, 3e-5, warmup, 50, 64);
    EXPECT_EQ(s.warmup_samples, 49 * 64) << "warmup=" << warmup;
    EXPECT_EQ(s.decay_samples, 50 * 64);
    EXPECT_DOUBLE_EQ(s.lr_at(49 * 64), 3e-4);
    EXPECT_DOUBLE_EQ(s.lr_at(50 * 64), 3e-5);
  }
  // Just below the cap, nothing changes.
  EXPECT_EQ(LrSchedule::from_iterations(3e-4, 3e-5, 49, 50, 64).warmup_samples, 49 * 64);
}

TEST(LrSchedule, NoWarmupStartsAtPeak) {
  const LrSchedule s = LrSchedule::from_iterations(3e-4, 3e-5, 0, 50, 64);
  EXPECT_EQ(s.warmup_samples, 0);
  EXPECT_DOUBLE_EQ(s.lr_at(0), 3e-4);
  EXPECT_DOUBLE_EQ(s.lr_at(25 * 64), 0.5 * (3e-4 + 3e-5));
}

TEST(LrSchedule, SingleIterationRun) {
  // 1 iteration: warmup is capped to 0; the logged rate after the only step is min_lr.
  const LrSchedule s = LrSchedule::from_iterations(3e-4, 3e-5, 2, 1, 64);
  EXPECT_EQ(s.warmup_samples, 0);
  EXPECT_DOUBLE_EQ(s.lr_at(64), 3e-5);
}

}  // namespace
