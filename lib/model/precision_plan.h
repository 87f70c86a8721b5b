#pragma once
// Which format each Transformer linear layer runs in, derived from a precision recipe the way
// Megatron does it: the FP8/FP4 autocast wraps whole layers, and first_last_layers_bf16 keeps the
// first num_layers_at_start_in_bf16 and last num_layers_at_end_in_bf16 layers in BF16.
// Embedding, attention core, norms and the LM head are always BF16.
#include <string>
#include <vector>

#include "config/model_config.h"
#include "config/precision_recipe.h"

namespace pl {

enum class LinearFormat { BF16, FP8_CURRENT_SCALING, MXFP8, NVFP4 };
const char* format_name(LinearFormat f);
// Elements per scaling block along a GEMM dimension that the format requires (1 for BF16).
int64_t format_block_multiple(LinearFormat f);

inline constexpr const char* kLinearNames[4] = {"linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"};

struct PrecisionPlan {
  std::string recipe_name;
  std::vector<LinearFormat> layer_format;  // [num_layers]; all four linears of a layer share it
  std::vector<std::string> notes;          // adjustments the banner must state
  Nvfp4Options nvfp4;

  bool all_bf16() const;
  LinearFormat quantized_format() const;   // the non-BF16 format in use (BF16 if none)
  // Human-readable plan, one line per run of layers with the same format.
  std::vector<std::string> describe() const;
};

// Every linear layer in BF16 (the bf16_mixed recipe).
PrecisionPlan bf16_plan(int64_t num_layers);
// Builds the plan and checks the recipe's block rules against the model's linear dimensions; a
// violation is a one-line error naming the model file, the field and the recipe.
PrecisionPlan make_precision_plan(const ModelConfig& model, const PrecisionRecipe& recipe);
// The wgrad GEMM reduces over the tokens of a micro-batch, so they must fill whole blocks too.
void check_tokens_block_rule(const PrecisionPlan& plan, int64_t micro_batch, int64_t seq_length);
// cuBLASLt's FP4 GEMM needs 16-byte rows, so on the GPU every NVFP4 reduction dim (hidden, ffn,
// heads*kv_channels, tokens per micro-batch) must be a multiple of 32, not only 16.
void check_gpu_gemm_rules(const PrecisionPlan& plan, const ModelConfig& model, int64_t micro_batch,
                          int64_t seq_length);

}  // namespace pl
