// pretrain_llama --peft lora (issue 41) through the program: a tiny run whose banner names the adapters and the
// trainable share and whose loss falls, the NVFP4 base's first loss equal to the full model's (B = 0), and the
// one-line refusals of bad LoRA input and of the flags LoRA does not serve yet (nothing written).
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using pl::test::ProcessResult;

const std::string kApp = PL_APP_PATH;
const std::string kTiny = std::string(PL_CONFIG_DIR) + "/models/llama_tiny.json";

std::vector<std::string> tiny_run(std::vector<std::string> extra, const char* iters = "12") {
  std::vector<std::string> a = {"--model", kTiny, "--device", "cpu", "--train-iters", iters, "--global-batch-size", "4",
                                "--micro-batch-size", "2", "--seq-length", "64", "--lr", "5e-3", "--min-lr", "5e-4",
                                "--warmup-iters", "0", "--log-interval", "1", "--num-layers-at-end-in-bf16", "0"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

std::vector<double> losses_of(const std::string& out) {
  std::vector<double> v;
  const std::regex re(R"(lm loss: ([0-9.E+-]+))");
  for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end; ++it) v.push_back(std::stod((*it)[1]));
  return v;
}

void expect_one_line_failure(const std::vector<std::string>& args, const std::vector<std::string>& needles) {
  const ProcessResult r = pl::test::run_process(kApp, args, 60.0);
  ASSERT_FALSE(r.timed_out);
  EXPECT_NE(r.exit_code, 0) << r.out;
  const auto lines = pl::test::split_lines(r.err);
  ASSERT_EQ(lines.size(), 1u) << r.err;
  for (const std::string& n : needles) EXPECT_NE(lines[0].find(n), std::string::npos) << "'" << n << "' not in: " << lines[0];
}

TEST(LoraCli, ATinyNvfp4RunTrainsTheAdaptersAndSaysWhatTrains) {
  const ProcessResult r = pl::test::run_process(kApp, tiny_run({"--peft", "lora", "--lora-dim", "8", "--lora-alpha", "16",
                                                                "--lora-dropout", "0.1"}), 300.0);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // 2 layers x (8 x (256 + 384) + 8 x (256 + 256) + 8 x (256 + 512) + 8 x (256 + 256)) = 2 x 19,456 = 38,912
  EXPECT_NE(r.out.find("LoRA (--peft lora): adapters on linear_qkv,linear_proj,linear_fc1,linear_fc2 of every layer, "
                       "dim 8, alpha 16 (scale 2), dropout 0.1 (pre), A init xavier, B zero | trainable parameters "
                       "38912"),
            std::string::npos)
      << r.out;
  const std::vector<double> l = losses_of(r.out);
  ASSERT_EQ(l.size(), 12u) << r.out;
  EXPECT_LT(l.back(), l.front() - 0.05);
}

// B = 0: the first iteration's loss is the full model's in the same recipe (and same seed), to the printed digit.
TEST(LoraCli, TheFirstLossIsTheBaseModels) {
  for (const char* recipe : {"bf16_mixed", "bf16_with_nvfp4_mixed"}) {
    const ProcessResult base = pl::test::run_process(kApp, tiny_run({"--recipe", recipe}, "1"), 120.0);
    const ProcessResult lora = pl::test::run_process(kApp, tiny_run({"--recipe", recipe, "--peft", "lora"}, "1"), 120.0);
    ASSERT_EQ(base.exit_code, 0) << base.err;
    ASSERT_EQ(lora.exit_code, 0) << lora.err;
    ASSERT_EQ(losses_of(base.out).size(), 1u);
    EXPECT_EQ(losses_of(base.out), losses_of(lora.out)) << recipe;
  }
}

TEST(LoraCli, BadLoraInputIsOneLineNamingTheFlag) {
  const std::vector<std::string> lora = {"--peft", "lora"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = tiny_run(lora);
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  expect_one_line_failure(with({"--lora-dim", "0"}), {"--lora-dim must be >= 1"});
  expect_one_line_failure(with({"--lora-alpha", "0"}), {"--lora-alpha"});
  expect_one_line_failure(with({"--lora-dropout", "1"}), {"--lora-dropout must be in [0, 1)"});
  expect_one_line_failure(with({"--lora-target-modules", "q_proj,v_proj"}), {"--lora-target-modules", "k_proj"});
  expect_one_line_failure(with({"--lora-target-modules", "lm_head"}), {"--lora-target-modules", "lm_head"});
  expect_one_line_failure(with({"--lora-dropout-position", "after"}), {"--lora-dropout-position"});
  expect_one_line_failure(tiny_run({"--lora-dim", "8"}), {"--lora-dim needs --peft lora"});
  expect_one_line_failure(tiny_run({"--peft", "qlora"}), {"--peft must be none or lora"});
  expect_one_line_failure(with({"--use-precision-aware-optimizer", "--optimizer-cpu-offload"}),
                          {"--peft lora cannot be combined with --optimizer-cpu-offload"});
  expect_one_line_failure(with({"--use-precision-aware-optimizer", "--main-grads-dtype", "bf16"}),
                          {"--peft lora", "--main-grads-dtype bf16"});
  const fs::path save = fs::temp_directory_path() / "pl_lora_cli_save";
  fs::remove_all(save);
  expect_one_line_failure(with({"--save", save.string()}), {"--peft lora cannot be combined with --save"});
  EXPECT_FALSE(fs::exists(save)) << "nothing written";
}

}  // namespace
