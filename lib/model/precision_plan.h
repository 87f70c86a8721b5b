#pragma once
// make_precision_plan turns a recipe and the model config into the formats of x, W and dy of every
// Transformer linear layer and the rules on them, as Megatron does: the FP8/FP4 autocast wraps whole
// layers; first_last_layers_bf16 keeps the first/last num_layers_at_{start,end}_in_bf16 in BF16.
// Embedding, attention core, norms and the LM head are always BF16. Model, memory plan and banner
// read only the plan.
#include <optional>
#include <string>
#include <vector>

#include "backend/quantize.h"
#include "config/model_config.h"
#include "config/precision_recipe.h"

namespace pl {

inline constexpr const char* kLinearNames[4] = {"linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"};

// One linear layer y[T,out] = x[T,in]·W[out,in]ᵀ: the quantized format of each GEMM operand, or none
// of them (BF16, unquantized), and the switches of its quantization.
struct LinearPlan {
  int64_t in = 0, out = 0;
  std::optional<QuantFormat> x, w, dy;  // all three or none
  bool rht = false;                     // NVFP4: RHT on the wgrad operands (columnwise copies of x and dy)
  bool stochastic_rounding = false;     // NVFP4: stochastic rounding of dy
  bool weight_2d = false;               // NVFP4: 16x16 weight blocks (else 1x16)
  // FP8 delayed scaling (fp8_recipe "delayed"): x, W and dy each quantized with a scale from its own amax
  // history of amax_history_len steps (numerics/delayed_scaling.h); 0 for every other format.
  int64_t amax_history_len = 0;
  bool amax_most_recent = false;  // amax_compute_algo "most_recent" (else "max")
  int64_t margin = 0;
  bool delayed() const { return amax_history_len > 0; }
  // Every GEMM dim must be a multiple of block_multiple (NVFP4 and FP8 16: cuBLASLt FP8 needs 16;
  // MXFP8 32), on the GPU of gpu_multiple (NVFP4 32: cuBLASLt's FP4 rows are 16 bytes); 1 for BF16.
  int64_t block_multiple = 1, gpu_multiple = 1;
  bool quantized() const { return x.has_value(); }
  bool operator==(const LinearPlan&) const = default;
};
// The recipe's name of a linear layer's format, used by the banner and every log line:
// "bf16", "fp8-current-scaling", "fp8-delayed-scaling", "mxfp8" or "nvfp4".
const char* format_name(const LinearPlan& p);

struct PrecisionPlan {
  std::string recipe_name;
  std::vector<LinearPlan> linears;  // [layer*4 + kind], kind indexing kLinearNames
  std::vector<std::string> notes;   // adjustments the banner must state

  int64_t num_layers() const { return static_cast<int64_t>(linears.size()) / 4; }
  const LinearPlan& linear(int64_t layer, int kind) const { return linears[static_cast<size_t>(layer * 4 + kind)]; }
  // The first quantized linear's plan (all quantized linears share formats and rules), else a BF16 one.
  const LinearPlan& quantized() const;
  bool all_bf16() const { return !quantized().quantized(); }
  // The activations' format of each quantized linear, each once, in layer order (the formats whose GEMMs run).
  std::vector<QuantFormat> quantized_formats() const;
  std::vector<std::string> describe() const;  // one line per run of layers with the same formats
};

PrecisionPlan bf16_plan(const ModelConfig& model);  // every linear layer in BF16 (the bf16_mixed recipe)
// Builds the plan and checks the recipe's block rules against the model's linear dimensions; a
// violation is a one-line error naming the model file, the field and the recipe.
PrecisionPlan make_precision_plan(const ModelConfig& model, const PrecisionRecipe& recipe);
// The wgrad GEMM reduces over the tokens of a micro-batch, so they must fill whole blocks too.
void check_tokens_block_rule(const PrecisionPlan& plan, int64_t micro_batch, int64_t seq_length);
// The plan's GPU rule (gpu_multiple) for every reduction dim (hidden, ffn, heads*kv_channels, tokens
// per micro-batch) where it is stricter than the block rule.
void check_gpu_gemm_rules(const PrecisionPlan& plan, const ModelConfig& model, int64_t micro_batch,
                          int64_t seq_length);

}  // namespace pl
