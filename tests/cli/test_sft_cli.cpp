// Supervised fine-tuning end to end (issue 28), through the programs: preprocess_data --dataset-type sft (both
// shapes, truncation and dropping counted, malformed lines refused with FILE:LINE and nothing half-written), a
// tiny model exported by our own Hugging Face writer fine-tuned on it with --finetune --init-from-hf (the banner's
// SFT line; the answer-only validation loss falls), exported again and reloaded by generate; --finetune from a
// checkpoint; the 8B benchmark command's dry run; the one-line refusals.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "data/utf8_stream.h"
#include "test_util.h"
#include "cli/programs.h"

namespace {

namespace fs = std::filesystem;
using pl::test::ProcessResult;
using pl::test::run_process;

const std::string kBytes = std::string(PL_CONFIG_DIR) + "/models/llama_tiny_bytes.json";

// n instruction examples: arithmetic questions as chats and as input/output pairs, in a shuffled order.
std::string write_jsonl(const fs::path& path, int n) {
  std::ofstream f(path);
  for (int i = 0; i < n; ++i) {
    const int a = (i * 7) % 10, b = (i * 3 + 1) % 10;
    if (i % 2 == 0)
      f << fmt::format(R"({{"messages": [{{"role": "user", "content": "What is {} plus {}?"}}, )"
                       R"({{"role": "assistant", "content": "{} plus {} is {}."}}]}})",
                       a, b, a, b, a + b)
        << "\n";
    else
      f << fmt::format(R"({{"input": "Question: what is {} times {}? Answer:", "output": "{}"}})", a, b, a * b) << "\n";
  }
  return path.string();
}

ProcessResult preprocess(const std::string& in, const std::string& prefix, std::vector<std::string> extra = {}) {
  std::vector<std::string> a = {"--dataset-type", "sft", "--input", in, "--output-prefix", prefix, "--tokenizer-type",
                                "byte"};
  a.insert(a.end(), extra.begin(), extra.end());
  return run_process(kPreprocess, a, 120.0);
}

std::vector<std::string> sft_train_args(std::vector<std::string> extra) {
  std::vector<std::string> a = {"--model", kBytes, "--device", "cpu", "--disable-fp4", "--global-batch-size", "4",
                                "--micro-batch-size", "2", "--seq-length", "128", "--lr", "2e-3", "--min-lr", "2e-4",
                                "--warmup-iters", "0"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

std::vector<double> validation_losses(const std::string& out) {
  const std::regex v(R"( validation loss at iteration \d+ \| lm loss value: (\S+) )");
  std::vector<double> l;
  for (std::sregex_iterator it(out.begin(), out.end(), v), end; it != end; ++it) l.push_back(std::stod((*it)[1]));
  return l;
}

TEST(SftCli, PreprocessWritesTheSetAndCountsWhatItCut) {
  pl::test::TempDir dir;
  const std::string in = write_jsonl(dir.path() / "sft.jsonl", 20), prefix = (dir.path() / "sft").string();
  const ProcessResult r = preprocess(in, prefix);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("preprocess_data: sft: 20 examples (10 chats, 10 input/output)"), std::string::npos) << r.out;
  for (const char* ext : {".bin", ".idx", ".loss_mask", ".sft.json", ".tokenizer.json"})
    EXPECT_TRUE(fs::exists(prefix + ext)) << ext;
  // Every chat is 57 or 58 tokens long (42 of them the prompt), every input/output example at most 40: at 50 the
  // chats are cut (truncate) or left out (drop), and counted; at 40 a cut chat keeps no answer token and is dropped.
  const ProcessResult cut = preprocess(in, prefix + "_cut", {"--max-seq-length", "50"});
  ASSERT_EQ(cut.exit_code, 0) << cut.err;
  EXPECT_NE(cut.out.find("10 truncated, 0 dropped (--max-seq-length 50, --overlong truncate)"), std::string::npos)
      << cut.out;
  const ProcessResult none_left = preprocess(in, prefix + "_40", {"--max-seq-length", "40"});
  ASSERT_EQ(none_left.exit_code, 0) << none_left.err;
  EXPECT_NE(none_left.out.find("0 truncated, 10 dropped (--max-seq-length 40, --overlong truncate)"), std::string::npos)
      << none_left.out;
  const ProcessResult drop = preprocess(in, prefix + "_drop", {"--max-seq-length", "50", "--overlong", "drop"});
  ASSERT_EQ(drop.exit_code, 0) << drop.err;
  EXPECT_NE(drop.out.find("sft: 10 examples (0 chats, 10 input/output)"), std::string::npos) << drop.out;
  EXPECT_NE(drop.out.find("0 truncated, 10 dropped"), std::string::npos) << drop.out;
}

TEST(SftCli, AMalformedLineIsOneLineWithFileAndLineAndNothingIsReplaced) {
  pl::test::TempDir dir;
  const std::string in = write_jsonl(dir.path() / "sft.jsonl", 6), prefix = (dir.path() / "sft").string();
  ASSERT_EQ(preprocess(in, prefix).exit_code, 0);
  const std::string before = pl::test::read_text_file(prefix + ".loss_mask");
  const auto bad = [&](const std::string& line, const std::vector<std::string>& needles) {
    const fs::path p = dir.path() / "bad.jsonl";
    std::ofstream(p) << R"({"input": "q", "output": "a"})" << "\n" << line << "\n";
    const ProcessResult r = preprocess(p.string(), prefix);
    EXPECT_EQ(r.exit_code, 1) << r.out;
    const auto lines = pl::test::split_lines(r.err);
    ASSERT_EQ(lines.size(), 1u) << r.err;
    EXPECT_NE(lines[0].find(p.string() + ":2: "), std::string::npos) << lines[0];
    for (const std::string& n : needles) EXPECT_NE(lines[0].find(n), std::string::npos) << lines[0];
  };
  bad(R"({"input": "q"})", {"'output'", "missing"});
  bad(R"({"input": "q", "output": "   "})", {"empty answer"});
  bad(R"({"messages": [{"role": "assistant", "content": "a"}]})", {"message 1", "'user' was expected"});
  bad(R"({"messages": [{"role": "user", "content": "q"}, {"role": "user", "content": "q"}]})", {"message 2"});
  bad(R"({"input": "q", "output": "a")", {"JSON"});
  EXPECT_EQ(pl::test::read_text_file(prefix + ".loss_mask"), before);  // the earlier set is intact
  const ProcessResult flags = run_process(
      kPreprocess, {"--dataset-type", "sft", "--input", in, "--output-prefix", prefix, "--tokenizer-type", "byte",
                    "--append-eod"}, 60.0);
  EXPECT_EQ(flags.exit_code, 1);
  EXPECT_NE(flags.err.find("--append-eod does not apply to --dataset-type sft"), std::string::npos) << flags.err;
}

// Our own HF export of a briefly pretrained tiny model, fine-tuned on the instruction set from its weights: the
// banner's SFT line, the answer-only validation loss falls, the result exports and generate reloads it.
TEST(SftCli, FineTuneFromHuggingFaceWeightsExportAndGenerate) {
  pl::test::TempDir dir;
  const fs::path d = dir.path();
  // 1. The starting point: 3 iterations on mock data, saved, exported to HF.
  ProcessResult r = run_process(kApp, sft_train_args({"--train-iters", "3", "--save", (d / "base").string()}), 180.0);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = run_process(kConvert, {"--load", (d / "base").string(), "--to-hf", (d / "hf_base").string()}, 120.0);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // 2. The instruction set.
  const std::string prefix = (d / "sft").string();
  ASSERT_EQ(preprocess(write_jsonl(d / "sft.jsonl", 80), prefix).exit_code, 0);
  // 3. Fine-tuning: validation every 10 iterations on the held-out tenth.
  r = run_process(kApp,
                  sft_train_args({"--finetune", "--init-from-hf", (d / "hf_base").string(), "--data-path", prefix,
                                  "--split", "90,10,0", "--train-iters", "30", "--eval-interval", "10", "--eval-iters",
                                  "2", "--save", (d / "sft_ckpt").string()}),
                  300.0);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(SFT dataset: 80 examples, packed into \d+ sequences of 128 )"
                                                  R"(tokens, answer tokens \d+\.\d%)")))
      << r.out;
  EXPECT_NE(r.out.find("loss normalized per micro-batch by its answer tokens"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("initialized from Hugging Face checkpoint"), std::string::npos) << r.out;
  const std::vector<double> val = validation_losses(r.out);
  ASSERT_GE(val.size(), 3u) << r.out;
  EXPECT_LT(val.back(), 0.9 * val.front()) << r.out;
  // 4. Exported (the data's tokenizer record goes along), reloaded by generate, from the export and the checkpoint.
  r = run_process(kConvert, {"--load", (d / "sft_ckpt").string(), "--to-hf", (d / "hf_sft").string()}, 120.0);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(d / "hf_sft" / "pretrain_llama_tokenizer.json"));
  for (const std::vector<std::string>& from :
       {std::vector<std::string>{"--init-from-hf", (d / "hf_sft").string()},
        std::vector<std::string>{"--load", (d / "sft_ckpt").string()}}) {
    std::vector<std::string> a = from;
    for (const char* x : {"--prompt", "What is 7 plus 1?", "--chat", "--max-new-tokens", "12"}) a.push_back(x);
    const ProcessResult g = run_process(kGenerate, a, 120.0);
    ASSERT_EQ(g.exit_code, 0) << g.err;
    EXPECT_NE(g.err.find("generate | model "), std::string::npos) << g.err;
    EXPECT_NE(g.err.find("(from "), std::string::npos) << g.err;  // the tokenizer was found, not given
    EXPECT_NE(g.err.find("chat template plain"), std::string::npos) << g.err;
    EXPECT_EQ(pl::test::split_lines(g.out).size(), 1u) << g.out;
  }
}

TEST(SftCli, FinetuneFromACheckpointStartsAtIterationOneWithAFreshOptimizer) {
  pl::test::TempDir dir;
  const fs::path d = dir.path();
  ProcessResult r = run_process(kApp, sft_train_args({"--train-iters", "3", "--save", (d / "base").string()}), 180.0);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string prefix = (d / "sft").string();
  ASSERT_EQ(preprocess(write_jsonl(d / "sft.jsonl", 30), prefix).exit_code, 0);
  r = run_process(kApp, sft_train_args({"--finetune", "--load", (d / "base").string(), "--data-path", prefix, "--split",
                                        "1,0,0", "--train-iters", "2"}),
                  180.0);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("--finetune: the weights of iteration 3 only; a fresh optimizer, iteration 0"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(pl::test::iteration_lines(r.out, 1).size(), 2u) << r.out;  // iterations 1 and 2
}

TEST(SftCli, TheBenchmarkCommandsDryRunPlansAndFits) {
  const ProcessResult r = run_process(kApp, {"--dry-run", "--finetune", "--model", "llama3_8b", "--seq-length",
                                             "16384", "--global-batch-size", "8", "--micro-batch-size", "1",
                                             "--reset-position-ids", "--reset-attention-mask"},
                                      120.0);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* gpu : {"H100", "H200", "B200"}) EXPECT_NE(r.out.find(gpu), std::string::npos) << gpu << "\n" << r.out;
  EXPECT_NE(r.out.find("total"), std::string::npos) << r.out;
}

TEST(SftCli, RefusalsAreOneLine) {
  pl::test::TempDir dir;
  const std::string prefix = (dir.path() / "sft").string();
  ASSERT_EQ(preprocess(write_jsonl(dir.path() / "sft.jsonl", 10), prefix).exit_code, 0);
  const auto refused = [&](const std::string& exe, const std::vector<std::string>& args, const std::string& needle) {
    const ProcessResult r = run_process(exe, args, 60.0);
    EXPECT_EQ(r.exit_code, 1) << r.out;
    const auto lines = pl::test::split_lines(r.err);
    ASSERT_EQ(lines.size(), 1u) << r.err;
    EXPECT_NE(lines[0].find(needle), std::string::npos) << lines[0];
  };
  refused(kApp, sft_train_args({"--finetune", "--train-iters", "1"}), "--finetune needs the weights to start from");
  refused(kApp, sft_train_args({"--data-path", "0.5", prefix, "0.5", prefix, "--train-iters", "1"}),
          "a run takes one SFT dataset alone");
  refused(kApp, sft_train_args({"--data-path", prefix, "--eod-mask-loss", "--train-iters", "1"}),
          "--eod-mask-loss does not apply to an SFT dataset");
  refused(kApp, sft_train_args({"--data-path", prefix, "--packing-algorithm", "best_fit", "--train-iters", "1"}),
          "--packing-algorithm best_fit");
  refused(kGenerate, {"--load", (dir.path() / "nothing").string(), "--prompt", "x"}, "nothing");
  // A prompt longer than the model's positions (llama_tiny_bytes: 8192).
  pl::test::TempDir ck;
  ASSERT_EQ(run_process(kApp, sft_train_args({"--train-iters", "1", "--save", ck.path().string()}), 120.0).exit_code, 0);
  refused(kGenerate, {"--load", ck.path().string(), "--tokenizer-type", "byte", "--prompt", std::string(9000, 'x')},
          "--prompt: 9000 tokens, but model llama_tiny_bytes has 8192 positions");
}

// generate on a byte-level model (one step of training: near-uniform logits, so sampled bytes rarely form
// UTF-8): stdout is complete UTF-8 (a partial character held back, U+FFFD for an invalid one), exactly the
// replacement of the raw bytes --raw-bytes writes; --max-new-tokens INT64_MAX runs to the model's last
// position with no overflow in the sum of prompt and request. (The model has 256 positions, not 8192: a prompt
// near 8192 tokens took 258 s under the sanitizers.)
TEST(SftCli, GenerateWritesCompleteUtf8AndRunsToTheLastPosition) {
  pl::test::TempDir ck;
  std::string config = pl::test::read_text_file(kBytes);
  const std::string positions = "\"max_position_embeddings\": 8192";
  config.replace(config.find(positions), positions.size(), "\"max_position_embeddings\": 256");
  const std::string model = ck.write("llama_tiny_bytes_256.json", config);
  std::vector<std::string> train = sft_train_args({"--train-iters", "1", "--save", (ck.path() / "ck").string()});
  train[1] = model;
  ASSERT_EQ(run_process(kApp, train, 120.0).exit_code, 0);
  const auto generate = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = {"--load", (ck.path() / "ck").string(), "--tokenizer-type", "byte", "--prompt",
                                  std::string(256 - 64, 'x'), "--max-new-tokens", "9223372036854775807",
                                  "--temperature", "1", "--seed", "5"};
    a.insert(a.end(), extra.begin(), extra.end());
    return run_process(kGenerate, a, 180.0);
  };
  const ProcessResult text = generate({}), raw = generate({"--raw-bytes"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  ASSERT_EQ(raw.exit_code, 0) << raw.err;
  EXPECT_NE(text.err.find("stopped at the model's last position"), std::string::npos) << text.err;
  EXPECT_EQ(pl::data::find_invalid_utf8(text.out), std::string::npos);
  ASSERT_NE(pl::data::find_invalid_utf8(raw.out), std::string::npos) << "the sampled bytes happen to be valid UTF-8";
  pl::data::Utf8Stream replaced;
  std::string want = replaced.push(raw.out);
  want += replaced.finish();
  EXPECT_EQ(text.out, want);
}

}  // namespace
