// --fp8-param-gather / --no-fp8-param-gather over the FP8 recipes' fp8_param_gather (FP8 primary weights,
// issue 39) end to end on a 4-layer llama_tiny (CPU): the banner says which, the iteration lines are the same
// either way, the refusals are one line, and the dry run of the FP8 8B names flags that fit an H200 without
// the optimizer offload.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "test_util.h"
#include "cli/programs.h"

namespace {

using pl::test::ProcessResult;

const std::string kFp8 = "bf16_with_fp8_current_scaling_mixed";

std::vector<std::string> fp8_param_gather_tiny(const std::vector<std::string>& extra, const std::string& recipe = kFp8,
                                               const std::string& iters = "4") {
  std::vector<std::string> a = {"--model", kTiny, "--num-layers", "4", "--device", "cpu", "--threads", "2",
                                "--train-iters", iters, "--global-batch-size", "4", "--micro-batch-size", "2",
                                "--seq-length", "64", "--recipe", recipe};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}


bool has(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

TEST(Fp8ParamGatherCli, TheBannerSaysWhichAndTheIterationsAreTheSame) {
  const ProcessResult on = run_app(fp8_param_gather_tiny({}));
  ASSERT_EQ(on.exit_code, 0) << on.err;
  const ProcessResult off = run_app(fp8_param_gather_tiny({"--no-fp8-param-gather"}));
  ASSERT_EQ(off.exit_code, 0) << off.err;
  EXPECT_TRUE(has(on.out, "FP8 primary weights (fp8_param_gather): on -- the 8 FP8 linear layers' weights")) << on.out;
  EXPECT_TRUE(has(off.out, "FP8 primary weights (fp8_param_gather): off -- the FP8 layers keep BF16 weights")) << off.out;
  EXPECT_TRUE(has(off.out, "| --no-fp8-param-gather")) << off.out;  // the recipe note
  const auto lines = pl::test::iteration_lines(on.out, 1);
  ASSERT_EQ(lines.size(), 4u) << on.out;
  EXPECT_EQ(pl::test::iteration_lines(off.out, 1), lines);
}

TEST(Fp8ParamGatherCli, RefusedInOneLineWhereItCannotBeOn) {
  const auto refused = [](const std::vector<std::string>& args, const std::string& message) {
    SCOPED_TRACE(message);
    const ProcessResult r = run_app(args);
    EXPECT_NE(r.exit_code, 0);
    const auto lines = pl::test::split_lines(r.err);
    ASSERT_EQ(lines.size(), 1u) << r.err;
    EXPECT_TRUE(has(lines[0], message)) << lines[0];
  };
  refused(fp8_param_gather_tiny({"--fp8-param-gather"}, "bf16_mixed"),
          "--fp8-param-gather keeps FP8 weights, but recipe 'bf16_mixed' has no FP8 layer");
  const std::vector<std::string> offload = {"--use-precision-aware-optimizer", "--optimizer-cpu-offload"};
  std::vector<std::string> both = offload;
  both.push_back("--fp8-param-gather");
  refused(fp8_param_gather_tiny(both), "--optimizer-cpu-offload keeps the master weights");
  refused(fp8_param_gather_tiny({"--fp8-param-gather", "--no-fp8-param-gather"}), "--no-fp8-param-gather");
  // From the recipe, the offload turns it off and the banner says why.
  const ProcessResult r = run_app(fp8_param_gather_tiny(offload, kFp8, "1"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "FP8 primary weights (fp8_param_gather): off -- --optimizer-cpu-offload keeps")) << r.out;
}

// Acceptance 2 of issue 39: the FP8 8B at micro-batch 1, seq 4096 fits an H200 with the BF16 moments alone.
TEST(Fp8ParamGatherCli, TheFp8Llama8bDryRunFitsAnH200WithoutTheOffload) {
  const ProcessResult r = run_app({"--dry-run", "--model", "llama3_8b", "--recipe", kFp8, "--micro-batch-size", "1",
                                   "--seq-length", "4096"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "plan   FP8 primary weights (fp8_param_gather): on -- the 120 FP8 linear layers")) << r.out;
  EXPECT_TRUE(has(r.out, "weights (bf16 but FP8 layers)")) << r.out;
  std::string h200;
  for (const std::string& l : pl::test::split_lines(r.out))
    if (has(l, "fit    H200 141GB")) h200 = l;
  ASSERT_FALSE(h200.empty()) << r.out;
  EXPECT_TRUE(has(h200, "--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16 (GPU")) << h200;
  EXPECT_FALSE(has(h200, "--optimizer-cpu-offload")) << h200;
}

}  // namespace
