// Hugging Face Llama interop: config.json <-> ModelConfig (Llama 3.1 8B's published config maps onto
// configs/models/llama3_1_8b.json), configs either side cannot express are refused naming the field,
// and llama_tiny survives export -> import (single file and sharded) with its master weights equal
// to the BF16-rounded originals and an identical forward loss; the CLI starts a run from an export.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <regex>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "io/safetensors.h"
#include "model/hf_llama.h"
#include "model/llama.h"
#include "numerics/bf16.h"
#include "test_util.h"

namespace pl {
namespace {

using test::expect_one_line_error;
using test::TempDir;

const std::string kTinyPath = std::string(PL_CONFIG_DIR) + "/models/llama_tiny.json";

ModelConfig hf_llama_tiny() { return load_model_config(kTinyPath); }

// meta-llama/Llama-3.1-8B's config.json as published on the Hub.
const char* kLlama31_8bConfig = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
  "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072,
  "mlp_bias": false, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 128256
})";

std::vector<float> master_of(LlamaModel& m) {
  const float* p = m.master().flat.f32();
  return std::vector<float>(p, p + m.num_params());
}

struct Batch {
  std::vector<int32_t> tok, lab;
};
Batch fixed_batch(const ModelConfig& cfg, int64_t n) {
  std::mt19937 rng(11);
  Batch b{std::vector<int32_t>(static_cast<size_t>(n)), std::vector<int32_t>(static_cast<size_t>(n))};
  for (auto& t : b.tok) t = static_cast<int32_t>(rng() % cfg.vocab_size);
  for (auto& t : b.lab) t = static_cast<int32_t>(rng() % cfg.vocab_size);
  return b;
}

TEST(HfLlama, Llama31ConfigMapsOntoOurModelConfig) {
  TempDir dir;
  const std::string p = dir.write("config.json", kLlama31_8bConfig);
  const HfLlamaConfig hf = read_hf_llama_config(p);
  const ModelConfig ours = load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama3_1_8b.json");
  EXPECT_NO_THROW(check_hf_config_matches(hf.model, ours));
  EXPECT_EQ(hf.model.num_parameters(), ours.num_parameters());
  EXPECT_EQ(hf.model.kv_channels, 128);
  EXPECT_TRUE(hf.model.rope_scaling);
  EXPECT_EQ(hf.model.rope_original_max_position, 8192);
  EXPECT_EQ(hf.model.max_position_embeddings, 131072);
  EXPECT_FALSE(hf.tie_word_embeddings);
  EXPECT_EQ(hf.bos_token_id, 128000);
  EXPECT_EQ(hf.eos_token_ids, (std::vector<int64_t>{128001}));
  EXPECT_EQ(hf.torch_dtype, "bfloat16");
}

TEST(HfLlama, ConfigJsonRoundTrip) {
  const ModelConfig m = hf_llama_tiny();
  HfExportOptions opts;
  opts.bos_token_id = 1;
  opts.eos_token_ids = {2, 3};
  const std::string text = hf_llama_config_json(m, opts);
  const nlohmann::json j = nlohmann::json::parse(text);
  EXPECT_EQ(j["architectures"], nlohmann::json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(j["model_type"], "llama");
  EXPECT_EQ(j["torch_dtype"], "bfloat16");
  EXPECT_EQ(j["head_dim"], 32);
  EXPECT_EQ(j["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(j["rope_scaling"]["factor"], 8.0);
  EXPECT_EQ(j["rope_theta"], 500000.0);
  EXPECT_EQ(j["tie_word_embeddings"], false);
  TempDir dir;
  const HfLlamaConfig back = read_hf_llama_config(dir.write("config.json", text));
  EXPECT_NO_THROW(check_hf_config_matches(back.model, m));
  EXPECT_EQ(back.model.max_position_embeddings, m.max_position_embeddings);
  EXPECT_EQ(back.model.init_method_std, m.init_method_std);
  EXPECT_EQ(back.bos_token_id, 1);
  EXPECT_EQ(back.eos_token_ids, (std::vector<int64_t>{2, 3}));
  // Without rope scaling: rope_scaling null, read back as none.
  ModelConfig plain = m;
  plain.rope_scaling = false;
  const std::string t2 = hf_llama_config_json(plain);
  EXPECT_TRUE(nlohmann::json::parse(t2)["rope_scaling"].is_null());
  EXPECT_FALSE(read_hf_llama_config(dir.write("config.json", t2)).model.rope_scaling);
}

TEST(HfLlama, DefaultsAndTransformersV5RopeParameters) {
  TempDir dir;
  // Absent fields take LlamaConfig's defaults; rope_parameters is transformers v5's spelling.
  const std::string p = dir.write("config.json", R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 100,
      "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})");
  const ModelConfig m = read_hf_llama_config(p).model;
  EXPECT_EQ(m.num_query_groups, 4);
  EXPECT_EQ(m.kv_channels, 16);
  EXPECT_EQ(m.layernorm_epsilon, 1e-6);
  EXPECT_EQ(m.max_position_embeddings, 2048);
  EXPECT_EQ(m.rotary_base, 500000.0);
  EXPECT_TRUE(m.rope_scaling);
  EXPECT_EQ(m.rope_scaling_factor, 32.0);
}

TEST(HfLlama, RefusesHfConfigsWeCannotExpress) {
  const nlohmann::json base = nlohmann::json::parse(kLlama31_8bConfig);
  struct Case {
    const char* what;
    std::function<void(nlohmann::json&)> edit;
    std::vector<std::string> needles;
  };
  const std::vector<Case> cases = {
      {"yarn rope", [](auto& j) { j["rope_scaling"]["rope_type"] = "yarn"; }, {"rope_scaling.rope_type", "yarn"}},
      {"linear rope (old 'type' key)", [](auto& j) { j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}}; },
       {"rope_scaling.type", "linear"}},
      {"gelu", [](auto& j) { j["hidden_act"] = "gelu"; }, {"hidden_act", "gelu"}},
      {"attention bias", [](auto& j) { j["attention_bias"] = true; }, {"attention_bias"}},
      {"mlp bias", [](auto& j) { j["mlp_bias"] = true; }, {"mlp_bias"}},
      {"other model type", [](auto& j) { j["model_type"] = "mistral"; }, {"model_type", "mistral"}},
      {"other architecture", [](auto& j) { j["architectures"] = {"MistralForCausalLM"}; }, {"architectures"}},
      {"quantized", [](auto& j) { j["quantization_config"] = {{"quant_method", "fp8"}}; }, {"quantization_config"}},
      {"kv heads not dividing heads", [](auto& j) { j["num_key_value_heads"] = 5; }, {"num_key_value_heads"}},
      {"odd head_dim", [](auto& j) { j["head_dim"] = 127; }, {"head_dim"}},
      {"heads not dividing hidden", [](auto& j) { j["num_attention_heads"] = 24; j["num_key_value_heads"] = 8; },
       {"num_attention_heads"}},
      {"llama3 rope without its factors", [](auto& j) { j["rope_scaling"].erase("low_freq_factor"); },
       {"rope_scaling.low_freq_factor"}},
      {"missing hidden_size", [](auto& j) { j.erase("hidden_size"); }, {"hidden_size", "missing"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    TempDir dir;
    nlohmann::json j = base;
    c.edit(j);
    const std::string p = dir.write("config.json", j.dump());
    std::vector<std::string> needles = c.needles;
    needles.push_back(p);
    expect_one_line_error([&] { (void)read_hf_llama_config(p); }, needles);
  }
}

TEST(HfLlama, RefusesModelConfigsHfCannotExpress) {
  ModelConfig m = hf_llama_tiny();
  m.max_position_embeddings = 0;
  expect_one_line_error([&] { (void)hf_llama_config_json(m); }, {"max_position_embeddings", kTinyPath});
  m = hf_llama_tiny();
  m.kv_channels = 31;
  expect_one_line_error([&] { (void)hf_llama_config_json(m); }, {"kv_channels", "head_dim"});
}

TEST(HfLlama, TensorLayoutCoversEveryParameterOnce) {
  const ModelConfig m = hf_llama_tiny();
  const std::vector<HfTensorSlot> slots = hf_llama_tensor_layout(m);
  EXPECT_EQ(slots.size(), 2u + 9u * static_cast<size_t>(m.num_layers) + 1u);
  std::vector<int> covered(static_cast<size_t>(m.num_parameters()), 0);
  for (const HfTensorSlot& s : slots)
    for (int64_t i = 0; i < s.numel(); ++i) covered[static_cast<size_t>(s.offset + i)]++;
  for (size_t i = 0; i < covered.size(); ++i) ASSERT_EQ(covered[i], 1) << "element " << i;
  // q, k, v are consecutive row blocks of linear_qkv; gate precedes up in linear_fc1.
  EXPECT_EQ(slots[1].name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(slots[1].shape, (std::vector<int64_t>{m.q_dim(), m.hidden_size}));
  EXPECT_EQ(slots[2].offset, slots[1].offset + m.q_dim() * m.hidden_size);
  EXPECT_EQ(slots[3].offset, slots[2].offset + m.kv_dim() * m.hidden_size);
  EXPECT_EQ(slots[5].name, "model.layers.0.mlp.gate_proj.weight");
  EXPECT_EQ(slots[6].offset, slots[5].offset + m.ffn_hidden_size * m.hidden_size);
}

// The heart of it: export, import into a fresh model, same weights (BF16-rounded) and same loss.
TEST(HfLlama, ExportImportRoundTripIsExact) {
  const ModelConfig cfg = hf_llama_tiny();
  const int64_t B = 2, S = 32;
  const Batch batch = fixed_batch(cfg, B * S);
  LlamaModel a(cfg, B, S, OpContext{});
  a.init_parameters(7);
  const double loss_a = a.forward(batch.tok.data(), batch.lab.data());
  const std::vector<float> orig = master_of(a);

  TempDir dir;
  const std::string single = (dir.path() / "single").string();
  const std::vector<std::string> files = export_hf(a, single);
  EXPECT_EQ(files, (std::vector<std::string>{"model.safetensors", "config.json"}));
  LlamaModel b(cfg, B, S, OpContext{});
  b.init_parameters(99);  // different weights, all of which the import must replace
  const HfImportReport rep = import_hf(single, b);
  EXPECT_EQ(rep.num_tensors, 2 + 9 * cfg.num_layers + 1);
  EXPECT_EQ(rep.dtypes, (std::set<std::string>{"BF16"}));
  EXPECT_EQ(rep.stored_bytes, static_cast<uint64_t>(cfg.num_parameters()) * 2);
  EXPECT_FALSE(rep.tied_embeddings);
  EXPECT_NE(rep.describe().find("initialized from Hugging Face checkpoint " + single + " (" +
                                std::to_string(rep.num_tensors) + " tensors, 0.00 GB, dtype BF16)"),
            std::string::npos)
      << rep.describe();
  const std::vector<float> got = master_of(b);
  for (size_t i = 0; i < orig.size(); ++i) ASSERT_EQ(got[i], num::round_bf16(orig[i])) << "master element " << i;
  // The forward pass reads the BF16 weights, which rounding the master again does not change.
  EXPECT_EQ(b.forward(batch.tok.data(), batch.lab.data()), loss_a);

  // Sharded with a small limit: several files and an index, the same weights.
  const std::string sharded = (dir.path() / "sharded").string();
  HfExportOptions small;
  small.max_shard_bytes = 100'000;
  const std::vector<std::string> sfiles = export_hf(a, sharded, small);
  ASSERT_GT(sfiles.size(), 3u);
  EXPECT_EQ(sfiles[sfiles.size() - 2], "model.safetensors.index.json");
  EXPECT_TRUE(std::regex_match(sfiles[0], std::regex(R"(model-00001-of-\d{5}\.safetensors)"))) << sfiles[0];
  EXPECT_TRUE(SafetensorsCheckpoint(sharded).sharded());
  LlamaModel c(cfg, B, S, OpContext{});
  import_hf(sharded, c);
  EXPECT_EQ(master_of(c), got);
}

// An export from host master floats (what a checkpoint converter holds) equals the model export.
TEST(HfLlama, ExportFromHostMasterWeights) {
  const ModelConfig cfg = hf_llama_tiny();
  LlamaModel a(cfg, 1, 16, OpContext{});
  a.init_parameters(3);
  TempDir dir;
  const std::vector<float> host = master_of(a);
  export_hf(cfg, host, (dir.path() / "h").string());
  export_hf(a, (dir.path() / "m").string());
  EXPECT_EQ(test::read_text_file((dir.path() / "h/model.safetensors").string()),
            test::read_text_file((dir.path() / "m/model.safetensors").string()));
  EXPECT_EQ(test::read_text_file((dir.path() / "h/config.json").string()),
            test::read_text_file((dir.path() / "m/config.json").string()));
  expect_one_line_error([&] { export_hf(cfg, std::span<const float>(host.data(), 10), (dir.path() / "x").string()); },
                        {"10 master weights"});
}

// Rewrites dir's weights as `tensors` (names -> float data, F32 unless dtype says otherwise).
struct Rewrite {
  std::vector<std::string> names;
  std::vector<std::vector<float>> data;
  std::vector<std::vector<int64_t>> shapes;
  void add(const std::string& n, std::vector<float> d, std::vector<int64_t> s) {
    names.push_back(n);
    data.push_back(std::move(d));
    shapes.push_back(std::move(s));
  }
  void write(const std::string& dir, const std::string& dtype = "F32") const {
    std::vector<SafetensorsTensorOut> out;
    for (size_t i = 0; i < names.size(); ++i) out.push_back({names[i], dtype, shapes[i], data[i].data()});
    write_safetensors_checkpoint(dir, out, 1ull << 40);
  }
};

// The exported tensors of a tiny model, read back, for editing.
Rewrite exported(const std::string& dir) {
  const SafetensorsCheckpoint c(dir);
  Rewrite r;
  for (const std::string& n : c.names()) r.add(n, c.read_float(n), c.info(n).shape);
  return r;
}

TEST(HfLlama, ImportsF32StoredWeightsExactlyAndIgnoresRotaryBuffers) {
  const ModelConfig cfg = hf_llama_tiny();
  LlamaModel a(cfg, 1, 16, OpContext{});
  a.init_parameters(5);
  TempDir dir;
  const std::string d = dir.path().string();
  export_hf(a, d);
  // Replace the BF16 file by F32 tensors holding the exact masters, plus an old-style inv_freq buffer.
  Rewrite r;
  const std::vector<float> orig = master_of(a);
  for (const HfTensorSlot& s : hf_llama_tensor_layout(cfg))
    r.add(s.name, std::vector<float>(orig.begin() + s.offset, orig.begin() + s.offset + s.numel()), s.shape);
  r.add("model.layers.0.self_attn.rotary_emb.inv_freq", std::vector<float>(16, 1.0f), {16});
  r.write(d, "F32");
  LlamaModel b(cfg, 1, 16, OpContext{});
  const HfImportReport rep = import_hf(d, b);
  EXPECT_EQ(master_of(b), orig);
  EXPECT_EQ(rep.dtypes, (std::set<std::string>{"F32"}));
  EXPECT_EQ(rep.ignored, (std::vector<std::string>{"model.layers.0.self_attn.rotary_emb.inv_freq"}));
  EXPECT_NE(rep.describe().find("ignored: model.layers.0.self_attn.rotary_emb.inv_freq"), std::string::npos);
}

TEST(HfLlama, TiedEmbeddingsInitialiseTheLmHeadFromTheEmbedding) {
  const ModelConfig cfg = hf_llama_tiny();
  LlamaModel a(cfg, 1, 16, OpContext{});
  a.init_parameters(5);
  TempDir dir;
  const std::string d = dir.path().string();
  export_hf(a, d);
  Rewrite r = exported(d);
  const auto it = std::find(r.names.begin(), r.names.end(), "lm_head.weight");
  const size_t k = static_cast<size_t>(it - r.names.begin());
  r.names.erase(r.names.begin() + static_cast<std::ptrdiff_t>(k));
  r.data.erase(r.data.begin() + static_cast<std::ptrdiff_t>(k));
  r.shapes.erase(r.shapes.begin() + static_cast<std::ptrdiff_t>(k));
  r.write(d, "BF16");
  std::string config = test::read_text_file(d + "/config.json");
  config = std::regex_replace(config, std::regex(R"("tie_word_embeddings": false)"), R"("tie_word_embeddings": true)");
  std::ofstream(d + "/config.json") << config;
  LlamaModel b(cfg, 1, 16, OpContext{});
  const HfImportReport rep = import_hf(d, b);
  EXPECT_TRUE(rep.tied_embeddings);
  EXPECT_NE(rep.describe().find("tie_word_embeddings"), std::string::npos);
  const std::vector<float> m = master_of(b);
  const int64_t n = cfg.vocab_size * cfg.hidden_size;
  const int64_t head = cfg.num_parameters() - n;
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(m[static_cast<size_t>(head + i)], m[static_cast<size_t>(i)]);
}

TEST(HfLlama, RefusesMissingExtraAndMisshapenTensors) {
  const ModelConfig cfg = hf_llama_tiny();
  LlamaModel a(cfg, 1, 16, OpContext{});
  a.init_parameters(5);
  TempDir dir;
  const std::string d = dir.path().string();
  export_hf(a, d);
  const Rewrite base = exported(d);
  LlamaModel b(cfg, 1, 16, OpContext{});
  b.init_parameters(42);
  const std::vector<float> before = master_of(b);
  {
    SCOPED_TRACE("missing");
    Rewrite r = base;
    const auto it = std::find(r.names.begin(), r.names.end(), "model.layers.1.mlp.up_proj.weight");
    const auto k = it - r.names.begin();
    r.names.erase(it);
    r.data.erase(r.data.begin() + k);
    r.shapes.erase(r.shapes.begin() + k);
    r.write(d);
    expect_one_line_error([&] { import_hf(d, b); }, {d, "model.layers.1.mlp.up_proj.weight", "missing"});
  }
  {
    SCOPED_TRACE("extra layer");
    Rewrite r = base;
    r.add("model.layers.2.self_attn.q_proj.weight", std::vector<float>(16, 0.0f), {4, 4});
    r.write(d);
    expect_one_line_error([&] { import_hf(d, b); }, {"model.layers.2.self_attn.q_proj.weight", "unexpected"});
  }
  {
    SCOPED_TRACE("wrong shape");
    Rewrite r = base;
    const auto k = std::find(r.names.begin(), r.names.end(), "model.norm.weight") - r.names.begin();
    r.data[static_cast<size_t>(k)].push_back(1.0f);
    r.shapes[static_cast<size_t>(k)] = {cfg.hidden_size + 1};
    r.write(d);
    expect_one_line_error([&] { import_hf(d, b); }, {"model.norm.weight", "[257]", "[256]"});
  }
  {
    SCOPED_TRACE("config.json of another shape");
    base.write(d);
    std::string config = test::read_text_file(d + "/config.json");
    config = std::regex_replace(config, std::regex(R"("intermediate_size": 256)"), R"("intermediate_size": 512)");
    std::ofstream(d + "/config.json") << config;
    expect_one_line_error([&] { import_hf(d, b); }, {"ffn_hidden_size", "intermediate_size", "256", "512"});
  }
  // Every check runs before any weight is written: the refused imports left b's weights alone.
  EXPECT_EQ(master_of(b), before);
}

}  // namespace
}  // namespace pl

namespace pl {
namespace {

// An independent forward pass written from transformers' modeling_llama.py over the HF-named tensors
// of an exported directory, in double precision: RMSNorm, q/k/v/o projections, rotate_half RoPE with
// the llama3 inverse frequencies, GQA by repeat_kv, causal softmax(q k^T / sqrt(d)), SwiGLU MLP
// (down(silu(gate(x)) * up(x))), final norm, lm_head. Returns the summed cross-entropy. If the
// exporter put q/k/v or gate/up in the wrong place, or our RoPE paired other elements than
// rotate_half, this disagrees with our model.
double hf_reference_loss_sum(const std::string& dir, const std::vector<int32_t>& tok, const std::vector<int32_t>& lab) {
  const ModelConfig m = read_hf_llama_config(dir + "/config.json").model;
  const SafetensorsCheckpoint ck(dir);
  auto W = [&](const std::string& n) {
    const std::vector<float> f = ck.read_float(n);
    return std::vector<double>(f.begin(), f.end());
  };
  const int64_t T = static_cast<int64_t>(tok.size()), h = m.hidden_size, d = m.kv_channels;
  const int64_t nq = m.num_attention_heads, nkv = m.num_query_groups, f = m.ffn_hidden_size, V = m.vocab_size;
  using Mat = std::vector<double>;  // row-major [T, cols]
  auto linear = [&](const Mat& x, const Mat& w, int64_t in, int64_t out) {  // x @ w^T
    Mat y(static_cast<size_t>(T * out), 0.0);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t o = 0; o < out; ++o) {
        double s = 0;
        for (int64_t i = 0; i < in; ++i) s += x[t * in + i] * w[o * in + i];
        y[t * out + o] = s;
      }
    return y;
  };
  auto rmsnorm = [&](const Mat& x, const Mat& w) {
    Mat y(x.size());
    for (int64_t t = 0; t < T; ++t) {
      double ss = 0;
      for (int64_t i = 0; i < h; ++i) ss += x[t * h + i] * x[t * h + i];
      const double r = 1.0 / std::sqrt(ss / static_cast<double>(h) + m.layernorm_epsilon);
      for (int64_t i = 0; i < h; ++i) y[t * h + i] = w[i] * (x[t * h + i] * r);
    }
    return y;
  };
  // _compute_llama3_parameters
  std::vector<double> inv_freq(static_cast<size_t>(d / 2));
  for (int64_t i = 0; i < d / 2; ++i) {
    double fr = 1.0 / std::pow(m.rotary_base, static_cast<double>(2 * i) / static_cast<double>(d));
    if (m.rope_scaling) {
      const double old_ctx = static_cast<double>(m.rope_original_max_position);
      const double wavelen = 2 * std::numbers::pi / fr;
      const double scaled = wavelen > old_ctx / m.rope_low_freq_factor ? fr / m.rope_scaling_factor : fr;
      const double smooth = (old_ctx / wavelen - m.rope_low_freq_factor) / (m.rope_high_freq_factor - m.rope_low_freq_factor);
      const bool medium = !(wavelen < old_ctx / m.rope_high_freq_factor) && !(wavelen > old_ctx / m.rope_low_freq_factor);
      fr = medium ? (1 - smooth) * scaled / m.rope_scaling_factor + smooth * scaled : scaled;
    }
    inv_freq[static_cast<size_t>(i)] = fr;
  }
  auto rope = [&](Mat& x, int64_t heads) {  // x*cos + rotate_half(x)*sin, emb = cat(freqs, freqs)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t hd = 0; hd < heads; ++hd) {
        double* v = &x[(t * heads + hd) * d];
        std::vector<double> out(static_cast<size_t>(d));
        for (int64_t j = 0; j < d; ++j) {
          const double ang = static_cast<double>(t) * inv_freq[static_cast<size_t>(j % (d / 2))];
          const double rot = j < d / 2 ? -v[j + d / 2] : v[j - d / 2];
          out[static_cast<size_t>(j)] = v[j] * std::cos(ang) + rot * std::sin(ang);
        }
        std::copy(out.begin(), out.end(), v);
      }
  };
  const Mat emb = W("model.embed_tokens.weight");
  Mat x(static_cast<size_t>(T * h));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < h; ++i) x[t * h + i] = emb[tok[t] * h + i];
  for (int64_t l = 0; l < m.num_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    const Mat a = rmsnorm(x, W(p + "input_layernorm.weight"));
    Mat q = linear(a, W(p + "self_attn.q_proj.weight"), h, nq * d);
    Mat k = linear(a, W(p + "self_attn.k_proj.weight"), h, nkv * d);
    const Mat v = linear(a, W(p + "self_attn.v_proj.weight"), h, nkv * d);
    rope(q, nq);
    rope(k, nkv);
    Mat att(static_cast<size_t>(T * nq * d), 0.0);
    for (int64_t hd = 0; hd < nq; ++hd) {
      const int64_t g = hd / (nq / nkv);  // repeat_kv
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> s(static_cast<size_t>(i + 1));
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < d; ++e) dot += q[(i * nq + hd) * d + e] * k[(j * nkv + g) * d + e];
          s[static_cast<size_t>(j)] = dot / std::sqrt(static_cast<double>(d));
          mx = std::max(mx, s[static_cast<size_t>(j)]);
        }
        for (double& z : s) sum += (z = std::exp(z - mx));
        for (int64_t j = 0; j <= i; ++j)
          for (int64_t e = 0; e < d; ++e) att[(i * nq + hd) * d + e] += s[static_cast<size_t>(j)] / sum * v[(j * nkv + g) * d + e];
      }
    }
    const Mat o = linear(att, W(p + "self_attn.o_proj.weight"), nq * d, h);
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
    const Mat b = rmsnorm(x, W(p + "post_attention_layernorm.weight"));
    const Mat gate = linear(b, W(p + "mlp.gate_proj.weight"), h, f), up = linear(b, W(p + "mlp.up_proj.weight"), h, f);
    Mat act(gate.size());
    for (size_t i = 0; i < act.size(); ++i) act[i] = gate[i] / (1 + std::exp(-gate[i])) * up[i];
    const Mat down = linear(act, W(p + "mlp.down_proj.weight"), f, h);
    for (size_t i = 0; i < x.size(); ++i) x[i] += down[i];
  }
  const Mat logits = linear(rmsnorm(x, W("model.norm.weight")), W("lm_head.weight"), h, V);
  double loss = 0;
  for (int64_t t = 0; t < T; ++t) {
    double mx = -1e300, sum = 0;
    for (int64_t c = 0; c < V; ++c) mx = std::max(mx, logits[t * V + c]);
    for (int64_t c = 0; c < V; ++c) sum += std::exp(logits[t * V + c] - mx);
    loss += mx + std::log(sum) - logits[t * V + lab[t]];
  }
  return loss;
}

TEST(HfLlama, ExportedWeightsGiveTransformersLlamaForwardLoss) {
  ModelConfig cfg = hf_llama_tiny();
  cfg.init_method_std = 0.25;  // large weights: attention and MLP visibly shape the logits
  const int64_t S = 48;
  const Batch batch = fixed_batch(cfg, S);
  OpContext fp32;
  fp32.round_bf16 = false;  // FP32 activations, to compare with the double-precision reference
  LlamaModel model(cfg, 1, S, fp32);
  model.init_parameters(21);
  TempDir dir;
  export_hf(model, dir.path().string());
  import_hf(dir.path().string(), model);  // our model now holds exactly the exported BF16 values
  const double ours = model.forward(batch.tok.data(), batch.lab.data());
  const double ref = hf_reference_loss_sum(dir.path().string(), batch.tok, batch.lab);
  EXPECT_NEAR(ours, ref, 1e-4 * std::abs(ref)) << "ours " << ours << " reference " << ref;
  // Far from the uniform-prediction loss, so a misplaced tensor could not hide in it.
  EXPECT_GT(std::abs(ref - static_cast<double>(S) * std::log(static_cast<double>(cfg.vocab_size))), 10.0);
}

}  // namespace
}  // namespace pl

namespace pl {
namespace {

struct RunLog {
  int exit_code = -1;
  std::string out, err;
  std::string loss1, grad_norm1;  // iteration 1's "lm loss" and "grad norm" fields, as printed
};

RunLog run_pretrain(std::vector<std::string> args) {
  const std::vector<std::string> common = {"--device", "cpu", "--disable-fp4", "--train-iters", "2", "--global-batch-size", "4",
                                           "--micro-batch-size", "2", "--seq-length", "32", "--threads", "2"};
  args.insert(args.end(), common.begin(), common.end());
  const test::ProcessResult r = test::run_process(PL_APP_PATH, args, 120.0);
  RunLog log{r.exit_code, r.out, r.err, "", ""};
  std::smatch m;
  if (std::regex_search(r.out, m, std::regex(R"(iteration +1/ +2 \|.*? lm loss: (\S+) \|.*? grad norm: (\S+) \|)"))) {
    log.loss1 = m[1];
    log.grad_norm1 = m[2];
  }
  return log;
}

// pretrain_llama --init-from-hf: iteration 1 of a run started from an export of the seed-77
// initialisation prints the loss and grad norm of the seed-77 run itself (iteration 1 reads only
// the BF16 weights, which the BF16 export holds exactly), and not those of another seed.
TEST(HfLlama, CliInitFromHfStartsFromTheExportedWeights) {
  const ModelConfig cfg = hf_llama_tiny();
  TempDir dir;
  const std::string hf_dir = (dir.path() / "tiny_hf").string();
  {
    LlamaModel m(cfg, 2, 32, OpContext{});
    m.init_parameters(77);
    export_hf(m, hf_dir);
  }
  const RunLog seed77 = run_pretrain({"--model", kTinyPath, "--seed", "77"});
  const RunLog seed78 = run_pretrain({"--model", kTinyPath, "--seed", "78"});
  const RunLog from_hf = run_pretrain({"--init-from-hf", hf_dir});
  ASSERT_EQ(seed77.exit_code, 0) << seed77.err;
  ASSERT_EQ(from_hf.exit_code, 0) << from_hf.err;
  ASSERT_FALSE(seed77.loss1.empty()) << seed77.out;
  EXPECT_EQ(from_hf.loss1, seed77.loss1) << from_hf.out;
  EXPECT_EQ(from_hf.grad_norm1, seed77.grad_norm1);
  EXPECT_NE(seed78.loss1, seed77.loss1) << "the comparison must be able to fail";
  EXPECT_NE(from_hf.out.find("config.json, Hugging Face"), std::string::npos) << from_hf.out;
  EXPECT_NE(from_hf.out.find("pretrain_llama | initialized from Hugging Face checkpoint " + hf_dir + " (" +
                             std::to_string(2 + 9 * cfg.num_layers + 1) + " tensors, 0.00 GB, dtype BF16)"),
            std::string::npos)
      << from_hf.out;

  // --model given too: it must agree (it does: the export came from llama_tiny) ...
  const RunLog both = run_pretrain({"--init-from-hf", hf_dir, "--model", kTinyPath});
  EXPECT_EQ(both.exit_code, 0) << both.err;
  EXPECT_EQ(both.loss1, seed77.loss1);
  // ... or the run stops with one line naming the field.
  const RunLog clash = run_pretrain({"--init-from-hf", hf_dir, "--model", "llama_small"});
  EXPECT_EQ(clash.exit_code, 1);
  EXPECT_EQ(test::split_lines(clash.err).size(), 1u) << clash.err;
  EXPECT_NE(clash.err.find("disagree on"), std::string::npos) << clash.err;
  const RunLog missing = run_pretrain({"--init-from-hf", (dir.path() / "nope").string()});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_EQ(test::split_lines(missing.err).size(), 1u) << missing.err;
  EXPECT_NE(missing.err.find("nope"), std::string::npos) << missing.err;
}

}  // namespace
}  // namespace pl
