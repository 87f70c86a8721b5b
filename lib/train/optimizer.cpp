#include "train/optimizer.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/timers.h"
#include "parallel/world.h"
#include "numerics/reduce.h"

namespace pl {

DType optimizer_state_dtype(const std::string& flag_value) {
  PL_CHECK(flag_value == "fp32" || flag_value == "bf16", "internal: optimizer state dtype '{}' not stored here",
           flag_value);
  return flag_value == "bf16" ? DType::BF16 : DType::F32;
}

OptimizerConfig optimizer_config(const TrainConfig& t) {
  validate_optimizer_dtypes(t);
  OptimizerConfig c;
  c.beta1 = t.adam_beta1;
  c.beta2 = t.adam_beta2;
  c.eps = t.adam_eps;
  c.weight_decay = t.weight_decay;
  c.clip_grad = t.clip_grad;
  c.exp_avg_dtype = optimizer_state_dtype(t.exp_avg_dtype);
  c.exp_avg_sq_dtype = optimizer_state_dtype(t.exp_avg_sq_dtype);
  c.offload = t.optimizer_cpu_offload;
  c.overlap_host_step = t.overlap_cpu_optimizer_d2h_h2d;
  return c;
}

// The [begin, end) ranges of `ranges` that fall inside [begin, begin + size), relative to begin.
static std::vector<int64_t> clip_ranges(const std::vector<int64_t>& ranges, int64_t begin, int64_t size) {
  std::vector<int64_t> out;
  for (size_t r = 0; r < ranges.size(); r += 2) {
    const int64_t lo = std::max(ranges[r], begin), hi = std::min(ranges[r + 1], begin + size);
    if (lo < hi) out.insert(out.end(), {lo - begin, hi - begin});
  }
  return out;
}

// The host worker of --overlap-cpu-optimizer-d2h-h2d: one thread for the whole run, woken once per step.
// `queued` counts the chunks (in the forward's order) whose uploads are queued in this step: the weight
// gate waits on it, since waiting on a CUDA event that is not recorded yet would wait for nothing.
struct AdamW::HostWorker {
  AdamW* owner = nullptr;  // the optimizer whose chunks it updates
  std::mutex mutex;
  std::condition_variable changed;
  bool start = false, busy = false, stop = false;
  int64_t queued = 0;
  AdamWStep step;
  OpContext host;  // the host ops' context, taken on the caller's thread at each step
  std::exception_ptr error;
  std::thread thread;
};

void AdamW::StopWorker::operator()(HostWorker* w) const {
  {
    const std::lock_guard lock(w->mutex);
    w->stop = true;
  }
  w->changed.notify_all();
  w->thread.join();
  delete w;
}

AdamW::AdamW(LlamaModel& model, const OptimizerConfig& cfg, const parallel::World* world)
    : model_(model), cfg_(cfg), world_(world), offload_(cfg.offload) {
  PL_CHECK(!(offload_ && model.sharded()), "internal: the optimizer offload with the distributed optimizer");
  PL_CHECK(!model.sharded() || world_ != nullptr, "internal: a sharded optimizer without its world");
  PL_CHECK(!(model.fp8_primary_weights() && (offload_ || model.sharded())),
           "internal: FP8 primary weights with the optimizer offload or the distributed optimizer");
  const size_t n = static_cast<size_t>(state_elements());
  const Device dev = model.grads().flat.device;
  PL_CHECK(dev == Device::CPU || offload_ == (model.master().flat.device == Device::CPU),
           "internal: optimizer offload {} but the model's master weights are on the {}", offload_ ? "on" : "off",
           device_name(model.master().flat.device));
  // The moments live beside the master weights (on the host when offloaded).
  const Device state = offload_ ? Device::CPU : dev;
  m_ = Buffer(n * dtype_size(cfg.exp_avg_dtype), state);  // zeroed (a zero bf16 is 0x0000)
  v_ = Buffer(n * dtype_size(cfg.exp_avg_sq_dtype), state);
  // Decay applies to 2-D tensors only: the others become no-decay ranges (adjacent ones merged).
  for (const ParamEntry& e : model.param_entries()) {
    if (e.is_matrix) continue;
    if (!no_decay_host_.empty() && no_decay_host_.back() == e.offset)
      no_decay_host_.back() = e.offset + e.numel();
    else
      no_decay_host_.insert(no_decay_host_.end(), {e.offset, e.offset + e.numel()});
  }
  if (model.sharded()) no_decay_host_ = clip_ranges(no_decay_host_, model.shard().begin, model.shard().shard);
  no_decay_.host = no_decay_host_.data();
  no_decay_.count = static_cast<int64_t>(no_decay_host_.size() / 2);
  if (dev == Device::CUDA && !offload_ && no_decay_.count > 0) {  // (the offload's step reads the host table)
    no_decay_device_ = Buffer(no_decay_host_.size() * sizeof(int64_t), dev);
    copy_from_host(no_decay_device_.as({static_cast<int64_t>(no_decay_host_.size()) * 2}, DType::I32),
                   no_decay_host_.data());
    no_decay_.device = static_cast<const int64_t*>(no_decay_device_.data());
  }
  PL_CHECK(offload_ || !cfg.overlap_host_step, "internal: the host step's overlap without the optimizer offload");
  if (offload_) prepare_offload();
  if (model.sharded()) {
    const int64_t chunks = (model.shard().real_size() + num::kSumSquaresChunk - 1) / num::kSumSquaresChunk;
    norm_partials_ = Buffer(static_cast<size_t>(std::max<int64_t>(1, chunks)) * 4, dev);
  }
}

// The distributed optimizer's gradient norm: this rank's chunk partials (its shard's real elements; the
// shards are chunk-aligned), gathered on rank 0 in rank order -- the one-rank run's partials of the whole
// gradient -- and added with the same tree; rank 0 sends the sum to all. Bit-identical to sum_of_squares
// over the whole gradient.
double AdamW::sharded_sum_of_squares(const Tensor& grads) {
  const int64_t chunks = (grads.numel() + num::kSumSquaresChunk - 1) / num::kSumSquaresChunk;
  std::vector<float> mine(static_cast<size_t>(chunks));
  if (chunks > 0) {
    const Tensor partials = norm_partials_.as({chunks}, DType::F32);
    sum_of_squares_chunks(model_.context(), partials, grads);
    copy_to_host(mine.data(), partials);
  }
  std::vector<uint64_t> bits(mine.size());
  for (size_t i = 0; i < mine.size(); ++i) bits[i] = std::bit_cast<uint32_t>(mine[i]);
  const std::vector<uint64_t> all = world_->gather(bits, 0);
  float total = 0.0f;
  if (world_->rank() == 0) {
    std::vector<float> partials(all.size());
    for (size_t i = 0; i < all.size(); ++i) partials[i] = std::bit_cast<float>(static_cast<uint32_t>(all[i]));
    total = partials.empty() ? 0.0f : num::group_tree_sum(partials.data(), static_cast<int64_t>(partials.size()));
  }
  world_->broadcast(&total, sizeof total, 0);
  return static_cast<double>(total);
}

AdamW::~AdamW() {
  if (!worker_) return;
  // Destructors must not throw: a failed host step is reported on stderr. The model's gate points here,
  // so a forward still to come gets its weights (and their quantized copies) now.
  try {
    finish_host_step();
    model_.settle_pending_weights();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "warning: the optimizer's last host step failed: %s\n", e.what());
  }
}  // (worker_'s deleter stops and joins the thread)

void AdamW::prepare_offload() {
  const int64_t n = model_.num_params();
  const Device dev = model_.grads().flat.device;
  chunk_elements_ = std::min(cfg_.offload_chunk_elements, n);
  PL_CHECK(chunk_elements_ >= 1, "internal: offload chunk of {} elements", cfg_.offload_chunk_elements);
  for (int64_t b = 0; b < n; b += chunk_elements_) {
    const int64_t size = std::min(chunk_elements_, n - b);
    chunks_.push_back({b, size, clip_ranges(no_decay_host_, b, size)});
  }
  // The host copy of the gradients in their dtype (bf16 bits for a GPU's BF16 main grads).
  host_grads_ = Buffer::pinned_host(static_cast<size_t>(n) * dtype_size(model_.grads().flat.dtype), dev);
  const DType storage = model_.weights().flat.dtype;
  staging_ = Buffer::pinned_host(static_cast<size_t>(chunk_elements_) * dtype_size(storage) * kOffloadStagingSlots, dev);
  copies_ = CopyStream(dev, 2 * static_cast<int>(chunks_.size()));
  updated_.assign(chunks_.size(), 0);
  order_chunk_.assign(chunks_.size(), 0);
  issued_at_.assign(chunks_.size(), 0);
}

// Chunks are queued from the top of the flat buffers down (the backward finishes the LM head first and
// the embedding last): every chunk lying wholly in [final_from, n) that is not queued yet. The host copy
// they overwrite is the last step's, which its host step must have finished reading.
void AdamW::queue_gradient_copies(int64_t final_from) {
  finish_host_step();
  const int64_t count = static_cast<int64_t>(chunks_.size());
  while (copied_down_ < count) {
    const int64_t c = count - 1 - copied_down_;
    const Chunk& ch = chunks_[static_cast<size_t>(c)];
    if (ch.begin < final_from) break;
    const Tensor src = model_.grads().flat.rows(ch.begin, ch.size);
    copies_.to_host(static_cast<char*>(host_grads_.data()) + static_cast<size_t>(ch.begin) * dtype_size(src.dtype), src,
                    download_mark(static_cast<int>(c)));
    ++copied_down_;
  }
}

// Chunk c of the host's AdamW, the `order`-th of the step: wait for the chunk's gradients and for the
// staging slot's previous upload (that of chunk `slot_before`, or none: -1), update its masters and
// moments and write its new weights into the slot (the CPU backend's op: the same element math as every
// backend), then queue the slot's upload. `host`: the model's context on the CPU backend, timed only off
// the worker (the caller's thread owns the timers: they are single-threaded).
void AdamW::host_chunk(const AdamWStep& s, const OpContext& host, int c, int order, int slot_before) {
  const DType storage = model_.weights().flat.dtype, gdt = model_.grads().flat.dtype;
  const int slot = order % kOffloadStagingSlots;
  const Chunk& ch = chunks_[static_cast<size_t>(c)];
  if (host.timers) host.timers->start(TimerId::OptimizerCopyToMainGrad);
  copies_.wait(download_mark(c));
  if (slot_before >= 0) copies_.wait(upload_mark(slot_before));
  if (host.timers) host.timers->stop(TimerId::OptimizerCopyToMainGrad);
  const Tensor staged =
      staging_.as({ch.size}, storage, static_cast<size_t>(slot * chunk_elements_) * dtype_size(storage));
  ElementRanges nd;
  nd.host = ch.no_decay.data();
  nd.count = static_cast<int64_t>(ch.no_decay.size() / 2);
  const auto rows = [&](const Buffer& b, DType t) { return b.as({ch.size}, t, static_cast<size_t>(ch.begin) * dtype_size(t)); };
  const auto t0 = std::chrono::steady_clock::now();
  adamw_update_multi(host, staged, model_.master().flat.rows(ch.begin, ch.size), rows(host_grads_, gdt),
                     rows(m_, cfg_.exp_avg_dtype), rows(v_, cfg_.exp_avg_sq_dtype), nd, s);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  copies_.to_device(model_.weights().flat.rows(ch.begin, ch.size), staged.data, upload_mark(c));
  // Read and written: the master (twice), the moments (twice each); read: the gradients; written: the weights.
  const double per_element = 8.0 + static_cast<double>(dtype_size(gdt) + dtype_size(storage)) +
                             2.0 * static_cast<double>(dtype_size(cfg_.exp_avg_dtype) + dtype_size(cfg_.exp_avg_sq_dtype));
  {
    std::unique_lock<std::mutex> lock;
    if (worker_) lock = std::unique_lock(worker_->mutex);
    host_work_.seconds += seconds;
    host_work_.bytes += per_element * static_cast<double>(ch.size);
  }
  if (chunk_listener_) chunk_listener_(ch.begin);
}

// Every chunk, from the LM head down to the embedding: the order the gradients arrive in.
void AdamW::host_chunks(const AdamWStep& s, const OpContext& host) {
  const int count = static_cast<int>(chunks_.size());
  for (int i = 0; i < count; ++i) {
    const int c = count - 1 - i;
    host_chunk(s, host, c, i, i >= kOffloadStagingSlots ? c + kOffloadStagingSlots : -1);
  }
}

// The worker's order: the forward's (the embedding first). But the embedding's gradients are the last to
// come down, so while the next chunk in the forward's order still waits for its download and the top
// chunk not yet updated (the LM head's end) has arrived, that one is updated instead: the host does not
// idle during the downloads' tail, and the forward's order is kept wherever the gradients allow it (on
// the CPU backend, whose copies are done at once, it is exactly the forward's order). The gate's counter
// `queued` is the length of the prefix of chunks updated and uploaded; issued_at_ their upload's rank.
void AdamW::host_chunks_forward_order(const AdamWStep& s, const OpContext& host) {
  const int count = static_cast<int>(chunks_.size());
  std::fill(updated_.begin(), updated_.end(), uint8_t{0});
  int low = 0, high = count - 1, prefix = 0;
  for (int i = 0; i < count; ++i) {
    const bool take_high = low < high && !copies_.done(download_mark(low)) && copies_.done(download_mark(high));
    const int c = take_high ? high-- : low++;
    order_chunk_[static_cast<size_t>(i)] = c;
    host_chunk(s, host, c, i, i >= kOffloadStagingSlots ? order_chunk_[static_cast<size_t>(i - kOffloadStagingSlots)] : -1);
    updated_[static_cast<size_t>(c)] = 1;
    {
      const std::lock_guard lock(worker_->mutex);
      issued_at_[static_cast<size_t>(c)] = i;
      while (prefix < count && updated_[static_cast<size_t>(prefix)]) ++prefix;
      worker_->queued = prefix;
    }
    worker_->changed.notify_all();
  }
}

void AdamW::worker_loop(HostWorker& w) {
  std::unique_lock lock(w.mutex);
  for (;;) {
    w.changed.wait(lock, [&] { return w.start || w.stop; });
    if (w.stop) return;
    w.start = false;
    const AdamWStep s = w.step;
    const OpContext host = w.host;
    lock.unlock();
    std::exception_ptr error;
    try {
      w.owner->copies_.use_on_this_thread();
      w.owner->host_chunks_forward_order(s, host);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    w.error = error;
    w.busy = false;
    w.changed.notify_all();
  }
}

// After the gradients are queued down: hand the host step to the worker and make the next forward wait
// for each layer's chunks (the gate), or run it here, from the LM head down, and make the compute stream
// wait for all of it.
void AdamW::start_host_step(const AdamWStep& s) {
  queue_gradient_copies(0);  // whatever the backward did not announce (e.g. a step without a listener)
  copied_down_ = 0;
  copies_.compute_waits_for_downloads();  // the next iteration overwrites the gradients they read
  copies_.uploads_wait_for_compute();     // the backward still reads the weights the uploads overwrite
  OpContext host = model_.context();
  host.device = Device::CPU;
  host.gpu = nullptr;
  if (!cfg_.overlap_host_step) {
    host_chunks(s, host);
    copies_.compute_waits_for_copies();
    return;
  }
  if (!worker_) {
    worker_.reset(new HostWorker);
    worker_->owner = this;
    HostWorker* w = worker_.get();
    worker_->thread = std::thread([w] { worker_loop(*w); });
  }
  PL_CHECK(worker_->owner == this, "internal: the optimizer moved after its first overlapped step");
  {
    const std::lock_guard lock(worker_->mutex);
    worker_->step = s;
    worker_->host = host;
    worker_->host.timers = nullptr;
    worker_->queued = 0;
    worker_->start = worker_->busy = true;
  }
  worker_->changed.notify_all();
  host_step_in_flight_ = true;
  gate_ = [this](int64_t, int64_t end) { wait_for_uploads(end); };
  model_.weights_arrive_during_forward(&gate_);
}

// The weight gate: the forward is about to read flat elements [.., end). The host waits until the worker
// has queued the uploads of every chunk up to the one holding element end - 1, then the compute stream
// waits for the last queued of them, which the one upload stream finishes after all earlier ones.
void AdamW::wait_for_uploads(int64_t end) {
  if (!host_step_in_flight_ || end <= 0) return;
  const int64_t last = (end - 1) / chunk_elements_;
  bool failed = false;
  int latest = 0;
  {
    std::unique_lock lock(worker_->mutex);
    worker_->changed.wait(lock, [&] { return worker_->queued > last || !worker_->busy; });
    failed = worker_->queued <= last;
    for (int c = 0; !failed && c <= static_cast<int>(last); ++c)
      if (issued_at_[static_cast<size_t>(c)] > issued_at_[static_cast<size_t>(latest)]) latest = c;
  }
  if (failed) finish_host_step();  // rethrows the worker's error
  copies_.compute_waits_for(upload_mark(latest));
}

void AdamW::finish_host_step() {
  if (!host_step_in_flight_) return;
  std::exception_ptr error;
  {
    std::unique_lock lock(worker_->mutex);
    worker_->changed.wait(lock, [&] { return !worker_->busy; });
    error = std::exchange(worker_->error, nullptr);
  }
  host_step_in_flight_ = false;
  if (error) std::rethrow_exception(error);
  copies_.compute_waits_for_copies();
}

AdamW::HostWork AdamW::take_host_work() {
  std::unique_lock<std::mutex> lock;
  if (worker_) lock = std::unique_lock(worker_->mutex);
  return std::exchange(host_work_, HostWork{});
}

double AdamW::master_weights_norm() {
  finish_host_step();
  const Tensor master = model_.master().flat;
  if (model_.sharded()) {
    const ShardLayout& sh = model_.shard();
    return std::sqrt(sharded_sum_of_squares(master.rows(sh.real_begin() - sh.begin, sh.real_size())));
  }
  OpContext ctx = model_.context();
  ctx.timers = nullptr;  // (not the optimizer's clip timer: this is logging)
  if (master.device == Device::CPU) {  // the offload's masters are on the host
    ctx.device = Device::CPU;
    ctx.gpu = nullptr;
  }
  return std::sqrt(sum_of_squares(ctx, master));
}

AdamW::Result AdamW::step(double lr, double weight_decay) {
  finish_host_step();  // (the last one is done by now: the forward waited for every chunk)
  const OpContext& ctx = model_.context();
  Result r;
  // The distributed optimizer: this rank's shard of the reduced gradients; the norm over its real
  // elements' chunk partials, added on rank 0 with the one-rank tree (sharded_sum_of_squares).
  const ShardLayout& shard = model_.shard();
  const Tensor grads = model_.sharded() ? model_.grads_padded().rows(shard.begin, shard.shard) : model_.grads().flat;
  const double squares = model_.sharded()
                             ? sharded_sum_of_squares(model_.grads_padded().rows(shard.real_begin(), shard.real_size()))
                             : sum_of_squares(ctx, grads);
  r.grad_norm = std::sqrt(squares);
  if (!std::isfinite(r.grad_norm)) {
    r.skipped = true;
    drop_queued_gradient_copies();
    return r;
  }
  const double clip = cfg_.clip_grad / (r.grad_norm + 1e-6);
  const float grad_scale = cfg_.clip_grad > 0.0 && clip < 1.0 ? static_cast<float>(clip) : 1.0f;
  ++step_;
  const int64_t n = state_elements();
  AdamWStep s;
  s.lr = static_cast<float>(lr);
  s.beta1 = static_cast<float>(cfg_.beta1);
  s.beta2 = static_cast<float>(cfg_.beta2);
  s.eps = static_cast<float>(cfg_.eps);
  s.weight_decay = static_cast<float>(weight_decay);  // 0 inside no_decay_ (the norm weights)
  s.step = step_;
  s.grad_scale = grad_scale;
  if (offload_) {
    start_host_step(s);
    return r;
  }
  // One pass over the flat buffers (one launch on the GPU), bit-identical to one adamw_update per tensor.
  const Tensor m = m_.as({n}, cfg_.exp_avg_dtype), v = v_.as({n}, cfg_.exp_avg_sq_dtype);
  const Tensor weights = model_.sharded() ? model_.weights_padded().rows(shard.begin, shard.shard) : model_.weights().flat;
  adamw_update_multi(ctx, weights, model_.master().flat, grads, m, v, no_decay_, s);
  // FP8 primary weights: the step wrote no BF16 weights (weights is [0]); the ones the model keeps now, the
  // FP8 layers' copies at prepare_weights.
  if (model_.fp8_primary_weights()) model_.copy_master_to_kept_weights();
  return r;
}

}  // namespace pl
