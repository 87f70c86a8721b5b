// Issue 14, classes 8, 10 and 11: sizes computed from user input are checked (core/checked_math.h),
// integer fields take no fractions, wrapped negatives or clamped floats, and values that are valid as
// written but nonsense where they are used are one-line errors naming the field.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "config/train_config.h"
#include "core/checked_math.h"
#include "core/error.h"
#include "core/host_memory.h"
#include "data/blended_dataset.h"
#include "data/tokenizer_record.h"
#include "io/json_text.h"
#include "model/hf_llama.h"
#include "test_util.h"

namespace {

using pl::test::expect_one_line_error;
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

TEST(CheckedMath, ProductsThatFitAreExactAndOverflowsAreErrorsNamingTheQuantity) {
  EXPECT_EQ(pl::checked_mul(3'000'000'000LL, 3'000'000'000LL, "x"), 9'000'000'000'000'000'000LL);
  EXPECT_EQ(pl::checked_product({2, 3, 7}, "x"), 42);
  expect_one_line_error([] { pl::checked_mul(4'000'000'000LL, 4'000'000'000LL, "the widget count"); },
                        {"the widget count", "overflows", "4000000000 x 4000000000"});
  expect_one_line_error([] { pl::checked_add(kMax, 1, "a sum"); }, {"a sum", "overflows"});
  expect_one_line_error([] { pl::checked_mul_u64(UINT64_MAX / 2, 3, "bytes"); }, {"bytes", "overflows"});
}

TEST(CheckedMath, JsonIntegersAreExactOrRefused) {
  using nlohmann::json;
  EXPECT_EQ(pl::json_exact_integer<int32_t>(json::parse("7")), 7);
  EXPECT_EQ(pl::json_exact_integer<int64_t>(json::parse("1e5")), 100000);  // a whole float is fine
  EXPECT_FALSE(pl::json_exact_integer<int64_t>(json::parse("1.9")));        // not truncated to 1
  EXPECT_FALSE(pl::json_exact_integer<int64_t>(json::parse("1e20")));       // not clamped
  EXPECT_FALSE(pl::json_exact_integer<uint64_t>(json::parse("-1")));        // not wrapped
  EXPECT_FALSE(pl::json_exact_integer<int32_t>(json::parse("4294967296")));
  EXPECT_FALSE(pl::json_exact_integer<int64_t>(json::parse("18446744073709551615")));
  EXPECT_FALSE(pl::json_exact_integer<int64_t>(json::parse("\"3\"")));
}

TEST(CheckedSizes, TrainSamplesThatOverflowAreOneLineErrorsNamingTheFlags) {
  pl::TrainConfig t;
  t.seq_length = 64;
  t.train_iters = kMax / 8;
  t.global_batch_size = 64;
  t.micro_batch_size = 4;
  expect_one_line_error([&] { pl::validate_train_config(t); }, {"--train-iters", "--global-batch-size", "overflows"});
  t.train_iters = 10;
  t.eval_iters = kMax / 32;
  expect_one_line_error([&] { pl::validate_train_config(t); }, {"--eval-iters", "overflows"});
  t.eval_iters = 0;
  t.micro_batch_size = kMax / 2 + 1;
  t.global_batch_size = kMax / 2 + 1;
  expect_one_line_error([&] { pl::validate_train_config(t); }, {"--seq-length", "overflows"});
}

TEST(CheckedSizes, BlendWeightsWhoseSumOverflows) {
  const double w[] = {1e308, 1e308};
  expect_one_line_error([&] { pl::data::normalize_blend_weights(w); }, {"--data-path", "sum"});
}

TEST(CheckedSizes, TokenizerRecordIdsAreExactIntegersInRange) {
  pl::test::TempDir dir;
  const std::string prefix = (dir.path() / "d").string();
  pl::data::TokenizerRecord r;
  r.type = "byte";
  r.vocab_size = 257;
  r.eod = 256;
  pl::data::write_tokenizer_record(prefix, r);
  ASSERT_TRUE(pl::data::read_tokenizer_record(prefix).has_value());
  const std::string path = pl::data::tokenizer_record_path(prefix);
  const std::string good = pl::test::read_text_file(path);
  for (const std::string& bad : {std::string("1.9"), std::string("-1"), std::string("1e20")}) {
    nlohmann::json j = nlohmann::json::parse(good);
    j["eod"] = nlohmann::json::parse(bad);
    dir.write("d.tokenizer.json", j.dump());
    SCOPED_TRACE(bad);
    expect_one_line_error([&] { pl::data::read_tokenizer_record(prefix); }, {path, "eod"});
  }
}

TEST(CheckedSizes, HfSpecialTokenIdsMustNameTokens) {
  pl::ModelConfig m;
  m.name = "t";
  m.num_layers = 1;
  m.hidden_size = 64;
  m.ffn_hidden_size = 64;
  m.num_attention_heads = 2;
  m.num_query_groups = 2;
  m.kv_channels = 32;
  m.vocab_size = 100;
  m.seq_length = 16;
  m.max_position_embeddings = 16;
  m.rotary_base = 10000.0;
  pl::HfExportOptions o;
  o.bos_token_id = -1;  // would be written into config.json and read back as a (pad) token id
  expect_one_line_error([&] { pl::hf_llama_config_json(m, o); }, {"bos_token_id", "-1", "vocabulary"});
  o.bos_token_id = 1;
  o.eos_token_ids = {2, 100};
  expect_one_line_error([&] { pl::hf_llama_config_json(m, o); }, {"eos_token_id", "100"});
  o.eos_token_ids = {2};
  const std::string text = pl::hf_llama_config_json(m, o);
  nlohmann::json j = nlohmann::json::parse(text);
  j["eos_token_id"] = -1;
  pl::test::TempDir dir;
  const std::string p = dir.write("config.json", j.dump());
  expect_one_line_error([&] { pl::read_hf_llama_config(p); }, {p, "eos_token_id", "-1"});
}

TEST(HostMemory, AvailableIsPositiveAndAnAbsurdRequestIsRefused) {
  EXPECT_GT(pl::host_memory_available_bytes(), 0);
  EXPECT_NO_THROW(pl::check_host_memory(1, "a byte", "never"));
  expect_one_line_error([] { pl::check_host_memory(kMax, "the widget index", "lower --widgets"); },
                        {"the widget index", "GB", "lower --widgets"});
}

}  // namespace
