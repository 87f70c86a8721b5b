// pretrain_llama's flags of issue 27: TensorBoard event files: Megatron's --tensorboard-dir and its companions.
// Names, defaults and meanings followed from Megatron-LM megatron/training/arguments.py (the logging group:
// --tensorboard-dir, --tensorboard-log-interval, --tensorboard-queue-size, --log-timers-to-tensorboard,
// --no-log-loss-scale-to-tensorboard, --log-validation-ppl-to-tensorboard, --log-memory-to-tensorboard,
// --log-world-size-to-tensorboard) and megatron/training/training.py (what each writes; observe/tensorboard_log.h).
#include <CLI/CLI.hpp>

#include <filesystem>

#include "core/error.h"
#include "pretrain_llama.h"

namespace pl::pretrain {

void add_tensorboard_flags(CLI::App& app, Options& o) {
  observe::TensorBoardConfig& t = o.outputs.tensorboard;
  app.add_option("--tensorboard-dir", t.dir,
                 "Write TensorBoard event files to this directory (created if missing; one new file per run, "
                 "so a resumed run continues the curves): lm loss, learning rate, grad norm, loss scale, "
                 "iteration time, throughput, validation loss; view with `tensorboard --logdir DIR`");
  app.add_option("--tensorboard-log-interval", t.log_interval,
                 "Write the per-iteration scalars every N iterations")
      ->capture_default_str();
  app.add_option("--tensorboard-queue-size", t.queue_size,
                 "Scalars the event writer may hold before it drops new ones instead of slowing the run (the disk "
                 "is written by a thread of its own)")
      ->capture_default_str();
  app.add_flag("--log-timers-to-tensorboard", t.log_timers,
               "Also write the timers of --timing-log-level (<name>-time, seconds per iteration, max over ranks)");
  app.add_flag("--no-log-loss-scale-to-tensorboard{false}", t.log_loss_scale,
               "Do not write loss-scale");
  app.add_flag("--log-validation-ppl-to-tensorboard", t.log_validation_ppl,
               "Also write the validation perplexity (lm loss validation ppl)");
  app.add_flag("--log-memory-to-tensorboard", t.log_memory,
               "Also write the memory figures (mem-allocated-bytes, mem-reserved-bytes, ...)");
  app.add_flag("--log-world-size-to-tensorboard", t.log_world_size, "Also write world-size");
}

// The directory itself is created (and its events file opened) by the writer rank at start-up, before the
// model is built (main.cpp); here only what needs no file system write.
void validate_tensorboard_flags(const Options& o, const CLI::App& app) {
  const observe::TensorBoardConfig& t = o.outputs.tensorboard;
  PL_CHECK(!(app.count("--tensorboard-dir") && t.dir.empty()), "--tensorboard-dir needs a DIR");
  PL_CHECK(t.log_interval >= 1, "--tensorboard-log-interval must be >= 1, got {}",
           t.log_interval);
  PL_CHECK(t.queue_size >= 1 && t.queue_size <= 100'000'000,
           "--tensorboard-queue-size must be in [1, 100000000], got {}", t.queue_size);
  if (t.dir.empty())
    for (const char* flag : {"--tensorboard-log-interval", "--tensorboard-queue-size", "--log-timers-to-tensorboard",
                             "--no-log-loss-scale-to-tensorboard", "--log-validation-ppl-to-tensorboard",
                             "--log-memory-to-tensorboard", "--log-world-size-to-tensorboard"})
      PL_CHECK(app.count(flag) == 0, "{} needs --tensorboard-dir DIR (it says what TensorBoard gets)", flag);
  std::error_code ec;
  const auto st = std::filesystem::status(t.dir, ec);
  PL_CHECK(t.dir.empty() || !std::filesystem::exists(st) || std::filesystem::is_directory(st),
           "--tensorboard-dir {}: exists and is not a directory", t.dir);
}

}  // namespace pl::pretrain
