#include "model/llama.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <span>

#include "core/error.h"
#include "core/timers.h"
#include "parallel/communicator.h"
#include "model/init.h"

namespace pl {

LlamaModel::LlamaModel(const ModelConfig& cfg, int64_t micro_batch, int64_t seq_length, const OpContext& ctx)
    : LlamaModel(cfg, micro_batch, seq_length, ctx, bf16_plan(cfg)) {}

LlamaModel::LlamaModel(const ModelConfig& cfg, int64_t micro_batch, int64_t seq_length, const OpContext& ctx,
                       const PrecisionPlan& plan, const RunLayout& options)
    : cfg_(cfg),
      B_(micro_batch),
      S_(seq_length),
      ctx_(ctx),
      plan_(plan),
      layout_(options),
      entries_(options.lora ? lora_layout(cfg, *options.lora) : param_layout(cfg)),
      base_entries_(param_layout(cfg)) {
  PL_CHECK(micro_batch > 0 && seq_length > 0, "model needs a positive micro-batch and sequence length");
  PL_CHECK(options.loss_micro_batches >= 1, "internal: loss_micro_batches = {} (must be >= 1)",
           options.loss_micro_batches);
  PL_CHECK(plan_.num_layers() == cfg.num_layers, "internal: precision plan for {} layers, model has {}",
           plan_.num_layers(), cfg.num_layers);
  // LoRA trains the adapters over a frozen base: the options that offload or round the full model's optimizer
  // state do not apply (the flags are refused in one line before a model is built).
  PL_CHECK(!lora() || (!options.optimizer_offload && !options.bf16_main_grads),
           "internal: LoRA with the optimizer offload or BF16 main grads");
  if (lora() && options.lora->has_adapters()) validate_lora_config(*options.lora);  // (none: an evaluation model)
  trainable_ = entries_.empty() ? 0 : entries_.back().offset + entries_.back().numel();
  // On the GPU the plan is the context's GPU's.
  mem_ = plan_memory(cfg_, B_, S_, ctx_.device, plan_, layout_, device_sm(ctx_));
  // The distributed optimizer pads the weights and gradients and keeps only this rank's shard of the
  // master weights (ShardLayout); otherwise the shard is the whole buffer.
  shard_ = shard_layout(num_params(), layout_);
  const size_t n = static_cast<size_t>(shard_.padded);
  const DType storage = float_storage(ctx_.device);
  // FP8 primary weights: BF16 storage for the kept ranges only (packed), and one FP8 layer's rounding scratch.
  primary_ = !lora() && fp8_primary_weights_in_effect(plan_, layout_);
  kept_ = bf16_weight_ranges(cfg_, plan_, layout_);
  int64_t kept_elements = 0;
  for (size_t r = 0; r < kept_.size(); r += 2) kept_elements += kept_[r + 1] - kept_[r];
  weight_buf_ = Buffer((primary_ ? static_cast<size_t>(kept_elements) : n) * dtype_size(storage), ctx_.device);
  if (primary_)
    primary_scratch_ = Buffer(static_cast<size_t>(primary_weight_scratch_elements(plan_, layout_)) * dtype_size(storage),
                              ctx_.device);
  // Main grads: FP32, or BF16 with --main-grads-dtype bf16 (the device's bf16 storage: FP32 on the CPU).
  const DType grad_type = layout_.bf16_main_grads ? float_storage(ctx_.device) : DType::F32;
  grad_buf_ = Buffer(n * dtype_size(grad_type), ctx_.device);
  // With the optimizer offloaded the FP32 master weights live in host memory, where AdamW updates them.
  master_buf_ = Buffer(static_cast<size_t>(shard_.shard) * 4, options.optimizer_offload ? Device::CPU : ctx_.device);
  if (lora()) {
    allocate_lora_views(storage, grad_type);
  } else {
    weights_ = primary_ ? kept_weight_views(cfg_, entries_, kept_, weight_buf_.data(), storage, ctx_.device)
                        : views_of(weight_buf_, storage);
    grads_ = views_of(grad_buf_, grad_type);
    if (sharded())
      master_.flat = master_buf_.as({shard_.shard}, DType::F32);
    else
      master_ = views_of(master_buf_, DType::F32);
  }
  allocate_activations();
  if (layout_.bf16_main_grads) grad_work_ = views_at(acts_.grad_scratch.data, DType::F32, ctx_.device, true);
  // Ops with grow-only device scratch size it on their first call: make the gradient-norm reduction's
  // happen now rather than in the training loop.
  if (ctx_.device == Device::CUDA && trainable_ > 0) (void)sum_of_squares(ctx_, grads_.flat);
}

std::vector<ParamEntry> param_layout(const ModelConfig& cfg) {
  const int64_t h = cfg.hidden_size, V = cfg.vocab_size, f = cfg.ffn_hidden_size;
  const double std = cfg.init_method_std;
  const double out_std = std / std::sqrt(2.0 * static_cast<double>(cfg.num_layers));  // scaled_init_method_normal
  std::vector<ParamEntry> entries;
  int64_t offset = 0;
  auto add = [&](std::string name, int64_t rows, int64_t cols, bool matrix, double init_std) {
    entries.push_back({std::move(name), rows, cols, offset, matrix, init_std});
    offset += rows * cols;
  };
  add("embedding.word_embeddings.weight", V, h, true, std);
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    const std::string p = fmt::format("decoder.layers.{}.", l);
    add(p + "self_attention.linear_qkv.layer_norm_weight", 1, h, false, 0.0);
    add(p + "self_attention.linear_qkv.weight", cfg.qkv_dim(), h, true, std);
    add(p + "self_attention.linear_proj.weight", h, cfg.q_dim(), true, out_std);
    add(p + "mlp.linear_fc1.layer_norm_weight", 1, h, false, 0.0);
    add(p + "mlp.linear_fc1.weight", 2 * f, h, true, std);
    add(p + "mlp.linear_fc2.weight", h, f, true, out_std);
  }
  add("decoder.final_layernorm.weight", 1, h, false, 0.0);
  add("output_layer.weight", V, h, true, std);
  PL_CHECK(offset == cfg.num_parameters(), "internal: parameter layout {} != {}", offset, cfg.num_parameters());
  return entries;
}

// Views of flat storage at `base` by parameter. group_relative: each parameter at its offset within its
// group of kEntriesPerLayer-entry layers (the embedding; layer l; the final norm with the LM head), so all
// layers share the same memory: the BF16 main grads' FP32 scratch of one group.
ParamViews param_views(const ModelConfig& cfg, const std::vector<ParamEntry>& entries, void* base, DType t, Device d,
                       bool group_relative) {
  const size_t es = dtype_size(t);
  auto view = [&](const ParamEntry& e, int64_t group_begin) {
    void* p = e.offset < 0 ? nullptr  // no storage (kept_weight_views)
                           : static_cast<char*>(base) + static_cast<size_t>(e.offset - (group_relative ? group_begin : 0)) * es;
    return e.rows == 1 ? Tensor(p, {e.cols}, t, d) : Tensor(p, {e.rows, e.cols}, t, d);
  };
  ParamViews v;
  size_t i = 0;
  v.embedding = view(entries[i++], 0);
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    const int64_t b = entries[i].offset;
    LayerParams lp;
    lp.ln1 = view(entries[i++], b);
    lp.qkv = view(entries[i++], b);
    lp.proj = view(entries[i++], b);
    lp.ln2 = view(entries[i++], b);
    lp.fc1 = view(entries[i++], b);
    lp.fc2 = view(entries[i++], b);
    v.layers.push_back(lp);
  }
  const int64_t head = entries[i].offset;
  v.final_norm = view(entries[i++], head);
  v.lm_head = view(entries[i++], head);
  v.flat = Tensor(base, {group_relative ? largest_grad_group(cfg) : cfg.num_parameters()}, t, d);
  return v;
}

ParamViews kept_weight_views(const ModelConfig& cfg, std::vector<ParamEntry> entries, const std::vector<int64_t>& kept,
                             void* base, DType t, Device d) {
  // Each entry's offset in the packed buffer, or -1 (no storage): ranges are made of whole entries.
  int64_t packed = 0;
  size_t r = 0;
  for (ParamEntry& e : entries) {
    while (r < kept.size() && kept[r + 1] <= e.offset) {
      packed += kept[r + 1] - kept[r];
      r += 2;
    }
    e.offset = r < kept.size() && kept[r] <= e.offset ? packed + (e.offset - kept[r]) : -1;
  }
  ParamViews v = param_views(cfg, entries, base, t, d);
  v.flat = Tensor(nullptr, {0}, t, d);  // (AdamW's param: the BF16 weights are not written by the step)
  return v;
}

ParamViews LlamaModel::views_at(void* base, DType t, Device d, bool group_relative) const {
  return param_views(cfg_, base_entries_, base, t, d, group_relative);
}

ParamViews LlamaModel::views_of(const Buffer& buf, DType t) const { return views_at(buf.data(), t, buf.device(), false); }

void LlamaModel::allocate_activations() {
  arena_ = Buffer(static_cast<size_t>(mem_.activations), ctx_.device);
  auto place = [&](Tensor& t, const ArenaSlot& s) {
    if (s.dims.empty()) return;
    t = Tensor(static_cast<char*>(arena_.data()) + s.offset, {}, s.type, ctx_.device);
    t.ndim = static_cast<int>(s.dims.size());
    for (int i = 0; i < t.ndim; ++i) t.shape[i] = s.dims[i];
  };
  const auto slots = Activations<ArenaSlot>::all(mem_.arena);
  const auto tensors = Activations<Tensor>::all(acts_);
  for (size_t i = 0; i < slots.size(); ++i) place(*tensors[i], *slots[i]);
  acts_.layers.resize(mem_.arena.layers.size());
  for (size_t l = 0; l < acts_.layers.size(); ++l) {
    const auto ls = Activations<ArenaSlot>::Layer::all(mem_.arena.layers[l]);
    const auto lt = Activations<Tensor>::Layer::all(acts_.layers[l]);
    for (size_t i = 0; i < ls.size(); ++i) place(*lt[i], *ls[i]);
  }

  const int64_t T = B_ * S_, d = cfg_.kv_channels;
  std::vector<LinearWorkspace*> workspace_of;
  for (int64_t first : mem_.workspaces) {
    linear_workspaces_.push_back(std::make_unique<LinearWorkspace>(
        LinearWorkspace::allocate(quant_buffers_, ctx_.device, plan_.linears[static_cast<size_t>(first)], T)));
    workspace_of.push_back(linear_workspaces_.back().get());
  }
  allocate_weight_t_scratches();
  linears_.reserve(plan_.linears.size());
  for (size_t i = 0; i < plan_.linears.size(); ++i) {
    const int64_t w = mem_.workspace_of[i], t = mem_.weight_t_of[i];
    const QuantizedCopy* weight_t = t < 0 ? nullptr : &weight_t_[static_cast<size_t>(t)].columnwise;
    linears_.emplace_back(plan_.linears[i], T, static_cast<uint32_t>(i * 4), ctx_.device, quant_buffers_,
                          w < 0 ? nullptr : workspace_of[static_cast<size_t>(w)], acts_.quant_scratch_a,
                          acts_.quant_scratch_b, lora(), weight_t);
  }
  fp8_state_ = DelayedScalingState::allocate(quant_buffers_, ctx_.device, plan_);
  fp8_state_.reset();
  for (int64_t i = 0, q = 0; fp8_state_.enabled() && i < static_cast<int64_t>(linears_.size()); ++i)
    if (linears_[static_cast<size_t>(i)].plan().quantized())
      linears_[static_cast<size_t>(i)].attach_delayed_scaling(fp8_state_.slots(q++));

  std::vector<float> cos(static_cast<size_t>(S_ * d / 2)), sin(cos.size());
  rope_tables(cfg_, S_, cos.data(), sin.data());
  copy_from_host(acts_.rope_cos, cos.data());
  copy_from_host(acts_.rope_sin, sin.data());
  losses_ = acts_.losses_all.rows(0, 1).view({T});
  host_losses_.resize(static_cast<size_t>(layout_.loss_micro_batches * T));
  // Document-aware packing's host buffers, for the worst case (every token its own document).
  const data::DocumentPacking& pack = layout_.packing;
  PL_CHECK(!pack.explicit_documents || (pack.reset_position_ids && pack.reset_attention_mask),
           "internal: explicit documents without their positions and offsets (data::packing_for_data sets all three)");
  if (pack.eod_mask_loss) host_labels_.resize(static_cast<size_t>(T));
  if (pack.reset_position_ids) host_positions_.resize(static_cast<size_t>(T));
  if (pack.reset_attention_mask) host_offsets_.resize(static_cast<size_t>(T + 1));
  // Pinned staging for tokens + labels (+ positions and offsets), two slots (see UploadStaging): allocated
  // here, never in the loop.
  const size_t ids = 2 * static_cast<size_t>(T) + host_positions_.size() + host_offsets_.size();
  staging_ = UploadStaging(ids * sizeof(int32_t), 2, ctx_.device);
}

void LlamaModel::write_master(int64_t offset, const float* values, int64_t count) {
  const int64_t lo = std::max(offset, shard_.begin), hi = std::min(offset + count, shard_.real_end());
  if (lo >= hi) return;
  copy_from_host(master_.flat.rows(lo - shard_.begin, hi - lo), values + (lo - offset));
}

void LlamaModel::init_parameters(uint64_t seed) {
  // Values are generated on the host (counter-based, so identical for every device and every rank)
  // tensor by tensor and copied into the fp32 master buffer wherever it lives: with the distributed
  // optimizer only the tensors that reach into this rank's shard, and only that part of them.
  std::vector<float> staging;
  const bool everything = !lora();
  for (size_t i = 0; i < base_entries_.size(); ++i) {
    const ParamEntry& e = base_entries_[i];
    if (everything && (e.offset + e.numel() <= shard_.begin || e.offset >= shard_.real_end())) continue;
    staging.resize(static_cast<size_t>(e.numel()));
    initial_parameter_values(e, static_cast<uint64_t>(i), seed, staging.data());
    write_base(e.offset, staging.data(), e.numel());
  }
  if (lora()) return init_adapters(seed);
  sync_weights_from_master();
  zero_grads();
}

void LlamaModel::gather_weights() {
  if (!sharded()) return;
  PL_CHECK(comm_ != nullptr, "internal: sharded weights but no communicator to gather them");
  comm_->all_gather(weights_padded(), false);
  comm_->wait();
}

void LlamaModel::sync_weights_from_master() {
  if (sharded()) {
    // This rank's shard of the weights from its masters, then every rank's shard to every rank.
    copy_master_to_param(ctx_, weights_padded().rows(shard_.begin, shard_.shard), master_.flat);
    gather_weights();
  } else if (primary_) {
    copy_master_to_kept_weights();
  } else if (master_.flat.device == weights_.flat.device) {
    copy_master_to_param(ctx_, weights_.flat, master_.flat);
  } else {
    // Master on the host (optimizer offload), weights on the GPU: rounded on the host by the same op
    // (bf16 bits), uploaded piece by piece. Runs at initialisation and checkpoint load, not in the loop.
    OpContext host = ctx_;
    host.device = Device::CPU;
    host.gpu = nullptr;
    const DType storage = weights_.flat.dtype;
    const int64_t n = num_params(), piece = std::min<int64_t>(n, kOffloadChunkElements);
    std::vector<uint8_t> bytes(static_cast<size_t>(piece) * dtype_size(storage));
    for (int64_t b = 0; b < n; b += piece) {
      const int64_t len = std::min(piece, n - b);
      const Tensor staged(bytes.data(), {len}, storage, Device::CPU);
      copy_master_to_param(host, staged, master_.flat.rows(b, len));
      copy_from_host(weights_.flat.rows(b, len), bytes.data());
    }
  }
  prepare_weights();
}

void LlamaModel::prepare_weights() {
  for (int64_t l = 0; l < cfg_.num_layers; ++l) prepare_layer_weights(l);
  weights_pending_ = false;
}

void LlamaModel::prepare_layer_weights(int64_t l) {
  const LayerParams& w = weights_.layers[l];
  const Tensor* ws[4] = {&w.qkv, &w.proj, &w.fc1, &w.fc2};
  for (int k = 0; k < 4; ++k) {
    if (ws[k]->data == nullptr && lora()) continue;  // a frozen quantized-only base linear: quantized at load
    linear(l, k).prepare_weight(linear_ctx(k), ws[k]->data != nullptr ? *ws[k] : rounded_master_weight(l, k));
  }
}

// The master's linear weights of layer l, in the order of its LinearSlot kinds.
static const Tensor& master_linear(const LayerParams& m, int kind) {
  const Tensor* ms[4] = {&m.qkv, &m.proj, &m.fc1, &m.fc2};
  return *ms[kind];
}

Tensor LlamaModel::rounded_master_weight(int64_t l, int kind) {
  const Tensor& m = master_linear(master_.layers[static_cast<size_t>(l)], kind);
  const Tensor s = primary_scratch_.as({m.numel()}, weights_.flat.dtype);
  copy_master_to_param(linear_ctx(kind), s, m.view({m.numel()}));
  return s.view({m.dim(0), m.dim(1)});
}

Tensor LlamaModel::backward_weight(int64_t l, int kind, const MicroBatchOptions& step) {
  const Tensor& w = master_linear(weights_.layers[static_cast<size_t>(l)], kind);
  return w.data != nullptr || !step.collect_quant_stats ? w : rounded_master_weight(l, kind);
}

void LlamaModel::copy_master_to_kept_weights() {
  PL_CHECK(primary_, "internal: the kept BF16 weights are written by AdamW unless FP8 primary weights are on");
  int64_t packed = 0;
  for (size_t r = 0; r < kept_.size(); r += 2) {
    const int64_t len = kept_[r + 1] - kept_[r];
    const DType storage = weights_.flat.dtype;
    copy_master_to_param(ctx_, weight_buf_.as({len}, storage, static_cast<size_t>(packed) * dtype_size(storage)),
                         master_.flat.rows(kept_[r], len));
    packed += len;
  }
}

void LlamaModel::weights_to_host(int64_t first, int64_t count, void* dst) const {
  const DType storage = weights_.flat.dtype;
  const size_t es = dtype_size(storage);
  auto* out = static_cast<char*>(dst);
  if (!primary_) {
    copy_to_host(dst, weight_buf_.as({shard_.padded}, storage).rows(first, count));
    return;
  }
  // Piece by piece: a kept range from the packed buffer, any other from the master rounded on the host by
  // the same op (copy_master_to_param on the CPU backend: the same bits as the device's).
  const OpContext host{.device = Device::CPU, .round_bf16 = ctx_.round_bf16};
  std::vector<float> master;
  int64_t packed = 0, at = first;
  const int64_t end = first + count;
  for (size_t r = 0; at < end; r += 2) {
    const bool past = r >= kept_.size();
    const int64_t kb = past ? end : kept_[r], ke = past ? end : kept_[r + 1];
    if (at < kb) {  // a gap before this kept range: from the master
      const int64_t len = std::min(kb, end) - at;
      master.resize(static_cast<size_t>(len));
      copy_to_host(master.data(), master_.flat.rows(at, len));
      copy_master_to_param(host, Tensor(out + (at - first) * es, {len}, storage), Tensor(master.data(), {len}, DType::F32));
      at += len;
    }
    if (!past && at < end && at < ke) {
      const int64_t len = std::min(ke, end) - at;
      copy_to_host(out + (at - first) * es, weight_buf_.as({len}, storage, static_cast<size_t>(packed + at - kb) * es));
      at += len;
    }
    if (!past) packed += ke - kb;
  }
}

void LlamaModel::weights_arrive_during_forward(const WeightGate* gate) {
  PL_CHECK(!lora(), "internal: a weight gate over LoRA's frozen base");
  gate_ = gate;
  weights_pending_ = true;
}

void LlamaModel::settle_pending_weights() {
  if (!weights_pending_) return;
  (*gate_)(0, num_params());
  prepare_weights();
}

// --overlap-param-gather and --overlap-cpu-optimizer-d2h-h2d: the weights of flat elements [begin, end) are about to be read; the first forward
// after a step waits for them there (and makes a layer's quantized copies then), not before it starts.
void LlamaModel::before_reading_weights(int64_t begin, int64_t end, int64_t layer) {
  if (!weights_pending_) return;
  (*gate_)(begin, end);
  if (layer >= 0) prepare_layer_weights(layer);
}

std::vector<LinearStats> LlamaModel::quant_stats() const {
  std::vector<LinearStats> out;
  for (size_t i = 0; i < linears_.size(); ++i)
    if (linears_[i].plan().quantized() && !linears_[i].stats().empty())
      out.push_back({static_cast<int64_t>(i / 4), kLinearNames[i % 4], linears_[i].stats()});
  return out;
}

// The padding of the distributed optimizer's buffers too: its gradients must stay zero.
void LlamaModel::zero_grads() { fill_zero(ctx_, grads_padded()); }

// The ids were checked where the batch was built (data::TrainingData::micro_batch names the sample), and on the
// CPU the embedding and cross-entropy ops check them again; the GPU kernels skip an id outside [0, V) rather
// than read out of bounds (op_checks.cpp ids_in_vocab).
void LlamaModel::upload_batch(const int32_t* tokens, const int32_t* labels, const int32_t* positions) {
  const int64_t T = B_ * S_;
  PL_CHECK((positions != nullptr) == layout_.packing.explicit_documents,
           "internal: a micro-batch {} positions for a model {}", positions ? "with" : "without",
           layout_.packing.explicit_documents ? "whose data gives them (an SFT dataset)" : "that derives them");
  if (positions != nullptr)
    for (int64_t i = 0; i < T; ++i)
      PL_CHECK(positions[i] == 0 || (i % S_ != 0 && positions[i] == positions[i - 1] + 1),
               "position {} of sample {} of the micro-batch (index {}) does not continue or restart its document",
               positions[i], i / S_, i % S_);
  upload_packed(tokens, labels, positions);
}

// The micro-batch's ids with what RunLayout::packing derives from them (data/documents.h), through one staging
// slot. CUDA: async copies from pinned staging on the default stream, ordered before the ops that read the
// ids and after those of the previous micro-batch; CPU: memcpy.
void LlamaModel::upload_packed(const int32_t* tokens, const int32_t* labels, const int32_t* positions) {
  const data::DocumentPacking& pack = layout_.packing;
  const auto T = static_cast<size_t>(B_ * S_);
  const std::span<const int32_t> tok(tokens, T);
  if (pack.eod_mask_loss) {
    (void)data::masked_labels(pack, tok, std::span<const int32_t>(labels, T), host_labels_);
    labels = host_labels_.data();
  }
  // An SFT pack brings its positions, and its documents follow from them; else both come from the EOD tokens.
  if (pack.explicit_documents) std::copy(positions, positions + T, host_positions_.begin());
  else if (pack.reset_position_ids) data::position_ids(pack, tok, S_, host_positions_);
  if (pack.reset_position_ids) positions_ = {host_positions_.data(), acts_.positions.i32()};
  if (pack.reset_attention_mask) {
    const int64_t count = pack.explicit_documents
                              ? data::document_offsets_from_positions(host_positions_, S_, host_offsets_)
                              : data::document_offsets(pack, tok, S_, host_offsets_);
    docs_ = {host_offsets_.data(), acts_.doc_offsets.i32(), count};
  }
  // (An empty tensor is an upload that is off: UploadStaging skips it.)
  const Tensor positions_t = pack.reset_position_ids ? acts_.positions : Tensor{};
  const Tensor offsets_t = pack.reset_attention_mask ? acts_.doc_offsets.rows(0, docs_.count + 1) : Tensor{};
  staging_.upload({{acts_.tokens, tokens}, {acts_.labels, labels}, {positions_t, host_positions_.data()},
                   {offsets_t, host_offsets_.data()}});
}

void LlamaModel::use_loss_slot(int64_t slot) {
  PL_CHECK(slot >= 0 && slot < layout_.loss_micro_batches, "internal: loss slot {} of {}", slot,
           layout_.loss_micro_batches);
  losses_ = acts_.losses_all.rows(slot, 1).view({B_ * S_});
}

void LlamaModel::queue_forward(int64_t slot, const int32_t* tokens, const int32_t* labels, const int32_t* positions) {
  use_loss_slot(slot);
  upload_batch(tokens, labels, positions);
  run_forward(0.0f, false);
}

void LlamaModel::queue_forward_backward(int64_t slot, const int32_t* tokens, const int32_t* labels, float grad_scale,
                                        const MicroBatchOptions& step, const int32_t* positions) {
  queue_training_forward(slot, tokens, labels, grad_scale, positions, step.counter);
  queue_backward(step);
}

void LlamaModel::queue_training_forward(int64_t slot, const int32_t* tokens, const int32_t* labels, float grad_scale,
                                        const int32_t* positions, uint64_t counter) {
  lora_counter_ = counter;
  use_loss_slot(slot);
  upload_batch(tokens, labels, positions);
  run_forward(grad_scale, true);
  backward_pending_ = true;
}

void LlamaModel::queue_backward(const MicroBatchOptions& step) {
  PL_CHECK(backward_pending_, "internal: a backward without its training forward");
  backward_pending_ = false;
  run_backward(step);
  // FP8 delayed scaling: this micro-batch's amaxes into the histories, new scales for the next one.
  if (fp8_state_.enabled()) update_delayed_scaling();
}

// Transformer Engine's reduce_amax (transformer_engine/pytorch/quantization.py, FP8GlobalStateManager.
// reduce_and_update_fp8_tensors: one MAX all-reduce of the current amaxes over the amax reduction group, the
// data-parallel group in Megatron, before the history update), so every rank rolls the same histories and
// computes the same scales, and a checkpoint (rank 0's) resumes every rank. The current amaxes are the
// histories' row 0 ([len, n] layout). The compute stream waits for the reduction only (wait_first keeps the
// gradient buckets' bookkeeping of an overlapped reduction intact).
void LlamaModel::update_delayed_scaling() {
  if (comm_ != nullptr && comm_->size() > 1) {
    comm_->all_reduce_max(fp8_state_.history.rows(0, 1).view({fp8_state_.history.dim(1)}), false);
    comm_->wait_first(comm_->queued());
  }
  fp8_state_.update(ctx_);
}

double LlamaModel::forward(const int32_t* tokens, const int32_t* labels, const int32_t* positions) {
  queue_forward(0, tokens, labels, positions);
  return add_loss_sums(1, 0.0);
}

double LlamaModel::forward_backward(const int32_t* tokens, const int32_t* labels, float grad_scale,
                                    const MicroBatchOptions& step, const int32_t* positions) {
  queue_forward_backward(0, tokens, labels, grad_scale, step, positions);
  return add_loss_sums(1, 0.0);
}

void LlamaModel::run_discarded_step() {
  const size_t T = static_cast<size_t>(B_ * S_);
  const std::vector<int32_t> zeros(T, 0);  // token 0 everywhere; position 0 everywhere: one-token documents
  prepare_weights();
  queue_training_forward(0, zeros.data(), zeros.data(), 1.0f, layout_.packing.explicit_documents ? zeros.data() : nullptr);
  queue_backward(MicroBatchOptions{});
  zero_grads();
  fp8_state_.reset();
}

double LlamaModel::add_loss_sums(int64_t slots, double acc) {
  PL_CHECK(slots >= 1 && slots <= layout_.loss_micro_batches, "internal: reading {} loss slots of {}", slots,
           layout_.loss_micro_batches);
  const int64_t T = B_ * S_;
  copy_to_host(host_losses_.data(), acts_.losses_all.rows(0, slots));  // the one device -> host wait
  for (int64_t m = 0; m < slots; ++m) {
    double sum = 0.0;
    const float* l = host_losses_.data() + m * T;
    for (int64_t i = 0; i < T; ++i) sum += l[i];
    acc += sum;
  }
  return acc;
}

// One decoder layer: out = h + MLP(norm(h)) with h = x + Attn(norm(x)), x = acts_.layers[l].resid_in.
// Each residual add is fused with the RMSNorm that reads its sum (add_rmsnorm_forward, bit for bit
// add then rmsnorm_forward): h with ln2; when fused, out with the next layer's ln1 or the final norm,
// whose weight is then read here, before that layer's own weights (the --overlap-param-gather gate
// waits for it first). Each producer of a linear layer's input (the norms, SwiGLU) writes that input's amax
// where the layer takes it (LinearLayer::producer_x_amax; empty: not asked).
void LlamaModel::layer_forward(int64_t l, const Tensor& out, bool fused) {
  const AttentionShape as = attention_shape();  // with the micro-batch's documents (recomputation too)
  const float eps = static_cast<float>(cfg_.layernorm_epsilon);
  const int64_t rotated = cfg_.num_attention_heads + cfg_.num_query_groups;
  auto& a = acts_.layers[l];
  const LayerParams& w = weights_.layers[l];
  // ln1 of a fused layer l > 0 was made (with its amax) by layer l - 1's output add.
  const Tensor qkv_amax = linear(l, kQkv).producer_x_amax();
  if (!fused || l == 0) rmsnorm_forward(ctx_, a.ln1, a.rstd1, a.resid_in, w.ln1, eps, qkv_amax);
  linear(l, kQkv).forward(linear_ctx(kQkv), a.qkv, a.ln1, w.qkv, qkv_amax.data != nullptr);
  adapter_forward(l, kQkv, a.qkv, a.ln1);
  rope_forward(ctx_, a.qkv, acts_.rope_cos, acts_.rope_sin, S_, rotated, cfg_.kv_channels, positions_);
  attention_forward(ctx_, a.attn, a.lse, a.qkv, as);
  linear(l, kProj).forward(linear_ctx(kProj), acts_.d_h, a.attn, w.proj);  // acts_.d_h is free during the forward: scratch
  adapter_forward(l, kProj, acts_.d_h, a.attn);
  const Tensor fc1_amax = linear(l, kFc1).producer_x_amax(), fc2_amax = linear(l, kFc2).producer_x_amax();
  add_rmsnorm_forward(ctx_, a.resid_mid, a.ln2, a.rstd2, a.resid_in, acts_.d_h, w.ln2, eps, fc1_amax);
  linear(l, kFc1).forward(linear_ctx(kFc1), a.fc1, a.ln2, w.fc1, fc1_amax.data != nullptr);
  adapter_forward(l, kFc1, a.fc1, a.ln2);
  swiglu_forward(ctx_, a.swi, a.fc1, fc2_amax);
  linear(l, kFc2).forward(linear_ctx(kFc2), acts_.d_h, a.swi, w.fc2, fc2_amax.data != nullptr);
  adapter_forward(l, kFc2, acts_.d_h, a.swi);
  if (!fused) {
    add(ctx_, out, a.resid_mid, acts_.d_h);
    return;
  }
  // The next norm's weight is its group's first entry (param_layout): layer l+1's ln1, or the final norm.
  const bool last = l + 1 == cfg_.num_layers;
  const size_t next = 1 + kEntriesPerLayer * static_cast<size_t>(l + 1);
  before_reading_weights(base_entries_[next].offset, base_entries_[next + 1].offset, -1);
  if (last) {
    add_rmsnorm_forward(ctx_, out, acts_.lnf, acts_.rstdf, a.resid_mid, acts_.d_h, weights_.final_norm, eps, {});
  } else {
    auto& n = acts_.layers[l + 1];
    add_rmsnorm_forward(ctx_, out, n.ln1, n.rstd1, a.resid_mid, acts_.d_h, weights_.layers[l + 1].ln1, eps,
                        linear(l + 1, kQkv).producer_x_amax());
  }
}

// (The weight gate of --overlap-param-gather and the offload's overlap reads the flat layout of every parameter:
// LoRA, which has neither, passes the base's offsets, never read.)
void LlamaModel::run_forward(float grad_scale, bool want_grad) {
  const size_t head = 1 + kEntriesPerLayer * static_cast<size_t>(cfg_.num_layers);
  lora_training_ = want_grad;
  before_reading_weights(0, base_entries_[1].offset, -1);
  embedding_forward(ctx_, acts_.embed_out, acts_.tokens, weights_.embedding);
  for (int64_t l = 0; l < cfg_.num_layers; ++l) {
    const size_t first = 1 + kEntriesPerLayer * static_cast<size_t>(l);
    before_reading_weights(base_entries_[first].offset, base_entries_[first + kEntriesPerLayer].offset, l);
    layer_forward(l, l + 1 < cfg_.num_layers ? acts_.layers[l + 1].resid_in : acts_.resid_out, true);
  }
  before_reading_weights(base_entries_[head].offset, cfg_.num_parameters(), -1);
  weights_pending_ = false;
  // acts_.lnf and acts_.rstdf were made by the last layer's output add (num_layers >= 1: model_config.cpp).
  linear_forward(with_pass(with_linear(ctx_, LinearKind::LmHead), GemmPass::Fprop), acts_.logits, acts_.lnf,
                 weights_.lm_head);
  if (greedy_out_ != nullptr) mark_greedy_labels();
  cross_entropy_forward_backward(ctx_, losses_, acts_.logits, acts_.labels, want_grad ? grad_scale : 0.0f);
}

void LlamaModel::run_backward(const MicroBatchOptions& step) {
  // acts_.logits now holds dlogits.
  // The gradients are final group by group: the final norm with the LM head, each layer from the last,
  // the embedding (entries of param_layout: embedding, kEntriesPerLayer per layer, final norm, LM head). With BF16 main
  // grads a group's gradients of this micro-batch go to the FP32 scratch (zeroed first) and are then
  // added into the BF16 main grads, rounded once; then the offload's listener hears that everything
  // from the group's first element on is final. Under LoRA the groups are the layers' adapters (the flat
  // elements from layer l's first adapter on are final after layer l's backward; all of them after layer 0's),
  // and the frozen base's weight gradients are not computed: no wgrad GEMM, no embedding backward; the norms'
  // weight gradients, which their backward makes with the input gradient, go to a sink.
  const bool bf16 = layout_.bf16_main_grads, frozen = lora();
  ParamViews& g_all = bf16 ? grad_work_ : grads_;
  const Tensor norm_sink = frozen ? norm_grad_sink_.as({cfg_.hidden_size}, DType::F32) : Tensor{};
  auto group_size = [&](size_t first, size_t next) {
    return (next < entries_.size() ? entries_[next].offset : num_params()) - entries_[first].offset;
  };
  auto begin_group = [&](size_t first, size_t next) {
    if (bf16) fill_zero(ctx_, acts_.grad_scratch.rows(0, group_size(first, next)));
  };
  PL_CHECK(bf16 || !step.overwrite_main_grads, "internal: overwriting the main grads without BF16 main grads");
  auto end_group = [&](size_t first, size_t next) {
    const int64_t b = entries_[first].offset, size = group_size(first, next);
    // (The first micro-batch's overwrite: the FP32 -> main-grads rounding copy, the same rounding.)
    if (bf16 && step.overwrite_main_grads)
      copy_master_to_param(ctx_, grads_.flat.rows(b, size), acts_.grad_scratch.rows(0, size));
    else if (bf16)
      accumulate_bf16(ctx_, grads_.flat.rows(b, size), acts_.grad_scratch.rows(0, size));
    if (step.grads_final_from) (*step.grads_final_from)(b);
  };
  const size_t head = 1 + kEntriesPerLayer * static_cast<size_t>(cfg_.num_layers);
  if (!frozen) begin_group(head, entries_.size());
  const OpContext lm_head = with_linear(ctx_, LinearKind::LmHead);
  if (!frozen) linear_backward_weight(with_pass(lm_head, GemmPass::Wgrad), g_all.lm_head, acts_.logits, acts_.lnf);
  linear_backward_input(with_pass(lm_head, GemmPass::Dgrad), acts_.d_ln, acts_.logits, weights_.lm_head);
  rmsnorm_backward_overwrite(ctx_, acts_.d_resid, frozen ? norm_sink : g_all.final_norm, acts_.d_ln, acts_.resid_out,
                             weights_.final_norm, acts_.rstdf);
  if (!frozen) end_group(head, entries_.size());
  for (int64_t l = cfg_.num_layers - 1; l >= 0; --l) {
    const size_t first = 1 + kEntriesPerLayer * static_cast<size_t>(l);
    if (!frozen) begin_group(first, first + kEntriesPerLayer);
    layer_backward(l, frozen ? LayerParams{} : g_all.layers[l], frozen ? norm_sink : g_all.layers[l].ln1,
                   frozen ? norm_sink : g_all.layers[l].ln2, step);
    if (frozen)
      adapters_final_from(l, step);
    else
      end_group(first, first + kEntriesPerLayer);
  }
  if (frozen) return;
  begin_group(0, 1);
  embedding_backward(ctx_, g_all.embedding, acts_.d_resid, acts_.tokens);
  end_group(0, 1);
}

// Layer l's backward from acts_.d_resid = dL/d(layer output), into g (its weight gradients; empty views: frozen,
// dgrad only) and g_ln1/g_ln2 (its norms' weight gradients, or LoRA's sink); acts_.d_resid then holds dL/d(input).
void LlamaModel::layer_backward(int64_t l, const LayerParams& g, const Tensor& g_ln1, const Tensor& g_ln2,
                                const MicroBatchOptions& step) {
  const AttentionShape as = attention_shape();
  const int64_t rotated = cfg_.num_attention_heads + cfg_.num_query_groups;
  // Recomputation, before the backward of a chunk's last layer: its layers' forwards refill their activation sets
  // from the chunk's kept input, each output into the next one's input (the last to scratch: never read again).
  const RecomputeConfig& rc = layout_.recompute;
  if (rc.recomputed(l) && rc.chunk_end(l, cfg_.num_layers) == l + 1)
    for (int64_t r = rc.chunk_begin(l); r <= l; ++r)
      layer_forward(r, r < l ? acts_.layers[r + 1].resid_in : acts_.d_h, false);
  auto& a = acts_.layers[l];
  const LayerParams& w = weights_.layers[l];
  // acts_.d_resid = dL/d(layer output) = dL/d(resid_mid) through the MLP residual branch.
  linear(l, kFc2).backward(linear_ctx(kFc2), acts_.d_swi, g.fc2, acts_.d_resid, a.swi, backward_weight(l, kFc2, step),
                           step);
  adapter_backward(l, kFc2, acts_.d_swi, acts_.d_resid, a.swi);
  const Tensor dfc1_amax = linear(l, kFc1).producer_dy_amax();
  swiglu_backward(ctx_, acts_.d_fc1, acts_.d_swi, a.fc1, dfc1_amax);
  linear(l, kFc1).backward(linear_ctx(kFc1), acts_.d_ln, g.fc1, acts_.d_fc1, a.ln2, backward_weight(l, kFc1, step),
                           step, dfc1_amax.data != nullptr);
  adapter_backward(l, kFc1, acts_.d_ln, acts_.d_fc1, a.ln2);
  rmsnorm_backward(ctx_, acts_.d_resid, g_ln2, acts_.d_ln, a.resid_mid, w.ln2, a.rstd2);
  // acts_.d_resid = dL/d(resid_mid); the attention branch.
  linear(l, kProj).backward(linear_ctx(kProj), acts_.d_attn, g.proj, acts_.d_resid, a.attn,
                            backward_weight(l, kProj, step), step);
  adapter_backward(l, kProj, acts_.d_attn, acts_.d_resid, a.attn);
  attention_backward(ctx_, acts_.d_qkv, acts_.d_attn, a.attn, a.lse, a.qkv, as);
  rope_backward(ctx_, acts_.d_qkv, acts_.rope_cos, acts_.rope_sin, S_, rotated, cfg_.kv_channels, positions_);
  linear(l, kQkv).backward(linear_ctx(kQkv), acts_.d_ln, g.qkv, acts_.d_qkv, a.ln1, backward_weight(l, kQkv, step),
                           step);
  adapter_backward(l, kQkv, acts_.d_ln, acts_.d_qkv, a.ln1);
  rmsnorm_backward(ctx_, acts_.d_resid, g_ln1, acts_.d_ln, a.resid_in, w.ln1, a.rstd1);
}

}  // namespace pl
