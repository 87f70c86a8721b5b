// preprocess_data end to end: JSON lines and plain text into Megatron .bin/.idx, read back with
// IndexedDataset and compared with Tokenizer::encode; determinism across --workers; one-line errors
// that leave no output behind; the tokenizer sidecar.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "data/indexed_dataset.h"
#include "data/test_tokenizer.h"
#include "data/tokenizer.h"
#include "data/tokenizer_record.h"
#include "io/atomic_file.h"
#include "test_util.h"
#include "cli/programs.h"

namespace {

using pl::test::run_process;
using pl::test::dead_pid;
using pl::test::FileSizeLimit;
using pl::test::ScopedEnv;
using Ids = std::vector<int32_t>;

// The same program with FileSet's test hook installed from the environment (tests/tools/publish_test_hooks.cpp).
const std::string kAppWithTestHooks = PL_PREPROCESS_DATA_TEST_HOOKS_PATH;

Ids sequence(const pl::data::IndexedDataset& ds, int64_t i) {
  Ids out(static_cast<size_t>(ds.sequence_lengths()[static_cast<size_t>(i)]));
  ds.get(i, 0, static_cast<int64_t>(out.size()), out.data());
  return out;
}

Ids with_eod(Ids ids, int32_t eod) {
  ids.push_back(eod);
  return ids;
}

size_t count_files(const std::filesystem::path& dir) {
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) n += e.is_regular_file() ? 1 : 0;
  return n;
}

void preprocess_data_expect_one_line_failure(const pl::test::ProcessResult& r, const std::vector<std::string>& needles) {
  EXPECT_EQ(r.exit_code, 1) << r.err;
  const auto lines = pl::test::split_lines(r.err);
  ASSERT_EQ(lines.size(), 1u) << r.err;
  EXPECT_EQ(lines[0].rfind("preprocess_data: error: ", 0), 0u) << lines[0];
  for (const std::string& n : needles) EXPECT_NE(lines[0].find(n), std::string::npos) << n << " not in " << lines[0];
}

TEST(PreprocessData, JsonLinesWithTheByteTokenizer) {
  pl::test::TempDir dir;
  const std::vector<std::string> texts = {"Hello world", "", "a<|end_of_text|>b", "  \n"};
  const std::string in = dir.write("in.jsonl", "{\"text\": \"Hello world\", \"id\": 1}\n"
                                               "{\"text\": \"\"}\n"
                                               "\n"
                                               "{\"text\": \"a<|end_of_text|>b\"}\n"
                                               "{\"text\": \"  \\n\"}\n");
  const std::string prefix = (dir.path() / "out").string();
  const auto r = run_process(kPreprocess, {"--input", in, "--output-prefix", prefix, "--tokenizer-type", "byte",
                                           "--append-eod", "--log-interval", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Megatron's progress line every 2 documents (the blank line is no document).
  const auto progress = pl::test::split_lines(r.err);
  ASSERT_EQ(progress.size(), 2u) << r.err;
  EXPECT_EQ(progress[0].rfind("Processed 2 documents (", 0), 0u) << progress[0];
  EXPECT_NE(progress[1].find("MB/s)."), std::string::npos) << progress[1];
  EXPECT_NE(r.out.find("4 documents (1 empty), 20 tokens, dtype uint16"), std::string::npos) << r.out;

  const auto tok = pl::data::make_tokenizer("byte", "");
  const pl::data::IndexedDataset ds(prefix + "_text_document");
  EXPECT_EQ(ds.dtype(), pl::data::IndexedDType::uint16);
  // The empty document adds no sequence, only a document boundary (preprocess_data.py).
  ASSERT_EQ(ds.sequence_lengths().size(), 3u);
  EXPECT_EQ(ds.document_indices(), (std::vector<int64_t>{0, 1, 1, 2, 3}));
  EXPECT_EQ(sequence(ds, 0), with_eod(tok->encode("Hello world"), 257));
  EXPECT_EQ(sequence(ds, 1), (Ids{'a', 257, 'b', 257}));
  EXPECT_EQ(sequence(ds, 2), (Ids{' ', ' ', '\n', 257}));

  const auto rec = pl::data::read_tokenizer_record(prefix + "_text_document");
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->type, "byte");
  EXPECT_EQ(rec->model_path, "");
  EXPECT_EQ(rec->vocab_size, 258);
  EXPECT_EQ(rec->eod, 257);
  EXPECT_EQ(rec->bos, 256);
  EXPECT_TRUE(rec->append_eod);
  EXPECT_FALSE(rec->prepend_bos);
  EXPECT_FALSE(pl::data::read_tokenizer_record(prefix + "_nothing_document").has_value());
}

TEST(PreprocessData, PlainTextParagraphsLinesAndFiles) {
  pl::test::TempDir dir;
  const std::string in = dir.write("in.txt", "para one\nline two\n\n\n   \npara two\n");
  const std::string prefix = (dir.path() / "p").string();
  auto run_mode = [&](const std::string& mode, const std::string& out) {
    const auto r = run_process(kPreprocess, {"--input", in, "--output-prefix", out, "--tokenizer-type", "byte",
                                             "--text-document", mode, "--prepend-bos"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return std::make_unique<pl::data::IndexedDataset>(out + "_text_document");
  };
  const auto tok = pl::data::make_tokenizer("byte", "");
  auto bos = [&](const std::string& text) {
    Ids ids{256};
    const Ids body = tok->encode(text);
    ids.insert(ids.end(), body.begin(), body.end());
    return ids;
  };
  const auto para = run_mode("paragraph", prefix + "_para");
  ASSERT_EQ(para->sequence_lengths().size(), 2u);
  EXPECT_EQ(sequence(*para, 0), bos("para one\nline two"));
  EXPECT_EQ(sequence(*para, 1), bos("para two"));
  const auto line = run_mode("line", prefix + "_line");
  ASSERT_EQ(line->sequence_lengths().size(), 3u);
  EXPECT_EQ(sequence(*line, 1), bos("line two"));
  const auto file = run_mode("file", prefix + "_file");
  ASSERT_EQ(file->sequence_lengths().size(), 1u);
  EXPECT_EQ(sequence(*file, 0), bos("para one\nline two\n\n\n   \npara two\n"));
}

TEST(PreprocessData, TiktokenOutputIsTheSameForAnyNumberOfWorkers) {
  pl::test::TempDir dir;
  const std::string model = dir.write("tiny.model", pl::test::tiny_rank_file());
  std::string jsonl;
  const std::vector<std::string> words = {"abc", "hello", "xyz", "  ", "12345", "he's", "<|eot_id|>", "ab\\n\\n", "é"};
  for (int d = 0; d < 300; ++d) {
    std::string text;
    for (int w = 0; w < d % 17; ++w) text += words[static_cast<size_t>(d * 7 + w * 3) % words.size()] + " ";
    jsonl += "{\"text\": \"" + text + "\"}\n";
  }
  const std::string in = dir.write("in.jsonl", jsonl);
  auto run_workers = [&](const std::string& n) {
    const std::string prefix = (dir.path() / ("w" + n)).string();
    const auto r = run_process(kPreprocess, {"--input", in, "--output-prefix", prefix, "--tokenizer-type", "tiktoken",
                                             "--tokenizer-model", model, "--append-eod", "--workers", n});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return prefix + "_text_document";
  };
  const std::string one = run_workers("1"), three = run_workers("3");
  EXPECT_EQ(pl::test::read_text_file(one + ".bin"), pl::test::read_text_file(three + ".bin"));
  EXPECT_EQ(pl::test::read_text_file(one + ".idx"), pl::test::read_text_file(three + ".idx"));

  const auto tok = pl::data::make_tokenizer("tiktoken", model);
  const pl::data::IndexedDataset ds(three);
  EXPECT_EQ(ds.dtype(), pl::data::IndexedDType::uint16);  // 520 ids < 65500
  ASSERT_EQ(ds.sequence_lengths().size(), 300u - 300u / 17 - 1);  // d % 17 == 0 gives empty text
  // Document 3: words 21%9=3, 24%9=6, 27%9=0 -> "  " + " " <|eot_id|> " " "abc" " "
  EXPECT_EQ(sequence(ds, 2), with_eod(tok->encode("   <|eot_id|> abc "), tok->eod()));

  const auto rec = pl::data::read_tokenizer_record(three);
  ASSERT_TRUE(rec.has_value());
  int64_t size = 0;
  EXPECT_EQ(rec->type, "tiktoken");
  EXPECT_EQ(rec->model_path, std::filesystem::absolute(model).lexically_normal().string());
  EXPECT_EQ(rec->model_fnv1a64, pl::data::fnv1a64_file_hex(model, &size));
  EXPECT_EQ(rec->model_size, static_cast<int64_t>(std::filesystem::file_size(model)));
  EXPECT_EQ(rec->vocab_size, pl::test::kTinyVocab);
  EXPECT_EQ(rec->eod, pl::test::kTinyBase + 1);
  EXPECT_EQ(rec->bos, pl::test::kTinyBase);
}

TEST(PreprocessData, BadDocumentsAreOneLineErrorsAndLeaveNoOutput) {
  pl::test::TempDir dir;
  const std::filesystem::path out_dir = dir.path() / "out";
  std::filesystem::create_directory(out_dir);
  const std::string prefix = (out_dir / "o").string();
  auto run_on = [&](const std::string& name, const std::string& content, std::vector<std::string> extra = {}) {
    const std::string in = dir.write(name, content);
    std::vector<std::string> args = {"--input", in, "--output-prefix", prefix, "--tokenizer-type", "byte",
                                     "--workers", "2"};
    args.insert(args.end(), extra.begin(), extra.end());
    return std::make_pair(in, run_process(kPreprocess, args));
  };
  {
    const auto [in, r] = run_on("bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"oops}\n{\"text\": \"ok\"}\n");
    preprocess_data_expect_one_line_failure(r, {in + ":2:", "not valid JSON"});
  }
  {
    const auto [in, r] = run_on("key.jsonl", "{\"text\": \"ok\"}\n\n{\"content\": \"x\"}\n");
    preprocess_data_expect_one_line_failure(r, {in + ":3:", "key 'text' is missing"});
  }
  {
    const auto [in, r] = run_on("num.json", "{\"text\": 5}\n");
    preprocess_data_expect_one_line_failure(r, {in + ":1:", "key 'text' is a number"});
  }
  {
    const auto [in, r] = run_on("bad.txt", "fine\n\nnot \xFF fine\n");
    preprocess_data_expect_one_line_failure(r, {in + ":3:", "invalid UTF-8"});
  }
  {
    const auto [in, r] = run_on("other.jsonl", "{\"body\": \"x\"}\n", {"--json-keys", "body", "title"});
    preprocess_data_expect_one_line_failure(r, {in + ":1:", "key 'title' is missing"});
  }
  EXPECT_EQ(count_files(out_dir), 0u);

  const auto usage = run_process(kPreprocess, {"--input", "x.jsonl", "--tokenizer-type", "byte"});
  EXPECT_EQ(usage.exit_code, 2);
  EXPECT_EQ(pl::test::split_lines(usage.err).size(), 1u) << usage.err;
  const auto no_dir = run_process(kPreprocess, {"--input", dir.write("a.txt", "a\n"), "--output-prefix",
                                                (dir.path() / "missing" / "o").string(), "--tokenizer-type", "byte"});
  preprocess_data_expect_one_line_failure(no_dir, {"does not exist"});
  const auto no_model = run_process(kPreprocess, {"--input", dir.write("b.txt", "b\n"), "--output-prefix", prefix,
                                                  "--tokenizer-type", "tiktoken"});
  preprocess_data_expect_one_line_failure(no_model, {"--tokenizer-model"});
  EXPECT_EQ(count_files(out_dir), 0u);
}

TEST(PreprocessData, SeveralJsonKeysAndSeveralInputs) {
  pl::test::TempDir dir;
  const std::string a = dir.write("a.jsonl", "{\"title\": \"T1\", \"body\": \"B1\"}\n");
  const std::string b = dir.write("b.jsonl", "{\"title\": \"T2\", \"body\": \"\"}\n");
  const std::string prefix = (dir.path() / "k").string();
  const auto r = run_process(kPreprocess, {"--input", a, b, "--output-prefix", prefix, "--tokenizer-type", "byte",
                                           "--json-keys", "title", "body", "--append-eod"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(pl::test::split_lines(r.out).size(), 2u) << r.out;
  const pl::data::IndexedDataset titles(prefix + "_title_document");
  const pl::data::IndexedDataset bodies(prefix + "_body_document");
  ASSERT_EQ(titles.sequence_lengths().size(), 2u);
  EXPECT_EQ(sequence(titles, 1), (Ids{'T', '2', 257}));
  ASSERT_EQ(bodies.sequence_lengths().size(), 1u);
  EXPECT_EQ(bodies.document_indices(), (std::vector<int64_t>{0, 1, 1}));
  EXPECT_TRUE(pl::data::read_tokenizer_record(prefix + "_body_document").has_value());
}

// ---------------------------------------------------------------------------------------------
// Outputs published as a set (io/atomic_file.h FileSet): nothing a failed or killed run does loses
// the previous dataset or leaves a mix.

// Every entry of `dir` and its contents ("<dir>" for a directory).
std::map<std::string, std::string> snapshot(const std::filesystem::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    out[e.path().filename().string()] = e.is_directory() ? "<dir>" : pl::test::read_text_file(e.path().string());
  return out;
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

TEST(PreprocessData, AFailedRunLeavesThePreviousOutputsByteIdentical) {
  pl::test::TempDir dir;
  const std::filesystem::path out_dir = dir.path() / "out";
  std::filesystem::create_directory(out_dir);
  const std::string prefix = (out_dir / "o").string();
  auto run_on = [&](const std::string& in, const std::string& app = kPreprocess) {
    return run_process(app, {"--input", in, "--output-prefix", prefix, "--tokenizer-type", "byte", "--append-eod",
                             "--log-interval", "1000000"});
  };
  ASSERT_EQ(run_on(dir.write("first.txt", "the first dataset\n\nits second document\n")).exit_code, 0);
  const auto before = snapshot(out_dir);
  ASSERT_EQ(before.size(), 3u);
  {
    const auto r = run_on(dir.write("bad.txt", "fine\n\nnot \xFF fine\n"));
    preprocess_data_expect_one_line_failure(r, {"invalid UTF-8"});
    EXPECT_EQ(snapshot(out_dir), before);
  }
  {
    // A full disk while writing the new .bin (600 KB of tokens, files limited to 64 KB).
    std::string big;
    for (int i = 0; i < 3000; ++i) big += "a paragraph of about one hundred bytes, repeated to make a large input file.\n\n";
    const std::string in = dir.write("big.txt", big);
    pl::test::ProcessResult r;
    {
      FileSizeLimit full(64 << 10);
      r = run_on(in);
    }
    preprocess_data_expect_one_line_failure(r, {prefix + "_text_document.bin.tmp-", "File too large"});
    EXPECT_EQ(snapshot(out_dir), before);
  }
  for (const char* point : {"0", "2", "3"}) {
    // A failure part way through the renames is rolled back in-process.
    SCOPED_TRACE(point);
    pl::test::ProcessResult r;
    {
      ScopedEnv fail("PL_TEST_PUBLISH_FAIL_AT", point);
      r = run_on(dir.write("second.txt", "a second dataset\n"), kAppWithTestHooks);
    }
    preprocess_data_expect_one_line_failure(r, {"forced failure", "rolled back"});
    EXPECT_EQ(snapshot(out_dir), before);
  }
  // The production program reads no test hook from the environment: it publishes normally.
  ScopedEnv fail("PL_TEST_PUBLISH_FAIL_AT", "0"), kill("PL_TEST_PUBLISH_KILL_AT", "0");
  const auto r = run_on(dir.write("third.txt", "a third dataset\n"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(sequence(pl::data::IndexedDataset(prefix + "_text_document"), 0),
            with_eod(Ids{'a', ' ', 't', 'h', 'i', 'r', 'd', ' ', 'd', 'a', 't', 'a', 's', 'e', 't'}, 257));
}

TEST(PreprocessData, StaleTemporariesOfDeadRunsDoNotBreakARun) {
  pl::test::TempDir dir;
  const std::filesystem::path out_dir = dir.path() / "out";
  std::filesystem::create_directory(out_dir);
  const std::string prefix = (out_dir / "o").string();
  const std::string dead = std::to_string(dead_pid()), live = std::to_string(::getppid());
  const std::string p = prefix + "_text_document";
  std::filesystem::create_directories(p + ".bin.tmp-" + dead + "/x");  // a directory in the way
  write_file(p + ".idx.tmp-" + dead, "half an index");
  std::filesystem::create_directory(p + ".bin.tmp");  // an older version's temporary name: left alone
  write_file(p + ".bin.tmp-" + live, "another live process's");
  const auto r = run_process(kPreprocess, {"--input", dir.write("in.txt", "hello\n"), "--output-prefix", prefix,
                                           "--tokenizer-type", "byte"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(std::filesystem::exists(p + ".bin.tmp-" + dead));
  EXPECT_FALSE(std::filesystem::exists(p + ".idx.tmp-" + dead));
  EXPECT_TRUE(std::filesystem::is_directory(p + ".bin.tmp"));
  EXPECT_EQ(pl::test::read_text_file(p + ".bin.tmp-" + live), "another live process's");
  const pl::data::IndexedDataset ds(p);
  EXPECT_EQ(sequence(ds, 0), (Ids{'h', 'e', 'l', 'l', 'o'}));
}

TEST(PreprocessData, AKillBetweenTheRenamesIsRefusedByTheReaderAndRecoveredByTheNextRun) {
  pl::test::TempDir dir;
  const std::filesystem::path out_dir = dir.path() / "out";
  std::filesystem::create_directory(out_dir);
  const std::string prefix = (out_dir / "o").string();
  auto run_on = [&](const std::string& name, const std::string& title, const std::string& body,
                    const std::string& app = kPreprocess) {
    const std::string in = dir.write(name, "{\"title\": \"" + title + "\", \"body\": \"" + body + "\"}\n");
    return run_process(app, {"--input", in, "--output-prefix", prefix, "--tokenizer-type", "byte", "--json-keys",
                             "title", "body"});
  };
  ASSERT_EQ(run_on("a.jsonl", "old", "old body").exit_code, 0);
  const std::string title = prefix + "_title_document", body = prefix + "_body_document";
  {
    // Killed after the title's .bin, .idx and sidecar are renamed, before the body's.
    ScopedEnv kill("PL_TEST_PUBLISH_KILL_AT", "3");
    EXPECT_EQ(run_on("b.jsonl", "newer", "newer body", kAppWithTestHooks).exit_code, 128 + SIGKILL);
  }
  // One journal under both datasets' names: each reader refuses, naming it.
  for (const std::string& p : {title, body}) {
    const std::string journal = pl::data::indexed_dataset_journal_path(p);
    ASSERT_TRUE(std::filesystem::exists(journal));
    pl::test::expect_one_line_error([&] { pl::data::IndexedDataset ds(p); },
                                    {p + ".bin/.idx", "mid-replacement", "died", journal});
  }
  const auto r = run_on("c.jsonl", "third", "third body");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto err = pl::test::split_lines(r.err);
  ASSERT_EQ(err.size(), 1u) << r.err;
  EXPECT_EQ(err[0].rfind("preprocess_data: " + pl::data::indexed_dataset_journal_path(title) +
                             ": completed the interrupted publish of process ", 0),
            0u)
      << err[0];
  EXPECT_NE(err[0].find("rolled forward"), std::string::npos) << err[0];
  EXPECT_EQ(snapshot(out_dir).size(), 6u);  // the two triples, no journal, backup or temporary
  const pl::data::IndexedDataset t(title), b(body);
  EXPECT_EQ(sequence(t, 0), (Ids{'t', 'h', 'i', 'r', 'd'}));
  EXPECT_EQ(b.sequence_lengths()[0], 10);
  const auto rec = pl::data::read_tokenizer_record(body);
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->data_bin_bytes, 20);
  EXPECT_EQ(rec->data_idx_checksum64.size(), 16u);
}

}  // namespace
