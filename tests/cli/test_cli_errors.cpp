// The pretrain_llama command line: every bad input stops before training with a non-zero exit
// code and exactly one line on stderr naming the flag or file; --help lists every flag.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "test_util.h"
#include "cli/programs.h"

namespace {

using pl::test::ProcessResult;



// A failing run on llama_tiny (so nothing big is ever loaded) with one stderr line containing `needles`.
void expect_one_line_failure(const std::vector<std::string>& args, const std::vector<std::string>& needles) {
  std::string cmd;
  for (const auto& a : args) cmd += " " + a;
  SCOPED_TRACE("pretrain_llama" + cmd);
  const ProcessResult r = run_app(args);
  ASSERT_FALSE(r.timed_out);
  EXPECT_NE(r.exit_code, 0) << "stdout:\n" << r.out;
  const auto lines = pl::test::split_lines(r.err);
  ASSERT_EQ(lines.size(), 1u) << "stderr:\n" << r.err;
  EXPECT_FALSE(lines[0].empty());
  EXPECT_EQ(r.err.back(), '\n');
  for (const std::string& n : needles) EXPECT_NE(lines[0].find(n), std::string::npos) << "'" << n << "' not in: " << lines[0];
}

std::vector<std::string> cli_errors_tiny(std::vector<std::string> extra) {
  std::vector<std::string> a = {"--model", kTiny, "--device", "cpu"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

TEST(CliErrors, TrainItersZero) { expect_one_line_failure(cli_errors_tiny({"--train-iters", "0"}), {"--train-iters"}); }

TEST(CliErrors, TrainItersNotANumber) {
  expect_one_line_failure(cli_errors_tiny({"--train-iters", "abc"}), {"--train-iters", "abc"});
}

TEST(CliErrors, GlobalBatchNotDivisibleByMicroBatch) {
  expect_one_line_failure(cli_errors_tiny({"--global-batch-size", "10", "--micro-batch-size", "4"}),
                          {"--global-batch-size", "--micro-batch-size"});
}

TEST(CliErrors, UnknownQuantizeKernels) {
  expect_one_line_failure(cli_errors_tiny({"--quantize-kernels", "turbo"}), {"--quantize-kernels", "fast, reference", "turbo"});
}

TEST(CliErrors, UnknownDevice) {
  expect_one_line_failure({"--model", kTiny, "--device", "tpu"}, {"--device", "tpu"});
}

TEST(CliErrors, UnknownModelName) {
  expect_one_line_failure({"--model", "does_not_exist", "--device", "cpu"}, {"model", "does_not_exist"});
}

TEST(CliErrors, MissingModelFile) {
  expect_one_line_failure({"--model", "/nonexistent/x.json", "--device", "cpu"}, {"/nonexistent/x.json"});
}

TEST(CliErrors, UnknownRecipeName) {
  expect_one_line_failure(cli_errors_tiny({"--recipe", "no_such_recipe"}), {"recipe", "no_such_recipe"});
}

TEST(CliErrors, ModelWithUnknownKey) {
  pl::test::TempDir dir;
  std::string text = pl::test::read_text_file(kTiny);
  const size_t brace = text.find('{');
  ASSERT_NE(brace, std::string::npos);
  text.insert(brace + 1, "\n  \"num_layerz\": 2,");
  const std::string p = dir.write("typo_model.json", text);
  expect_one_line_failure({"--model", p, "--device", "cpu"}, {p, "num_layerz"});
}

TEST(CliErrors, RecipeWithFp4AndFp8) {
  pl::test::TempDir dir;
  const std::string p = dir.write("both.json", R"({"name": "both", "fp4": "e2m1", "fp8": "e4m3"})");
  expect_one_line_failure(cli_errors_tiny({"--recipe", p}), {p, "fp4", "fp8"});
}

TEST(CliErrors, UnknownFlag) { expect_one_line_failure(cli_errors_tiny({"--unknown-flag"}), {"--unknown-flag"}); }

TEST(CliErrors, NegativeLearningRate) { expect_one_line_failure(cli_errors_tiny({"--lr", "-1"}), {"--lr"}); }

TEST(CliErrors, MinLrAboveLr) {
  expect_one_line_failure(cli_errors_tiny({"--lr", "1e-4", "--min-lr", "1e-3"}), {"--min-lr"});
}

TEST(CliErrors, Nvfp4TokensBlockRule) {
  // 1 x 15 tokens cannot fill the 16-element blocks of the NVFP4 weight-gradient GEMM.
  expect_one_line_failure(cli_errors_tiny({"--global-batch-size", "1", "--micro-batch-size", "1", "--seq-length", "15"}),
                          {"15", "nvfp4"});
}

TEST(Cli, HelpListsEveryFlag) {
  const ProcessResult r = run_app({"--help"});
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(r.err.empty()) << r.err;
  for (const char* flag : {"--disable-fp4", "--train-iters", "--warmup-iters", "--global-batch-size",
                           "--micro-batch-size", "--seq-length", "--model", "--recipe", "--device", "--seed", "--lr",
                           "--min-lr", "--log-interval", "--threads", "--log-quant-stats-interval"})
    EXPECT_NE(r.out.find(flag), std::string::npos) << flag << " missing from --help:\n" << r.out;
  // The playbook's defaults are shown.
  EXPECT_NE(r.out.find("bf16_with_nvfp4_mixed"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("llama3_8b"), std::string::npos) << r.out;
}

}  // namespace

namespace {

TEST(Cli, DryRunPrintsTheMemoryPlanWithoutTouchingTheDevice) {
  for (const char* fp4 : {"", "--disable-fp4"}) {
    std::vector<std::string> args = {"--dry-run", "--model", PL_CONFIG_DIR "/models/llama3_8b.json", "--micro-batch-size",
                                     "4", "--seq-length", "4096"};
    if (*fp4) args.push_back(fp4);
    const ProcessResult r = run_app(args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("parameters: 8.03 B"), std::string::npos) << r.out;
    // Megatron's theoretical weight+optimizer figure for the BF16 setting (SPEC-MEGATRON §1a).
    EXPECT_NE(r.out.find("weight and optimizer=137853.14 MB"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("memory total"), std::string::npos) << r.out;
    const bool nvfp4 = *fp4 == '\0';
    EXPECT_EQ(r.out.find("layers 0-27  : linear_qkv linear_proj linear_fc1 linear_fc2 in nvfp4") != std::string::npos,
              nvfp4)
        << r.out;
    EXPECT_EQ(r.out.find(" iteration "), std::string::npos);
  }
}

TEST(CliErrors, BadRecomputeValue) {
  expect_one_line_failure(cli_errors_tiny({"--recompute", "selective"}), {"--recompute", "selective"});
}

// Megatron's recompute flags (issue 42): selective is not built, a count must be a layer of the model, a method or a
// count needs the granularity, block needs its count.
TEST(CliErrors, BadRecomputeFlags) {
  expect_one_line_failure(cli_errors_tiny({"--recompute-granularity", "selective"}),
                          {"--recompute-granularity selective", "not built"});
  expect_one_line_failure(cli_errors_tiny({"--recompute-granularity", "full", "--recompute-num-layers", "0"}),
                          {"--recompute-num-layers", ">= 1", "0"});
  expect_one_line_failure(cli_errors_tiny({"--recompute-granularity", "full", "--recompute-num-layers", "3"}),
                          {"--recompute-num-layers 3", "2 layers"});
  expect_one_line_failure(cli_errors_tiny({"--recompute-method", "block", "--recompute-num-layers", "1"}),
                          {"--recompute-method block", "needs --recompute-granularity full"});
  expect_one_line_failure(cli_errors_tiny({"--recompute-num-layers", "1"}),
                          {"--recompute-num-layers 1", "needs --recompute-granularity full"});
  expect_one_line_failure(cli_errors_tiny({"--recompute-granularity", "full", "--recompute-method", "block"}),
                          {"--recompute-method block needs --recompute-num-layers"});
  expect_one_line_failure(cli_errors_tiny({"--recompute-granularity", "full", "--recompute-method", "chunked"}),
                          {"--recompute-method", "uniform or block", "chunked"});
  expect_one_line_failure(cli_errors_tiny({"--recompute", "none", "--recompute-granularity", "full"}),
                          {"--recompute none", "--recompute-granularity full"});
}

}  // namespace

namespace {

// --num-layers 4 over llama3_8b: the real 8B layer shapes, an eighth of the layers.
TEST(Cli, DryRunWithFewerLayersPlansTheRealLayerShapes) {
  const ProcessResult r = run_app({"--dry-run", "--model", "llama3_8b", "--num-layers", "4", "--micro-batch-size", "1",
                                   "--seq-length", "4096"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("with --num-layers 4"), std::string::npos) << r.out;
  // 4 layers of 218.1 M + embedding and LM head 2 x 128256 x 4096 + final norm = 1.923 B.
  EXPECT_NE(r.out.find("parameters: 1.92 B"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("memory total"), std::string::npos) << r.out;
  // The BF16 edge layers of the recipe still apply to the shortened model, and the plan says what it did.
  EXPECT_NE(r.out.find("plan"), std::string::npos) << r.out;
}

// Megatron's --num-layers-at-end-in-bf16 over the recipe: 0 quantizes every layer of the short model.
TEST(Cli, BF16EdgeLayerFlagsOverrideTheRecipe) {
  const ProcessResult r = run_app({"--dry-run", "--model", "llama3_8b", "--num-layers", "4", "--num-layers-at-end-in-bf16",
                                   "0", "--micro-batch-size", "1", "--seq-length", "4096"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("layers 0-3   : linear_qkv linear_proj linear_fc1 linear_fc2 in nvfp4"), std::string::npos) << r.out;
  const ProcessResult s = run_app({"--dry-run", "--model", "llama3_8b", "--num-layers", "4", "--num-layers-at-start-in-bf16",
                                   "1", "--num-layers-at-end-in-bf16", "1", "--micro-batch-size", "1", "--seq-length", "4096"});
  ASSERT_EQ(s.exit_code, 0) << s.err;
  EXPECT_NE(s.out.find("layers 1-2   : linear_qkv linear_proj linear_fc1 linear_fc2 in nvfp4"), std::string::npos) << s.out;
  expect_one_line_failure(cli_errors_tiny({"--num-layers-at-end-in-bf16", "-1"}), {"--num-layers-at-end-in-bf16"});
}

TEST(CliErrors, ShapeFlagMustBePositive) {
  expect_one_line_failure(cli_errors_tiny({"--num-layers", "0"}), {"--num-layers", "0"});
  expect_one_line_failure(cli_errors_tiny({"--hidden-size", "-8"}), {"--hidden-size"});
}

TEST(CliErrors, ShapeFlagThatBreaksTheModel) {
  expect_one_line_failure(cli_errors_tiny({"--num-attention-heads", "7"}), {"--num-attention-heads 7"});
}

TEST(CliErrors, ShapeFlagWithHuggingFaceInit) {
  expect_one_line_failure(cli_errors_tiny({"--num-layers", "1", "--init-from-hf", "/nonexistent"}), {"--num-layers 1", "--init-from-hf"});
}

}  // namespace

// ---- issue 14: nonsense that used to be accepted, and the index memory check ----------------------

TEST(CliErrors, NegativeSeedIsRefusedNotWrapped) {
  expect_one_line_failure(cli_errors_tiny({"--seed", "-1", "--dry-run"}), {"--seed", "-1"});
}

TEST(CliErrors, TrainSamplesThatOverflowInt64) {
  expect_one_line_failure(cli_errors_tiny({"--train-iters", "4611686018427387904", "--dry-run"}), {"--train-iters", "overflows"});
}

TEST(CliErrors, EvalItersWhoseIndicesDoNotFitInHostMemory) {
  // A billion validation batches: the indices would take hundreds of GB. Refused before allocating.
  expect_one_line_failure(cli_errors_tiny({"--train-iters", "1", "--global-batch-size", "4", "--micro-batch-size", "4",
                                           "--seq-length", "32", "--eval-iters", "1000000000", "--threads", "1"}),
                          {"valid split", "GB of host memory", "--eval-iters"});
}
