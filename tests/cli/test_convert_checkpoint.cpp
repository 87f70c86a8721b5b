// convert_checkpoint: a saved checkpoint becomes a Hugging Face directory whose weights are the
// checkpoint's FP32 masters rounded to BF16, and which pretrain_llama --init-from-hf reads back.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "model/hf_llama.h"
#include "model/llama.h"
#include "numerics/bf16.h"
#include "train/checkpoint.h"

#include "test_util.h"
#include "cli/programs.h"

namespace {


std::string train_and_save(const pl::test::TempDir& dir) {
  const std::string ckpt = (dir.path() / "ckpt").string();
  const pl::test::ProcessResult r =
      pl::test::run_process(kApp, {"--model", kTiny, "--device", "cpu", "--train-iters", "3", "--global-batch-size", "4",
                                   "--micro-batch-size", "2", "--seq-length", "32", "--save", ckpt},
                            120.0);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return ckpt;
}

TEST(ConvertCheckpoint, HfWeightsAreTheMastersInBf16AndLoadBack) {
  pl::test::TempDir dir;
  const std::string ckpt = train_and_save(dir);
  const std::string hf = (dir.path() / "hf").string();
  const pl::test::ProcessResult c = pl::test::run_process(
      kConvert, {"--load", ckpt, "--to-hf", hf, "--max-shard-size", "500KB", "--eos-token-id", "127"});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  EXPECT_NE(c.out.find("iteration 3, model llama_tiny"), std::string::npos) << c.out;
  EXPECT_TRUE(std::filesystem::exists(hf + "/model.safetensors.index.json"));  // 1.6 MB of BF16 > 500 KB
  EXPECT_TRUE(std::filesystem::exists(hf + "/model-00001-of-00004.safetensors")) << c.out;

  const pl::VerifiedCheckpoint v = pl::verify_checkpoint(ckpt);
  const std::vector<float> master = pl::read_master_weights(v);
  const pl::ModelConfig tiny = pl::load_model_config(kTiny);
  ASSERT_EQ(static_cast<int64_t>(master.size()), tiny.num_parameters());
  pl::LlamaModel model(tiny, 1, 8, pl::OpContext{});
  pl::import_hf(hf, model);
  const float* got = model.master().flat.f32();
  int64_t differ = 0, moved = 0;
  for (size_t i = 0; i < master.size(); ++i) {
    differ += got[i] != pl::num::round_bf16(master[i]);
    moved += master[i] != pl::num::round_bf16(master[i]);  // the masters are FP32: most are not BF16 values
  }
  EXPECT_EQ(differ, 0);
  EXPECT_GT(moved, static_cast<int64_t>(master.size()) / 2);

  const pl::test::ProcessResult run = pl::test::run_process(
      kApp, {"--init-from-hf", hf, "--device", "cpu", "--disable-fp4", "--train-iters", "1", "--global-batch-size", "2",
             "--micro-batch-size", "2", "--seq-length", "32"},
      120.0);
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.out.find("initialized from Hugging Face checkpoint " + hf), std::string::npos) << run.out;
}

TEST(ConvertCheckpoint, AnExistingExportIsReplacedWholeOnlyWithOverwrite) {
  pl::test::TempDir dir;
  const std::string ckpt = train_and_save(dir);
  const std::string hf = (dir.path() / "hf").string();
  ASSERT_EQ(pl::test::run_process(kConvert, {"--load", ckpt, "--to-hf", hf, "--max-shard-size", "500KB"}).exit_code, 0);
  const pl::test::ProcessResult again = pl::test::run_process(kConvert, {"--load", ckpt, "--to-hf", hf});
  EXPECT_NE(again.exit_code, 0);
  EXPECT_NE(again.err.find("--overwrite"), std::string::npos) << again.err;
  EXPECT_TRUE(std::filesystem::exists(hf + "/model.safetensors.index.json"));  // untouched
  const pl::test::ProcessResult over = pl::test::run_process(kConvert, {"--load", ckpt, "--to-hf", hf, "--overwrite"});
  ASSERT_EQ(over.exit_code, 0) << over.err;
  // The new export alone: one unsharded file, none of the old shards, no temporaries beside it.
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(hf)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"config.json", "model.safetensors"}));
  int siblings = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) siblings += e.path().filename().string() != "ckpt";
  EXPECT_EQ(siblings, 1);  // hf only
  // --overwrite replaces an earlier export only (issue 38): a directory of other files is refused and kept.
  const std::string mine = (dir.path() / "mine").string();
  std::filesystem::create_directory(mine);
  std::ofstream(mine + "/notes.txt") << "my notes\n";
  const pl::test::ProcessResult refused = pl::test::run_process(kConvert, {"--load", ckpt, "--to-hf", mine, "--overwrite"});
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.err.find("--to-hf " + mine + ": not a Hugging Face export of this program (no config.json)"),
            std::string::npos)
      << refused.err;
  EXPECT_EQ(pl::test::read_text_file(mine + "/notes.txt"), "my notes\n");
}

TEST(ConvertCheckpoint, ErrorsAreOneLine) {
  pl::test::TempDir dir;
  const std::string ckpt = train_and_save(dir);
  const auto expect_fail = [](const std::vector<std::string>& args, const std::string& needle) {
    const pl::test::ProcessResult r = pl::test::run_process(kConvert, args);
    EXPECT_NE(r.exit_code, 0);
    const auto lines = pl::test::split_lines(r.err);
    ASSERT_EQ(lines.size(), 1u) << r.err;
    EXPECT_NE(lines[0].find(needle), std::string::npos) << lines[0];
  };
  const std::string out = (dir.path() / "hf").string();
  expect_fail({"--load", (dir.path() / "none").string(), "--to-hf", out}, "none");
  expect_fail({"--load", ckpt, "--to-hf", out, "--max-shard-size", "5 gigs"}, "--max-shard-size");
  expect_fail({"--load", ckpt}, "--to-hf");
  // One flipped byte in the master weights: refused before anything is written.
  const std::string master = ckpt + "/iter_0000003/master_fp32.bin";
  {
    std::fstream f(master, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(1000);
    char b = 0;
    f.read(&b, 1);
    f.seekp(1000);
    b = static_cast<char>(b ^ 0x40);
    f.write(&b, 1);
  }
  expect_fail({"--load", ckpt, "--to-hf", out}, "master_fp32.bin");
  EXPECT_FALSE(std::filesystem::exists(out + "/config.json"));
}

}  // namespace
