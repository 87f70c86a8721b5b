#include "train/gradient_sync.h"

#include <algorithm>

#include "core/error.h"

namespace pl {

int64_t ddp_bucket_elements(const TrainConfig& t) {
  // Megatron-LM megatron/core/distributed/distributed_data_parallel.py (__init__): bucket_size defaults
  // to max(40000000, 1000000 * dp size) and is None (one bucket) without overlap_grad_reduce.
  if (!t.overlap_grad_reduce) return 0;
  if (t.ddp_bucket_size > 0) return t.ddp_bucket_size;
  return std::max<int64_t>(40000000, 1000000 * t.data_parallel_size);
}

std::vector<GradBucket> grad_buckets(const std::vector<ParamEntry>& entries, int64_t num_params, int64_t padded,
                                     int64_t bucket_elements) {
  // Group starts, top down: the final norm + LM head, layer L-1, ..., layer 0, the embedding (offset 0).
  std::vector<int64_t> starts;
  for (size_t first = 1; first < entries.size(); first += kEntriesPerLayer) starts.push_back(entries[first].offset);
  starts.push_back(0);
  std::sort(starts.rbegin(), starts.rend());
  PL_CHECK(!starts.empty() && starts.front() < num_params && num_params <= padded, "internal: bucket layout");
  std::vector<GradBucket> out;
  int64_t end = padded;
  for (int64_t begin : starts) {
    const bool last = begin == 0;
    if (bucket_elements > 0 && end - begin < bucket_elements && !last) continue;
    if (bucket_elements == 0 && !last) continue;
    out.push_back({begin, end});
    end = begin;
  }
  return out;
}

GradientSync::GradientSync(LlamaModel& model, parallel::Communicator& comm, const TrainConfig& cfg)
    : model_(model),
      comm_(comm),
      overlap_(cfg.overlap_grad_reduce && comm.size() > 1),
      overlap_gather_(cfg.overlap_param_gather && model.sharded()) {
  PL_CHECK(comm.size() == cfg.data_parallel_size, "internal: {} ranks but data-parallel size {}", comm.size(),
           cfg.data_parallel_size);
  buckets_ = grad_buckets(model.param_entries(), model.num_params(), model.shard().padded, ddp_bucket_elements(cfg));
  gather_mark_.assign(buckets_.size(), 0);
}

const std::function<void(int64_t)>* GradientSync::listener() {
  if (!overlap_) return nullptr;
  on_final_ = [this](int64_t final_from) {
    while (launched_ < buckets_.size() && buckets_[launched_].begin >= final_from)
      reduce_bucket(buckets_[launched_++], true);
  };
  return &on_final_;
}

// fn(owner, lo, hi) for each rank's part [lo, hi) of bucket b (shards are contiguous: a bucket is cut at
// shard boundaries).
template <class Fn>
void GradientSync::for_each_owner_part(const GradBucket& b, Fn&& fn) const {
  const int64_t shard = model_.shard().shard;
  for (int64_t q = b.begin / shard; q < comm_.size() && q * shard < b.end; ++q) {
    const int64_t lo = std::max(b.begin, q * shard), hi = std::min(b.end, (q + 1) * shard);
    if (lo < hi) fn(static_cast<int>(q), lo, hi);
  }
}

void GradientSync::reduce_bucket(const GradBucket& b, bool async) {
  const Tensor grads = model_.grads_padded();
  if (!model_.sharded()) {
    comm_.all_reduce_sum(grads.rows(b.begin, b.end - b.begin), async);
    return;
  }
  // The distributed optimizer: each owner's part of the bucket summed onto its owner.
  for_each_owner_part(b, [&](int owner, int64_t lo, int64_t hi) { comm_.reduce_sum(grads.rows(lo, hi - lo), owner, async); });
}

void GradientSync::finish_gradient_reduction() {
  if (launched_ == 0) {
    // Nothing overlapped: the whole buffer at once.
    const Tensor grads = model_.grads_padded();
    if (model_.sharded())
      comm_.reduce_scatter_sum(grads, false);
    else
      comm_.all_reduce_sum(grads, false);
  } else {
    while (launched_ < buckets_.size()) reduce_bucket(buckets_[launched_++], false);
  }
  comm_.wait();
  launched_ = 0;
}

void GradientSync::gather_weights() {
  if (!overlap_gather_) {
    model_.gather_weights();
    return;
  }
  // Bottom up (buckets_ is top down): the forward reads the embedding first.
  const Tensor weights = model_.weights_padded();
  for (size_t i = buckets_.size(); i-- > 0;) {
    for_each_owner_part(buckets_[i], [&](int owner, int64_t lo, int64_t hi) {
      comm_.broadcast(weights.rows(lo, hi - lo), owner, true);
    });
    gather_mark_[i] = comm_.queued();
  }
  gate_ = [this](int64_t begin, int64_t end) { wait_for_weights(begin, end); };
  model_.weights_arrive_during_forward(&gate_);
}

// The compute stream waits for the gathers of the buckets that hold [begin, end): the latest queued of them
// (the communicator completes collectives in the order queued).
void GradientSync::wait_for_weights(int64_t begin, int64_t end) {
  size_t upto = 0;
  for (size_t i = 0; i < buckets_.size(); ++i)
    if (buckets_[i].begin < end && begin < buckets_[i].end) upto = std::max(upto, gather_mark_[i]);
  comm_.wait_first(upto);
}

void GradientSync::finish_weight_gather() {
  if (!overlap_gather_) return;
  comm_.wait();
  std::fill(gather_mark_.begin(), gather_mark_.end(), size_t{0});
}

}  // namespace pl
