// pretrain_llama --save/--load/--exit-interval/--keep-last end to end on llama_tiny: a resumed run
// prints the uninterrupted run's iteration lines (timings aside), a kill -9 in the middle of a save
// leaves the previous checkpoint loadable, and every damaged checkpoint is refused with one line.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"
#include "cli/programs.h"

namespace {

using pl::test::iteration_lines;

namespace fs = std::filesystem;
using pl::test::ProcessResult;

const std::string kStall = PL_CHECKPOINT_STALL_PATH;

std::vector<std::string> tiny(const std::vector<std::string>& extra, const std::string& iters = "20") {
  std::vector<std::string> a = {"--model", kTiny, "--device", "cpu", "--threads", "2", "--train-iters", iters,
                                "--global-batch-size", "4", "--micro-batch-size", "2", "--seq-length", "64"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}


ProcessResult run_ok(const std::vector<std::string>& args) {
  ProcessResult r = run_app(args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return r;
}


void expect_resume_matches(const std::vector<std::string>& recipe_flags) {
  pl::test::TempDir dir;
  const std::string d = (dir.path() / "ckpt").string();
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), recipe_flags.begin(), recipe_flags.end());
    return tiny(extra);
  };
  const ProcessResult straight = run_ok(with({}));
  const ProcessResult part1 = run_ok(with({"--save", d, "--save-interval", "10", "--exit-interval", "10"}));
  EXPECT_NE(part1.out.find("successfully saved checkpoint from iteration      10 to " + d), std::string::npos);
  EXPECT_NE(part1.out.find("exiting program at iteration 10"), std::string::npos);
  EXPECT_TRUE(iteration_lines(part1.out, 11).empty());
  EXPECT_EQ(pl::test::read_text_file(d + "/latest_checkpointed_iteration.txt"), "10\n");
  const ProcessResult part2 = run_ok(with({"--load", d}));
  EXPECT_NE(part2.out.find("successfully loaded checkpoint from " + d + " [ t 1/1, p 1/1 ] at iteration 10"),
            std::string::npos);
  const auto expected = iteration_lines(straight.out, 11);
  ASSERT_EQ(expected.size(), 10u);
  EXPECT_EQ(iteration_lines(part2.out, 1), expected);
  EXPECT_NE(part2.out.find("run by this process: 11-20"), std::string::npos);
}

TEST(CheckpointCli, ResumeReproducesTheStraightRunBf16) { expect_resume_matches({"--disable-fp4"}); }
TEST(CheckpointCli, ResumeReproducesTheStraightRunNvfp4) { expect_resume_matches({}); }

TEST(CheckpointCli, ResumeInsideALogIntervalPrintsTheStraightRunsLines) {
  pl::test::TempDir dir;
  const std::string d = (dir.path() / "ckpt").string();
  const ProcessResult straight = run_ok(tiny({"--disable-fp4", "--log-interval", "3"}));
  // Iteration 10 is not a log iteration: the open interval (iteration 10) travels in the checkpoint.
  const ProcessResult part1 = run_ok(tiny({"--disable-fp4", "--log-interval", "3", "--save", d, "--exit-interval", "10"}));
  EXPECT_TRUE(iteration_lines(part1.out, 10).empty());
  const ProcessResult part2 = run_ok(tiny({"--disable-fp4", "--log-interval", "3", "--load", d}));
  const auto expected = iteration_lines(straight.out, 11);
  ASSERT_EQ(expected.size(), 4u);  // 12 (averaging 10..12), 15, 18, 20
  EXPECT_EQ(iteration_lines(part2.out, 1), expected);
}

// The validation lines (in-loop, final validation and test) after iteration `after`.
std::vector<std::string> validation_lines(const std::string& out, int after) {
  static const std::regex valid(R"(^ validation loss at iteration (\d+))");
  std::vector<std::string> lines;
  for (const std::string& l : pl::test::split_lines(out)) {
    std::smatch m;
    if (std::regex_search(l, m, valid) && std::stoi(m[1]) > after) lines.push_back(l);
  }
  return lines;
}

TEST(CheckpointCli, ResumeContinuesTheValidationSampler) {
  pl::test::TempDir dir;
  const std::string d = (dir.path() / "ckpt").string();
  const std::vector<std::string> eval = {"--disable-fp4", "--eval-interval", "5", "--eval-iters", "1"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), eval.begin(), eval.end());
    return tiny(extra);
  };
  const ProcessResult straight = run_ok(with({}));
  const ProcessResult part1 = run_ok(with({"--save", d, "--exit-interval", "10"}));
  EXPECT_TRUE(validation_lines(part1.out, 10).empty()) << "an --exit-interval stop skips the final evaluation";
  const ProcessResult part2 = run_ok(with({"--load", d}));
  const auto expected = validation_lines(straight.out, 10);
  ASSERT_EQ(expected.size(), 4u);  // iterations 15 and 20, then on the validation and test sets
  EXPECT_EQ(validation_lines(part2.out, 10), expected);
  EXPECT_EQ(iteration_lines(part2.out, 1), iteration_lines(straight.out, 11));
}

// Runs tests/tools/checkpoint_stall (save_checkpoint with a write hook that stops forever in the
// middle of one file), waits until `marker` exists (the writer has reached the stall), then kills it
// with SIGKILL. Returns true when the marker appeared.
bool run_and_kill_when(const std::vector<std::string>& args, const std::function<bool()>& marker) {
  std::vector<std::string> argv_s = {kStall};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int null = ::open("/dev/null", O_RDWR);
    ::dup2(null, 0);
    ::dup2(null, 1);
    ::dup2(null, 2);
    ::execv(kStall.c_str(), argv.data());
    ::_exit(127);
  }
  bool seen = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(300);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) return false;  // exited without stalling
    if (marker()) {
      seen = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // let it reach the stall
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return seen;
}

bool has_entry_containing(const fs::path& dir, const std::string& needle) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().find(needle) != std::string::npos) return true;
  return false;
}

TEST(CheckpointCli, KillDuringTheSecondSaveLeavesTheFirstLoadable) {
  pl::test::TempDir dir;
  const std::string d = (dir.path() / "ckpt").string();
  run_ok(tiny({"--disable-fp4", "--save", d, "--exit-interval", "4"}, "8"));
  // Killed while writing the Adam moments of iteration 8: a half-written iter_0000008.tmp-<pid>.
  ASSERT_TRUE(run_and_kill_when({kTiny, d, "8", "adam_m_fp32.bin"}, [&] { return has_entry_containing(d, "iter_0000008.tmp-"); }));
  EXPECT_FALSE(fs::exists(d + "/iter_0000008"));
  EXPECT_EQ(pl::test::read_text_file(d + "/latest_checkpointed_iteration.txt"), "4\n");
  const ProcessResult resumed = run_ok(tiny({"--disable-fp4", "--load", d}, "8"));
  EXPECT_NE(resumed.out.find("at iteration 4"), std::string::npos);
  const ProcessResult straight = run_ok(tiny({"--disable-fp4"}, "8"));
  EXPECT_EQ(iteration_lines(resumed.out, 1), iteration_lines(straight.out, 5));
  EXPECT_EQ(iteration_lines(resumed.out, 1).size(), 4u);

  // Killed while replacing the tracker after iteration 8 was renamed into place: the tracker still
  // says 4 and that checkpoint loads; the next successful save removes the leftovers.
  ASSERT_TRUE(run_and_kill_when({kTiny, d, "8", "latest_checkpointed_iteration.txt"}, [&] {
    return fs::exists(d + "/iter_0000008") && has_entry_containing(d, "latest_checkpointed_iteration.txt.tmp-");
  }));
  EXPECT_TRUE(fs::exists(d + "/iter_0000008/manifest.json"));
  EXPECT_EQ(pl::test::read_text_file(d + "/latest_checkpointed_iteration.txt"), "4\n");
  const ProcessResult again = run_ok(tiny({"--disable-fp4", "--load", d, "--save", d}, "8"));
  EXPECT_NE(again.out.find("at iteration 4"), std::string::npos);
  EXPECT_EQ(iteration_lines(again.out, 1), iteration_lines(straight.out, 5));
  EXPECT_EQ(pl::test::read_text_file(d + "/latest_checkpointed_iteration.txt"), "8\n");
  EXPECT_FALSE(has_entry_containing(d, ".tmp-"));
}

// A checkpoint at iteration 10 in <dir>/ckpt, for damaging.
std::string make_checkpoint(const pl::test::TempDir& dir) {
  const std::string d = (dir.path() / "ckpt").string();
  run_ok(tiny({"--disable-fp4", "--save", d, "--exit-interval", "10"}));
  return d;
}

void expect_refused(const std::vector<std::string>& args, const std::vector<std::string>& needles) {
  const ProcessResult r = run_app(args);
  EXPECT_NE(r.exit_code, 0);
  const auto lines = pl::test::split_lines(r.err);
  ASSERT_EQ(lines.size(), 1u) << r.err;
  for (const std::string& n : needles) EXPECT_NE(lines[0].find(n), std::string::npos) << "'" << n << "' not in " << lines[0];
  EXPECT_EQ(iteration_lines(r.out, 1).size(), 0u) << "trained although the checkpoint was refused";
}

TEST(CheckpointCli, OneCorruptedByteIsRefusedNamingTheFile) {
  pl::test::TempDir dir;
  const std::string d = make_checkpoint(dir);
  const std::string f = d + "/iter_0000010/adam_v_fp32.bin";
  {
    std::fstream s(f, std::ios::in | std::ios::out | std::ios::binary);
    s.seekg(12345);
    char c = 0;
    s.read(&c, 1);
    c = static_cast<char>(c ^ 0x10);
    s.seekp(12345);
    s.write(&c, 1);
  }
  expect_refused(tiny({"--disable-fp4", "--load", d}), {f, "checksum", "corrupted"});
}

TEST(CheckpointCli, ATruncatedFileIsRefusedNamingTheFile) {
  pl::test::TempDir dir;
  const std::string d = make_checkpoint(dir);
  const std::string f = d + "/iter_0000010/master_fp32.bin";
  fs::resize_file(f, fs::file_size(f) - 4096);
  expect_refused(tiny({"--disable-fp4", "--load", d}), {f, "truncated"});
}

TEST(CheckpointCli, AMissingManifestIsRefused) {
  pl::test::TempDir dir;
  const std::string d = make_checkpoint(dir);
  fs::remove(d + "/iter_0000010/manifest.json");
  expect_refused(tiny({"--disable-fp4", "--load", d}), {d + "/iter_0000010/manifest.json", "missing"});
}

TEST(CheckpointCli, AMissingTrackerMeansTheNewestCompleteCheckpointOrARefusal) {
  pl::test::TempDir dir;
  const std::string d = make_checkpoint(dir);
  // A crash between renaming the first iter_ directory into place and writing the tracker: the
  // directory is complete, so it is what the tracker would have named.
  fs::remove(d + "/latest_checkpointed_iteration.txt");
  const ProcessResult r = run_ok(tiny({"--disable-fp4", "--load", d}));
  EXPECT_NE(r.out.find("at iteration 10"), std::string::npos) << r.out;
  // Naming the iter_ directory itself works too.
  const ProcessResult named = run_ok(tiny({"--disable-fp4", "--load", d + "/iter_0000010"}));
  EXPECT_NE(named.out.find("at iteration 10"), std::string::npos);
  // Neither a tracker nor an iter_ directory (and not the --save directory): refused.
  const std::string empty = (dir.path() / "empty").string();
  fs::create_directories(empty);
  expect_refused(tiny({"--disable-fp4", "--load", empty}), {"latest_checkpointed_iteration.txt", "missing"});
}

TEST(CheckpointCli, AnotherModelShapeIsRefusedNamingTheField) {
  pl::test::TempDir dir;
  const std::string d = make_checkpoint(dir);
  std::string text = pl::test::read_text_file(kTiny);
  text = std::regex_replace(text, std::regex(R"("ffn_hidden_size": 256)"), R"("ffn_hidden_size": 512)");
  const std::string other = dir.write("wider.json", text);
  expect_refused({"--model", other, "--device", "cpu", "--train-iters", "20", "--global-batch-size", "4",
                  "--micro-batch-size", "2", "--seq-length", "64", "--disable-fp4", "--load", d},
                 {"ffn_hidden_size", "256", "512"});
}

TEST(CheckpointCli, AnotherBatchSizeOrRecipeIsAllowedAndStated) {
  pl::test::TempDir dir;
  const std::string d = make_checkpoint(dir);
  auto args = tiny({"--load", d});  // the default (NVFP4) recipe
  args[std::find(args.begin(), args.end(), "--global-batch-size") - args.begin() + 1] = "8";
  const ProcessResult r = run_ok(args);
  EXPECT_NE(r.out.find("checkpoint saved with --global-batch-size 4, resuming with 8 (data continues at consumed "
                       "sample 40)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("checkpoint saved with recipe bf16_mixed, resuming with recipe bf16_with_nvfp4_mixed"),
            std::string::npos);
  const auto lines = iteration_lines(r.out, 1);
  ASSERT_EQ(lines.size(), 10u);
  EXPECT_NE(lines[0].find("iteration       11/      20 | consumed samples:           48"), std::string::npos) << lines[0];
}

TEST(CheckpointCli, KeepLastLeavesTheNewestCheckpoints) {
  pl::test::TempDir dir;
  const std::string d = (dir.path() / "ckpt").string();
  run_ok(tiny({"--disable-fp4", "--save", d, "--save-interval", "2", "--keep-last", "2"}, "8"));
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(d)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  // (pretrain_llama.lock: the --save directory's lock, which stays; see SaveDirectoryLock)
  EXPECT_EQ(names, (std::vector<std::string>{"iter_0000006", "iter_0000008", "latest_checkpointed_iteration.txt",
                                             "pretrain_llama.lock"}));
}

TEST(CheckpointCli, LoadingTheEmptySaveDirectoryStartsFromScratchWithMegatronsWarning) {
  pl::test::TempDir dir;
  const std::string d = (dir.path() / "ckpt").string();
  const ProcessResult r = run_ok(tiny({"--disable-fp4", "--load", d, "--save", d}, "2"));
  EXPECT_NE(r.out.find("WARNING: could not find the metadata file " + d + "/latest_checkpointed_iteration.txt"),
            std::string::npos);
  EXPECT_NE(r.out.find("will not load any checkpoints and will start from random"), std::string::npos);
  EXPECT_EQ(pl::test::read_text_file(d + "/latest_checkpointed_iteration.txt"), "2\n");
  // Without --save pointing there, an empty --load is an error.
  expect_refused(tiny({"--disable-fp4", "--load", (dir.path() / "nothing").string()}), {"--load", "nothing"});
}

TEST(CheckpointCli, FlagCombinationsAreChecked) {
  expect_refused(tiny({"--save-interval", "10"}), {"--save-interval", "--save"});
  expect_refused(tiny({"--keep-last", "2"}), {"--keep-last", "--save"});
  expect_refused(tiny({"--save", "/tmp/x", "--save-interval", "0"}), {"--save-interval", ">= 1"});
  expect_refused(tiny({"--exit-interval", "-1"}), {"--exit-interval"});
}

}  // namespace

// ---- issue 14, class 10: --save is claimed at start-up --------------------------------------------

TEST(SaveDirectory, ARegularFileIsRefusedBeforeTheFirstIteration) {
  pl::test::TempDir dir;
  const std::string f = dir.write("not_a_dir", "x");
  expect_refused(tiny({"--disable-fp4", "--save", f}, "2"), {"--save", f, "not a directory"});
  EXPECT_EQ(pl::test::read_text_file(f), "x");
}

TEST(SaveDirectory, ADirectoryLockedByAnotherRunIsRefusedNamingItsOwner) {
  pl::test::TempDir dir;
  const std::string d = (dir.path() / "ckpt").string();
  fs::create_directories(d);
  // This test process plays the other run: it holds the lock and has recorded itself in the file.
  const std::string lock = d + "/pretrain_llama.lock";
  const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  const std::string me = "pid " + std::to_string(::getpid()) + " on testhost\n";
  ASSERT_EQ(::write(fd, me.data(), me.size()), static_cast<ssize_t>(me.size()));
  expect_refused(tiny({"--disable-fp4", "--save", d}, "2"), {"--save", "another run", std::to_string(::getpid())});
  EXPECT_FALSE(fs::exists(d + "/iter_0000002"));
  ::close(fd);  // released: the next run takes the directory
  run_ok(tiny({"--disable-fp4", "--save", d}, "2"));
  EXPECT_TRUE(fs::exists(d + "/iter_0000002/manifest.json"));
}

TEST(SaveDirectory, ASaveRemovesOnlyTemporariesOfProcessesThatAreGone) {
  pl::test::TempDir dir;
  const std::string d = (dir.path() / "ckpt").string();
  fs::create_directories(d);
  const std::string dead = d + "/iter_0000007.tmp-" + std::to_string(pl::test::dead_pid());
  const std::string alive = d + "/iter_0000009.tmp-" + std::to_string(::getpid());
  fs::create_directories(dead);
  fs::create_directories(alive);
  run_ok(tiny({"--disable-fp4", "--save", d}, "2"));
  EXPECT_FALSE(fs::exists(dead)) << "a dead process's temporary was left";
  EXPECT_TRUE(fs::exists(alive)) << "a live process's temporary was taken from under it";
}
