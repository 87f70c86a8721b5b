// pretrain_llama --peft lora (issue 41) through the program: a tiny run whose banner names the adapters and the
// trainable share and whose loss falls, the NVFP4 base's first loss equal to the full model's (B = 0), and the
// one-line refusals of bad LoRA input and of the flags LoRA does not serve yet (nothing written).
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "test_util.h"
#include "cli/programs.h"

namespace {

namespace fs = std::filesystem;
using pl::test::ProcessResult;

// llama_tiny_bytes: llama_tiny with the byte tokenizer's vocabulary, so generate can run the exports.

std::vector<std::string> lora_tiny_run(std::vector<std::string> extra, const char* iters = "12") {
  std::vector<std::string> a = {"--model", kTinyBytes, "--device", "cpu", "--train-iters", iters, "--global-batch-size", "4",
                                "--micro-batch-size", "2", "--seq-length", "64", "--lr", "5e-3", "--min-lr", "5e-4",
                                "--warmup-iters", "0", "--log-interval", "1", "--num-layers-at-end-in-bf16", "0"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

std::vector<double> lora_losses_of(const std::string& out) {
  std::vector<double> v;
  const std::regex re(R"(lm loss: ([0-9.E+-]+))");
  for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end; ++it) v.push_back(std::stod((*it)[1]));
  return v;
}

void lora_expect_one_line_failure(const std::vector<std::string>& args, const std::vector<std::string>& needles) {
  const ProcessResult r = pl::test::run_process(kApp, args, 60.0);
  ASSERT_FALSE(r.timed_out);
  EXPECT_NE(r.exit_code, 0) << r.out;
  const auto lines = pl::test::split_lines(r.err);
  ASSERT_EQ(lines.size(), 1u) << r.err;
  for (const std::string& n : needles) EXPECT_NE(lines[0].find(n), std::string::npos) << "'" << n << "' not in: " << lines[0];
}

TEST(LoraCli, ATinyNvfp4RunTrainsTheAdaptersAndSaysWhatTrains) {
  const ProcessResult r = pl::test::run_process(kApp, lora_tiny_run({"--peft", "lora", "--lora-dim", "8", "--lora-alpha", "16",
                                                                     "--lora-dropout", "0.1"}), 300.0);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // 2 layers x (8 x (256 + 384) + 8 x (256 + 256) + 8 x (256 + 512) + 8 x (256 + 256)) = 2 x 19,456 = 38,912
  EXPECT_NE(r.out.find("LoRA (--peft lora): adapters on linear_qkv,linear_proj,linear_fc1,linear_fc2 of every layer, "
                       "dim 8, alpha 16 (scale 2), dropout 0.1 (pre), A init xavier, B zero | trainable parameters "
                       "38912"),
            std::string::npos)
      << r.out;
  const std::vector<double> l = lora_losses_of(r.out);
  ASSERT_EQ(l.size(), 12u) << r.out;
  EXPECT_LT(l.back(), l.front() - 0.05);
}

// B = 0: the first iteration's loss is the full model's in the same recipe (and same seed), to the printed digit.
TEST(LoraCli, TheFirstLossIsTheBaseModels) {
  for (const char* recipe : {"bf16_mixed", "bf16_with_nvfp4_mixed"}) {
    const ProcessResult base = pl::test::run_process(kApp, lora_tiny_run({"--recipe", recipe}, "1"), 120.0);
    const ProcessResult lora = pl::test::run_process(kApp, lora_tiny_run({"--recipe", recipe, "--peft", "lora"}, "1"), 120.0);
    ASSERT_EQ(base.exit_code, 0) << base.err;
    ASSERT_EQ(lora.exit_code, 0) << lora.err;
    ASSERT_EQ(lora_losses_of(base.out).size(), 1u);
    EXPECT_EQ(lora_losses_of(base.out), lora_losses_of(lora.out)) << recipe;
  }
}

TEST(LoraCli, BadLoraInputIsOneLineNamingTheFlag) {
  const std::vector<std::string> lora = {"--peft", "lora"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = lora_tiny_run(lora);
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  lora_expect_one_line_failure(with({"--lora-dim", "0"}), {"--lora-dim must be >= 1"});
  lora_expect_one_line_failure(with({"--lora-alpha", "0"}), {"--lora-alpha"});
  lora_expect_one_line_failure(with({"--lora-dropout", "1"}), {"--lora-dropout must be in [0, 1)"});
  lora_expect_one_line_failure(with({"--lora-target-modules", "q_proj,v_proj"}), {"--lora-target-modules", "k_proj"});
  lora_expect_one_line_failure(with({"--lora-target-modules", "lm_head"}), {"--lora-target-modules", "lm_head"});
  lora_expect_one_line_failure(with({"--lora-dropout-position", "after"}), {"--lora-dropout-position"});
  lora_expect_one_line_failure(lora_tiny_run({"--lora-dim", "8"}), {"--lora-dim needs --peft lora"});
  lora_expect_one_line_failure(lora_tiny_run({"--peft", "qlora"}), {"--peft must be none or lora"});
  lora_expect_one_line_failure(with({"--use-precision-aware-optimizer", "--optimizer-cpu-offload"}),
                               {"--peft lora cannot be combined with --optimizer-cpu-offload"});
  lora_expect_one_line_failure(with({"--use-precision-aware-optimizer", "--main-grads-dtype", "bf16"}),
                               {"--peft lora", "--main-grads-dtype bf16"});
  const fs::path save = fs::temp_directory_path() / "pl_lora_cli_save";
  fs::remove_all(save);
  lora_expect_one_line_failure(with({"--save", save.string(), "--use-distributed-optimizer", "--overlap-grad-reduce",
                                     "--overlap-param-gather"}),
                               {"--peft lora cannot be combined with --overlap-param-gather"});
  EXPECT_FALSE(fs::exists(save)) << "nothing written";
}

// Adapter-only checkpoints: a LoRA run saved at iteration 6 and resumed prints the straight run's iterations 7-12
// (the adapters, their moments, the dropout counter); the state files hold the adapters only; the record names the
// base, and a resume over another base (another --seed's random base), without --peft lora or with other adapter
// shapes is one line; a full checkpoint is a frozen base with --finetune (its first loss the full model's).
TEST(LoraCli, AdapterCheckpointsResumeOnTheirBaseOnly) {
  pl::test::TempDir dir;
  const std::string d = (dir.path() / "lora").string();
  const std::vector<std::string> lora = {"--peft", "lora", "--lora-dim", "8", "--lora-dropout", "0.1", "--recipe",
                                         "bf16_with_nvfp4_mixed"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = lora_tiny_run(lora);
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  const ProcessResult straight = pl::test::run_process(kApp, with({}), 300.0);
  ASSERT_EQ(straight.exit_code, 0) << straight.err;
  const ProcessResult part1 = pl::test::run_process(kApp, with({"--save", d, "--exit-interval", "6"}), 300.0);
  ASSERT_EQ(part1.exit_code, 0) << part1.err;
  const fs::path iter = fs::path(d) / "iter_0000006";
  EXPECT_EQ(fs::file_size(iter / "master_fp32.bin"), 4u * 38912u) << "the adapters' master weights only";
  const std::string meta = pl::test::read_text_file((iter / "metadata.json").string());
  EXPECT_NE(meta.find("\"peft\""), std::string::npos) << meta;
  EXPECT_NE(meta.find("\"source\": \"init seed 1234\""), std::string::npos) << meta;
  const ProcessResult part2 = pl::test::run_process(kApp, with({"--load", d}), 300.0);
  ASSERT_EQ(part2.exit_code, 0) << part2.err;
  const auto expected = pl::test::iteration_lines(straight.out, 7);
  ASSERT_EQ(expected.size(), 6u);
  EXPECT_EQ(pl::test::iteration_lines(part2.out, 1), expected);
  lora_expect_one_line_failure(with({"--load", d, "--seed", "99"}), {"--load", "another base", "init seed 1234"});
  lora_expect_one_line_failure(lora_tiny_run({"--load", d}), {"a LoRA checkpoint", "--peft lora"});
  lora_expect_one_line_failure(lora_tiny_run({"--peft", "lora", "--lora-dim", "4", "--load", d}),
                               {"its adapters are dim 8", "--lora-dim 4"});
  // A full checkpoint as the frozen base.
  const std::string full = (dir.path() / "full").string();
  const ProcessResult base = pl::test::run_process(kApp, lora_tiny_run({"--save", full}, "2"), 300.0);
  ASSERT_EQ(base.exit_code, 0) << base.err;
  lora_expect_one_line_failure(lora_tiny_run({"--peft", "lora", "--load", full}), {"a checkpoint of every parameter", "--finetune"});
  const ProcessResult on_full = pl::test::run_process(kApp, lora_tiny_run({"--peft", "lora", "--load", full, "--finetune"}, "1"), 300.0);
  const ProcessResult full_again = pl::test::run_process(kApp, lora_tiny_run({"--load", full, "--finetune"}, "1"), 300.0);
  ASSERT_EQ(on_full.exit_code, 0) << on_full.err;
  ASSERT_EQ(full_again.exit_code, 0) << full_again.err;
  EXPECT_NE(on_full.out.find("the frozen base is the weights of iteration 2"), std::string::npos) << on_full.out;
  EXPECT_EQ(lora_losses_of(on_full.out), lora_losses_of(full_again.out));

  // Exports of the LoRA checkpoint: PEFT's files, the merge into its base (the record's "init seed 1234": the
  // initialisation made again, its checksum checked), generate over both; the one-line refusals.
  const std::string peft = (dir.path() / "peft").string(), merged = (dir.path() / "merged").string();
  const ProcessResult to_peft = pl::test::run_process(kConvert, {"--load", d, "--to-peft", peft}, 120.0);
  ASSERT_EQ(to_peft.exit_code, 0) << to_peft.err;
  EXPECT_TRUE(fs::exists(fs::path(peft) / "adapter_config.json"));
  EXPECT_TRUE(fs::exists(fs::path(peft) / "adapter_model.safetensors"));
  const ProcessResult merge = pl::test::run_process(kConvert, {"--load", d, "--merge-lora", "--to-hf", merged}, 120.0);
  ASSERT_EQ(merge.exit_code, 0) << merge.err;
  EXPECT_NE(merge.out.find("LoRA dim 8 merged into the base init seed 1234"), std::string::npos) << merge.out;
  for (const std::vector<std::string>& g : {std::vector<std::string>{"--load", d}, std::vector<std::string>{"--init-from-hf", merged}}) {
    std::vector<std::string> a = g;
    a.insert(a.end(), {"--prompt", "abc", "--max-new-tokens", "4", "--tokenizer-type", "byte"});
    const ProcessResult gen = pl::test::run_process(kGenerate, a, 120.0);
    EXPECT_EQ(gen.exit_code, 0) << gen.err;
  }
  const auto convert_fails = [&](const std::vector<std::string>& args, const std::vector<std::string>& needles) {
    const ProcessResult r = pl::test::run_process(kConvert, args, 60.0);
    EXPECT_NE(r.exit_code, 0);
    for (const std::string& n : needles) EXPECT_NE(r.err.find(n), std::string::npos) << r.err;
  };
  convert_fails({"--load", d, "--to-hf", (dir.path() / "x").string()}, {"a LoRA checkpoint", "--merge-lora"});
  convert_fails({"--load", full, "--to-peft", (dir.path() / "y").string()}, {"not a LoRA checkpoint", "--to-peft"});
  EXPECT_FALSE(fs::exists(dir.path() / "x"));
  EXPECT_FALSE(fs::exists(dir.path() / "y"));
}

}  // namespace
