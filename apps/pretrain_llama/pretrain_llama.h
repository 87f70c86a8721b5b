#pragma once
// pretrain_llama's parts: the flags (flags.cpp), the banner (banner.cpp), the memory plan's start-up
// check and --dry-run (memory.cpp), and the run that wires data -> model -> trainer (main.cpp).
#include <nlohmann/json_fwd.hpp>
#include <spdlog/spdlog.h>

#include <csignal>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "config/model_config.h"
#include "config/precision_recipe.h"
#include "config/train_config.h"
#include "data/data_pipeline.h"
#include "log/plan_log.h"
#include "model/fit_plan.h"
#include "model/memory_plan.h"
#include "model/precision_plan.h"
#include "observe/checkpointer.h"
#include "observe/downstream_eval.h"
#include "observe/jsonl_log.h"
#include "observe/megatron_text_log.h"
#include "observe/profiler_window.h"
#include "observe/quant_stats_log.h"
#include "observe/roofline_report.h"
#include "observe/stop_conditions.h"
#include "observe/tensorboard_log.h"
#include "parallel/communicator.h"
#include "parallel/world.h"
#include "train/trainer.h"

namespace CLI {
class App;  // <CLI/CLI.hpp>: only flags.cpp and main.cpp parse it (a heavy header-only library)
}

namespace pl::pretrain {

using Logger = std::shared_ptr<spdlog::logger>;

// Where the run's records go (lib/observe/: one observer each), by flag.
struct OutputOptions {
  std::string timing_log_option = "minmax";  // --timing-log-option (the text log's timer block)
  int64_t quant_stats_interval = 0;          // --log-quant-stats-interval (0 = off)
  observe::StopConfig stop;                  // --exit-interval, --exit-duration-in-mins, --max-nan-iterations
  observe::RooflineConfig roofline;          // --roofline [FILE], --roofline-at-log-interval
  observe::ProfileConfig profile;            // --profile, --profile-step-start/-end, --profile-ranks
  observe::TensorBoardConfig tensorboard;    // --tensorboard-dir and its companions (flags_tensorboard.cpp)
  std::string log_jsonl;                     // --log-jsonl FILE
  observe::DownstreamEvalConfig downstream;  // --downstream-eval and its companions (flags_downstream.cpp)
};

struct Options {
  TrainConfig train;
  OutputOptions outputs;
  std::string model = "llama3_8b";
  std::string recipe = "bf16_with_nvfp4_mixed";  // the playbook's
  bool disable_fp4 = false;
  // Megatron's --fp8-param-gather and our --no-fp8-param-gather over the recipe's fp8_param_gather (FP8
  // primary weights: RunLayout::fp8_primary_weights).
  bool fp8_param_gather = false, no_fp8_param_gather = false;
  // --recompute (the alias) and Megatron's three (flags_recompute.cpp); "" / 0: not given.
  std::string recompute = "none", recompute_granularity, recompute_method = "uniform";
  int64_t recompute_num_layers = 0;
  bool dry_run = false;
  std::string dry_run_gpu;  // --dry-run-gpu: plan for this GPU of the fit table (model/fit_plan.h)
  int64_t dry_run_world_size = 0;  // --dry-run-world-size: plan one GPU of this many data-parallel ranks
  int64_t dp_rank = 0;             // this process's data-parallel rank (the World's rank)
  bool print_library_versions = false;
  // --probe-machine: measure this machine's ceilings (roofline/machine_ceilings.h), print them and exit.
  bool probe_machine = false;
  // --machine-ceilings FILE: the ceilings cache of --roofline and --probe-machine. "" (not given): the
  // default path, roofline::default_ceilings_cache_path(); "none": no cache, always measured.
  std::string machine_ceilings;
  // Checkpoints (Megatron's flags): --save, --save-interval, --load, --keep-last (--exit-interval is a stop
  // condition: outputs.stop).
  std::string save, load;
  int64_t save_interval = 0;
  int64_t keep_last = 0;
  bool exit_signal_handler = false;  // Megatron's --exit-signal-handler (on by default with --save)
  std::string init_from_hf;  // a Hugging Face Llama directory: config and weights come from it
  bool finetune = false;     // Megatron's --finetune: --load's weights only, fresh optimizer and iteration 0
  ModelShapeOverrides shape;  // Megatron's --num-layers, --hidden-size, ... over the --model config
  // Megatron's --num-layers-at-start-in-bf16 / --num-layers-at-end-in-bf16 over the recipe (-1 = not given).
  int64_t bf16_layers_at_start = -1, bf16_layers_at_end = -1;
  data::DataConfig data;
  // --peft and the --lora-* flags (flags_lora.cpp): the numbers straight into lora, the names parsed there.
  std::string peft = "none";
  LoraConfig lora;
  std::string lora_dropout_position = "pre", lora_a_init = "xavier";
  std::string lora_target_modules = "linear_qkv,linear_proj,linear_fc1,linear_fc2";
};

// What the flags resolve to before any device is touched: the model, the recipe and its plan.
struct RunSetup {
  ModelConfig mc;
  std::string model_source;  // where the shape came from, for the banner
  PrecisionRecipe recipe;
  std::string recipe_path;
  std::string recipe_note;  // the flags that changed the recipe, for the banner
  PrecisionPlan plan;
};

// flags.cpp
void add_flags(CLI::App& app, Options& o);
void validate_flags(const Options& o, const CLI::App& app);
RunSetup resolve_model_and_plan(Options& o, const CLI::App& app, const char* argv0);
void check_outputs_apart(const Options& o, const RunSetup& s);
RunLayout run_layout(const Options& o, const RunSetup& s);

// Issue 27's flag groups, one file each (flags.cpp calls them in add_flags / validate_flags):
// flags_schedule.cpp: AdamW's and the LR schedule's flags (Megatron's names).
void add_schedule_flags(CLI::App& app, Options& o);
void validate_schedule_flags(const Options& o, const CLI::App& app);
// --init-method-std over the resolved model config (after resolve_model_and_plan).
void apply_init_method_std(const Options& o, RunSetup& s);
// flags_packing.cpp: document-aware packing (--eod-mask-loss, --reset-position-ids, --reset-attention-mask).
void add_packing_flags(CLI::App& app, Options& o);
void validate_packing_flags(const Options& o, const CLI::App& app);
// RunLayout::packing without the data's EOD id: Megatron's flags, or an SFT dataset's packing (--data-path).
data::DocumentPacking packing_flags(const Options& o);
// flags_sft.cpp (issue 28): --finetune and --packing-algorithm.
void add_sft_flags(CLI::App& app, Options& o);
void validate_sft_flags(const Options& o, const CLI::App& app);
std::string packing_line(const data::DocumentPacking& p, const TrainConfig& t);  // "" without these flags
// flags_lora.cpp (issue 41): --peft lora and the --lora-* flags; the LoRA configuration they make (none without
// --peft lora; a one-line error for a bad value); the banner's line on the adapters and the trainable share.
void add_lora_flags(CLI::App& app, Options& o);
void validate_lora_flags(const Options& o, const CLI::App& app);
std::optional<LoraConfig> lora_config_of(const Options& o);
std::string lora_banner_line(const ModelConfig& mc, const LoraConfig& c);
// flags_recompute.cpp (issue 42): --recompute-granularity, --recompute-method, --recompute-num-layers (and the
// --recompute alias); the configuration they make, checked against the model's layers (one line each).
void add_recompute_flags(CLI::App& app, Options& o);
void validate_recompute_flags(const Options& o, const CLI::App& app);
RecomputeConfig recompute_config_of(const Options& o, const ModelConfig& mc);
// flags_downstream.cpp (issue 43): --downstream-eval and its companions; the observer they make (null without
// them), its tasks read and its tokenizer found (the training data's record) at once, before the device arena is
// reserved (its evaluation model is planned into it: main.cpp); make_outputs wires where its scores go.
void add_downstream_flags(CLI::App& app, Options& o);
void validate_downstream_flags(const Options& o, const CLI::App& app);
std::unique_ptr<observe::DownstreamEval> make_downstream_eval(const Options& o, const ModelConfig& mc,
                                                              log::NoteFn note);
// flags_tensorboard.cpp: --tensorboard-dir and its companions.
void add_tensorboard_flags(CLI::App& app, Options& o);
void validate_tensorboard_flags(const Options& o, const CLI::App& app);
// flags_fp8.cpp: FP8 delayed scaling's overrides (--fp8-amax-history-len, ...).
void add_fp8_flags(CLI::App& app, Options& o);
void validate_fp8_flags(const Options& o, const CLI::App& app);
// The FP8 flags over the recipe (refused unless it is delayed scaling), before the plan is made.
void apply_fp8_flags(const Options& o, const CLI::App& app, RunSetup& s);
// --fp8-param-gather given with a plan that has no FP8 weight, or with what turns FP8 primary weights off
// (the optimizer offload, the distributed optimizer): one line naming both (after the plan is made).
void check_fp8_param_gather(const Options& o, const RunSetup& s);
// The banner's and the dry run's line on FP8 primary weights ("" when the plan has no FP8 weight).
std::string fp8_primary_weights_line(const RunSetup& s, const RunLayout& layout);

// banner.cpp
int print_library_versions();
void print_model_and_plan(const RunSetup& s, const TrainConfig& t, Device device, int threads, const Logger& out);
DeviceStateHandle open_gpu(const RunSetup& s, const TrainConfig& t, OpContext& ctx, const Logger& out);
void print_training_and_parameters(const ModelConfig& mc, const Options& o, const Logger& out);
void print_optimizer_state(const TrainConfig& t, const Logger& out);
void print_optimizer_and_schedule(const ModelConfig& mc, const Options& o, const Logger& out);
void print_data_parallel(const parallel::World& world, const parallel::Communicator& comm, const TrainConfig& t,
                         const LlamaModel& model, size_t buckets, const Logger& out);
// What the banner says, as values: the JSON-lines log's "start" line.
struct RunFacts {
  const RunSetup& setup;
  const Options& o;
  const OpContext& ctx;
  const MemoryPlan& memory;
  std::vector<std::string> data_summary;  // the data's banner lines
  std::vector<std::string> command_line;  // argv
};
nlohmann::ordered_json run_facts(const RunFacts& f);

// roofline.cpp: --probe-machine (prints the ceilings; the exit code) and --roofline: the machine's ceilings
// (rank 0, measured before the device arena is reserved, so the probe's operands are allocations of their
// own, freed after it; null on the other ranks and without --roofline), then the report's observer.
int probe_machine_command(const Options& o, const RunSetup& s, const OpContext& ctx, const Logger& out);
std::shared_ptr<const roofline::MachineCeilings> roofline_ceilings(const Options& o, const RunSetup& s,
                                                                   const OpContext& ctx, const parallel::World& world,
                                                                   const Logger& out);
std::unique_ptr<observe::RooflineReport> roofline_report(const Options& o, const RunSetup& s,
                                                         std::shared_ptr<const roofline::MachineCeilings> ceilings,
                                                         const Logger& out);

// outputs.cpp: the run's outputs, one observer each (lib/observe/), built from the flags, in the order the
// trainer calls them (train/observer.h): the stop conditions and the checkpoints first (a resume's restore
// before anything is printed of the run; a save before the stop's line), then the text log and what follows
// its lines.
struct RunOutputs {
  std::unique_ptr<observe::StopConditions> stop;
  std::unique_ptr<observe::Checkpointer> checkpoints;
  std::unique_ptr<observe::MegatronTextLog> text;
  std::unique_ptr<observe::QuantStatsLog> quant_stats;    // --log-quant-stats-interval
  std::unique_ptr<observe::RooflineReport> roofline;      // --roofline (rank 0)
  std::unique_ptr<observe::ProfilerWindow> profiler;      // --profile
  observe::TensorBoardLog* tensorboard = nullptr;         // --tensorboard-dir (the last rank; made at start-up)
  std::unique_ptr<observe::JsonLinesLog> jsonl;           // --log-jsonl (the last rank)
  std::unique_ptr<observe::DownstreamEval> downstream;    // --downstream-eval (every rank: each scores a shard)
  std::vector<TrainObserver*> list() const;
};
// What the outputs are made of, besides the flags.
struct OutputInputs {
  const parallel::World& world;
  const RunSetup& setup;
  Logger lines;                                     // every line an observer prints (it chooses its rank)
  std::unique_ptr<SaveDirectoryLock> save_lock;     // rank 0's, with --save
  observe::TensorBoardLog* tensorboard = nullptr;
  std::optional<VerifiedCheckpoint> resume;         // --load's
  std::shared_ptr<const roofline::MachineCeilings> ceilings;  // rank 0's, with --roofline
  nlohmann::ordered_json facts;                     // the banner's (run_facts)
  std::vector<std::string> command_line;
  GemmAlgorithms gemm_algorithms;                   // choose_gemm_algorithms's, for the checkpoints
  std::unique_ptr<observe::DownstreamEval> downstream;  // --downstream-eval's (made before the arena)
};
RunOutputs make_outputs(const Options& o, OutputInputs in);
// --exit-signal-handler (on by default with --save): SIGTERM/SIGINT handlers installed now; the flag they set
// (null: signals not watched), and the banner line saying so.
const volatile std::sig_atomic_t* watch_stop_signals(const Options& o);
void print_stop_signals(const Options& o, const Logger& out);

// gemm_choice.cpp: cuBLASLt's algorithm per GEMM (backend/gemm_algorithms.h), before the loop: the checkpoint's
// (--load) when it was chosen on this GPU and library; else, unless --deterministic-mode (the heuristic's first),
// the fastest of the heuristic's first few, timed in one discarded step of the model; rank 0's for every rank.
// Prints one line (one per GEMM at --timing-log-level 2). Nothing on the CPU.
GemmAlgorithms choose_gemm_algorithms(const Options& o, const std::optional<VerifiedCheckpoint>& resume,
                                      LlamaModel& model, const parallel::World& world, const Logger& out);

// memory.cpp
void check_memory_fits(const MemoryPlan& p, const FitRequest& req, const TrainConfig& t, Device device, int sm);
void print_dry_run(const RunSetup& s, const Options& o, const Logger& out);

}  // namespace pl::pretrain
