// FP8 delayed scaling (numerics/delayed_scaling.h, the delayed_scaling_update op, quantize with a given
// scale): the scale sequence of a tensor over a few steps against a hand computation of Transformer
// Engine's rule (kernel_bulk in transformer_engine/common/recipe/delayed_scaling.cu): the history roll,
// "max" vs "most_recent", the margin, the first step (scale 1), a step without an amax (no roll), and
// Inf / NaN / tiny amaxes.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/quantize.h"
#include "numerics/delayed_scaling.h"
#include "numerics/fp8.h"
#include "ops/op_test_util.h"

namespace pl {
namespace {

// One tensor's state: history [len] (one column) and scale, run step by step through the shared rule.
struct OneTensor {
  std::vector<float> h;
  float scale = 1.0f;  // TE's initial scale
  explicit OneTensor(int len) : h(static_cast<size_t>(len), 0.0f) {}
  // The quantizer records `amax` (0: the tensor was not quantized this step), then the update runs.
  float step(float amax, bool most_recent, float scaled_max) {
    h[0] = amax;
    num::delayed_scaling_update_one(h.data(), static_cast<int64_t>(h.size()), 1, 0, &scale, most_recent, scaled_max);
    return scale;
  }
};

// amaxes 2, 8, 4, 1, (none), 0.5 with a history of 3 steps. By hand (TE: m = max over the last 3
// recorded amaxes; the roll keeps h = [0, older, newest]):
//   max:         448/2 = 224, 448/8 = 56, max(8,4) -> 56, max(8,4,1) -> 56, no amax -> kept 56,
//                max(4,1,0.5) -> 448/4 = 112 (the 8 of step 2 has left the window)
//   most_recent: 224, 56, 112, 448, kept 448, 896
TEST(DelayedScaling, ScaleSequenceFollowsTransformerEnginesRule) {
  const float amaxes[6] = {2.0f, 8.0f, 4.0f, 1.0f, 0.0f, 0.5f};
  const float want_max[6] = {224.0f, 56.0f, 56.0f, 56.0f, 56.0f, 112.0f};
  const float want_recent[6] = {224.0f, 56.0f, 112.0f, 448.0f, 448.0f, 896.0f};
  const float want_margin1[6] = {112.0f, 28.0f, 28.0f, 28.0f, 28.0f, 56.0f};
  OneTensor a(3), b(3), c(3);
  const float e4m3 = num::delayed_scaled_max(num::kE4M3Max, 0);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(a.step(amaxes[i], false, e4m3), want_max[i]) << "step " << i + 1;
    EXPECT_EQ(b.step(amaxes[i], true, e4m3), want_recent[i]) << "step " << i + 1;
    EXPECT_EQ(c.step(amaxes[i], false, num::delayed_scaled_max(num::kE4M3Max, 1)), want_margin1[i]) << "step " << i + 1;
  }
  // The history after step 6: row 0 cleared, then the last two recorded amaxes, oldest first.
  EXPECT_EQ(a.h, (std::vector<float>{0.0f, 1.0f, 0.5f}));
  EXPECT_EQ(num::delayed_scaled_max(num::kE5M2Max, 2), 14336.0f);
}

TEST(DelayedScaling, HistoryOfOneIsCurrentScalingOfThePreviousStep) {
  OneTensor a(1);
  EXPECT_EQ(a.step(3.5f, false, 448.0f), 128.0f);
  EXPECT_EQ(a.h[0], 0.0f);
  EXPECT_EQ(a.step(7.0f, false, 448.0f), 64.0f);
}

TEST(DelayedScaling, NonFiniteAndTinyAmaxes) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  OneTensor a(2);
  EXPECT_EQ(a.step(4.0f, false, 448.0f), 112.0f);
  EXPECT_EQ(a.step(inf, false, 448.0f), 112.0f);  // Inf enters the history: the scale is kept...
  EXPECT_EQ(a.step(2.0f, false, 448.0f), 112.0f);  // ...while it is in the window
  EXPECT_EQ(a.step(1.0f, false, 448.0f), 224.0f);  // max(2, 1)
  EXPECT_EQ(a.step(nan, false, 448.0f), 448.0f);   // NaN rolls in but the max ignores it (fmaxf): max(1)
  OneTensor b(2);
  EXPECT_EQ(b.step(nan, true, 448.0f), 1.0f);      // most_recent NaN: kept (the initial 1)
  EXPECT_EQ(b.step(1e-44f, true, 448.0f), FLT_MAX);  // 448 / 1e-44 overflows: FLT_MAX
}

// The CPU op runs the rule per column of [len, n], the forward columns with the forward maximum.
TEST(DelayedScaling, OpUpdatesEveryColumnWithItsFormatsMaximum) {
  optest::HostF32 history({2, 2});
  optest::HostF32 scale({2}, 1.0f);
  history.v = {4.0f, 8.0f, 0.0f, 0.0f};  // row 0: this step's amaxes of x (forward) and dy (gradient)
  const DelayedScalingRule rule{.num_forward = 1, .forward_scaled_max = 448.0f, .backward_scaled_max = 57344.0f};
  delayed_scaling_update(optest::cpu_ctx(true), history.t(), scale.t(), rule);
  EXPECT_EQ(scale.v, (std::vector<float>{112.0f, 7168.0f}));
  EXPECT_EQ(history.v, (std::vector<float>{0.0f, 0.0f, 4.0f, 8.0f}));
}

// quantize with a given scale: codes of x * scale, scale_inv 1/scale, the amax recorded.
TEST(DelayedScaling, QuantizeUsesTheGivenScaleAndRecordsTheAmax) {
  std::vector<Buffer> owner;
  QuantizedTensor q = allocate_quantized(owner, Device::CPU, QuantFormat::FP8_E4M3, 2, 16, true, true);
  optest::HostF32 x({2, 16});
  for (size_t i = 0; i < x.v.size(); ++i) x.v[i] = (static_cast<float>(i) - 10.0f) * 0.375f;
  optest::HostF32 scale({1}, 64.0f), record({1}, 0.0f);
  quantize(optest::cpu_ctx(true), q, x.t(),
           {.format = QuantFormat::FP8_E4M3, .rowwise = true, .columnwise = true, .scale = scale.t(),
            .amax_record = record.t(), .compact_scales = true});
  EXPECT_EQ(record.v[0], 21.0f * 0.375f);
  EXPECT_EQ(q.rowwise.scale_inv.f32()[0], 1.0f / 64.0f);
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t k = 0; k < 16; ++k) {
      const uint8_t want = num::float_to_e4m3(x.v[static_cast<size_t>(r * 16 + k)] * 64.0f);
      EXPECT_EQ(q.rowwise.data.u8()[r * 16 + k], want);
      EXPECT_EQ(q.columnwise.data.u8()[k * 2 + r], want);
    }
}

}  // namespace
}  // namespace pl
