// pretrain_llama's flags of issue 27: FP8 delayed scaling's overrides of the recipe: Megatron's
// --fp8-amax-history-len, --fp8-amax-compute-algo, --fp8-margin (Megatron-LM read at HEAD: the flags are
// made by megatron/training/arguments.py, _add_transformer_engine_args, from TransformerConfig's fields in
// megatron/core/transformer/transformer_config.py: fp8_amax_history_len int = 1, fp8_amax_compute_algo
// 'most_recent'|'max' = 'most_recent', fp8_margin int = 0; megatron/core/extensions/transformer_engine.py,
// TEDelayedScaling, passes them to TE's DelayedScaling for --fp8-recipe delayed only). Here they override
// the recipe's values and are refused with a recipe that is not delayed scaling (Megatron ignores them).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "model/memory_plan.h"
#include "pretrain_llama.h"

namespace pl::pretrain {

namespace {
constexpr const char* kFp8Flags[3] = {"--fp8-amax-history-len", "--fp8-amax-compute-algo", "--fp8-margin"};
}

void add_fp8_flags(CLI::App& app, Options& o) {
  TrainConfig& t = o.train;
  // Megatron's --fp8-param-gather (megatron/training/arguments.py: "Keep the compute param in fp8 (do not use
  // any other intermediate dtype) and perform the param all-gather in fp8"); Megatron-Bridge's FP8 recipes set
  // it, as ours do. --no-fp8-param-gather turns the recipe's off.
  auto* on = app.add_flag("--fp8-param-gather", o.fp8_param_gather,
                          "FP8 primary weights: the FP8 layers' weights are kept only as FP8, made from the FP32 "
                          "master after each step, no BF16 copy (overrides the recipe's fp8_param_gather)");
  app.add_flag("--no-fp8-param-gather", o.no_fp8_param_gather,
               "keep BF16 weights of the FP8 layers beside their FP8 copies (overrides the recipe's fp8_param_gather)")
      ->excludes(on);
  app.add_option(kFp8Flags[0], t.fp8_amax_history_len,
                 "FP8 delayed scaling: steps of amax history per tensor (overrides the recipe's)");
  app.add_option(kFp8Flags[1], t.fp8_amax_compute_algo,
                 "FP8 delayed scaling: max | most_recent, the amax the scale is computed from (overrides the recipe's)");
  app.add_option(kFp8Flags[2], t.fp8_margin,
                 "FP8 delayed scaling: scale = fp8_max / amax / 2^margin (overrides the recipe's)");
}

void validate_fp8_flags(const Options& o, const CLI::App& app) {
  const TrainConfig& t = o.train;
  PL_CHECK(!app.count(kFp8Flags[0]) || (t.fp8_amax_history_len >= 1 && t.fp8_amax_history_len <= (int64_t{1} << 24)),
           "--fp8-amax-history-len must be in [1, 16777216], got {}", t.fp8_amax_history_len);
  PL_CHECK(!app.count(kFp8Flags[1]) || t.fp8_amax_compute_algo == "max" || t.fp8_amax_compute_algo == "most_recent",
           "--fp8-amax-compute-algo must be max or most_recent, got '{}'", t.fp8_amax_compute_algo);
  PL_CHECK(!app.count(kFp8Flags[2]) || (t.fp8_margin >= 0 && t.fp8_margin <= 64), "--fp8-margin must be in [0, 64], got {}",
           t.fp8_margin);
}

void apply_fp8_flags(const Options& o, const CLI::App& app, RunSetup& s) {
  const TrainConfig& t = o.train;
  PrecisionRecipe& r = s.recipe;
  for (const char* flag : kFp8Flags)
    PL_CHECK(!app.count(flag) || r.delayed_scaling(),
             "{} applies to FP8 delayed scaling only; recipe '{}' is not (use --recipe bf16_with_fp8_delayed_scaling_mixed)",
             flag, r.name);
  if (o.fp8_param_gather || o.no_fp8_param_gather) {
    r.fp8_param_gather = o.fp8_param_gather;
    s.recipe_note += o.fp8_param_gather ? " | --fp8-param-gather" : " | --no-fp8-param-gather";
  }
  if (!r.delayed_scaling()) return;
  // Data parallelism: the amaxes are reduced over the ranks before each update (LlamaModel::
  // update_delayed_scaling, Transformer Engine's reduce_amax).
  if (app.count(kFp8Flags[0])) r.fp8_amax_history_len = t.fp8_amax_history_len;
  if (app.count(kFp8Flags[1])) r.fp8_amax_compute_algo = t.fp8_amax_compute_algo;
  if (app.count(kFp8Flags[2])) r.fp8_margin = t.fp8_margin;
  for (const char* flag : kFp8Flags)
    if (app.count(flag)) s.recipe_note += fmt::format(" | {} {}", flag, app.get_option(flag)->as<std::string>());
}

}  // namespace pl::pretrain

namespace pl::pretrain {

void check_fp8_param_gather(const Options& o, const RunSetup& s) {
  if (!o.fp8_param_gather) return;
  PL_CHECK(std::any_of(s.plan.linears.begin(), s.plan.linears.end(), fp8_primary_weight_linear),
           "--fp8-param-gather keeps FP8 weights, but recipe '{}' has no FP8 layer (use an FP8 or MXFP8 recipe)",
           s.recipe.name);
  const char* off = fp8_primary_weights_off_because(s.plan, run_layout(o, s));
  PL_CHECK(off == nullptr, "--fp8-param-gather cannot be on here: {}; drop one of the two", off ? off : "");
}

std::string fp8_primary_weights_line(const RunSetup& s, const RunLayout& layout) {
  const int64_t fp8 = std::count_if(s.plan.linears.begin(), s.plan.linears.end(), fp8_primary_weight_linear);
  if (fp8 == 0) return "";
  if (!layout.fp8_primary_weights)
    return "FP8 primary weights (fp8_param_gather): off -- the FP8 layers keep BF16 weights beside their FP8 copies";
  if (const char* off = fp8_primary_weights_off_because(s.plan, layout))
    return fmt::format("FP8 primary weights (fp8_param_gather): off -- {}", off);
  int64_t elements = 0;
  for (const LinearPlan& p : s.plan.linears)
    if (fp8_primary_weight_linear(p)) elements += p.in * p.out;
  return fmt::format("FP8 primary weights (fp8_param_gather): on -- the {} FP8 linear layers' weights ({:.2f} B "
                     "parameters) live only as FP8 copies, made from the FP32 master after each step through a "
                     "transient BF16 rounding, one layer at a time (codes and scales as with BF16 weights)",
                     fp8, static_cast<double>(elements) / 1e9);
}

}  // namespace pl::pretrain
