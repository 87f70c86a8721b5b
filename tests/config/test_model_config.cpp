// Model configs: the shipped files load with the values SPEC-MEGATRON §3 names, and every malformed
// file is a one-line pl::Error naming the file and the field.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "config/model_config.h"
#include "core/error.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using pl::test::expect_one_line_error;
using pl::ModelConfig;

std::string model_path(const std::string& name) { return std::string(PL_CONFIG_DIR) + "/models/" + name + ".json"; }

// A valid small model (llama_tiny's shape) that the error tests mutate.
nlohmann::json base_model_json() {
  return nlohmann::json{{"name", "t"},
                        {"num_layers", 2},
                        {"hidden_size", 256},
                        {"ffn_hidden_size", 256},
                        {"num_attention_heads", 8},
                        {"num_query_groups", 2},
                        {"kv_channels", 32},
                        {"vocab_size", 128},
                        {"seq_length", 128},
                        {"rotary_base", 500000.0}};
}

// Runs `fn`, expects a pl::Error, and checks that its message is one non-empty line containing
// every string of `needles`.
TEST(ConfigModel, EveryShippedModelLoads) {
  int count = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(PL_CONFIG_DIR) / "models")) {
    if (entry.path().extension() != ".json") continue;
    SCOPED_TRACE(entry.path().string());
    ModelConfig m;
    ASSERT_NO_THROW(m = pl::load_model_config(entry.path().string()));
    EXPECT_FALSE(m.name.empty());
    EXPECT_EQ(m.file, entry.path().string());
    EXPECT_GT(m.num_parameters(), 0);
    ++count;
  }
  // llama3_8b, llama3_1_8b, llama_small, llama_tiny at least.
  EXPECT_GE(count, 4);
}

TEST(ConfigModel, Llama3_8bMatchesMegatronBridge) {
  const ModelConfig m = pl::load_model_config(model_path("llama3_8b"));
  EXPECT_EQ(m.name, "llama3_8b");
  EXPECT_EQ(m.num_layers, 32);
  EXPECT_EQ(m.hidden_size, 4096);
  EXPECT_EQ(m.ffn_hidden_size, 14336);
  EXPECT_EQ(m.num_attention_heads, 32);
  EXPECT_EQ(m.num_query_groups, 8);
  EXPECT_EQ(m.kv_channels, 128);
  EXPECT_EQ(m.vocab_size, 128256);
  EXPECT_EQ(m.padded_vocab_size(), 128256);  // 128256 = 1002 * 128: no padding
  EXPECT_EQ(m.seq_length, 8192);
  EXPECT_EQ(m.max_position_embeddings, 8192);
  EXPECT_DOUBLE_EQ(m.rotary_base, 500000.0);
  EXPECT_FALSE(m.rope_scaling);  // Meta-Llama-3-8B: rope_scaling null
  EXPECT_DOUBLE_EQ(m.layernorm_epsilon, 1e-5);
  EXPECT_DOUBLE_EQ(m.init_method_std, 0.02);
  EXPECT_EQ(m.q_dim(), 4096);
  EXPECT_EQ(m.kv_dim(), 1024);
}

TEST(ConfigModel, Llama3_1_8bHasRopeScalingFactor8) {
  const ModelConfig a = pl::load_model_config(model_path("llama3_1_8b"));
  const ModelConfig b = pl::load_model_config(model_path("llama3_8b"));
  EXPECT_TRUE(a.rope_scaling);
  EXPECT_DOUBLE_EQ(a.rope_scaling_factor, 8.0);
  EXPECT_DOUBLE_EQ(a.rope_low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(a.rope_high_freq_factor, 4.0);
  EXPECT_EQ(a.rope_original_max_position, 8192);
  // Every other architecture field is the Llama 3 one.
  EXPECT_EQ(a.num_layers, b.num_layers);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.ffn_hidden_size, b.ffn_hidden_size);
  EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
  EXPECT_EQ(a.num_query_groups, b.num_query_groups);
  EXPECT_EQ(a.kv_channels, b.kv_channels);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_DOUBLE_EQ(a.rotary_base, b.rotary_base);
  EXPECT_EQ(a.num_parameters(), b.num_parameters());
}

// Meta-Llama-3-70B's shapes (Hugging Face config.json: 80 layers, hidden 8192, intermediate 28672, 64 heads,
// 8 KV heads, vocab 128256, rope_theta 500000) with Megatron-Bridge's Llama3ModelProvider70B init_method_std
// 0.008944; the parameter count by tensor shapes (untied embedding and output layer, no biases):
// 70.55 B, of which 68.45 B in the linear layers (issue 42). Llama 3.1 adds only the RoPE scaling.
TEST(ConfigModel, Llama3_70bMatchesMetaAndMegatronBridge) {
  const ModelConfig m = pl::load_model_config(model_path("llama3_70b"));
  EXPECT_EQ(m.name, "llama3_70b");
  EXPECT_EQ(m.num_layers, 80);
  EXPECT_EQ(m.hidden_size, 8192);
  EXPECT_EQ(m.ffn_hidden_size, 28672);
  EXPECT_EQ(m.num_attention_heads, 64);
  EXPECT_EQ(m.num_query_groups, 8);
  EXPECT_EQ(m.kv_channels, 128);
  EXPECT_EQ(m.padded_vocab_size(), 128256);
  EXPECT_FALSE(m.rope_scaling);
  EXPECT_DOUBLE_EQ(m.rotary_base, 500000.0);
  EXPECT_DOUBLE_EQ(m.init_method_std, 0.008944);
  const int64_t h = 8192, kv = 8 * 128, f = 28672, V = 128256, L = 80;
  const int64_t linear = L * (h * (h + 2 * kv) + h * h + h * 2 * f + f * h);
  const int64_t megatron = linear + L * 2 * h + h + 2 * V * h;  // + the norms, the final norm, embedding and head
  EXPECT_EQ(linear, 68'451'041'280);
  EXPECT_EQ(megatron, 70'553'706'496);
  EXPECT_EQ(m.num_parameters(), megatron);

  const ModelConfig m31 = pl::load_model_config(model_path("llama3_1_70b"));
  EXPECT_TRUE(m31.rope_scaling);
  EXPECT_DOUBLE_EQ(m31.rope_scaling_factor, 8.0);
  EXPECT_DOUBLE_EQ(m31.rope_low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(m31.rope_high_freq_factor, 4.0);
  EXPECT_EQ(m31.rope_original_max_position, 8192);
  EXPECT_EQ(m31.max_position_embeddings, 131072);
  EXPECT_EQ(m31.num_parameters(), m.num_parameters());
}

TEST(ConfigModel, LlamaTinyIsTinyAndBlockAligned) {
  const ModelConfig m = pl::load_model_config(model_path("llama_tiny"));
  EXPECT_LT(m.num_parameters(), 1'000'000);
  EXPECT_EQ(m.hidden_size % 32, 0) << m.hidden_size;
  EXPECT_EQ(m.ffn_hidden_size % 32, 0) << m.ffn_hidden_size;
  EXPECT_EQ(m.q_dim() % 32, 0) << m.q_dim();
  EXPECT_EQ(m.kv_dim() % 32, 0) << m.kv_dim();
}

TEST(ConfigModel, LlamaSmallHas15To30MParameters) {
  const ModelConfig m = pl::load_model_config(model_path("llama_small"));
  EXPECT_GE(m.num_parameters(), 15'000'000);
  EXPECT_LE(m.num_parameters(), 30'000'000);
}

TEST(ConfigModel, NumParametersCountsEveryTensor) {
  // llama_tiny by hand: per layer 2 norms (2*256) + qkv ((256+2*64)*256) + proj (256*256)
  // + fc1 (2*256*256) + fc2 (256*256); final norm 256; untied embedding + LM head 2*128*256.
  const ModelConfig m = pl::load_model_config(model_path("llama_tiny"));
  const int64_t per_layer = 512 + 384 * 256 + 256 * 256 + 2 * 256 * 256 + 256 * 256;
  EXPECT_EQ(m.num_parameters(), 2 * per_layer + 256 + 2 * 128 * 256);
}

TEST(ConfigModel, PaddedVocabRoundsUpToDivisor) {
  ModelConfig m = pl::load_model_config(model_path("llama_tiny"));
  m.vocab_size = 32000;
  EXPECT_EQ(m.padded_vocab_size(), 32000);
  m.vocab_size = 32001;
  EXPECT_EQ(m.padded_vocab_size(), 32128);
}

TEST(ConfigModel, OptionalFieldsDefault) {
  pl::test::TempDir dir;
  nlohmann::json j = base_model_json();
  j.erase("num_query_groups");
  j.erase("kv_channels");
  const ModelConfig m = pl::load_model_config(dir.write("defaults.json", j.dump()));
  EXPECT_EQ(m.num_query_groups, 8);  // = heads (MHA)
  EXPECT_EQ(m.kv_channels, 32);      // = hidden / heads
  EXPECT_EQ(m.max_position_embeddings, 128);
  EXPECT_FALSE(m.rope_scaling);
}

// ---- errors -----------------------------------------------------------------------------------

class ConfigModelErrors : public ::testing::Test {
 protected:
  std::string write(const nlohmann::json& j, const std::string& name = "bad_model.json") {
    return dir_.write(name, j.dump(2));
  }
  pl::test::TempDir dir_;
};

TEST_F(ConfigModelErrors, ValidBaseLoads) {
  // The fixture's base document is valid, so each error below is due to its one change.
  EXPECT_NO_THROW(pl::load_model_config(write(base_model_json())));
}

TEST_F(ConfigModelErrors, UnknownKey) {
  nlohmann::json j = base_model_json();
  j["hiden_size"] = 256;
  const std::string p = write(j);
  expect_one_line_error([&] { pl::load_model_config(p); }, {p, "hiden_size"});
}

TEST_F(ConfigModelErrors, StringForInteger) {
  nlohmann::json j = base_model_json();
  j["num_layers"] = "2";
  const std::string p = write(j);
  expect_one_line_error([&] { pl::load_model_config(p); }, {p, "num_layers"});
}

TEST_F(ConfigModelErrors, FractionForInteger) {
  nlohmann::json j = base_model_json();
  j["hidden_size"] = 1.5;
  const std::string p = write(j);
  expect_one_line_error([&] { pl::load_model_config(p); }, {p, "hidden_size"});
}

TEST_F(ConfigModelErrors, StringForNumber) {
  nlohmann::json j = base_model_json();
  j["rotary_base"] = "500000";
  const std::string p = write(j);
  expect_one_line_error([&] { pl::load_model_config(p); }, {p, "rotary_base"});
}

TEST_F(ConfigModelErrors, MissingRequiredField) {
  nlohmann::json j = base_model_json();
  j.erase("ffn_hidden_size");
  const std::string p = write(j);
  expect_one_line_error([&] { pl::load_model_config(p); }, {p, "ffn_hidden_size"});
}

TEST_F(ConfigModelErrors, MissingFile) {
  const std::string p = (dir_.path() / "no_such_model.json").string();
  expect_one_line_error([&] { pl::load_model_config(p); }, {p});
}

TEST_F(ConfigModelErrors, InvalidJsonIsOneLine) {
  // A syntax error on the third line of a multi-line file.
  const std::string p = dir_.write("syntax.json", "{\n  \"name\": \"t\",\n  \"num_layers\": 2,,\n}\n");
  expect_one_line_error([&] { pl::load_model_config(p); }, {p, "JSON"});
}

TEST_F(ConfigModelErrors, TopLevelNotObject) {
  const std::string p = dir_.write("array.json", "[1, 2, 3]");
  expect_one_line_error([&] { pl::load_model_config(p); }, {p});
}

TEST_F(ConfigModelErrors, HeadsMustDivideHidden) {
  nlohmann::json j = base_model_json();
  j["num_attention_heads"] = 3;
  j["num_query_groups"] = 3;
  const std::string p = write(j);
  expect_one_line_error([&] { pl::load_model_config(p); }, {p, "num_attention_heads"});
}

TEST_F(ConfigModelErrors, GroupsMustDivideHeads) {
  nlohmann::json j = base_model_json();
  j["num_query_groups"] = 3;
  const std::string p = write(j);
  expect_one_line_error([&] { pl::load_model_config(p); }, {p, "num_query_groups"});
}

TEST_F(ConfigModelErrors, NonPositiveLayers) {
  nlohmann::json j = base_model_json();
  j["num_layers"] = 0;
  const std::string p = write(j);
  expect_one_line_error([&] { pl::load_model_config(p); }, {p, "num_layers"});
}

TEST_F(ConfigModelErrors, WrongTypeForBoolean) {
  nlohmann::json j = base_model_json();
  j["rope_scaling"] = 1;
  const std::string p = write(j);
  expect_one_line_error([&] { pl::load_model_config(p); }, {p, "rope_scaling"});
}

}  // namespace

namespace {

// Megatron's shape flags over a shipped config: only the given fields change, kv_channels follows
// hidden/heads unless given, and an impossible result names the flags.
TEST(ConfigModel, ShapeOverridesReplaceOnlyTheGivenFields) {
  const ModelConfig base = pl::load_model_config(model_path("llama3_8b"));
  pl::ModelShapeOverrides o;
  EXPECT_FALSE(o.any());
  EXPECT_EQ(pl::apply_shape_overrides(base, o).file, base.file);  // nothing given: unchanged
  o.num_layers = 4;
  const ModelConfig four = pl::apply_shape_overrides(base, o);
  EXPECT_EQ(four.num_layers, 4);
  EXPECT_EQ(four.hidden_size, base.hidden_size);
  EXPECT_EQ(four.ffn_hidden_size, base.ffn_hidden_size);
  EXPECT_EQ(four.kv_channels, 128);
  EXPECT_EQ(four.num_query_groups, 8);
  EXPECT_EQ(four.vocab_size, base.vocab_size);
  EXPECT_EQ(four.num_parameters() - 2 * four.vocab_size * four.hidden_size - four.hidden_size,
            (base.num_parameters() - 2 * base.vocab_size * base.hidden_size - base.hidden_size) / 8);
  EXPECT_NE(four.file.find("--num-layers 4"), std::string::npos) << four.file;

  pl::ModelShapeOverrides w;
  w.hidden_size = 2048;
  w.num_attention_heads = 16;
  w.ffn_hidden_size = 7168;
  const ModelConfig narrow = pl::apply_shape_overrides(base, w);
  EXPECT_EQ(narrow.kv_channels, 128);  // 2048 / 16, derived as Megatron does
  EXPECT_EQ(narrow.ffn_hidden_size, 7168);
  w.kv_channels = 64;
  EXPECT_EQ(pl::apply_shape_overrides(base, w).kv_channels, 64);  // given: kept
  EXPECT_EQ(w.describe(), "--hidden-size 2048 --ffn-hidden-size 7168 --num-attention-heads 16 --kv-channels 64");
}

TEST(ConfigModel, ShapeOverridesThatBreakTheModelNameTheFlags) {
  const ModelConfig base = pl::load_model_config(model_path("llama3_8b"));
  pl::ModelShapeOverrides o;
  o.num_attention_heads = 24;  // does not divide by the 8 query groups... and 4096 % 24 != 0
  expect_one_line_error([&] { (void)pl::apply_shape_overrides(base, o); }, {"--num-attention-heads 24", "llama3_8b"});
  pl::ModelShapeOverrides g;
  g.num_query_groups = 3;
  expect_one_line_error([&] { (void)pl::apply_shape_overrides(base, g); }, {"--num-query-groups 3", "num_query_groups"});
}

}  // namespace

// ---- silently accepted nonsense (issue 14, class 11): each is a one-line error naming the field ----

TEST_F(ConfigModelErrors, SizesWhoseParameterCountOverflowsInt64) {
  nlohmann::json j = base_model_json();
  j["hidden_size"] = 4'000'000'000'000LL;  // divisible by 8 heads; h^2 overflows int64
  j["ffn_hidden_size"] = 4'000'000'000'000LL;
  j.erase("kv_channels");
  const std::string p = write(j);
  expect_one_line_error([&] { pl::load_model_config(p); }, {p, "overflows"});
}

TEST_F(ConfigModelErrors, VocabularyThatOverflowsWhenPadded) {
  nlohmann::json j = base_model_json();
  j["vocab_size"] = INT64_MAX - 5;
  const std::string p = write(j);
  expect_one_line_error([&] { pl::load_model_config(p); }, {p, "overflows"});
}

TEST_F(ConfigModelErrors, EpsilonThatIsZeroInFp32) {
  nlohmann::json j = base_model_json();
  j["layernorm_epsilon"] = 1e-50;  // > 0 as a double, 0 as the float the kernels use
  const std::string p = write(j);
  expect_one_line_error([&] { pl::load_model_config(p); }, {p, "layernorm_epsilon", "FP32"});
}

TEST_F(ConfigModelErrors, RotaryBaseThatIsInfiniteInFp32) {
  nlohmann::json j = base_model_json();
  j["rotary_base"] = 1e39;
  const std::string p = write(j);
  expect_one_line_error([&] { pl::load_model_config(p); }, {p, "rotary_base"});
}

TEST_F(ConfigModelErrors, HugeNameIsRefusedWithoutEchoingIt) {
  nlohmann::json j = base_model_json();
  j["name"] = std::string(5'000'000, 'x');
  const std::string p = write(j);
  try {
    pl::load_model_config(p);
    FAIL() << "a 5 MB name was accepted";
  } catch (const pl::Error& e) {
    const std::string msg = e.what();
    EXPECT_LT(msg.size(), 400u) << "the name was echoed";
    EXPECT_NE(msg.find("'name'"), std::string::npos) << msg;
  }
}

TEST_F(ConfigModelErrors, NameWithAControlCharacter) {
  nlohmann::json j = base_model_json();
  j["name"] = "a\nb";
  const std::string p = write(j);
  expect_one_line_error([&] { pl::load_model_config(p); }, {p, "name", "control"});
}

TEST_F(ConfigModelErrors, IntegerFieldsTakeNoFractionsOrHugeFloats) {
  for (const char* text : {"1.9", "1e20", "-1e300"}) {
    nlohmann::json j = base_model_json();
    j["num_layers"] = nlohmann::json::parse(text);
    const std::string p = write(j);
    SCOPED_TRACE(text);
    expect_one_line_error([&] { pl::load_model_config(p); }, {p, "num_layers", "integer"});
  }
}
