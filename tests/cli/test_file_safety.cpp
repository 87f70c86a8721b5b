// Every tool against hostile paths (issue 14, classes 4 and 6): a FIFO given as any kind of input file is
// one "<app>: error: ..." line within seconds (before the fix, open(2) blocked forever), and no output may
// be, contain or lie inside an input -- the input left byte for byte as it was.
#include <sys/stat.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "data/indexed_dataset.h"
#include "io/npy.h"
#include "test_util.h"
#include "cli/programs.h"

namespace {

namespace fs = std::filesystem;
using pl::test::ProcessResult;
using pl::test::run_process;
using pl::test::TempDir;

const std::string kQuantize = PL_QUANTIZE_TENSOR_PATH;

std::string make_fifo(const fs::path& p) {
  fs::create_directories(p.parent_path());
  if (::mkfifo(p.c_str(), 0644) != 0) throw std::runtime_error("mkfifo failed: " + p.string());
  return p.string();
}

// A failure within the deadline: exit 1, one stderr line "<app>: error: " with the needles.
void expect_one_line(const ProcessResult& r, const std::string& app, const std::vector<std::string>& needles) {
  ASSERT_FALSE(r.timed_out) << app << " hung";
  EXPECT_EQ(r.exit_code, 1) << r.err;
  const auto lines = pl::test::split_lines(r.err);
  ASSERT_EQ(lines.size(), 1u) << r.err;
  EXPECT_EQ(lines[0].rfind(app + ": error: ", 0), 0u) << lines[0];
  for (const std::string& n : needles) EXPECT_NE(lines[0].find(n), std::string::npos) << n << " not in " << lines[0];
}

// Every regular file under `dir` (or `dir` itself) and its bytes.
std::map<std::string, std::string> contents(const fs::path& dir) {
  std::map<std::string, std::string> m;
  if (fs::is_regular_file(dir)) {
    m[dir.string()] = pl::test::read_text_file(dir.string());
    return m;
  }
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) m[e.path().string()] = pl::test::read_text_file(e.path().string());
  return m;
}

std::vector<std::string> tiny_run(std::vector<std::string> extra) {
  std::vector<std::string> a = {"--device", "cpu", "--train-iters", "1", "--global-batch-size", "2",
                                "--micro-batch-size", "2", "--seq-length", "32"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

std::string write_dataset(const fs::path& prefix) {
  fs::create_directories(prefix.parent_path());
  pl::data::IndexedDatasetWriter w(prefix.string(), 256);
  std::vector<int32_t> doc(300);
  for (size_t i = 0; i < doc.size(); ++i) doc[i] = static_cast<int32_t>(i % 250);
  for (int k = 0; k < 8; ++k) w.add_document(doc);
  w.finalize();
  return prefix.string();
}

constexpr double kDeadline = 60.0;

TEST(FileSafety, AFifoAsAnyInputIsOneLineNotAHang) {
  TempDir dir;
  const fs::path d = dir.path();
  // pretrain_llama: the model and recipe configs, the data's .bin, a Hugging Face config.json.
  const std::string model = make_fifo(d / "model.json");
  expect_one_line(run_process(kApp, tiny_run({"--model", model}), kDeadline), "pretrain_llama", {model, "is a FIFO"});
  const std::string recipe = make_fifo(d / "recipe.json");
  expect_one_line(run_process(kApp, tiny_run({"--model", kTiny, "--recipe", recipe}), kDeadline), "pretrain_llama",
                  {recipe, "is a FIFO"});
  const std::string prefix = write_dataset(d / "data" / "corpus");
  fs::remove(prefix + ".bin");
  const std::string bin = make_fifo(prefix + ".bin");
  expect_one_line(run_process(kApp, tiny_run({"--model", kTiny, "--data-path", prefix}), kDeadline), "pretrain_llama",
                  {bin, "is a FIFO"});
  const std::string hf_config = make_fifo(d / "hf" / "config.json");
  expect_one_line(run_process(kApp, tiny_run({"--init-from-hf", (d / "hf").string()}), kDeadline), "pretrain_llama",
                  {"config.json"});
  (void)hf_config;
  // inspect_data: the .idx.
  const std::string prefix2 = write_dataset(d / "data2" / "corpus");
  fs::remove(prefix2 + ".idx");
  const std::string idx = make_fifo(prefix2 + ".idx");
  expect_one_line(run_process(kInspect, {"--data-path", prefix2}, kDeadline), "inspect_data", {idx, "is a FIFO"});
  // quantize_tensor: the .npy.
  const std::string npy = make_fifo(d / "x.npy");
  expect_one_line(run_process(kQuantize, {npy, "--format", "nvfp4", "--out", (d / "q").string()}, kDeadline),
                  "quantize_tensor", {npy, "is a FIFO"});
  // preprocess_data: a JSON-lines input, the tokenizer model.
  const std::string jsonl = make_fifo(d / "docs.jsonl");
  expect_one_line(run_process(kPreprocess, {"--input", jsonl, "--output-prefix", (d / "out").string(),
                                            "--tokenizer-type", "byte"},
                              kDeadline),
                  "preprocess_data", {jsonl, "is a FIFO"});
  const std::string docs = dir.write("docs.json", "{\"text\": \"hello\"}\n");
  const std::string tok = make_fifo(d / "tokenizer.model");
  expect_one_line(run_process(kPreprocess, {"--input", docs, "--output-prefix", (d / "out").string(),
                                            "--tokenizer-type", "tiktoken", "--tokenizer-model", tok},
                              kDeadline),
                  "preprocess_data", {tok, "is a FIFO"});
  // convert_checkpoint: a checkpoint whose manifest is a FIFO.
  const std::string manifest = make_fifo(d / "ck" / "iter_0000002" / "manifest.json");
  expect_one_line(run_process(kConvert, {"--load", (d / "ck" / "iter_0000002").string(), "--to-hf",
                                         (d / "hf_out").string()},
                              kDeadline),
                  "convert_checkpoint", {manifest, "is a FIFO"});
}

// A FIFO in place of a file the manifest lists is named as a FIFO (it read "cannot stat: Operation not
// supported"), by every reader of checkpoints (issue 38).
TEST(FileSafety, AFifoInsideACheckpointIsNamedAsOne) {
  TempDir dir;
  const std::string ck = (dir.path() / "ck").string();
  const ProcessResult train = run_process(kApp, tiny_run({"--model", kTiny, "--disable-fp4", "--save", ck}), 300.0);
  ASSERT_EQ(train.exit_code, 0) << train.err;
  const fs::path master = fs::path(ck) / "iter_0000001" / "master_fp32.bin";
  fs::remove(master);
  make_fifo(master);
  expect_one_line(run_process(kConvert, {"--load", ck, "--to-hf", (dir.path() / "hf").string()}, kDeadline),
                  "convert_checkpoint", {master.string(), "is a FIFO"});
  expect_one_line(run_process(kApp, tiny_run({"--model", kTiny, "--disable-fp4", "--load", ck}), kDeadline),
                  "pretrain_llama", {master.string(), "is a FIFO"});
}

TEST(FileSafety, ConvertCheckpointRefusesAnOutputOntoInsideOrAroundTheCheckpoint) {
  TempDir dir;
  const std::string ck = (dir.path() / "ck").string();
  const ProcessResult train = run_process(kApp, tiny_run({"--model", kTiny, "--disable-fp4", "--save", ck}), 300.0);
  ASSERT_EQ(train.exit_code, 0) << train.err;
  const std::string iter = ck + "/iter_0000001";
  ASSERT_TRUE(fs::is_directory(iter));
  const auto before = contents(ck);
  ASSERT_GE(before.size(), 3u);
  const std::string link = (dir.path() / "link").string();
  fs::create_directory_symlink(ck, link);
  struct Case {
    std::string load, to_hf, how;
  };
  for (const Case& c : {Case{ck, ck, "is the same as"}, Case{ck, ck + "/", "is the same as"},
                        Case{ck, link, "is the same as"}, Case{ck, iter + "/hf", "lies inside"},
                        Case{ck, ck + "/sub/../hf", "lies inside"}, Case{iter, ck, "contains"},
                        Case{iter, link, "contains"}, Case{iter, dir.path().string(), "contains"}}) {
    SCOPED_TRACE(c.load + " -> " + c.to_hf);
    expect_one_line(run_process(kConvert, {"--load", c.load, "--to-hf", c.to_hf, "--overwrite"}, kDeadline),
                    "convert_checkpoint", {"--to-hf " + c.to_hf, c.how, "--load " + c.load, "must not overlap"});
    EXPECT_EQ(contents(ck), before) << "the checkpoint changed";
  }
  // Beside it: allowed, and the checkpoint still intact.
  const ProcessResult ok = run_process(kConvert, {"--load", ck, "--to-hf", (dir.path() / "hf").string()}, 300.0);
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_EQ(contents(ck), before);
}

TEST(FileSafety, QuantizeTensorRefusesAnOutputOverItsInput) {
  TempDir dir;
  std::vector<float> x(32 * 32);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 17) - 8.0f;
  const std::string in = (dir.path() / "w.dequant.npy").string();
  pl::write_npy(in, "<f4", {32, 32}, x.data(), x.size() * sizeof(float));
  const auto before = contents(in);
  const std::string prefix = (dir.path() / "w").string();
  expect_one_line(run_process(kQuantize, {in, "--format", "nvfp4", "--out", prefix}, kDeadline), "quantize_tensor",
                  {"--out " + in, "is the same as", "INPUT " + in});
  EXPECT_EQ(contents(in), before);
  // Another name of the same file (a hard link) is the same file.
  fs::create_hard_link(in, dir.path() / "v.codes.npy");
  expect_one_line(run_process(kQuantize, {in, "--format", "fp8_e4m3", "--out", (dir.path() / "v").string()}, kDeadline),
                  "quantize_tensor", {"is the same as", "INPUT " + in});
  EXPECT_EQ(contents(in), before);
  EXPECT_FALSE(fs::exists(dir.path() / "v.dequant.npy"));
}

TEST(FileSafety, PreprocessDataRefusesAnOutputOverAnInput) {
  TempDir dir;
  const std::string prefix = (dir.path() / "p").string();
  // An input named like an output: "p_text_document.idx" (read as plain text).
  const std::string in = dir.write("p_text_document.idx", "some text\n\nmore text\n");
  const ProcessResult r = run_process(
      kPreprocess, {"--input", in, "--output-prefix", prefix, "--tokenizer-type", "byte"}, kDeadline);
  expect_one_line(r, "preprocess_data", {"--output-prefix " + in, "is the same as", "--input " + in});
  EXPECT_EQ(pl::test::read_text_file(in), "some text\n\nmore text\n");
  EXPECT_FALSE(fs::exists(prefix + "_text_document.bin"));
}

TEST(FileSafety, PretrainSaveMayBeLoadButNotHoldTheData) {
  TempDir dir;
  const std::string prefix = write_dataset(dir.path() / "data" / "corpus");
  const auto before = contents(dir.path() / "data");
  const std::string bytes_model = std::string(PL_CONFIG_DIR) + "/models/llama_tiny_bytes.json";
  const std::string save = (dir.path() / "data").string();
  expect_one_line(run_process(kApp, tiny_run({"--model", bytes_model, "--data-path", prefix, "--save", save}), kDeadline),
                  "pretrain_llama", {"--save " + save, "contains", "--data-path " + prefix + ".bin"});
  EXPECT_EQ(contents(dir.path() / "data"), before);
  // --save and --load one directory: Megatron's resume, allowed (an empty one starts from scratch).
  const std::string ck = (dir.path() / "ck").string();
  const ProcessResult ok =
      run_process(kApp, tiny_run({"--model", bytes_model, "--data-path", prefix, "--save", ck, "--load", ck}), 300.0);
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
}

}  // namespace
