#include "train/checkpoint_metadata.h"

#include <fmt/format.h>

#include <ctime>
#include <optional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/file_checks.h"
#include "io/json_text.h"
#include "model/linear_layer.h"

namespace pl {
using nlohmann::json;

std::string hex64(uint64_t v) { return fmt::format("0x{:016x}", v); }

namespace {

std::string utc_timestamp() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

json model_json(const ModelConfig& m) {
  return json{{"name", m.name},
              {"file", m.file},
              {"num_layers", m.num_layers},
              {"hidden_size", m.hidden_size},
              {"ffn_hidden_size", m.ffn_hidden_size},
              {"num_attention_heads", m.num_attention_heads},
              {"num_query_groups", m.num_query_groups},
              {"kv_channels", m.kv_channels},
              {"vocab_size", m.vocab_size},
              {"make_vocab_size_divisible_by", m.make_vocab_size_divisible_by},
              {"seq_length", m.seq_length},
              {"max_position_embeddings", m.max_position_embeddings},
              {"rotary_base", m.rotary_base},
              {"rope_scaling", m.rope_scaling},
              {"rope_scaling_factor", m.rope_scaling_factor},
              {"rope_low_freq_factor", m.rope_low_freq_factor},
              {"rope_high_freq_factor", m.rope_high_freq_factor},
              {"rope_original_max_position", m.rope_original_max_position},
              {"layernorm_epsilon", m.layernorm_epsilon},
              {"init_method_std", m.init_method_std}};
}

json state_json(const TrainState& s) {
  return json{{"iteration", s.iteration},
              {"consumed_samples", s.consumed_samples},
              {"scheduler_samples", s.scheduler_samples},
              {"micro_batches_done", s.micro_batches_done},
              {"valid_consumed_samples", s.valid_consumed_samples},
              {"nan_iterations", s.nan_iterations},
              {"consecutive_nan_iterations", s.consecutive_nan},
              {"interval_loss_sum", s.interval_loss},
              {"interval_iterations", s.interval_iters},
              {"interval_good_iterations", s.interval_good},
              {"interval_skipped_iterations", s.interval_skipped},
              {"interval_nan_iterations", s.interval_nan}};
}

TrainState state_from_json(const json& j, const std::string& file) {
  TrainState s;
  s.iteration = json_field<int64_t>(j, "iteration", file);
  s.consumed_samples = json_field<int64_t>(j, "consumed_samples", file);
  s.scheduler_samples = json_field<int64_t>(j, "scheduler_samples", file);
  s.micro_batches_done = json_field<int64_t>(j, "micro_batches_done", file);
  s.valid_consumed_samples = json_field<int64_t>(j, "valid_consumed_samples", file);
  s.nan_iterations = json_field<int64_t>(j, "nan_iterations", file);
  s.consecutive_nan = json_field<int64_t>(j, "consecutive_nan_iterations", file);
  s.interval_loss = json_field<double>(j, "interval_loss_sum", file);
  s.interval_iters = json_field<int64_t>(j, "interval_iterations", file);
  s.interval_good = json_field<int64_t>(j, "interval_good_iterations", file);
  s.interval_skipped = json_field<int64_t>(j, "interval_skipped_iterations", file);
  s.interval_nan = json_field<int64_t>(j, "interval_nan_iterations", file);
  return s;
}

// Issue 27's optimizer and schedule settings (Megatron's scheduler state_dict holds the schedule's; here
// AdamW's too). An unset optional is null.
json optional_json(const std::optional<double>& v) { return v ? json(*v) : json(nullptr); }

json schedule_json(const TrainConfig& t) {
  return json{{"adam_beta1", t.adam_beta1},
              {"adam_beta2", t.adam_beta2},
              {"adam_eps", t.adam_eps},
              {"clip_grad", t.clip_grad},
              {"weight_decay", t.weight_decay},
              {"start_weight_decay", optional_json(t.start_weight_decay)},
              {"end_weight_decay", optional_json(t.end_weight_decay)},
              {"weight_decay_incr_style", t.weight_decay_incr_style},
              {"lr_decay_style", t.lr_decay_style},
              {"lr_decay_iters", t.lr_decay_iters},
              {"lr_warmup_fraction", optional_json(t.lr_warmup_fraction)},
              {"lr_wsd_decay_style", t.lr_wsd_decay_style},
              {"lr_wsd_decay_iters", t.lr_wsd_decay_iters}};
}

// Read back; a checkpoint written before these settings existed has no "schedule" object: it was trained
// with the defaults (the only values there were), which TrainConfig holds.
void schedule_from_json(const json& meta, const std::string& file, TrainConfig& t) {
  if (!meta.contains("schedule")) return;
  const json j = json_field<json>(meta, "schedule", file);
  const auto optional = [&](const char* key) -> std::optional<double> {
    if (j.is_object() && j.contains(key) && j.at(key).is_null()) return std::nullopt;
    return json_field<double>(j, key, file);
  };
  t.adam_beta1 = json_field<double>(j, "adam_beta1", file);
  t.adam_beta2 = json_field<double>(j, "adam_beta2", file);
  t.adam_eps = json_field<double>(j, "adam_eps", file);
  t.clip_grad = json_field<double>(j, "clip_grad", file);
  t.weight_decay = json_field<double>(j, "weight_decay", file);
  t.start_weight_decay = optional("start_weight_decay");
  t.end_weight_decay = optional("end_weight_decay");
  t.weight_decay_incr_style = json_field<std::string>(j, "weight_decay_incr_style", file);
  t.lr_decay_style = json_field<std::string>(j, "lr_decay_style", file);
  t.lr_decay_iters = json_field<int64_t>(j, "lr_decay_iters", file);
  t.lr_warmup_fraction = optional("lr_warmup_fraction");
  t.lr_wsd_decay_style = json_field<std::string>(j, "lr_wsd_decay_style", file);
  t.lr_wsd_decay_iters = json_field<int64_t>(j, "lr_wsd_decay_iters", file);
}

std::string text_of(double v) { return fmt::format("{}", v); }
std::string text_of(const std::string& v) { return v; }
std::string text_of(const std::optional<double>& v) { return v ? fmt::format("{}", *v) : std::string("(not given)"); }

// One line per changed value, naming the flag, saved -> now (Megatron's OptimizerParamScheduler logs each
// value it checks against the checkpoint); the run follows the command line.
void add_schedule_changes(const TrainConfig& saved, const TrainConfig& now, std::vector<std::string>& notes) {
  const auto note = [&](const char* flag, const auto& before, const auto& after) {
    if (before != after)
      notes.push_back(fmt::format("checkpoint saved with {} {}, resuming with {} {} (the command line's value is used)",
                                  flag, text_of(before), flag, text_of(after)));
  };
  note("--adam-beta1", saved.adam_beta1, now.adam_beta1);
  note("--adam-beta2", saved.adam_beta2, now.adam_beta2);
  note("--adam-eps", saved.adam_eps, now.adam_eps);
  note("--clip-grad", saved.clip_grad, now.clip_grad);
  note("--weight-decay", saved.weight_decay, now.weight_decay);
  note("--start-weight-decay", saved.start_weight_decay, now.start_weight_decay);
  note("--end-weight-decay", saved.end_weight_decay, now.end_weight_decay);
  note("--weight-decay-incr-style", saved.weight_decay_incr_style, now.weight_decay_incr_style);
  note("--lr-decay-style", saved.lr_decay_style, now.lr_decay_style);
  // (0: not given, the default span of --train-iters / none.)
  const auto iters = [](int64_t v) { return v > 0 ? std::optional<double>(static_cast<double>(v)) : std::nullopt; };
  note("--lr-decay-iters", iters(saved.lr_decay_iters), iters(now.lr_decay_iters));
  note("--lr-warmup-fraction", saved.lr_warmup_fraction, now.lr_warmup_fraction);
  note("--lr-wsd-decay-style", saved.lr_wsd_decay_style, now.lr_wsd_decay_style);
  note("--lr-wsd-decay-iters", iters(saved.lr_wsd_decay_iters), iters(now.lr_wsd_decay_iters));
}

// metadata.json's "peft" (LoRA checkpoints): the adapters' configuration in Megatron-Bridge's names, the dropout
// masks' seed (the counter is the train state's micro-batches done), and the frozen base's record.
json peft_json(const LoraConfig& c, const LoraBaseRecord& base) {
  return json{{"type", "lora"},
              {"dim", c.dim},
              {"alpha", c.alpha},
              {"dropout", c.dropout},
              {"dropout_position", lora_dropout_position_name(c.dropout_position)},
              {"lora_A_init_method", lora_a_init_name(c.a_init)},
              {"target_modules", lora_target_names(c.targets)},
              {"dropout_seed", kLoraDropoutSeed},
              {"base", json{{"source", base.source}, {"recipe", base.recipe}, {"checksum", hex64(base.checksum)}}}};
}

void peft_from_json(const json& p, const std::string& path, VerifiedCheckpoint& v) {
  PL_CHECK(json_field<std::string>(p, "type", path) == "lora", "{}: peft.type '{}' is not lora", path,
           json_field<std::string>(p, "type", path));
  LoraConfig c;
  c.dim = json_field<int64_t>(p, "dim", path);
  c.alpha = json_field<double>(p, "alpha", path);
  c.dropout = json_field<double>(p, "dropout", path);
  c.dropout_position = parse_lora_dropout_position(json_field<std::string>(p, "dropout_position", path));
  c.a_init = parse_lora_a_init(json_field<std::string>(p, "lora_A_init_method", path));
  c.targets = parse_lora_target_modules(json_field<std::string>(p, "target_modules", path));
  validate_lora_config(c);
  v.lora = c;
  const json b = json_field<json>(p, "base", path);
  v.lora_base.source = json_field<std::string>(b, "source", path);
  v.lora_base.recipe = json_field<std::string>(b, "recipe", path);
  const std::string sum = json_field<std::string>(b, "checksum", path);
  PL_CHECK(sum.size() == 18 && sum.starts_with("0x"), "{}: peft.base.checksum '{}' is not 0x and 16 hex digits", path,
           sum);
  v.lora_base.checksum = std::stoull(sum.substr(2), nullptr, 16);
}

}  // namespace

std::string checkpoint_metadata_text(const TrainState& st, int64_t optimizer_steps, const RunDescription& run,
                                     bool fp8_delayed_scaling) {
  const TrainConfig& t = run.train;
  json j;
  j["format_version"] = kCheckpointFormatVersion;
  j["iteration"] = st.iteration;
  j["timestamp"] = utc_timestamp();
  j["command_line"] = run.command_line;
  j["model"] = model_json(run.model);
  j["recipe"] = json{{"name", run.recipe_name},
                     {"file", run.recipe_file},
                     {"plan", run.plan},
                     {"fp8_delayed_scaling", fp8_delayed_scaling}};
  j["train"] = json{{"train_iters", t.train_iters},   {"warmup_iters", t.warmup_iters},
                    {"global_batch_size", t.global_batch_size}, {"micro_batch_size", t.micro_batch_size},
                    {"seq_length", t.seq_length},     {"lr", t.lr},
                    {"min_lr", t.min_lr},             {"seed", t.seed},
                    {"fp32_reference", t.fp32_reference}, {"eval_interval", t.eval_interval},
                    {"eval_iters", t.eval_iters},     {"data_parallel_size", t.data_parallel_size},
                    {"use_distributed_optimizer", t.use_distributed_optimizer}};
  j["schedule"] = schedule_json(t);
  j["train_state"] = state_json(st);
  j["optimizer"] = json{{"steps_taken", optimizer_steps}};
  j["data"] = json{{"description", run.data},
                   {"consumed_samples", st.consumed_samples},
                   {"consumed_valid_samples", st.valid_consumed_samples}};
  // The only RNG consumed during training is the counter-based Philox of the gradients' stochastic
  // rounding: (seed, counter = micro-batches done) determines every bit it draws next.
  j["rng"] = json{{"stochastic_rounding_seed", LinearLayer::kStochasticRoundingSeed},
                  {"stochastic_rounding_next_counter", st.micro_batches_done},
                  {"init_seed", t.seed}};
  if (run.lora) j["peft"] = peft_json(*run.lora, run.lora_base);
  return j.dump(2) + "\n";
}

std::string checkpoint_manifest_text(int64_t iteration, const std::vector<CheckpointFile>& files) {
  json list = json::array();
  for (const CheckpointFile& f : files) {
    json e{{"name", f.name}, {"dtype", f.dtype}, {"bytes", f.bytes}, {"checksum", hex64(f.checksum)}};
    if (f.dtype != "json") {
      e["shape"] = json::array({f.numel});
      e["numel"] = f.numel;
    }
    list.push_back(e);
  }
  json j{{"format", "pretrain_llama checkpoint"},
         {"format_version", kCheckpointFormatVersion},
         {"iteration", iteration},
         {"checksum", "fnv1a64 x4 lanes per 1 MiB chunk, chunk digests folded in order (lib/core/checksum.h)"},
         {"files", list}};
  return j.dump(2) + "\n";
}

void read_checkpoint_metadata(const std::string& meta_path, const std::string& manifest_path, VerifiedCheckpoint& v) {
  const json meta = parse_json_text(read_regular_file(meta_path), meta_path);
  // The whole model config as saved (validated like a configs/models file; "file" names where the
  // run loaded it from).
  json m = json_field<json>(meta, "model", meta_path);
  PL_CHECK(m.is_object(), "{}: 'model' is not an object", meta_path);
  m.erase("file");
  v.model = model_config_from_json(m, meta_path + " (model)");
  const json recipe = json_field<json>(meta, "recipe", meta_path);
  v.recipe_name = json_field<std::string>(recipe, "name", meta_path);
  if (recipe.contains("fp8_delayed_scaling")) v.fp8_delayed_scaling = json_field<bool>(recipe, "fp8_delayed_scaling", meta_path);
  const json t = json_field<json>(meta, "train", meta_path);
  v.train.train_iters = json_field<int64_t>(t, "train_iters", meta_path);
  v.train.warmup_iters = json_field<int64_t>(t, "warmup_iters", meta_path);
  v.train.global_batch_size = json_field<int64_t>(t, "global_batch_size", meta_path);
  v.train.micro_batch_size = json_field<int64_t>(t, "micro_batch_size", meta_path);
  v.train.seq_length = json_field<int64_t>(t, "seq_length", meta_path);
  v.train.lr = json_field<double>(t, "lr", meta_path);
  v.train.min_lr = json_field<double>(t, "min_lr", meta_path);
  // (Absent before data parallelism: one rank.)
  if (t.contains("data_parallel_size")) v.train.data_parallel_size = json_field<int64_t>(t, "data_parallel_size", meta_path);
  schedule_from_json(meta, meta_path, v.train);
  v.state = state_from_json(json_field<json>(meta, "train_state", meta_path), meta_path);
  v.optimizer_steps = json_field<int64_t>(json_field<json>(meta, "optimizer", meta_path), "steps_taken", meta_path);
  if (meta.contains("command_line")) v.command_line = json_field<std::vector<std::string>>(meta, "command_line", meta_path);
  if (meta.contains("peft")) peft_from_json(json_field<json>(meta, "peft", meta_path), meta_path, v);
  PL_CHECK(v.state.iteration == v.iteration, "{}: iteration {} but {} says {}", meta_path,
           v.state.iteration, manifest_path, v.iteration);
}

void check_checkpoint_peft(const VerifiedCheckpoint& c, const std::optional<LoraConfig>& run, bool finetune) {
  if (c.lora) {
    PL_CHECK(run.has_value(),
             "--load {}: a LoRA checkpoint (adapters of dim {} on {} over the base '{}'): resume it with --peft lora "
             "and that base",
             c.path, c.lora->dim, lora_target_names(c.lora->targets), c.lora_base.source);
    PL_CHECK(run->dim == c.lora->dim && run->targets == c.lora->targets,
             "--load {}: its adapters are dim {} on {}, this run's --lora-dim {} on {}", c.path, c.lora->dim,
             lora_target_names(c.lora->targets), run->dim, lora_target_names(run->targets));
    return;
  }
  PL_CHECK(!run.has_value() || finetune,
           "--peft lora --load {}: a checkpoint of every parameter; to train adapters over it as the frozen base give "
           "--finetune (its weights only)",
           c.path);
}

std::vector<std::string> compare_checkpoint_with_run(const VerifiedCheckpoint& c, const ModelConfig& m,
                                                     const std::string& recipe_name, const TrainConfig& t) {
  const std::pair<const char*, std::pair<int64_t, int64_t>> shape[] = {
      {"num_layers", {c.model.num_layers, m.num_layers}},
      {"hidden_size", {c.model.hidden_size, m.hidden_size}},
      {"ffn_hidden_size", {c.model.ffn_hidden_size, m.ffn_hidden_size}},
      {"num_attention_heads", {c.model.num_attention_heads, m.num_attention_heads}},
      {"num_query_groups", {c.model.num_query_groups, m.num_query_groups}},
      {"kv_channels", {c.model.kv_channels, m.kv_channels}},
      {"vocab_size", {c.model.vocab_size, m.vocab_size}},
  };
  for (const auto& [name, v] : shape)
    PL_CHECK(v.first == v.second, "--load {}: the checkpoint's model has {} {} but --model {} has {}", c.path, name,
             v.first, m.name, v.second);

  std::vector<std::string> notes;
  if (c.recipe_name != recipe_name)
    notes.push_back(fmt::format("checkpoint saved with recipe {}, resuming with recipe {}", c.recipe_name, recipe_name));
  const std::pair<const char*, std::pair<int64_t, int64_t>> flags[] = {
      {"--global-batch-size", {c.train.global_batch_size, t.global_batch_size}},
      {"--micro-batch-size", {c.train.micro_batch_size, t.micro_batch_size}},
      {"--seq-length", {c.train.seq_length, t.seq_length}},
      {"--train-iters", {c.train.train_iters, t.train_iters}},
      {"--warmup-iters", {c.train.warmup_iters, t.warmup_iters}},
  };
  for (const auto& [flag, v] : flags)
    if (v.first != v.second)
      notes.push_back(fmt::format("checkpoint saved with {} {}, resuming with {} (data continues at consumed sample {})",
                                  flag, v.first, v.second, c.state.consumed_samples));
  if (c.train.data_parallel_size != t.data_parallel_size)
    notes.push_back(fmt::format("checkpoint saved by {} data-parallel ranks, resuming with {} (the files do not depend "
                                "on the rank count; data continues at consumed sample {})",
                                c.train.data_parallel_size, t.data_parallel_size, c.state.consumed_samples));
  // The moments' dtypes (the precision-aware optimizer's): the manifest names each file in its dtype.
  auto saved_dtype = [&](const std::string& stem) {
    for (const CheckpointFile& f : c.files)
      if (f.name == stem + "_bf16.bin") return std::string("bf16");
    return std::string("fp32");
  };
  const std::string saved_m = saved_dtype("adam_m"), saved_v = saved_dtype("adam_v");
  if (saved_m != t.exp_avg_dtype || saved_v != t.exp_avg_sq_dtype)
    notes.push_back(fmt::format("checkpoint saved with optimizer state exp_avg {}, exp_avg_sq {}; this run keeps "
                                "exp_avg {}, exp_avg_sq {}: converted on load (bf16 -> fp32 exact, fp32 -> bf16 "
                                "round-to-nearest-even)",
                                saved_m, saved_v, t.exp_avg_dtype, t.exp_avg_sq_dtype));
  if (c.train.lr != t.lr || c.train.min_lr != t.min_lr)
    notes.push_back(fmt::format("checkpoint saved with --lr {} --min-lr {}, resuming with --lr {} --min-lr {}",
                                c.train.lr, c.train.min_lr, t.lr, t.min_lr));
  add_schedule_changes(c.train, t, notes);
  return notes;
}

}  // namespace pl
