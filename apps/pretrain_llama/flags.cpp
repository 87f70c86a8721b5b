// pretrain_llama's flags: their definitions (Megatron's names where Megatron has the flag) and the rules
// CLI11 cannot express, then what they resolve to (the model, the recipe and its plan) before any device
// is touched.
#include "pretrain_llama.h"

#include <CLI/CLI.hpp>

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <tuple>

#include "../app_main.h"
#include "config/paths.h"
#include "data/tokenizer_record.h"
#include "io/file_checks.h"
#include "model/hf_llama.h"
#include "observe/jsonl_log.h"
#include "roofline/machine_ceilings.h"

namespace pl::pretrain {

namespace {

// What is trained: the batch, the model (its config and Megatron's shape overrides), the precision recipe.
void add_model_and_recipe_flags(CLI::App& app, Options& o) {
  TrainConfig& t = o.train;
  app.add_flag("--disable-fp4", o.disable_fp4, "Run the BF16 baseline: switches the recipe to bf16_mixed");
  app.add_option("--train-iters", t.train_iters, "Number of training iterations")->capture_default_str();
  app.add_option("--warmup-iters", t.warmup_iters, "Learning-rate warmup iterations (linear from 0)")
      ->capture_default_str();
  app.add_option("--global-batch-size", t.global_batch_size, "Samples per iteration (all micro-batches)")
      ->capture_default_str();
  app.add_option("--micro-batch-size", t.micro_batch_size, "Samples per forward/backward pass")
      ->capture_default_str();
  app.add_option("--seq-length", t.seq_length, "Tokens per sample")->capture_default_str();
  app.add_option("--model", o.model, "Model config: a name in configs/models/ or a path to a .json")
      ->capture_default_str();
  app.add_option("--num-layers", o.shape.num_layers, "Override the model config's num_layers (Megatron's flag)");
  app.add_option("--hidden-size", o.shape.hidden_size, "Override the model config's hidden_size");
  app.add_option("--ffn-hidden-size", o.shape.ffn_hidden_size, "Override the model config's ffn_hidden_size");
  app.add_option("--num-attention-heads", o.shape.num_attention_heads,
                 "Override the model config's num_attention_heads (kv_channels becomes hidden/heads unless "
                 "--kv-channels is given)");
  app.add_option("--num-query-groups", o.shape.num_query_groups, "Override the model config's num_query_groups (KV heads)");
  app.add_option("--kv-channels", o.shape.kv_channels, "Override the model config's kv_channels (head dim)");
  app.add_option("--num-layers-at-start-in-bf16", o.bf16_layers_at_start,
                 "Override the recipe's num_layers_at_start_in_bf16 (turns first_last_layers_bf16 on)");
  app.add_option("--num-layers-at-end-in-bf16", o.bf16_layers_at_end,
                 "Override the recipe's num_layers_at_end_in_bf16 (turns first_last_layers_bf16 on; 0 quantizes "
                 "the last layers too)");
  app.add_option("--recipe", o.recipe, "Precision recipe: a name in configs/recipes/ or a path to a .json")
      ->capture_default_str();
}

// The schedule, the device and threads, the initialisation.
void add_training_flags(CLI::App& app, Options& o) {
  TrainConfig& t = o.train;
  app.add_option("--device", t.device, "auto | cpu | cuda")->capture_default_str();
  app.add_option("--seed", t.seed, "Seed of the parameter initialisation")
      ->capture_default_str();
  app.add_option("--lr", t.lr, "Peak learning rate")->capture_default_str();
  app.add_option("--min-lr", t.min_lr, "Final learning rate of the cosine decay")->capture_default_str();
  app.add_option("--log-interval", t.log_interval, "Iterations per log line")->capture_default_str();
  app.add_option("--threads", t.threads, "CPU threads for OpenMP and OpenBLAS (0 = all cores)")
      ->capture_default_str();
  app.add_option("--max-nan-iterations", o.outputs.stop.max_consecutive_nan_iterations,
                 "Stop after this many consecutive iterations with a non-finite loss or grad norm")
      ->capture_default_str();
  app.add_option("--log-quant-stats-interval", o.outputs.quant_stats_interval,
                 "Every N iterations, one 'quant stats' line per quantized linear layer and operand: amax, "
                 "saturated fraction, underflowed-block fraction, relative error (0 = off)")
      ->capture_default_str();
  app.add_option("--init-from-hf", o.init_from_hf,
                 "Start from a Hugging Face Llama directory (config.json + safetensors): the model config comes "
                 "from its config.json (--model, if also given, must agree on every shape field) and its weights "
                 "replace the random initialisation");
}

// --dry-run, the checkpoints (Megatron's save/load flags) and the data (Megatron's dataset flags).
void add_checkpoint_and_data_flags(CLI::App& app, Options& o) {
  TrainConfig& t = o.train;
  app.add_flag("--dry-run", o.dry_run,
               "Print the memory plan (GB per category and total) and a fit table (which GPUs it fits, and the "
               "cheapest flags that make it fit where it does not) and exit; touches no GPU");
  app.add_option("--dry-run-gpu", o.dry_run_gpu,
                 "With --dry-run: plan for this GPU (its compute capability) and name the cheapest flags that "
                 "fit it: " + known_gpu_keys());
  app.add_option("--save", o.save, "Directory to save checkpoints in (DIR/iter_0000010/, "
                 "DIR/latest_checkpointed_iteration.txt); the last iteration run is always saved");
  app.add_option("--save-interval", o.save_interval, "Also save every N iterations (needs --save)");
  app.add_option("--load", o.load, "Resume from a checkpoint: a --save directory (its latest checkpoint) or one "
                 "iter_ directory; verified before use");
  app.add_option("--exit-interval", o.outputs.stop.exit_interval,
                 "Stop after the first iteration divisible by N, saving first when --save is given (0 = off)")
      ->capture_default_str();
  app.add_flag("--exit-signal-handler", o.exit_signal_handler,
               "Megatron's flag: on SIGTERM or SIGINT finish the current iteration, save a checkpoint (with --save) "
               "and exit 0; a second signal stops at once. On by default when --save is given");
  app.add_option("--keep-last", o.keep_last, "Keep only the newest K checkpoints in --save (0 = keep all)")
      ->capture_default_str();
  app.add_option("--data-path", o.data.data_path,
                 "Megatron indexed dataset(s): PREFIX (PREFIX.bin/.idx, e.g. corpus_text_document) or a blend "
                 "'W1 PREFIX1 W2 PREFIX2 ...'; without it, Megatron's mock data")
      ->expected(1, -1);
  app.add_option("--split", o.data.split, "Train/validation/test proportions of the documents (real data only)")
      ->capture_default_str();
  app.add_option("--data-cache-path", o.data.cache_path,
                 "Where GPTDataset index files are cached (default: <prefix>/cache/GPTDataset_indices)");
  app.add_option("--data-seed", o.data.seed, "Seed of the dataset shuffles (Bridge's dataset.random_seed)")
      ->capture_default_str();
  app.add_option("--eval-interval", t.eval_interval, "Iterations between validation runs")->capture_default_str();
  app.add_option("--eval-iters", t.eval_iters,
                 "Global batches per validation run (0 = no validation, the playbook's setting)")
      ->capture_default_str();
}

// The timers, the FP32 reference and the precision-aware optimizer (Megatron's flags).
void add_logging_and_optimizer_flags(CLI::App& app, Options& o) {
  TrainConfig& t = o.train;
  app.add_option("--timing-log-level", t.timing_log_level,
                 "Megatron's timers, printed after the iteration line of each log interval in ms per iteration: "
                 "0 = none; 1 = forward-backward and the optimizer's phases; 2 = also forward-compute, "
                 "backward-compute, batch-generator and the time inside each op category (GEMMs by format, "
                 "attention, quantization, norms, ...)")
      ->capture_default_str();
  app.add_option("--timing-log-option", o.outputs.timing_log_option,
                 "How the timers are reported across ranks: max | minmax | all (one process: all equal)")
      ->capture_default_str();
  app.add_option("--log-jsonl", o.outputs.log_jsonl,
                 "Also write the run as JSON lines to FILE, one object per event (start, iteration, interval, "
                 "eval, end; README \"The JSON-lines log\"), for scripts; created at the first iteration, "
                 "appended to by a resumed run")
      ->option_text("FILE");
  app.add_flag("--fp32-reference", t.fp32_reference,
               "CPU only: keep every activation in FP32 (no BF16 rounding), for numerics studies");
  app.add_flag("--use-precision-aware-optimizer", t.use_precision_aware_optimizer,
               "Megatron's flag: let the optimizer states below take lower-precision dtypes (one rank: its "
               "distributed optimizer is the whole state, so --use-distributed-optimizer is not needed)");
  app.add_option("--main-grads-dtype", t.main_grads_dtype,
                 "Megatron's flag: dtype of the main gradients, fp32 | bf16 (bf16: each micro-batch's FP32 gradients added "
                 "into BF16 main grads, rounded once)")
      ->capture_default_str();
  app.add_option("--main-params-dtype", t.main_params_dtype,
                 "Megatron's flag: dtype of the master weights, fp32 | fp16 (fp16: not implemented yet)")
      ->capture_default_str();
  app.add_option("--exp-avg-dtype", t.exp_avg_dtype,
                 "Megatron's flag: dtype of Adam's first moment, fp32 | fp16 | bf16 (fp16: not implemented yet)")
      ->capture_default_str();
  app.add_option("--exp-avg-sq-dtype", t.exp_avg_sq_dtype,
                 "Megatron's flag: dtype of Adam's second moment, fp32 | fp16 | bf16 (fp16: not implemented yet)")
      ->capture_default_str();
  app.add_flag("--optimizer-cpu-offload", t.optimizer_cpu_offload,
               "Megatron's flag: keep the FP32 master weights and Adam's moments in host memory and run AdamW on "
               "the host (gradients copied down during the last backward, updated weights copied up); needs "
               "--use-precision-aware-optimizer, as Megatron");
  app.add_option("--optimizer-offload-fraction", t.optimizer_offload_fraction,
                 "Megatron's flag: the fraction of the optimizer offloaded to the host (1.0 only: a split is not "
                 "implemented yet)")
      ->capture_default_str();
  app.add_flag("--overlap-cpu-optimizer-d2h-h2d", t.overlap_cpu_optimizer_d2h_h2d,
               "Megatron's flag: overlap the offloaded optimizer's host step and its copies with compute: AdamW "
               "runs on a host thread layer by layer in the order the next forward reads the weights (embedding "
               "first), gradients go down and weights come up on separate streams, and the next forward waits "
               "per layer, not for the whole model; needs --optimizer-cpu-offload");
}

// The per-op roofline (issue 24) and Megatron's Nsight profiling window.
void add_roofline_and_profiling_flags(CLI::App& app, Options& o) {
  observe::RooflineConfig& r = o.outputs.roofline;
  observe::ProfileConfig& p = o.outputs.profile;
  // An optional value: `--roofline` alone is the table only (CLI11 calls the function with "").
  app.add_option_function<std::string>(
         "--roofline",
         [&r](const std::string& file) {
           r.on = true;
           r.json = file;
         },
         "Per-op roofline report at the end of the run (and a JSON FILE); times every op (a little overhead)")
      ->expected(0, 1)
      ->option_text("[FILE]");
  app.add_flag("--roofline-at-log-interval", r.at_log_interval,
               "With --roofline: also print the table at every --log-interval");
  app.add_flag("--probe-machine", o.probe_machine,
               "Measure this machine's ceilings (GEMM rate per format, bandwidth per memory level), print them and "
               "exit");
  app.add_option("--machine-ceilings", o.machine_ceilings,
                 "The measured-ceilings cache of --roofline and --probe-machine (default: "
                 "$XDG_CACHE_HOME/pretrain_llama/machine_ceilings.json, else ~/.cache/...; none: no cache)")
      ->option_text("FILE");
  app.add_flag("--profile", p.on,
               "Megatron's flag: cudaProfilerStart/Stop around the --profile-step-* window (for nsys profile "
               "--capture-range=cudaProfilerApi), NVTX ranges per iteration and op category");
  app.add_option("--profile-step-start", p.step_start,
                 "Megatron's flag: the window opens when N iterations are done (before iteration N+1)")
      ->capture_default_str();
  app.add_option("--profile-step-end", p.step_end, "Megatron's flag: the window closes after iteration N")
      ->capture_default_str();
  app.add_option("--profile-ranks", p.ranks, "Megatron's flag: the data-parallel ranks to profile")
      ->capture_default_str();
}

// GPU determinism and debugging, data parallelism, and the flags of another mode.
void add_gpu_and_parallel_flags(CLI::App& app, Options& o) {
  TrainConfig& t = o.train;
  app.add_flag("--deterministic-mode", t.deterministic_mode,
               "Megatron's flag: choose code that has deterministic execution (slower): cuDNN's deterministic "
               "attention backward. Default: cuDNN's fastest backward, as Transformer Engine's default");
  app.add_flag("--cuda-sync-every-launch", t.cuda_sync_every_launch,
               "Debugging: synchronize the GPU after every kernel launch, so an asynchronous fault names the op "
               "that caused it (as CUDA_LAUNCH_BLOCKING=1; slow). No effect on the CPU");
  app.add_option("--quantize-kernels", t.quantize_kernels,
                 "The GPU's quantize and expand kernels: fast | reference (the kernels before issue 40: the same "
                 "codes, losses and checkpoints bit for bit, slower; for diagnosis). No effect on the CPU")
      ->capture_default_str();
  app.add_flag("--use-distributed-optimizer", t.use_distributed_optimizer,
               "Megatron's flag: shard the FP32 master weights and Adam's moments over the data-parallel ranks "
               "(gradients reduce-scattered, BF16 weights all-gathered after each step)");
  app.add_flag("--overlap-grad-reduce", t.overlap_grad_reduce,
               "Megatron's flag: reduce each bucket of gradients on the communication stream as soon as the last "
               "micro-batch's backward has finished it");
  app.add_flag("--overlap-param-gather", t.overlap_param_gather,
               "Megatron's flag: overlap the weight all-gather after each step with the next forward (needs "
               "--use-distributed-optimizer and --overlap-grad-reduce): each bucket's weights are waited for, and "
               "a layer's quantized copies made, when the forward reaches them");
  app.add_option("--ddp-bucket-size", t.ddp_bucket_size,
                 "Megatron's flag: elements per gradient bucket with --overlap-grad-reduce (0 = Megatron's default "
                 "max(40000000, 1000000 x data-parallel size))")
      ->capture_default_str();
  app.add_option("--dry-run-world-size", o.dry_run_world_size,
                 "With --dry-run: plan one GPU of a run with this many data-parallel ranks (default: the MPI world "
                 "this process was started in, 1 without mpirun)");
  app.add_flag("--print-library-versions", o.print_library_versions,
               "Print the versions of the CUDA driver and of the CUDA libraries this process loads, and exit");
}

void validate_checkpoint_flags(const Options& o, const CLI::App& app) {
  PL_CHECK(!app.count("--save-interval") || o.save_interval >= 1, "--save-interval must be >= 1, got {}",
           o.save_interval);
  PL_CHECK(!app.count("--save-interval") || !o.save.empty(), "--save-interval {} needs --save DIR", o.save_interval);
  PL_CHECK(o.keep_last >= 0, "--keep-last must be >= 0 (0 = keep all), got {}", o.keep_last);
  PL_CHECK(o.keep_last == 0 || !o.save.empty(), "--keep-last {} needs --save DIR", o.keep_last);
  PL_CHECK(!app.count("--save") || !o.save.empty(), "--save needs a directory");
  PL_CHECK(!app.count("--load") || !o.load.empty(), "--load needs a directory");
}

// --roofline FILE is written at the end of the run: a path that cannot be written is refused now, before
// any model is built, not after the training. (access(2) answers for this process's user; as root it
// only refuses a read-only file system.)
void check_roofline_output(const std::string& file) {
  namespace fs = std::filesystem;
  if (file.empty()) return;  // the table only
  std::error_code ec;
  const fs::file_status st = fs::status(file, ec);
  PL_CHECK(st.type() != fs::file_type::directory, "--roofline {}: is a directory (give a FILE for the JSON report)",
           file);
  PL_CHECK(!fs::exists(st) || st.type() == fs::file_type::regular,
           "--roofline {}: exists and is not a regular file (give a FILE for the JSON report)", file);
  const fs::path parent = fs::path(file).has_parent_path() ? fs::path(file).parent_path() : fs::path(".");
  PL_CHECK(fs::is_directory(parent, ec), "--roofline {}: directory {} does not exist", file, parent.string());
  PL_CHECK(::access(parent.c_str(), W_OK | X_OK) == 0, "--roofline {}: directory {} is not writable: {}", file,
           parent.string(), std::strerror(errno));
  PL_CHECK(!fs::exists(st) || ::access(file.c_str(), W_OK) == 0, "--roofline {}: not writable: {}", file,
           std::strerror(errno));
}

void validate_roofline_flags(const Options& o, const CLI::App& app) {
  observe::validate_roofline_config(o.outputs.roofline);
  check_roofline_output(o.outputs.roofline.json);
  if (!app.count("--machine-ceilings")) return;
  std::error_code ec;
  PL_CHECK(!o.machine_ceilings.empty(), "--machine-ceilings needs a FILE (or none: no cache)");
  PL_CHECK(!std::filesystem::is_directory(o.machine_ceilings, ec), "--machine-ceilings {}: is a directory (give a FILE)",
           o.machine_ceilings);
}

// The outputs' flags: the stop conditions, the text log's timer option, quantization statistics, the profiling
// window (over the data-parallel ranks), and --log-jsonl's FILE (writable, before any model is built).
void validate_output_flags(const Options& o) {
  const OutputOptions& out = o.outputs;
  observe::validate_stop_config(out.stop);
  PL_CHECK(out.quant_stats_interval >= 0, "--log-quant-stats-interval must be >= 0 (0 = off), got {}",
           out.quant_stats_interval);
  PL_CHECK(out.timing_log_option == "minmax" || out.timing_log_option == "max" || out.timing_log_option == "all",
           "--timing-log-option must be max, minmax or all, got '{}'", out.timing_log_option);
  observe::validate_profile_config(out.profile, o.train.data_parallel_size);
  if (!out.log_jsonl.empty()) observe::check_jsonl_output(out.log_jsonl);
}

}  // namespace

// In the order --help lists them.
void add_flags(CLI::App& app, Options& o) {
  add_model_and_recipe_flags(app, o);
  add_training_flags(app, o);
  add_checkpoint_and_data_flags(app, o);
  add_logging_and_optimizer_flags(app, o);
  add_schedule_flags(app, o);
  add_packing_flags(app, o);
  add_sft_flags(app, o);
  add_lora_flags(app, o);
  add_recompute_flags(app, o);
  add_tensorboard_flags(app, o);
  add_downstream_flags(app, o);
  add_fp8_flags(app, o);
  add_roofline_and_profiling_flags(app, o);
  add_gpu_and_parallel_flags(app, o);
}

// The flag rules CLI11 cannot express; one line naming the flag each.
void validate_flags(const Options& o, const CLI::App& app) {
  const TrainConfig& t = o.train;
  validate_train_config(t);
  validate_output_flags(o);
  validate_checkpoint_flags(o, app);
  validate_roofline_flags(o, app);
  validate_schedule_flags(o, app);
  validate_packing_flags(o, app);
  validate_sft_flags(o, app);
  validate_lora_flags(o, app);
  validate_recompute_flags(o, app);
  validate_tensorboard_flags(o, app);
  validate_downstream_flags(o, app);
  validate_fp8_flags(o, app);
  PL_CHECK(!(app.count("--eval-interval") && t.eval_iters == 0),
           "--eval-interval {} needs --eval-iters N > 0 (validation is off by default, as in the playbook)",
           t.eval_interval);
  PL_CHECK(o.data.data_path.empty() ? !app.count("--split") && !app.count("--data-cache-path") : true,
           "--split and --data-cache-path apply to --data-path data (mock data always uses split 1,1,1)");
  for (const char* flag : {"--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads",
                           "--num-query-groups", "--kv-channels"})
    PL_CHECK(!app.count(flag) || app.get_option(flag)->as<int64_t>() >= 1, "{} must be >= 1, got {}", flag,
             app.get_option(flag)->as<std::string>());
  PL_CHECK(!(o.shape.any() && !o.init_from_hf.empty()),
           "{} cannot be combined with --init-from-hf (the Hugging Face weights fix the model's shape)",
           o.shape.describe());
  PL_CHECK(!app.count("--dry-run-world-size") || o.dry_run, "--dry-run-world-size {} needs --dry-run",
           o.dry_run_world_size);
  PL_CHECK(!app.count("--dry-run-world-size") || o.dry_run_world_size >= 1, "--dry-run-world-size must be >= 1, got {}",
           o.dry_run_world_size);
  if (app.count("--dry-run-gpu")) {
    PL_CHECK(o.dry_run, "--dry-run-gpu {} needs --dry-run (it plans without a GPU)", o.dry_run_gpu);
    PL_CHECK(find_gpu(o.dry_run_gpu) != nullptr, "--dry-run-gpu: unknown GPU '{}' (known: {})", o.dry_run_gpu,
             known_gpu_keys());
    PL_CHECK(o.train.device != "cpu", "--dry-run-gpu {} plans a GPU; it cannot be combined with --device cpu",
             o.dry_run_gpu);
  }
}

RunSetup resolve_model_and_plan(Options& o, const CLI::App& app, const char* argv0) {
  RunSetup s;
  if (o.disable_fp4) {
    if (app.count("--recipe") && o.recipe != "bf16_mixed")
      s.recipe_note = fmt::format(" | --disable-fp4 overrides --recipe {}", o.recipe);
    o.recipe = "bf16_mixed";
  }
  const bool from_hf = !o.init_from_hf.empty();
  const std::string model_path = from_hf ? o.init_from_hf + "/config.json, Hugging Face"
                                         : resolve_config("models", o.model, argv0);
  s.recipe_path = resolve_config("recipes", o.recipe, argv0);
  s.mc = from_hf ? hf_model_config_for_run(o.init_from_hf, app.count("--model") ? resolve_config("models", o.model, argv0) : "")
                 : apply_shape_overrides(load_model_config(model_path), o.shape);
  s.model_source = from_hf ? model_path : s.mc.file;
  s.recipe = load_precision_recipe(s.recipe_path);
  for (auto [flag, value, field] : {std::tuple{"--num-layers-at-start-in-bf16", o.bf16_layers_at_start,
                                               &s.recipe.num_layers_at_start_in_bf16},
                                    std::tuple{"--num-layers-at-end-in-bf16", o.bf16_layers_at_end,
                                               &s.recipe.num_layers_at_end_in_bf16}}) {
    if (!app.count(flag)) continue;
    PL_CHECK(value >= 0, "{} must be >= 0, got {}", flag, value);
    if (!s.recipe.first_last_layers_bf16) {
      s.recipe.first_last_layers_bf16 = true;
      s.recipe.num_layers_at_start_in_bf16 = s.recipe.num_layers_at_end_in_bf16 = 0;
    }
    *field = value;
    s.recipe_note += fmt::format(" | {} {}", flag, value);
  }
  apply_fp8_flags(o, app, s);
  s.plan = make_precision_plan(s.mc, s.recipe);
  check_tokens_block_rule(s.plan, o.train.micro_batch_size, o.train.seq_length);
  check_fp8_param_gather(o, s);
  return s;
}

static void check_no_output_overlaps_an_input(const Options& o, const RunSetup& s) {
  std::vector<FlagPath> outputs;
  for (const FlagPath& f : {FlagPath{"--save", o.save}, FlagPath{"--log-jsonl", o.outputs.log_jsonl},
                            FlagPath{"--roofline", o.outputs.roofline.json},
                            FlagPath{"--machine-ceilings", o.machine_ceilings == "none" ? "" : o.machine_ceilings}})
    if (!f.path.empty()) outputs.push_back(f);
  if (outputs.empty()) return;
  std::vector<FlagPath> inputs{o.init_from_hf.empty() ? FlagPath{"--model", s.mc.file}
                                                      : FlagPath{"--init-from-hf", o.init_from_hf},
                               {"--recipe", s.recipe_path}};
  if (!o.data.data_path.empty())
    for (const std::string& p : data::parse_data_path(o.data.data_path).prefixes)
      for (const std::string& f : {p + ".bin", p + ".idx", data::tokenizer_record_path(p)})
        inputs.push_back({"--data-path", f});
  check_outputs_apart_from_inputs(inputs, outputs);
}

// The outputs' one rule (io/file_checks.h). None may be, contain or lie inside anything the run reads: the
// model and recipe configs, the Hugging Face directory, the data's .bin/.idx/.tokenizer.json (--load may be
// --save, as Megatron resumes, or lie inside it). And a file output replaces only its own kind: the JSON-lines
// log, the roofline report and the ceilings cache (checked second, so an input named as an output is said so).
void check_outputs_apart(const Options& o, const RunSetup& s) {
  check_no_output_overlaps_an_input(o, s);
  observe::check_jsonl_replaceable(o.outputs.log_jsonl);
  check_replaceable_output("--roofline", o.outputs.roofline.json, "a roofline report", [](const std::string& p) {
    return json_file_lacks(p, {"rows", "ceilings", "step_ms"});
  });
  if (!o.machine_ceilings.empty() && o.machine_ceilings != "none")
    roofline::check_ceilings_cache_replaceable(o.machine_ceilings, "--machine-ceilings");
}

RunLayout run_layout(const Options& o, const RunSetup& s) {
  const TrainConfig& t = o.train;
  const OptimizerConfig oc = optimizer_config(t);  // validates the precision-aware optimizer's flags
  return RunLayout{.recompute = recompute_config_of(o, s.mc),
                   .quant_telemetry = o.outputs.quant_stats_interval > 0,
                   .loss_micro_batches = t.num_micro_batches(),  // the loss is read once per iteration
                   .deterministic_attention = t.deterministic_mode,
                   .exp_avg = oc.exp_avg_dtype,
                   .exp_avg_sq = oc.exp_avg_sq_dtype,
                   .optimizer_offload = t.optimizer_cpu_offload,
                   .bf16_main_grads = t.main_grads_dtype == "bf16",
                   .fp8_primary_weights = s.recipe.fp8_param_gather,
                   .dp_size = t.data_parallel_size,
                   .dp_rank = o.dp_rank,
                   .distributed_optimizer = t.use_distributed_optimizer,
                   .packing = packing_flags(o),
                   .lora = lora_config_of(o)};
}

}  // namespace pl::pretrain
