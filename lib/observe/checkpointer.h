#pragma once
// Megatron's checkpoints as an observer of the run: --load's verified checkpoint restored before the first
// iteration (all of it, or with --finetune the weights only), and --save written at Megatron's save points
// (megatron/training/training.py): every --save-interval iterations, and when the run ends or stops early
// unless that iteration was just saved. It owns the --save directory's lock (train/checkpoint.h
// SaveDirectoryLock, rank 0's, taken at start-up) and checks the free space for one checkpoint before the
// first iteration. Lines (rank 0): Megatron's saving/saved/loaded lines and the --keep-last removals.
#include <memory>
#include <optional>
#include <string>

#include "observe/megatron_text_log.h"
#include "train/checkpoint.h"

namespace pl::observe {

struct CheckpointConfig {
  std::string save;            // --save ("" = no saves)
  int64_t save_interval = 0;   // --save-interval (0: only at the end or an early stop)
  int64_t keep_last = 0;       // --keep-last (0: keep all)
  bool finetune = false;       // --finetune: --load's weights only (fresh optimizer, iteration 0)
};

class Checkpointer : public TrainObserver {
 public:
  // resume: --load's checkpoint, verified (or none); lock: rank 0's lock on --save (null on the other ranks and
  // without --save).
  Checkpointer(const CheckpointConfig& c, RunDescription run, std::optional<VerifiedCheckpoint> resume,
               std::unique_ptr<SaveDirectoryLock> lock, std::string load_dir, LineFn out);
  // Where a resumed run continues: the checkpoint's loop state, or iteration 0 (no --load, or --finetune).
  TrainState start_state() const;
  void on_start(const RunStart& s, TrainerAccess& trainer) override;
  void on_iteration_end(const IterationEnd& e, TrainerAccess& trainer) override;

 private:
  void restore(TrainerAccess& trainer);
  void record_lora_base(const LlamaModel& model);
  void print_first(const std::string& line) const {
    if (first_rank_) out_(line);
  }
  CheckpointConfig cfg_;
  RunDescription run_;
  std::optional<VerifiedCheckpoint> resume_;
  std::unique_ptr<SaveDirectoryLock> lock_;
  std::string load_dir_;
  LineFn out_;
  const parallel::World* world_ = nullptr;
  bool first_rank_ = true;
  int64_t last_saved_ = -1;
};

}  // namespace pl::observe
