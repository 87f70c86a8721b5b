#pragma once
// AdamW on the fp32 master weights with global-norm clipping, as Megatron's optimizer with
// bf16_mixed: grad norm over all fp32 grads before clipping, clip_coeff = max_norm/(norm+1e-6)
// applied when < 1, decoupled weight decay on 2-D tensors only, new bf16 weights from the masters.
//
// Offloaded (Megatron's --optimizer-cpu-offload): the master weights and moments stay in host memory.
// During the last micro-batch's backward each chunk of gradients is copied down as soon as it is final
// (CopyStream: a second stream, under the rest of the backward); the gradient norm is computed where the
// gradients are (the same op, bit-identical on every backend); then the host runs the CPU backend's
// adamw_update_multi chunk by chunk, in the order the copies arrive, writing the new bf16 weights into
// a pinned staging slot whose upload starts at once (under the next chunk's host work). The per-element
// math is the same num::adamw_element_stored, so offloaded and on-device steps agree bit for bit.
#include <cstdint>
#include <functional>
#include <vector>

#include "config/train_config.h"
#include "core/tensor.h"
#include "model/llama.h"
#include "model/memory_plan.h"

namespace pl {
namespace parallel {
class World;
}

struct OptimizerConfig {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.033;  // Bridge's effective decay (the scheduler's constant 0.033)
  double clip_grad = 1.0;
  // The precision-aware optimizer's moment dtypes (--exp-avg-dtype / --exp-avg-sq-dtype): F32 or BF16
  // (stored as 2-byte bf16 on every backend; num::adamw_element_stored loads, computes in FP32, stores RNE).
  DType exp_avg_dtype = DType::F32;
  DType exp_avg_sq_dtype = DType::F32;
  // --optimizer-cpu-offload: master (the model's, allocated on the host) and moments in host memory;
  // AdamW runs on the host over chunks of this many elements (tests use small ones to cross boundaries).
  bool offload = false;
  int64_t offload_chunk_elements = kOffloadChunkElements;
};

// The optimizer settings of a run: the defaults with the run's state dtypes (validated flags).
OptimizerConfig optimizer_config(const TrainConfig& t);
// "fp32" -> F32, "bf16" -> BF16 (the moment dtypes this optimizer stores).
DType optimizer_state_dtype(const std::string& flag_value);

// With Megatron's distributed optimizer (the model's ShardLayout) AdamW holds the moments of this rank's
// shard only and updates that shard of the master weights and bf16 weights from the reduced gradients of
// the shard; the gradient norm is the square root of the sum over the ranks of each shard's sum of squares
// (`world`), so it is the norm of the whole gradient. The weight all-gather is the trainer's
// (GradientSync::gather_weights).
class AdamW {
 public:
  AdamW(LlamaModel& model, const OptimizerConfig& cfg, const parallel::World* world = nullptr);

  struct Result {
    double grad_norm = 0.0;  // before clipping
    bool skipped = false;    // grad norm not finite: no update
  };
  // One step at learning rate lr. A non-finite gradient norm skips the update (nothing changes).
  Result step(double lr);
  // The offload's listener for the last micro-batch's backward (StepOptions::grads_final_from): queues
  // the copy to the host of every chunk whose gradients are now final. Null without offload.
  // (Bound to this object at each call, so a moved AdamW hands out a listener that points at itself.)
  const std::function<void(int64_t)>* gradient_copy_listener() {
    if (!offload_) return nullptr;
    on_final_ = [this](int64_t begin) { queue_gradient_copies(begin); };
    return &on_final_;
  }
  // An iteration that does not step (its loss or gradient norm was not finite): the copies it queued
  // are forgotten, and the compute stream waits for them before it overwrites the gradients they read.
  void drop_queued_gradient_copies() {
    copied_down_ = 0;
    if (offload_) copies_.compute_waits_for_copies();
  }
  int64_t steps_taken() const { return step_; }
  // Checkpoint access: the moments (flat, the layout of the master weights, in their dtypes) and the step count.
  const Buffer& moment1() const { return m_; }
  const Buffer& moment2() const { return v_; }
  // [num_params], or with the distributed optimizer [shard] (elements model.shard().begin ..).
  Tensor moment1_tensor() const { return m_.as({state_elements()}, cfg_.exp_avg_dtype); }
  Tensor moment2_tensor() const { return v_.as({state_elements()}, cfg_.exp_avg_sq_dtype); }
  const OptimizerConfig& config() const { return cfg_; }
  void restore_steps_taken(int64_t steps) { step_ = steps; }
  size_t state_bytes() const { return m_.bytes() + v_.bytes(); }

 private:
  // The optimizer offload (--optimizer-cpu-offload): one chunk of the flat buffers and its no-decay
  // ranges relative to the chunk.
  struct Chunk {
    int64_t begin = 0, size = 0;
    std::vector<int64_t> no_decay;
  };
  int64_t state_elements() const { return model_.master().flat.numel(); }
  double sharded_sum_of_squares(const Tensor& grads);
  void prepare_offload();
  void queue_gradient_copies(int64_t final_from);
  void host_step(const AdamWStep& s);
  LlamaModel& model_;
  OptimizerConfig cfg_;
  const parallel::World* world_ = nullptr;  // sums the shards' squared norms (distributed optimizer)
  Buffer norm_partials_;                 // the shard's sum_of_squares_chunks (distributed optimizer)
  Buffer m_, v_;
  // The elements without weight decay (the 1-D norm weights) as sorted [begin, end) ranges of the flat
  // buffers (of this rank's shard, relative to its start, with the distributed optimizer): on the host,
  // and on the device once (built at construction, read by every step).
  std::vector<int64_t> no_decay_host_;
  Buffer no_decay_device_;
  ElementRanges no_decay_;
  int64_t step_ = 0;
  // Offload state: the chunks (in flat order), the pinned host copy of the gradients, the ring of
  // pinned staging slots for the updated weights, the copy stream (marks: one per chunk, then one
  // per staging slot), and how many chunks from the top have been queued down this iteration.
  bool offload_ = false;
  std::vector<Chunk> chunks_;
  Buffer host_grads_, staging_;
  CopyStream copies_;
  int64_t copied_down_ = 0;
  std::function<void(int64_t)> on_final_;
};

}  // namespace pl
