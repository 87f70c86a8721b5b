#include "config/model_config.h"

#include <fmt/format.h>

#include <cmath>
#include <string_view>

#include "config/json_reader.h"
#include "core/checked_math.h"
#include "core/error.h"

namespace pl {

int64_t ModelConfig::padded_vocab_size() const {
  const int64_t d = make_vocab_size_divisible_by;
  return checked_mul((checked_add(vocab_size, d - 1, "the padded vocabulary size")) / d, d, "the padded vocabulary size");
}

int64_t ModelConfig::num_parameters() const {
  // Checked (core/checked_math.h): a config's sizes are user input, and every other size of the model is
  // bounded by this count once it has been computed without overflow (validate_model_config does).
  const int64_t h = hidden_size;
  constexpr std::string_view what = "the parameter count";
  int64_t per_layer = checked_mul(2, h, what);                                                 // two RMSNorm weights
  per_layer = checked_add(per_layer, checked_mul(qkv_dim(), h, what), what);                   // linear_qkv
  per_layer = checked_add(per_layer, checked_mul(h, q_dim(), what), what);                     // linear_proj
  per_layer = checked_add(per_layer, checked_product({3, ffn_hidden_size, h}, what), what);   // fc1 (gate|up), fc2
  const int64_t layers = checked_mul(num_layers, per_layer, what);
  // + the final norm + the untied embedding and LM head (padded vocabulary rows are not parameters)
  return checked_add(checked_add(layers, h, what), checked_product({2, vocab_size, h}, what), what);
}

ModelConfig load_model_config(const std::string& path) { return model_config_from_json(read_json_file(path), path); }

ModelConfig model_config_from_json(const nlohmann::json& j, const std::string& path) {
  JsonReader r(j, path);
  ModelConfig m;
  m.file = path;
  m.name = r.string("name");
  m.num_layers = r.integer("num_layers");
  m.hidden_size = r.integer("hidden_size");
  m.ffn_hidden_size = r.integer("ffn_hidden_size");
  m.num_attention_heads = r.integer("num_attention_heads");
  m.num_query_groups = r.integer("num_query_groups", m.num_attention_heads);
  m.kv_channels = r.integer("kv_channels", m.num_attention_heads > 0 ? m.hidden_size / m.num_attention_heads : 0);
  m.vocab_size = r.integer("vocab_size");
  m.make_vocab_size_divisible_by = r.integer("make_vocab_size_divisible_by", 128);
  m.seq_length = r.integer("seq_length");
  m.max_position_embeddings = r.integer("max_position_embeddings", m.seq_length);
  m.rotary_base = r.number("rotary_base");
  m.rope_scaling = r.boolean("rope_scaling", false);
  m.rope_scaling_factor = r.number("rope_scaling_factor", 8.0);
  m.rope_low_freq_factor = r.number("rope_low_freq_factor", 1.0);
  m.rope_high_freq_factor = r.number("rope_high_freq_factor", 4.0);
  m.rope_original_max_position = r.integer("rope_original_max_position", 8192);
  m.layernorm_epsilon = r.number("layernorm_epsilon", 1e-5);
  m.init_method_std = r.number("init_method_std", 0.02);
  r.reject_unknown_keys();
  validate_model_config(m);
  return m;
}

void validate_model_config(const ModelConfig& m) {
  const std::string& f = m.file;
  auto positive = [&](const char* field, int64_t v) {
    PL_CHECK(v > 0, "{}: field '{}' must be positive, got {}", f, field, v);
  };
  positive("num_layers", m.num_layers);
  positive("hidden_size", m.hidden_size);
  positive("ffn_hidden_size", m.ffn_hidden_size);
  positive("num_attention_heads", m.num_attention_heads);
  positive("num_query_groups", m.num_query_groups);
  positive("kv_channels", m.kv_channels);
  positive("vocab_size", m.vocab_size);
  positive("make_vocab_size_divisible_by", m.make_vocab_size_divisible_by);
  positive("seq_length", m.seq_length);
  // The name is echoed into every log's banner: a short printable string.
  PL_CHECK(!m.name.empty() && m.name.size() <= kMaxModelNameLength, "{}: field 'name' must be 1 to {} characters, got {}",
           f, kMaxModelNameLength, m.name.size());
  for (const char c : m.name)
    PL_CHECK(static_cast<unsigned char>(c) >= 0x20 && c != 0x7f,
             "{}: field 'name' holds a control character (code {})", f, static_cast<int>(static_cast<unsigned char>(c)));
  PL_CHECK(m.hidden_size % m.num_attention_heads == 0,
           "{}: field 'num_attention_heads' = {} does not divide hidden_size = {}", f, m.num_attention_heads,
           m.hidden_size);
  PL_CHECK(m.num_attention_heads % m.num_query_groups == 0,
           "{}: field 'num_query_groups' = {} does not divide num_attention_heads = {}", f, m.num_query_groups,
           m.num_attention_heads);
  PL_CHECK(m.kv_channels % 2 == 0, "{}: field 'kv_channels' = {} must be even for rotary embeddings", f,
           m.kv_channels);
  PL_CHECK(m.vocab_size >= 2, "{}: field 'vocab_size' must be at least 2 (one id is the end-of-document)", f);
  PL_CHECK(m.rotary_base > 1.0, "{}: field 'rotary_base' must be > 1, got {}", f, m.rotary_base);
  // The kernels compute in FP32: a value that is positive as a double but 0 or inf as a float would be
  // silently different from what the config says.
  auto positive_finite_f32 = [&](const char* field, double v) {
    const float x = static_cast<float>(v);
    PL_CHECK(std::isfinite(v) && x > 0.0f && std::isfinite(x) && std::isnormal(x),
             "{}: field '{}' must be a positive normal FP32 number (about 1.2e-38 to 3.4e38), got {}", f, field, v);
  };
  positive_finite_f32("layernorm_epsilon", m.layernorm_epsilon);
  positive_finite_f32("init_method_std", m.init_method_std);
  positive_finite_f32("rotary_base", m.rotary_base);
  // Every size derived from the shape must fit int64 (num_parameters is checked and bounds the rest).
  const std::string qkv = fmt::format("{}: (num_attention_heads + 2 x num_query_groups) x kv_channels", f);
  (void)checked_mul(checked_add(m.num_attention_heads, checked_mul(2, m.num_query_groups, qkv), qkv), m.kv_channels, qkv);
  try {
    (void)m.num_parameters();
  } catch (const Error& e) {
    fail("{}: {}", f, e.what());
  }
  (void)checked_mul(m.padded_vocab_size(), m.hidden_size, fmt::format("{}: vocabulary x hidden size", f));
  if (m.rope_scaling) {
    PL_CHECK(m.rope_scaling_factor >= 1.0, "{}: field 'rope_scaling_factor' must be >= 1", f);
    PL_CHECK(m.rope_high_freq_factor > m.rope_low_freq_factor,
             "{}: field 'rope_high_freq_factor' must exceed rope_low_freq_factor", f);
    positive("rope_original_max_position", m.rope_original_max_position);
  }
}

bool ModelShapeOverrides::any() const {
  return num_layers || hidden_size || ffn_hidden_size || num_attention_heads || num_query_groups || kv_channels;
}

std::string ModelShapeOverrides::describe() const {
  std::string s;
  auto add = [&](const char* flag, int64_t v) {
    if (v != 0) s += fmt::format("{}{} {}", s.empty() ? "" : " ", flag, v);
  };
  add("--num-layers", num_layers);
  add("--hidden-size", hidden_size);
  add("--ffn-hidden-size", ffn_hidden_size);
  add("--num-attention-heads", num_attention_heads);
  add("--num-query-groups", num_query_groups);
  add("--kv-channels", kv_channels);
  return s;
}

ModelConfig apply_shape_overrides(ModelConfig m, const ModelShapeOverrides& o) {
  if (!o.any()) return m;
  auto take = [](int64_t& field, int64_t v, const char* flag) {
    PL_CHECK(v >= 0, "{} must be positive, got {}", flag, v);
    if (v > 0) field = v;
  };
  take(m.num_layers, o.num_layers, "--num-layers");
  take(m.hidden_size, o.hidden_size, "--hidden-size");
  take(m.ffn_hidden_size, o.ffn_hidden_size, "--ffn-hidden-size");
  take(m.num_attention_heads, o.num_attention_heads, "--num-attention-heads");
  take(m.num_query_groups, o.num_query_groups, "--num-query-groups");
  take(m.kv_channels, o.kv_channels, "--kv-channels");
  if (o.kv_channels == 0 && (o.hidden_size > 0 || o.num_attention_heads > 0))
    m.kv_channels = m.hidden_size / m.num_attention_heads;
  m.file = fmt::format("{} with {}", m.file, o.describe());
  validate_model_config(m);
  return m;
}

}  // namespace pl
