// pretrain_llama's document-aware packing flags (issue 27): --eod-mask-loss, --reset-position-ids,
// --reset-attention-mask and --calculate-per-token-loss train on indexed data whose tokenizer record gives the
// EOD id (other losses than without them: the 20..59-token documents put EODs in every 32-token sample); data
// without a record is refused in one line naming the flag and the missing record file.
#include <gtest/gtest.h>

#include <regex>
#include <string>
#include <vector>

#include "data/indexed_dataset.h"
#include "data/tokenizer_record.h"

#include "test_util.h"
#include "cli/programs.h"

namespace {


// 200 documents of 20..59 tokens ending with EOD 127 (llama_tiny's vocabulary), with or without a record.
std::string write_corpus(const pl::test::TempDir& dir, bool record) {
  const std::string prefix = (dir.path() / "docs_text_document").string();
  pl::data::IndexedDatasetWriter w(prefix, 128);
  for (int d = 0; d < 200; ++d) {
    std::vector<int32_t> doc;
    for (int k = 0; k < 20 + d % 40; ++k) doc.push_back((d + k * k) % 127);
    doc.push_back(127);
    w.add_document(doc);
  }
  w.finalize();
  if (record) {
    pl::data::TokenizerRecord r;
    r.type = "byte";
    r.vocab_size = 128;
    r.eod = 127;
    r.append_eod = true;
    pl::data::write_tokenizer_record(prefix, r);
  }
  return prefix;
}

std::vector<std::string> args(const std::string& prefix, std::vector<std::string> extra) {
  std::vector<std::string> a = {"--model", kTiny, "--device", "cpu", "--disable-fp4", "--train-iters", "2",
                                "--global-batch-size", "4", "--micro-batch-size", "2", "--seq-length", "32",
                                "--data-path", prefix};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

std::vector<std::string> losses(const std::string& out) {
  const std::regex loss(R"(lm loss: (\d\.\d{6}E[+-]\d\d))");
  std::vector<std::string> v;
  for (std::sregex_iterator it(out.begin(), out.end(), loss), end; it != end; ++it) v.push_back((*it)[1]);
  return v;
}

TEST(PackingCli, TrainsWithEveryFlagAndChangesTheLoss) {
  pl::test::TempDir dir;
  const std::string prefix = write_corpus(dir, true);
  const pl::test::ProcessResult plain = pl::test::run_process(kApp, args(prefix, {}), 120.0);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  const pl::test::ProcessResult packed = pl::test::run_process(
      kApp,
      args(prefix, {"--eod-mask-loss", "--reset-position-ids", "--reset-attention-mask", "--calculate-per-token-loss"}),
      120.0);
  ASSERT_EQ(packed.exit_code, 0) << packed.err;
  ASSERT_EQ(losses(plain.out).size(), 2u) << plain.out;
  ASSERT_EQ(losses(packed.out).size(), 2u) << packed.out;
  EXPECT_NE(losses(plain.out), losses(packed.out));
  EXPECT_NE(packed.out.find("documents: EOD 127 (--eod-mask-loss --reset-position-ids --reset-attention-mask); loss "
                            "normalized by the tokens counted over the global batch"),
            std::string::npos)
      << packed.out;
  EXPECT_EQ(plain.out.find("documents:"), std::string::npos);
}

TEST(PackingCli, DataWithoutTokenizerRecordIsOneLineNamingFlagAndFile) {
  pl::test::TempDir dir;
  const std::string prefix = write_corpus(dir, false);
  for (const char* flag : {"--eod-mask-loss", "--reset-position-ids", "--reset-attention-mask"}) {
    const pl::test::ProcessResult r = pl::test::run_process(kApp, args(prefix, {flag}), 60.0);
    EXPECT_NE(r.exit_code, 0) << r.out;
    const auto lines = pl::test::split_lines(r.err);
    ASSERT_EQ(lines.size(), 1u) << r.err;
    EXPECT_NE(lines[0].find(flag), std::string::npos) << lines[0];
    EXPECT_NE(lines[0].find(prefix + ".tokenizer.json"), std::string::npos) << lines[0];
  }
}

}  // namespace
