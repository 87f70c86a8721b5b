// The whole real-data path, as README shows it: build the sample corpus (license texts, byte
// tokenizer) with scripts/make_sample_corpus.sh and preprocess_data, train llama_tiny_bytes on it for
// 50 iterations with validation every 25, and check that training and validation loss fall.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "test_util.h"
#include "cli/programs.h"

namespace {

const std::filesystem::path kSource = std::filesystem::path(PL_CONFIG_DIR).parent_path();

TEST(EndToEndData, PreprocessTheSampleCorpusTrainAndValidate) {
  if (!std::filesystem::is_directory("/usr/share/common-licenses"))
    GTEST_SKIP() << "no /usr/share/common-licenses (Debian's base-files) to build the sample corpus from";
  pl::test::TempDir dir;
  ::setenv("OUT_DIR", dir.path().c_str(), 1);
  const pl::test::ProcessResult corpus =
      pl::test::run_process("/bin/bash", {(kSource / "scripts/make_sample_corpus.sh").string(), kPreprocess}, 300.0);
  ::unsetenv("OUT_DIR");
  ASSERT_EQ(corpus.exit_code, 0) << corpus.out << corpus.err;
  const std::string prefix = (dir.path() / "license_byte_text_document").string();
  ASSERT_TRUE(std::filesystem::exists(prefix + ".bin") && std::filesystem::exists(prefix + ".idx") &&
              std::filesystem::exists(prefix + ".tokenizer.json"));

  const pl::test::ProcessResult r = pl::test::run_process(
      kApp,
      {"--model", (kSource / "configs/models/llama_tiny_bytes.json").string(), "--device", "cpu", "--disable-fp4",
       "--train-iters", "50", "--global-batch-size", "8", "--micro-batch-size", "2", "--seq-length", "128",
       "--data-path", prefix, "--eval-interval", "25", "--eval-iters", "4"},
      900.0);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("tokenizer byte vocab 258 eod 257"), std::string::npos) << r.out;

  const std::regex train(R"( iteration\s+(\d+)/\s+50 \|.* lm loss: (\d\.\d{6}E[+-]\d\d) \|)");
  const std::regex valid(R"( validation loss at iteration (\d+) \| lm loss value: (\d\.\d{6}E[+-]\d\d) \|)");
  std::vector<double> losses, valid_losses;
  for (const std::string& line : pl::test::split_lines(r.out)) {
    std::smatch m;
    if (std::regex_search(line, m, train)) losses.push_back(std::stod(m[2]));
    if (std::regex_search(line, m, valid)) valid_losses.push_back(std::stod(m[2]));
  }
  ASSERT_EQ(losses.size(), 50u) << r.out;
  ASSERT_EQ(valid_losses.size(), 2u) << r.out;  // iterations 25 and 50
  // ln(258) = 5.55 at the start; bytes of English text are far from uniform.
  EXPECT_GT(losses.front(), 5.0);
  EXPECT_LT(losses.back(), 0.7 * losses.front()) << r.out;
  EXPECT_LT(valid_losses[1], valid_losses[0]) << r.out;
  EXPECT_LT(valid_losses[0], losses.front());
  EXPECT_NE(r.out.find("validation loss at iteration 50 on validation set"), std::string::npos);
}

}  // namespace
