// Megatron's --exit-signal-handler (issue 14, class 7), on by default with --save: SIGTERM during a run
// finishes the iteration, saves it, says why and exits 0, and --load continues bit-identically to a
// straight run; a second signal stops at once (the earlier checkpoint stays loadable); a closed stdout
// (`| head`) does not kill the run before its final save.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"
#include "cli/programs.h"

namespace {

using pl::test::ProcessResult;


std::vector<std::string> run_args(const std::string& save, std::vector<std::string> extra = {}, int iters = 30) {
  std::vector<std::string> a = {"--model", kTiny, "--device", "cpu", "--threads", "1", "--train-iters", std::to_string(iters),
                                "--global-batch-size", "8", "--micro-batch-size", "2", "--seq-length", "128",
                                "--save", save, "--save-interval", "5"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// Starts the app with stdout and stderr into `out`; sends `signals` (one after another, 1 ms apart) once
// the line of iteration `at` is in the log; returns the exit code (128 + signal when killed by one).
int run_and_signal(const std::vector<std::string>& args, const std::string& out, int at, std::vector<int> signals) {
  std::vector<std::string> argv_s = {kApp};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execv(kApp.c_str(), argv.data());
    ::_exit(127);
  }
  const std::string needle = "iteration " + std::string(at < 10 ? "       " : "      ") + std::to_string(at) + "/";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (pl::test::read_text_file(out).find(needle) == std::string::npos && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  for (size_t i = 0; i < signals.size(); ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ::kill(pid, signals[i]);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int last_iteration(const std::string& log) {
  int last = 0;
  const std::regex it(R"(iteration +(\d+)/)");
  for (const std::string& l : pl::test::split_lines(log))
    if (std::smatch m; std::regex_search(l, m, it)) last = std::stoi(m[1]);
  return last;
}

TEST(SignalStop, SigtermSavesTheIterationExitsZeroAndResumesBitIdentically) {
  pl::test::TempDir dir;
  const std::string ck = (dir.path() / "ck").string(), log = (dir.path() / "run.log").string();
  ASSERT_EQ(run_and_signal(run_args(ck), log, 6, {SIGTERM}), 0) << pl::test::read_text_file(log);
  const std::string out = pl::test::read_text_file(log);
  EXPECT_NE(out.find("SIGTERM/SIGINT: finish the iteration, save a checkpoint, exit 0"), std::string::npos) << out;
  const int stopped = last_iteration(out);
  ASSERT_GE(stopped, 6);
  ASSERT_LT(stopped, 30) << "the run was not stopped";
  EXPECT_NE(out.find("exiting program after receiving SIGTERM at iteration " + std::to_string(stopped)), std::string::npos)
      << out;
  EXPECT_EQ(pl::test::read_text_file(ck + "/latest_checkpointed_iteration.txt"), std::to_string(stopped) + "\n");

  const ProcessResult resumed = pl::test::run_process(kApp, run_args(ck, {"--load", ck}), 300.0);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  const ProcessResult straight = pl::test::run_process(kApp, run_args((dir.path() / "straight").string()), 300.0);
  ASSERT_EQ(straight.exit_code, 0) << straight.err;
  const auto tail = pl::test::iteration_lines(straight.out, stopped + 1);
  ASSERT_EQ(tail.size(), static_cast<size_t>(30 - stopped));
  EXPECT_EQ(pl::test::iteration_lines(resumed.out, stopped + 1), tail);
}

TEST(SignalStop, ASecondSignalStopsAtOnceAndTheEarlierCheckpointStays) {
  pl::test::TempDir dir;
  const std::string ck = (dir.path() / "ck").string(), log = (dir.path() / "run.log").string();
  // Two different signals: two pending SIGTERMs would merge into one (standard signals do not queue).
  const int rc = run_and_signal(run_args(ck), log, 6, {SIGINT, SIGTERM});
  const std::string out = pl::test::read_text_file(log);
  // Ended by the second signal, whichever of the two was taken second (a multi-threaded process may take
  // two pending signals in either order).
  EXPECT_TRUE(rc == 128 + SIGTERM || rc == 128 + SIGINT) << rc << "\n" << out;
  EXPECT_EQ(out.find("exiting program after receiving"), std::string::npos) << out;
  // Iteration 5's checkpoint (the save interval) is whole: the tracker names it and it verifies.
  EXPECT_EQ(pl::test::read_text_file(ck + "/latest_checkpointed_iteration.txt"), "5\n");
  const ProcessResult resumed = pl::test::run_process(kApp, run_args(ck, {"--load", ck}, 6), 300.0);
  EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("iteration        6/"), std::string::npos) << resumed.out;
}

TEST(SignalStop, AClosedStdoutDoesNotKillTheRunBeforeItsFinalSave) {
  pl::test::TempDir dir;
  const std::string ck = (dir.path() / "ck").string();
  std::string cmd = "'" + kApp + "'";
  for (const std::string& a : run_args(ck, {}, 8)) cmd += " '" + a + "'";
  // head exits after one line; the run then writes into a closed pipe for the rest of its 8 iterations.
  const ProcessResult r = pl::test::run_process("/bin/bash", {"-c", cmd + " | head -n 1 >/dev/null; exit ${PIPESTATUS[0]}"}, 300.0);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(pl::test::read_text_file(ck + "/latest_checkpointed_iteration.txt"), "8\n");
}

}  // namespace
