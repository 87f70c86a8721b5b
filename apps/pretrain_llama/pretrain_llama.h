#pragma once
// pretrain_llama's parts: the flags (flags.cpp), the banner (banner.cpp), the memory plan's start-up
// check and --dry-run (memory.cpp), and the run that wires data -> model -> trainer (main.cpp).
#include <spdlog/spdlog.h>

#include <memory>
#include <string>

#include "backend/ops.h"
#include "config/model_config.h"
#include "config/precision_recipe.h"
#include "config/train_config.h"
#include "data/data_pipeline.h"
#include "log/plan_log.h"
#include "model/fit_plan.h"
#include "model/memory_plan.h"
#include "model/precision_plan.h"
#include "parallel/communicator.h"
#include "parallel/world.h"
#include "train/trainer.h"

namespace CLI {
class App;  // <CLI/CLI.hpp>: only flags.cpp and main.cpp parse it (a heavy header-only library)
}

namespace pl::pretrain {

using Logger = std::shared_ptr<spdlog::logger>;

struct Options {
  TrainConfig train;
  std::string model = "llama3_8b";
  std::string recipe = "bf16_with_nvfp4_mixed";  // the playbook's
  bool disable_fp4 = false;
  std::string recompute = "none";
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
  // Checkpoints (Megatron's flags): --save, --save-interval, --load, --keep-last; --exit-interval
  // lives in TrainConfig because the trainer stops there.
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
void check_save_apart_from_inputs(const Options& o, const RunSetup& s);
RunLayout model_options(const Options& o);

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
// flags_tensorboard.cpp: --tensorboard-dir and its companions.
void add_tensorboard_flags(CLI::App& app, Options& o);
void validate_tensorboard_flags(const Options& o, const CLI::App& app);
// flags_fp8.cpp: FP8 delayed scaling's overrides (--fp8-amax-history-len, ...).
void add_fp8_flags(CLI::App& app, Options& o);
void validate_fp8_flags(const Options& o, const CLI::App& app);
// The FP8 flags over the recipe (refused unless it is delayed scaling), before the plan is made.
void apply_fp8_flags(const Options& o, const CLI::App& app, RunSetup& s);

// banner.cpp
int print_library_versions();
void print_model_and_plan(const RunSetup& s, const TrainConfig& t, Device device, int threads, const Logger& out);
DeviceStateHandle open_gpu(const RunSetup& s, const TrainConfig& t, OpContext& ctx, const Logger& out);
void print_training_and_parameters(const ModelConfig& mc, const TrainConfig& t, const Logger& out);
void print_optimizer_state(const TrainConfig& t, const Logger& out);
void print_optimizer_and_schedule(const ModelConfig& mc, const TrainConfig& t, const Logger& out);
void print_data_parallel(const parallel::World& world, const parallel::Communicator& comm, const TrainConfig& t,
                         const LlamaModel& model, size_t buckets, const Logger& out);
void print_summary(const TrainResult& r, const TrainConfig& t, const TrainState& start, const Logger& out);

// roofline.cpp: --probe-machine (prints the ceilings; the exit code) and --roofline: the machine's ceilings
// (rank 0, measured before the device arena is reserved, so the probe's operands are allocations of their
// own, freed after it; null on the other ranks and without --roofline), then the trainer's listener.
int probe_machine_command(const Options& o, const RunSetup& s, const OpContext& ctx, const Logger& out);
std::shared_ptr<const roofline::MachineCeilings> roofline_ceilings(const Options& o, const RunSetup& s,
                                                                   const OpContext& ctx, const parallel::World& world,
                                                                   const Logger& out);
void attach_roofline(Trainer& trainer, const Options& o, const RunSetup& s,
                     std::shared_ptr<const roofline::MachineCeilings> ceilings, const Logger& out);

// memory.cpp
void check_memory_fits(const MemoryPlan& p, const FitRequest& req, const TrainConfig& t, Device device, int sm);
void print_dry_run(const RunSetup& s, const Options& o, const Logger& out);

}  // namespace pl::pretrain
