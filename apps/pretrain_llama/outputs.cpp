// pretrain_llama's outputs: every line, file and decision the run makes besides training itself, each an
// observer of the trainer (lib/observe/), built here once from the flags.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "pretrain_llama.h"

namespace pl::pretrain {

namespace {

// --exit-signal-handler: the first SIGTERM/SIGINT is recorded for the stop conditions (read after each
// iteration); a second one restores the default action and re-raises it, so the process ends at once.
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) {
  if (g_stop_signal != 0) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  g_stop_signal = sig;
}

// When the process started (before main, as Megatron's _TRAIN_START_TIME before its imports): where
// --exit-duration-in-mins counts from.
const std::chrono::steady_clock::time_point g_program_start = std::chrono::steady_clock::now();

bool watches_signals(const Options& o) { return o.exit_signal_handler || !o.save.empty(); }

// Where a LoRA run's frozen base comes from (LoraBaseRecord::source): a Hugging Face directory, a full checkpoint
// (--load DIR --finetune), or the random initialisation of --seed.
std::string lora_base_source(const Options& o, const std::optional<VerifiedCheckpoint>& resume) {
  if (!o.init_from_hf.empty()) return "hf " + o.init_from_hf;
  if (resume && !resume->lora) return fmt::format("checkpoint {}", resume->path);
  return fmt::format("init seed {}", o.train.seed);
}

// What a checkpoint records about the run that wrote it (metadata.json).
RunDescription describe_run(const Options& o, const OutputInputs& in) {
  return RunDescription{
      .model = in.setup.mc,
      .recipe_name = in.setup.recipe.name,
      .recipe_file = in.setup.recipe_path,
      .plan = in.setup.plan.describe(),
      .train = o.train,
      .command_line = in.command_line,
      .data = o.data.data_path.empty() ? std::string("Megatron MockGPTDataset (split 1,1,1)")
                                       : fmt::format("--data-path {} --split {} --data-seed {}",
                                                     fmt::join(o.data.data_path, " "), o.data.split, o.data.seed),
      .gemm_algorithms = in.gemm_algorithms,
      .lora = lora_config_of(o),
      .lora_base = {.source = lora_base_source(o, in.resume), .recipe = in.setup.recipe.name}};
}

}  // namespace

const volatile std::sig_atomic_t* watch_stop_signals(const Options& o) {
  if (!watches_signals(o)) return nullptr;
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGINT, on_stop_signal);
  return &g_stop_signal;
}

void print_stop_signals(const Options& o, const Logger& out) {
  if (!watches_signals(o)) return;
  out->info("pretrain_llama | SIGTERM/SIGINT: finish the iteration, {}exit 0; a second signal stops at once "
            "(--exit-signal-handler{})",
            o.save.empty() ? "" : "save a checkpoint, ", o.exit_signal_handler ? "" : ", on because --save is given");
}

RunOutputs make_outputs(const Options& o, OutputInputs in) {
  const OutputOptions& f = o.outputs;
  const Logger lines = in.lines;
  const observe::LineFn print = [lines](const std::string& line) { lines->info("{}", line); };
  RunOutputs out;
  out.stop = std::make_unique<observe::StopConditions>(f.stop, watch_stop_signals(o), g_program_start);
  const bool resumes = in.resume && !o.finetune;
  out.checkpoints = std::make_unique<observe::Checkpointer>(
      observe::CheckpointConfig{o.save, o.save_interval, o.keep_last, o.finetune}, describe_run(o, in),
      std::move(in.resume), std::move(in.save_lock), o.load, print);
  out.text = std::make_unique<observe::MegatronTextLog>(print, f.timing_log_option);
  if (f.quant_stats_interval > 0) out.quant_stats = std::make_unique<observe::QuantStatsLog>(print, f.quant_stats_interval);
  out.roofline = roofline_report(o, in.setup, std::move(in.ceilings), lines);
  if (f.profile.on) out.profiler = std::make_unique<observe::ProfilerWindow>(f.profile);
  out.tensorboard = in.tensorboard;
  if (!f.log_jsonl.empty() && in.world.rank() == in.world.size() - 1)  // (Megatron's print_rank_last)
    out.jsonl = std::make_unique<observe::JsonLinesLog>(
        f.log_jsonl, std::move(in.facts), resumes, [print](const std::string& note) { print("pretrain_llama | " + note); });
  // --downstream-eval's scores go to the outputs that show them (the text log prints on the last rank, as the
  // validation lines; TensorBoard and the JSON-lines log exist only there).
  std::vector<TrainObserver*> shown = {out.text.get(), out.tensorboard, out.jsonl.get()};
  out.downstream = std::move(in.downstream);
  if (out.downstream)
    out.downstream->set_publish([shown](const log::DownstreamEvalRecord& r) {
      for (TrainObserver* t : shown)
        if (t != nullptr) t->on_downstream_eval(r);
    });
  return out;
}

std::vector<TrainObserver*> RunOutputs::list() const {
  std::vector<TrainObserver*> all;
  for (TrainObserver* o : std::initializer_list<TrainObserver*>{stop.get(), checkpoints.get(), text.get(),
                                                                quant_stats.get(), roofline.get(), profiler.get(),
                                                                tensorboard, jsonl.get(), downstream.get()})
    if (o != nullptr) all.push_back(o);
  return all;
}

}  // namespace pl::pretrain
