#include "train/evaluation.h"

#include <algorithm>
#include <vector>

#include "data/documents.h"

namespace pl {

double evaluation_loss(LlamaModel& model, const TrainConfig& cfg, const parallel::World& world, const BatchFn& data,
                       int64_t first_sample) {
  const int64_t T = model.tokens_per_micro_batch();
  const int64_t M = cfg.num_micro_batches(), dp = cfg.data_parallel_size, rank = world.rank();
  std::vector<int32_t> tokens(static_cast<size_t>(T)), labels(static_cast<size_t>(T));
  std::vector<int32_t> positions(model.packing().explicit_documents ? static_cast<size_t>(T) : 0);
  const ScopedTimers untimed(model, nullptr);  // the evaluation's ops are not in the training timers
  // Megatron's evaluate sums every micro-batch's [loss sum, token count] over eval_iters batches and reports
  // sum / count. The losses stay on the device and are read once per model.loss_slots() micro-batches.
  // With masked positions (--eod-mask-loss) the count is of the positions counted (data/documents.h), as
  // Megatron's loss_func reports [Σ masked losses, Σ loss_mask]; without, every token: the same division.
  double sums[2] = {0.0, 0.0};  // loss sum, counted tokens
  double& loss_sum = sums[0];
  const int64_t K = model.loss_slots();
  for (int64_t e = 0; e < cfg.eval_iters; ++e)
    for (int64_t m = 0; m < M; ++m) {
      data(first_sample + e * cfg.global_batch_size, m * dp + rank, tokens, labels, positions);  // the sampler's slice
      sums[1] += static_cast<double>(data::counted_tokens(model.packing(), tokens, labels));
      const int64_t slot = (e * M + m) % K;
      model.queue_forward(slot, tokens.data(), labels.data(), positions.empty() ? nullptr : positions.data());
      if (slot == K - 1 || (e == cfg.eval_iters - 1 && m == M - 1)) loss_sum = model.add_loss_sums(slot + 1, loss_sum);
    }
  // Megatron all-reduces the sums over the data-parallel group. No counted token at all: loss 0 (Megatron's
  // 0/0 would print NaN), the same rule as training's.
  world.all_reduce_sum(sums);
  return loss_sum / std::max(sums[1], 1.0);
}

}  // namespace pl
