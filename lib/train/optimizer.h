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
//
// Overlapped (Megatron's --overlap-cpu-optimizer-d2h-h2d, "Overlap CPU optimizer step, gradients D2H and
// updated parameters H2D", megatron/training/arguments.py; Megatron's HybridDeviceOptimizer in
// megatron/core/optimizer/cpu_offloading/ overlaps them per parameter with streams and events): step()
// hands the host AdamW to a worker thread (made by the first such step, kept to the end) and returns at once. The worker
// updates and uploads the chunks in the order the next forward reads them (the flat layout's order:
// embedding, layer 0, 1, ..., final norm, LM head; while the next of those still waits for its gradients,
// which come down last for the embedding, a chunk from the top whose gradients are down goes first), and
// the model's weight gate (LlamaModel::weights_arrive_during_forward) makes the next forward wait per layer: the host until the
// uploads of the chunks holding that layer are queued, the compute stream (not the host) until they are
// done. Downloads and uploads have a stream each (CopyStream). Whatever else reads the weights, the
// masters or the moments first calls finish_host_step().
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
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
  double weight_decay = 0.033;  // Bridge's effective decay (the scheduler's constant 0.033); step(lr) uses it
  double clip_grad = 1.0;       // the global-norm bound; 0: no clipping (Megatron's clip_grad > 0.0 test)
  // The precision-aware optimizer's moment dtypes (--exp-avg-dtype / --exp-avg-sq-dtype): F32 or BF16
  // (stored as 2-byte bf16 on every backend; num::adamw_element_stored loads, computes in FP32, stores RNE).
  DType exp_avg_dtype = DType::F32;
  DType exp_avg_sq_dtype = DType::F32;
  // --optimizer-cpu-offload: master (the model's, allocated on the host) and moments in host memory;
  // AdamW runs on the host over chunks of this many elements (tests use small ones to cross boundaries).
  bool offload = false;
  int64_t offload_chunk_elements = kOffloadChunkElements;
  // --overlap-cpu-optimizer-d2h-h2d (with offload only): the host step on a worker thread, chunks in the
  // forward's order, the next forward waiting per layer (see the top of this file).
  bool overlap_host_step = false;
};

// The optimizer settings of a run: AdamW's hyper-parameters (--adam-beta1/2, --adam-eps, --weight-decay,
// --clip-grad) and the state dtypes (validated flags).
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
  // Waits for the host worker (errors go to stderr), leaves the model's weights complete.
  ~AdamW();
  // Movable until its first overlapped step: from then on the host worker and the model's weight gate
  // hold its address (a later move is an internal error at the next step).
  AdamW(AdamW&&) noexcept = default;
  AdamW& operator=(AdamW&&) = delete;

  struct Result {
    double grad_norm = 0.0;  // before clipping
    bool skipped = false;    // grad norm not finite: no update
  };
  // One step at learning rate lr and decoupled weight decay weight_decay (the schedule's; without it the
  // config's). A non-finite gradient norm skips the update (nothing changes). The gradient norm is computed
  // with clipping off too (--clip-grad 0): the skip and the log line read it (Megatron then logs 0.0).
  Result step(double lr, double weight_decay);
  Result step(double lr) { return step(lr, cfg_.weight_decay); }
  // --log-params-norm: the L2 norm of the FP32 master weights, over the ranks' shards with the distributed
  // optimizer (Megatron's calc_params_l2_norm on the main params). Finishes an overlapped host step first.
  double master_weights_norm();
  // The offload's listener for the last micro-batch's backward (MicroBatchOptions::grads_final_from): queues
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
    finish_host_step();
    copied_down_ = 0;
    if (offload_) copies_.compute_waits_for_copies();
  }
  // --overlap-cpu-optimizer-d2h-h2d: blocks until the host worker has finished the last step (rethrowing
  // its error), then the compute stream waits for every upload. Whatever reads the weights (other than
  // the next forward, which waits per layer), the masters or the moments calls it first: the next
  // gradient copies, a skipped step, evaluation, a checkpoint, the end of a run, tests. A no-op when no
  // host step is in flight (and without the flag).
  void finish_host_step();
  bool overlapped() const { return cfg_.overlap_host_step; }
  // Test hook: called with the first flat element of each offloaded chunk once its update is written
  // and its upload queued, on the thread that runs the host step (the worker, with the overlap). Set it
  // while no host step is in flight.
  void set_host_chunk_listener(std::function<void(int64_t chunk_begin)> fn) { chunk_listener_ = std::move(fn); }
  // The host AdamW's work since the last call (offload only): the time inside the update op (summed over
  // the chunks) and the bytes it moved (read and written: master, gradients, both moments, new weights).
  // With the overlap a step still running counts only the chunks it has done. For the timer lines.
  struct HostWork {
    double seconds = 0.0, bytes = 0.0;
  };
  HostWork take_host_work();
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
  struct HostWorker;  // --overlap-cpu-optimizer-d2h-h2d's thread (below)
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
  void start_host_step(const AdamWStep& s);
  void host_chunks(const AdamWStep& s, const OpContext& host);
  void host_chunks_forward_order(const AdamWStep& s, const OpContext& host);
  void host_chunk(const AdamWStep& s, const OpContext& host, int c, int order, int slot_before);
  static void worker_loop(HostWorker& w);
  void wait_for_uploads(int64_t end);
  int download_mark(int chunk) const { return chunk; }
  int upload_mark(int chunk) const { return static_cast<int>(chunks_.size()) + chunk; }
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
  // Offload state: the chunks (in flat order, each chunk_elements_ but the last), the pinned host copy of
  // the gradients, the ring of pinned staging slots for the updated weights, the copy streams (marks:
  // each chunk's download, then each chunk's upload), and how many chunks from the top have been queued
  // down this iteration.
  bool offload_ = false;
  std::vector<Chunk> chunks_;
  int64_t chunk_elements_ = 0;
  Buffer host_grads_, staging_;
  CopyStream copies_;
  int64_t copied_down_ = 0;
  std::function<void(int64_t)> on_final_;
  std::function<void(int64_t)> chunk_listener_;
  // The worker's bookkeeping of one step, by chunk: updated yet, the rank of its upload (read by the gate
  // under the worker's mutex); and the chunk of each rank (the staging ring's previous user).
  std::vector<uint8_t> updated_;
  std::vector<int> issued_at_, order_chunk_;
  // --overlap-cpu-optimizer-d2h-h2d: the worker thread (started by the first step, then kept to the end)
  // and what it shares with the caller (optimizer.cpp); the model's weight gate; a host step handed to
  // the worker and not yet finished (caller's thread only).
  struct StopWorker {
    void operator()(HostWorker* w) const;
  };
  std::unique_ptr<HostWorker, StopWorker> worker_;
  std::function<void(int64_t, int64_t)> gate_;
  bool host_step_in_flight_ = false;
  HostWork host_work_;  // guarded by the worker's mutex when there is one
};

}  // namespace pl
