#pragma once
// The architecture of a Llama-shaped decoder, loaded from configs/models/*.json. Field names follow
// Megatron's TransformerConfig / GPTModelProvider so a Megatron user recognises them.
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>

namespace pl {

// The longest model name a config may give (it is printed in every banner).
inline constexpr size_t kMaxModelNameLength = 256;

struct ModelConfig {
  std::string name;
  std::string file;                 // where it was loaded from (for error messages)
  int64_t num_layers = 0;
  int64_t hidden_size = 0;
  int64_t ffn_hidden_size = 0;
  int64_t num_attention_heads = 0;
  int64_t num_query_groups = 0;     // KV heads
  int64_t kv_channels = 0;          // head dim; defaults to hidden/heads
  int64_t vocab_size = 0;
  int64_t make_vocab_size_divisible_by = 128;
  int64_t seq_length = 0;           // the model's default sequence length (recipe default)
  int64_t max_position_embeddings = 0;
  double rotary_base = 10000.0;
  bool rope_scaling = false;        // Llama 3.1 frequency scaling
  double rope_scaling_factor = 8.0;
  double rope_low_freq_factor = 1.0;
  double rope_high_freq_factor = 4.0;
  int64_t rope_original_max_position = 8192;
  double layernorm_epsilon = 1e-5;
  double init_method_std = 0.02;

  int64_t q_dim() const { return num_attention_heads * kv_channels; }
  int64_t kv_dim() const { return num_query_groups * kv_channels; }
  int64_t qkv_dim() const { return q_dim() + 2 * kv_dim(); }
  // Megatron's calculate_padded_vocab_size with TP=1 (used by the FLOP formula).
  int64_t padded_vocab_size() const;
  // Parameter counts by tensor shapes (what the model allocates).
  int64_t num_parameters() const;
};

// Loads and validates; any problem is a one-line pl::Error naming the file and the field.
ModelConfig load_model_config(const std::string& path);
// The same from JSON already parsed (e.g. the "model" object of a checkpoint's metadata.json); `path`
// names it in errors.
ModelConfig model_config_from_json(const nlohmann::json& j, const std::string& path);
// Checks the relations between fields (heads divide hidden, groups divide heads, ...).
void validate_model_config(const ModelConfig& m);

// Megatron's model-shape flags (--num-layers, --hidden-size, --ffn-hidden-size, --num-attention-heads,
// --num-query-groups, --kv-channels) over a loaded config, e.g. the real Llama-3-8B layer shapes with
// fewer layers so that they fit one GPU. 0 = flag not given.
struct ModelShapeOverrides {
  int64_t num_layers = 0, hidden_size = 0, ffn_hidden_size = 0, num_attention_heads = 0, num_query_groups = 0,
          kv_channels = 0;
  bool any() const;
  std::string describe() const;  // "--num-layers 4 --hidden-size 2048", in flag order
};
// The config with the given fields replaced and validated; errors name the flags. As Megatron derives
// kv_channels = hidden_size / num_attention_heads when --kv-channels is not given, a new hidden size or
// head count recomputes it (unless --kv-channels is given).
ModelConfig apply_shape_overrides(ModelConfig m, const ModelShapeOverrides& o);

}  // namespace pl
