#include "config/precision_recipe.h"

#include "config/json_reader.h"
#include "core/error.h"

namespace pl {

void check_delayed_scaling_fields(const PrecisionRecipe& p,
                                  const std::function<void(const std::string&, const std::string&)>& fail) {
  if (p.fp8_amax_history_len < 1) fail("fp8_amax_history_len", "must be >= 1, got " + std::to_string(p.fp8_amax_history_len));
  // 2^24 floats per tensor would already be 64 MiB of history each.
  if (p.fp8_amax_history_len > (int64_t{1} << 24))
    fail("fp8_amax_history_len", "must be <= 16777216, got " + std::to_string(p.fp8_amax_history_len));
  if (p.fp8_amax_compute_algo != "max" && p.fp8_amax_compute_algo != "most_recent")
    fail("fp8_amax_compute_algo", "must be \"max\" or \"most_recent\", got \"" + p.fp8_amax_compute_algo + "\"");
  // TE's scaled_max = fp8_max * 2^-margin: a negative margin would scale amaxes past the FP8 maximum.
  if (p.fp8_margin < 0 || p.fp8_margin > 64) fail("fp8_margin", "must be in [0, 64], got " + std::to_string(p.fp8_margin));
}

PrecisionRecipe load_precision_recipe(const std::string& path) {
  const nlohmann::json j = read_json_file(path);
  JsonReader r(j, path);
  PrecisionRecipe p;
  p.file = path;
  p.name = r.string("name");
  // bf16 params with fp32 master weights, gradients and moments is the only base this tool implements.
  const std::string base = r.string("mixed_precision", "bf16_mixed");
  if (base != "bf16_mixed") r.fail_field("mixed_precision", "must be \"bf16_mixed\", got \"" + base + "\"");
  p.fp8 = r.nullable_string("fp8");
  p.fp8_recipe = r.string("fp8_recipe", "tensorwise");
  p.fp4 = r.nullable_string("fp4");
  p.fp4_recipe = r.string("fp4_recipe", "nvfp4");
  p.fp8_param_gather = r.boolean("fp8_param_gather", false);
  p.fp4_param_gather = r.boolean("fp4_param_gather", false);
  p.first_last_layers_bf16 = r.boolean("first_last_layers_bf16", false);
  p.num_layers_at_start_in_bf16 = r.integer("num_layers_at_start_in_bf16", 0);
  p.num_layers_at_end_in_bf16 = r.integer("num_layers_at_end_in_bf16", 0);
  p.fp8_amax_history_len = r.integer("fp8_amax_history_len", 1);
  p.fp8_amax_compute_algo = r.string("fp8_amax_compute_algo", "most_recent");
  p.fp8_margin = r.integer("fp8_margin", 0);
  JsonReader n = r.object("nvfp4");
  p.nvfp4.random_hadamard_transform = n.boolean("random_hadamard_transform", true);
  p.nvfp4.stochastic_rounding = n.boolean("stochastic_rounding", true);
  p.nvfp4.weight_2d_quantization = n.boolean("weight_2d_quantization", true);
  n.reject_unknown_keys();
  r.reject_unknown_keys();

  if (p.fp8 && *p.fp8 != "e4m3" && *p.fp8 != "hybrid")
    r.fail_field("fp8", "must be null, \"e4m3\" or \"hybrid\", got \"" + *p.fp8 + "\"");
  if (p.fp8 && p.fp8_recipe != "tensorwise" && p.fp8_recipe != "mxfp8" && p.fp8_recipe != "delayed")
    r.fail_field("fp8_recipe", "must be \"tensorwise\", \"delayed\" or \"mxfp8\" (blockwise scaling is not supported), got \"" +
                                   p.fp8_recipe + "\"");
  check_delayed_scaling_fields(p, [&](const std::string& field, const std::string& why) { r.fail_field(field, why); });
  if (p.fp8 && p.fp8_recipe == "mxfp8" && *p.fp8 != "e4m3")
    r.fail_field("fp8", "must be \"e4m3\" with fp8_recipe \"mxfp8\"");
  if (p.fp4 && *p.fp4 != "e2m1") r.fail_field("fp4", "must be null or \"e2m1\", got \"" + *p.fp4 + "\"");
  if (p.fp4 && p.fp4_recipe != "nvfp4") r.fail_field("fp4_recipe", "must be \"nvfp4\", got \"" + p.fp4_recipe + "\"");
  // Megatron-Bridge's finalize() rejects fp4 together with fp8.
  if (p.fp4 && p.fp8) r.fail_field("fp4", "cannot be combined with fp8 (Megatron-Bridge rejects fp4 + fp8)");
  if (p.num_layers_at_start_in_bf16 < 0) r.fail_field("num_layers_at_start_in_bf16", "must be >= 0");
  if (p.num_layers_at_end_in_bf16 < 0) r.fail_field("num_layers_at_end_in_bf16", "must be >= 0");
  return p;
}

}  // namespace pl
