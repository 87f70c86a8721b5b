// --log-jsonl FILE (issue 37): the run as JSON lines. Its records carry the numbers the Megatron text log
// prints (losses, learning rates, grad norms, validation losses, the summary), its start line the banner's facts;
// a run that fails before its first iteration leaves no file (and an old one untouched); a resumed run appends
// after its own start line, a fresh one replaces; a FILE that cannot be written, or that is an input, is refused
// at start-up with one line.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <fmt/format.h>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"
#include "cli/programs.h"

namespace {

using Json = nlohmann::json;
using pl::test::ProcessResult;



std::vector<std::string> log_jsonl_tiny(int iters, std::vector<std::string> extra) {
  std::vector<std::string> a = {"--model", kTiny, "--device", "cpu", "--threads", "1", "--train-iters",
                                std::to_string(iters), "--global-batch-size", "4", "--micro-batch-size", "2",
                                "--seq-length", "32"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

std::vector<Json> read_jsonl(const std::string& path) {
  std::vector<Json> events;
  std::istringstream in(pl::test::read_text_file(path));
  for (std::string line; std::getline(in, line);) events.push_back(Json::parse(line));
  return events;
}

std::vector<Json> of(const std::vector<Json>& events, const std::string& kind) {
  std::vector<Json> out;
  for (const Json& e : events)
    if (e.at("event") == kind) out.push_back(e);
  return out;
}

// The NVFP4 recipe with validation every 2 iterations: each iteration line's loss, learning rate and grad norm
// are the iteration event's numbers as the line formats them; each validation line is an eval event's; the
// summary line is the end event's.
TEST(LogJsonl, CarriesTheTextLogsNumbers) {
  pl::test::TempDir dir;
  const std::string file = (dir.path() / "run.jsonl").string();
  const ProcessResult r =
      run_app(log_jsonl_tiny(5, {"--log-jsonl", file, "--eval-interval", "2", "--eval-iters", "1", "--timing-log-level", "1"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<Json> events = read_jsonl(file);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.front().at("event"), "start");
  EXPECT_EQ(events.back().at("event"), "end");

  const std::regex iter_re(R"(iteration +(\d+)/ +5 \|.* learning rate: (\S+) \|.* lm loss: (\S+) \|.* grad norm: (\S+) \|)");
  const std::regex valid_re(R"(validation loss at iteration (\d+)( on validation set| on test set)? \| lm loss value: (\S+) \|)");
  std::vector<std::smatch> iteration_lines, validation_lines;
  std::istringstream in(r.out);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  for (const std::string& line : lines) {
    std::smatch m;
    if (std::regex_search(line, m, iter_re)) iteration_lines.push_back(m);
    if (std::regex_search(line, m, valid_re)) validation_lines.push_back(m);
  }
  const std::vector<Json> iterations = of(events, "iteration"), intervals = of(events, "interval");
  ASSERT_EQ(iterations.size(), 5u);
  ASSERT_EQ(intervals.size(), 5u);
  ASSERT_EQ(iteration_lines.size(), 5u) << r.out;
  for (size_t i = 0; i < 5; ++i) {
    SCOPED_TRACE("iteration " + std::to_string(i + 1));
    const Json& it = iterations[i];
    EXPECT_EQ(it.at("iteration"), static_cast<int>(i + 1));
    EXPECT_EQ(std::stoi(iteration_lines[i][1]), static_cast<int>(i + 1));
    EXPECT_EQ(fmt::format("{:.6E}", it.at("learning_rate").get<double>()), iteration_lines[i][2].str());
    EXPECT_EQ(fmt::format("{:.6E}", it.at("lm_loss").get<double>()), iteration_lines[i][3].str());
    EXPECT_EQ(fmt::format("{:.3f}", it.at("grad_norm").get<double>()), iteration_lines[i][4].str());
    EXPECT_EQ(it.at("consumed_samples"), static_cast<int>(4 * (i + 1)));
    EXPECT_FALSE(it.at("skipped").get<bool>());
    EXPECT_GT(it.at("elapsed_ms").get<double>(), 0.0);
    // At --log-interval 1 the interval is the iteration; its timers are --timing-log-level 1's.
    EXPECT_EQ(intervals[i].at("lm_loss"), it.at("lm_loss"));
    EXPECT_TRUE(intervals[i].at("timers_ms").contains("forward-backward")) << intervals[i].dump();
  }
  // Validation at iterations 2 and 4, then the validation and test splits after training.
  const std::vector<Json> evals = of(events, "eval");
  ASSERT_EQ(evals.size(), 4u);
  ASSERT_EQ(validation_lines.size(), 4u) << r.out;
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(fmt::format("{:.6E}", evals[i].at("lm_loss").get<double>()), validation_lines[i][3].str());
    EXPECT_DOUBLE_EQ(evals[i].at("ppl").get<double>(), std::exp(evals[i].at("lm_loss").get<double>()));
  }
  EXPECT_EQ(evals[3].at("split"), "test");
  EXPECT_TRUE(evals[3].at("after_training").get<bool>());
  // The end: the summary line's figures.
  const Json& end = events.back();
  EXPECT_EQ(end.at("stop"), "train_iters");
  EXPECT_EQ(end.at("last_iteration"), 5);
  EXPECT_EQ(end.at("final_lm_loss"), iterations.back().at("lm_loss"));
  EXPECT_EQ(end.at("valid_lm_loss"), evals[2].at("lm_loss"));
  EXPECT_EQ(end.at("allocations_in_loop"), 0);
  std::smatch sm;
  ASSERT_TRUE(std::regex_search(r.out, sm, std::regex(R"(summary: iterations (\d+)-(\d+) of 5 .* final lm loss (\S+) \|)")));
  EXPECT_EQ(end.at("summary_first"), std::stoi(sm[1]));
  EXPECT_EQ(end.at("summary_last"), std::stoi(sm[2]));
  EXPECT_EQ(fmt::format("{:.6E}", end.at("final_lm_loss").get<double>()), sm[3].str());
  // The start: the banner's facts.
  const Json& start = events.front();
  EXPECT_EQ(start.at("schema_version"), 1);
  EXPECT_EQ(start.at("model").at("name"), "llama_tiny");
  EXPECT_EQ(start.at("recipe").at("name"), "bf16_with_nvfp4_mixed");
  EXPECT_EQ(start.at("quantized_format"), "nvfp4");
  EXPECT_EQ(start.at("device").at("type"), "cpu");
  EXPECT_EQ(start.at("training").at("seq_length"), 32);
  EXPECT_EQ(start.at("first_iteration"), 1);
  ASSERT_EQ(start.at("gemms").size(), 2u) << start.dump();
  EXPECT_EQ(start.at("gemms")[1].at("format"), "nvfp4");
  EXPECT_EQ(start.at("gemms")[1].at("execution"), "emulated");  // (the CPU emulates every quantized GEMM)
  EXPECT_FALSE(start.at("precision_plan").empty());
}

// A run that fails before its first iteration writes nothing: no file where there was none, an existing file
// as it was.
TEST(LogJsonl, ARunThatFailsBeforeItsFirstIterationLeavesNoFile) {
  pl::test::TempDir dir;
  const std::string file = (dir.path() / "run.jsonl").string();
  const std::string missing = (dir.path() / "no_checkpoint_here").string();
  ProcessResult r = run_app(log_jsonl_tiny(2, {"--log-jsonl", file, "--load", missing}));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_FALSE(std::filesystem::exists(file));
  const std::string old = dir.write("run.jsonl", "an earlier run's log\n");
  r = run_app(log_jsonl_tiny(2, {"--log-jsonl", old, "--load", missing}));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(pl::test::read_text_file(old), "an earlier run's log\n");
}

// The same for every output of the run (issue 38): a bad --data-path leaves no events file, no directory made for
// it, no JSON-lines log; the same run with good flags keeps both.
TEST(LogJsonl, AFailedStartLeavesNoEventsFileEither) {
  pl::test::TempDir dir;
  const std::filesystem::path made = dir.path() / "made";
  const std::string file = (dir.path() / "run.jsonl").string(), tb = (made / "tb").string();
  ProcessResult r = run_app(log_jsonl_tiny(1, {"--log-jsonl", file, "--tensorboard-dir", tb, "--data-path",
                                               (dir.path() / "no_such_prefix").string()}));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_FALSE(std::filesystem::exists(made)) << r.err;
  EXPECT_FALSE(std::filesystem::exists(file));
  r = run_app(log_jsonl_tiny(1, {"--log-jsonl", file, "--tensorboard-dir", tb}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(tb), {}), 1);
  EXPECT_TRUE(std::filesystem::exists(file));
}

// A resume appends after its own start line (an --exit-interval stop, then --load); a fresh run replaces.
TEST(LogJsonl, AResumeAppendsAndAFreshRunReplaces) {
  pl::test::TempDir dir;
  const std::string file = (dir.path() / "run.jsonl").string(), save = (dir.path() / "ckpt").string();
  ProcessResult r = run_app(log_jsonl_tiny(4, {"--log-jsonl", file, "--save", save, "--exit-interval", "2"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<Json> events = read_jsonl(file);
  EXPECT_EQ(events.back().at("stop"), "exit_interval");
  r = run_app(log_jsonl_tiny(4, {"--log-jsonl", file, "--save", save, "--load", save}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  events = read_jsonl(file);
  ASSERT_EQ(of(events, "start").size(), 2u);
  std::vector<int> numbers;
  for (const Json& it : of(events, "iteration")) numbers.push_back(it.at("iteration"));
  EXPECT_EQ(numbers, (std::vector<int>{1, 2, 3, 4}));
  EXPECT_EQ(of(events, "start")[1].at("first_iteration"), 3);
  r = run_app(log_jsonl_tiny(1, {"--log-jsonl", file}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  events = read_jsonl(file);
  EXPECT_EQ(of(events, "start").size(), 1u);
  EXPECT_EQ(of(events, "iteration").size(), 1u);
}

// A FILE that cannot be written, or that is one of the run's inputs, is one line naming --log-jsonl, before
// anything is built; nothing is written.
TEST(LogJsonl, AFileThatCannotBeWrittenOrIsAnInputIsRefusedAtStartUp) {
  pl::test::TempDir dir;
  const std::string model_copy = dir.write("model.json", pl::test::read_text_file(kTiny));
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {(dir.path() / "missing_dir" / "run.jsonl").string(), {"--log-jsonl", "does not exist"}},
      {dir.path().string(), {"--log-jsonl", "not a regular file"}},
  };
  for (const auto& [path, needles] : cases) {
    SCOPED_TRACE(path);
    const ProcessResult r = run_app(log_jsonl_tiny(2, {"--log-jsonl", path}));
    EXPECT_EQ(r.exit_code, 1);
    const auto err = pl::test::split_lines(r.err);
    ASSERT_EQ(err.size(), 1u) << r.err;
    for (const std::string& n : needles) EXPECT_NE(err[0].find(n), std::string::npos) << err[0];
    EXPECT_EQ(r.out.find("iteration"), std::string::npos) << "refused after the run started";
  }
  std::vector<std::string> args = log_jsonl_tiny(2, {"--log-jsonl", model_copy});
  args[1] = model_copy;  // --model is the file --log-jsonl names
  const ProcessResult r = run_app(args);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--log-jsonl"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--model"), std::string::npos) << r.err;
  EXPECT_EQ(pl::test::read_text_file(model_copy), pl::test::read_text_file(kTiny)) << "the input was overwritten";
}

}  // namespace
