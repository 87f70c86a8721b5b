// pretrain_llama's --roofline and --profile-* flags, bad input only: an output the run could not write at
// the end, or a profiling window that cannot open, is one stderr line naming the flag at start-up, before
// any model is built or any iteration runs. (The report itself is tested where it is made.)
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "test_util.h"
#include "cli/programs.h"

namespace {

using pl::test::ProcessResult;


std::vector<std::string> roofline_tiny(std::vector<std::string> extra) {
  std::vector<std::string> a = {"--model", kTiny, "--device", "cpu", "--disable-fp4", "--train-iters", "2",
                                "--global-batch-size", "4", "--micro-batch-size", "2", "--seq-length", "32"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// Non-zero exit, exactly one stderr line holding every needle, and no iteration run. The 30 s limit only
// catches a run that trains anyway; a refusal at start-up takes a fraction of that.
void expect_refused_at_start(const std::vector<std::string>& args, const std::vector<std::string>& needles) {
  const ProcessResult r = pl::test::run_process(kApp, args, 30.0);
  ASSERT_FALSE(r.timed_out) << "still running after 30 s: the flag was not refused at start-up";
  EXPECT_NE(r.exit_code, 0) << r.out;
  const std::vector<std::string> lines = pl::test::split_lines(r.err);
  ASSERT_EQ(lines.size(), 1u) << r.err;
  for (const std::string& n : needles) EXPECT_NE(lines[0].find(n), std::string::npos) << n << " not in: " << lines[0];
  EXPECT_EQ(r.out.find("iteration"), std::string::npos) << r.out;
}

TEST(CliRoofline, ToADirectoryIsRefusedAtStartUp) {
  pl::test::TempDir dir;
  expect_refused_at_start(roofline_tiny({"--roofline", dir.path().string()}), {"--roofline", dir.path().string(), "directory"});
}

TEST(CliRoofline, IntoAMissingDirectoryIsRefusedAtStartUp) {
  pl::test::TempDir dir;
  const std::string file = (dir.path() / "no_such_dir" / "r.json").string();
  expect_refused_at_start(roofline_tiny({"--roofline", file}), {"--roofline", file, "does not exist"});
}

TEST(CliRoofline, IntoAnUnwritableDirectoryIsRefusedAtStartUp) {
  // Root writes into a 0555 directory all the same (the permission bits do not bind it).
  if (::geteuid() == 0) GTEST_SKIP() << "running as root: chmod 0555 does not stop root from writing";
  pl::test::TempDir dir;
  const std::filesystem::path locked = dir.path() / "locked";
  std::filesystem::create_directory(locked);
  ASSERT_EQ(::chmod(locked.c_str(), 0555), 0);
  const std::string file = (locked / "r.json").string();
  expect_refused_at_start(roofline_tiny({"--roofline", file}), {"--roofline", file, "not writable"});
  ::chmod(locked.c_str(), 0755);  // so that TempDir can remove it
}

// No output replaces an input or a file that is not its own kind (issue 38): --machine-ceilings, --roofline
// and --log-jsonl naming the --model file of the same command, or a user's notes, are refused at start-up and
// the file is left byte-identical.
TEST(CliRoofline, NoOutputReplacesAFileThatIsNotItsOwnKind) {
  pl::test::TempDir dir;
  const std::string notes = (dir.path() / "notes.txt").string();
  std::ofstream(notes) << "my notes\n";
  const std::string report = (dir.path() / "r.json").string();
  for (const std::string& file : {kTiny, notes}) {
    const std::string before = pl::test::read_text_file(file);
    const std::string why = file == kTiny ? "--model" : "not a machine ceilings cache of this program";
    expect_refused_at_start(roofline_tiny({"--roofline", report, "--machine-ceilings", file}), {"--machine-ceilings", file, why});
    expect_refused_at_start(roofline_tiny({"--roofline", file}),
                            {"--roofline", file, file == kTiny ? "--model" : "not a roofline report of this program"});
    expect_refused_at_start(roofline_tiny({"--log-jsonl", file}),
                            {"--log-jsonl", file, file == kTiny ? "--model" : "not a JSON-lines log of this program"});
    EXPECT_EQ(pl::test::read_text_file(file), before) << file;
  }
}

// A start that fails on its inputs (a bad --data-path) measures nothing and writes no ceilings cache (issue 38).
TEST(CliRoofline, AFailedStartWritesNoCeilingsCache) {
  pl::test::TempDir dir;
  const std::string cache = (dir.path() / "ceilings.json").string();
  const ProcessResult r = pl::test::run_process(
      kApp, roofline_tiny({"--roofline", (dir.path() / "r.json").string(), "--machine-ceilings", cache, "--data-path",
                           (dir.path() / "no_such_prefix").string()}),
      60.0);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.out.find("machine ceilings"), std::string::npos) << r.out;
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 0);
}

TEST(CliRoofline, AtLogIntervalNeedsRoofline) {
  expect_refused_at_start(roofline_tiny({"--roofline-at-log-interval"}), {"--roofline-at-log-interval", "--roofline"});
}

TEST(CliProfile, AWindowThatCannotOpenIsOneLineNamingTheFlag) {
  expect_refused_at_start(roofline_tiny({"--profile", "--profile-step-start", "5", "--profile-step-end", "5"}),
                          {"--profile-step-end"});
  expect_refused_at_start(roofline_tiny({"--profile-step-start", "4", "--profile-step-end", "2"}), {"--profile-step-end"});
  expect_refused_at_start(roofline_tiny({"--profile", "--profile-step-start", "-1"}), {"--profile-step-start"});
  // One process is a world of one rank: rank 1 does not exist.
  expect_refused_at_start(roofline_tiny({"--profile", "--profile-ranks", "0", "1"}), {"--profile-ranks", "1"});
}

// The good values pass the same checks: --dry-run validates every flag, then prints the plan and exits.
TEST(CliRoofline, GoodValuesPassTheStartUpChecks) {
  pl::test::TempDir dir;
  const std::string file = (dir.path() / "r.json").string();
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"--roofline", file, "--roofline-at-log-interval"}, {"--roofline"},
        {"--profile-step-start", "0", "--profile-step-end", "1"},  // without --profile: accepted, as Megatron
        {"--profile", "--profile-ranks", "0", "--machine-ceilings", "none"}}) {
    std::vector<std::string> args = roofline_tiny(extra);
    args.push_back("--dry-run");
    const ProcessResult r = pl::test::run_process(kApp, args, 60.0);
    EXPECT_EQ(r.exit_code, 0) << extra[0] << ": " << r.err;
    EXPECT_TRUE(r.err.empty()) << r.err;
  }
  EXPECT_FALSE(std::filesystem::exists(file)) << "the start-up check must not create the report";
}

}  // namespace
