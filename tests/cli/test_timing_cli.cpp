// pretrain_llama --timing-log-level / --timing-log-option through the binary: a bad value is one
// stderr line and a non-zero exit; level 0 (the default) prints no timer line; level 2 prints
// Megatron's timer block after each iteration line, with level-1 and level-2 names.
#include <gtest/gtest.h>

#include <regex>
#include <set>
#include <string>
#include <vector>

#include "test_util.h"
#include "cli/programs.h"

namespace {

using pl::test::ProcessResult;


std::vector<std::string> timing_tiny(std::vector<std::string> extra) {
  std::vector<std::string> a = {"--model",         kTiny, "--device",           "cpu", "--train-iters",
                                "2",               "--global-batch-size",       "4",   "--micro-batch-size",
                                "2",               "--seq-length",              "32",  "--warmup-iters",
                                "1"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

void timing_expect_one_line_failure(const std::vector<std::string>& args, const std::string& needle) {
  const ProcessResult r = pl::test::run_process(kApp, args, 60.0);
  ASSERT_FALSE(r.timed_out);
  EXPECT_NE(r.exit_code, 0) << r.out;
  const auto lines = pl::test::split_lines(r.err);
  ASSERT_EQ(lines.size(), 1u) << r.err;
  EXPECT_NE(lines[0].find(needle), std::string::npos) << lines[0];
  EXPECT_TRUE(r.out.find("time across ranks") == std::string::npos) << r.out;
}

TEST(CliTiming, BadLevelIsOneLineError) {
  timing_expect_one_line_failure(timing_tiny({"--timing-log-level", "3"}), "--timing-log-level");
  timing_expect_one_line_failure(timing_tiny({"--timing-log-level", "-1"}), "--timing-log-level");
  timing_expect_one_line_failure(timing_tiny({"--timing-log-level", "two"}), "--timing-log-level");
  timing_expect_one_line_failure(timing_tiny({"--timing-log-option", "median"}), "--timing-log-option");
}

TEST(CliTiming, HelpListsTheFlags) {
  const ProcessResult r = pl::test::run_process(kApp, {"--help"}, 60.0);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("--timing-log-level"), std::string::npos);
  EXPECT_NE(r.out.find("--timing-log-option"), std::string::npos);
}

TEST(CliTiming, LevelZeroIsTheDefaultAndPrintsNoTimers) {
  const ProcessResult r = pl::test::run_process(kApp, timing_tiny({}), 300.0);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find("time across ranks"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("forward-backward"), std::string::npos) << r.out;
  const ProcessResult explicit0 = pl::test::run_process(kApp, timing_tiny({"--timing-log-level", "0"}), 300.0);
  ASSERT_EQ(explicit0.exit_code, 0) << explicit0.err;
  EXPECT_EQ(pl::test::split_lines(explicit0.out).size(), pl::test::split_lines(r.out).size());
}

TEST(CliTiming, LevelTwoPrintsMegatronsBlockAfterEachIterationLine) {
  const ProcessResult r = pl::test::run_process(kApp, timing_tiny({"--timing-log-level", "2"}), 300.0);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<std::string> lines = pl::test::split_lines(r.out);
  const std::regex timer(R"(^    ([a-z0-9-]+) \.+: \((\d+\.\d\d), (\d+\.\d\d)\)$)");
  int headers = 0;
  std::set<std::string> seen;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i] != "(min, max) time across ranks (ms):") continue;
    ++headers;
    // After the iteration line (and, the first time, the memory line).
    const std::string& prev = lines[i - 1].rfind("[Rank 0] (after", 0) == 0 ? lines[i - 2] : lines[i - 1];
    EXPECT_NE(prev.find(" iteration "), std::string::npos) << prev;
    size_t j = i + 1;
    for (std::smatch m; j < lines.size() && std::regex_match(lines[j], m, timer); ++j) {
      seen.insert(m[1].str());
      EXPECT_GE(std::stod(m[2]), 0.0);
    }
    EXPECT_GT(j, i + 1) << "empty timer block";
  }
  EXPECT_EQ(headers, 2);  // one per iteration at --log-interval 1
  for (const char* name : {"forward-backward", "optimizer", "optimizer-inner-step", "batch-generator",
                           "forward-compute", "backward-compute", "gemm-bf16", "attention", "rmsnorm",
                           "cross-entropy"})
    EXPECT_TRUE(seen.count(name)) << name << " missing:\n" << r.out;
}

}  // namespace
