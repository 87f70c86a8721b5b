// pretrain_llama's LoRA flags (issue 41), Megatron-Bridge's LoRA PEFT config under NeMo 2 / Megatron-Bridge's
// names (peft/lora.py: dim, alpha, dropout, dropout_position, lora_A_init_method, target_modules; the command line
// spells them --lora-*), validated into config/lora_config.h's LoraConfig, and the flags LoRA cannot serve yet.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "core/error.h"
#include "pretrain_llama.h"

namespace pl::pretrain {

namespace {
constexpr const char* kLoraFlags[] = {"--lora-dim", "--lora-alpha", "--lora-dropout", "--lora-dropout-position",
                                      "--lora-a-init", "--lora-target-modules"};
}  // namespace

void add_lora_flags(CLI::App& app, Options& o) {
  app.add_option("--peft", o.peft,
                 "Parameter-efficient fine-tuning: none (every parameter trains) or lora (adapters on a frozen base "
                 "kept in the recipe's format)")
      ->capture_default_str();
  app.add_option("--lora-dim", o.lora.dim, "LoRA rank (Megatron-Bridge's dim)")->capture_default_str();
  app.add_option("--lora-alpha", o.lora.alpha, "LoRA alpha: the adapter's output is scaled by alpha/dim")
      ->capture_default_str();
  app.add_option("--lora-dropout", o.lora.dropout, "Dropout probability on the adapter, in [0, 1)")
      ->capture_default_str();
  app.add_option("--lora-dropout-position", o.lora_dropout_position,
                 "pre (on the adapter's input, before A) or post (on its output, before the alpha/dim scaling)")
      ->capture_default_str();
  app.add_option("--lora-a-init", o.lora_a_init, "A's initialisation: xavier (normal) or kaiming (uniform); B is zero")
      ->capture_default_str();
  app.add_option("--lora-target-modules", o.lora_target_modules,
                 "Linear layers with an adapter: Megatron's names (linear_qkv,linear_proj,linear_fc1,linear_fc2), "
                 "all-linear, or Hugging Face projections in whole fused groups (q_proj,k_proj,v_proj; o_proj; "
                 "gate_proj,up_proj; down_proj)")
      ->capture_default_str();
}

std::optional<LoraConfig> lora_config_of(const Options& o) {
  if (o.peft != "lora") return std::nullopt;
  LoraConfig c = o.lora;
  c.dropout_position = parse_lora_dropout_position(o.lora_dropout_position);
  c.a_init = parse_lora_a_init(o.lora_a_init);
  c.targets = parse_lora_target_modules(o.lora_target_modules);
  validate_lora_config(c);
  return c;
}

void validate_lora_flags(const Options& o, const CLI::App& app) {
  PL_CHECK(o.peft == "none" || o.peft == "lora", "--peft must be none or lora, got '{}'", o.peft);
  if (o.peft != "lora") {
    for (const char* flag : kLoraFlags) PL_CHECK(!app.count(flag), "{} needs --peft lora", flag);
    return;
  }
  (void)lora_config_of(o);  // each LoRA flag's own rule: one line naming it
  const TrainConfig& t = o.train;
  // What LoRA does not serve yet, each refused in one line before anything is built or written.
  const std::pair<bool, const char*> refused[] = {
      {t.optimizer_cpu_offload, "--optimizer-cpu-offload (the adapters' optimizer state is small: keep it on the device)"},
      {t.overlap_cpu_optimizer_d2h_h2d, "--overlap-cpu-optimizer-d2h-h2d (it needs the optimizer offload)"},
      {t.main_grads_dtype == "bf16", "--main-grads-dtype bf16 (the adapters' gradients stay FP32)"},
      {t.overlap_param_gather, "--overlap-param-gather (the adapters' all-gather is not overlapped with the forward)"},
      {app.count("--fp8-param-gather") > 0, "--fp8-param-gather (the frozen base keeps no master weights to gather)"},
  };
  for (const auto& [given, what] : refused) PL_CHECK(!given, "--peft lora cannot be combined with {}", what);
}

std::string lora_banner_line(const ModelConfig& mc, const LoraConfig& c) {
  const int64_t trainable = lora_parameter_count(mc, c);
  return fmt::format(
      "LoRA (--peft lora): adapters on {} of every layer, dim {}, alpha {} (scale {}), dropout {} ({}), A init {}, "
      "B zero | trainable parameters {} ({:.2f}% of {}); the base is frozen in the recipe's format",
      lora_target_names(c.targets), c.dim, c.alpha, c.scale(), c.dropout, lora_dropout_position_name(c.dropout_position),
      lora_a_init_name(c.a_init), trainable,
      100.0 * static_cast<double>(trainable) / static_cast<double>(mc.num_parameters()), mc.num_parameters());
}

}  // namespace pl::pretrain
