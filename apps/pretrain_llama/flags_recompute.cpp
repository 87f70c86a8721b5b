// pretrain_llama's activation recomputation flags (issue 42), Megatron's names and meanings
// (megatron/training/arguments.py: --recompute-granularity, --recompute-method, --recompute-num-layers), resolved
// into config/recompute_config.h's RecomputeConfig. Megatron asks for a method and a count with full granularity;
// here `--recompute-granularity full` alone is uniform 1 (the old `--recompute full`, kept as an alias).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "core/error.h"
#include "pretrain_llama.h"

namespace pl::pretrain {

void add_recompute_flags(CLI::App& app, Options& o) {
  app.add_option("--recompute", o.recompute,
                 "none | full: the alias of --recompute-granularity full (uniform, 1 layer per chunk)")
      ->capture_default_str();
  app.add_option("--recompute-granularity", o.recompute_granularity,
                 "full: keep only the input of the recomputed layers and run their forward again in the backward "
                 "(selective, the attention core only, is not built)");
  app.add_option("--recompute-method", o.recompute_method,
                 "uniform: the layers in chunks of --recompute-num-layers, each chunk's input kept, every layer "
                 "recomputed; block: the first --recompute-num-layers layers recomputed, the rest keep their "
                 "activations (default uniform)");
  app.add_option("--recompute-num-layers", o.recompute_num_layers,
                 "uniform: layers per recomputed chunk (default 1); block: how many of the first layers are "
                 "recomputed");
}

void validate_recompute_flags(const Options& o, const CLI::App& app) {
  PL_CHECK(o.recompute == "none" || o.recompute == "full", "--recompute must be none or full, got '{}'", o.recompute);
  const bool granularity = app.count("--recompute-granularity") > 0;
  if (granularity) {
    PL_CHECK(o.recompute_granularity != "selective",
             "--recompute-granularity selective (the attention core only) is not built; use full with "
             "--recompute-method uniform|block and --recompute-num-layers N");
    PL_CHECK(o.recompute_granularity == "full", "--recompute-granularity must be full, got '{}'",
             o.recompute_granularity);
    PL_CHECK(!(app.count("--recompute") && o.recompute == "none"),
             "--recompute none contradicts --recompute-granularity full");
  }
  const bool full = granularity || o.recompute == "full";
  for (const char* flag : {"--recompute-method", "--recompute-num-layers"})
    PL_CHECK(!app.count(flag) || full, "{} {} needs --recompute-granularity full", flag,
             app.get_option(flag)->as<std::string>());
  if (app.count("--recompute-method"))
    PL_CHECK(o.recompute_method == "uniform" || o.recompute_method == "block",
             "--recompute-method must be uniform or block, got '{}'", o.recompute_method);
  if (app.count("--recompute-num-layers"))
    PL_CHECK(o.recompute_num_layers >= 1, "--recompute-num-layers must be >= 1, got {}", o.recompute_num_layers);
  PL_CHECK(o.recompute_method != "block" || app.count("--recompute-num-layers"),
           "--recompute-method block needs --recompute-num-layers N (the first N layers are recomputed)");
}

RecomputeConfig recompute_config_of(const Options& o, const ModelConfig& mc) {
  if (o.recompute_granularity.empty() && o.recompute != "full") return {};
  const int64_t n = o.recompute_num_layers > 0 ? o.recompute_num_layers : 1;
  PL_CHECK(n <= mc.num_layers, "--recompute-num-layers {} is beyond the model's {} layers", n, mc.num_layers);
  return {o.recompute_method == "block" ? RecomputeConfig::Method::Block : RecomputeConfig::Method::Uniform, n};
}

}  // namespace pl::pretrain
