// pretrain_llama on indexed data: the data summary, Megatron's validation lines (in-loop and after
// training), the index cache reused by a second run, and one-line errors for data flags.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "data/indexed_dataset.h"

#include "test_util.h"
#include "cli/programs.h"

namespace {


// 400 documents of 20..59 tokens over llama_tiny's vocabulary (127 = eod).
std::string train_on_data_write_corpus(const pl::test::TempDir& dir, int32_t vocab = 128) {
  const std::string prefix = (dir.path() / "c_text_document").string();
  pl::data::IndexedDatasetWriter w(prefix, vocab);
  for (int d = 0; d < 400; ++d) {
    std::vector<int32_t> doc;
    for (int k = 0; k < 20 + d % 40; ++k) doc.push_back((d + k * k) % (vocab - 1));
    doc.push_back(vocab - 1);
    w.add_document(doc);
  }
  w.finalize();
  return prefix;
}

std::vector<std::string> train_on_data_run_args(const std::string& prefix, std::vector<std::string> extra) {
  std::vector<std::string> a = {"--model", kTiny, "--device", "cpu", "--disable-fp4", "--train-iters", "4",
                                "--global-batch-size", "4", "--micro-batch-size", "2", "--seq-length", "32",
                                "--data-path", prefix};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

TEST(TrainOnData, ValidationLinesInMegatronsFormat) {
  pl::test::TempDir dir;
  const std::string prefix = train_on_data_write_corpus(dir);
  const pl::test::ProcessResult r = pl::test::run_process(
      kApp, train_on_data_run_args(prefix, {"--eval-interval", "2", "--eval-iters", "2", "--split", "90,8,2"}), 120.0);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto lines = pl::test::split_lines(r.out);
  const std::regex val(R"( validation loss at (iteration \d+( on (validation|test) set)?) \| lm loss value: )"
                       R"((\d\.\d{6}E[+-]\d\d) \| lm loss PPL: (\d\.\d{6}E[+-]\d\d) \| )");
  std::vector<std::string> prefixes;
  for (size_t i = 0; i < lines.size(); ++i) {
    std::smatch m;
    if (!std::regex_match(lines[i], m, val)) continue;
    prefixes.push_back(m[1]);
    // Framed by rules of '-' one longer than the line.
    ASSERT_TRUE(i >= 1 && i + 1 < lines.size());
    EXPECT_EQ(lines[i - 1], std::string(lines[i].size() + 1, '-'));
    EXPECT_EQ(lines[i + 1], std::string(lines[i].size() + 1, '-'));
    EXPECT_NEAR(std::stod(m[5]), std::exp(std::stod(m[4])), 1e-5 * std::exp(std::stod(m[4])));
  }
  EXPECT_EQ(prefixes, (std::vector<std::string>{"iteration 2", "iteration 4", "iteration 4 on validation set",
                                                "iteration 4 on test set"}))
      << r.out;
  // The validation line comes after iteration 2's log line.
  EXPECT_LT(r.out.find("iteration        2/"), r.out.find("validation loss at iteration 2"));
  EXPECT_NE(r.out.find("data: dataset 1: " + prefix + " (400 sequences"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("valid: 32 sequences"), std::string::npos) << r.out;  // round(.98*400) - round(.9*400)
  EXPECT_NE(r.out.find("indices built, cached in " + prefix + "/cache/GPTDataset_indices/"), std::string::npos)
      << r.out;

  // A second run reads the cached indices and prints the same losses.
  const pl::test::ProcessResult again = pl::test::run_process(
      kApp, train_on_data_run_args(prefix, {"--eval-interval", "2", "--eval-iters", "2", "--split", "90,8,2"}), 120.0);
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.out.find("indices loaded from"), std::string::npos) << again.out;
  const std::regex loss(R"(lm loss( value)?: (\d\.\d{6}E[+-]\d\d))");
  const auto losses = [&](const std::string& out) {
    std::vector<std::string> v;
    for (std::sregex_iterator it(out.begin(), out.end(), loss), end; it != end; ++it) v.push_back((*it)[2]);
    return v;
  };
  EXPECT_EQ(losses(r.out), losses(again.out));
  EXPECT_EQ(losses(r.out).size(), 8u);  // 4 iterations + 4 evaluations
}

TEST(TrainOnData, Errors) {
  pl::test::TempDir dir;
  const std::string wide = train_on_data_write_corpus(dir, 1000);  // ids up to 999: not for llama_tiny's 128
  const auto expect_fail = [](const std::vector<std::string>& args, const std::vector<std::string>& needles) {
    const pl::test::ProcessResult r = pl::test::run_process(kApp, args, 120.0);
    EXPECT_NE(r.exit_code, 0);
    const auto lines = pl::test::split_lines(r.err);
    ASSERT_EQ(lines.size(), 1u) << r.err;
    for (const auto& n : needles) EXPECT_NE(lines[0].find(n), std::string::npos) << lines[0];
  };
  expect_fail(train_on_data_run_args(wide, {}), {"token id", "vocabulary [0, 128)", "train split"});
  expect_fail(train_on_data_run_args((dir.path() / "nope_text_document").string(), {}), {"nope_text_document.idx"});
  expect_fail(train_on_data_run_args(wide, {"--eval-interval", "2"}), {"--eval-interval", "--eval-iters"});
  expect_fail({"--model", kTiny, "--device", "cpu", "--split", "1,1,1"}, {"--split", "--data-path"});
  expect_fail(train_on_data_run_args("0.5", {}), {"--data-path", "weight"});
}

}  // namespace
