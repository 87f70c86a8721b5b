// pretrain_llama's banner: the start-up lines that say what runs (model, device, recipe, plan, training,
// data parallelism), and the same facts as values for the JSON-lines log's start line (run_facts). The
// device layer words its own lines (backend/device_info.h); this file adds the prefix. (The summary at the
// end is the text log's: observe/megatron_text_log.)
#include "pretrain_llama.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>

#include "backend/device_info.h"
#include "log/megatron_log.h"
#include "model/accounting.h"
#include "model/llama.h"
#include "train/lr_schedule.h"

#include <nlohmann/json.hpp>

extern "C" char* openblas_get_config(void);

namespace pl::pretrain {

// --print-library-versions: what the device layer reports (backend/device_info.h), then the library
// smoke test on the GPU. Exit 0 when every smoke check passed; 1 without CUDA, without a device, or when a
// check failed (scripts/gpu_check.sh stops there and shows the ✗ lines).
int print_library_versions() {
  const LibraryVersions v = library_versions();
  for (const std::string& line : v.lines) std::printf("pretrain_llama | %s\n", line.c_str());
  if (!v.cuda_backend) return 1;
  std::fflush(stdout);  // the versions stand even if a library aborts the process in the smoke test
  const LibrarySmokeTest smoke = library_smoke_test();
  for (const std::string& line : smoke.lines) std::printf("pretrain_llama | %s\n", line.c_str());
  return smoke.passed ? 0 : 1;
}

void print_model_and_plan(const RunSetup& s, const TrainConfig& t, Device device, int threads, const Logger& out) {
  const ModelConfig& mc = s.mc;
  out->info("pretrain_llama | model {} ({}): {} layers, hidden {}, ffn {}, heads {} ({} kv groups, head dim {}), "
            "vocab {}, {:.3f} M parameters",
            mc.name, s.model_source, mc.num_layers, mc.hidden_size, mc.ffn_hidden_size, mc.num_attention_heads,
            mc.num_query_groups, mc.kv_channels, mc.vocab_size, static_cast<double>(mc.num_parameters()) / 1e6);
  out->info("pretrain_llama | device {} | OpenMP threads {} | BLAS {}", device_name(device), threads,
            openblas_get_config());
  if (device == Device::CPU)
    for (const std::string& line : gemm_banner_lines(OpContext{}, {})) out->info("pretrain_llama | {}", line);
  out->info("pretrain_llama | recipe {} ({}){}{}", s.recipe.name, s.recipe_path, s.recipe_note,
            t.fp32_reference ? " | --fp32-reference: activations kept in FP32" : "");
  out->info("pretrain_llama | precision plan:");
  for (const std::string& line : s.plan.describe()) out->info("pretrain_llama |   {}", line);
  for (const std::string& note : s.plan.notes) out->info("pretrain_llama |   note: {}", note);
  if (device == Device::CPU && !s.plan.all_bf16())
    out->info("pretrain_llama |   note: {} GEMMs are emulated on the cpu (each code expanded exactly with its block "
              "scale, BF16 GEMM with FP32 accumulation, global scales as alpha): the recipe's numerics, not its speed",
              format_name(s.plan.quantized()));
}

// The GPU's state, opened once and owned by the caller: checks what the GPU run needs, applies the
// debugging and determinism switches and prints how each quantized format's GEMM runs.
DeviceStateHandle open_gpu(const RunSetup& s, const TrainConfig& t, OpContext& ctx, const Logger& out) {
  check_gpu_gemm_rules(s.plan, s.mc, t.micro_batch_size, t.seq_length);
  DeviceStateHandle state = open_gpu_for_training(ctx, t.deterministic_mode, t.cuda_sync_every_launch);
  const bool reference_kernels = t.quantize_kernels == "reference";
  use_reference_quantize_kernels(ctx, reference_kernels);
  // One banner line per quantized format of the plan, native or emulated.
  for (const std::string& line : gemm_banner_lines(ctx, s.plan.quantized_formats())) out->info("pretrain_llama |   {}", line);
  if (reference_kernels && !s.plan.quantized_formats().empty())
    out->info("pretrain_llama |   --quantize-kernels reference: the quantize and expand kernels before issue 40 "
              "(the same codes bit for bit, slower)");
  if (t.cuda_sync_every_launch)
    out->info("pretrain_llama |   debug: --cuda-sync-every-launch: the GPU is synchronized after every launch, so "
              "a fault names its op (slow: timings are not representative)");
  return state;
}

void print_training_and_parameters(const ModelConfig& mc, const Options& o, const Logger& out) {
  const TrainConfig& t = o.train;
  out->info("pretrain_llama | training: {} iterations, global batch {} = {} micro-batches x {} samples x {} tokens, "
            "lr {:.3g} -> {:.3g} ({}, warmup {}), seed {}, log interval {}",
            t.train_iters, t.global_batch_size, t.num_micro_batches(), t.micro_batch_size, t.seq_length, t.lr,
            t.min_lr, t.lr_decay_style, t.lr_warmup_fraction ? fmt::format("fraction {}", *t.lr_warmup_fraction)
                                                              : fmt::format("{}", t.warmup_iters),
            t.seed, t.log_interval);
  print_optimizer_and_schedule(mc, o, out);
  print_optimizer_state(t, out);
  const MegatronParamCounts pc = megatron_param_counts(mc);
  // Five lines in one message: the "%v" pattern prints them as they are, each ending in a newline.
  out->info("{}", log::parameter_lines(pc.transformer_layers, pc.embedding_layers, kWeightAndOptimizerBytesPerParam));
  if (const std::optional<LoraConfig> lora = lora_config_of(o)) out->info("pretrain_llama | {}", lora_banner_line(mc, *lora));
  if (const RecomputeConfig rc = recompute_config_of(o, mc); rc.on())
    out->info("pretrain_llama | recompute: granularity full, method {}, num layers {} ({} of {} layers run their forward "
              "again in the backward)",
              rc.method == RecomputeConfig::Method::Uniform ? "uniform" : "block", rc.num_layers,
              rc.recomputed_layers(mc.num_layers), mc.num_layers);
}

// The effective AdamW hyper-parameters and LR / weight-decay schedule (issue 27's flags, or the recipe's
// defaults), as the optimizer and LrSchedule::from_config will use them.
void print_optimizer_and_schedule(const ModelConfig& mc, const Options& o, const Logger& out) {
  const TrainConfig& t = o.train;
  const double exit_minutes = o.outputs.stop.exit_duration_in_mins;
  const LrSchedule s = LrSchedule::from_config(t);
  const std::string wd = s.wd_incr_style == "constant"
                             ? fmt::format("{}", s.end_wd)
                             : fmt::format("{} -> {} ({} over {} iterations)", s.start_wd, s.end_wd, s.wd_incr_style,
                                           t.train_iters);
  out->info("pretrain_llama | optimizer: AdamW beta1 {}, beta2 {}, eps {}, weight decay {} (not on 1-D norm weights), "
            "{}, init std {}",
            t.adam_beta1, t.adam_beta2, t.adam_eps, wd,
            t.clip_grad > 0.0 ? fmt::format("gradients clipped to global norm {}", t.clip_grad)
                              : std::string("no gradient clipping (--clip-grad 0)"),
            mc.init_method_std);
  out->info("pretrain_llama | lr schedule: {} -> {}, {}{}{}", t.lr, t.min_lr, s.describe(t.global_batch_size),
            exit_minutes > 0.0 ? fmt::format(" | exit after {} minutes", exit_minutes) : "",
            t.log_params_norm ? " | params norm logged" : "");
}

// The precision-aware optimizer's one banner line (only when --use-precision-aware-optimizer is given,
// so default logs are unchanged).
void print_optimizer_state(const TrainConfig& t, const Logger& out) {
  if (!t.use_precision_aware_optimizer) return;
  out->info("pretrain_llama | optimizer state (--use-precision-aware-optimizer): main grads {}, master weights {}, "
            "exp_avg {}, exp_avg_sq {} (one rank: its distributed optimizer holds the whole state)",
            t.main_grads_dtype, t.main_params_dtype, t.exp_avg_dtype, t.exp_avg_sq_dtype);
  if (t.optimizer_cpu_offload)
    out->info("pretrain_llama | optimizer CPU offload (--optimizer-cpu-offload, fraction {}): FP32 master weights and "
              "Adam's moments in host memory, AdamW on the host over the shared element math; gradients copied to "
              "the host as each layer's are final in the last micro-batch",
              t.optimizer_offload_fraction);
  if (t.optimizer_cpu_offload && t.overlap_cpu_optimizer_d2h_h2d)
    out->info("pretrain_llama | optimizer overlap (--overlap-cpu-optimizer-d2h-h2d): gradients go down on a "
              "device-to-host stream during the last backward, AdamW runs on a host worker thread chunk by chunk "
              "in the forward's order (embedding, layers 0..L-1, final norm, LM head; chunks from the top whose "
              "gradients are down fill in while the embedding's are still coming), each chunk's weights go up on a "
              "host-to-device stream as soon as it is done; the next forward waits per layer (the host until "
              "that layer's uploads are queued, the compute stream on their events), not for the whole model");
}

// The start-up line of a data-parallel run (only with more than one rank or a data-parallel flag, so
// one-rank logs are unchanged).
void print_data_parallel(const parallel::World& world, const parallel::Communicator& comm, const TrainConfig& t,
                         const LlamaModel& model, size_t buckets, const Logger& out) {
  if (world.size() == 1 && !t.use_distributed_optimizer && !t.overlap_grad_reduce) return;
  const ShardLayout& sh = model.shard();
  out->info("pretrain_llama | data parallel: world size {}, data-parallel size {} ({}), {} micro-batches per rank per "
            "iteration (global batch {} = {} x {} samples x {} ranks), communicator {}",
            world.size(), t.data_parallel_size, world.describe(), t.num_micro_batches(), t.global_batch_size,
            t.num_micro_batches(), t.micro_batch_size, t.data_parallel_size, comm.name());
  out->info("pretrain_llama | data parallel: {}; gradients {} in FP32 (Megatron-Bridge's Llama 3 recipes: "
            "grad_reduce_in_fp32), {}",
            t.use_distributed_optimizer
                ? fmt::format("distributed optimizer: each rank owns {} of {} elements (padded from {}) of the master "
                              "weights and moments",
                              sh.shard, sh.padded, sh.num_params)
                : std::string("every rank holds the whole optimizer state (no --use-distributed-optimizer)"),
            t.use_distributed_optimizer ? "reduce-scattered" : "all-reduced",
            t.overlap_grad_reduce ? fmt::format("in {} bucket(s), each as soon as the last backward has finished it "
                                                "(--overlap-grad-reduce)", buckets)
                                  : std::string("in one bucket after the backward"));
}

// The facts of the banner as the JSON-lines log's "start" line (README "The JSON-lines log").
nlohmann::ordered_json run_facts(const RunFacts& f) {
  using Json = nlohmann::ordered_json;
  const ModelConfig& mc = f.setup.mc;
  const TrainConfig& t = f.o.train;
  const DeviceIdentity id = device_identity(f.ctx);
  Json categories = Json::object();
  const auto cat = f.memory.categories();
  const char* names[] = {"weights", "grads", "master", "optimizer", "activations", "quantized", "workspace"};
  for (size_t i = 0; i < cat.size(); ++i) categories[names[i]] = cat[i];
  return Json{
      {"program", "pretrain_llama"},
      {"timestamp", log::now_timestamp()},
      {"command_line", f.command_line},
      {"model", {{"name", mc.name}, {"source", f.setup.model_source}, {"num_layers", mc.num_layers},
                 {"hidden_size", mc.hidden_size}, {"ffn_hidden_size", mc.ffn_hidden_size},
                 {"num_attention_heads", mc.num_attention_heads}, {"num_query_groups", mc.num_query_groups},
                 {"kv_channels", mc.kv_channels}, {"vocab_size", mc.vocab_size}, {"parameters", mc.num_parameters()}}},
      {"recipe", {{"name", f.setup.recipe.name}, {"file", f.setup.recipe_path}, {"note", f.setup.recipe_note}}},
      {"precision_plan", f.setup.plan.describe()},
      {"quantized_format", format_name(f.setup.plan.quantized())},
      {"device", {{"type", device_name(f.ctx.device)}, {"name", id.name}, {"driver", id.driver}, {"sm", id.sm},
                  {"threads", id.threads}, {"gemm_impl", id.gemm_impl}, {"library_versions", id.library_versions}}},
      {"gemms", observe::gemms_json(gemm_paths(f.ctx, f.setup.plan.quantized_formats()))},
      {"memory_plan", {{"total_bytes", f.memory.total()}, {"host_total_bytes", f.memory.host_total()},
                       {"by_category", categories}}},
      {"training", {{"train_iters", t.train_iters}, {"global_batch_size", t.global_batch_size},
                    {"micro_batch_size", t.micro_batch_size}, {"seq_length", t.seq_length},
                    {"num_micro_batches", t.num_micro_batches()}, {"data_parallel_size", t.data_parallel_size},
                    {"lr", t.lr}, {"min_lr", t.min_lr}, {"lr_decay_style", t.lr_decay_style},
                    {"warmup_iters", t.warmup_iters}, {"seed", t.seed}, {"log_interval", t.log_interval},
                    {"eval_interval", t.eval_interval}, {"eval_iters", t.eval_iters},
                    {"timing_log_level", t.timing_log_level}, {"recompute", recompute_config_of(f.o, mc).describe()}}},
      {"data", f.data_summary}};
}

}  // namespace pl::pretrain
