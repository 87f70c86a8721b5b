// Megatron's recompute flags through the program (issue 42): the banner and the JSON-lines start record say the
// resolved three, `--recompute full` is the alias of uniform 1, and a run under each method prints the iteration
// losses of a run without recomputation digit for digit (full model, NVFP4 in every layer; and LoRA over it); the
// dry run names the method and plans less memory for it.
#include <gtest/gtest.h>

#include <regex>
#include <string>
#include <vector>

#include "test_util.h"
#include "cli/programs.h"

namespace {

using pl::test::ProcessResult;


std::vector<std::string> five_layer_run(std::vector<std::string> extra) {
  std::vector<std::string> a = {"--model", std::string(PL_CONFIG_DIR) + "/models/llama_tiny.json", "--num-layers", "5",
                                "--device", "cpu", "--train-iters", "3", "--global-batch-size", "4",
                                "--micro-batch-size", "2", "--seq-length", "64", "--log-interval", "1",
                                "--num-layers-at-end-in-bf16", "0", "--recipe", "bf16_with_nvfp4_mixed"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

std::vector<std::string> recompute_losses_of(const std::string& out) {
  std::vector<std::string> v;
  const std::regex re(R"(lm loss: ([0-9.E+-]+))");
  for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end; ++it) v.push_back((*it)[1]);
  return v;
}

TEST(RecomputeCli, EveryMethodPrintsTheSameLossesAndTheBannerSaysIt) {
  for (const std::vector<std::string> lora : {std::vector<std::string>{},
                                              std::vector<std::string>{"--peft", "lora", "--lora-dropout", "0.1"}}) {
    SCOPED_TRACE(lora.empty() ? "full model" : "LoRA");
    const auto run = [&](std::vector<std::string> flags) {
      flags.insert(flags.end(), lora.begin(), lora.end());
      const ProcessResult r = pl::test::run_process(kApp, five_layer_run(flags), 120.0);
      EXPECT_EQ(r.exit_code, 0) << r.err;
      return r;
    };
    const ProcessResult none = run({});
    const std::vector<std::string> base = recompute_losses_of(none.out);
    ASSERT_EQ(base.size(), 3u) << none.out;
    EXPECT_EQ(none.out.find("pretrain_llama | recompute:"), std::string::npos) << "no line without recomputation";
    const struct {
      std::vector<std::string> flags;
      std::string banner;
    } cases[] = {
        {{"--recompute", "full"}, "recompute: granularity full, method uniform, num layers 1 (5 of 5 layers"},
        {{"--recompute-granularity", "full", "--recompute-num-layers", "2"},
         "recompute: granularity full, method uniform, num layers 2 (5 of 5 layers"},
        {{"--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "3"},
         "recompute: granularity full, method block, num layers 3 (3 of 5 layers"},
    };
    for (const auto& c : cases) {
      SCOPED_TRACE(c.banner);
      const ProcessResult r = run(c.flags);
      EXPECT_NE(r.out.find(c.banner), std::string::npos) << r.out;
      EXPECT_EQ(recompute_losses_of(r.out), base);
    }
  }
}

TEST(RecomputeCli, TheDryRunNamesTheMethodAndPlansLess) {
  const auto total = [](const std::vector<std::string>& flags) {
    std::vector<std::string> a = {"--model", "llama3_8b", "--micro-batch-size", "1", "--seq-length", "4096", "--dry-run"};
    a.insert(a.end(), flags.begin(), flags.end());
    const ProcessResult r = pl::test::run_process(kApp, a, 60.0);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::smatch m;
    EXPECT_TRUE(std::regex_search(r.out, m, std::regex(R"(memory total +([0-9.]+) GB)"))) << r.out;
    return std::pair{r.out, m.size() > 1 ? std::stod(m[1]) : 0.0};
  };
  const auto [none_out, none] = total({});
  const auto [block_out, block] = total({"--recompute-granularity", "full", "--recompute-method", "block",
                                         "--recompute-num-layers", "16"});
  const auto [full_out, full] = total({"--recompute-granularity", "full"});
  EXPECT_NE(none_out.find("recompute none,"), std::string::npos) << none_out;
  EXPECT_NE(block_out.find("recompute full, block, 16,"), std::string::npos) << block_out;
  EXPECT_NE(full_out.find("recompute full, uniform, 1,"), std::string::npos) << full_out;
  EXPECT_LT(block, none);
  EXPECT_LT(full, block);
  EXPECT_NE(none_out.find("memory activations and scratch by recomputation: none"), std::string::npos) << none_out;
}

}  // namespace
