#include "observe/checkpointer.h"

#include <fmt/format.h>

#include <chrono>

#include "core/error.h"
#include "log/megatron_log.h"
#include "train/checkpoint_metadata.h"

namespace pl::observe {

Checkpointer::Checkpointer(const CheckpointConfig& c, RunDescription run, std::optional<VerifiedCheckpoint> resume,
                           std::unique_ptr<SaveDirectoryLock> lock, std::string load_dir, LineFn out)
    : cfg_(c),
      run_(std::move(run)),
      resume_(std::move(resume)),
      lock_(std::move(lock)),
      load_dir_(std::move(load_dir)),
      out_(std::move(out)) {}

TrainState Checkpointer::start_state() const { return resume_ && !cfg_.finetune ? resume_->state : TrainState{}; }

// Before the first iteration: one checkpoint must fit on --save's file system (rank 0 holds the lock), then
// --load's checkpoint goes into the model and the optimizer.
void Checkpointer::on_start(const RunStart& s, TrainerAccess& trainer) {
  world_ = &s.world;
  first_rank_ = s.world.rank() == 0;
  if (lock_) lock_->check_free_space(checkpoint_bytes(trainer.model(), trainer.settled_optimizer()));
  if (resume_) restore(trainer);
  if (trainer.model().lora() && (resume_ || !cfg_.save.empty())) record_lora_base(trainer.model());
}

// LoRA: the frozen base's checksum for the checkpoints' record; a LoRA checkpoint resumed over another base is
// refused (its adapters were trained for the base it records).
void Checkpointer::record_lora_base(const LlamaModel& model) {
  run_.lora_base.checksum = model.base_checksum();
  if (!resume_ || !resume_->lora) return;
  const LoraBaseRecord& saved = resume_->lora_base;
  PL_CHECK(saved.checksum == run_.lora_base.checksum,
           "--load {}: its adapters were trained over another base ({}, recipe {}, weights checksum {}); this run's "
           "base is {} (checksum {}): give the same base (--init-from-hf DIR, or the same --seed)",
           resume_->path, saved.source, saved.recipe, hex64(saved.checksum), run_.lora_base.source,
           hex64(run_.lora_base.checksum));
}

void Checkpointer::restore(TrainerAccess& trainer) {
  const VerifiedCheckpoint& c = *resume_;
  const auto t_load = std::chrono::steady_clock::now();
  if (trainer.model().lora() && !c.lora) {  // a full checkpoint as the frozen base (--peft lora --finetune)
    LlamaModel& model = trainer.model();
    stream_master_weights(c, [&](int64_t offset, const float* v, int64_t n) { model.write_base(offset, v, n); });
    model.prepare_weights();
    print_first(fmt::format("pretrain_llama | --peft lora: the frozen base is the weights of iteration {} of {} "
                            "({} parameters, rounded to BF16)",
                            c.iteration, c.path, c.model.num_parameters()));
    return;
  }
  restore_checkpoint(c, trainer.model(), trainer.settled_optimizer(), cfg_.finetune);
  const double secs = c.seconds + std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
  print_first(log::loaded_checkpoint_line(load_dir_, c.iteration, c.path, 2.0 * c.bytes, secs));
  if (cfg_.finetune)
    print_first(fmt::format("pretrain_llama | --finetune: the weights of iteration {} only; a fresh optimizer, "
                            "iteration 0",
                            c.iteration));
  else
    last_saved_ = c.iteration;
}

// Megatron's save points: every --save-interval iterations, and the last iteration this process runs (the
// end, --exit-interval, a signal, --exit-duration-in-mins) unless it was just saved. Every rank takes part.
void Checkpointer::on_iteration_end(const IterationEnd& e, TrainerAccess& trainer) {
  if (cfg_.save.empty()) return;
  const int64_t it = e.state.iteration;
  const bool interval = cfg_.save_interval > 0 && it % cfg_.save_interval == 0;
  if (!(interval || e.last) || it == last_saved_) return;
  print_first(log::saving_checkpoint_line(it, cfg_.save));
  // (settled_optimizer finishes the weight gather and the host step: an iteration that saves nothing leaves
  // them running into the next forward.)
  const SaveReport rep =
      save_checkpoint(cfg_.save, cfg_.keep_last, trainer.model(), trainer.settled_optimizer(), e.state, run_, {}, world_);
  last_saved_ = it;
  print_first(log::saved_checkpoint_line(it, cfg_.save, rep.path, rep.bytes, rep.seconds));
  for (const std::string& p : rep.pruned) print_first(fmt::format("pretrain_llama | --keep-last {}: removed {}", cfg_.keep_last, p));
}

}  // namespace pl::observe
