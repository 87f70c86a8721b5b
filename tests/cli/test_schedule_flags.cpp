// Issue 27's optimizer and schedule flags on the command line: bad values and bad combinations stop before
// training with one line naming the flag; the banner says the effective optimizer and schedule; a resume
// with a changed value says which (saved -> now) and follows the command line; --exit-duration-in-mins
// saves and stops; --log-params-norm puts Megatron's " params norm: X |" into the iteration line.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "test_util.h"
#include "cli/programs.h"

namespace {

using pl::test::ProcessResult;



// A short llama_tiny run (BF16, 2 samples of 32 tokens per iteration, one thread).
std::vector<std::string> schedule_flags_tiny(int iters, std::vector<std::string> extra) {
  std::vector<std::string> a = {"--model", kTiny, "--device", "cpu", "--disable-fp4", "--threads", "1",
                                "--train-iters", std::to_string(iters), "--global-batch-size", "2",
                                "--micro-batch-size", "2", "--seq-length", "32"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

TEST(ScheduleFlags, BadValuesAreOneLineNamingTheFlag) {
  const std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>> cases = {
      {{"--adam-beta1", "1"}, {"--adam-beta1", "[0, 1)"}},
      {{"--adam-beta2", "-0.1"}, {"--adam-beta2"}},
      {{"--adam-beta2", "nan"}, {"--adam-beta2"}},
      {{"--adam-eps", "0"}, {"--adam-eps", "> 0"}},
      {{"--weight-decay", "-1"}, {"--weight-decay"}},
      {{"--clip-grad", "inf"}, {"--clip-grad"}},
      {{"--init-method-std", "0"}, {"--init-method-std"}},
      {{"--exit-duration-in-mins", "-1"}, {"--exit-duration-in-mins"}},
      {{"--lr-decay-iters", "0"}, {"--lr-decay-iters"}},
      {{"--lr-decay-style", "exponential"}, {"--lr-decay-style", "exponential"}},
      {{"--lr-warmup-fraction", "1.5"}, {"--lr-warmup-fraction"}},
      {{"--lr-warmup-fraction", "0.1", "--warmup-iters", "1"}, {"--lr-warmup-fraction", "--warmup-iters"}},
      {{"--lr-decay-style", "WSD"}, {"--lr-wsd-decay-iters"}},
      {{"--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "5", "--lr-wsd-decay-style", "step"}, {"--lr-wsd-decay-style"}},
      {{"--start-weight-decay", "0.1"}, {"--start-weight-decay", "--weight-decay-incr-style"}},
      {{"--weight-decay-incr-style", "cosine", "--start-weight-decay", "0.1"}, {"--end-weight-decay"}},
      {{"--warmup-iters", "4"}, {"--warmup-iters 4", "8 samples", "--train-iters 4"}},
      {{"--lr-decay-iters", "2"}, {"--lr-decay-iters 2", "4 samples"}},
  };
  for (const auto& [flags, needles] : cases) {
    std::string cmd;
    for (const std::string& f : flags) cmd += " " + f;
    SCOPED_TRACE(cmd);
    const ProcessResult r = run_app(schedule_flags_tiny(4, flags));
    EXPECT_NE(r.exit_code, 0);
    const auto lines = pl::test::split_lines(r.err);
    ASSERT_EQ(lines.size(), 1u) << r.err;
    for (const std::string& n : needles) EXPECT_NE(lines[0].find(n), std::string::npos) << n << " not in " << lines[0];
    EXPECT_EQ(r.out.find("iteration "), std::string::npos);  // refused before training
  }
}

TEST(ScheduleFlags, ResumeWithChangedValuesWarnsAndFollowsTheCommandLine) {
  pl::test::TempDir dir;
  const std::string ck = (dir.path() / "ck").string();
  const ProcessResult first = run_app(schedule_flags_tiny(2, {"--save", ck}));
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_NE(first.out.find("optimizer: AdamW beta1 0.9, beta2 0.95, eps 1e-08, weight decay 0.033"), std::string::npos)
      << first.out;
  const ProcessResult second =
      run_app(schedule_flags_tiny(3, {"--load", ck, "--save", ck, "--weight-decay", "0.1", "--adam-beta2", "0.98", "--lr-decay-style",
                                      "linear", "--lr-decay-iters", "3"}));
  ASSERT_EQ(second.exit_code, 0) << second.err;
  for (const char* note : {"checkpoint saved with --weight-decay 0.033, resuming with --weight-decay 0.1",
                           "checkpoint saved with --adam-beta2 0.95, resuming with --adam-beta2 0.98",
                           "checkpoint saved with --lr-decay-style cosine, resuming with --lr-decay-style linear",
                           "checkpoint saved with --lr-decay-iters (not given), resuming with --lr-decay-iters 3"})
    EXPECT_NE(second.out.find(note), std::string::npos) << note << "\n" << second.out;
  EXPECT_EQ(second.out.find("--adam-beta1"), std::string::npos);  // unchanged values say nothing
  EXPECT_NE(second.out.find("weight decay 0.1 "), std::string::npos);
  // The command line's values are the run's: the linear decay ends at --min-lr at iteration 3, and the
  // new checkpoint records them.
  EXPECT_NE(second.out.find("learning rate: 3.000000E-05"), std::string::npos) << second.out;
  const std::string meta = pl::test::read_text_file(ck + "/iter_0000003/metadata.json");
  EXPECT_NE(meta.find("\"weight_decay\": 0.1"), std::string::npos) << meta;
  EXPECT_NE(meta.find("\"lr_decay_style\": \"linear\""), std::string::npos) << meta;
}

TEST(ScheduleFlags, ExitDurationSavesAndStops) {
  pl::test::TempDir dir;
  const std::string ck = (dir.path() / "ck").string();
  const ProcessResult r = run_app(schedule_flags_tiny(50, {"--save", ck, "--exit-duration-in-mins", "0.0001"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // 6 ms are over before the first iteration ends (start-up alone takes longer): it is the last, saved.
  EXPECT_NE(r.out.find("iteration        1/      50"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("iteration        2/"), std::string::npos) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(\[exiting program after [0-9.e-]+ minutes\] datetime: )"))) << r.out;
  EXPECT_TRUE(std::filesystem::exists(ck + "/iter_0000001/metadata.json"));
  EXPECT_EQ(pl::test::read_text_file(ck + "/latest_checkpointed_iteration.txt").substr(0, 1), "1");
}

TEST(ScheduleFlags, LogParamsNormPrintsTheMasterWeightsNormAfterTheGradNorm) {
  const ProcessResult r = run_app(schedule_flags_tiny(2, {"--log-params-norm", "--init-method-std", "0.01"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::regex field(R"(\| grad norm: [0-9.]+ \| params norm: ([0-9.]+) \| number of skipped)");
  std::vector<double> norms;
  for (const std::string& l : pl::test::split_lines(r.out))
    if (std::smatch m; std::regex_search(l, m, field)) norms.push_back(std::stod(m[1]));
  ASSERT_EQ(norms.size(), 2u) << r.out;
  // Every norm weight is 1 (llama_tiny: the norms' elements add sqrt(count) to the norm) and the matrices
  // are N(0, 0.01) draws: the norm sits just above the norms' part and moves with each step.
  EXPECT_GT(norms[0], 1.0);
  EXPECT_NE(norms[0], norms[1]);
  EXPECT_NE(r.out.find("init std 0.01"), std::string::npos);
  const ProcessResult plain = run_app(schedule_flags_tiny(1, {}));
  EXPECT_EQ(plain.out.find("params norm"), std::string::npos);
}

}  // namespace
