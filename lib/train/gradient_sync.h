#pragma once
// Data parallelism's gradient and weight synchronisation, as Megatron's DistributedDataParallel with its
// ParamAndGradBuffer (megatron/core/distributed/): the gradients of every rank are summed (each rank's
// backward already scaled them by 1 / (tokens of the whole global batch)), then
//   - plain data parallelism: all-reduced, every rank steps the whole model;
//   - the distributed optimizer: reduced onto the rank that owns each element (its shard, ShardLayout),
//     which steps its shard; then the updated BF16 weights are all-gathered.
// Buckets (--overlap-grad-reduce): ranges of the flat gradients made of whole groups of parameters (the
// LM head with the final norm, each layer, the embedding: the order in which the backward finishes
// them), from the top down, each closed once it holds --ddp-bucket-size elements (Megatron's default
// max(40M, 1M x data-parallel size)); the last micro-batch's backward announces each finished group
// (MicroBatchOptions::grads_final_from) and every bucket now complete is reduced on the communication stream
// while the rest of the backward runs: all-reduced (plain), or each owner's part of it reduced to its
// owner (the distributed optimizer; rank-contiguous shards, so a bucket is cut at shard boundaries).
// Without --overlap-grad-reduce: one bucket, reduced after the backward (one reduce-scatter or
// all-reduce of the whole buffer).
#include <cstdint>
#include <functional>
#include <vector>

#include "config/train_config.h"
#include "parallel/communicator.h"
#include "model/llama.h"

namespace pl {

// [begin, end) ranges of the flat buffer.
struct GradBucket {
  int64_t begin = 0, end = 0;
};
// The buckets, top down (the order the backward completes them); the top one reaches `padded`.
std::vector<GradBucket> grad_buckets(const std::vector<ParamEntry>& entries, int64_t num_params, int64_t padded,
                                     int64_t bucket_elements);
// Megatron's bucket size in elements: --ddp-bucket-size, else max(40000000, 1000000 * dp) with the
// overlap, else everything in one bucket (0 here).
int64_t ddp_bucket_elements(const TrainConfig& t);

class GradientSync {
 public:
  GradientSync(LlamaModel& model, parallel::Communicator& comm, const TrainConfig& cfg);
  // For the last micro-batch's backward: reduces each bucket as soon as it is complete (with
  // --overlap-grad-reduce and more than one rank; null otherwise). Bound at each call (see AdamW's).
  const std::function<void(int64_t)>* listener();
  // After the last backward: reduces the buckets not reduced yet and waits for all of them. Then the
  // summed gradients are in place: the whole buffer, or this rank's shard (distributed optimizer).
  void finish_gradient_reduction();
  // After a step of the distributed optimizer: every rank's updated weight shard to every rank. With
  // --overlap-param-gather the gathers are only queued, bucket by bucket in the order the forward reads
  // them (the embedding's first), each bucket's owners' parts broadcast from their owners; the model's next
  // forward waits for each bucket when it reaches it (LlamaModel::weights_arrive_during_forward).
  void gather_weights();
  // Waits for every weight gather still in flight (before anything but the forward reads the weights).
  void finish_weight_gather();
  size_t bucket_count() const { return buckets_.size(); }

 private:
  template <class Fn>
  void for_each_owner_part(const GradBucket& b, Fn&& fn) const;
  void reduce_bucket(const GradBucket& b, bool async);
  void wait_for_weights(int64_t begin, int64_t end);
  LlamaModel& model_;
  parallel::Communicator& comm_;
  bool overlap_ = false;
  std::vector<GradBucket> buckets_;
  size_t launched_ = 0;  // buckets (from the top) whose reduction is queued this iteration
  std::function<void(int64_t)> on_final_;
  // --overlap-param-gather: per bucket (index into buckets_), the communicator's queued() count after its
  // gather was queued (0: none in flight); the gate the model calls.
  bool overlap_gather_ = false;
  std::vector<size_t> gather_mark_;
  LlamaModel::WeightGate gate_;
};

}  // namespace pl
