#pragma once
// Megatron's evaluate (megatron/training/training.py): eval_iters global batches of a split, forward only, the
// loss summed over every micro-batch of every rank and divided by the tokens counted in it.
#include <cstdint>

#include "config/train_config.h"
#include "model/llama.h"
#include "parallel/world.h"
#include "train/trainer.h"

namespace pl {

// cfg.eval_iters global batches of `data` from sample `first_sample` (this rank's slice of each, as training's
// sampler gives it), forward only, untimed: the token-weighted mean loss over all ranks.
double evaluation_loss(LlamaModel& model, const TrainConfig& cfg, const parallel::World& world, const BatchFn& data,
                       int64_t first_sample);

}  // namespace pl
