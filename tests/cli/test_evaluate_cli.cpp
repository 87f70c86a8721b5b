// evaluate and pretrain_llama --downstream-eval (issue 43) through the programs: a tiny model trained on a pattern
// (the context determines the answer: "<noise> | k -> l", the next letter) scores far above chance on a held-out
// task file of that pattern and a fresh one near chance; the results JSON and samples hold lm-eval's keys and let a
// reader recompute the score; the Hugging Face export and a LoRA checkpoint score too; --downstream-eval's lines come
// at the interval and leave the training losses as they were; bad input is one line and writes nothing.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"
#include "cli/programs.h"

namespace {

namespace fs = std::filesystem;
using pl::test::ProcessResult;
using pl::test::TempDir;


std::string noise(std::mt19937& rng) {
  std::string w;
  const int n = 2 + static_cast<int>(rng() % 3);
  for (int i = 0; i < n; ++i) w += static_cast<char>('a' + rng() % 26);
  return w;
}
char next_letter(char c) { return c == 'z' ? 'a' : static_cast<char>(c + 1); }

// The corpus (4000 documents "<noise> | c -> next(c)") as a byte dataset, and a held-out task file of 200 documents
// (other noise) in the generic layout, the gold among three other letters.
struct Pattern {
  std::string data, task;
};
Pattern make_pattern(const TempDir& dir) {
  std::mt19937 rng(7);
  std::string corpus;
  for (int i = 0; i < 4000; ++i) {
    const char c = static_cast<char>('a' + rng() % 26);
    corpus += noise(rng) + " | " + c + " -> " + next_letter(c) + "\n\n";
  }
  std::string task;
  for (int i = 0; i < 200; ++i) {
    const char c = static_cast<char>('a' + rng() % 26), gold = next_letter(c);
    std::vector<std::string> choices;
    while (choices.size() < 3) {
      const std::string o(1, static_cast<char>('a' + rng() % 26));
      if (o[0] != gold && std::find(choices.begin(), choices.end(), o) == choices.end()) choices.push_back(o);
    }
    const int label = static_cast<int>(rng() % 4);
    choices.insert(choices.begin() + label, std::string(1, gold));
    task += nlohmann::json{{"context", noise(rng) + " | " + c + " ->"}, {"choices", choices}, {"label", label}}.dump() + "\n";
  }
  const std::string prefix = (dir.path() / "pat").string();
  const ProcessResult p = pl::test::run_process(kPreprocess, {"--input", dir.write("corpus.txt", corpus), "--output-prefix",
                                                             prefix, "--tokenizer-type", "byte", "--append-eod",
                                                             "--text-document", "paragraph"}, 120.0);
  EXPECT_EQ(p.exit_code, 0) << p.err;
  return {prefix + "_text_document", dir.write("successor.jsonl", task)};
}

std::vector<std::string> train_args(const Pattern& p, const char* iters, std::vector<std::string> extra) {
  std::vector<std::string> a = {"--model", kTinyBytes, "--device", "cpu", "--data-path", p.data, "--split", "100,0,0",
                                "--train-iters", iters, "--global-batch-size", "8", "--micro-batch-size", "8",
                                "--seq-length", "128", "--lr", "3e-3", "--min-lr", "3e-4", "--warmup-iters", "10", "--lr-decay-iters", "300",
                                "--log-interval", "1", "--eval-iters", "0"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

double acc_of(const std::string& results_json, const std::string& task = "successor") {
  const nlohmann::json j = nlohmann::json::parse(pl::test::read_text_file(results_json));
  return j.at("results").at(task).at("acc,none").get<double>();
}

TEST(EvaluateCli, APatternTrainedModelScoresFarAboveChanceAndAFreshOneNearIt) {
  TempDir dir;
  const Pattern p = make_pattern(dir);
  const std::string trained = (dir.path() / "trained").string(), fresh = (dir.path() / "fresh").string();
  for (auto [iters, save] : {std::pair{"300", trained}, std::pair{"1", fresh}}) {
    const ProcessResult r = pl::test::run_process(kApp, train_args(p, iters, {"--disable-fp4", "--save", save}), 300.0);
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  const std::string out = (dir.path() / "res" / "trained.json").string();
  fs::create_directories(dir.path() / "res");
  const ProcessResult e = pl::test::run_process(kEvaluate, {"--load", trained, "--task", p.task, "--output", out,
                                                            "--log-samples", "--batch-size", "6"}, 300.0);
  ASSERT_EQ(e.exit_code, 0) << e.err;
  EXPECT_NE(e.out.find("|successor|      1|none  |     0|acc     |↑  |"), std::string::npos) << e.out;
  const double acc = acc_of(out);
  EXPECT_GT(acc, 0.6) << e.out;  // chance: 0.25
  // lm-eval's keys, and samples from which the score is recomputed.
  const nlohmann::json j = nlohmann::json::parse(pl::test::read_text_file(out));
  EXPECT_EQ(j["n-samples"]["successor"]["original"], 200);
  EXPECT_EQ(j["n-shot"]["successor"], 0);
  EXPECT_TRUE(j["results"]["successor"].contains("acc_norm_stderr,none"));
  const std::vector<std::string> samples =
      pl::test::split_lines(pl::test::read_text_file((dir.path() / "res" / "samples_successor.jsonl").string()));
  ASSERT_EQ(samples.size(), 200u);
  double right = 0.0;
  for (const std::string& line : samples) {
    const nlohmann::json s = nlohmann::json::parse(line);
    size_t best = 0;
    for (size_t c = 0; c < s["filtered_resps"].size(); ++c)
      if (s["filtered_resps"][c][0].get<double>() > s["filtered_resps"][best][0].get<double>()) best = c;
    right += best == s["target"].get<size_t>() ? 1.0 : 0.0;
    EXPECT_EQ(s["acc"].get<double>(), best == s["target"].get<size_t>() ? 1.0 : 0.0);
  }
  EXPECT_DOUBLE_EQ(right / 200.0, acc);
  // The fresh model: near chance.
  const std::string fresh_out = (dir.path() / "res" / "fresh.json").string();
  const ProcessResult f = pl::test::run_process(kEvaluate, {"--load", fresh, "--task", p.task, "--output", fresh_out}, 300.0);
  ASSERT_EQ(f.exit_code, 0) << f.err;
  EXPECT_LT(acc_of(fresh_out), 0.45) << f.out;
  // The Hugging Face export scores the same (the same BF16 weights and tokenizer record).
  const std::string hf = (dir.path() / "hf").string(), hf_out = (dir.path() / "res" / "hf.json").string();
  ASSERT_EQ(pl::test::run_process(kConvert, {"--load", trained, "--to-hf", hf}, 120.0).exit_code, 0);
  const ProcessResult h = pl::test::run_process(kEvaluate, {"--init-from-hf", hf, "--task", p.task, "--output", hf_out}, 300.0);
  ASSERT_EQ(h.exit_code, 0) << h.err;
  EXPECT_EQ(acc_of(hf_out), acc);
  // A LoRA checkpoint over that export: scored as base + adapters.
  const std::string lora = (dir.path() / "lora").string();
  const ProcessResult l = pl::test::run_process(
      kApp, train_args(p, "3", {"--disable-fp4", "--init-from-hf", hf, "--peft", "lora", "--lora-dim", "4", "--save", lora}), 300.0);
  ASSERT_EQ(l.exit_code, 0) << l.err;
  const ProcessResult le = pl::test::run_process(kEvaluate, {"--load", lora, "--task", p.task, "--limit", "20"}, 300.0);
  ASSERT_EQ(le.exit_code, 0) << le.err;
  EXPECT_NE(le.err.find("LoRA dim 4 over its base hf " + hf), std::string::npos) << le.err;
}

using pl::test::mpirun_flags;

// Two MPI ranks each score every other document and reduce: the same results file as one rank.
TEST(EvaluateCli, TwoRanksScoreHalvesAndReduceToTheOneRankResults) {
  const std::string mpirun = PL_MPIRUN;
  if (mpirun.empty()) GTEST_SKIP() << "built without MPI (scripts/setup.sh installs OpenMPI; reconfigure)";
  TempDir dir;
  const Pattern p = make_pattern(dir);
  const std::string ck = (dir.path() / "ck").string();
  ASSERT_EQ(pl::test::run_process(kApp, train_args(p, "20", {"--disable-fp4", "--save", ck}), 120.0).exit_code, 0);
  const std::string one = (dir.path() / "one.json").string(), two = (dir.path() / "two.json").string();
  const std::vector<std::string> args = {"--load", ck, "--task", p.task, "--limit", "41"};
  std::vector<std::string> a1 = args, a2 = mpirun_flags();
  a1.insert(a1.end(), {"--output", one});
  a2.insert(a2.end(), {"-x", "OMP_NUM_THREADS=1", "-np", "2", kEvaluate});
  a2.insert(a2.end(), args.begin(), args.end());
  a2.insert(a2.end(), {"--output", two});
  const ProcessResult r1 = pl::test::run_process(kEvaluate, a1, 120.0);
  const ProcessResult r2 = pl::test::run_process(mpirun, a2, 300.0);
  ASSERT_EQ(r1.exit_code, 0) << r1.err;
  ASSERT_EQ(r2.exit_code, 0) << r2.err;
  EXPECT_NE(r2.err.find("x 2 ranks"), std::string::npos) << r2.err;
  nlohmann::json j1 = nlohmann::json::parse(pl::test::read_text_file(one));
  nlohmann::json j2 = nlohmann::json::parse(pl::test::read_text_file(two));
  EXPECT_EQ(j1["results"], j2["results"]);
  EXPECT_EQ(j1["n-samples"], j2["n-samples"]);
}

std::vector<double> losses_of(const std::string& out) {
  std::vector<double> v;
  const std::regex re(R"(lm loss: ([0-9.E+-]+))");
  for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end; ++it) v.push_back(std::stod((*it)[1]));
  return v;
}

TEST(EvaluateCli, DownstreamEvalLinesComeAtTheIntervalAndLeaveTheLossesAlone) {
  TempDir dir;
  const Pattern p = make_pattern(dir);
  const std::vector<std::string> nvfp4 = {"--recipe", "bf16_with_nvfp4_mixed", "--num-layers-at-end-in-bf16", "0"};
  std::vector<std::string> with = nvfp4;
  for (const std::string& a : {std::string("--downstream-eval"), p.task, std::string("--downstream-eval-interval"),
                               std::string("8"), std::string("--downstream-eval-limit"), std::string("30"),
                               std::string("--log-jsonl"), (dir.path() / "log.jsonl").string()})
    with.push_back(a);
  const ProcessResult a = pl::test::run_process(kApp, train_args(p, "20", nvfp4), 300.0);
  const ProcessResult b = pl::test::run_process(kApp, train_args(p, "20", with), 300.0);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_EQ(losses_of(a.out), losses_of(b.out));
  ASSERT_EQ(losses_of(a.out).size(), 20u);
  const std::regex line(R"( downstream eval at iteration (\d+) \| successor \| acc: [01]\.\d{4} \| acc_stderr: 0\.\d{4} \| )"
                        R"(acc_norm: [01]\.\d{4} \| acc_norm_stderr: 0\.\d{4} \| documents: 30 \| 0-shot \| forward: bf16 \|)");
  std::vector<int> at;
  for (std::sregex_iterator it(b.out.begin(), b.out.end(), line), end; it != end; ++it) at.push_back(std::stoi((*it)[1]));
  EXPECT_EQ(at, (std::vector<int>{8, 16, 20})) << b.out;
  int records = 0;
  for (const std::string& l : pl::test::split_lines(pl::test::read_text_file((dir.path() / "log.jsonl").string()))) {
    const nlohmann::json j = nlohmann::json::parse(l);
    if (j["event"] == "eval" && j["split"] == "downstream") {
      ++records;
      EXPECT_EQ(j["task"], "successor");
      EXPECT_EQ(j["documents"], 30);
      EXPECT_TRUE(j.contains("acc") && j.contains("acc_norm"));
    }
  }
  EXPECT_EQ(records, 3);
}

void evaluate_expect_one_line_failure(const std::string& exe, const std::vector<std::string>& args,
                                      const std::vector<std::string>& needles) {
  const ProcessResult r = pl::test::run_process(exe, args, 120.0);
  ASSERT_FALSE(r.timed_out);
  EXPECT_NE(r.exit_code, 0) << r.out;
  const auto lines = pl::test::split_lines(r.err);
  ASSERT_EQ(lines.size(), 1u) << r.err;
  for (const std::string& n : needles) EXPECT_NE(lines[0].find(n), std::string::npos) << "'" << n << "' not in: " << lines[0];
}

TEST(EvaluateCli, BadInputIsOneLineAndWritesNothing) {
  TempDir dir;
  const Pattern p = make_pattern(dir);
  const std::string ck = (dir.path() / "ck").string();
  ASSERT_EQ(pl::test::run_process(kApp, train_args(p, "1", {"--disable-fp4", "--save", ck}), 120.0).exit_code, 0);
  const std::string bad = dir.write("bad.jsonl", R"({"context": "c", "choices": ["a"], "label": 0})" "\n{\"context\": 3}\n");
  const std::string out = (dir.path() / "r.json").string();
  evaluate_expect_one_line_failure(kEvaluate, {"--load", ck, "--task", bad, "--output", out}, {bad + ":2", "'choices'"});
  evaluate_expect_one_line_failure(kEvaluate, {"--load", ck, "--task", p.task, "--log-samples"}, {"--log-samples needs --output"});
  evaluate_expect_one_line_failure(kEvaluate, {"--task", p.task}, {"--load DIR or --init-from-hf DIR"});
  evaluate_expect_one_line_failure(kEvaluate, {"--load", ck, "--task", p.task, "--num-fewshot", "2"}, {"--fewshot-file"});
  evaluate_expect_one_line_failure(kEvaluate, {"--load", ck, "--task", p.task + ":hellaswag"}, {p.task + ":1", "'activity_label'"});
  const std::string notes = dir.write("notes.json", "{\"mine\": 1}\n");
  evaluate_expect_one_line_failure(kEvaluate, {"--load", ck, "--task", p.task, "--output", notes}, {"--output", "not a results file"});
  EXPECT_FALSE(fs::exists(out));
  EXPECT_EQ(pl::test::read_text_file(notes), "{\"mine\": 1}\n");
  evaluate_expect_one_line_failure(kApp, train_args(p, "2", {"--downstream-eval-limit", "5"}), {"--downstream-eval-limit needs --downstream-eval"});
  evaluate_expect_one_line_failure(kApp, {"--model", kTinyBytes, "--device", "cpu", "--train-iters", "2", "--global-batch-size", "2",
                                          "--micro-batch-size", "2", "--seq-length", "32", "--downstream-eval", p.task},
                                   {"--downstream-eval", "mock data"});
  evaluate_expect_one_line_failure(kApp, train_args(p, "2", {"--downstream-eval", bad}), {bad + ":2"});
}

}  // namespace
