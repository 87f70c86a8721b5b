// inspect_data prints what the trainer would read: Megatron's first mock training sample at seq 4096
// (golden values from numpy, see scripts/mock_data_golden.py), samples of real data identical to the
// library's, and one-line errors.
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "data/data_pipeline.h"
#include "data/indexed_dataset.h"

#include "test_util.h"
#include "cli/programs.h"

namespace {


// The ids printed after the "sample i of ..." header line.
std::vector<int32_t> ids_after(const std::string& out, const std::string& header_start) {
  const size_t h = out.find(header_start);
  if (h == std::string::npos) return {};
  const size_t line = out.find('\n', h) + 1;
  std::istringstream in(out.substr(line, out.find('\n', line) - line));
  std::vector<int32_t> ids;
  for (int32_t v; in >> v;) ids.push_back(v);
  return ids;
}

TEST(InspectData, MockSampleZeroAtSeq4096IsMegatrons) {
  const pl::test::ProcessResult r = pl::test::run_process(kInspect, {"--mock", "--seq-length", "4096", "--sample", "0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("mock train: 33333 sequences"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("16648 samples (the run reads 3200)"), std::string::npos) << r.out;
  const std::vector<int32_t> ids = ids_after(r.out, "sample 0 of train (iteration 1, position 0");
  ASSERT_EQ(ids.size(), 4097u) << r.out.substr(0, 2000);
  // numpy golden: dataset index 0 -> shuffle 2298, tokens 611.. (document 4637 from offset 610).
  EXPECT_EQ(std::accumulate(ids.begin(), ids.end(), int64_t{0}), 4075306);
  EXPECT_EQ(pl::test::fnv1a(ids), 0x2c63b91c7c2b533dULL);
  EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + 6), (std::vector<int32_t>{611, 612, 613, 614, 615, 616}));
  EXPECT_EQ(std::vector<int32_t>(ids.end() - 6, ids.end()), (std::vector<int32_t>{759, 760, 761, 762, 763, 764}));
}

TEST(InspectData, RealDataSamplesAreTheLibrarys) {
  pl::test::TempDir dir;
  const std::string prefix = (dir.path() / "d_text_document").string();
  {
    pl::data::IndexedDatasetWriter w(prefix, 300);
    for (int d = 0; d < 300; ++d) {
      std::vector<int32_t> doc;
      for (int k = 0; k < 1 + d % 17; ++k) doc.push_back((d + 3 * k) % 299);
      doc.push_back(299);
      w.add_document(doc);
    }
    w.finalize();
  }
  const pl::test::ProcessResult r = pl::test::run_process(
      kInspect, {"--data-path", prefix, "--model", std::string(PL_CONFIG_DIR) + "/models/llama_tiny.json",
                 "--seq-length", "32", "--train-iters", "10", "--global-batch-size", "4", "--eval-iters", "1",
                 "--eval-interval", "5", "--sample", "2:4", "--from", "valid", "--data-cache-path",
                 (dir.path() / "cache").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  pl::data::DataConfig c;
  c.data_path = {prefix};
  c.cache_path = (dir.path() / "cache").string();
  const pl::data::TrainingData d(pl::data::data_config_for_run(c, 128, 32, {40, 12, 4}));
  std::vector<int32_t> want(33);
  for (int i = 2; i < 4; ++i) {
    d.split(pl::data::Split::valid)->get(i, want);
    EXPECT_EQ(ids_after(r.out, "sample " + std::to_string(i) + " of valid:"), want) << r.out;
  }
  EXPECT_NE(r.out.find("valid: 9 sequences"), std::string::npos) << r.out;  // round(0.999*300) - round(0.969*300)
  EXPECT_NE(r.out.find("the run reads 12"), std::string::npos) << r.out;    // (10/5 + 1) * 1 * 4
}

TEST(InspectData, ErrorsAreOneLine) {
  const auto expect_fail = [](const std::vector<std::string>& args, const std::string& needle) {
    const pl::test::ProcessResult r = pl::test::run_process(kInspect, args);
    EXPECT_NE(r.exit_code, 0);
    const auto lines = pl::test::split_lines(r.err);
    ASSERT_EQ(lines.size(), 1u) << r.err;
    EXPECT_NE(lines[0].find(needle), std::string::npos) << lines[0];
  };
  expect_fail({"--seq-length", "64"}, "--mock and --data-path");
  expect_fail({"--mock", "--data-path", "x"}, "--mock and --data-path");
  expect_fail({"--mock", "--seq-length", "4096", "--sample", "99999"}, "16648 samples");
  expect_fail({"--mock", "--sample", "3:1"}, "empty");
  expect_fail({"--mock", "--sample", "x"}, "--sample");
  expect_fail({"--mock", "--from", "dev"}, "--from");
  expect_fail({"--data-path", "/nonexistent/p_text_document"}, "/nonexistent/p_text_document.idx");
  // Issue 14: an index whose range end wraps (it printed nothing and exited 0), sizes that overflow.
  expect_fail({"--mock", "--sample", "9223372036854775807"}, "overflows");
  expect_fail({"--mock", "--train-iters", "4611686018427387904"}, "overflows");
}

}  // namespace
