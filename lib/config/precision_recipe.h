#pragma once
// A precision recipe, loaded from configs/recipes/*.json. Field names follow Megatron-Bridge's
// MixedPrecisionConfig (fp8, fp8_recipe, fp4, fp4_recipe, first_last_layers_bf16,
// num_layers_at_start_in_bf16, num_layers_at_end_in_bf16), plus the NVFP4 switches that TE exposes
// as NVTE_NVFP4_DISABLE_{RHT,STOCHASTIC_ROUNDING,2D_QUANTIZATION}.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace pl {

struct Nvfp4Options {
  bool random_hadamard_transform = true;  // RHT on the wgrad operands (columnwise copies)
  bool stochastic_rounding = true;        // SR on gradient tensors
  bool weight_2d_quantization = true;     // 16x16 weight blocks (else 1x16)
};

struct PrecisionRecipe {
  std::string name;
  std::string file;
  std::optional<std::string> fp8;         // null | "e4m3" | "hybrid"
  std::string fp8_recipe = "tensorwise";  // "tensorwise" (current scaling) | "mxfp8" | "delayed"
  std::optional<std::string> fp4;         // null | "e2m1"
  std::string fp4_recipe = "nvfp4";
  bool fp8_param_gather = false;          // accepted for Bridge compatibility; single node: no effect
  bool fp4_param_gather = false;
  bool first_last_layers_bf16 = false;
  int64_t num_layers_at_start_in_bf16 = 0;
  int64_t num_layers_at_end_in_bf16 = 0;
  Nvfp4Options nvfp4;
  // fp8_recipe "delayed" (TE's DelayedScaling): Megatron-Bridge's MixedPrecisionConfig fields, with its
  // defaults (history 1, "most_recent", margin 0); Megatron's --fp8-amax-history-len,
  // --fp8-amax-compute-algo and --fp8-margin override them.
  int64_t fp8_amax_history_len = 1;
  std::string fp8_amax_compute_algo = "most_recent";  // "max" | "most_recent"
  int64_t fp8_margin = 0;
  bool delayed_scaling() const { return fp8.has_value() && fp8_recipe == "delayed"; }
};

// The delayed-scaling fields' rules (history length >= 1, algo max|most_recent, margin in [0, 64]): a
// one-line error through `fail(field, why)`, shared by the loader and the flags.
void check_delayed_scaling_fields(const PrecisionRecipe& p,
                                  const std::function<void(const std::string&, const std::string&)>& fail);

PrecisionRecipe load_precision_recipe(const std::string& path);

}  // namespace pl
