// Hostile JSON (issue 14, classes 1 and 2): a 100,000-deep value and a number beyond double's range are
// one-line errors naming the file (no stack overflow, no "internal error"), in every reader that takes
// JSON from a user's file: configs (and through them pretrain_llama), safetensors headers, JSON-lines
// documents (with FILE:LINE); and an error message never serializes a whole value.
#include <gtest/gtest.h>

#include <string>

#include "config/json_reader.h"
#include "io/json_text.h"
#include "test_util.h"

namespace pl {
namespace {

std::string deep_array(int depth) { return std::string(static_cast<size_t>(depth), '[') + std::string(static_cast<size_t>(depth), ']'); }

TEST(JsonText, DeepNestingIsRefusedWhileParsing) {
  test::expect_one_line_error([] { parse_json_text(deep_array(100000), "x.json"); },
                              {"x.json", "nested deeper than 64 levels"});
  EXPECT_NO_THROW(parse_json_text(deep_array(kMaxJsonDepth), "ok.json"));
  test::expect_one_line_error([] { parse_json_text(deep_array(kMaxJsonDepth + 1), "y.json"); }, {"y.json", "nested"});
}

TEST(JsonText, NumbersBeyondDoubleAreOneLineErrorsNotInternalErrors) {
  test::expect_one_line_error([] { parse_json_text(R"({"init_method_std": 1e400})", "m.json"); },
                              {"m.json", "not valid JSON", "1e400"});
  // A megabyte of digits is not echoed whole.
  try {
    parse_json_text("[1" + std::string(1 << 20, '0') + "e400]", "big.json");
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_LT(std::string(e.what()).size(), 400u);
  }
}

TEST(JsonText, DescriptionsAreBoundedAndNeverRecurse) {
  nlohmann::json deep = nlohmann::json::array();
  for (int i = 0; i < 5000; ++i) deep = nlohmann::json::array({deep});  // deeper than dump() could bear in a thread
  EXPECT_EQ(describe_json(deep), "an array of 1 elements");
  EXPECT_EQ(describe_json(nlohmann::json::array({1, -2})), "[1,-2]");
  EXPECT_EQ(describe_json(nlohmann::json::object({{"a", 1}})), "an object of 1 keys");
  EXPECT_LE(describe_json(nlohmann::json(std::string(100000, 'x'))).size(), 70u);
}

TEST(JsonText, ConfigFilesGoThroughTheBoundedParser) {
  test::TempDir dir;
  test::expect_one_line_error([&] { read_json_file(dir.write("deep.json", deep_array(100000))); },
                              {"deep.json", "nested deeper than"});
  test::expect_one_line_error([&] { read_json_file(dir.write("big.json", R"({"seq_length": 1e400})")); },
                              {"big.json", "not valid JSON"});
  // A field of the wrong type is described, not dumped.
  const std::string path = dir.write("shape.json", R"({"a": )" + deep_array(60) + "}");
  const nlohmann::json j = read_json_file(path);
  JsonReader r(j, path);
  test::expect_one_line_error([&] { r.integer("a"); }, {"field 'a'", "must be an integer, got an array of 1 elements"});
}

TEST(JsonText, PretrainLlamaReportsAHostileModelConfigInOneLine) {
  test::TempDir dir;
  for (const std::string& text : {deep_array(100000), std::string(R"({"name": "x", "num_layers": 1e400})")}) {
    const std::string path = dir.write("m.json", text);
    const test::ProcessResult r = test::run_process(PL_APP_PATH, {"--model", path, "--device", "cpu", "--dry-run"});
    EXPECT_EQ(r.exit_code, 1) << r.err;
    const auto lines = test::split_lines(r.err);
    ASSERT_EQ(lines.size(), 1u) << r.err;
    EXPECT_EQ(lines[0].rfind("pretrain_llama: error: ", 0), 0u) << lines[0];
    EXPECT_NE(lines[0].find("m.json"), std::string::npos) << lines[0];
  }
}

TEST(JsonText, PreprocessDataKeepsFileAndLineForANumberBeyondDouble) {
  test::TempDir dir;
  const std::string in = dir.write("in.jsonl", "{\"text\": \"fine\"}\n{\"text\": 1e400}\n");
  const test::ProcessResult r = test::run_process(
      PL_PREPROCESS_DATA_PATH, {"--input", in, "--output-prefix", (dir.path() / "out").string(), "--tokenizer-type", "byte"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("in.jsonl:2: not valid JSON"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace pl
