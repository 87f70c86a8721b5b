#pragma once
// What the training tests that run a model on mock data share: the micro-batches of a MockGPTDataset as the
// trainer asks for them, and the RunDescription a checkpoint of such a run records.
#include <span>
#include <string>

#include "config/model_config.h"
#include "config/train_config.h"
#include "data/mock_dataset.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace pl::test {

// The trainer's training batches from `data` (which must outlive them), micro_batch_size samples each.
inline BatchFn mock_batches(const data::MockGPTDataset& data, const TrainConfig& t) {
  return [&data, mbs = t.micro_batch_size](int64_t first, int64_t mi, std::span<int32_t> tok, std::span<int32_t> lab,
                                          std::span<int32_t>) { data.micro_batch(first, mi, mbs, tok, lab); };
}

// A test run's description for its checkpoints (metadata.json).
inline RunDescription mock_run_description(const ModelConfig& m, const std::string& recipe, const TrainConfig& t) {
  RunDescription d;
  d.model = m;
  d.recipe_name = recipe;
  d.train = t;
  d.command_line = {"test"};
  d.data = "mock";
  return d;
}

}  // namespace pl::test
