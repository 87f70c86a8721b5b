// The range rules every app's number flags share (apps/app_main.h, issue 38): no negative wrapped into an
// unsigned option, no value clamped to 64 bits, no octal surprise, no infinite or NaN float; each app refuses
// in one line naming the flag, before it reads any file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "app_main.h"
#include "test_util.h"

namespace {

using pl::test::ProcessResult;

TEST(NumberFlags, IntegersAreDecimalAndFit64BitsOrAreRefused) {
  const auto check = [](std::string v, bool is_unsigned) {
    const std::string why = pl::app::check_integer_text(v, is_unsigned);
    return why.empty() ? "= " + v : why;
  };
  EXPECT_EQ(check("010", false), "= 10");  // decimal, as Megatron's argparse reads it (CLI11 alone: octal 8)
  EXPECT_EQ(check("+7", true), "= 7");
  EXPECT_EQ(check("-000", false), "= 0");
  EXPECT_EQ(check("18446744073709551615", true), "= 18446744073709551615");
  EXPECT_EQ(check("9223372036854775807", false), "= 9223372036854775807");
  EXPECT_EQ(check("-9223372036854775808", false), "= -9223372036854775808");
  EXPECT_NE(check("-1", true).find("must be >= 0, got -1"), std::string::npos);
  EXPECT_NE(check("18446744073709551616", true).find("out of range"), std::string::npos);
  EXPECT_NE(check("99999999999999999999", true).find("out of range"), std::string::npos);
  EXPECT_NE(check("9223372036854775808", false).find("out of range"), std::string::npos);
  EXPECT_NE(check("-9223372036854775809", false).find("out of range"), std::string::npos);
  for (const char* bad : {"", "-", "0x10", "1e3", "1.5", " 1", "1 "})
    EXPECT_NE(check(bad, false).find("must be a decimal integer"), std::string::npos) << "'" << bad << "'";
}

TEST(NumberFlags, FloatsMustBeFinite) {
  EXPECT_EQ(pl::app::check_float_text("0.8"), "");
  EXPECT_EQ(pl::app::check_float_text("1e-3"), "");
  for (const char* bad : {"inf", "-inf", "nan", "1e400", "-1e999"})
    EXPECT_NE(pl::app::check_float_text(bad).find("must be a finite number"), std::string::npos) << bad;
  EXPECT_NE(pl::app::check_float_text("0.8x").find("must be a number"), std::string::npos);
}

// One stderr line naming the flag and the value, exit 2 (a bad command line), for each app's cases in the issue.
void number_flags_expect_refused(const std::string& exe, const std::vector<std::string>& args, const std::string& flag,
                                 const std::string& value) {
  SCOPED_TRACE(exe + " " + flag + " " + value);
  const ProcessResult r = pl::test::run_process(exe, args, 60.0);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  const auto lines = pl::test::split_lines(r.err);
  ASSERT_EQ(lines.size(), 1u) << r.err;
  EXPECT_NE(lines[0].find(flag), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find(value), std::string::npos) << lines[0];
}

TEST(NumberFlags, EveryAppRefusesWrappedClampedAndInfiniteValues) {
  const std::string tiny = std::string(PL_CONFIG_DIR) + "/models/llama_tiny.json";
  const std::string huge = "99999999999999999999";
  number_flags_expect_refused(PL_APP_PATH, {"--model", tiny, "--dry-run", "--seed", huge}, "--seed", huge);
  number_flags_expect_refused(PL_APP_PATH, {"--model", tiny, "--dry-run", "--lr", "nan"}, "--lr", "nan");
  number_flags_expect_refused(PL_APP_PATH, {"--model", tiny, "--dry-run", "--train-iters", huge}, "--train-iters", huge);
  const std::vector<std::string> gen = {"--load", "/nonexistent", "--prompt", "x"};
  const auto with = [](std::vector<std::string> a, const std::string& flag, const std::string& v) {
    a.push_back(flag);
    a.push_back(v);
    return a;
  };
  number_flags_expect_refused(PL_GENERATE_PATH, with(gen, "--seed", "-1"), "--seed", "-1");
  number_flags_expect_refused(PL_GENERATE_PATH, with(gen, "--seed", "18446744073709551616"), "--seed", "18446744073709551616");
  number_flags_expect_refused(PL_GENERATE_PATH, with(gen, "--temperature", "inf"), "--temperature", "inf");
  number_flags_expect_refused(PL_GENERATE_PATH, with(gen, "--max-new-tokens", huge), "--max-new-tokens", huge);
  const std::vector<std::string> pre = {"--input", "/nonexistent.jsonl", "--output-prefix", "/nonexistent/x",
                                        "--tokenizer-type", "byte", "--dataset-type", "sft"};
  number_flags_expect_refused(PL_PREPROCESS_DATA_PATH, with(pre, "--max-seq-length", huge), "--max-seq-length", huge);
  number_flags_expect_refused(PL_PREPROCESS_DATA_PATH, with(pre, "--workers", huge), "--workers", huge);
  number_flags_expect_refused(PL_QUANTIZE_TENSOR_PATH, {"/nonexistent.npy", "--format", "nvfp4", "--stochastic", "--seed", "-1"},
                              "--seed", "-1");
}

// "No limit" is --max-seq-length's absence: 0 is refused like 1, and --overlong without it would do nothing.
TEST(NumberFlags, PreprocessMaxSeqLengthZeroAndOverlongAloneAreRefused) {
  pl::test::TempDir dir;
  const std::string in = (dir.path() / "sft.jsonl").string();
  std::ofstream(in) << "{\"input\": \"a\", \"output\": \"b\"}\n";
  const auto refused = [&](std::vector<std::string> extra, const std::string& needle) {
    std::vector<std::string> a = {"--input", in, "--output-prefix", (dir.path() / "out").string(), "--tokenizer-type",
                                  "byte", "--dataset-type", "sft"};
    a.insert(a.end(), extra.begin(), extra.end());
    const ProcessResult r = pl::test::run_process(PL_PREPROCESS_DATA_PATH, a, 60.0);
    EXPECT_EQ(r.exit_code, 1) << r.out;
    const auto lines = pl::test::split_lines(r.err);
    ASSERT_EQ(lines.size(), 1u) << r.err;
    EXPECT_NE(lines[0].find(needle), std::string::npos) << lines[0];
  };
  refused({"--max-seq-length", "0"}, "--max-seq-length 0 must be at least 2 (for no limit, leave the flag out)");
  refused({"--max-seq-length", "1"}, "--max-seq-length 1 must be at least 2");
  refused({"--overlong", "drop"}, "--overlong drop needs --max-seq-length N");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 1);  // nothing written
}

}  // namespace
